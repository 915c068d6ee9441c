-- The attempt-scoped credential issued with each lease (its SHA-256, hex): the attempt's
-- supervisor renews its lease and reports its outcome with it while its agent is away.
ALTER TABLE attempts ADD COLUMN report_key_hash TEXT;
