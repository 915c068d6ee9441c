-- An OOM blamed on a neighbour that grew past its estimate (`oom_cause = 'neighbour_grew'`):
-- the neighbour's attempt.
ALTER TABLE attempts ADD COLUMN oom_neighbour TEXT;
