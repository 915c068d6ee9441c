-- `exclusive` and `cooldown`: what each attempt of a job waits for before the job starts
-- (JSON of `prestart::Prestart`; NULL: it starts at once). Such a job holds its GPUs alone.
ALTER TABLE jobs ADD COLUMN prestart TEXT;
-- Why an attempt's job has not started yet, as its agent last said (NULL once it runs).
ALTER TABLE attempts ADD COLUMN waiting TEXT;
-- What the wait was: time for the GPUs to empty, time cooling, the hottest GPU's
-- temperature (milli-degrees C) when cooling began and when it ended, and whether
-- `max_wait` passed first.
ALTER TABLE attempts ADD COLUMN exclusive_wait_ms INTEGER;
ALTER TABLE attempts ADD COLUMN cooldown_wait_ms INTEGER;
ALTER TABLE attempts ADD COLUMN cooldown_from_mdeg INTEGER;
ALTER TABLE attempts ADD COLUMN cooldown_start_mdeg INTEGER;
ALTER TABLE attempts ADD COLUMN cooldown_timed_out INTEGER;
