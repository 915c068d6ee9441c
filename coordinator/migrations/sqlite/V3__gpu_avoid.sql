-- GPUs a claim skips for a while after an agent handed a lease back on them.
CREATE TABLE gpu_avoid (
    node     TEXT NOT NULL,
    gpu      INTEGER NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (node, gpu)
);
