-- Early stopping's ledger: each attempt's value (a JSON number) at each rung it reached,
-- read by (experiment, rung) when another attempt reaches that rung; an attempt's
-- decisions stay on it (`attempts.rungs`).
CREATE TABLE metric_rungs (
    experiment_id TEXT NOT NULL,
    rung          INTEGER NOT NULL,
    attempt_id    TEXT NOT NULL,
    job_id        TEXT NOT NULL,
    value         TEXT NOT NULL,
    PRIMARY KEY (experiment_id, rung, attempt_id)
);
