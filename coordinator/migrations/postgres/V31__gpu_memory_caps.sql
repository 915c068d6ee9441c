-- A hard GPU memory limit per attempt where the node can set one: an experiment's
-- `memory_cap: off`, the limit each attempt ran under (MiB on each of its GPUs) and why an
-- attempt ran out of GPU memory (`cap_hit`: at its own limit).
ALTER TABLE experiments ADD COLUMN memory_cap_off BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE attempts ADD COLUMN memory_cap_mib BIGINT;
ALTER TABLE attempts ADD COLUMN oom_cause TEXT;
