-- Why a waiting job is not running yet (as migrations/sqlite/V4__pending_reason.sql).
ALTER TABLE jobs ADD COLUMN pending_reason JSONB;
