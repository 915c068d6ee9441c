-- Users: a token belongs to one (by name); a name has one role; a user may map to the Unix
-- user its jobs run as on nodes whose agent runs as root (never root unless allowed).
CREATE TABLE users (
    name       TEXT PRIMARY KEY,
    role       TEXT NOT NULL,
    unix_user  TEXT,
    allow_root INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
-- The holders of tokens made before users existed become users (the first role wins).
INSERT INTO users (name, role, created_at)
    SELECT name, MIN(role), MIN(created_at) FROM tokens GROUP BY name;
