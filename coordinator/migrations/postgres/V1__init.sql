-- The same tables and columns as migrations/sqlite/V1__init.sql: times are BIGINT
-- milliseconds since the epoch, JSON documents are JSONB, flags are BOOLEAN.
CREATE TABLE experiments (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    seed        BIGINT NOT NULL,
    spec        JSONB NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE jobs (
    seq           BIGSERIAL PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    experiment_id TEXT NOT NULL REFERENCES experiments(id),
    idx           BIGINT NOT NULL,
    config        BIGINT NOT NULL,
    run           BIGINT NOT NULL,
    state         TEXT NOT NULL,
    priority      BIGINT NOT NULL,
    params        JSONB NOT NULL,
    argv          JSONB NOT NULL,
    env           JSONB NOT NULL,
    profile       TEXT NOT NULL,
    gpus          BIGINT NOT NULL,
    estimate_mib  BIGINT,
    timeout_ms    BIGINT,
    max_attempts  BIGINT NOT NULL,
    retry_on      JSONB NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    fence         BIGINT NOT NULL DEFAULT 0,
    last_failure  TEXT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE INDEX jobs_pending ON jobs (state, priority DESC, seq);
CREATE INDEX jobs_experiment ON jobs (experiment_id, seq);

CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    agent_id      TEXT,
    gpus          JSONB NOT NULL,
    plan          TEXT NOT NULL,
    headroom      TEXT NOT NULL,
    telemetry     JSONB,
    last_seen     BIGINT,
    registered_at BIGINT NOT NULL
);

CREATE TABLE attempts (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs(id),
    number           BIGINT NOT NULL,
    node             TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    gpus             JSONB NOT NULL,
    fence            BIGINT NOT NULL,
    phase            TEXT NOT NULL,
    estimate_mib     BIGINT,
    leased_at        BIGINT NOT NULL,
    lease_expires_at BIGINT NOT NULL,
    started_at       BIGINT,
    ended_at         BIGINT,
    pid              BIGINT,
    exit_code        BIGINT,
    signal           BIGINT,
    failure_class    TEXT,
    peak_mem_mib     BIGINT,
    cleanup_ms       BIGINT,
    cleanup_verified BOOLEAN,
    log_tail         TEXT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX attempts_active ON attempts (node, phase);
CREATE INDEX attempts_job ON attempts (job_id, number);
CREATE INDEX attempts_expiry ON attempts (phase, lease_expires_at);
