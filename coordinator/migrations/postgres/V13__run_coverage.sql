-- How late after the job's exec its figures begin (ms; 0: read before the exec).
ALTER TABLE attempts ADD COLUMN first_reading_ms BIGINT;
-- The figures cover the job's whole run (read before its exec and after its end).
ALTER TABLE attempts ADD COLUMN covers_run BOOLEAN;
-- Each GPU's total-energy counter at the run's first and last readings (a JSON list):
-- what a shared GPU's energy is apportioned from.
ALTER TABLE attempts ADD COLUMN energy_counters JSONB;
-- The attempts that ran on a node around a time (shared GPUs): ended since, or running.
CREATE INDEX attempts_node_ended ON attempts (node, ended_at);
-- The most memory no listed process accounted for on one of the attempt's GPUs during its
-- run, beyond what there was before it (MiB; "ghost" memory).
ALTER TABLE attempts ADD COLUMN ghost_mib BIGINT;
