-- Colocated backgrounds (as migrations/sqlite/V10__colocate.sql).
ALTER TABLE jobs ADD COLUMN background JSONB;
ALTER TABLE jobs ADD COLUMN background_mib BIGINT;
ALTER TABLE attempts ADD COLUMN background_pid BIGINT;
ALTER TABLE attempts ADD COLUMN background_ready_ms BIGINT;
ALTER TABLE attempts ADD COLUMN background_exit_code BIGINT;
ALTER TABLE attempts ADD COLUMN background_signal BIGINT;
ALTER TABLE attempts ADD COLUMN background_exited_early BOOLEAN;
