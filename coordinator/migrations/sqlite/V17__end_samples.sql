-- The GPU samples the latest attempt end on a node brought (taken after its verified
-- cleanup), beside the node's own samples: a finish records them here, last, instead of in
-- the node's row. Writing the node's row meant holding it from the finish's first statement
-- to its commit (a node's rows are locked before its attempts' and jobs'), so on PostgreSQL
-- a node's finishes and claims ran one after another. A claim woken without samples of its
-- own places with the newer of the two. No foreign key to `nodes`: checking one takes a share
-- lock of the node's row, which a claim holding it makes the finish wait for.
CREATE TABLE node_end_samples (
    node    TEXT PRIMARY KEY,
    samples TEXT NOT NULL,
    at      INTEGER NOT NULL
);
