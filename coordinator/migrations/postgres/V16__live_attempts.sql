-- A node's live attempts (every claim reads them) and the leases that may have run out (every
-- expiry sweep) were read through (node, phase) and (phase, lease_expires_at). `phase !=
-- 'ended'` is no range of those, so each read walked every attempt the node (or the store)
-- had ever run: 0.6 ms a claim after 3,000 jobs on one node, and more as its history grows.
-- These hold the live attempts only.
DROP INDEX attempts_active;
DROP INDEX attempts_expiry;
CREATE INDEX attempts_live ON attempts (node) WHERE phase != 'ended';
CREATE INDEX attempts_live_expiry ON attempts (lease_expires_at) WHERE phase != 'ended';
-- A progress count of one experiment reads its jobs' states from this index alone; it read
-- the whole table (one statement for "one experiment or all" could use no index).
CREATE INDEX jobs_experiment_state ON jobs (experiment_id, state);
