-- The one-queen lock becomes a lease with a deadline (lease.go): the
-- holder renews expires_at (milliseconds since 1970 on the database's
-- clock) every renew interval; a standby that finds it past takes the
-- lease and ends the sessions named session (the holder's
-- application_name). A holder that stops cleanly sets session to '' and
-- expires_at to 0: released. SQLite keeps the columns unused.
ALTER TABLE queen_lease ADD COLUMN expires_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE queen_lease ADD COLUMN session TEXT NOT NULL DEFAULT '';
