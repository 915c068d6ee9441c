-- A run's GPU memory over time as its supervisor measured it, fitted as phases (JSON of
-- `phases::Phases`): what the next runs of its memory key are placed by when they declare
-- none. Kept only for runs that ended well and uncontaminated.
ALTER TABLE attempts ADD COLUMN memory_profile JSONB;
-- The phases an attempt was placed by (declared or learned, its background's memory in its
-- steady use), so that later claims count it as it was counted; NULL: it holds its estimate
-- throughout.
ALTER TABLE attempts ADD COLUMN placed_phases JSONB;
-- Attempts placed by their experiment's declared phases before this column held them.
UPDATE attempts SET placed_phases = (
    SELECT e.memory_phases FROM jobs j JOIN experiments e ON e.id = j.experiment_id
    WHERE j.id = attempts.job_id AND j.background_mib IS NULL
) WHERE phase != 'ended' AND number = 1 AND estimate_mib IS NOT NULL;
