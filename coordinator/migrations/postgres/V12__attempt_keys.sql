-- The attempt-scoped credential issued with each lease (its SHA-256, hex): the attempt's
-- supervisor renews its lease and reports its outcome with it while its agent is away.
ALTER TABLE attempts ADD COLUMN report_key_hash TEXT;
-- The attempt's host RAM peak, from its cgroup's memory controller (MiB).
ALTER TABLE attempts ADD COLUMN host_peak_mib BIGINT;
