-- A lease renewal (every heartbeat, for each of the node's attempts) rewrote the index that
-- held the lease's expiry; the expiry sweep reads the live attempts from `attempts_live`
-- instead (as on PostgreSQL, where no index holding it lets a renewal touch no index).
DROP INDEX attempts_live_expiry;
