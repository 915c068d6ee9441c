//! Coordinator settings with their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use headroom_shared::spec::DEFAULT_MAX_JOBS;

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub listen: SocketAddr,
    /// Where attempt logs (and the SQLite file, for the embedded store) live.
    pub data_dir: PathBuf,
    /// An agent silent this long loses its leases.
    pub lease_ttl: Duration,
    /// Longest a claim or progress request is held open waiting for a change.
    pub long_poll: Duration,
    /// Most jobs one spec may expand into.
    pub max_jobs: u64,
    /// A job waiting longer than this holds GPUs for itself instead of being overtaken.
    pub reserve_after: Duration,
}

impl CoordinatorConfig {
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Self {
        Self {
            listen,
            data_dir,
            lease_ttl: Duration::from_secs(30),
            long_poll: Duration::from_secs(25),
            max_jobs: DEFAULT_MAX_JOBS,
            reserve_after: Duration::from_secs(600),
        }
    }
}
