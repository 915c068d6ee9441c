-- `max_concurrent`: the most jobs of an experiment leased or running at once (Slurm's array
-- `%N`); a claim counts them under one lock, so replicas and nodes never pass it together.
ALTER TABLE experiments ADD COLUMN max_concurrent INTEGER;
