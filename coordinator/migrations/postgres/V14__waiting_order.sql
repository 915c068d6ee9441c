-- The claim reads waiting jobs in placement order (priority, then the longest waiting) a
-- window at a time. `jobs_pending` leads with the state, so over the two waiting states the
-- database sorted every waiting job at each claim (a 100,000-job queue: 60 ms, spilled to
-- disk). This index holds only waiting jobs, in that order: a claim reads its window.
CREATE INDEX jobs_waiting ON jobs (priority DESC, seq) WHERE state IN ('queued', 'retrying');
-- A key's learned estimate is taken over its most recent observed peaks: read from here,
-- newest first, without visiting its other attempts.
CREATE INDEX attempts_key_peaks ON attempts (memory_key, leased_at) WHERE peak_mem_mib IS NOT NULL;
