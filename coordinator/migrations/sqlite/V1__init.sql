CREATE TABLE experiments (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    seed        INTEGER NOT NULL,
    spec        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE jobs (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    experiment_id TEXT NOT NULL REFERENCES experiments(id),
    idx           INTEGER NOT NULL,
    config        INTEGER NOT NULL,
    run           INTEGER NOT NULL,
    state         TEXT NOT NULL,
    priority      INTEGER NOT NULL,
    params        TEXT NOT NULL,
    argv          TEXT NOT NULL,
    env           TEXT NOT NULL,
    profile       TEXT NOT NULL,
    gpus          INTEGER NOT NULL,
    estimate_mib  INTEGER,
    timeout_ms    INTEGER,
    max_attempts  INTEGER NOT NULL,
    retry_on      TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    fence         INTEGER NOT NULL DEFAULT 0,
    last_failure  TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX jobs_pending ON jobs (state, priority DESC, seq);
CREATE INDEX jobs_experiment ON jobs (experiment_id, seq);

CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    agent_id      TEXT,
    gpus          TEXT NOT NULL,
    plan          TEXT NOT NULL,
    headroom      TEXT NOT NULL,
    telemetry     TEXT,
    last_seen     INTEGER,
    registered_at INTEGER NOT NULL
);

CREATE TABLE attempts (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs(id),
    number           INTEGER NOT NULL,
    node             TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    gpus             TEXT NOT NULL,
    fence            INTEGER NOT NULL,
    phase            TEXT NOT NULL,
    estimate_mib     INTEGER,
    leased_at        INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    started_at       INTEGER,
    ended_at         INTEGER,
    pid              INTEGER,
    exit_code        INTEGER,
    signal           INTEGER,
    failure_class    TEXT,
    peak_mem_mib     INTEGER,
    cleanup_ms       INTEGER,
    cleanup_verified INTEGER,
    log_tail         TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX attempts_active ON attempts (node, phase);
CREATE INDEX attempts_job ON attempts (job_id, number);
CREATE INDEX attempts_expiry ON attempts (phase, lease_expires_at);
