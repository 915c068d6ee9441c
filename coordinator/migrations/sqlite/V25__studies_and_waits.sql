-- Studies: experiments submitted together from one spec (`experiments:`), each a variant.
ALTER TABLE experiments ADD COLUMN study_id TEXT;
ALTER TABLE experiments ADD COLUMN study_name TEXT;
CREATE INDEX experiments_study ON experiments (study_id);
-- A study's waits (`after`): a job starts once the jobs it needs ended as asked.
-- `jobs.waiting_on` counts its waits not yet met; a claim reads only jobs with none.
ALTER TABLE jobs ADD COLUMN waiting_on INTEGER NOT NULL DEFAULT 0;
CREATE TABLE job_waits (
    job_id        TEXT NOT NULL,
    needs_job_id  TEXT NOT NULL,
    wait_when     TEXT NOT NULL,
    on_failure    TEXT NOT NULL,
    PRIMARY KEY (job_id, needs_job_id)
);
CREATE INDEX job_waits_needs ON job_waits (needs_job_id);
-- The claim's windows hold only jobs free to start: a waiting job is not read past at
-- every claim.
DROP INDEX jobs_waiting;
DROP INDEX jobs_waiting_cpu;
CREATE INDEX jobs_waiting ON jobs (priority DESC, seq) WHERE state IN ('queued', 'retrying') AND waiting_on = 0;
CREATE INDEX jobs_waiting_cpu ON jobs (priority DESC, seq) WHERE state IN ('queued', 'retrying') AND waiting_on = 0 AND gpus = 0;
