//! `Application`: binds the listener, wires the store into the router, runs the lease
//! sweeper and the store's change watch, and shuts down cleanly on cancellation.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{AppState, router};
use crate::auth::Authenticator;
use crate::config::CoordinatorConfig;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Serve(std::io::Error),
    #[error("the configured tokens' users: {0}")]
    Users(crate::store::StoreError),
    #[error(
        "refusing to listen on {addr} without tokens: anyone who can reach it could run \
         commands on every GPU node. Give a bootstrap admin token (--admin-token or \
         HEADROOM_ADMIN_TOKEN, e.g. `export HEADROOM_ADMIN_TOKEN=$(openssl rand -hex 24)`) or a \
         tokens file (--tokens-file), or listen on a loopback address (127.0.0.1)"
    )]
    OpenToTheNetwork { addr: SocketAddr },
}

pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    /// Binds `config.listen` (port 0 picks a free port) over `store`.
    pub async fn build(config: CoordinatorConfig, store: Arc<dyn Store>) -> Result<Self, AppError> {
        check_exposure(&config)?;
        if config.tokens.is_empty() {
            tracing::warn!(
                listen = %config.listen,
                "no tokens: every local account is this coordinator's admin (submit, cancel, \
                 plans). Only requests to a loopback name from this machine's own programs are \
                 answered, users cannot be mapped to Unix users, and jobs run as the agent's own \
                 or default user (never root). Give --admin-token to make it private."
            );
        }
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| AppError::Bind {
                addr: config.listen,
                source,
            })?;
        // Names the configuration gives are users too: a stored token cannot take them.
        let users = config
            .tokens
            .iter()
            .map(|t| (t.name.clone(), t.role, t.unix_user.clone()))
            .collect();
        store.ensure_users(users).await.map_err(AppError::Users)?;
        let admission = crate::admission::Admission::new(config.max_claims, config.claim_turn_wait);
        let state = AppState {
            changes: store.changes(),
            auth: Arc::new(Authenticator::new(config.tokens.clone(), store.clone())),
            store,
            config: Arc::new(config),
            metrics: crate::metrics::CoordinatorMetrics::new(),
            progress: Default::default(),
            refusals: Default::default(),
            admission,
            owners: crate::owners::Owners::default(),
        };
        Ok(Self { listener, state })
    }

    /// Claims' turns at the store (tests hold turns through it).
    pub fn admission(&self) -> crate::admission::Admission {
        self.state.admission.clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.state.config.listen)
    }

    /// Serves until `shutdown` is cancelled, then drains requests and background tasks.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), AppError> {
        let tasks = TaskTracker::new();
        tasks.spawn(sweep_leases(self.state.clone(), shutdown.clone()));
        tasks.spawn(prune_telemetry(self.state.clone(), shutdown.clone()));
        tasks.spawn(crate::tracking::run(self.state.clone(), shutdown.clone()));
        tasks.spawn(crate::settle::run(self.state.clone(), shutdown.clone()));
        tasks.spawn(crate::charging::run(self.state.clone(), shutdown.clone()));
        tasks.spawn(crate::preempting::run(self.state.clone(), shutdown.clone()));
        tasks.spawn(crate::alerting::run(self.state.clone(), shutdown.clone()));
        // Other replicas' changes wake this process's long-polls too.
        let (store, changes) = (self.state.store.clone(), self.state.changes.clone());
        let stop = shutdown.clone();
        tasks.spawn(async move {
            store
                .watch_changes(Arc::new(move |c| changes.bump(c)), stop)
                .await
        });
        let app = router(self.state.clone());
        // Draining: stop accepting, answer held long-polls at once, finish requests in flight.
        let changes = self.state.changes.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            stop.cancelled().await;
            tracing::info!("draining: no new requests, answering long-polls");
            changes.close();
        });
        let serve =
            crate::serve::serve(self.listener, app, self.state.config.http, shutdown.clone());
        // A request stuck on an unreachable database must not hold the exit for ever.
        let limit = self.state.config.drain_timeout;
        let stop = shutdown.clone();
        let served = tokio::select! {
            r = serve => r,
            _ = async { stop.cancelled().await; tokio::time::sleep(limit).await } => {
                tracing::warn!(?limit, "requests still in flight after the drain limit: dropping them");
                Ok(())
            }
        };
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        served.map_err(AppError::Serve)
    }
}

/// Keeps GPU telemetry within its retention: every minute, deletes what is too old or beyond
/// the count kept per GPU, in bounded batches (one transaction each) so that heartbeats are
/// never held behind one long delete.
async fn prune_telemetry(state: AppState, shutdown: CancellationToken) {
    const BATCH: u32 = 5_000;
    let mut tick = tokio::time::interval(state.config.telemetry_prune_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let keep = crate::store::Retention {
            older_than: crate::store::now_ms()
                .saturating_sub(state.config.telemetry_retention.as_millis() as i64),
            keep_per_gpu: state.config.telemetry_max_samples,
            batch: BATCH,
        };
        let mut total = 0;
        loop {
            match state.store.prune_telemetry(keep).await {
                Ok(n) => {
                    total += n;
                    if n < u64::from(BATCH) || shutdown.is_cancelled() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!("telemetry pruning failed: {e}");
                    break;
                }
            }
        }
        if total > 0 {
            tracing::debug!(rows = total, "old telemetry pruned");
        }
    }
}

/// A coordinator reachable beyond this machine must require tokens: refused otherwise, before
/// anything is opened (binaries call it first; `Application::build` checks again).
/// Files and directories this process makes are its user's alone (umask 077).
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Makes a data directory private (`mode`: 0700, or 0711 where jobs of other users must pass
/// through to the fake GPUs' folder), and its logs and store files its owner's alone, as
/// they are made with the process's umask (077) but may come from an older version.
pub fn private_dir(dir: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let no_link = |p: &std::path::Path| {
        headroom_shared::datadir::not_a_link(p).map_err(std::io::Error::other)
    };
    no_link(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    for (name, mode) in [
        ("logs", 0o700),
        ("headroom.db", 0o600),
        ("headroom.db-wal", 0o600),
        ("headroom.db-shm", 0o600),
    ] {
        let path = dir.join(name);
        // A link planted there would turn the chmod on its target.
        if no_link(&path)? {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

pub fn check_exposure(config: &CoordinatorConfig) -> Result<(), AppError> {
    if config.tokens.is_empty() && !config.listen.ip().is_loopback() {
        return Err(AppError::OpenToTheNetwork {
            addr: config.listen,
        });
    }
    Ok(())
}

/// Marks attempts whose agent went silent as lost, a few times per lease TTL.
async fn sweep_leases(state: AppState, shutdown: CancellationToken) {
    let every = state.config.lease_ttl / 4;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match state.store.expire_due_leases().await {
            Ok(lost) if !lost.is_empty() => {
                tracing::warn!(
                    count = lost.len(),
                    "leases expired: attempts recorded as lost"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("lease sweep failed: {e}"),
        }
    }
}
