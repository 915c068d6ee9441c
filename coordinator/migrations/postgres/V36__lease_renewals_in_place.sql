-- A lease renewal (every heartbeat, for each of the node's attempts) wrote a new entry in
-- every index of `attempts`, because one index held the lease's expiry: with none holding
-- it (nor `waiting`), PostgreSQL updates the row in place (a heap-only tuple) and touches no
-- index. The expiry sweep reads the live attempts from `attempts_live` instead: a few
-- thousand rows every few seconds, against entries in ten indexes at every renewal. Room
-- left on each page keeps those in-place updates on the row's own page.
DROP INDEX attempts_live_expiry;
ALTER TABLE attempts SET (fillfactor = 90);
