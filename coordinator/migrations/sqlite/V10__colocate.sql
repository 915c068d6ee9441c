-- Colocated backgrounds (`colocate`): each job's resolved background (JSON, NULL: runs
-- alone) and its memory, which placement adds to the job's estimate; each attempt's record
-- of its background: pid, how long the foreground waited for it to be ready, how it exited,
-- and whether it exited by itself before the foreground ended. (V8 and V9 are other
-- changes'.)
ALTER TABLE jobs ADD COLUMN background TEXT;
ALTER TABLE jobs ADD COLUMN background_mib INTEGER;
ALTER TABLE attempts ADD COLUMN background_pid INTEGER;
ALTER TABLE attempts ADD COLUMN background_ready_ms INTEGER;
ALTER TABLE attempts ADD COLUMN background_exit_code INTEGER;
ALTER TABLE attempts ADD COLUMN background_signal INTEGER;
ALTER TABLE attempts ADD COLUMN background_exited_early INTEGER;
