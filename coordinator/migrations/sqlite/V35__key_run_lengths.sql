-- How long a key's runs take (a study's queue order, `submit --dry-run`) is the mean of its
-- latest successful runs, those that left no GPU peak too (CPU-only jobs, a GPU whose
-- per-process memory could not be read): read from here, newest first.
CREATE INDEX attempts_key_runs ON attempts (memory_key, leased_at)
    WHERE failure_class IS NULL AND ended_at IS NOT NULL AND started_at IS NOT NULL;
