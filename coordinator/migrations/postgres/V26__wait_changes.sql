-- A study's waits are settled after the change that moved them, in transactions of their
-- own: a job's end only notes itself here (when some job waits for it), and the coordinator
-- counts the waiting jobs' waits again under each one's own lock, in `seq` order, then
-- drops the note. The job that ended locks no other job.
CREATE TABLE wait_changes (
    id BIGSERIAL PRIMARY KEY,
    job_id  TEXT NOT NULL,
    at      BIGINT NOT NULL
);
