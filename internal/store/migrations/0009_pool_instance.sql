-- pools.instance: the hive process that holds the pool (its registration's
-- instance, drawn at random when the hive starts), kept across queen
-- restarts so that a restarted queen still tells the holder from another
-- hive given the same pool id ("" for a hive that sends none).
ALTER TABLE pools ADD COLUMN instance TEXT NOT NULL DEFAULT '';
