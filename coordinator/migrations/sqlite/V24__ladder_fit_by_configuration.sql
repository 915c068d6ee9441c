-- A ladder fit belongs to one configuration of one submitter's spec: its key is the submitter,
-- the experiment's name, the job's parameters before any step and its ladder, not the memory
-- key (which several configurations share where `memory_key` names few parameters).
UPDATE jobs SET base_memory_key = NULL;
UPDATE jobs SET base_memory_key =
    (SELECT e.submitted_by || ';' || e.name FROM experiments e WHERE e.id = jobs.experiment_id)
    || ';' || CAST(params AS TEXT) || ';' || CAST(ladder AS TEXT)
    WHERE ladder_step = 0;
DELETE FROM ladder_fits;
