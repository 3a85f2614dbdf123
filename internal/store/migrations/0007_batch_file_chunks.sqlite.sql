-- batch_file_chunks: the bytes of the Batch API's files, chunk by chunk
-- (see the PostgreSQL migration). A SQLite queen is the only one on its
-- database and keeps the bytes in its data dir instead; the table is here
-- so that both databases have one schema.
CREATE TABLE batch_file_chunks (
    file_id TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    data    BLOB    NOT NULL,
    PRIMARY KEY (file_id, seq)
);
