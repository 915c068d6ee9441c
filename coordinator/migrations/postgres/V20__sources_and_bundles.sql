-- Where an experiment's jobs run from (working directory, git state, snapshot bundle,
-- Python environment), as its submitter's client recorded it; NULL for older experiments.
ALTER TABLE experiments ADD COLUMN source JSONB;
-- Code bundles (`code: snapshot`), content-addressed by the SHA-256 of their bytes: in the
-- database, so that every coordinator replica serves every bundle.
CREATE TABLE bundles (
    hash        TEXT PRIMARY KEY,
    data        BYTEA NOT NULL,
    bytes       BIGINT NOT NULL,
    uploaded_by TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
