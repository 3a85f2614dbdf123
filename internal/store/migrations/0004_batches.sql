-- batch_files: files of the OpenAI Batch API (/v1/files). The bytes live
-- in the queen's data dir; the row says what they are. expires_at: the
-- file is removed after it (NULL: never).
CREATE TABLE batch_files (
    id         TEXT    PRIMARY KEY,
    purpose    TEXT    NOT NULL,
    filename   TEXT    NOT NULL,
    bytes      BIGINT  NOT NULL,
    created_at BIGINT  NOT NULL,
    expires_at BIGINT
);
-- batches: one row a batch (/v1/batches); status as OpenAI names it, the
-- times of each status change, the files it made.
CREATE TABLE batches (
    id                TEXT    PRIMARY KEY,
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL,
    completion_window TEXT    NOT NULL,
    status            TEXT    NOT NULL,
    output_file_id    TEXT    NOT NULL DEFAULT '',
    error_file_id     TEXT    NOT NULL DEFAULT '',
    failure           TEXT    NOT NULL DEFAULT '',
    metadata          TEXT    NOT NULL DEFAULT '{}',
    total             INTEGER NOT NULL,
    created_at        BIGINT  NOT NULL,
    expires_at        BIGINT  NOT NULL,
    in_progress_at    BIGINT,
    finalizing_at     BIGINT,
    completed_at      BIGINT,
    failed_at         BIGINT,
    expired_at        BIGINT,
    cancelling_at     BIGINT,
    cancelled_at      BIGINT
);
-- batch_jobs: one row a request of a batch (its line in the input file):
-- queued, running (on the worker of lifecycle_id), then succeeded, failed
-- or cancelled with its one result line (the line of the output or error
-- file).
CREATE TABLE batch_jobs (
    batch_id     TEXT    NOT NULL,
    line         INTEGER NOT NULL,
    custom_id    TEXT    NOT NULL,
    model_ref    TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    lifecycle_id TEXT    NOT NULL DEFAULT '',
    result       TEXT    NOT NULL DEFAULT '',
    updated_at   BIGINT  NOT NULL,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX batch_jobs_state ON batch_jobs (state, batch_id, line);
