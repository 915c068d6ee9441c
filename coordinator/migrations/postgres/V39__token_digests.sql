-- The SHA-256 (hex) of a token the coordinator made, checked in place of its argon2 hash
-- (`secret_hash`, kept for replicas of earlier versions during a rolling update): its secret
-- is 192 random bits, so a slow hash protects nothing there and cost every replica a
-- verification per token after each start. NULL until the token next verifies (tokens made
-- before this column), then written once. As migrations/sqlite/V39__token_digests.sql.
ALTER TABLE tokens ADD COLUMN secret_digest TEXT;
