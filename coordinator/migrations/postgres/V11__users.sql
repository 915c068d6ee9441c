-- Users (as migrations/sqlite/V11__users.sql).
CREATE TABLE users (
    name       TEXT PRIMARY KEY,
    role       TEXT NOT NULL,
    unix_user  TEXT,
    allow_root BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL
);
INSERT INTO users (name, role, created_at)
    SELECT name, MIN(role), MIN(created_at) FROM tokens GROUP BY name;
