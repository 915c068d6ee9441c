-- GPUs a claim skips for a while after an agent handed a lease back on them
-- (as migrations/sqlite/V3__gpu_avoid.sql).
CREATE TABLE gpu_avoid (
    node     TEXT NOT NULL,
    gpu      BIGINT NOT NULL,
    until_ms BIGINT NOT NULL,
    PRIMARY KEY (node, gpu)
);
