-- batch_file_chunks: the bytes of the Batch API's files on PostgreSQL, so
-- that every queen on the database reads and writes them without a shared
-- directory: a file's content in order of seq, each chunk at most
-- FileChunkBytes (1 MiB), so neither a value nor a read holds a whole
-- file. Removed with the file's row (DeleteBatchFile).
CREATE TABLE batch_file_chunks (
    file_id TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    data    BYTEA   NOT NULL,
    PRIMARY KEY (file_id, seq)
);
