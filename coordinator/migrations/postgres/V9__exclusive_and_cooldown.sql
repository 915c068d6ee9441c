-- `exclusive` and `cooldown` (as migrations/sqlite/V9__exclusive_and_cooldown.sql).
ALTER TABLE jobs ADD COLUMN prestart JSONB;
ALTER TABLE attempts ADD COLUMN waiting TEXT;
ALTER TABLE attempts ADD COLUMN exclusive_wait_ms BIGINT;
ALTER TABLE attempts ADD COLUMN cooldown_wait_ms BIGINT;
ALTER TABLE attempts ADD COLUMN cooldown_from_mdeg BIGINT;
ALTER TABLE attempts ADD COLUMN cooldown_start_mdeg BIGINT;
ALTER TABLE attempts ADD COLUMN cooldown_timed_out BOOLEAN;
