//! Coordinator settings: what people set (`CoordinatorSettings`, the same for
//! `headroom-coordinator` and `headroom up`, from flags, `HEADROOM_*` variables or the config
//! file) and the resolved configuration the application runs with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use headroom_shared::settings::duration;
use headroom_shared::spec::DEFAULT_MAX_JOBS;

/// The coordinator's settings, as flags (config-file keys are the same names).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Coordinator")]
pub struct CoordinatorSettings {
    /// Address the REST API listens on.
    #[arg(long, env = "HEADROOM_LISTEN", default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// Attempt logs live here, and the embedded store (unless a database URL is given).
    #[arg(long, env = "HEADROOM_DATA_DIR", default_value = ".headroom")]
    pub data_dir: PathBuf,
    /// An agent silent this long loses its leases.
    #[arg(long, env = "HEADROOM_LEASE_TTL", default_value = "30s", value_parser = duration)]
    pub lease_ttl: Duration,
    /// Most jobs one spec may expand into.
    #[arg(long, env = "HEADROOM_MAX_JOBS", default_value_t = DEFAULT_MAX_JOBS)]
    pub max_jobs: u64,
    /// Longest a claim, progress or log read is held open waiting for a change.
    #[arg(long, env = "HEADROOM_LONG_POLL", default_value = "25s", value_parser = duration)]
    pub long_poll: Duration,
    /// GPU telemetry older than this is deleted.
    #[arg(long, env = "HEADROOM_TELEMETRY_RETENTION", default_value = "24h", value_parser = duration)]
    pub telemetry_retention: Duration,
    /// Most telemetry samples kept per GPU (the oldest go first).
    #[arg(
        long,
        env = "HEADROOM_TELEMETRY_MAX_SAMPLES",
        default_value_t = 100_000
    )]
    pub telemetry_max_samples: u64,
}

impl CoordinatorSettings {
    /// The configuration to run with; `data_dir` is the settings' directory, resolved.
    pub fn config(&self, data_dir: PathBuf) -> CoordinatorConfig {
        CoordinatorConfig {
            lease_ttl: self.lease_ttl,
            max_jobs: self.max_jobs,
            long_poll: self.long_poll,
            telemetry_retention: self.telemetry_retention,
            telemetry_max_samples: self.telemetry_max_samples,
            ..CoordinatorConfig::new(self.listen, data_dir)
        }
    }
}

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub listen: SocketAddr,
    /// Where attempt logs (and the SQLite file, for the embedded store) live.
    pub data_dir: PathBuf,
    /// An agent silent this long loses its leases.
    pub lease_ttl: Duration,
    /// Longest a claim, progress or log read is held open waiting for a change.
    pub long_poll: Duration,
    /// Most jobs one spec may expand into.
    pub max_jobs: u64,
    /// A job waiting longer than this holds GPUs for itself instead of being overtaken.
    pub reserve_after: Duration,
    /// How long a stop signal waits for requests in flight before dropping them (under
    /// Kubernetes' default 30 s grace before SIGKILL).
    pub drain_timeout: Duration,
    /// GPU telemetry older than this is deleted.
    pub telemetry_retention: Duration,
    /// Most telemetry samples kept per GPU.
    pub telemetry_max_samples: u64,
    /// How often retention is applied.
    pub telemetry_prune_every: Duration,
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
            drain_timeout: Duration::from_secs(20),
            telemetry_retention: Duration::from_secs(24 * 3600),
            telemetry_max_samples: 100_000,
            telemetry_prune_every: Duration::from_secs(60),
        }
    }
}
