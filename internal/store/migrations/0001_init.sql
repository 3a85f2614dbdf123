-- apiary queen store, version 1. One schema for SQLite and PostgreSQL: only
-- types and statements both understand. Times are Unix microseconds (UTC)
-- in BIGINT columns; NULL means "not yet".

-- pools: the hives that registered, their liveness status and the last
-- inventory they reported (JSON arrays of internal/api GPU and Worker).
CREATE TABLE pools (
    id                TEXT    PRIMARY KEY,
    endpoint          TEXT    NOT NULL,
    node_id           TEXT    NOT NULL,
    version           TEXT    NOT NULL,
    status            TEXT    NOT NULL,
    drained           INTEGER NOT NULL DEFAULT 0,
    registered_at     BIGINT  NOT NULL,
    status_changed_at BIGINT  NOT NULL,
    last_heartbeat_at BIGINT,
    gpus              TEXT    NOT NULL DEFAULT '[]',
    workers           TEXT    NOT NULL DEFAULT '[]'
);

-- workers: the lifecycle rows, the source of truth about every worker the
-- queen asked for. Only the queen writes them.
CREATE TABLE workers (
    id                TEXT    PRIMARY KEY,
    pool_id           TEXT    NOT NULL,
    worker_id         TEXT    NOT NULL DEFAULT '',
    model_ref         TEXT    NOT NULL,
    gpu_device        INTEGER,
    status            TEXT    NOT NULL,
    reason            TEXT    NOT NULL DEFAULT '',
    owner             TEXT    NOT NULL,
    created_at        BIGINT  NOT NULL,
    started_at        BIGINT,
    ready_at          BIGINT,
    stopped_at        BIGINT,
    last_heartbeat_at BIGINT,
    vram_bytes        BIGINT  NOT NULL DEFAULT 0,
    uri               TEXT    NOT NULL DEFAULT '',
    pid               INTEGER,
    exit_code         INTEGER
);
CREATE INDEX workers_status ON workers (status);
CREATE INDEX workers_pool ON workers (pool_id);
CREATE INDEX workers_created ON workers (created_at);

-- audit_log: one entry per change the queen makes (ids are assigned by the
-- queen, increasing).
CREATE TABLE audit_log (
    id       BIGINT PRIMARY KEY,
    ts       BIGINT NOT NULL,
    actor    TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    reason   TEXT   NOT NULL DEFAULT '',
    metadata TEXT   NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_ts ON audit_log (ts);

-- nodes: machines the queen may start hives on over SSH.
CREATE TABLE nodes (
    name        TEXT   PRIMARY KEY,
    ssh_target  TEXT   NOT NULL,
    install_dir TEXT   NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL,
    metadata    TEXT   NOT NULL DEFAULT '{}'
);
