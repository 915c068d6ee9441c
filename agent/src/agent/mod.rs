//! The agent as an explicit state machine: `Registering -> Serving -> Draining`, its steps
//! in `run` (here). Before it, `recover` re-attaches to the attempts an earlier run left
//! running. Registering (`register`) sweeps strays of earlier runs and verifies the GPUs;
//! Serving (`claim`) long-polls the coordinator for leases, admits each against live GPU
//! memory and runs it (see [`crate::agent::lease`]) while [`crate::agent::heartbeat`] renews
//! the leases; Draining (`drain`, here) stops every attempt with the normal cleanup and
//! reports it, or leaves it to its supervisor.

pub mod attempts;
pub mod backoff;
mod claim;
pub mod client;
mod code;
mod heartbeat;
pub mod join;
mod lease;
pub mod metrics;
mod readings;
mod recover;
mod register;
pub mod self_fence;
pub mod settings;
pub mod standby;
pub mod sweep;
pub mod telemetry;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use headroom_shared::AgentId;
use headroom_shared::api::{GpuSample, Headroom};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::attempts::{Attempts, AttemptsError, StopReason};
use crate::agent::backoff::Backoff;
use crate::agent::client::{BearerToken, Client, ClientError};
use crate::agent::self_fence::{SelfFenceBudget, SelfFenceError};
use crate::gpu::{BackendChoice, GpuBackend};
use crate::outcomes::{Outcome, Outcomes, OutcomesError};
use crate::supervisor::attempt::{self, SupervisorConfig};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub coordinator: String,
    pub node: String,
    /// Applied at registration; `None` keeps the plan the coordinator has.
    pub plan: Option<String>,
    pub headroom: Headroom,
    /// Host memory usable by jobs (MiB), reported at registration: jobs are admitted
    /// against it.
    pub host_memory_mib: Option<u64>,
    /// Attempt logs are written under `<data_dir>/logs`; quarantines are kept here too, and
    /// the directory names this agent's jobs on the host (see [`crate::agent::sweep`]).
    pub data_dir: PathBuf,
    pub supervisor: SupervisorConfig,
    /// How long one claim may wait for work.
    pub claim_wait: Duration,
    /// Kill processes of no attempt that hold memory on this node's GPUs (off by default:
    /// they are reported and left alone).
    pub kill_foreign: bool,
    /// Give each attempt a cgroup where the agent can (`--no-cgroups`: never).
    pub cgroups: bool,
    /// How often GPU telemetry is sampled (zero: never).
    pub telemetry_interval: Duration,
    /// Most telemetry samples kept while the coordinator cannot be reached.
    pub telemetry_buffer: usize,
    /// Where `GET /metrics` is served (none: not at all).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Sent as `Authorization: Bearer` on every call (a token of role `agent`).
    /// Certificates to trust for an `https://` coordinator, beside the system's.
    pub ca_file: Option<std::path::PathBuf>,
    pub token: Option<BearerToken>,
    /// The GPU backend, as each attempt's supervisor process opens it too.
    pub gpu: BackendChoice,
    /// What an exit (SIGTERM, SIGINT) does to running attempts.
    pub on_exit: OnExit,
    /// The binary run as each attempt's supervisor ([`crate::supervisor`]): the agent's own.
    pub supervisor_exe: PathBuf,
    /// Variables of the agent's environment passed to jobs besides [`crate::jobenv::PASS_THROUGH`].
    pub pass_env: Vec<String>,
    /// Where each job's own directory (`HEADROOM_JOB_DIR`) is made.
    pub job_dirs: PathBuf,
    /// The Unix user of jobs whose submitter maps to none (agents running as root).
    pub run_as_default: String,
}

/// What an exiting agent does to the attempts it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnExit {
    /// Leave them running under their supervisors (an upgrade or restart): an agent started
    /// again on the same data directory re-attaches; with none within the lease, they stop
    /// themselves before the coordinator may give their jobs away.
    #[default]
    Detach,
    /// Stop them with the normal cleanup and report them (requeued per their retry policy).
    Stop,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("coordinator client: {0}")]
    Client(#[from] ClientError),
    #[error("data directory: {0}")]
    Io(#[from] std::io::Error),
    #[error("quarantine file: {0}")]
    Attempts(#[from] AttemptsError),
    #[error("outcome journal: {0}")]
    Outcomes(#[from] OutcomesError),
    /// The coordinator's lease TTL leaves no room to stop jobs before their leases expire.
    #[error("{0}")]
    Fence(#[from] SelfFenceError),
    #[error("the coordinator refused this agent: {0}")]
    Refused(ClientError),
    #[error("cannot serve metrics on {addr}: {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "the coordinator did not accept this agent's token: {0} (give the agent a token of \
         role agent with --agent-token or HEADROOM_AGENT_TOKEN; an admin makes one with \
         `headroom token create --role agent --name NODE`)"
    )]
    NotAuthorized(ClientError),
    #[error("{0}")]
    PassEnv(#[from] crate::jobenv::PassEnvError),
    #[error("--run-as-default: {0}")]
    RunAs(String),
    #[error(
        "another agent is using the data dir {} (stop it, or give this one --data-dir)",
        .0.display()
    )]
    DataDirInUse(PathBuf),
}

/// The agent's states; each step of `run` moves from one to the next.
enum State {
    Registering {
        backoff: Backoff,
    },
    Serving(Session),
    Draining {
        outcome: Result<(), AgentError>,
        /// The session's heartbeats, kept going until the attempts have stopped so that
        /// their leases stay ours while they are cleaned up.
        heartbeats: Option<CancellationToken>,
    },
}

#[derive(Clone)]
pub(crate) struct Session {
    pub agent: AgentId,
    pub plan: String,
    pub budget: SelfFenceBudget,
    /// When the registration that renewed the leases was sent.
    pub renewed: Instant,
}

/// What the agent's tasks share.
pub(crate) struct Shared {
    pub cfg: AgentConfig,
    pub client: Client,
    pub backend: Arc<dyn GpuBackend>,
    pub attempts: Attempts,
    /// End reports not yet answered by the coordinator (see [`crate::outcomes`]).
    pub outcomes: Outcomes,
    /// The value of [`crate::agent::sweep::AGENT_VAR`] on this agent's jobs.
    pub scope: String,
    /// Where attempts get their cgroups (`None`: unavailable, markers instead).
    pub cgroups: Option<crate::cgroup::Cgroups>,
    /// GPU telemetry, sampled at `cfg.telemetry_interval`, shipped with heartbeats.
    pub telemetry: crate::agent::telemetry::Telemetry,
    pub metrics: crate::agent::metrics::AgentMetrics,
    /// Starts attempt supervisors, one ahead of the next lease; they write what goes wrong
    /// to `<data dir>/supervisors.log`.
    pub standby: Arc<crate::agent::standby::Standby>,
    /// What jobs start from: the agent's pass-through variables ([`crate::jobenv`]).
    pub job_base_env: std::collections::BTreeMap<String, String>,
    /// What a re-attach proves to a supervisor ([`crate::supervisor::proto::attach_key`]).
    pub attach_key: String,
    /// Code bundles being fetched and unpacked ([`crate::agent::code`]).
    pub bundles: crate::agent::code::Bundles,
}

pub struct Agent {
    shared: Arc<Shared>,
    /// One task per attempt.
    attempt_tasks: TaskTracker,
    /// Heartbeats.
    tasks: TaskTracker,
    /// Parent of every attempt's stop signal: cancelled when the agent exits stopping them.
    stopping: CancellationToken,
    exit: crate::agent::lease::Exit,
    registered_once: AtomicBool,
    /// Outcomes an earlier run journalled and did not get answered: kept (declared at
    /// registration) and reported before any new work is taken.
    unreported: Mutex<Vec<Outcome>>,
    /// Bound at start, so a taken port fails the start rather than later.
    metrics_listener: Mutex<Option<std::net::TcpListener>>,
    /// Held for the agent's life: one agent per data directory.
    _data_lock: std::fs::File,
    /// Removes this agent's cgroup directories at exit when empty.
    _cgroups: crate::cgroup::Tidy,
}

/// An exclusive lock on `<data dir>/agent.lock`: a second agent on the same directory would
/// sweep the first one's jobs and register as its node.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, AgentError> {
    let path = dir.join("agent.lock");
    let file = std::fs::File::create(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(AgentError::DataDirInUse(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

impl Agent {
    /// Blocking (reads the data dir): call before the agent's work starts.
    pub fn new(cfg: AgentConfig, backend: Arc<dyn GpuBackend>) -> Result<Self, AgentError> {
        crate::jobenv::check_extra(&cfg.pass_env)?;
        match crate::runas::check_default(&cfg.run_as_default).map_err(AgentError::RunAs)? {
            Some(me) => tracing::warn!(
                "not running as root: every job runs as this agent's user ({me}), whoever \
                 submitted it, and can read what that user can (this agent's token and data \
                 directory among it): serve one user's jobs with it, or run the agent as root \
                 so that each job runs as its submitter's Unix user"
            ),
            None => tracing::info!(
                default = %cfg.run_as_default,
                "jobs run as their submitters' Unix users (the default for those without one)"
            ),
        }
        let pass_env = cfg.pass_env.clone();
        std::fs::create_dir_all(cfg.data_dir.join("logs"))?;
        let data_lock = lock_data_dir(&cfg.data_dir)?;
        {
            // Logs, journal and keys are the agent's alone; jobs of other users only pass
            // through, to the fake GPUs' folder.
            use std::os::unix::fs::PermissionsExt;
            let mode = |m| std::fs::Permissions::from_mode(m);
            std::fs::set_permissions(&cfg.data_dir, mode(0o711))?;
            std::fs::set_permissions(cfg.data_dir.join("logs"), mode(0o700))?;
        }
        let attach_key = crate::supervisor::proto::attach_key(&cfg.data_dir)?;
        let mut cfg = cfg;
        cfg.data_dir = cfg.data_dir.canonicalize()?;
        let attempts = Attempts::load(&cfg.data_dir)?;
        let outcomes = Outcomes::open(&cfg.data_dir)?;
        let supervisor_log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(cfg.data_dir.join("supervisors.log"))
            .map_err(|e| tracing::warn!("supervisors.log: {e}"))
            .ok();
        let metrics_listener = match cfg.metrics_addr {
            Some(addr) => Some(
                std::net::TcpListener::bind(addr)
                    .map_err(|source| AgentError::MetricsListen { addr, source })?,
            ),
            None => None,
        };
        let telemetry =
            crate::agent::telemetry::Telemetry::new(cfg.telemetry_interval, cfg.telemetry_buffer);
        let metrics = crate::agent::metrics::AgentMetrics::new(
            &cfg.node,
            backend.inventory(),
            telemetry.clone(),
            attempts.clone(),
        );
        let scope = crate::agent::sweep::scope_of(&cfg.data_dir);
        let cgroups = crate::cgroup::for_agent(cfg.cgroups, &scope);
        let cgroups_at_exit = cgroups.clone();
        let standby = crate::agent::standby::Standby::new(
            cfg.supervisor_exe.clone(),
            scope.clone(),
            supervisor_log,
            Some(cfg.gpu.clone()),
        );
        Ok(Self {
            shared: Arc::new(Shared {
                client: Client::new_with(&cfg.coordinator, cfg.ca_file.as_deref())?
                    .with_token(cfg.token.as_ref().map(BearerToken::expose))?,
                scope,
                cgroups,
                cfg,
                backend,
                attempts,
                outcomes,
                telemetry,
                metrics,
                standby,
                job_base_env: crate::jobenv::for_jobs(std::env::vars_os(), &pass_env),
                attach_key,
                bundles: Default::default(),
            }),
            attempt_tasks: TaskTracker::new(),
            tasks: TaskTracker::new(),
            stopping: CancellationToken::new(),
            exit: crate::agent::lease::Exit {
                giving_up: CancellationToken::new(),
                detach: CancellationToken::new(),
            },
            registered_once: AtomicBool::new(false),
            unreported: Mutex::new(Vec::new()),
            metrics_listener: Mutex::new(metrics_listener),
            _data_lock: data_lock,
            _cgroups: crate::cgroup::Tidy(cgroups_at_exit),
        })
    }

    /// Where `/metrics` is served, when it is.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Runs until `shutdown`, then stops every attempt and reports it before returning.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), AgentError> {
        if let Err(e) = attempt::become_subreaper() {
            tracing::warn!("cannot become child subreaper, orphans may escape to init: {e}");
        }
        // Sampling and the metrics page run for the agent's whole life, heartbeats or not.
        let background = CancellationToken::new();
        let _stop_background = background.clone().drop_guard();
        self.tasks.spawn(
            self.shared
                .telemetry
                .clone()
                .run(self.shared.backend.clone(), background.clone()),
        );
        let listener = self
            .metrics_listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(listener) = listener {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
            }
            self.tasks.spawn(
                self.shared
                    .metrics
                    .clone()
                    .serve(listener, background.clone()),
            );
        }
        self.recover().await?;
        // The first lease, too, goes to a supervisor that is already waiting.
        self.shared.standby.refill();
        let mut state = State::Registering {
            backoff: Backoff::coordinator(),
        };
        let (outcome, heartbeats) = loop {
            state = match state {
                State::Registering { backoff } => self.register(backoff, &shutdown).await,
                State::Serving(session) => self.serve(session, &shutdown).await,
                State::Draining {
                    outcome,
                    heartbeats,
                } => break (outcome, heartbeats),
            };
        };
        background.cancel();
        // No lease comes any more: the waiting supervisor exits.
        self.shared.standby.close();
        self.drain(heartbeats).await;
        outcome
    }

    fn unreported(&self) -> std::sync::MutexGuard<'_, Vec<Outcome>> {
        self.unreported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// With [`OnExit::Stop`], stops every attempt with the normal cleanup and waits until
    /// each is reported, the heartbeats renewing their leases meanwhile; with
    /// [`OnExit::Detach`], leaves them to their supervisors and reports only the ends
    /// already known.
    async fn drain(&self, heartbeats: Option<CancellationToken>) {
        match self.shared.cfg.on_exit {
            OnExit::Stop => {
                let n = self.shared.attempts.stop_all(StopReason::Shutdown);
                if n > 0 {
                    tracing::info!(attempts = n, "stopping running attempts");
                }
                self.stopping.cancel();
            }
            OnExit::Detach => {
                let n = self.shared.attempts.running_count();
                if n > 0 {
                    tracing::info!(
                        attempts = n,
                        "leaving running attempts to their supervisors (on-exit = detach): an \
                         agent started again on this data directory re-attaches; without one \
                         they stop themselves before their leases expire"
                    );
                }
                self.exit.detach.cancel();
            }
        }
        self.exit.giving_up.cancel();
        self.attempt_tasks.close();
        self.attempt_tasks.wait().await;
        if let Some(h) = heartbeats {
            h.cancel();
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

fn drained(outcome: Result<(), AgentError>) -> State {
    State::Draining {
        outcome,
        heartbeats: None,
    }
}

/// Live GPU samples, read off the runtime (NVML and /proc reads block): every GPU, each with
/// its own error if its reading failed, never an empty list.
pub async fn sample(backend: &Arc<dyn GpuBackend>) -> Vec<GpuSample> {
    let read = reading(backend);
    read_samples(read.await, backend)
}

/// A reading of every GPU, started off the runtime (see [`sample`]).
fn reading(backend: &Arc<dyn GpuBackend>) -> tokio::task::JoinHandle<Vec<GpuSample>> {
    let b = backend.clone();
    tokio::task::spawn_blocking(move || {
        let mut samples = crate::gpu::read(b.as_ref());
        for p in samples.iter_mut().flat_map(|g| g.processes.iter_mut()) {
            if p.attempt.is_none() && !p.outside_pid_namespace {
                (p.user, p.command) = crate::procscan::describe(p.pid);
            }
        }
        samples
    })
}

/// A [`reading`]'s samples, or every GPU unknown when its task failed.
fn read_samples(
    read: Result<Vec<GpuSample>, tokio::task::JoinError>,
    backend: &Arc<dyn GpuBackend>,
) -> Vec<GpuSample> {
    read.unwrap_or_else(|e| {
        tracing::warn!("GPU sample task failed: {e}");
        crate::gpu::all_unknown(
            &backend.inventory(),
            &format!("GPU sample task failed: {e}"),
        )
    })
}
