-- Learned memory estimates, the OOM ladder, contamination and quarantined GPUs.
ALTER TABLE jobs ADD COLUMN memory_key TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN command TEXT NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN shell INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN ladder TEXT NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN ladder_step INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN memory_key TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN estimate_source TEXT NOT NULL DEFAULT 'none';
ALTER TABLE attempts ADD COLUMN params TEXT NOT NULL DEFAULT '{}';
ALTER TABLE attempts ADD COLUMN ladder_step INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN contaminated INTEGER;
CREATE INDEX attempts_memory_key ON attempts (memory_key);

CREATE TABLE memory_floors (
    memory_key TEXT PRIMARY KEY,
    floor_mib  INTEGER NOT NULL
);

CREATE TABLE quarantine (
    node       TEXT NOT NULL,
    gpu        INTEGER NOT NULL,
    attempt_id TEXT NOT NULL,
    reason     TEXT NOT NULL,
    since      INTEGER NOT NULL,
    PRIMARY KEY (node, gpu, attempt_id)
);
