-- Host memory admission: what an experiment's jobs hold of their node's memory
-- (`resources.host_memory`), what each attempt was admitted with (its cgroup's limit), and
-- each node's memory usable by jobs (its total less the agent's host headroom).
ALTER TABLE experiments ADD COLUMN host_memory_mib BIGINT;
ALTER TABLE attempts ADD COLUMN host_estimate_mib BIGINT;
ALTER TABLE nodes ADD COLUMN host_memory_mib BIGINT;
-- A key's latest host memory peaks, read at each claim as its GPU peaks are.
CREATE INDEX attempts_key_host_peaks ON attempts (memory_key, leased_at) WHERE host_peak_mib IS NOT NULL;
