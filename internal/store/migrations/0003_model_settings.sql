-- model_settings: an operator's settings of a model (apiary models scale):
-- the controller keeps at least min_workers of it live; max_workers, when
-- not NULL, bounds its live workers instead of the queen's --max-workers.
CREATE TABLE model_settings (
    model_ref   TEXT    PRIMARY KEY,
    min_workers INTEGER NOT NULL,
    max_workers INTEGER,
    reason      TEXT    NOT NULL DEFAULT '',
    updated_at  BIGINT  NOT NULL
);
