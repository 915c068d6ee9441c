-- Fair share: each user's weight (`share`) and what they may hold at once (NULL: no cap).
ALTER TABLE users ADD COLUMN share INTEGER NOT NULL DEFAULT 1;
ALTER TABLE users ADD COLUMN max_jobs INTEGER;
ALTER TABLE users ADD COLUMN max_gpus INTEGER;
ALTER TABLE users ADD COLUMN max_gpu_mib BIGINT;
-- The GPU memory a lease reserved over all its GPUs (its estimate on each, or the whole GPU
-- for a job that runs alone): what its run costs its user. Attempts leased before had none.
ALTER TABLE attempts ADD COLUMN reserved_mib BIGINT;
-- Whether the attempt's run is in its user's ledger yet: new attempts are not (0) until they
-- end and the coordinator charges them; those from before fair share count as charged.
ALTER TABLE attempts ADD COLUMN charged INTEGER NOT NULL DEFAULT 1;
CREATE INDEX attempts_uncharged ON attempts (submitted_by) WHERE charged = 0;
-- Each user's decayed usage in MiB-milliseconds of reserved GPU memory, as of `at`.
CREATE TABLE share_usage (
    name   TEXT PRIMARY KEY,
    mib_ms BIGINT NOT NULL,
    at     BIGINT NOT NULL
);
-- A claim reads each waiting user's jobs in their own order (fair share orders the users).
CREATE INDEX jobs_waiting_by_user ON jobs (submitted_by, priority DESC, seq) WHERE state IN ('queued', 'retrying') AND waiting_on = 0;
