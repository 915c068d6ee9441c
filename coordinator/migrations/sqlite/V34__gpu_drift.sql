-- Drift: a GPU whose use and the estimates placed on it are apart (`over`: it uses more;
-- `under`: it uses less), since when, and whether it has lasted past the alert's threshold.
CREATE TABLE gpu_drift (
    node      TEXT NOT NULL,
    gpu       BIGINT NOT NULL,
    direction TEXT NOT NULL,
    gap_mib   BIGINT NOT NULL,
    since     BIGINT NOT NULL,
    lasting   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (node, gpu)
);
