-- Where an experiment's jobs run from (working directory, git state, snapshot bundle,
-- Python environment), as its submitter's client recorded it; NULL for older experiments.
ALTER TABLE experiments ADD COLUMN source TEXT;
-- Code bundles (`code: snapshot`), content-addressed by the SHA-256 of their bytes: in the
-- database, so that every coordinator replica serves every bundle; kept once however many
-- upload them.
CREATE TABLE bundles (
    hash        TEXT PRIMARY KEY,
    data        BLOB NOT NULL,
    bytes       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
-- Who uploaded each bundle (sending its bytes proves holding them): a submission names
-- only a bundle its submitter uploaded, so a hash seen elsewhere runs no one's code.
CREATE TABLE bundle_uploads (
    hash        TEXT NOT NULL REFERENCES bundles(hash),
    uploaded_by TEXT NOT NULL,
    PRIMARY KEY (hash, uploaded_by)
);
