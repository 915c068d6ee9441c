//! The agent as an explicit state machine: `Registering -> Serving -> Draining`. Serving
//! long-polls the coordinator for leases, admits each against live GPU memory, runs it under
//! the supervisor, ships its log, and reports its end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use headroom_shared::api::{
    AttemptRef, ClaimRequest, FinishReport, GpuSample, HandBackRequest, Headroom, HeartbeatRequest,
    Lease, RegisterRequest, StartReport,
};
use headroom_shared::{AgentId, AttemptId, FailureClass};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{Client, ClientError};
use crate::gpu::GpuBackend;
use crate::supervisor::{self, AttemptEnd, Launch, SupervisorConfig};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub coordinator: String,
    pub node: String,
    /// Applied at registration; `None` keeps the plan the coordinator has.
    pub plan: Option<String>,
    pub headroom: Headroom,
    /// Attempt logs are written under `<data_dir>/logs`.
    pub data_dir: PathBuf,
    pub supervisor: SupervisorConfig,
    /// How long one claim may wait for work.
    pub claim_wait: Duration,
    /// Kill processes of no attempt that hold memory on this node's GPUs (off by default:
    /// they are reported and left alone).
    pub kill_foreign: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("coordinator client: {0}")]
    Client(#[from] ClientError),
    #[error("data directory: {0}")]
    Io(#[from] std::io::Error),
}

/// The agent's states; each step of `run` moves from one to the next.
enum State {
    Registering { backoff: Duration },
    Serving(Session),
    Draining,
}

#[derive(Clone)]
struct Session {
    agent: AgentId,
    plan: String,
    ttl: Duration,
}

/// Why the agent stopped an attempt before it ended by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopReason {
    /// A user cancelled the job.
    User,
    /// The lease could not be renewed for its TTL: the coordinator may have given the job to
    /// another node, so this one must not keep running it.
    LeaseLost,
}

/// One attempt the agent is running.
struct Running {
    fence: i64,
    cancel: CancellationToken,
    /// Set before `cancel` fires; unset when the agent is shutting down.
    reason: Arc<OnceLock<StopReason>>,
}

impl Running {
    fn stop(&self, reason: StopReason) {
        let _ = self.reason.set(reason);
        self.cancel.cancel();
    }
}

pub struct Agent {
    cfg: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    client: Client,
    running: Arc<Mutex<HashMap<AttemptId, Running>>>,
    tasks: TaskTracker,
    /// Cancelled when the agent drains: attempts stop and are reported lost.
    draining: CancellationToken,
    quarantined: Quarantined,
    registered_once: std::sync::atomic::AtomicBool,
}

/// Ended attempts whose cleanup could not be verified: their GPUs and the pids that still
/// held memory. Heartbeats report them released once those are gone.
type Quarantined = Arc<Mutex<HashMap<AttemptId, (Vec<u32>, Vec<u32>)>>>;

const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Agent {
    pub fn new(cfg: AgentConfig, backend: Arc<dyn GpuBackend>) -> Result<Self, AgentError> {
        std::fs::create_dir_all(cfg.data_dir.join("logs"))?;
        Ok(Self {
            client: Client::new(&cfg.coordinator)?,
            cfg,
            backend,
            running: Arc::default(),
            tasks: TaskTracker::new(),
            draining: CancellationToken::new(),
            quarantined: Arc::default(),
            registered_once: Default::default(),
        })
    }

    /// Runs until `shutdown`, then stops every attempt and reports it before returning.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), AgentError> {
        if let Err(e) = supervisor::become_subreaper() {
            tracing::warn!("cannot become child subreaper, orphans may escape to init: {e}");
        }
        let mut state = State::Registering {
            backoff: Duration::from_millis(100),
        };
        loop {
            state = match state {
                State::Registering { backoff } => self.register(backoff, &shutdown).await,
                State::Serving(session) => self.serve(session, &shutdown).await,
                State::Draining => break,
            };
        }
        self.drain().await;
        Ok(())
    }

    async fn register(&self, backoff: Duration, shutdown: &CancellationToken) -> State {
        let req = RegisterRequest {
            node: self.cfg.node.clone(),
            gpus: self.backend.inventory(),
            // The plan given at start applies once: a later re-registration (coordinator
            // restart) must not undo a `plan set` made since.
            plan: if self
                .registered_once
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                None
            } else {
                self.cfg.plan.clone()
            },
            headroom: Some(self.cfg.headroom),
            version: env!("CARGO_PKG_VERSION").to_string(),
            running: self.running_refs(),
        };
        match self.client.register(&req).await {
            Ok(resp) => {
                self.registered_once
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(agent = %resp.agent, plan = %resp.plan, gpus = req.gpus.len(), backend = self.backend.kind(), "registered with the coordinator");
                if !resp.lost_attempts.is_empty() {
                    kill_leftovers(resp.lost_attempts.clone()).await;
                    self.verify_released(&resp.lost_attempts).await;
                }
                State::Serving(Session {
                    agent: resp.agent,
                    plan: resp.plan,
                    ttl: Duration::from_millis(resp.lease_ttl_ms),
                })
            }
            Err(e) if e.is_transient() => {
                tracing::warn!("registration failed, retrying in {backoff:?}: {e}");
                tokio::select! {
                    _ = shutdown.cancelled() => State::Draining,
                    _ = tokio::time::sleep(backoff) => State::Registering { backoff: (backoff * 2).min(MAX_BACKOFF) },
                }
            }
            Err(e) => {
                // A refused registration (bad plan, ...) will not fix itself.
                tracing::error!("registration refused: {e}");
                State::Draining
            }
        }
    }

    async fn serve(&self, mut session: Session, shutdown: &CancellationToken) -> State {
        let session_done = shutdown.child_token();
        self.tasks.spawn(heartbeats(
            self.client.clone(),
            self.backend.clone(),
            self.running.clone(),
            self.quarantined.clone(),
            session.clone(),
            self.cfg.clone(),
            session_done.clone(),
        ));
        let _stop_heartbeats = session_done.clone().drop_guard();
        let mut backoff = Duration::from_millis(100);
        loop {
            let samples = sample(&self.backend).await;
            let req = ClaimRequest {
                gpus: samples,
                max: 64,
                watching: self.watching(),
                known_plan: Some(session.plan.clone()),
                wait_ms: self.cfg.claim_wait.as_millis() as u64,
            };
            let reply = tokio::select! {
                _ = shutdown.cancelled() => return State::Draining,
                r = self.client.claim(session.agent, &req) => r,
            };
            match reply {
                Ok(resp) => {
                    backoff = Duration::from_millis(100);
                    if resp.plan != session.plan {
                        tracing::info!(plan = %resp.plan, "plan changed");
                        session.plan = resp.plan;
                    }
                    for attempt in resp.cancel {
                        self.cancel_attempt(attempt);
                    }
                    if !resp.leases.is_empty() {
                        self.admit(resp.leases).await;
                    }
                }
                Err(ClientError::UnknownAgent(m)) => {
                    tracing::warn!("coordinator forgot this agent ({m}); registering again");
                    return State::Registering {
                        backoff: Duration::from_millis(100),
                    };
                }
                Err(e) => {
                    tracing::warn!("claim failed, retrying in {backoff:?}: {e}");
                    tokio::select! {
                        _ = shutdown.cancelled() => return State::Draining,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Waits (bounded by the verify timeout) until no process of `attempts` is on a GPU, so
    /// new work is not admitted next to memory that is about to be freed.
    async fn verify_released(&self, attempts: &[AttemptId]) {
        let deadline = tokio::time::Instant::now() + self.cfg.supervisor.verify_timeout;
        loop {
            let samples = sample(&self.backend).await;
            let left: Vec<u32> = samples
                .iter()
                .flat_map(|g| &g.processes)
                .filter(|p| p.attempt.is_some_and(|a| attempts.contains(&a)))
                .map(|p| p.pid)
                .collect();
            if left.is_empty() {
                tracing::info!(
                    attempts = attempts.len(),
                    "GPUs verified free of an earlier run's attempts"
                );
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(pids = ?left, "processes of an earlier run still hold GPU memory");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn running_refs(&self) -> Vec<AttemptRef> {
        refs(&self.running)
    }

    fn watching(&self) -> Vec<AttemptId> {
        self.running
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|(_, a)| !a.cancel.is_cancelled())
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn cancel_attempt(&self, attempt: AttemptId) {
        if let Ok(running) = self.running.lock()
            && let Some(a) = running.get(&attempt)
        {
            tracing::info!(%attempt, "cancelling attempt");
            a.stop(StopReason::User);
        }
    }

    /// Admission at launch: re-read live memory; a lease that no longer fits goes back.
    async fn admit(&self, leases: Vec<Lease>) {
        let mut samples = sample(&self.backend).await;
        let inventory = self.backend.inventory();
        for lease in leases {
            if let Some(est) = lease.estimate_mib {
                let short = lease.gpus.iter().find_map(|g| {
                    let total = inventory.iter().find(|i| i.index == *g)?.total_mib;
                    let free = samples.iter().find(|s| s.index == *g)?.free_mib;
                    let usable = free.saturating_sub(self.cfg.headroom.mib_of(total));
                    (usable < est).then_some((*g, usable))
                });
                if let Some((gpu, usable)) = short {
                    let reason = format!(
                        "GPU {gpu} has {usable} MiB free beyond headroom, the job needs {est} MiB"
                    );
                    tracing::info!(attempt = %lease.attempt, "handing lease back: {reason}");
                    let req = HandBackRequest {
                        fence: lease.fence,
                        reason,
                        gpus: samples.clone(),
                    };
                    if let Err(e) = self.client.hand_back(lease.attempt, &req).await {
                        tracing::warn!(attempt = %lease.attempt, "hand back failed (the lease will expire): {e}");
                    }
                    continue;
                }
                // Later leases of this batch must not count on memory this one will take.
                for s in samples.iter_mut().filter(|s| lease.gpus.contains(&s.index)) {
                    s.free_mib = s.free_mib.saturating_sub(est);
                }
            }
            self.launch(lease);
        }
    }

    fn launch(&self, lease: Lease) {
        let run = Running {
            fence: lease.fence,
            cancel: self.draining.child_token(),
            reason: Arc::default(),
        };
        let (cancel, reason) = (run.cancel.clone(), run.reason.clone());
        if let Ok(mut r) = self.running.lock() {
            r.insert(lease.attempt, run);
        }
        tracing::info!(attempt = %lease.attempt, job = %lease.job, gpus = ?lease.gpus, "launching");
        let ctx = AttemptCtx {
            client: self.client.clone(),
            backend: self.backend.clone(),
            running: self.running.clone(),
            supervisor: self.cfg.supervisor.clone(),
            log_path: self
                .cfg
                .data_dir
                .join("logs")
                .join(format!("{}.log", lease.attempt)),
            draining: self.draining.clone(),
            quarantined: self.quarantined.clone(),
            gpus: lease.gpus.clone(),
        };
        self.tasks.spawn(run_lease(ctx, lease, cancel, reason));
    }

    async fn drain(&self) {
        let n = self.running.lock().map(|r| r.len()).unwrap_or(0);
        if n > 0 {
            tracing::info!(attempts = n, "stopping running attempts");
        }
        self.draining.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

struct AttemptCtx {
    client: Client,
    backend: Arc<dyn GpuBackend>,
    running: Arc<Mutex<HashMap<AttemptId, Running>>>,
    supervisor: SupervisorConfig,
    log_path: PathBuf,
    draining: CancellationToken,
    quarantined: Quarantined,
    gpus: Vec<u32>,
}

async fn run_lease(
    ctx: AttemptCtx,
    lease: Lease,
    cancel: CancellationToken,
    reason: Arc<OnceLock<StopReason>>,
) {
    let attempt = lease.attempt;
    let fence = lease.fence;
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<u32>();
    let start_client = ctx.client.clone();
    let reporter = tokio::spawn(async move {
        if let Ok(pid) = pid_rx.await {
            let report = StartReport {
                fence,
                pid,
                started_at: Utc::now(),
            };
            if let Err(e) = start_client.start(attempt, &report).await {
                tracing::warn!(%attempt, "start report failed: {e}");
            }
        }
    });
    let ship_stop = CancellationToken::new();
    let shipper = tokio::spawn(ship_log(
        ctx.client.clone(),
        attempt,
        fence,
        ctx.log_path.clone(),
        ship_stop.clone(),
    ));
    let launch = Launch {
        attempt,
        job: lease.job,
        argv: lease.argv,
        env: lease.env,
        params: lease.params,
        gpus: lease.gpus,
        timeout: lease.timeout_ms.map(Duration::from_millis),
        log_path: ctx.log_path.clone(),
        workdir: None,
    };
    let end: AttemptEnd = supervisor::run_attempt(
        launch,
        ctx.backend.clone(),
        &ctx.supervisor,
        cancel,
        move |pid| {
            let _ = pid_tx.send(pid);
        },
    )
    .await;
    let _ = reporter.await;
    ship_stop.cancel();
    let _ = shipper.await;

    let mut failure = end.failure;
    let mut log_tail = end.log_tail;
    if failure == Some(FailureClass::Cancelled) {
        match reason.get() {
            Some(StopReason::User) => {}
            Some(StopReason::LeaseLost) => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped: the lease could not be renewed in time\n");
            }
            None => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped because the agent shut down\n");
            }
        }
    }
    let report = FinishReport {
        fence,
        failure,
        exit_code: end.exit_code,
        signal: end.signal,
        ended_at: end.ended_at,
        peak_mem_mib: end.peak_mem_mib,
        cleanup_ms: end.cleanup_ms,
        cleanup_verified: end.cleanup_verified,
        unverified: end.unverified.clone(),
        contaminated: end.contaminated,
        log_tail,
        gpus: sample(&ctx.backend).await,
    };
    // The slot frees on the coordinator only when it hears of the end, so keep trying;
    // a draining agent gives up after a while and the lease expires instead.
    let mut backoff = Duration::from_millis(100);
    let mut tries = 0;
    if !end.cleanup_verified
        && let Ok(mut q) = ctx.quarantined.lock()
    {
        q.insert(attempt, (ctx.gpus.clone(), end.held_by.clone()));
    }
    // Leave the running set first: the next claim must not watch this attempt any more.
    if let Ok(mut r) = ctx.running.lock() {
        r.remove(&attempt);
    }
    loop {
        match ctx.client.finish(attempt, &report).await {
            Ok(resp) => {
                tracing::info!(%attempt, failure = ?report.failure, job_state = %resp.job_state, "attempt reported");
                break;
            }
            Err(ClientError::Stale(m)) => {
                tracing::warn!(%attempt, "finish refused, the lease is no longer ours: {m}");
                break;
            }
            Err(e) if e.is_transient() => {
                tries += 1;
                if ctx.draining.is_cancelled() && tries > 20 {
                    tracing::warn!(%attempt, "giving up reporting the end: {e}");
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(e) => {
                tracing::error!(%attempt, "finish refused: {e}");
                break;
            }
        }
    }
}

/// Ships the attempt's log to the coordinator as it grows, and the rest at the end.
async fn ship_log(
    client: Client,
    attempt: AttemptId,
    fence: i64,
    path: PathBuf,
    stop: CancellationToken,
) {
    const CHUNK: usize = 1 << 20;
    let mut offset: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        // Ship everything there is; at the end, keep going until the file is drained.
        loop {
            let chunk = match read_from(&path, offset, CHUNK).await {
                Ok(c) => c,
                Err(_) => break,
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len() as u64;
            match client.append_log(attempt, fence, offset, chunk).await {
                Ok(()) => offset += n,
                Err(ClientError::Stale(_)) => return,
                Err(e) => {
                    tracing::debug!(%attempt, "log shipping failed, will retry: {e}");
                    break;
                }
            }
            if n < CHUNK as u64 {
                break;
            }
        }
        if last {
            return;
        }
    }
}

async fn read_from(path: &PathBuf, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf).await?;
    Ok(buf)
}

/// How long after its last renewal an agent stops its attempts by itself: early enough that
/// they are dead (kill grace included) before the coordinator can expire the leases and hand
/// the jobs to another node.
pub fn self_fence_after(ttl: Duration, kill_grace: Duration) -> Duration {
    (ttl.saturating_sub(kill_grace) * 3 / 4).max(ttl / 3)
}

async fn heartbeats(
    client: Client,
    backend: Arc<dyn GpuBackend>,
    running: Arc<Mutex<HashMap<AttemptId, Running>>>,
    quarantined: Quarantined,
    session: Session,
    cfg: AgentConfig,
    done: CancellationToken,
) {
    let every = (session.ttl / 3).max(Duration::from_millis(100));
    let retry = every.min(Duration::from_secs(1));
    let fence_after = self_fence_after(session.ttl, cfg.supervisor.kill_grace);
    let mut last_renewal = tokio::time::Instant::now();
    let mut wait = every;
    // Foreign pids seen at the last heartbeat: only a process foreign twice in a row is
    // killed, never one caught for an instant without its marker (mid-exec).
    let mut suspects = std::collections::HashSet::new();
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let attempts = refs(&running);
        // Orphans re-parented to this subreaper that died between attempts are reaped here.
        let _ = tokio::task::spawn_blocking(crate::procscan::reap_orphans).await;
        let gpus = sample(&backend).await;
        let released = released(&quarantined, &gpus).await;
        if cfg.kill_foreign {
            kill_foreign_processes(&gpus, &mut suspects);
        }
        let req = HeartbeatRequest {
            gpus,
            attempts,
            released: released.clone(),
        };
        match client.heartbeat(session.agent, &req).await {
            Ok(resp) => {
                last_renewal = tokio::time::Instant::now();
                wait = every;
                if !released.is_empty()
                    && let Ok(mut q) = quarantined.lock()
                {
                    for a in &released {
                        tracing::info!(attempt = %a, "leftovers gone: GPU quarantine lifted");
                        q.remove(a);
                    }
                }
                if let Ok(r) = running.lock() {
                    for id in resp.cancel {
                        if let Some(a) = r.get(&id) {
                            a.stop(StopReason::User);
                        }
                    }
                    for id in resp.stale {
                        if let Some(a) = r.get(&id) {
                            tracing::warn!(attempt = %id, "lease is stale: stopping the attempt");
                            a.stop(StopReason::LeaseLost);
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!("heartbeat failed: {e}");
                wait = retry;
                // A stale token refuses the whole heartbeat: stop the attempt it names.
                if let crate::client::ClientError::Stale(msg) = &e
                    && let Ok(r) = running.lock()
                {
                    for (_, a) in r.iter().filter(|(id, _)| msg.contains(&id.to_string())) {
                        a.stop(StopReason::LeaseLost);
                    }
                }
                // Soon the coordinator may hand our jobs to another node: stop them here
                // first, so no job runs twice.
                if last_renewal.elapsed() >= fence_after
                    && let Ok(r) = running.lock()
                    && !r.is_empty()
                {
                    tracing::error!(
                        attempts = r.len(),
                        "leases not renewed for {:?}: stopping every attempt",
                        session.ttl
                    );
                    for a in r.values() {
                        a.stop(StopReason::LeaseLost);
                    }
                }
            }
        }
    }
}

/// Quarantined attempts whose leftovers are gone: none of the pids that held memory is
/// alive or on its GPUs, and no process carries the attempt's marker.
async fn released(quarantined: &Quarantined, samples: &[GpuSample]) -> Vec<AttemptId> {
    let held: Vec<(AttemptId, Vec<u32>, Vec<u32>)> = match quarantined.lock() {
        Ok(q) => q
            .iter()
            .map(|(a, (g, p))| (*a, g.clone(), p.clone()))
            .collect(),
        Err(_) => return vec![],
    };
    if held.is_empty() {
        return vec![];
    }
    let samples = samples.to_vec();
    tokio::task::spawn_blocking(move || {
        let marked = crate::procscan::marked_processes();
        held.into_iter()
            .filter(|(attempt, gpus, pids)| {
                let on_gpus = samples
                    .iter()
                    .filter(|g| gpus.contains(&g.index))
                    .flat_map(|g| &g.processes)
                    .any(|p| pids.contains(&p.pid) || p.attempt == Some(*attempt));
                !on_gpus
                    && !marked.contains_key(attempt)
                    && !pids.iter().any(|&p| crate::procscan::is_alive(p))
            })
            .map(|(a, _, _)| a)
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// Kills processes of no attempt holding GPU memory, for nodes configured to own their GPUs.
fn kill_foreign_processes(samples: &[GpuSample], suspects: &mut std::collections::HashSet<u32>) {
    let foreign: Vec<(u32, u64, Option<String>, Option<String>)> = samples
        .iter()
        .flat_map(|g| &g.processes)
        .filter(|p| p.attempt.is_none() && p.used_mib > 0 && p.pid != std::process::id())
        .map(|p| (p.pid, p.used_mib, p.user.clone(), p.command.clone()))
        .collect();
    let seen_before = std::mem::replace(suspects, foreign.iter().map(|f| f.0).collect());
    for (pid, mib, user, command) in foreign.into_iter().filter(|f| seen_before.contains(&f.0)) {
        tracing::warn!(
            pid,
            mib,
            ?user,
            ?command,
            "killing a foreign process on the GPUs (--kill-foreign)"
        );
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn refs(running: &Mutex<HashMap<AttemptId, Running>>) -> Vec<AttemptRef> {
    running
        .lock()
        .map(|r| {
            r.iter()
                .map(|(id, a)| AttemptRef {
                    attempt: *id,
                    fence: a.fence,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Live GPU samples, read off the runtime (NVML and /proc reads block).
pub async fn sample(backend: &Arc<dyn GpuBackend>) -> Vec<GpuSample> {
    let b = backend.clone();
    let read = move || {
        let mut samples = b.sample()?;
        for p in samples.iter_mut().flat_map(|g| g.processes.iter_mut()) {
            if p.attempt.is_none() {
                (p.user, p.command) = crate::procscan::describe(p.pid);
            }
        }
        Ok::<_, crate::gpu::GpuError>(samples)
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!("GPU sample failed: {e}");
            vec![]
        }
        Err(e) => {
            tracing::warn!("GPU sample task failed: {e}");
            vec![]
        }
    }
}

/// Kills what is left of attempts of this node's earlier incarnation (their processes carry
/// the attempt's marker even after double forks).
async fn kill_leftovers(attempts: Vec<AttemptId>) {
    let killed = tokio::task::spawn_blocking(move || {
        attempts
            .into_iter()
            .map(|a| supervisor::kill_marked(a).len())
            .sum::<usize>()
    })
    .await
    .unwrap_or(0);
    if killed > 0 {
        tracing::warn!(
            processes = killed,
            "killed leftovers of attempts from an earlier run"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_fence_themselves_before_the_coordinator_expires_them() {
        let s = Duration::from_secs;
        for (ttl, grace) in [(30, 10), (30, 0), (10, 4), (5, 1), (2, 0)] {
            let after = self_fence_after(s(ttl), s(grace));
            assert!(
                after >= s(ttl) / 3,
                "ttl {ttl} grace {grace}: {after:?} too eager"
            );
            assert!(
                after + s(grace) < s(ttl),
                "ttl {ttl} grace {grace}: {after:?} too late"
            );
        }
    }
}
