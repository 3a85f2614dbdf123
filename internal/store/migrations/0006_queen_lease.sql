-- queen_lease: the fencing epoch of the one-queen lock (PostgreSQL). A
-- queen that takes the advisory lock raises epoch; every write
-- transaction of a queen first reads the row FOR SHARE and goes on only
-- while epoch is its own, so a queen that lost the lock cannot write one
-- more row once another has taken it. SQLite keeps the table unused (its
-- lock is a file lock that ends with the process).
CREATE TABLE queen_lease (
    id       INTEGER PRIMARY KEY,
    epoch    BIGINT  NOT NULL,
    holder   TEXT    NOT NULL,
    taken_at BIGINT  NOT NULL
);
