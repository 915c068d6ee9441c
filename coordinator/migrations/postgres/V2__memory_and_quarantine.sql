-- Learned memory estimates, the OOM ladder, contamination and quarantined GPUs
-- (as migrations/sqlite/V2__memory_and_quarantine.sql).
ALTER TABLE jobs ADD COLUMN memory_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN command JSONB NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN shell BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE jobs ADD COLUMN ladder JSONB NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN ladder_step BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN memory_key TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN estimate_source TEXT NOT NULL DEFAULT 'none';
ALTER TABLE attempts ADD COLUMN params JSONB NOT NULL DEFAULT '{}';
ALTER TABLE attempts ADD COLUMN ladder_step BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN contaminated BOOLEAN;
CREATE INDEX attempts_memory_key ON attempts (memory_key);

CREATE TABLE memory_floors (
    memory_key TEXT PRIMARY KEY,
    floor_mib  BIGINT NOT NULL
);

CREATE TABLE quarantine (
    node       TEXT NOT NULL,
    gpu        BIGINT NOT NULL,
    attempt_id TEXT NOT NULL,
    reason     TEXT NOT NULL,
    since      BIGINT NOT NULL,
    PRIMARY KEY (node, gpu, attempt_id)
);
