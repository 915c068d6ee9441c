-- An experiment's jobs' memory over time (`resources.memory_phases` with `expected_duration`):
-- JSON of `phases::Phases`, read by placement for the pending jobs and the running attempts.
ALTER TABLE experiments ADD COLUMN memory_phases JSONB;
