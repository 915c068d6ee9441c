-- What runs achieved (`metrics`, `early_stop`, `tracking`; shared::results): the experiment's
-- settings, each attempt's final values, its decisions at early stopping's rungs and where its
-- results were tracked; its series apart (read only for learning curves).
ALTER TABLE experiments ADD COLUMN results TEXT;
ALTER TABLE attempts ADD COLUMN metric_finals TEXT;
ALTER TABLE attempts ADD COLUMN metrics_ignored INTEGER;
ALTER TABLE attempts ADD COLUMN rungs TEXT;
ALTER TABLE attempts ADD COLUMN tracking TEXT;
-- The tracking outbox: an ended attempt whose run is still to be written is due then (ms).
ALTER TABLE attempts ADD COLUMN tracking_due INTEGER;
ALTER TABLE attempts ADD COLUMN tracking_tries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_tracking_due ON attempts (tracking_due) WHERE tracking_due IS NOT NULL;
CREATE TABLE attempt_series (
    attempt_id  TEXT PRIMARY KEY,
    series      TEXT NOT NULL
);
