-- Why a waiting job is not running yet, as the last claim pass that looked at it saw it
-- (JSON of `PendingReason`).
ALTER TABLE jobs ADD COLUMN pending_reason TEXT;
