//! Stop and verify: ends the attempt's processes (SIGTERM, grace, SIGKILL, the marker's
//! sweep), confirms that none is alive and none holds memory on its GPUs, and makes the
//! attempt's end of it.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::supervisor::process::Child;
use chrono::Utc;
use headroom_shared::AttemptId;
use headroom_shared::api::{GpuSample, PeakSource};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::gpu::{self, GpuBackend};
use crate::procscan::{self};
use crate::supervisor::classify::{EndFacts, Ended, Stopped, Unstarted};
use crate::supervisor::colocate::{self};

use super::launch::{AttemptEnd, Launch, SupervisorConfig};
use super::log::note;
use super::running::{Running, signal_each, signal_group};
use super::watch::{Watch, figures, lock, take_reading};

/// How often cleanup re-checks processes and GPUs: short, since cleanup time is reported and
/// the GPU slot stays quarantined until it is verified.
pub(super) const POLL: Duration = Duration::from_millis(25);

/// The main process, as cleanup knows it.
#[derive(Clone, Copy)]
pub(super) enum Main {
    Running,
    /// With its status, `None` when waiting for it failed.
    Exited(Option<ExitStatus>),
}

impl Main {
    pub(super) fn exited(self) -> bool {
        matches!(self, Main::Exited(_))
    }

    pub(super) fn status(self) -> Option<ExitStatus> {
        match self {
            Main::Exited(status) => status,
            Main::Running => None,
        }
    }

    /// Reaps the main process if it has exited since the last look.
    pub(super) fn poll(&mut self, child: &mut Child) {
        if let Main::Running = self {
            match child.try_wait() {
                Ok(Some(status)) => *self = Main::Exited(Some(status)),
                Ok(None) => {}
                Err(_) => *self = Main::Exited(None),
            }
        }
    }
}

/// The attempt's live processes: the members of its cgroup where it has one; else this
/// process's descendants when it is their subreaper (`own_tree`: orphans of the tree
/// re-parent to it, so none can leave it); else those carrying the attempt's marker. `Err`:
/// they cannot be told (the cgroup or `/proc` cannot be read), which is never "none".
pub(super) async fn attempt_pids(attempt: AttemptId, own_tree: bool) -> Result<Vec<u32>, String> {
    if let Some(c) = crate::cgroup::attribution() {
        // On the runtime, as the cgroup was made ([`super::command`]): cgroupfs answers at
        // once and reads no process's memory, and a hand-off to the blocking pool and back
        // cost more than the read. `/proc` scans (another process's environment can wait on
        // its memory map) and GPU readings stay off it.
        let cg = c.attempt(attempt);
        return cg.pids().map_err(|e| {
            format!(
                "cannot read the attempt's cgroup {}: {e}",
                cg.dir().display()
            )
        });
    }
    if own_tree {
        tokio::task::spawn_blocking(procscan::descendants)
            .await
            .unwrap_or_else(|e| Err(format!("process tree task failed: {e}")))
    } else {
        Ok(marked(attempt).await)
    }
}

/// [`attempt_pids`], keeping why they could not be told in `unknown` (cleared by a scan
/// that could): the caller then counts nothing as verified.
async fn members(attempt: AttemptId, own_tree: bool, unknown: &mut Option<String>) -> Vec<u32> {
    match attempt_pids(attempt, own_tree).await {
        Ok(pids) => {
            *unknown = None;
            pids
        }
        Err(e) => {
            *unknown = Some(e);
            Vec::new()
        }
    }
}

/// SIGKILLs the attempt's whole cgroup, where it has one: what left its process group and
/// its supervisor's tree (`setsid`, double forks) is still in it.
/// On the runtime, as [`attempt_pids`] reads it.
pub(super) fn kill_cgroup(attempt: AttemptId) {
    if let Some(c) = crate::cgroup::attribution() {
        let _ = c.attempt(attempt).kill();
    }
}

/// The last `/proc` scan and when it started.
pub(super) type Scan = Option<(std::time::Instant, Arc<HashMap<AttemptId, Vec<u32>>>)>;

/// The attempt's live processes. Concurrent cleanups share scans: a caller takes the result
/// of a scan that started after it asked (so it misses nothing a fresh scan would see), and
/// many attempts ending together cost one pass over `/proc`, not one each.
pub(super) async fn marked(attempt: AttemptId) -> Vec<u32> {
    static LAST: OnceLock<tokio::sync::Mutex<Scan>> = OnceLock::new();
    // Wall-clock instants: a paused test clock must not make an old scan look fresh.
    let asked = std::time::Instant::now();
    let mut last = LAST
        .get_or_init(|| tokio::sync::Mutex::new(None))
        .lock()
        .await;
    if let Some((started, scan)) = last.as_ref()
        && *started >= asked
    {
        return scan.get(&attempt).cloned().unwrap_or_default();
    }
    let started = std::time::Instant::now();
    let scan = Arc::new(
        tokio::task::spawn_blocking(procscan::marked_processes)
            .await
            .unwrap_or_default(),
    );
    *last = Some((started, scan.clone()));
    scan.get(&attempt).cloned().unwrap_or_default()
}

/// The pids of the attempt still on a GPU, or why its GPUs cannot be read; with the
/// reading they come from.
pub(super) async fn on_gpus(
    backend: &Arc<dyn GpuBackend>,
    watch: &Arc<Mutex<Watch>>,
) -> (Vec<GpuSample>, Result<Vec<(u32, u64)>, String>) {
    let (backend, watch) = (backend.clone(), watch.clone());
    tokio::task::spawn_blocking(move || {
        let samples = gpu::read(backend.as_ref());
        let mut w = lock(&watch);
        w.observe(&samples);
        let left = w.leftovers(&samples);
        (samples, left)
    })
    .await
    .unwrap_or_else(|e| (Vec::new(), Err(format!("GPU reading task failed: {e}"))))
}

/// `pid 4242 (alice: python train.py) holds 5632 MiB`, for quarantine reports.
pub(super) fn describe_leftovers(left: &[(u32, u64)]) -> String {
    left.iter()
        .map(|&(pid, mib)| {
            let (user, command) = procscan::describe(pid);
            format!(
                "pid {pid} ({}: {}) holds {mib} MiB",
                user.as_deref().unwrap_or("?"),
                command.as_deref().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub(super) struct Cleanup {
    pub(super) status: Option<ExitStatus>,
    pub(super) verified: bool,
    /// Processes still alive after the main process had exited.
    pub(super) leftovers: Vec<u32>,
    /// What was left when verification gave up.
    pub(super) remaining: String,
    /// Pids still holding GPU memory when verification gave up.
    pub(super) held_by: Vec<u32>,
    /// GPUs whose unattributed memory stayed too high, with the limit that clears them.
    pub(super) ghost_limits: Vec<(u32, u64)>,
    /// The reading that found nothing of a verified attempt left on its GPUs.
    pub(super) gpus_after: Option<Vec<GpuSample>>,
}

/// SIGTERM, grace, SIGKILL, sweep the marker, reap, and verify on the GPUs. Polls throughout:
/// an attempt that leaves nothing behind is done in a few milliseconds.
pub(super) async fn cleanup(
    child: &mut Child,
    pgid: u32,
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    mut main: Main,
    watch: &Arc<Mutex<Watch>>,
) -> Cleanup {
    let attempt = launch.attempt;
    let main_exited = main.exited();

    // Ask politely: the group, and processes that left it (double-forked daemons).
    // Scan first: the group's SIGTERM would end most leftovers before they could be counted.
    let mut unknown = None;
    let mut alive = members(attempt, cfg.own_tree, &mut unknown).await;
    signal_group(pgid, Signal::SIGTERM);
    signal_each(&alive, Signal::SIGTERM);
    let leftovers = if main_exited {
        alive.clone()
    } else {
        Vec::new()
    };
    let grace_end = Instant::now() + cfg.kill_grace;
    loop {
        main.poll(child);
        if (main.exited() && alive.is_empty() && unknown.is_none()) || Instant::now() >= grace_end {
            break;
        }
        tokio::time::sleep(POLL).await;
        alive = members(attempt, cfg.own_tree, &mut unknown).await;
    }

    // Then by force, until nothing of the attempt is alive or on its GPUs.
    signal_group(pgid, Signal::SIGKILL);
    if !main.exited() {
        // In case the main process left its group.
        let _ = child.start_kill();
    }
    let verify_end = Instant::now() + cfg.verify_timeout;
    let mut remaining;
    let mut held: Vec<(u32, u64)> = Vec::new();
    let mut first = true;
    loop {
        // The grace loop has just scanned; the confirming scan below is fresh either way.
        if !first {
            alive = members(attempt, cfg.own_tree, &mut unknown).await;
        }
        first = false;
        kill_cgroup(attempt);
        signal_each(&alive, Signal::SIGKILL);
        main.poll(child);
        if !alive.is_empty() || !leftovers.is_empty() {
            // Killed orphans re-parented to the agent: reap them now rather than at the next
            // heartbeat. (Zombies hold no memory and carry no live marker, so verification
            // does not wait for this.)
            let _ = tokio::task::spawn_blocking(procscan::reap_orphans).await;
        }
        // `None`: not looked at yet, processes of the attempt are still alive.
        let mut reading = None;
        let gpu = if alive.is_empty() && unknown.is_none() && main.exited() {
            let (samples, left) = on_gpus(backend, watch).await;
            reading = Some(samples);
            Some(left)
        } else {
            None
        };
        // Confirm with a second scan: a process caught mid-exec reads without environment.
        if matches!(&gpu, Some(Ok(left)) if left.is_empty())
            && members(attempt, cfg.own_tree, &mut unknown)
                .await
                .is_empty()
            && unknown.is_none()
        {
            return Cleanup {
                status: main.status(),
                verified: true,
                leftovers,
                remaining: String::new(),
                held_by: vec![],
                ghost_limits: vec![],
                gpus_after: reading,
            };
        }
        remaining = match (gpu, main.exited()) {
            // What cannot be told is never "gone".
            _ if unknown.is_some() => unknown.clone().unwrap_or_default(),
            (_, false) => format!("main process {pgid} has not exited"),
            (Some(Ok(left)), true) => {
                held = left;
                "processes still hold memory on the GPUs".to_string()
            }
            // Unknown is never clean: the reading's error is the quarantine's reason.
            (Some(Err(error)), true) => {
                held.clear();
                error
            }
            (None, true) => format!("processes {alive:?} still alive"),
        };
        if Instant::now() >= verify_end {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    if !held.is_empty() {
        let h = held.clone();
        remaining = tokio::task::spawn_blocking(move || describe_leftovers(&h))
            .await
            .unwrap_or(remaining);
    }
    tracing::warn!(%attempt, %remaining, "attempt cleanup not verified");
    Cleanup {
        status: main.status(),
        verified: false,
        leftovers,
        remaining,
        held_by: held.iter().map(|&(pid, _)| pid).collect(),
        // Whatever kept it unverified, memory its processes leave behind must come down too.
        ghost_limits: lock(watch).baseline.ghost_limits(&launch.gpus),
        gpus_after: None,
    }
}

/// The end of an attempt whose foreground never started (for `why`): its background is
/// stopped with the attempt's verified cleanup, as the main process of the attempt.
pub(super) async fn stop_background_only(
    mut bg: colocate::Running,
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    watch: &Arc<Mutex<Watch>>,
    why: Unstarted,
) -> AttemptEnd {
    let end_mark = Instant::now();
    let ended_at = Utc::now();
    let main = match bg.exit {
        Some(status) => Main::Exited(status),
        None => Main::Running,
    };
    let outcome = cleanup(&mut bg.child, bg.pid, launch, backend, cfg, main, watch).await;
    if bg.exit.is_none() {
        bg.exit = Some(outcome.status);
    }
    let report = bg.finish();
    let (contaminated, measurements) = {
        let w = lock(watch);
        (w.contaminated, w.measurements())
    };
    AttemptEnd {
        facts: EndFacts::not_started(why),
        exit_code: None,
        signal: None,
        started_at: None,
        ended_at,
        pid: None,
        peak_mem_mib: None,
        peak_source: PeakSource::Processes,
        cleanup_ms: u64::try_from(end_mark.elapsed().as_millis()).unwrap_or(u64::MAX),
        cleanup_verified: outcome.verified,
        unverified: (!outcome.verified).then(|| outcome.remaining.clone()),
        held_by: outcome.held_by,
        gpus_after: outcome.gpus_after,
        ghost_limits: outcome.ghost_limits,
        contaminated,
        // No foreground ran: no figures, only what contaminated the wait.
        measurements,
        log_tail: String::new(),
        background: Some(report),
        metrics: None,
        memory_cap_mib: None,
    }
}

/// Why the run stopped.
pub(super) enum Stop {
    /// `None` if waiting failed (the status was taken by someone else).
    Exited(Option<ExitStatus>),
    Timeout,
    Cancelled,
    /// The colocated background exited, with `on_background_exit: fail`.
    BackgroundExited,
    /// Exited after its checkpoint signal: stopped by headroom (a requeue, its timeout)
    /// however it exited.
    AfterSignal(Option<ExitStatus>, Stopped),
}

/// Ends a run that stopped: stops and verifies every process of the attempt (its
/// background's too), takes the last readings and the log's tail, and says how it ended.
pub(super) async fn end(
    mut run: Running,
    stop: Stop,
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
) -> AttemptEnd {
    let ended_at = Utc::now();
    let end_mark = Instant::now();
    // The reading at the end, beside the cleanup rather than before it (it must not delay
    // freeing the GPU), after a start reading still on its way (the backend opening).
    let end_reading = {
        let w = run.watch.clone();
        let start_reading = run.start_reading.take();
        tokio::spawn(async move {
            if let Some(r) = start_reading {
                let _ = r.await;
            }
            let _ = take_reading(&w).await;
        })
    };
    let log = &run.log;
    let (main, stopped) = match stop {
        Stop::Exited(status) => (Main::Exited(status), None),
        Stop::AfterSignal(status, why) => {
            note(log, "the job exited after its checkpoint signal");
            (Main::Exited(status), Some(why))
        }
        Stop::BackgroundExited => (Main::Running, Some(Stopped::BackgroundExited)),
        Stop::Timeout => {
            let t = launch.timeout.unwrap_or_default();
            note(log, &format!("timeout after {t:?}: stopping the job"));
            (Main::Running, Some(Stopped::Timeout))
        }
        Stop::Cancelled => {
            // Why (a user's cancel, early stopping, a lost lease) is said where it was decided.
            note(log, "asked to stop: stopping the job");
            (Main::Running, Some(Stopped::Cancel))
        }
    };

    // The background is one of the attempt's processes: this stops it too, whatever the end.
    let pid = run.pid;
    let mut outcome = cleanup(&mut run.child, pid, launch, backend, cfg, main, &run.watch).await;
    let cleanup_ms = u64::try_from(end_mark.elapsed().as_millis()).unwrap_or(u64::MAX);
    run.guard.armed = false;
    procscan::disown(pid);
    let log = &run.log;
    let background = run.background.as_mut().map(|bg| {
        outcome.leftovers.retain(|&p| p != bg.pid);
        let report = bg.finish();
        if !bg.exited_early {
            note(
                log,
                &format!(
                    "background stopped with the foreground ({})",
                    bg.describe_exit()
                ),
            );
        }
        report
    });
    if let Some(g) = run.background_guard.as_mut() {
        g.armed = false;
    }
    if !outcome.leftovers.is_empty() {
        note(
            log,
            &format!(
                "stopped {} leftover process(es) of the attempt: {:?}",
                outcome.leftovers.len(),
                outcome.leftovers
            ),
        );
    }
    if !outcome.verified {
        note(
            log,
            &format!(
                "cleanup NOT verified after {:?}: {}",
                cfg.verify_timeout, outcome.remaining
            ),
        );
    }

    let _ = end_reading.await;
    let mut f = figures(&run.watch, &launch.log_path, run.log_start).await;
    let failed = outcome.status.is_none_or(|s| !s.success());
    // Only a clean run's shape is one its configuration's next runs may be placed by:
    // uncontaminated, measured per process (memory of no listed process, a neighbour's that
    // the driver has yet to release, is no part of what its own processes held).
    if !failed && !f.contaminated && f.peak_source == PeakSource::Processes {
        let run_ms = (ended_at - run.started_at).num_milliseconds();
        f.measurements.memory_profile = lock(&run.watch)
            .series
            .fit(u64::try_from(run_ms).unwrap_or(0));
    }
    if let Some(hint) = failed.then(|| denied_hint(launch, &f.log_tail)).flatten() {
        note(log, &hint);
        f.log_tail.push_str(&format!("[headroom] {hint}\n"));
    }
    AttemptEnd {
        facts: EndFacts::ran(Ended::of(outcome.status), stopped, f.saw_oom),
        exit_code: outcome.status.and_then(|s| s.code()),
        signal: outcome.status.and_then(|s| s.signal()),
        started_at: Some(run.started_at),
        ended_at,
        pid: Some(pid),
        peak_mem_mib: f.peak,
        peak_source: f.peak_source,
        cleanup_ms,
        cleanup_verified: outcome.verified,
        unverified: (!outcome.verified).then(|| outcome.remaining.clone()),
        held_by: outcome.held_by,
        gpus_after: outcome.gpus_after,
        ghost_limits: outcome.ghost_limits,
        contaminated: f.contaminated,
        measurements: f.measurements,
        log_tail: f.log_tail,
        background,
        metrics: f.metrics,
        memory_cap_mib: run.memory_cap_mib,
    }
}

/// What to say of a failed job whose output says `Permission denied` while it ran as a user
/// of the agent's choosing (a root agent's): who it ran as, and what would run it as
/// someone who may read the files.
fn denied_hint(launch: &Launch, tail: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if !tail.contains("Permission denied") {
        return None;
    }
    let id = crate::runas::resolve(launch.run_as.as_ref()?).ok()?;
    // In a directory of its own user's, the refusal is not about who it ran as.
    if let Some(dir) = &launch.workdir
        && std::fs::metadata(dir).is_ok_and(|m| m.uid() == id.uid.as_raw())
    {
        return None;
    }
    Some(format!(
        "the job's output says `Permission denied`: it ran as the Unix user `{}`, who may \
         not read what it needs. {}",
        id.name,
        crate::runas::MAPPING_HINT
    ))
}
