-- Alerts: users' and admins' subscriptions; the outbox of events, written by the
-- transaction that made each happen; and each event's delivery to each subscription it
-- matched, tried with backoff (`due`) until delivered or dead. A job's end (or its return
-- from one) is noted beside it, and the alerts sweep reads the notes in order: an
-- experiment's failures in a row, whether its end was told, and whether a node's loss and a
-- job's long wait were.
CREATE TABLE alert_subscriptions (
    id         TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    kinds      TEXT NOT NULL,
    target     TEXT NOT NULL,
    lab_wide   INTEGER NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE TABLE alert_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    kind    TEXT NOT NULL,
    subject TEXT,
    summary TEXT NOT NULL,
    details TEXT NOT NULL,
    at      BIGINT NOT NULL
);
CREATE TABLE alert_deliveries (
    id              TEXT PRIMARY KEY,
    event_id        BIGINT NOT NULL REFERENCES alert_events(id),
    -- No foreign key: an event recorded as its subscription is removed leaves a delivery
    -- that becomes a dead letter, rather than failing the transaction that recorded it.
    subscription_id TEXT NOT NULL,
    state           TEXT NOT NULL,
    tries           BIGINT NOT NULL DEFAULT 0,
    due             BIGINT,
    last_error      TEXT,
    delivered_at    BIGINT
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (due) WHERE due IS NOT NULL;
CREATE INDEX alert_deliveries_of ON alert_deliveries (subscription_id, event_id);
CREATE INDEX alert_deliveries_event ON alert_deliveries (event_id);
CREATE INDEX alert_events_at ON alert_events (at);
CREATE TABLE alert_notes (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id        TEXT NOT NULL,
    experiment_id TEXT NOT NULL,
    state         TEXT NOT NULL,
    at            BIGINT NOT NULL
);
ALTER TABLE experiments ADD COLUMN failure_streak BIGINT NOT NULL DEFAULT 0;
ALTER TABLE experiments ADD COLUMN ended_alerted BIGINT NOT NULL DEFAULT 0;
-- A quarantine that lasts past `--alert-quarantine-after` is told again, once.
ALTER TABLE quarantine ADD COLUMN lasting_alerted BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN lost_alerted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN pending_alerted INTEGER NOT NULL DEFAULT 0;
-- Jobs queued and nodes lost before alerts existed are not told of (a live node is
-- reset by its next heartbeat).
UPDATE jobs SET pending_alerted = 1;
-- A job's wait runs from its last change of state (`updated_at`), which resets the mark.
CREATE INDEX jobs_pending_alert ON jobs (updated_at) WHERE state IN ('queued', 'retrying') AND pending_alerted = 0;
UPDATE nodes SET lost_alerted = 1;
