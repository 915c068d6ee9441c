-- Checkpoint signal and preemption: an experiment's `checkpoint` (its signal and lead, JSON)
-- and `preemptible`; why a running attempt is asked to stop and requeue (`requeued` by a
-- user, `preempted` for another's job), beside its `cancel_requested`; and when a job was
-- last preempted (never twice within the coordinator's `--preempt-interval`).
ALTER TABLE experiments ADD COLUMN checkpoint JSONB;
ALTER TABLE experiments ADD COLUMN preemptible BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE attempts ADD COLUMN requeue TEXT;
ALTER TABLE jobs ADD COLUMN preempted_at BIGINT;
