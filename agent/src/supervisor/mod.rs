//! The attempt supervisor process ("shim", as containerd's): the agent's own binary started
//! with [`SUPERVISOR_ARG`], one attempt at a time (after a clean end its agent may hand it the
//! next, see [`standby`]). It leaves the agent's session, becomes child subreaper,
//! runs the attempt (spawn, log, timeout, peak memory, verified cleanup of its whole tree:
//! [`crate::supervisor::attempt::run_attempt`]), and journals the outcome in the agent's data
//! directory before it tells anyone. It does not die with the agent: a restarted agent
//! re-attaches over its socket ([`proto`]). Its lease deadline is pushed by the agent after
//! every renewal; when it passes with no renewal (agent dead, wedged or partitioned), the
//! supervisor stops the job itself, before the coordinator may give the job away.
//!
//! It opens the GPU backend itself (rather than asking the agent) so that an attempt that
//! ends while no agent is attached is still measured and verified clean. It opens it once,
//! as it starts and waits for a lease ([`proto::ToSupervisor::Prepare`],
//! [`crate::gpu::lazy`]), and reads through it for every attempt it runs: a job's start
//! reading is taken before its exec, so its figures cover its whole run.

pub mod attempt;
pub mod classify;
pub mod colocate;
pub mod direct;
mod handoff;
mod lease;
pub mod measure;
pub mod metrics;
pub mod oom;
pub mod prestart;
pub mod process;
pub mod proto;
mod results;
pub mod self_fence;

use std::ffi::OsStr;
use std::future::Future;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::FailureClass;
use headroom_shared::api::{FinishReport, GpuSample, JobStarted};
use tokio::net::UnixListener;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::gpu::lazy::{LazyBackend, Opening};
use crate::gpu::{self, BackendChoice, GpuBackend};
use crate::outcomes::{Outcome, Outcomes};
use attempt::{AttemptEnd, SupervisorConfig};
use direct::Delivery;
use handoff::Handoff;
use headroom_shared::prestart::{Prestart, PrestartReport};
use lease::{HeldLease, Reporter};
use proto::StopReason;
use proto::{Conn, FromSupervisor, PROTOCOL, Spec, ToSupervisor};

/// Attempts one supervisor process runs, one after another, before it exits. Handed back
/// to its agent after each clean end, it saves the next job an exec and a process start;
/// the bound keeps what a long life may accumulate in check.
const MAX_ATTEMPTS: u32 = 1000;

/// How long a connection to the supervisor's socket has to send the attach key.
const ATTACH_WAIT: Duration = Duration::from_secs(2);

/// First argument that turns a headroom binary into an attempt supervisor.
pub const SUPERVISOR_ARG: &str = "__headroom-attempt";
/// The supervisor's `argv[0]`, as `ps` shows it.
pub const PROCESS_NAME: &str = "headroom-attempt";
/// The supervisor's process name as `top` and `ps -o comm` show it (the kernel keeps 15
/// bytes; exec'd through `/proc/self/exe` it would read `exe`).
pub const COMM: &std::ffi::CStr = c"hr-attempt";
/// Its name while it waits for a lease (see [`standby`]).
pub const STANDBY_COMM: &std::ffi::CStr = c"hr-standby";
/// The running binary, whatever happened to its file since it started (an upgrade replaced
/// it): attempt supervisors run the agent's own image.
pub const SELF_EXE: &str = "/proc/self/exe";

/// Call first thing in `main` of every binary that runs jobs: when started as an attempt
/// supervisor, this process supervises its attempt and exits; it never returns.
pub fn run_if_supervisor() {
    // The helper that unpacks an attempt's code as its user is the same binary too.
    crate::codetree::run_if_unpacker();
    if std::env::args_os().nth(1).as_deref() != Some(OsStr::new(SUPERVISOR_ARG)) {
        return;
    }
    std::process::exit(main());
}

fn main() -> i32 {
    let _ = nix::sys::prctl::set_name(STANDBY_COMM);
    // A session of its own: Ctrl-C in the agent's terminal, a SIGHUP to its group or a
    // systemd stop (KillMode=process) reaches the agent only.
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("headroom attempt supervisor: setsid: {e}");
    }
    let own_tree = match attempt::become_subreaper() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("headroom attempt supervisor: {e}; orphans may escape to init");
            false
        }
    };
    headroom_shared::logging::init("warn");
    if let Err(e) = process::mark_inherited_close_on_exec() {
        eprintln!("headroom attempt supervisor: cannot mark inherited descriptors: {e}");
        return 2;
    }
    // The agent's end of the spawn channel is our stdin.
    let channel = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::os::unix::net::UnixStream::from(fd),
        Err(e) => {
            eprintln!("headroom attempt supervisor: no channel to the agent: {e}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("headroom attempt supervisor: runtime: {e}");
            return 2;
        }
    };
    rt.block_on(serve(channel, own_tree))
}

/// The supervisor's state besides the attempt itself.
struct Link {
    conn: Option<Conn>,
    /// Set once the job runs.
    started: Option<(u32, DateTime<Utc>)>,
    /// A restarted agent took over (over the socket): that agent may run another binary,
    /// so this process is not handed back to it for another attempt.
    reattached: bool,
}

impl Link {
    async fn send(&mut self, msg: &FromSupervisor) {
        if let Some(conn) = self.conn.as_mut()
            && let Err(e) = conn.send(msg).await
        {
            tracing::warn!("agent connection lost: {e}");
            self.conn = None;
        }
    }

    /// The next message of the attached agent; pending while none is attached.
    async fn recv(&mut self) -> Option<Result<Option<ToSupervisor>, proto::ProtoError>> {
        match self.conn.as_mut() {
            Some(c) => Some(c.recv().await),
            None => std::future::pending().await,
        }
    }
}

async fn accept(listener: &Option<UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn serve(channel: std::os::unix::net::UnixStream, own_tree: bool) -> i32 {
    let stop_reaping = CancellationToken::new();
    let reaper = own_tree.then(|| tokio::spawn(reap_inherited(stop_reaping.clone())));
    let code = serve_attempts(channel, own_tree).await;
    stop_reaping.cancel();
    if let Some(r) = reaper {
        let _ = r.await;
    }
    code
}

/// Reaps what this supervisor inherits as their subreaper (children a job left unreaped,
/// leftovers killed in a cleanup's last pass) whenever a child of it exits, during attempts
/// and between them: it serves up to [`MAX_ATTEMPTS`], and nothing may pile up under it.
/// Its own children (a job, a background) are left to their owners (`procscan::reap_orphans`).
async fn reap_inherited(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut exits = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch for exited children (zombies may pile up): {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = exits.recv() => if got.is_none() { return },
        }
        let _ = tokio::task::spawn_blocking(crate::procscan::reap_orphans).await;
    }
}

async fn serve_attempts(channel: std::os::unix::net::UnixStream, own_tree: bool) -> i32 {
    let mut conn = match Conn::new(channel) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("headroom attempt supervisor: agent channel: {e}");
            return 2;
        }
    };
    let mut served = 0;
    // The GPU backend, opened once for every attempt this process runs.
    let mut gpus: Option<Prepared> = None;
    // The last attempt's end, until the agent shows it reported it.
    let mut handed: Option<Box<Handoff>> = None;
    loop {
        let spec = match next_launch(&mut conn, &mut gpus, handed.take()).await {
            Ok(spec) => spec,
            Err(code) => return code,
        };
        served += 1;
        let _ = nix::sys::prctl::set_name(COMM);
        let reuse = own_tree && served < MAX_ATTEMPTS;
        let opening = prepared(&mut gpus, &spec.gpu).opening.clone();
        match supervise(spec, conn, own_tree, reuse, opening).await {
            Next::Exit(code) => return code,
            Next::Wait(c, handoff) => {
                conn = c;
                handed = handoff;
                let _ = nix::sys::prctl::set_name(STANDBY_COMM);
                // What exited before the reaper was told (its signals coalesce) goes now.
                let _ = tokio::task::spawn_blocking(crate::procscan::reap_orphans).await;
            }
        }
    }
}

/// The GPU backend a supervisor opened, and which one it is.
struct Prepared {
    choice: BackendChoice,
    opening: Arc<Opening>,
}

/// The backend for `choice`: the one being opened since the supervisor started, or (told
/// none, or another) one opened from now on.
fn prepared<'a>(gpus: &'a mut Option<Prepared>, choice: &BackendChoice) -> &'a Prepared {
    if gpus.as_ref().is_none_or(|p| p.choice != *choice) {
        *gpus = Some(prepare(choice.clone()));
    }
    gpus.as_ref().expect("set above")
}

/// Starts opening `choice`'s backend off the runtime.
fn prepare(choice: BackendChoice) -> Prepared {
    let open = choice.clone();
    let opening = Opening::new(move || gpu::open(&open).map_err(|e| e.to_string()));
    opening.start();
    Prepared { choice, opening }
}

/// The next launch on `conn`; else the process's exit code. A backend to prepare is
/// opened meanwhile. `handed`: the last attempt's end, reported here if the connection ends
/// before a launch (the agent went before reporting it; it gives a launch only after).
async fn next_launch(
    conn: &mut Conn,
    gpus: &mut Option<Prepared>,
    mut handed: Option<Box<Handoff>>,
) -> Result<Spec, i32> {
    loop {
        let msg = conn.recv::<ToSupervisor>().await;
        match &msg {
            // The agent gives a launch only once it has reported the last end.
            Ok(Some(ToSupervisor::Launch { .. })) => handed = None,
            // Sent before the agent read the end (renewals, a stop): it may still go first.
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                if let Some(h) = handed.take() {
                    h.settle().await;
                }
            }
        }
        match msg {
            Ok(Some(ToSupervisor::Launch { spec })) => return Ok(*spec),
            Ok(Some(ToSupervisor::Prepare { gpu })) => {
                prepared(gpus, &gpu);
            }
            // Sent for the attempt before while it ended, read only now: nothing runs to
            // renew or stop.
            Ok(Some(
                ToSupervisor::Renew { .. }
                | ToSupervisor::Stop { .. }
                | ToSupervisor::Attach { .. },
            )) => {}
            // The agent let this waiting supervisor go, or exited or died: nothing runs.
            Ok(None) => return Err(0),
            Err(e) => {
                eprintln!("headroom attempt supervisor: no launch from the agent: {e}");
                return Err(2);
            }
        }
    }
}

/// What a supervisor does after an attempt.
enum Next {
    Exit(i32),
    /// Handed back to its agent over this connection: waits for the next launch, and
    /// reports the last end itself if the agent goes before reporting it.
    Wait(Conn, Option<Box<Handoff>>),
}

/// Runs one attempt from its launch to its journalled and told end. `reuse`: whether this
/// process may serve another attempt afterwards, if this one ends clean.
async fn supervise(
    spec: Spec,
    first: Conn,
    own_tree: bool,
    reuse: bool,
    opening: Arc<Opening>,
) -> Next {
    if let Some(c) = &spec.cgroups {
        crate::cgroup::attribute_by(c);
    }
    let listener = listen(&spec);
    let mut link = Link {
        conn: Some(first),
        started: None,
        reattached: false,
    };
    link.send(&hello(&spec, None)).await;
    let (backend, cfg) = ready(&spec, opening, own_tree);
    let (cancel, checkpoint) = (CancellationToken::new(), CancellationToken::new());
    let mut lease = HeldLease::new(&spec, cancel.clone(), checkpoint.clone());
    // Its wait, its job's start, run, stop and verified cleanup: `attempt` and `prestart`.
    let run = prestart_then_run(
        spec.launch.clone(),
        backend.clone(),
        &cfg,
        cancel,
        checkpoint,
    );
    let (end, prestart) = serve_run(run, &spec, &mut link, &mut lease, &listener).await;
    let (end, gpus) = gpus_after(end, backend.as_ref());
    let (reason, reporter) = lease.end();
    let (outcome, kept) = outcome(&spec, end, reason, gpus, prestart);
    let journalled = journal(&spec, &outcome);
    // Journalled: a restarted agent reads the end there, and no longer looks for this
    // process to re-attach to (which, no longer answering, it would kill).
    drop(listener);
    finish(&spec, outcome, kept, journalled, link, reuse, reporter).await
}

/// What the supervisor says of its attempt when an agent attaches.
fn hello(spec: &Spec, started: Option<(u32, DateTime<Utc>)>) -> FromSupervisor {
    FromSupervisor::Hello {
        version: PROTOCOL,
        attempt: spec.launch.attempt,
        job: spec.launch.job,
        fence: spec.fence,
        gpus: spec.launch.gpus.clone(),
        pid: started.map(|s| s.0),
        started_at: started.map(|s| s.1),
    }
}

/// Binds the attempt's socket, before the job starts: from here on, a restarted agent can
/// find this supervisor.
fn listen(spec: &Spec) -> Option<UnixListener> {
    let attempt = spec.launch.attempt;
    let bound = proto::socket_addr(&spec.scope, attempt)
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            UnixListener::from_std(l)
        });
    match bound {
        Ok(l) => Some(l),
        Err(e) => {
            // Still supervised and fenced; a restarted agent will not find it and sweeps it.
            tracing::warn!(%attempt, "cannot listen for a restarted agent: {e}");
            None
        }
    }
}

/// The attempt's GPU backend and its supervision's settings.
fn ready(
    spec: &Spec,
    opening: Arc<Opening>,
    own_tree: bool,
) -> (Arc<dyn GpuBackend>, SupervisorConfig) {
    // Opened since the supervisor started: one that cannot open reads as unknown (figures
    // unknown, cleanup unverified).
    let backend: Arc<dyn GpuBackend> = Arc::new(LazyBackend::new(
        opening,
        spec.job_env.clone(),
        spec.launch.gpus.clone(),
    ));
    let cfg = SupervisorConfig {
        kill_grace: Duration::from_millis(spec.kill_grace_ms),
        verify_timeout: Duration::from_millis(spec.verify_timeout_ms),
        sample_every: Duration::from_millis(spec.sample_every_ms),
        start_reading_wait: Duration::from_millis(spec.start_reading_wait_ms),
        own_tree,
    };
    (backend, cfg)
}

/// An attempt on its way: its wait, its run, its stop and cleanup, with what it tells
/// meanwhile (its job's start, what it waits for).
struct Run<F> {
    end: F,
    started: UnboundedReceiver<(u32, DateTime<Utc>)>,
    waiting: UnboundedReceiver<Option<String>>,
    /// The job's latest metrics, while it runs.
    metrics: tokio::sync::watch::Receiver<Option<headroom_shared::results::AttemptMetrics>>,
}

/// Drives the attempt to its end while serving its agent and its lease: tells the agent of
/// the job's start and wait, takes its renewals and stops, lets a restarted agent attach,
/// renews the lease itself while the agent is away, stops the job when the fence falls,
/// and reports its metrics, stopping it when `early_stop` says so.
async fn serve_run(
    run: Run<impl Future<Output = (AttemptEnd, Option<PrestartReport>)>>,
    spec: &Spec,
    link: &mut Link,
    lease: &mut HeldLease,
    listener: &Option<UnixListener>,
) -> (AttemptEnd, Option<PrestartReport>) {
    let attempt = spec.launch.attempt;
    let (attach_tx, mut attach_rx) = tokio::sync::mpsc::unbounded_channel();
    let Run {
        end,
        mut started,
        mut waiting,
        mut metrics,
    } = run;
    let mut results = results::MetricsLink::new(spec);
    let mut end = std::pin::pin!(end);
    // The fallen fence the agent's messages were last looked for.
    let mut looked = None;
    loop {
        // Read before the select, which holds the lease for its renewal's answer.
        let (renew_due, fence_due) = (lease.renewal_due(), lease.fence_due());
        // In this order: a supervisor held up (its thread blocked on a busy disk as its job
        // starts) may wake to a fallen fence and a renewal that came before it fell; the
        // renewal is taken first. What could be ready again and again (a failing accept, a
        // flood of connections from any local user) comes last, after the fence, an
        // attaching agent and our own renewal.
        tokio::select! {
            biased;
            end = &mut end => return end,
            Some((pid, at)) = started.recv() => {
                link.started = Some((pid, at));
                lease.job_started();
                link.send(&FromSupervisor::Started { pid, started_at: at }).await;
            }
            Some(reason) = waiting.recv() => {
                link.send(&FromSupervisor::Waiting { reason }).await;
            }
            msg = link.recv() => from_agent(msg, attempt, link, lease),
            renewal = lease.answer() => lease.answered(renewal),
            _ = lease::at(fence_due) => {
                if looked == fence_due {
                    lease.fence_fell();
                } else {
                    // Woken late, the runtime may see its timers before its socket: one
                    // more turn of it reads what came before the fence fell.
                    looked = fence_due;
                    tokio::task::yield_now().await;
                }
            }
            Some(conn) = attach_rx.recv() => {
                // A restarted agent takes over; the old connection (if any) is dropped.
                link.conn = Some(conn);
                link.reattached = true;
                link.send(&hello(spec, link.started)).await;
            }
            _ = lease::at(renew_due) => lease.renew(),
            accepted = accept(listener) => match accepted.and_then(|s| s.into_std()) {
                Ok(stream) => check_attach(stream, spec, attach_tx.clone()),
                Err(e) => tracing::warn!(%attempt, "cannot accept a connection: {e}"),
            },
            Ok(()) = metrics.changed() => {
                if let Some(m) = metrics.borrow_and_update().clone() {
                    results.send(m);
                }
            }
            answer = results.answer() => {
                // A job already being stopped (a cancel, a lost lease) keeps that reason.
                if let Some(rung) = results.answered(attempt, answer).filter(|_| !lease.stopping()) {
                    let metric = spec.launch.results.as_ref()
                        .and_then(|r| r.early_stop.as_ref())
                        .map_or("the metric", |e| e.metric.as_str());
                    attempt::note_at(&spec.launch.log_path, &results::pruned_note(metric, &rung));
                    lease.stop(StopReason::Pruned);
                }
            }
        }
    }
}

/// Takes a message of the attached agent (`None`: none is attached).
fn from_agent(
    msg: Option<Result<Option<ToSupervisor>, proto::ProtoError>>,
    attempt: headroom_shared::AttemptId,
    link: &mut Link,
    lease: &mut HeldLease,
) {
    match msg {
        Some(Ok(Some(ToSupervisor::Renew {
            stop_in_ms,
            measured_at,
        }))) => {
            lease.renewed_by_agent(proto::left_of(stop_in_ms, measured_at));
        }
        Some(Ok(Some(ToSupervisor::Stop { reason }))) => lease.stop(reason),
        Some(Ok(Some(ToSupervisor::Launch { .. }))) => {
            tracing::warn!(%attempt, "a second launch is ignored");
        }
        Some(Ok(Some(ToSupervisor::Attach { .. } | ToSupervisor::Prepare { .. }))) => {}
        Some(Ok(None)) => {
            // The agent exited or died: the job runs on, fenced by its deadline.
            link.conn = None;
        }
        Some(Err(e)) => {
            tracing::warn!(%attempt, "agent connection: {e}");
            link.conn = None;
        }
        None => {}
    }
}

/// Checks a connection to the socket aside (a peer that says nothing must not hold the
/// attempt up): only one of the agent's user that proves the attach key takes over.
fn check_attach(
    stream: std::os::unix::net::UnixStream,
    spec: &Spec,
    attached: UnboundedSender<Conn>,
) {
    let (attempt, key) = (spec.launch.attempt, spec.key.clone());
    tokio::spawn(async move {
        match Conn::accept_attach(stream, &key, ATTACH_WAIT).await {
            Ok(conn) => {
                let _ = attached.send(conn);
            }
            Err(e) => tracing::warn!(%attempt, "refused a connection: {e}"),
        }
    });
}

/// The GPUs as the end reports them. A verified cleanup's last reading found the attempt
/// gone from its GPUs: reported as is, rather than read once more on the way from the job's
/// end to the free slot.
fn gpus_after(mut end: AttemptEnd, backend: &dyn GpuBackend) -> (AttemptEnd, Vec<GpuSample>) {
    let gpus = match end.gpus_after.take() {
        Some(g) => g,
        None => gpu::read(backend),
    };
    (end, gpus)
}

/// The attempt's wait before its job starts ([`crate::supervisor::prestart`]), then the
/// attempt itself; a wait that ends without a start (a stop, `max_wait`) ends the attempt
/// unstarted.
fn prestart_then_run<'a>(
    mut launch: attempt::Launch,
    backend: Arc<dyn GpuBackend>,
    cfg: &'a SupervisorConfig,
    cancel: CancellationToken,
    checkpoint: CancellationToken,
) -> Run<impl Future<Output = (AttemptEnd, Option<PrestartReport>)> + 'a> {
    let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
    let (waiting_tx, waiting) = tokio::sync::mpsc::unbounded_channel();
    let (metrics_tx, metrics) = tokio::sync::watch::channel(None);
    let started_fn = move |pid| {
        let _ = started_tx.send((pid, Utc::now()));
    };
    let waiting_fn = move |w| {
        let _ = waiting_tx.send(w);
    };
    let end = async move {
        if launch.prestart == Prestart::default() {
            return (
                attempt::run_attempt_reporting(
                    launch,
                    backend,
                    cfg,
                    cancel,
                    checkpoint,
                    started_fn,
                    Some(metrics_tx),
                )
                .await,
                None,
            );
        }
        let mut probe = prestart::BackendProbe::new(backend.clone(), &launch.gpus);
        let waited = prestart::wait(
            &launch.prestart,
            &mut probe,
            cfg.sample_every,
            &cancel,
            Some(&launch.log_path),
            waiting_fn,
        )
        .await;
        match waited {
            Ok(report) => {
                // What is on the GPUs now, not at admission before the wait, is what cleanup
                // returns to.
                if let Some(samples) = &probe.last {
                    launch.baseline = Some(attempt::Baseline::of(samples, &launch.gpus));
                }
                let end = attempt::run_attempt_reporting(
                    launch,
                    backend,
                    cfg,
                    cancel,
                    checkpoint,
                    started_fn,
                    Some(metrics_tx),
                )
                .await;
                (end, Some(report))
            }
            Err(n) => (
                attempt::not_started(n.why, format!("[headroom] {}\n", n.message)),
                Some(n.report),
            ),
        }
    };
    Run {
        end,
        started,
        waiting,
        metrics,
    }
}

/// What of an attempt's end is told besides its report, and what says whether its process
/// may serve another attempt.
struct Kept {
    held_by: Vec<u32>,
    ghost_limits: Vec<(u32, u64)>,
    /// Its whole tree was verified gone.
    clean: bool,
    /// Its job could be started: a supervisor that could not start one (descriptors,
    /// memory, a broken runtime) is not trusted with another.
    launched: bool,
}

/// The attempt's outcome: its end report (class decided, prestart, host RAM peak). Its
/// cgroup goes once its tree was verified gone.
fn outcome(
    spec: &Spec,
    end: AttemptEnd,
    reason: Option<StopReason>,
    gpus: Vec<GpuSample>,
    prestart: Option<PrestartReport>,
) -> (Outcome, Kept) {
    let kept = Kept {
        held_by: end.held_by.clone(),
        ghost_limits: end.ghost_limits.clone(),
        clean: end.cleanup_verified,
        launched: end.failure() != Some(FailureClass::LaunchError),
    };
    let memory_cap_mib = end.memory_cap_mib;
    let mut report = report(spec.fence, end, reason, gpus);
    report.prestart = prestart;
    ran_under_cap(&mut report, memory_cap_mib);
    if let Some(c) = crate::cgroup::attribution() {
        let cg = c.attempt(spec.launch.attempt);
        // On the runtime: cgroupfs answers at once (see `attempt::stop::attempt_pids`).
        report.host_peak_mib = cg.peak_mib();
        // Killed by the kernel at its cgroup's memory limit: host memory, not a signal of
        // its own or a GPU OOM.
        if matches!(
            report.failure,
            Some(FailureClass::Signal | FailureClass::Nonzero)
        ) && cg.oom_killed()
        {
            report.failure = Some(FailureClass::HostOom);
            report.log_tail.push_str(&format!(
                "\nhost_oom: killed by the kernel at its cgroup's memory limit ({})",
                spec.launch
                    .host_memory_mib
                    .map_or("unknown".to_string(), |m| headroom_shared::MemSize {
                        mib: m
                    }
                    .to_string())
            ));
        }
        // Left in place when not verified empty: the agent's sweep kills what is in it.
        if kept.clean
            && let Err(e) = cg.remove()
        {
            tracing::warn!(
                "cannot remove the attempt's cgroup {}: {e}",
                cg.dir().display()
            );
        }
    }
    let outcome = Outcome {
        attempt: spec.launch.attempt,
        report,
    };
    (outcome, kept)
}

/// Records the hard GPU memory limit the attempt ran under; out of GPU memory under one, it
/// grew past what it was given (`cap_hit`) when what it held and the allocation that failed
/// (the OOM's text) come to more than the limit, or when that cannot be told (an OOM is its
/// own unless shown otherwise). One that stayed within its limit found the GPU itself full:
/// left for the coordinator to blame on a neighbour that grew.
fn ran_under_cap(report: &mut FinishReport, cap: Option<u64>) {
    report.memory_cap_mib = cap;
    if let (Some(FailureClass::Oom), Some(cap)) = (report.failure, cap) {
        let tried = headroom_shared::oom::tried_to_allocate_mib(&report.log_tail);
        if let (Some(held), Some(tried)) = (report.peak_mem_mib, tried)
            && held.saturating_add(tried) <= cap
        {
            report.log_tail.push_str(&format!(
                "\n[headroom] out of GPU memory within its own limit ({held} MiB held, {tried} \
                 MiB asked, limit {cap} MiB): the GPU itself was full\n"
            ));
            return;
        }
        report.oom_cause = Some(headroom_shared::api::OomCause::CapHit);
        report.log_tail.push_str(&format!(
            "\n[headroom] cap_hit: out of GPU memory at its own limit ({cap} MiB)\n"
        ));
    }
}

/// The journal, and whether the outcome is in it.
struct Journalled {
    journal: Outcomes,
    written: Result<(), String>,
}

/// Journals the outcome, flushed to disk, before anyone is told.
fn journal(spec: &Spec, outcome: &Outcome) -> Journalled {
    let journal = Outcomes::writer(&spec.data_dir);
    // A restarting agent clears temporary files it finds (a write a kill cut short): try
    // again with a fresh one if ours went away under us.
    let mut spare = spec.spare.clone();
    let mut written = Err(String::new());
    for _ in 0..3 {
        written = journal
            .write_through(outcome, spare.take())
            .map_err(|e| e.to_string());
        if written.is_ok() {
            break;
        }
    }
    if let Err(e) = &written {
        // An attached agent still gets it; with none, it is lost as the attempt is.
        eprintln!(
            "headroom attempt supervisor: cannot journal the outcome of {}: {e}",
            spec.launch.attempt
        );
    }
    Journalled { journal, written }
}

/// Reports the journalled end to the coordinator itself when the agent is away, then tells
/// the attached agent (if any), and whether this process can take another attempt: only
/// after a clean end (journalled, its whole tree verified gone) and for the agent that
/// started it.
async fn finish(
    spec: &Spec,
    outcome: Outcome,
    kept: Kept,
    journalled: Journalled,
    mut link: Link,
    reuse: bool,
    mut reporter: Reporter,
) -> Next {
    let Journalled { journal, written } = journalled;
    let delivered = match reporter.direct.as_mut() {
        Some(d) if reporter.away || link.conn.is_none() => {
            d.deliver(&outcome.report, &spec.launch.log_path, reporter.give_up_at)
                .await
        }
        _ => Delivery::Undelivered,
    };
    if delivered != Delivery::Undelivered && link.conn.is_none() {
        // Answered: no agent needs it (one attached hears of the end below, and clears it).
        if let Err(e) = journal.discard(spec.launch.attempt) {
            tracing::warn!(attempt = %spec.launch.attempt, "cannot clear the journalled outcome: {e}");
        }
    }
    let reusable = reuse && kept.clean && kept.launched && written.is_ok() && !link.reattached;
    let attempt = outcome.attempt;
    link.send(&FromSupervisor::Ended {
        held_by: kept.held_by,
        ghost_limits: kept.ghost_limits,
        report: Box::new(outcome.report.clone()),
        reusable,
    })
    .await;
    // An end only the journal holds is the agent's to report; until it shows it did, this
    // process keeps it, and reports it if the agent goes first.
    let handoff = match reporter.direct {
        Some(direct) if delivered == Delivery::Undelivered && written.is_ok() => {
            Some(Box::new(Handoff {
                attempt,
                report: outcome.report,
                log: spec.launch.log_path.clone(),
                direct,
                journal,
                give_up_at: reporter.give_up_at,
            }))
        }
        _ => None,
    };
    let code = i32::from(written.is_err());
    match (link.conn, handoff) {
        (Some(conn), handoff) if reusable => Next::Wait(conn, handoff),
        (Some(mut conn), Some(h)) => {
            h.wait_for_release(&mut conn).await;
            Next::Exit(code)
        }
        // The agent went while the end was told: nobody else will report it.
        (None, Some(h)) => {
            h.settle().await;
            Next::Exit(code)
        }
        (_, None) => Next::Exit(code),
    }
}

/// The end report of an attempt, its failure class decided from its facts and (for a
/// cancel) why this supervisor asked for it.
pub fn report(
    fence: i64,
    end: AttemptEnd,
    reason: Option<StopReason>,
    gpus: Vec<GpuSample>,
) -> FinishReport {
    let facts = end.facts.told(reason);
    let mut log_tail = end.log_tail;
    if let Some(why) = classify::lost_note(&facts) {
        log_tail.push_str(&format!("\n[headroom] {why}\n"));
    }
    // Carried with the end, so that an end reported before its start was starts it too.
    let started = end
        .pid
        .zip(end.started_at)
        .map(|(pid, started_at)| JobStarted { pid, started_at });
    FinishReport {
        fence,
        failure: classify::decide(&facts),
        exit_code: end.exit_code,
        signal: end.signal,
        ended_at: end.ended_at,
        peak_mem_mib: end.peak_mem_mib,
        peak_source: Some(end.peak_source),
        cleanup_ms: end.cleanup_ms,
        cleanup_verified: end.cleanup_verified,
        unverified: end.unverified,
        contaminated: end.contaminated,
        measurements: end.measurements,
        log_tail,
        gpus,
        prestart: None,
        background: end.background,
        host_peak_mib: None,
        started,
        metrics: end.metrics,
        memory_cap_mib: None,
        oom_cause: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use classify::Unstarted;

    /// The end's report carries the job's start, so that an end that reaches the
    /// coordinator without its start report (it failed, or the agent died first) still
    /// records when the job started and as which process.
    #[test]
    fn an_end_report_carries_the_jobs_start() {
        let at = Utc::now();
        let end = AttemptEnd {
            pid: Some(4242),
            started_at: Some(at),
            ..attempt::not_started(Unstarted::LaunchFailed, String::new())
        };
        let r = report(7, end, None, vec![]);
        assert_eq!(
            r.started,
            Some(JobStarted {
                pid: 4242,
                started_at: at
            })
        );
        let never = report(
            7,
            attempt::not_started(Unstarted::LaunchFailed, String::new()),
            None,
            vec![],
        );
        assert_eq!(never.started, None, "a job that never started has no start");
    }

    /// An OOM under a limit of its own is the attempt's own (`cap_hit`), said in its log
    /// tail; another end, or an OOM without a limit, is not labelled.
    #[test]
    fn an_oom_under_its_own_cap_is_a_cap_hit() {
        use classify::{EndFacts, Ended};
        use headroom_shared::api::OomCause;
        let end = |oom| AttemptEnd {
            facts: EndFacts::ran(Ended::Code(1), None, oom),
            ..attempt::not_started(Unstarted::LaunchFailed, String::new())
        };
        let mut r = report(7, end(true), None, vec![]);
        ran_under_cap(&mut r, Some(9472));
        assert_eq!(
            (r.oom_cause, r.memory_cap_mib),
            (Some(OomCause::CapHit), Some(9472))
        );
        assert!(
            r.log_tail
                .contains("cap_hit: out of GPU memory at its own limit (9472 MiB)")
        );
        let mut r = report(7, end(true), None, vec![]);
        ran_under_cap(&mut r, None);
        assert_eq!(
            r.oom_cause, None,
            "no limit: whose growth it was is not known here"
        );
        let mut r = report(7, end(false), None, vec![]);
        ran_under_cap(&mut r, Some(9472));
        assert_eq!((r.oom_cause, r.memory_cap_mib), (None, Some(9472)));
        // What it held and what it asked for fit its limit: the GPU itself was full, which
        // is not its own doing (the coordinator looks for the neighbour that grew).
        let oom_text = |tried: &str| AttemptEnd {
            facts: EndFacts::ran(Ended::Code(1), None, true),
            peak_mem_mib: Some(4000),
            ..attempt::not_started(
                Unstarted::LaunchFailed,
                format!("CUDA out of memory. Tried to allocate {tried}."),
            )
        };
        let mut r = report(7, oom_text("2.00 GiB"), None, vec![]);
        ran_under_cap(&mut r, Some(9472));
        assert_eq!(r.oom_cause, None, "{}", r.log_tail);
        assert!(
            r.log_tail.contains("within its own limit"),
            "{}",
            r.log_tail
        );
        let mut r = report(7, oom_text("6.00 GiB"), None, vec![]);
        ran_under_cap(&mut r, Some(9472));
        assert_eq!(r.oom_cause, Some(OomCause::CapHit), "4000 + 6144 > 9472");
    }

    /// A cancel is reported as why this supervisor asked for it; the end it stopped, as is.
    #[test]
    fn a_cancel_is_reported_by_why_it_was_asked() {
        use classify::{EndFacts, Ended, Stopped};
        let end = |stop| AttemptEnd {
            facts: EndFacts::ran(Ended::Signal(15), stop, true),
            ..attempt::not_started(Unstarted::LaunchFailed, "tail".into())
        };
        let cancel = Some(Stopped::Cancel);
        let user = report(7, end(cancel), Some(StopReason::User), vec![]);
        assert_eq!(user.failure, Some(FailureClass::Cancelled));
        assert_eq!(user.log_tail, "tail");
        let fenced = report(7, end(cancel), Some(StopReason::LeaseLost), vec![]);
        assert_eq!(fenced.failure, Some(FailureClass::Lost));
        assert!(
            fenced.log_tail.ends_with("could not be renewed in time\n"),
            "{fenced:?}"
        );
        for reason in [Some(StopReason::Shutdown), None] {
            let r = report(7, end(cancel), reason, vec![]);
            assert_eq!(r.failure, Some(FailureClass::Lost), "{reason:?}");
            assert!(
                r.log_tail.ends_with("because the agent shut down\n"),
                "{r:?}"
            );
        }
        // The job ended by itself (OOM) before the agent's stop took effect.
        let oom = report(7, end(None), Some(StopReason::LeaseLost), vec![]);
        assert_eq!(oom.failure, Some(FailureClass::Oom));
        assert_eq!(oom.log_tail, "tail");
    }
}
