//! The agent as an explicit state machine: `Registering -> Serving -> Draining`. Registering
//! sweeps strays of earlier runs and verifies the GPUs; Serving long-polls the coordinator
//! for leases, admits each against live GPU memory and runs it (see [`crate::agent::lease`]) while
//! [`crate::agent::heartbeat`] renews the leases; Draining stops every attempt with the normal
//! cleanup and reports it.

pub mod attempts;
pub mod backoff;
pub mod client;
mod heartbeat;
pub mod join;
mod lease;
pub mod metrics;
pub mod self_fence;
pub mod settings;
pub mod standby;
pub mod sweep;
pub mod telemetry;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use headroom_shared::api::{
    ClaimRequest, ErrorCode, GpuSample, HandBackRequest, Headroom, Lease, RegisterRequest,
};
use headroom_shared::{AgentId, AttemptId};
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
use crate::supervisor::proto::FromSupervisor;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub coordinator: String,
    pub node: String,
    /// Applied at registration; `None` keeps the plan the coordinator has.
    pub plan: Option<String>,
    pub headroom: Headroom,
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

/// Where an agent instance keeps the agent id it registered with last.
const AGENT_ID_FILE: &str = "agent.id";

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

    /// Re-attaches to the supervisors of attempts a former run of this agent started that
    /// still run them, then collects the outcomes it journalled and did not report (but those
    /// of re-attached attempts, whose tasks report them).
    async fn recover(&self) -> Result<(), AgentError> {
        let scope = self.shared.scope.clone();
        // Supervisors by their sockets (they carry no marker), and attempts whose processes
        // do (a supervisor of an earlier version is marked; a job outlives its supervisor).
        let found = tokio::task::spawn_blocking(move || {
            let mut found: HashSet<AttemptId> = crate::procscan::marked_processes_scoped(Some((
                crate::agent::sweep::AGENT_VAR,
                &scope,
            )))
            .into_keys()
            .collect();
            match crate::supervisor::proto::listening(&scope) {
                Ok(listening) => found.extend(listening),
                Err(e) => tracing::warn!("cannot list attempt supervisors' sockets: {e}"),
            }
            found
        })
        .await
        .unwrap_or_default();
        for attempt in found {
            let hello = crate::supervisor::proto::connect(
                &self.shared.scope,
                attempt,
                &self.shared.attach_key,
                Duration::from_secs(2),
            )
            .await;
            // Of this agent's user and holding its key, and also a process this agent's data
            // directory started (its marker): nothing else is followed or signalled.
            let scope = self.shared.scope.as_str();
            let ours = |pid: Option<u32>| {
                pid.and_then(|p| crate::procscan::env_var(p, crate::agent::sweep::AGENT_VAR))
                    .as_deref()
                    == Some(scope)
            };
            let hello = match hello {
                Ok((conn, _)) if !ours(conn.peer_pid()) => {
                    tracing::warn!(
                        %attempt,
                        pid = ?conn.peer_pid(),
                        "a process that this agent did not start answers on the attempt's socket: left alone"
                    );
                    continue;
                }
                other => other,
            };
            match hello {
                Ok((
                    conn,
                    FromSupervisor::Hello {
                        fence,
                        gpus,
                        pid,
                        started_at,
                        ..
                    },
                )) => {
                    tracing::info!(%attempt, ?pid, "re-attached to a running attempt");
                    let stop = self.shared.attempts.begin(attempt, fence, &self.stopping);
                    // It keeps the deadline a former run gave it until this one renews.
                    let mut deadlines = self.shared.attempts.fence_deadline();
                    deadlines.borrow_and_update();
                    self.attempt_tasks.spawn(crate::agent::lease::follow(
                        self.shared.clone(),
                        attempt,
                        fence,
                        gpus,
                        conn,
                        pid.zip(started_at),
                        deadlines,
                        stop,
                        self.exit.clone(),
                        false,
                    ));
                }
                Ok(_) => {}
                // A supervisor that answers but cannot be re-attached (silent, another
                // protocol) is killed; its job's processes are swept as strays; a journalled
                // end is reported below.
                Err(e) => {
                    tracing::warn!(%attempt, "cannot re-attach to the attempt's supervisor: {e}");
                    // Only a process this agent's data directory started (its marker), of
                    // this agent's user: anyone may bind a name in the abstract namespace.
                    let killed =
                        crate::supervisor::proto::supervisor_pid(&self.shared.scope, attempt)
                            .filter(|&pid| {
                                crate::procscan::env_var(pid, crate::agent::sweep::AGENT_VAR)
                                    .as_deref()
                                    == Some(self.shared.scope.as_str())
                            })
                            .filter(|&pid| {
                                i32::try_from(pid).is_ok_and(|raw| {
                                    nix::sys::signal::kill(
                                        nix::unistd::Pid::from_raw(raw),
                                        nix::sys::signal::Signal::SIGKILL,
                                    )
                                    .is_ok()
                                })
                            });
                    if let Some(pid) = killed {
                        tracing::warn!(%attempt, pid, "killed the attempt's supervisor");
                    }
                }
            }
        }
        let journal = self.shared.outcomes.clone();
        let (pending, unreadable) = tokio::task::spawn_blocking(move || journal.pending())
            .await
            .map_err(std::io::Error::other)??;
        for e in unreadable {
            tracing::error!("a journalled outcome cannot be reported: {e}");
        }
        let attached = self.shared.attempts.running_ids();
        let unreported: Vec<Outcome> = pending
            .into_iter()
            .filter(|o| !attached.contains(&o.attempt))
            .collect();
        if !unreported.is_empty() {
            tracing::info!(
                outcomes = unreported.len(),
                "found outcomes an earlier run did not report; reporting them first"
            );
        }
        *self.unreported() = unreported;
        Ok(())
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

    async fn register(&self, mut backoff: Backoff, shutdown: &CancellationToken) -> State {
        // Before the coordinator hears of us: whatever it thinks of those attempts, processes
        // of attempts this agent does not run must go, and the GPUs be free of them.
        let killed = self.sweep().await;
        let req = RegisterRequest {
            node: self.shared.cfg.node.clone(),
            gpus: self.shared.backend.inventory(),
            // The plan given at start applies once: a later re-registration (coordinator
            // restart) must not undo a `plan set` made since.
            plan: if self.registered_once.load(Ordering::SeqCst) {
                None
            } else {
                self.shared.cfg.plan.clone()
            },
            headroom: Some(self.shared.cfg.headroom),
            version: env!("CARGO_PKG_VERSION").to_string(),
            // Attempts whose end is journalled keep their leases until it is reported, so
            // that their jobs are not given away meanwhile.
            running: self
                .shared
                .attempts
                .refs()
                .into_iter()
                .chain(self.unreported().iter().map(Outcome::attempt_ref))
                .collect(),
            previous: self.previous_agent(),
        };
        let sent = Instant::now();
        let resp = match self.shared.client.register(&req).await {
            Ok(resp) => resp,
            Err(e) if e.is_transient() => {
                tracing::warn!("registration failed, retrying: {e}");
                if !killed.is_empty() {
                    self.verify_gone(&killed, &[]).await;
                }
                return if backoff.wait(shutdown).await {
                    State::Registering { backoff }
                } else {
                    drained(Ok(()))
                };
            }
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::Unauthenticated | ErrorCode::Forbidden)
                ) =>
            {
                return drained(Err(AgentError::NotAuthorized(e)));
            }
            // Another agent instance is alive on this node (or won a race): it may stop, go
            // silent past the lease TTL, or an admin may let this one take over.
            Err(e) if e.code() == Some(ErrorCode::Conflict) => {
                tracing::warn!("cannot register yet, waiting: {e}");
                return if backoff.wait(shutdown).await {
                    State::Registering { backoff }
                } else {
                    drained(Ok(()))
                };
            }
            // A refused registration (bad plan, ...) will not fix itself.
            Err(e) => return drained(Err(AgentError::Refused(e))),
        };
        let ttl = Duration::from_millis(resp.lease_ttl_ms);
        let budget = match SelfFenceBudget::new(ttl, self.shared.cfg.supervisor.kill_grace) {
            Ok(b) => b,
            Err(e) => return drained(Err(e.into())),
        };
        self.registered_once.store(true, Ordering::SeqCst);
        self.remember_agent(resp.agent);
        // The registration renewed the leases of the attempts it named.
        self.shared.attempts.renewed_until(budget.deadline(sent));
        tracing::info!(agent = %resp.agent, plan = %resp.plan, gpus = req.gpus.len(), backend = self.shared.backend.kind(), "registered with the coordinator");
        self.shared.metrics.set_plan(&resp.plan);
        if !resp.lost_attempts.is_empty() {
            // Unscoped: also the leftovers of an agent version that did not mark its scope.
            let lost = resp.lost_attempts.clone();
            let n = tokio::task::spawn_blocking(move || {
                lost.into_iter()
                    .map(|a| attempt::kill_marked(a).len())
                    .sum::<usize>()
            })
            .await
            .unwrap_or(0);
            if n > 0 {
                tracing::warn!(
                    processes = n,
                    "killed leftovers of attempts the coordinator lost"
                );
            }
        }
        if !killed.is_empty() || !resp.lost_attempts.is_empty() {
            self.verify_gone(&killed, &resp.lost_attempts).await;
        }
        let unreported = std::mem::take(&mut *self.unreported());
        for outcome in &unreported {
            crate::agent::lease::report_outcome(&self.shared, outcome, shutdown).await;
        }
        State::Serving(Session {
            agent: resp.agent,
            plan: resp.plan,
            budget,
            renewed: sent,
        })
    }

    /// The agent id this instance (its data directory) last registered with.
    fn previous_agent(&self) -> Option<AgentId> {
        std::fs::read_to_string(self.shared.cfg.data_dir.join(AGENT_ID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kept so that this instance, restarted, registers again as its node's live agent.
    fn remember_agent(&self, agent: AgentId) {
        let dir = &self.shared.cfg.data_dir;
        let tmp = dir.join(format!("{AGENT_ID_FILE}.tmp"));
        let written = std::fs::write(&tmp, agent.to_string())
            .and_then(|()| std::fs::rename(&tmp, dir.join(AGENT_ID_FILE)));
        if let Err(e) = written {
            tracing::warn!("cannot keep the agent id in {}: {e}", dir.display());
        }
    }

    fn unreported(&self) -> std::sync::MutexGuard<'_, Vec<Outcome>> {
        self.unreported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Kills every process of this agent's scope whose attempt it does not run.
    async fn sweep(&self) -> HashMap<AttemptId, Vec<u32>> {
        let keep = self.shared.attempts.running_ids();
        let scope = self.shared.scope.clone();
        let cgroups = self.shared.cgroups.clone();
        let killed = tokio::task::spawn_blocking(move || {
            let mut killed = crate::agent::sweep::kill_strays(&scope, &keep);
            // Whatever a job did to its environment, its cgroup still holds it.
            for (attempt, pids) in cgroups.map(|c| c.kill_strays(&keep)).unwrap_or_default() {
                let list = killed.entry(attempt).or_default();
                for p in pids {
                    if !list.contains(&p) {
                        list.push(p);
                    }
                }
            }
            killed
        })
        .await
        .unwrap_or_default();
        if !killed.is_empty() {
            let pids: Vec<u32> = killed.values().flatten().copied().collect();
            tracing::warn!(
                attempts = killed.len(),
                ?pids,
                "killed processes of attempts this agent does not run (left by an earlier run)"
            );
        }
        killed
    }

    /// Waits (bounded by the verify timeout) until none of the `killed` pids lives and no
    /// process of those attempts or of `lost` is on a GPU, so new work is not admitted next
    /// to memory that is about to be freed. Polls, as cleanup does.
    async fn verify_gone(&self, killed: &HashMap<AttemptId, Vec<u32>>, lost: &[AttemptId]) -> bool {
        let attempts: HashSet<AttemptId> = killed.keys().chain(lost).copied().collect();
        let pids: Vec<u32> = killed.values().flatten().copied().collect();
        let deadline = Instant::now() + self.shared.cfg.supervisor.verify_timeout;
        loop {
            let samples = sample(&self.shared.backend).await;
            let p = pids.clone();
            let alive = tokio::task::spawn_blocking(move || {
                p.into_iter()
                    .filter(|&p| crate::procscan::is_alive(p))
                    .collect::<Vec<u32>>()
            })
            .await
            .unwrap_or_default();
            let on_gpus: Vec<u32> = samples
                .iter()
                .flat_map(|g| &g.processes)
                .filter(|p| {
                    p.attempt.is_some_and(|a| attempts.contains(&a)) || pids.contains(&p.pid)
                })
                .map(|p| p.pid)
                .collect();
            // No GPU reading is no proof, and a GPU that cannot be read is not verified free.
            let unknown = samples.is_empty() || samples.iter().any(|g| g.error.is_some());
            if !unknown && alive.is_empty() && on_gpus.is_empty() {
                tracing::info!(
                    attempts = attempts.len(),
                    "GPUs verified free of an earlier run's attempts"
                );
                return true;
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    ?alive,
                    ?on_gpus,
                    unknown,
                    "processes of an earlier run could not be verified gone; their memory stays \
                     counted as used by live free memory"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn serve(&self, mut session: Session, shutdown: &CancellationToken) -> State {
        let heartbeats = CancellationToken::new();
        self.tasks.spawn(crate::agent::heartbeat::run(
            self.shared.clone(),
            session.clone(),
            heartbeats.clone(),
        ));
        let stop_heartbeats = heartbeats.clone().drop_guard();
        let draining = |stop: tokio_util::sync::DropGuard| State::Draining {
            outcome: Ok(()),
            heartbeats: Some(stop.disarm()),
        };
        let mut backoff = Backoff::coordinator();
        loop {
            let samples = sample(&self.shared.backend).await;
            let req = ClaimRequest {
                gpus: samples,
                max: 64,
                watching: self.shared.attempts.watching(),
                known_plan: Some(session.plan.clone()),
                wait_ms: self.shared.cfg.claim_wait.as_millis() as u64,
            };
            // A lease is the coordinator's from when the claim was sent: counted from here, it
            // surely lasts the fence budget.
            let sent = Instant::now();
            let reply = tokio::select! {
                _ = shutdown.cancelled() => return draining(stop_heartbeats),
                r = self.shared.client.claim(session.agent, &req) => r,
            };
            match reply {
                Ok(resp) => {
                    backoff.reset();
                    if resp.plan != session.plan {
                        tracing::info!(plan = %resp.plan, "plan changed");
                        self.shared.metrics.set_plan(&resp.plan);
                        session.plan = resp.plan;
                    }
                    for attempt in resp.cancel {
                        if self.shared.attempts.stop(attempt, StopReason::User) {
                            tracing::info!(%attempt, "cancelling attempt");
                        }
                    }
                    if !resp.leases.is_empty() {
                        self.admit(resp.leases, sent, session.budget).await;
                    }
                }
                Err(ClientError::UnknownAgent(m)) => {
                    tracing::warn!("coordinator forgot this agent ({m}); registering again");
                    return State::Registering {
                        backoff: Backoff::coordinator(),
                    };
                }
                Err(e) => {
                    tracing::warn!("claim failed, retrying: {e}");
                    if !backoff.wait(shutdown).await {
                        return draining(stop_heartbeats);
                    }
                }
            }
        }
    }

    /// Admission at launch: re-read live memory; a lease that no longer fits goes back.
    /// `leased_until`: when the leases' own time (from the claim) runs out, less the fence
    /// budget; a launch's deadline is never earlier, whatever the last heartbeat said.
    async fn admit(&self, leases: Vec<Lease>, sent: Instant, budget: SelfFenceBudget) {
        let leased_until = budget.deadline(sent);
        let mut samples = sample(&self.shared.backend).await;
        let inventory = self.shared.backend.inventory();
        for lease in leases {
            // A GPU that cannot be read is never admitted to, whatever the estimate.
            let refusal = crate::gpu::unreadable(&samples, &lease.gpus).or_else(|| {
                let est = lease.estimate_mib?;
                lease.gpus.iter().find_map(|g| {
                    let total = inventory.iter().find(|i| i.index == *g)?.total_mib;
                    let free = samples.iter().find(|s| s.index == *g)?.free_mib;
                    let usable = free.saturating_sub(self.shared.cfg.headroom.mib_of(total));
                    (usable < est).then(|| {
                        format!(
                            "GPU {g} has {usable} MiB free beyond headroom, the job needs {est} MiB"
                        )
                    })
                })
            });
            if let Some(reason) = refusal {
                tracing::info!(attempt = %lease.attempt, "handing lease back: {reason}");
                let req = HandBackRequest {
                    fence: lease.fence,
                    reason,
                    gpus: samples.clone(),
                };
                if let Err(e) = self.shared.client.hand_back(lease.attempt, &req).await {
                    tracing::warn!(attempt = %lease.attempt, "hand back failed (the lease will expire): {e}");
                }
                continue;
            }
            if let Some(est) = lease.estimate_mib {
                // Later leases of this batch must not count on memory this one will take.
                for s in samples.iter_mut().filter(|s| lease.gpus.contains(&s.index)) {
                    s.free_mib = s.free_mib.saturating_sub(est);
                }
            }
            let baseline = crate::supervisor::attempt::Baseline::of(&samples, &lease.gpus);
            self.launch(lease, baseline, leased_until, budget);
        }
    }

    fn launch(
        &self,
        lease: Lease,
        baseline: crate::supervisor::attempt::Baseline,
        leased_until: Instant,
        budget: SelfFenceBudget,
    ) {
        let stop = self
            .shared
            .attempts
            .begin(lease.attempt, lease.fence, &self.stopping);
        tracing::info!(attempt = %lease.attempt, job = %lease.job, gpus = ?lease.gpus, "launching");
        self.shared
            .metrics
            .attempt_started(lease.attempt, &lease.gpus);
        self.attempt_tasks.spawn(crate::agent::lease::run(
            self.shared.clone(),
            lease,
            baseline,
            leased_until,
            budget,
            stop,
            self.exit.clone(),
        ));
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
    let b = backend.clone();
    let read = move || {
        let mut samples = crate::gpu::read(b.as_ref());
        for p in samples.iter_mut().flat_map(|g| g.processes.iter_mut()) {
            if p.attempt.is_none() && !p.outside_pid_namespace {
                (p.user, p.command) = crate::procscan::describe(p.pid);
            }
        }
        samples
    };
    let inventory = backend.inventory();
    tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
        tracing::warn!("GPU sample task failed: {e}");
        inventory
            .iter()
            .map(|g| crate::gpu::unknown(g.index, format!("GPU sample task failed: {e}")))
            .collect()
    })
}
