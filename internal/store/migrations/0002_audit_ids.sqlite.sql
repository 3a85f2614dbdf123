-- Audit ids from the database: INTEGER PRIMARY KEY AUTOINCREMENT never
-- hands out an id again, not even after the newest entries were pruned.
-- SQLite cannot add AUTOINCREMENT to a table, so the table is rebuilt.
CREATE TABLE audit_log_v2 (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    ts       BIGINT NOT NULL,
    actor    TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    reason   TEXT   NOT NULL DEFAULT '',
    metadata TEXT   NOT NULL DEFAULT '{}'
);
INSERT INTO audit_log_v2 (id, ts, actor, action, target, reason, metadata)
    SELECT id, ts, actor, action, target, reason, metadata FROM audit_log;
DROP TABLE audit_log;
ALTER TABLE audit_log_v2 RENAME TO audit_log;
CREATE INDEX audit_log_ts ON audit_log (ts);
