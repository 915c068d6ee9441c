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
pub mod measure;
pub mod prestart;
pub mod process;
pub mod proto;
pub mod self_fence;

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::FailureClass;
use headroom_shared::api::{FinishReport, JobStarted};
use tokio::net::UnixListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::gpu::lazy::{LazyBackend, Opening};
use crate::gpu::{self, BackendChoice, GpuBackend};
use crate::outcomes::{Outcome, Outcomes};
use attempt::{AttemptEnd, SupervisorConfig};
use direct::{Delivery, DirectLink, Renewal};
use handoff::Handoff;
use headroom_shared::prestart::{Prestart, PrestartReport};
use proto::StopReason;
use proto::{Conn, FromSupervisor, PROTOCOL, Spec, ToSupervisor};
use self_fence::SelfFence;

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
    let mut fence = SelfFence::new(Duration::from_millis(spec.stop_in_ms));
    let launch = spec.launch.clone();
    let attempt = launch.attempt;
    let hello = |started: Option<(u32, DateTime<Utc>)>| FromSupervisor::Hello {
        version: PROTOCOL,
        attempt,
        job: launch.job,
        fence: spec.fence,
        gpus: launch.gpus.clone(),
        pid: started.map(|s| s.0),
        started_at: started.map(|s| s.1),
    };
    // Bound before the job starts: from here on, a restarted agent can find us.
    let listener = match proto::socket_addr(&spec.scope, attempt)
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            UnixListener::from_std(l)
        }) {
        Ok(l) => Some(l),
        Err(e) => {
            // Still supervised and fenced; a restarted agent will not find it and sweeps it.
            tracing::warn!(%attempt, "cannot listen for a restarted agent: {e}");
            None
        }
    };
    let mut link = Link {
        conn: Some(first),
        started: None,
        reattached: false,
    };
    link.send(&hello(None)).await;

    // Opened since the supervisor started: one that cannot open reads as unknown (figures
    // unknown, cleanup unverified).
    let backend: Arc<dyn GpuBackend> = Arc::new(LazyBackend::new(
        opening,
        spec.job_env.clone(),
        launch.gpus.clone(),
    ));
    let cfg = SupervisorConfig {
        kill_grace: Duration::from_millis(spec.kill_grace_ms),
        verify_timeout: Duration::from_millis(spec.verify_timeout_ms),
        sample_every: Duration::from_millis(spec.sample_every_ms),
        start_reading_wait: Duration::from_millis(spec.start_reading_wait_ms),
        own_tree,
    };
    let cancel = CancellationToken::new();
    let mut reason: Option<StopReason> = None;
    // The line to the coordinator for while the agent is away: when the next renewal of our
    // own is due (none while one is on its way), and whether we renewed the lease ourselves
    // (then the agent is not renewing it, and may not report the end either).
    let mut direct = spec
        .direct
        .clone()
        .map(|d| DirectLink::new(d, attempt, spec.fence));
    let mut renew_due = direct.as_ref().map(|d| d.due(fence.deadline()));
    let mut renewing: Option<tokio::task::JoinHandle<Renewal>> = None;
    let mut renewed_itself = false;
    let (attach_tx, mut attach_rx) = tokio::sync::mpsc::unbounded_channel();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let (waiting_tx, mut waiting_rx) = tokio::sync::mpsc::unbounded_channel();
    let run = prestart_then_run(
        launch.clone(),
        backend.clone(),
        &cfg,
        cancel.clone(),
        move |w| {
            let _ = waiting_tx.send(w);
        },
        move |pid| {
            let _ = started_tx.send((pid, Utc::now()));
        },
    );
    tokio::pin!(run);
    let (mut end, prestart) = loop {
        tokio::select! {
            end = &mut run => break end,
            Some((pid, at)) = started_rx.recv() => {
                link.started = Some((pid, at));
                link.send(&FromSupervisor::Started { pid, started_at: at }).await;
            }
            Some(reason) = waiting_rx.recv() => {
                link.send(&FromSupervisor::Waiting { reason }).await;
            }
            msg = link.recv() => match msg {
                Some(Ok(Some(ToSupervisor::Renew { stop_in_ms }))) => {
                    fence.renew(Duration::from_millis(stop_in_ms));
                    // The agent renews again: the end is its to report.
                    renewed_itself = false;
                    if let Some(d) = &direct && renewing.is_none() {
                        renew_due = Some(d.due(fence.deadline()));
                    }
                }
                Some(Ok(Some(ToSupervisor::Stop { reason: r }))) => {
                    reason.get_or_insert(r);
                    cancel.cancel();
                }
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
            },
            accepted = accept(&listener) => match accepted.and_then(|s| s.into_std()) {
                // Checked aside (a peer that says nothing must not hold the attempt up): only
                // one of the agent's user that proves the attach key takes over.
                Ok(stream) => {
                    let (tx, key) = (attach_tx.clone(), spec.key.clone());
                    tokio::spawn(async move {
                        match Conn::accept_attach(stream, &key, ATTACH_WAIT).await {
                            Ok(conn) => { let _ = tx.send(conn); }
                            Err(e) => tracing::warn!(%attempt, "refused a connection: {e}"),
                        }
                    });
                }
                Err(e) => tracing::warn!(%attempt, "cannot accept a connection: {e}"),
            },
            Some(conn) = attach_rx.recv() => {
                // A restarted agent takes over; the old connection (if any) is dropped.
                link.conn = Some(conn);
                link.reattached = true;
                link.send(&hello(link.started)).await;
            }
            _ = at(renew_due), if reason.is_none() && renewing.is_none() => {
                renew_due = None;
                if let Some(d) = direct.as_mut() {
                    renewing = Some(tokio::spawn(d.renew(fence.deadline())));
                }
            }
            renewal = joined(&mut renewing) => {
                renewing = None;
                match renewal {
                    Renewal::Renewed { until, cancel: cancelled } => {
                        fence.extend_to(until);
                        renewed_itself = true;
                        renew_due = direct.as_ref().map(|d| d.due(fence.deadline()));
                        if cancelled && reason.is_none() {
                            reason = Some(StopReason::User);
                            cancel.cancel();
                        }
                    }
                    Renewal::Gone(why) => {
                        tracing::warn!(%attempt, "the lease is no longer this attempt's ({why}): stopping the job");
                        reason.get_or_insert(StopReason::LeaseLost);
                        cancel.cancel();
                    }
                    Renewal::Failed(why) => {
                        tracing::warn!(%attempt, "cannot renew the lease itself, retrying: {why}");
                        renew_due = direct.as_ref().map(|d| Instant::now() + d.retry());
                    }
                }
            }
            _ = fence.due(), if reason.is_none() => {
                tracing::warn!(%attempt, "lease not renewed in time: stopping the job");
                reason = Some(StopReason::LeaseLost);
                cancel.cancel();
            }
        }
    };
    if let Some(r) = renewing {
        r.abort();
    }
    // A verified cleanup's last reading found the attempt gone from its GPUs: reported as
    // is, rather than read once more on the way from the job's end to the free slot.
    let gpus = match end.gpus_after.take() {
        Some(g) => g,
        None => gpu::read(backend.as_ref()),
    };
    // Past the fence and one more budget, the coordinator has long given the lease up.
    let give_up_at = fence.deadline() + direct.as_ref().map_or(Duration::ZERO, |d| d.fence_after());
    let reporter = Reporter {
        direct,
        // The agent is away, or was not renewing: the end goes to the coordinator directly.
        away: renewed_itself,
        give_up_at,
    };
    finish(
        &spec, end, reason, gpus, prestart, link, reuse, reporter, listener,
    )
    .await
}

/// Resolves at `when`; never when `None`.
async fn at(when: Option<Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The answer of the renewal on its way; pending while none is.
async fn joined(renewing: &mut Option<tokio::task::JoinHandle<Renewal>>) -> Renewal {
    match renewing.as_mut() {
        Some(h) => h
            .await
            .unwrap_or_else(|e| Renewal::Failed(format!("renewal task: {e}"))),
        None => std::future::pending().await,
    }
}

/// Who hears of the end besides the journal.
struct Reporter {
    direct: Option<DirectLink>,
    /// The agent did not renew the lease lately, or is not attached.
    away: bool,
    give_up_at: Instant,
}

/// The attempt's wait before its job starts ([`crate::supervisor::prestart`]), then the attempt itself;
/// a wait that ends without a start (a stop, `max_wait`) ends the attempt unstarted.
async fn prestart_then_run(
    mut launch: attempt::Launch,
    backend: Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    cancel: CancellationToken,
    waiting: impl FnMut(Option<String>) + Send,
    started: impl FnOnce(u32) + Send,
) -> (AttemptEnd, Option<PrestartReport>) {
    if launch.prestart == Prestart::default() {
        return (
            attempt::run_attempt(launch, backend, cfg, cancel, started).await,
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
        waiting,
    )
    .await;
    match waited {
        Ok(report) => {
            // What is on the GPUs now, not at admission before the wait, is what cleanup
            // returns to.
            if let Some(samples) = &probe.last {
                launch.baseline = Some(attempt::Baseline::of(samples, &launch.gpus));
            }
            let end = attempt::run_attempt(launch, backend, cfg, cancel, started).await;
            (end, Some(report))
        }
        Err(n) => (
            attempt::not_started(Some(n.failure), format!("[headroom] {}\n", n.message)),
            Some(n.report),
        ),
    }
}

/// Journals the end (flushed to disk), reports it to the coordinator itself when the agent
/// is away, then tells the attached agent (if any), and whether this process can take
/// another attempt: only after a clean end (journalled, its whole tree verified gone) and
/// for the agent that started it.
#[allow(clippy::too_many_arguments)]
async fn finish(
    spec: &Spec,
    end: AttemptEnd,
    reason: Option<StopReason>,
    gpus: Vec<headroom_shared::api::GpuSample>,
    prestart: Option<PrestartReport>,
    mut link: Link,
    reuse: bool,
    mut reporter: Reporter,
    listener: Option<UnixListener>,
) -> Next {
    let held_by = end.held_by.clone();
    let ghost_limits = end.ghost_limits.clone();
    let clean = end.cleanup_verified;
    // A supervisor that could not start a job (descriptors, memory, a broken runtime) is
    // not trusted with another.
    let launched = end.failure != Some(FailureClass::LaunchError);
    let mut report = report(spec.fence, end, reason, gpus);
    report.prestart = prestart;
    if let Some(c) = crate::cgroup::attribution() {
        let cg = c.attempt(spec.launch.attempt);
        // On the runtime: cgroupfs answers at once (see `attempt::stop::attempt_pids`).
        report.host_peak_mib = cg.peak_mib();
        // Left in place when not verified empty: the agent's sweep kills what is in it.
        if clean && let Err(e) = cg.remove() {
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
    let journal = Outcomes::writer(&spec.data_dir);
    // A restarting agent clears temporary files it finds (a write a kill cut short): try
    // again with a fresh one if ours went away under us.
    let mut spare = spec.spare.clone();
    let mut written = Err(String::new());
    for _ in 0..3 {
        written = journal
            .write_through(&outcome, spare.take())
            .map_err(|e| e.to_string());
        if written.is_ok() {
            break;
        }
    }
    // Journalled: a restarted agent reads the end there, and no longer looks for this
    // process to re-attach to (which, no longer answering, it would kill).
    drop(listener);
    if let Err(e) = &written {
        // An attached agent still gets it below; with none, it is lost as the attempt is.
        eprintln!(
            "headroom attempt supervisor: cannot journal the outcome of {}: {e}",
            spec.launch.attempt
        );
    }
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
    let reusable = reuse && clean && launched && written.is_ok() && !link.reattached;
    let attempt = outcome.attempt;
    link.send(&FromSupervisor::Ended {
        held_by,
        ghost_limits,
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

/// The end report of an attempt, its failure class saying why headroom stopped it.
pub fn report(
    fence: i64,
    end: AttemptEnd,
    reason: Option<StopReason>,
    gpus: Vec<headroom_shared::api::GpuSample>,
) -> FinishReport {
    let mut failure = end.failure;
    let mut log_tail = end.log_tail;
    // Carried with the end, so that an end reported before its start was starts it too.
    let started = end
        .pid
        .zip(end.started_at)
        .map(|(pid, started_at)| JobStarted { pid, started_at });
    if failure == Some(FailureClass::Cancelled) {
        match reason {
            Some(StopReason::User) => {}
            Some(StopReason::LeaseLost) => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped: the lease could not be renewed in time\n");
            }
            // Retried as the job's policy says for `lost`, now rather than at lease expiry.
            Some(StopReason::Shutdown) | None => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped because the agent shut down\n");
            }
        }
    }
    FinishReport {
        fence,
        failure,
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end's report carries the job's start, so that an end that reaches the
    /// coordinator without its start report (it failed, or the agent died first) still
    /// records when the job started and as which process.
    #[test]
    fn an_end_report_carries_the_jobs_start() {
        let at = Utc::now();
        let end = AttemptEnd {
            pid: Some(4242),
            started_at: Some(at),
            ..attempt::not_started(None, String::new())
        };
        let r = report(7, end, None, vec![]);
        assert_eq!(
            r.started,
            Some(JobStarted {
                pid: 4242,
                started_at: at
            })
        );
        let never = report(7, attempt::not_started(None, String::new()), None, vec![]);
        assert_eq!(never.started, None, "a job that never started has no start");
    }
}
