-- Tokens the coordinator keeps (`headroom token create`): the public id, who holds it, its
-- role, an argon2 hash of the secret (never the secret) and when it expires. Revoked and
-- expired tokens stay listed.
CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    -- NULL: never expires.
    expires_at  BIGINT
);

-- Who submitted each experiment, job and attempt (the token's name); rows from before
-- tokens existed were submitted by the anonymous admin of an open coordinator.
ALTER TABLE experiments ADD COLUMN submitted_by TEXT NOT NULL DEFAULT 'anonymous';
ALTER TABLE jobs ADD COLUMN submitted_by TEXT NOT NULL DEFAULT 'anonymous';
ALTER TABLE attempts ADD COLUMN submitted_by TEXT NOT NULL DEFAULT 'anonymous';
