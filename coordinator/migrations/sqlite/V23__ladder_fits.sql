-- Where a configuration last fit: the OOM ladder step at which a run of it succeeded, by the
-- memory key it has before any step (`jobs.base_memory_key`). Its waiting runs, and later
-- ones of that key, start at that step; `jobs.ladder_from` says why.
ALTER TABLE jobs ADD COLUMN base_memory_key TEXT;
ALTER TABLE jobs ADD COLUMN ladder_from TEXT;
-- Jobs that never took a step still hold their first key; stepped ones' is unknown.
UPDATE jobs SET base_memory_key = memory_key WHERE ladder_step = 0;
CREATE INDEX jobs_base_memory_key ON jobs (base_memory_key, state);
CREATE TABLE ladder_fits (
    memory_key  TEXT PRIMARY KEY,
    step        INTEGER NOT NULL,
    attempt_id  TEXT NOT NULL,
    fitted_at   INTEGER NOT NULL
);
