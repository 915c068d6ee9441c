//! The attempt's start: its log, what was on its GPUs before, its colocated background
//! (started first and waited for), and its job, spawned in a session of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::command::{command, spawn};
use super::launch::{AttemptEnd, Launch, NotStarted, SupervisorConfig, not_started};
use super::log::{note, open_log, read_tail};
use super::running::{KillOnDrop, Running};
use super::stop::stop_background_only;
use super::watch::{Baseline, LogFollower, Peak, Watch, lock, take_reading};
use crate::gpu::GpuBackend;
use crate::supervisor::classify::Unstarted;
use crate::supervisor::colocate;
use crate::supervisor::measure::Meter;

/// Starts the attempt: its background first when it has one, then its job. `Err`: the
/// attempt ended without its job starting (a launch error, a background not ready, a
/// cancel meanwhile), cleaned up.
pub(super) async fn start(
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    cancel: &CancellationToken,
) -> Result<Running, AttemptEnd> {
    let log = match open_log(&launch.log_path) {
        Ok(log) => log,
        Err(e) => {
            let msg = format!("cannot open log {}: {e}", launch.log_path.display());
            return Err(not_started(
                Unstarted::LaunchFailed,
                format!("[headroom] {msg}\n"),
            ));
        }
    };
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let memory_cap_mib = set_cap(launch, backend, cfg, &log).await;
    let launch_error = |e: NotStarted| {
        note(&log, &e.message);
        let tail = read_tail(&launch.log_path, log_start);
        not_started(e.why, tail)
    };

    // What was on the GPUs before: cleanup returns to this, not to "empty".
    let baseline = match launch.baseline.clone() {
        Some(b) => b,
        None => {
            let (b, gpus) = (backend.clone(), launch.gpus.clone());
            tokio::task::spawn_blocking(move || Baseline::read(b.as_ref(), &gpus))
                .await
                .unwrap_or_default()
        }
    };
    let watch = Arc::new(Mutex::new(Watch {
        backend: backend.clone(),
        attempt: launch.attempt,
        peak: Peak::default(),
        log: LogFollower::open(&launch.log_path, log_start, launch.results.as_ref()),
        gpus: launch.gpus.clone(),
        baseline,
        contaminated: false,
        meter: Meter::new(&launch.gpus),
        contamination: None,
        exclusive: launch.prestart.exclusive,
        colocated: launch.background.is_some(),
        roles: HashMap::new(),
        background_memory: false,
        ghost: Default::default(),
        own_util: HashMap::new(),
        series: Default::default(),
        exec_at: None,
    }));
    let sample_every = cfg.sample_every.max(Duration::from_millis(10));

    // A colocated background starts first; the foreground waits until it is ready.
    let mut background = None;
    let mut background_guard = None;
    if let Some(spec) = &launch.background {
        let mut bg = match colocate::Running::spawn(launch, spec, backend.as_ref()) {
            Ok(bg) => bg,
            Err(e) => return Err(launch_error(e)),
        };
        let mut guard = KillOnDrop {
            pgid: bg.pid,
            attempt: launch.attempt,
            armed: true,
        };
        note(
            &log,
            &format!(
                "background pid {} started: {} (its log: {})",
                bg.pid,
                spec.argv.join(" "),
                bg.log_path.display()
            ),
        );
        let timeout = Duration::from_millis(spec.start_timeout_ms);
        let waited = bg.wait_ready(&watch, timeout, sample_every, cancel).await;
        let failed = match waited {
            colocate::Wait::Ready => None,
            colocate::Wait::Exited => Some((
                Unstarted::BackgroundNotReady,
                format!(
                    "the background exited ({}) before it was ready: the foreground did not start",
                    bg.describe_exit()
                ),
            )),
            colocate::Wait::TimedOut(t) => Some((
                Unstarted::BackgroundNotReady,
                format!(
                    "the background was not ready within colocate.start_timeout ({}): {}; \
                     the foreground did not start",
                    humantime::format_duration(t),
                    match &spec.ready_log {
                        Some(re) => format!("no line of its log matched `{re}`"),
                        None => "none of its GPU memory was seen".to_string(),
                    }
                ),
            )),
            colocate::Wait::Cancelled => Some((
                Unstarted::Stopped,
                "cancelled while waiting for the background to be ready".to_string(),
            )),
        };
        if let Some((why, msg)) = failed {
            note(&log, &msg);
            let end = stop_background_only(bg, launch, backend, cfg, &watch, why).await;
            guard.armed = false;
            return Err(AttemptEnd {
                log_tail: read_tail(&launch.log_path, log_start),
                ..end
            });
        }
        note(
            &log,
            &format!(
                "background ready after {} ms ({}): starting the foreground",
                bg.ready_ms.unwrap_or(0),
                match &spec.ready_log {
                    Some(re) => format!("its log matched `{re}`"),
                    None => "its GPU memory was seen".to_string(),
                }
            ),
        );
        background = Some(bg);
        background_guard = Some(guard);
    }

    // The start reading, before the job's exec, so that its figures cover its whole run
    // (the backend has been opening since the supervisor started). Taken while the job's
    // command is readied (its user, cgroup and directories), which does not need it, so
    // that neither waits for the other. Bounded: a backend that takes longer to open lets
    // the job start, and its figures say how late they begin.
    let mut start_reading = take_reading(&watch);
    // The spec holds the log handles given to the child: they close with it.
    let readied = command(launch, backend.as_ref(), &log);
    let start_reading = match &readied {
        // Nothing starts: the reading is not waited for.
        Err(_) => None,
        Ok(_) => match tokio::time::timeout(cfg.start_reading_wait, &mut start_reading).await {
            Ok(_) => None,
            Err(_) => {
                note(
                    &log,
                    &format!(
                        "the GPUs could not be read within {}: the job starts, and its \
                         figures begin when they can be read",
                        humantime::format_duration(cfg.start_reading_wait)
                    ),
                );
                Some(start_reading)
            }
        },
    };
    {
        let mut w = lock(&watch);
        let exec = std::time::Instant::now();
        w.meter.mark_exec(exec);
        w.exec_at = Some(exec);
        w.log.metrics.started();
    }
    let spawned = readied.and_then(|spec| spawn(spec, launch, &format!("`{}`", launch.argv[0])));
    // A fresh child always has a pid; without one there is nothing to supervise, and pid 0
    // must never reach killpg (it would signal the agent's own group).
    let spawned = spawned.and_then(|child| match Some(child.id()).filter(|&p| p > 0) {
        Some(pid) => Ok((child, pid)),
        None => Err("the process vanished at spawn".to_string().into()),
    });
    let (child, pid) = match spawned {
        Ok(spawned) => spawned,
        Err(e) => {
            // A background already runs: it is stopped and verified gone like any end of
            // the attempt, and recorded, not left to an unverified kill.
            if let (Some(bg), Some(mut guard)) = (background, background_guard) {
                note(&log, &format!("{}; stopping the background", e.message));
                let end = stop_background_only(bg, launch, backend, cfg, &watch, e.why).await;
                guard.armed = false;
                return Err(AttemptEnd {
                    log_tail: read_tail(&launch.log_path, log_start),
                    ..end
                });
            }
            return Err(launch_error(e));
        }
    };
    let guard = KillOnDrop {
        pgid: pid,
        attempt: launch.attempt,
        armed: true,
    };
    Ok(Running {
        log,
        log_start,
        start_reading,
        watch,
        sample_every,
        child,
        pid,
        started_at: Utc::now(),
        guard,
        background,
        background_guard,
        memory_cap_mib,
    })
}

/// Holds the attempt to its GPU memory limit (the agent asks only where its GPUs can set
/// one), before any of its processes starts; the limit set, if one was. Setting it waits
/// for the GPUs to open no longer than the start reading does (`start_reading_wait`).
async fn set_cap(
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    log: &std::fs::File,
) -> Option<u64> {
    let mib = launch.memory_cap_mib?;
    let (b, attempt) = (backend.clone(), launch.attempt);
    let setting = tokio::task::spawn_blocking(move || b.set_memory_cap(attempt, Some(mib)));
    let set = match tokio::time::timeout(cfg.start_reading_wait, setting).await {
        Ok(done) => done.unwrap_or_else(|e| Err(format!("memory cap task: {e}"))),
        Err(_) => Err(format!(
            "its GPUs did not open within {:?}",
            cfg.start_reading_wait
        )),
    };
    match set {
        Ok(()) => {
            note(
                log,
                &format!(
                    "GPU memory cap: {mib} MiB on each of its GPUs (its estimate and a slack)"
                ),
            );
            Some(mib)
        }
        Err(why) => {
            note(log, &format!("no GPU memory cap: {why}"));
            None
        }
    }
}

/// Lifts the attempt's GPU memory limit, once its processes are gone.
pub(super) async fn clear_cap(attempt: headroom_shared::AttemptId, backend: &Arc<dyn GpuBackend>) {
    let b = backend.clone();
    let cleared = tokio::task::spawn_blocking(move || b.set_memory_cap(attempt, None)).await;
    if let Ok(Err(e)) = cleared {
        tracing::warn!(%attempt, "cannot lift the attempt's GPU memory cap: {e}");
    }
}
