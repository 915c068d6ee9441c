-- What an attempt's supervisor measured over the run (as migrations/sqlite/V8__attempt_measurements.sql).
ALTER TABLE attempts ADD COLUMN energy_mj BIGINT;
ALTER TABLE attempts ADD COLUMN energy_source TEXT;
ALTER TABLE attempts ADD COLUMN mean_power_mw BIGINT;
ALTER TABLE attempts ADD COLUMN max_power_mw BIGINT;
ALTER TABLE attempts ADD COLUMN max_temp_mdeg BIGINT;
ALTER TABLE attempts ADD COLUMN start_temp_mdeg BIGINT;
ALTER TABLE attempts ADD COLUMN mean_util_mpct BIGINT;
ALTER TABLE attempts ADD COLUMN throttled_thermal BOOLEAN;
ALTER TABLE attempts ADD COLUMN throttled_power BOOLEAN;
ALTER TABLE attempts ADD COLUMN throttle_reasons JSONB;
ALTER TABLE attempts ADD COLUMN contamination_reason TEXT;
ALTER TABLE attempts ADD COLUMN contamination_pid BIGINT;
ALTER TABLE attempts ADD COLUMN contamination_command TEXT;
