-- Attempt logs live in the store, so that coordinator replicas share nothing but the
-- database: an attempt's output in chunks at their offset in the kept text, and how much is
-- kept (at most the coordinator's --max-log-size, then a line saying the log was cut).
CREATE TABLE attempt_logs (
    attempt_id TEXT PRIMARY KEY,
    kept       BIGINT NOT NULL,
    cut        BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE TABLE attempt_log_chunks (
    attempt_id TEXT NOT NULL,
    at         BIGINT NOT NULL,
    data       BYTEA NOT NULL,
    PRIMARY KEY (attempt_id, at)
);
