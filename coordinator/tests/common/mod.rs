//! A coordinator in this process on an embedded store and a free loopback port, for the HTTP
//! tests; it stops when dropped.

use std::sync::Arc;

use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorConfig};
use tokio_util::sync::CancellationToken;

pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    /// The coordinator's data directory.
    #[allow(dead_code)] // Not every test binary looks into it.
    pub data_dir: std::path::PathBuf,
    /// Claims' turns at the store.
    #[allow(dead_code)] // Not every test binary holds turns.
    pub admission: headroom_coordinator::admission::Admission,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts a coordinator with the defaults, changed by `configure`.
    pub async fn start(configure: impl FnOnce(CoordinatorConfig) -> CoordinatorConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("store.db")).expect("store");
        Self::start_on(dir, store, configure).await
    }

    /// As [`Server::start`], over a store the test prepared in `dir` (what an earlier run
    /// left).
    pub async fn start_on(
        dir: tempfile::TempDir,
        store: SqliteStore,
        configure: impl FnOnce(CoordinatorConfig) -> CoordinatorConfig,
    ) -> Self {
        let config = configure(CoordinatorConfig::new(
            "127.0.0.1:0".parse().expect("addr"),
            dir.path().to_path_buf(),
        ));
        let app = Application::build(config, Arc::new(store))
            .await
            .expect("build");
        let base = format!("http://{}", app.local_addr());
        let admission = app.admission();
        let stop = CancellationToken::new();
        tokio::spawn(app.run(stop.clone()));
        Self {
            admission,
            data_dir: dir.path().to_path_buf(),
            base,
            http: headroom_shared::client::http_builder()
                .build()
                .expect("an HTTP client"),
            stop,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// This process's peak resident memory (the coordinator runs in it), in MiB.
#[allow(dead_code)] // Not every test binary measures memory.
pub fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .expect("VmHWM")
}
