//! `headroom up`: the coordinator on the embedded SQLite store and a local agent in one
//! process. The agent talks to the coordinator over HTTP like any remote agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use headroom_agent::agent::{Agent, AgentConfig};
use headroom_agent::gpu::{self, BackendChoice, FakeGpuSpec};
use headroom_agent::supervisor::SupervisorConfig;
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorConfig};
use headroom_shared::api::Headroom;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum GpuBackendKind {
    /// NVML when an NVIDIA driver is found, fake GPUs otherwise.
    Auto,
    Nvml,
    Fake,
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Address the REST API listens on.
    #[arg(long, env = "HEADROOM_LISTEN", default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// Where the store, logs and fake GPU files live.
    #[arg(long, env = "HEADROOM_DATA_DIR", default_value = ".headroom")]
    pub data_dir: PathBuf,
    /// This node's name.
    #[arg(long, env = "HEADROOM_NODE")]
    pub node: Option<String>,
    /// Slots per GPU, e.g. "2,2,2,2,1,1,1" (default: one per GPU, or the stored plan).
    #[arg(long, env = "HEADROOM_PLAN")]
    pub plan: Option<String>,
    /// GPU memory kept free: a share (`10%`) or a size (`2GiB`).
    #[arg(long, env = "HEADROOM_HEADROOM", default_value = "10%")]
    pub headroom: Headroom,
    #[arg(long, value_enum, env = "HEADROOM_GPU_BACKEND", default_value = "auto")]
    pub gpu_backend: GpuBackendKind,
    /// Fake GPUs, e.g. `4x24GiB` (with `--gpu-backend fake`, or when no driver is found).
    #[arg(long, env = "HEADROOM_FAKE_GPUS", default_value = "4x24GiB")]
    pub fake_gpus: FakeGpuSpec,
    /// Time a job gets between SIGTERM and SIGKILL.
    #[arg(long, env = "HEADROOM_KILL_GRACE", default_value = "10s", value_parser = humantime_duration)]
    pub kill_grace: Duration,
    /// How long cleanup may take to verify that an attempt left nothing on its GPUs before
    /// the GPUs are quarantined.
    #[arg(long, env = "HEADROOM_VERIFY_TIMEOUT", default_value = "30s", value_parser = humantime_duration)]
    pub verify_timeout: Duration,
    /// An agent silent this long loses its leases.
    #[arg(long, env = "HEADROOM_LEASE_TTL", default_value = "30s", value_parser = humantime_duration)]
    pub lease_ttl: Duration,
    /// Most jobs one spec may expand into.
    #[arg(long, env = "HEADROOM_MAX_JOBS", default_value_t = headroom_shared::spec::DEFAULT_MAX_JOBS)]
    pub max_jobs: u64,
    /// Kill processes that belong to no job and hold GPU memory (default: report, never kill).
    #[arg(long, env = "HEADROOM_KILL_FOREIGN")]
    pub kill_foreign: bool,
    /// Submit this spec once up, show progress, and exit when every job has ended.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// A TOML file of settings (keys are the flags' names); flags and variables win over it.
    #[arg(long, env = "HEADROOM_CONFIG")]
    pub config: Option<PathBuf>,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration like `10s` or `500ms`: {e}"))
}

/// `quiet`: only warnings by default, so a progress bar is not buried under log lines.
fn init_tracing(quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = if quiet { "warn" } else { "info" };
    let filter =
        EnvFilter::try_from_env("HEADROOM_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub async fn run(args: UpArgs) -> Result<i32> {
    // First: a stop signal during start-up must stop us cleanly too.
    let shutdown = CancellationToken::new();
    headroom_shared::signals::cancel_on_stop_signal(shutdown.clone())?;
    init_tracing(args.run.is_some());
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data dir {}", args.data_dir.display()))?;
    let data_dir = args
        .data_dir
        .canonicalize()
        .with_context(|| format!("data dir {}", args.data_dir.display()))?;
    // One `headroom up` per data directory: a second one would register the same node and
    // declare the first one's running jobs lost.
    let _lock = lock_data_dir(&data_dir)?;
    let fake_dir = data_dir.join("fake-gpus");
    let choice = match args.gpu_backend {
        GpuBackendKind::Nvml => BackendChoice::Nvml,
        GpuBackendKind::Fake => BackendChoice::Fake {
            spec: args.fake_gpus.clone(),
            dir: fake_dir,
        },
        GpuBackendKind::Auto => BackendChoice::Auto {
            fake_fallback: args.fake_gpus.clone(),
            dir: fake_dir,
        },
    };
    let backend = gpu::open(&choice).context("opening the GPU backend")?;
    if let Some(p) = &args.plan {
        headroom_shared::Plan::parse_for(p, backend.inventory().len())
            .with_context(|| format!("--plan {p:?}"))?;
    }

    let db = data_dir.join("headroom.db");
    let store = {
        let path = db.clone();
        tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await?
            .with_context(|| format!("opening the store {}", db.display()))?
    };
    let mut config = CoordinatorConfig::new(args.listen, data_dir.clone());
    config.lease_ttl = args.lease_ttl;
    config.max_jobs = args.max_jobs;
    let app = Application::build(config, Arc::new(store)).await?;
    let addr = app.local_addr();
    let url = format!("http://{addr}");
    // A plain line on stdout that scripts and tests can wait for.
    println!(
        "headroom: coordinator listening on {url} (store {})",
        db.display()
    );

    let tasks = TaskTracker::new();
    let coord_stop = CancellationToken::new();
    let coordinator = tasks.spawn(app.run(coord_stop.clone()));
    let supervisor = SupervisorConfig {
        kill_grace: args.kill_grace,
        verify_timeout: args.verify_timeout,
        launcher: Some(headroom_agent::launcher::SELF_EXE.into()),
        ..SupervisorConfig::default()
    };
    let agent = Agent::new(
        AgentConfig {
            coordinator: url.clone(),
            node: args.node.clone().unwrap_or_else(host_name),
            plan: args.plan.clone(),
            headroom: args.headroom,
            data_dir: data_dir.join("agent"),
            supervisor,
            claim_wait: Duration::from_secs(20),
            kill_foreign: args.kill_foreign,
        },
        backend,
    )?;
    let agent_task = tasks.spawn(agent.run(shutdown.clone()));
    tasks.close();

    let mut code = 0;
    if let Some(spec) = &args.run {
        let api = crate::client::Api::new(&url)?;
        tokio::select! {
            r = crate::submit(&api, spec, true, false, None) => {
                code = match r {
                    Ok(c) => c,
                    Err(e) => { eprintln!("error: {e:#}"); 1 }
                };
            }
            _ = shutdown.cancelled() => {}
        }
    } else {
        shutdown.cancelled().await;
    }
    tracing::info!("shutting down: stopping running attempts");
    // The agent drains first (its attempts report their end), then the coordinator stops.
    shutdown.cancel();
    if let Ok(Err(e)) = agent_task.await {
        tracing::warn!("agent: {e}");
    }
    coord_stop.cancel();
    if let Ok(Err(e)) = coordinator.await {
        tracing::warn!("coordinator: {e}");
    }
    tasks.wait().await;
    Ok(code)
}

/// Holds an exclusive lock on `<data dir>/lock` for the life of the process.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File> {
    let path = dir.join("lock");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `headroom up` is using the data dir {} (stop it, or pass --data-dir)",
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}
