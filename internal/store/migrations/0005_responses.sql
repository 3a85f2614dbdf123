-- responses: answers of the Responses API (POST /v1/responses) kept for
-- previous_response_id and GET /v1/responses/{id}: the response object as
-- answered, and the conversation up to and including it as chat messages
-- (JSON). Pruned with the ended worker rows (--rows-retention).
CREATE TABLE responses (
    id         TEXT   PRIMARY KEY,
    created_at BIGINT NOT NULL,
    response   TEXT   NOT NULL,
    messages   TEXT   NOT NULL
);
CREATE INDEX responses_created ON responses (created_at);
