//! Runs one attempt of a job: spawns it in its own session with the job's environment and
//! log, watches for exit, timeout and cancellation while sampling its peak GPU memory, then
//! kills every process the attempt left behind and verifies its GPUs are free of it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::api::{BackgroundReport, GpuProcess, GpuSample, Measurements, PeakSource};
use headroom_shared::colocate::OnBackgroundExit;
use headroom_shared::expand::value_text;
use headroom_shared::prestart::Prestart;
use headroom_shared::{AttemptId, FailureClass, JobId};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::classify::{ExitKind, OomScanner, classify};
use crate::colocate::{self, ROLE_BACKGROUND, ROLE_VAR};
use crate::gpu::{self, GpuBackend};
use crate::measure::Meter;
use crate::procscan::{self, ATTEMPT_VAR};

/// How often cleanup re-checks processes and GPUs: short, since cleanup time is reported and
/// the GPU slot stays quarantined until it is verified.
const POLL: Duration = Duration::from_millis(25);
/// Bytes of log kept in [`AttemptEnd::log_tail`].
const TAIL_BYTES: u64 = 4096;
/// Most log bytes scanned per sampling tick, so that a job flooding its log cannot stall
/// the watch loop; the rest is read on the next tick or at the end.
const PUMP_LIMIT: u64 = 64 << 20;

/// Everything needed to run one attempt (sent to the attempt's supervisor process as JSON).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    pub attempt: AttemptId,
    pub job: JobId,
    /// Run directly, without a shell.
    pub argv: Vec<String>,
    /// Profile and job variables, already merged.
    pub env: BTreeMap<String, String>,
    /// Passed as `HP_<NAME>` variables.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Physical GPU indices, passed as `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    pub timeout: Option<Duration>,
    /// stdout and stderr are appended here; parent directories are created.
    pub log_path: PathBuf,
    pub workdir: Option<PathBuf>,
    /// What was on the GPUs just before, from a reading the caller made anyway (the agent's
    /// admission), so that the job's start does not wait for another; `None`: read here.
    #[serde(default)]
    pub baseline: Option<Baseline>,
    /// What the attempt waits for before the job starts ([`crate::prestart`]); exclusive
    /// attempts count any other process on their GPUs as contamination.
    #[serde(default)]
    pub prestart: Prestart,
    /// A colocated background to start first and wait for (`colocate`).
    #[serde(default)]
    pub background: Option<headroom_shared::colocate::Background>,
}

#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Longest wait, after SIGKILL, for the attempt's processes to leave its GPUs.
    pub verify_timeout: Duration,
    /// Interval of GPU memory sampling (peak memory) and of log scanning.
    pub sample_every: Duration,
    /// This process is the child subreaper of the attempt's whole tree (the attempt's own
    /// supervisor process): its processes are found among this process's descendants, a
    /// walk over the tree, instead of by reading every process's environment for the marker.
    pub own_tree: bool,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            kill_grace: Duration::from_secs(10),
            verify_timeout: Duration::from_secs(30),
            sample_every: Duration::from_secs(1),
            own_tree: false,
        }
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptEnd {
    /// `None` means success.
    pub failure: Option<FailureClass>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// `None` when the process never started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the main process exited, or when headroom decided to stop it.
    pub ended_at: DateTime<Utc>,
    pub pid: Option<u32>,
    /// Highest GPU memory seen at once over the attempt's processes; `None` when none of its
    /// processes was ever seen on a GPU, or their memory could not be told at all.
    pub peak_mem_mib: Option<u64>,
    /// How `peak_mem_mib` was measured: per process, or (when the driver gives no
    /// per-process memory) as the growth of the GPUs' used memory since the attempt began.
    pub peak_source: PeakSource,
    /// From the end of the main process (or the decision to stop it) until verified clean.
    pub cleanup_ms: u64,
    /// No process of the attempt is alive and none remains on a GPU, and no process that
    /// was not there before the attempt holds memory on its GPUs.
    pub cleanup_verified: bool,
    /// When not verified: what is left (pid, user, command, memory).
    pub unverified: Option<String>,
    /// The pids still holding memory when verification gave up; the GPUs are clean again
    /// once none of them is on them.
    pub held_by: Vec<u32>,
    /// A process of no attempt used the attempt's GPUs while it ran.
    pub contaminated: bool,
    /// Energy, power, temperature, utilization and throttling of its GPUs over the run, and
    /// the first process that contaminated it.
    pub measurements: Measurements,
    /// The last ~4 KiB of this attempt's log.
    pub log_tail: String,
    /// What became of the colocated background, when the attempt had one.
    pub background: Option<BackgroundReport>,
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot make the agent a child subreaper (prctl PR_SET_CHILD_SUBREAPER): {0}")]
    Subreaper(#[source] nix::Error),
}

/// Makes orphaned descendants of this process re-parent to it instead of init, so that the
/// supervisor can find, kill and reap double-forked processes of an attempt.
pub fn become_subreaper() -> Result<(), SupervisorError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(SupervisorError::Subreaper)
}

/// SIGKILLs every live process carrying `attempt`'s marker (e.g. leftovers of an earlier
/// incarnation of the agent); returns their pids. Blocking.
pub fn kill_marked(attempt: AttemptId) -> Vec<u32> {
    let pids = procscan::pids_with_marker(attempt);
    signal_each(&pids, Signal::SIGKILL);
    pids
}

/// Runs one attempt to its end and cleans up after it; never fails: problems are reported in
/// the returned [`AttemptEnd`]. `started` is called with the pid once the process runs.
///
/// Dropping the future kills the attempt's processes (best effort, unverified): stop an
/// attempt through `cancel` instead.
pub async fn run_attempt(
    launch: Launch,
    backend: Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    cancel: CancellationToken,
    started: impl FnOnce(u32) + Send,
) -> AttemptEnd {
    if cancel.is_cancelled() {
        return not_started(Some(FailureClass::Cancelled), String::new());
    }
    let log = match open_log(&launch.log_path) {
        Ok(log) => log,
        Err(e) => {
            let msg = format!("cannot open log {}: {e}", launch.log_path.display());
            return not_started(
                Some(FailureClass::LaunchError),
                format!("[headroom] {msg}\n"),
            );
        }
    };
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let launch_error = |msg: String| {
        note(&log, &msg);
        let tail = read_tail(&launch.log_path, log_start);
        not_started(Some(FailureClass::LaunchError), tail)
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
        log: LogFollower::open(&launch.log_path, log_start),
        gpus: launch.gpus.clone(),
        baseline,
        contaminated: false,
        meter: Meter::new(&launch.gpus),
        contamination: None,
        exclusive: launch.prestart.exclusive,
        colocated: launch.background.is_some(),
        roles: HashMap::new(),
        background_memory: false,
    }));
    let sample_every = cfg.sample_every.max(Duration::from_millis(10));

    // A colocated background starts first; the foreground waits until it is ready.
    let mut background = None;
    let mut bg_guard = None;
    if let Some(spec) = &launch.background {
        let mut bg = match colocate::Running::spawn(&launch, spec, backend.as_ref()) {
            Ok(bg) => bg,
            Err(msg) => return launch_error(msg),
        };
        bg_guard = Some(KillOnDrop {
            pgid: bg.pid,
            attempt: launch.attempt,
            armed: true,
        });
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
        let waited = bg.wait_ready(&watch, timeout, sample_every, &cancel).await;
        let failed = match waited {
            colocate::Wait::Ready => None,
            colocate::Wait::Exited => Some((
                FailureClass::BackgroundNotReady,
                format!(
                    "the background exited ({}) before it was ready: the foreground did not start",
                    bg.describe_exit()
                ),
            )),
            colocate::Wait::TimedOut(t) => Some((
                FailureClass::BackgroundNotReady,
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
                FailureClass::Cancelled,
                "cancelled while waiting for the background to be ready".to_string(),
            )),
        };
        if let Some((class, msg)) = failed {
            note(&log, &msg);
            let end = stop_background_only(bg, &launch, &backend, cfg, &watch, class).await;
            if let Some(g) = bg_guard.as_mut() {
                g.armed = false;
            }
            return AttemptEnd {
                log_tail: read_tail(&launch.log_path, log_start),
                ..end
            };
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
    }

    let mut cmd = match command(&launch, backend.as_ref(), &log) {
        Ok(cmd) => cmd,
        Err(msg) => return launch_error(msg),
    };
    let spawned = procscan::spawn_owned(|| cmd.spawn(), Child::id);
    // The command holds the log handles given to the child: close ours now.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return launch_error(format!("cannot start `{}`: {e}", launch.argv[0])),
    };
    // A fresh child always has a pid; without one there is nothing to supervise, and pid 0
    // must never reach killpg (it would signal the agent's own group).
    let Some(pid) = child.id().filter(|&p| p > 0) else {
        return launch_error("the process vanished at spawn".to_string());
    };
    let mut guard = KillOnDrop {
        pgid: pid,
        attempt: launch.attempt,
        armed: true,
    };
    let started_at = Utc::now();
    started(pid);

    // The energy counter's reading at the start. Not awaited: the job is already running,
    // and in an attempt's supervisor process this reading opens the GPU backend (NVML),
    // so it comes a moment after the spawn: the attempt's figures start from there. With a
    // colocated background the figures are the foreground's run on the GPU, background
    // included: its start and readiness wait come before this reading.
    let start_reading = take_reading(&watch);
    // Sample early and then less often: a short job must still be seen on its GPU once
    // (its peak teaches the estimate), a long one costs one sample per `sample_every`.
    let mut gap = Duration::from_millis(50).min(sample_every);
    let mut next_sample = Instant::now() + gap;
    let deadline = launch.timeout.map(|t| Instant::now() + t);

    let stop = loop {
        tokio::select! {
            // A job that has finished is reported as finished, whatever else is ready.
            biased;
            status = child.wait() => break Stop::Exited(status.ok()),
            _ = cancel.cancelled() => break Stop::Cancelled,
            _ = sleep_until(deadline) => break Stop::Timeout,
            _ = background_exit(&mut background) => {
                if let Some(bg) = background.as_mut() {
                    bg.exited_early = true;
                    let on_exit = launch.background.as_ref().map(|b| b.on_exit);
                    if on_exit == Some(OnBackgroundExit::Fail) {
                        note(&log, &format!(
                            "the background exited ({}) while the foreground ran: stopping the \
                             foreground (on_background_exit: fail)",
                            bg.describe_exit()
                        ));
                        break Stop::BackgroundExited;
                    }
                    note(&log, &format!(
                        "the background exited ({}) while the foreground ran; the foreground \
                         goes on (on_background_exit: flag)",
                        bg.describe_exit()
                    ));
                }
            }
            _ = tokio::time::sleep_until(next_sample) => {
                let w = watch.clone();
                let _ = tokio::task::spawn_blocking(move || lock(&w).step()).await;
                gap = (gap * 2).min(sample_every);
                next_sample = Instant::now() + gap;
            }
        }
    };
    let ended_at = Utc::now();
    let end_mark = Instant::now();
    // The reading at the end, beside the cleanup rather than before it (it must not delay
    // freeing the GPU), after the start reading (which may still be opening the backend).
    let end_reading = {
        let w = watch.clone();
        tokio::spawn(async move {
            let _ = start_reading.await;
            let _ = take_reading(&w).await;
        })
    };
    let background_failed = matches!(stop, Stop::BackgroundExited);
    let (main, timed_out, cancelled) = match stop {
        Stop::Exited(status) => (Main::Exited(status), false, false),
        Stop::BackgroundExited => (Main::Running, false, false),
        Stop::Timeout => {
            let t = launch.timeout.unwrap_or_default();
            note(&log, &format!("timeout after {t:?}: stopping the job"));
            (Main::Running, true, false)
        }
        Stop::Cancelled => {
            note(&log, "cancelled: stopping the job");
            (Main::Running, false, true)
        }
    };

    // The background is one of the attempt's processes: this stops it too, whatever the end.
    let mut outcome = cleanup(&mut child, pid, &launch, &backend, cfg, main, &watch).await;
    let cleanup_ms = u64::try_from(end_mark.elapsed().as_millis()).unwrap_or(u64::MAX);
    guard.armed = false;
    procscan::disown(pid);
    let background = background.as_mut().map(|bg| {
        outcome.leftovers.retain(|&p| p != bg.pid);
        let report = bg.finish();
        if !bg.exited_early {
            note(
                &log,
                &format!(
                    "background stopped with the foreground ({})",
                    bg.describe_exit()
                ),
            );
        }
        report
    });
    if let Some(g) = bg_guard.as_mut() {
        g.armed = false;
    }
    if !outcome.leftovers.is_empty() {
        note(
            &log,
            &format!(
                "stopped {} leftover process(es) of the attempt: {:?}",
                outcome.leftovers.len(),
                outcome.leftovers
            ),
        );
    }
    if !outcome.verified {
        note(
            &log,
            &format!(
                "cleanup NOT verified after {:?}: {}",
                cfg.verify_timeout, outcome.remaining
            ),
        );
    }

    let _ = end_reading.await;
    // Everything has stopped writing: scan the rest of the log and take its tail.
    let w = watch.clone();
    let path = launch.log_path.clone();
    let (saw_oom, (peak, peak_source), contaminated, measurements, log_tail) =
        tokio::task::spawn_blocking(move || {
            let mut w = lock(&w);
            w.log.pump(u64::MAX);
            let peak = w.peak.result();
            if peak.1 == PeakSource::DeviceDelta {
                // In the log, so that `show` (the log tail) says how the peak was taken.
                if let Ok(log) = open_log(&path) {
                    note(&log, &peak_note(peak.0));
                }
            }
            (
                w.log.scanner.saw_oom(),
                peak,
                w.contaminated,
                w.measurements(),
                read_tail(&path, log_start),
            )
        })
        .await
        .unwrap_or_else(|_| {
            (
                false,
                (None, PeakSource::Processes),
                false,
                Measurements::default(),
                String::new(),
            )
        });

    let exit = match outcome.status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExitKind::Code(code),
            (None, Some(sig)) => ExitKind::Signal(sig),
            (None, None) => ExitKind::Code(-1),
        },
        // The exit status was lost (the process could not be killed in time): not a success.
        None => ExitKind::Code(-1),
    };
    let failure = if background_failed {
        Some(FailureClass::BackgroundExited)
    } else {
        classify(exit, saw_oom, timed_out, cancelled)
    };
    AttemptEnd {
        failure,
        exit_code: outcome.status.and_then(|s| s.code()),
        signal: outcome.status.and_then(|s| s.signal()),
        started_at: Some(started_at),
        ended_at,
        pid: Some(pid),
        peak_mem_mib: peak,
        peak_source,
        cleanup_ms,
        cleanup_verified: outcome.verified,
        unverified: (!outcome.verified).then(|| outcome.remaining.clone()),
        held_by: outcome.held_by,
        contaminated,
        measurements,
        log_tail,
        background,
    }
}

enum Stop {
    /// `None` if waiting failed (the status was taken by someone else).
    Exited(Option<ExitStatus>),
    Timeout,
    Cancelled,
    /// The colocated background exited, with `on_background_exit: fail`.
    BackgroundExited,
}

/// Resolves when the colocated background (if any, still unreaped) exits.
async fn background_exit(bg: &mut Option<colocate::Running>) {
    match bg {
        Some(b) if b.exit.is_none() => {
            b.exited().await;
        }
        _ => std::future::pending().await,
    }
}

/// The end of an attempt whose foreground never started: its background is stopped with
/// the attempt's verified cleanup, as the main process of the attempt.
async fn stop_background_only(
    mut bg: colocate::Running,
    launch: &Launch,
    backend: &Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    watch: &Arc<Mutex<Watch>>,
    failure: FailureClass,
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
        failure: Some(failure),
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
        contaminated,
        // No foreground ran: no figures, only what contaminated the wait.
        measurements,
        log_tail: String::new(),
        background: Some(report),
    }
}

/// The main process, as cleanup knows it.
#[derive(Clone, Copy)]
enum Main {
    Running,
    /// With its status, `None` when waiting for it failed.
    Exited(Option<ExitStatus>),
}

impl Main {
    fn exited(self) -> bool {
        matches!(self, Main::Exited(_))
    }

    fn status(self) -> Option<ExitStatus> {
        match self {
            Main::Exited(status) => status,
            Main::Running => None,
        }
    }

    /// Reaps the main process if it has exited since the last look.
    fn poll(&mut self, child: &mut Child) {
        if let Main::Running = self {
            match child.try_wait() {
                Ok(Some(status)) => *self = Main::Exited(Some(status)),
                Ok(None) => {}
                Err(_) => *self = Main::Exited(None),
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn not_started(failure: Option<FailureClass>, log_tail: String) -> AttemptEnd {
    AttemptEnd {
        failure,
        exit_code: None,
        signal: None,
        started_at: None,
        ended_at: Utc::now(),
        pid: None,
        peak_mem_mib: None,
        peak_source: PeakSource::Processes,
        cleanup_ms: 0,
        cleanup_verified: true,
        unverified: None,
        held_by: vec![],
        contaminated: false,
        measurements: Measurements::default(),
        log_tail,
        background: None,
    }
}

fn open_log(path: &Path) -> io::Result<File> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    File::options().create(true).append(true).open(path)
}

/// Appends a line of the agent's own to the job's log, so that a user reading it sees why the
/// job stopped. Best effort: a full disk must not change the outcome.
fn note(log: &File, msg: &str) {
    let mut log = log;
    let _ = log.write_all(format!("[headroom] {msg}\n").as_bytes());
}

/// `HP_<NAME>`: parameter names are identifiers (the spec validates them); anything else is
/// made one so that the variable can be read from a shell.
fn param_var(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("HP_{name}")
}

/// The command for the attempt, or a message saying why it cannot be built.
fn command(launch: &Launch, backend: &dyn GpuBackend, log: &File) -> Result<Command, String> {
    if launch.argv.is_empty() {
        return Err("the job has an empty command".to_string());
    }
    build_command(launch, &launch.argv, &BTreeMap::new(), backend, log)
}

/// `argv` as one of the attempt's processes: its own session, the attempt's environment,
/// GPUs and marker, `extra` variables over the job's, output to `log`.
pub(crate) fn build_command(
    launch: &Launch,
    argv: &[String],
    extra: &BTreeMap<String, String>,
    backend: &dyn GpuBackend,
    log: &File,
) -> Result<Command, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty command".to_string());
    };
    // Forked from the attempt's supervisor process (small, one thread doing the work), not
    // from the agent.
    let mut cmd = Command::new(program);
    cmd.args(args);
    own_session_and_pdeathsig(&mut cmd);
    if let Some(dir) = &launch.workdir {
        // Spawning would report a missing directory as a missing program.
        if !dir.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                dir.display()
            ));
        }
        cmd.current_dir(dir);
    }
    // The agent's environment, then the job's, then what headroom owns.
    cmd.envs(&launch.env);
    cmd.envs(extra);
    let gpus: Vec<String> = launch.gpus.iter().map(u32::to_string).collect();
    cmd.env("CUDA_VISIBLE_DEVICES", gpus.join(","));
    cmd.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    cmd.env("HEADROOM_JOB_ID", launch.job.to_string());
    cmd.env(ATTEMPT_VAR, launch.attempt.to_string());
    for (name, value) in &launch.params {
        cmd.env(param_var(name), value_text(value));
    }
    cmd.envs(backend.job_env());

    let handle = || {
        log.try_clone()
            .map(Stdio::from)
            .map_err(|e| format!("cannot share the log file with the job: {e}"))
    };
    cmd.stdin(Stdio::null())
        .stdout(handle()?)
        .stderr(handle()?)
        .kill_on_drop(true);
    Ok(cmd)
}

/// Puts the child in a session and process group of its own (so the group can be signalled
/// without touching its supervisor) and has the kernel SIGKILL it if the supervisor process
/// (the thread that forked it: the runtime's only worker) dies.
#[allow(unsafe_code)]
fn own_session_and_pdeathsig(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // work is allowed. It makes two plain syscalls (setsid, prctl), allocates nothing (an
    // io::Error from an errno is not boxed), takes no lock and touches no parent state.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What is watched while the attempt runs: its peak GPU memory and its log.
pub(crate) struct Watch {
    backend: Arc<dyn GpuBackend>,
    attempt: AttemptId,
    peak: Peak,
    log: LogFollower,
    /// The attempt's GPUs, and what was on them before it started.
    gpus: Vec<u32>,
    baseline: Baseline,
    contaminated: bool,
    /// Telemetry of the attempt's GPUs over the run: energy, power, temperature, throttling.
    meter: Meter,
    /// The first process that contaminated the attempt.
    contamination: Option<Contamination>,
    /// Any process that is not the attempt's own on its GPUs contaminates it, another
    /// attempt's too.
    exclusive: bool,
    /// The attempt has a colocated background: its processes are the attempt's own but not
    /// the foreground's peak, and any other attempt's process on the GPU contaminates it.
    colocated: bool,
    /// Whether each of the attempt's pids is the background's (read once from its marker).
    roles: HashMap<u32, bool>,
    /// The background has held GPU memory.
    background_memory: bool,
}

/// A process of no attempt (or, beside a colocated pair, of another attempt) seen on the
/// attempt's GPUs, described when it was seen.
#[derive(Clone, Debug, PartialEq)]
struct Contamination {
    reason: String,
    pid: u32,
    command: Option<String>,
}

impl Contamination {
    /// Blocking: reads the process's owner and command line from `/proc` when the backend
    /// did not give them.
    fn of(gpu: u32, p: &GpuProcess) -> Self {
        let (user, command) = if p.user.is_some() || p.command.is_some() || p.outside_pid_namespace
        {
            (p.user.clone(), p.command.clone())
        } else {
            procscan::describe(p.pid)
        };
        let held = if p.used_mib_unknown {
            "memory the driver cannot size".to_string()
        } else {
            format!("{} MiB", p.used_mib)
        };
        let who = if p.outside_pid_namespace {
            "a process of another container".to_string()
        } else if let Some(other) = p.attempt {
            format!("a process of another attempt ({other})")
        } else {
            "a process of no attempt".to_string()
        };
        Self {
            reason: format!("{who} held {held} on GPU {gpu} during the run"),
            pid: p.pid,
            command: match (user, command) {
                (None, None) => None,
                (user, command) => Some(format!(
                    "{}: {}",
                    user.as_deref().unwrap_or("?"),
                    command.as_deref().unwrap_or("?")
                )),
            },
        }
    }
}

/// Reads the telemetry of the node's GPUs into the attempt's meter, off the runtime.
fn take_reading(watch: &Arc<Mutex<Watch>>) -> tokio::task::JoinHandle<()> {
    let w = watch.clone();
    tokio::task::spawn_blocking(move || {
        let backend = {
            let w = lock(&w);
            if !w.meter.wants_readings() {
                return;
            }
            w.backend.clone()
        };
        // Read outside the lock, so a slow reading (NVML opening) holds up no one.
        let reading = backend.telemetry().map_err(|e| e.to_string());
        let at = std::time::Instant::now();
        lock(&w)
            .meter
            .record(at, reading.as_deref().map_err(Clone::clone));
    })
}

/// The attempt's peak memory, measured two ways.
#[derive(Default)]
struct Peak {
    /// Sum of the attempt's processes' memory, when the driver gives it per process.
    processes: Option<u64>,
    /// Growth of its GPUs' used memory over the baseline, at ticks where one of its
    /// processes was seen without per-process memory.
    delta: Option<u64>,
    /// One of its processes was seen whose memory the driver cannot tell.
    unknown: bool,
}

impl Peak {
    /// The figure to report: the per-process peak, or, when any process's memory was
    /// unknown, the device delta (`None`, never 0, when that could not be read either).
    fn result(&self) -> (Option<u64>, PeakSource) {
        if self.unknown {
            // A process was on the GPU, so it held something: a growth of 0 means others
            // freed memory meanwhile and masked it, which is no measurement (and must not
            // teach an estimate of 0).
            (self.delta.filter(|&d| d > 0), PeakSource::DeviceDelta)
        } else {
            (self.processes, PeakSource::Processes)
        }
    }
}

/// `[headroom]` line saying that the peak is a device delta.
fn peak_note(peak: Option<u64>) -> String {
    match peak {
        Some(mib) => format!(
            "peak memory {mib} MiB measured as the GPUs' used-memory growth since the start \
             (the driver gives no per-process memory here; other processes' growth counts too)"
        ),
        None => "peak memory unknown: the driver gives no per-process memory and the GPUs' \
                 used memory could not be read"
            .to_string(),
    }
}

/// What was on the attempt's GPUs before it started: cleanup returns to this, not to
/// "empty", and peak deltas count from it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// Processes of no attempt.
    foreign: HashSet<u32>,
    /// Used memory of each GPU that read fine.
    #[serde(with = "pairs")]
    used: HashMap<u32, u64>,
}

/// A map with integer keys as a list of pairs: JSON object keys are strings, which serde
/// cannot read back as integers inside an internally tagged message.
mod pairs {
    use std::collections::HashMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(map: &HashMap<u32, u64>, s: S) -> Result<S::Ok, S::Error> {
        let mut v: Vec<(u32, u64)> = map.iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<u32, u64>, D::Error> {
        Ok(Vec::<(u32, u64)>::deserialize(d)?.into_iter().collect())
    }
}

impl Baseline {
    /// Blocking.
    fn read(backend: &dyn GpuBackend, gpus: &[u32]) -> Self {
        Self::of(&gpu::read(backend), gpus)
    }

    /// The baseline of `gpus` in a reading of the node's GPUs.
    pub fn of(samples: &[GpuSample], gpus: &[u32]) -> Self {
        let mut out = Baseline::default();
        for g in samples.iter().filter(|g| gpus.contains(&g.index)) {
            out.foreign.extend(
                g.processes
                    .iter()
                    .filter(|p| p.attempt.is_none())
                    .map(|p| p.pid),
            );
            if g.error.is_none() {
                out.used.insert(g.index, g.used_mib);
            }
        }
        out
    }
}

impl Watch {
    /// One sampling tick. Blocking.
    fn step(&mut self) {
        let samples = gpu::read(self.backend.as_ref());
        self.observe(&samples);
        if self.meter.wants_readings() {
            let reading = self.backend.telemetry().map_err(|e| e.to_string());
            self.meter.record(
                std::time::Instant::now(),
                reading.as_deref().map_err(Clone::clone),
            );
        }
        self.log.pump(PUMP_LIMIT);
    }

    /// The run's figures and what contaminated it.
    fn measurements(&self) -> Measurements {
        let c = self.contamination.clone();
        Measurements {
            contamination_reason: c.as_ref().map(|c| c.reason.clone()),
            contamination_pid: c.as_ref().map(|c| c.pid),
            contamination_command: c.and_then(|c| c.command),
            ..self.meter.result()
        }
    }

    /// One look for the colocated background's GPU memory (its readiness). Blocking.
    pub(crate) fn step_background_memory(&mut self) -> bool {
        let samples = gpu::read(self.backend.as_ref());
        self.observe(&samples);
        self.background_memory
    }

    /// Whether `pid` (one of the attempt's) is its colocated background's.
    fn is_background(&mut self, pid: u32) -> bool {
        *self
            .roles
            .entry(pid)
            .or_insert_with(|| procscan::env_var(pid, ROLE_VAR).as_deref() == Some(ROLE_BACKGROUND))
    }

    fn observe(&mut self, samples: &[GpuSample]) {
        let mut seen = false;
        let mut unknown = false;
        let mut sum = 0u64;
        for p in samples.iter().flat_map(|g| &g.processes) {
            if p.attempt == Some(self.attempt) {
                if self.colocated && self.is_background(p.pid) {
                    self.background_memory |= p.used_mib > 0 || p.used_mib_unknown;
                    continue;
                }
                seen = true;
                unknown |= p.used_mib_unknown;
                sum = sum.saturating_add(p.used_mib);
            }
        }
        if !self.contaminated
            && let Some((gpu, p)) = self.intruder(samples)
        {
            self.contaminated = true;
            self.contamination = Some(Contamination::of(gpu, p));
        }
        if seen && !unknown {
            self.peak.processes = Some(self.peak.processes.unwrap_or(0).max(sum));
        }
        if unknown {
            self.peak.unknown = true;
            if let Some(delta) = self.delta(samples) {
                self.peak.delta = Some(self.peak.delta.unwrap_or(0).max(delta));
            }
        }
    }

    /// Growth of the attempt's GPUs' used memory over the baseline; `None` when one of them
    /// cannot be read now or could not be then.
    fn delta(&self, samples: &[GpuSample]) -> Option<u64> {
        self.gpus.iter().try_fold(0u64, |acc, g| {
            let now = samples
                .iter()
                .find(|s| s.index == *g && s.error.is_none())?;
            let before = self.baseline.used.get(g)?;
            Some(acc.saturating_add(now.used_mib.saturating_sub(*before)))
        })
    }

    /// Processes of no attempt holding memory on this attempt's GPUs (memory the driver
    /// cannot tell counts as held).
    fn foreign_on_gpus<'a>(&self, samples: &'a [GpuSample]) -> Vec<&'a GpuProcess> {
        samples
            .iter()
            .filter(|g| self.gpus.contains(&g.index))
            .flat_map(|g| &g.processes)
            .filter(|p| holds_foreign(p))
            .collect()
    }

    /// The first process beyond the attempt on its GPUs, and its GPU: a process of no
    /// attempt; for an exclusive attempt any process not its own (another attempt's
    /// included); beside a colocated pair another attempt's process holding memory.
    fn intruder<'a>(&self, samples: &'a [GpuSample]) -> Option<(u32, &'a GpuProcess)> {
        samples
            .iter()
            .filter(|g| self.gpus.contains(&g.index))
            .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
            .find(|(_, p)| {
                if self.exclusive {
                    p.attempt != Some(self.attempt)
                } else {
                    // The background carries this attempt's marker: its processes are the
                    // attempt's own, never contamination; beside a colocated pair another
                    // attempt's process is.
                    holds_foreign(p) || (self.colocated && holds_other_attempt(p, self.attempt))
                }
            })
    }

    /// What keeps the GPUs from being clean: the attempt's own processes, and processes of
    /// no attempt that were not there before it (a leftover that shed its marker). `Err`
    /// when one of the attempt's GPUs cannot be read: unknown is never clean.
    fn leftovers(&self, samples: &[GpuSample]) -> Result<Vec<(u32, u64)>, String> {
        if let Some(error) = gpu::unreadable(samples, &self.gpus) {
            return Err(error);
        }
        let own = samples
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| p.attempt == Some(self.attempt));
        let new_foreign = self
            .foreign_on_gpus(samples)
            .into_iter()
            .filter(|p| !self.baseline.foreign.contains(&p.pid));
        Ok(own
            .chain(new_foreign)
            .map(|p| (p.pid, p.used_mib))
            .collect())
    }
}

/// A process of no attempt holding memory (memory the driver cannot tell counts as held).
fn holds_foreign(p: &GpuProcess) -> bool {
    p.attempt.is_none() && (p.used_mib > 0 || p.used_mib_unknown)
}

/// A process of another attempt than `attempt` holding memory: beyond the declared pair of a
/// colocated run.
fn holds_other_attempt(p: &GpuProcess, attempt: AttemptId) -> bool {
    p.attempt.is_some_and(|a| a != attempt) && (p.used_mib > 0 || p.used_mib_unknown)
}

/// `pid 4242 (alice: python train.py) holds 5632 MiB`, for quarantine reports.
fn describe_leftovers(left: &[(u32, u64)]) -> String {
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

/// Reads the log as it grows and feeds the OOM scanner; streaming, whatever the log's size.
struct LogFollower {
    file: Option<File>,
    scanner: OomScanner,
}

impl LogFollower {
    fn open(path: &Path, start: u64) -> Self {
        let file = File::open(path)
            .and_then(|mut f| f.seek(SeekFrom::Start(start)).map(|_| f))
            .map_err(|e| tracing::warn!(path = %path.display(), error = %e, "cannot read job log"))
            .ok();
        Self {
            file,
            scanner: OomScanner::new(),
        }
    }

    /// Scans up to `limit` new bytes. Blocking.
    fn pump(&mut self, limit: u64) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if self.scanner.saw_oom() {
            return;
        }
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0u64;
        while read < limit {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    read += n as u64;
                    if self.scanner.feed(&buf[..n]) {
                        break;
                    }
                }
            }
        }
    }
}

/// The last [`TAIL_BYTES`] of the log written since `start`, from a line start when possible.
fn read_tail(path: &Path, start: u64) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let from = start.max(len.saturating_sub(TAIL_BYTES));
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::with_capacity(usize::try_from(len - from).unwrap_or(0));
        f.take(TAIL_BYTES).read_to_end(&mut buf)?;
        if from > start {
            // Cut mid-line: drop the partial first line, unless that leaves too little.
            if let Some(nl) = buf.iter().position(|&b| b == b'\n')
                && nl < buf.len() / 2
            {
                buf.drain(..=nl);
            }
        }
        Ok(buf)
    };
    read()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Sends `sig` to a process group; a group that is gone (ESRCH) is what we want anyway.
fn signal_group(pgid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pgid)
        && raw > 1
    {
        let _ = killpg(Pid::from_raw(raw), sig);
    }
}

fn signal_each(pids: &[u32], sig: Signal) {
    let me = std::process::id();
    for &pid in pids {
        if let Ok(raw) = i32::try_from(pid)
            && raw > 1
            && pid != me
        {
            let _ = kill(Pid::from_raw(raw), sig);
        }
    }
}

/// The attempt's live processes: this process's descendants when it is their subreaper
/// (`own_tree`: orphans of the tree re-parent to it, so none can leave it), else those
/// carrying the attempt's marker.
async fn attempt_pids(attempt: AttemptId, own_tree: bool) -> Vec<u32> {
    if own_tree {
        tokio::task::spawn_blocking(procscan::descendants)
            .await
            .unwrap_or_default()
    } else {
        marked(attempt).await
    }
}

/// The last `/proc` scan and when it started.
type Scan = Option<(std::time::Instant, Arc<HashMap<AttemptId, Vec<u32>>>)>;

/// The attempt's live processes. Concurrent cleanups share scans: a caller takes the result
/// of a scan that started after it asked (so it misses nothing a fresh scan would see), and
/// many attempts ending together cost one pass over `/proc`, not one each.
async fn marked(attempt: AttemptId) -> Vec<u32> {
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

/// The pids of the attempt still on a GPU, or why its GPUs cannot be read.
async fn on_gpus(
    backend: &Arc<dyn GpuBackend>,
    watch: &Arc<Mutex<Watch>>,
) -> Result<Vec<(u32, u64)>, String> {
    let (backend, watch) = (backend.clone(), watch.clone());
    tokio::task::spawn_blocking(move || {
        let samples = gpu::read(backend.as_ref());
        let mut w = lock(&watch);
        w.observe(&samples);
        w.leftovers(&samples)
    })
    .await
    .unwrap_or_else(|e| Err(format!("GPU reading task failed: {e}")))
}

struct Cleanup {
    status: Option<ExitStatus>,
    verified: bool,
    /// Processes still alive after the main process had exited.
    leftovers: Vec<u32>,
    /// What was left when verification gave up.
    remaining: String,
    /// Pids still holding GPU memory when verification gave up.
    held_by: Vec<u32>,
}

/// SIGTERM, grace, SIGKILL, sweep the marker, reap, and verify on the GPUs. Polls throughout:
/// an attempt that leaves nothing behind is done in a few milliseconds.
async fn cleanup(
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
    let mut alive = attempt_pids(attempt, cfg.own_tree).await;
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
        if (main.exited() && alive.is_empty()) || Instant::now() >= grace_end {
            break;
        }
        tokio::time::sleep(POLL).await;
        alive = attempt_pids(attempt, cfg.own_tree).await;
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
            alive = attempt_pids(attempt, cfg.own_tree).await;
        }
        first = false;
        signal_each(&alive, Signal::SIGKILL);
        main.poll(child);
        if !alive.is_empty() || !leftovers.is_empty() {
            // Killed orphans re-parented to the agent: reap them now rather than at the next
            // heartbeat. (Zombies hold no memory and carry no live marker, so verification
            // does not wait for this.)
            let _ = tokio::task::spawn_blocking(procscan::reap_orphans).await;
        }
        // `None`: not looked at yet, processes of the attempt are still alive.
        let gpu = if alive.is_empty() && main.exited() {
            Some(on_gpus(backend, watch).await)
        } else {
            None
        };
        // Confirm with a second scan: a process caught mid-exec reads without environment.
        if matches!(&gpu, Some(Ok(left)) if left.is_empty())
            && attempt_pids(attempt, cfg.own_tree).await.is_empty()
        {
            return Cleanup {
                status: main.status(),
                verified: true,
                leftovers,
                remaining: String::new(),
                held_by: vec![],
            };
        }
        remaining = match (gpu, main.exited()) {
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
    }
}

/// Kills the attempt's processes if `run_attempt` is dropped before its cleanup ran.
struct KillOnDrop {
    pgid: u32,
    attempt: AttemptId,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            signal_group(self.pgid, Signal::SIGKILL);
            kill_marked(self.attempt);
            procscan::disown(self.pgid);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gpu::{FakeBackend, FakeGpuSpec};
    use headroom_shared::api::EnergySource;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tempfile::TempDir;

    /// Fake GPUs in a directory of their own (`gpus`), for the supervisor's tests and those
    /// of the modules it runs.
    pub(crate) struct Fixture {
        pub tmp: TempDir,
        pub backend: Arc<dyn GpuBackend>,
    }

    /// A [`Fixture`] of `spec` fake GPUs, e.g. `1x8GiB`.
    pub(crate) fn fake_gpus(spec: &str) -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let spec: FakeGpuSpec = spec.parse().expect("spec");
        let backend = FakeBackend::open(spec, &tmp.path().join("gpus")).expect("fake backend");
        Fixture {
            tmp,
            backend: Arc::new(backend),
        }
    }

    fn fixture() -> Fixture {
        fake_gpus("2x8GiB")
    }

    impl Fixture {
        fn launch(&self, argv: &[&str]) -> Launch {
            let attempt = AttemptId::new();
            Launch {
                attempt,
                job: JobId::new(),
                argv: argv.iter().map(|s| s.to_string()).collect(),
                env: BTreeMap::new(),
                params: BTreeMap::new(),
                gpus: vec![0],
                timeout: None,
                log_path: self.tmp.path().join(format!("logs/{attempt}.log")),
                workdir: None,
                baseline: None,
                prestart: Prestart::default(),
                background: None,
            }
        }

        fn sh(&self, script: &str) -> Launch {
            self.launch(&["sh", "-c", script])
        }

        async fn run(&self, launch: Launch) -> AttemptEnd {
            run_attempt(
                launch,
                self.backend.clone(),
                &quick(),
                CancellationToken::new(),
                |_| {},
            )
            .await
        }

        /// Nothing of the attempt is alive or on a fake GPU.
        fn assert_gone(&self, attempt: AttemptId) {
            assert!(
                procscan::pids_with_marker(attempt).is_empty(),
                "processes of the attempt survived"
            );
            let samples = self.backend.sample().expect("sample");
            assert!(
                samples
                    .iter()
                    .flat_map(|g| &g.processes)
                    .all(|p| p.attempt != Some(attempt)),
                "fake GPU memory of the attempt remains: {samples:?}"
            );
        }
    }

    /// Short grace and sampling, for tests.
    pub(crate) fn quick() -> SupervisorConfig {
        SupervisorConfig {
            kill_grace: Duration::from_millis(300),
            verify_timeout: Duration::from_secs(10),
            sample_every: Duration::from_millis(50),
            own_tree: false,
        }
    }

    fn log_of(launch: &Launch) -> String {
        std::fs::read_to_string(&launch.log_path).expect("log")
    }

    #[tokio::test]
    async fn a_job_succeeds_with_its_environment_and_log() {
        let f = fixture();
        let mut launch = f.sh(
            "echo hello; echo oops >&2; \
             echo \"gpus=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER job=$HEADROOM_JOB_ID\"; \
             echo \"attempt=$HEADROOM_ATTEMPT_ID bs=$HP_BATCH_SIZE model=$HP_MODEL lr=$HP_LR\"; \
             echo \"alloc=$PYTORCH_CUDA_ALLOC_CONF dir=${HEADROOM_FAKE_GPU_DIR:+set} gpus=$HEADROOM_FAKE_GPUS\"; \
             pwd; read x || echo stdin-empty",
        );
        launch.gpus = vec![1, 3];
        launch.env.insert(
            "PYTORCH_CUDA_ALLOC_CONF".into(),
            "expandable_segments:True".into(),
        );
        // The job cannot override what headroom owns.
        launch
            .env
            .insert("HEADROOM_ATTEMPT_ID".into(), "forged".into());
        launch
            .params
            .insert("batch_size".into(), serde_json::json!(32));
        launch
            .params
            .insert("model".into(), serde_json::json!("gpt2"));
        launch.params.insert("lr".into(), serde_json::json!(0.001));
        launch.workdir = Some(f.tmp.path().to_path_buf());
        let seen = Arc::new(AtomicU32::new(0));
        let seen2 = seen.clone();
        let end = run_attempt(
            launch.clone(),
            f.backend.clone(),
            &quick(),
            CancellationToken::new(),
            move |pid| seen2.store(pid, Ordering::SeqCst),
        )
        .await;

        assert_eq!(end.failure, None, "{end:?}");
        assert_eq!((end.exit_code, end.signal), (Some(0), None));
        assert_eq!(end.pid, Some(seen.load(Ordering::SeqCst)));
        assert!(end.started_at.is_some_and(|s| s <= end.ended_at));
        assert!(end.cleanup_verified);
        assert_eq!(end.peak_mem_mib, None);
        let log = log_of(&launch);
        for want in [
            "hello\n".to_string(),
            "oops\n".to_string(),
            format!("gpus=1,3 order=PCI_BUS_ID job={}", launch.job),
            format!("attempt={} bs=32 model=gpt2 lr=0.001", launch.attempt),
            "alloc=expandable_segments:True dir=set gpus=2x8GiB".to_string(),
            format!(
                "{}\n",
                f.tmp.path().canonicalize().expect("canon").display()
            ),
            "stdin-empty".to_string(),
        ] {
            assert!(log.contains(&want), "log lacks {want:?}:\n{log}");
        }
        assert_eq!(end.log_tail, log);
    }

    #[tokio::test]
    async fn exit_codes_and_signals_are_classified() {
        let f = fixture();
        let end = f.run(f.sh("exit 3")).await;
        assert_eq!(end.failure, Some(FailureClass::Nonzero));
        assert_eq!(end.exit_code, Some(3));

        let end = f.run(f.sh("kill -KILL $$")).await;
        assert_eq!(end.failure, Some(FailureClass::Signal));
        assert_eq!((end.exit_code, end.signal), (None, Some(9)));
    }

    #[tokio::test]
    async fn oom_text_in_the_log_makes_an_oom_failure() {
        let f = fixture();
        let launch = f.sh("echo step 1; \
             echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB' >&2; \
             exit 1");
        let end = f.run(launch).await;
        assert_eq!(end.failure, Some(FailureClass::Oom), "{end:?}");
        assert!(end.log_tail.contains("CUDA out of memory"));

        // The same text followed by success is a success.
        let end = f
            .run(f.sh("echo 'CUDA error: out of memory'; exit 0"))
            .await;
        assert_eq!(end.failure, None);
    }

    #[tokio::test]
    async fn a_missing_program_is_a_launch_error() {
        let f = fixture();
        let launch = f.launch(&["/nonexistent/train.py", "--epochs", "1"]);
        let called = Arc::new(AtomicU32::new(0));
        let called2 = called.clone();
        let end = run_attempt(
            launch.clone(),
            f.backend.clone(),
            &quick(),
            CancellationToken::new(),
            move |_| {
                called2.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
        assert_eq!(end.failure, Some(FailureClass::LaunchError));
        assert_eq!((end.pid, end.started_at), (None, None));
        assert_eq!(called.load(Ordering::SeqCst), 0);
        assert!(
            end.log_tail
                .contains("cannot start `/nonexistent/train.py`")
        );
        assert!(log_of(&launch).contains("No such file or directory"));

        let mut launch = f.launch(&["true"]);
        launch.workdir = Some(f.tmp.path().join("missing"));
        let end = f.run(launch).await;
        assert_eq!(end.failure, Some(FailureClass::LaunchError));
        assert!(
            end.log_tail.contains("working directory"),
            "{}",
            end.log_tail
        );

        let end = f.run(f.launch(&[])).await;
        assert_eq!(end.failure, Some(FailureClass::LaunchError));
    }

    #[tokio::test]
    async fn a_job_past_its_timeout_is_stopped() {
        let f = fixture();
        let mut launch = f.launch(&["sleep", "30"]);
        launch.timeout = Some(Duration::from_millis(200));
        let t0 = std::time::Instant::now();
        let end = f.run(launch.clone()).await;
        assert_eq!(end.failure, Some(FailureClass::Timeout));
        assert_eq!(end.signal, Some(15));
        assert!(end.cleanup_verified);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(log_of(&launch).contains("[headroom] timeout after"));
        f.assert_gone(launch.attempt);
    }

    #[tokio::test]
    async fn a_job_that_ignores_sigterm_is_killed_after_the_grace() {
        let f = fixture();
        let mut launch = f.sh("trap '' TERM; sleep 30");
        launch.timeout = Some(Duration::from_millis(100));
        let end = f.run(launch.clone()).await;
        assert_eq!(end.failure, Some(FailureClass::Timeout));
        assert_eq!(end.signal, Some(9));
        assert!(end.cleanup_verified);
        assert!(end.cleanup_ms >= 300, "{}", end.cleanup_ms);
        f.assert_gone(launch.attempt);
    }

    #[tokio::test]
    async fn cancel_stops_the_job() {
        let f = fixture();
        let launch = f.launch(&["sleep", "30"]);
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c.cancel();
        });
        let end = run_attempt(launch.clone(), f.backend.clone(), &quick(), cancel, |_| {}).await;
        assert_eq!(end.failure, Some(FailureClass::Cancelled));
        assert!(end.cleanup_verified);
        assert!(log_of(&launch).contains("[headroom] cancelled"));
        f.assert_gone(launch.attempt);

        // Cancelled before it started: nothing runs.
        let cancel = CancellationToken::new();
        cancel.cancel();
        let end = run_attempt(
            f.launch(&["true"]),
            f.backend.clone(),
            &quick(),
            cancel,
            |_| {},
        )
        .await;
        assert_eq!(end.failure, Some(FailureClass::Cancelled));
        assert_eq!(end.pid, None);
    }

    #[tokio::test]
    async fn peak_memory_sums_the_attempts_processes() {
        let f = fixture();
        let launch = f.sh("echo 512 > $HEADROOM_FAKE_GPU_DIR/$$; \
             sh -c 'echo 1:256 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.6' & \
             sleep 0.3; echo 0:2048 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3; wait");
        let end = f.run(launch.clone()).await;
        assert_eq!(end.failure, None, "{end:?}");
        assert_eq!(end.peak_mem_mib, Some(2048 + 256));
        f.assert_gone(launch.attempt);
    }

    #[tokio::test]
    async fn children_left_behind_by_a_successful_job_are_stopped() {
        let f = fixture();
        let launch = f.sh("sleep 300 & echo started");
        let end = f.run(launch.clone()).await;
        assert_eq!(end.failure, None);
        assert!(end.cleanup_verified);
        let log = log_of(&launch);
        assert!(
            log.contains("stopped 1 leftover process(es)"),
            "{end:?}\n{log}"
        );
        f.assert_gone(launch.attempt);
    }

    /// The case that cost the field 31 runs: an orphan in a session of its own, holding GPU
    /// memory and ignoring SIGTERM.
    #[tokio::test]
    async fn a_double_forked_orphan_holding_memory_is_killed_and_verified() {
        become_subreaper().expect("subreaper");
        let f = fixture();
        let launch = f.sh(
            "setsid -f sh -c 'trap \"\" TERM; echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300'; \
             until [ -n \"$(ls $HEADROOM_FAKE_GPU_DIR)\" ]; do sleep 0.02; done; \
             sleep 0.3; echo parent done",
        );
        let end = f.run(launch.clone()).await;
        assert_eq!(end.failure, None, "{end:?}");
        assert!(end.cleanup_verified, "{end:?}");
        assert_eq!(end.peak_mem_mib, Some(1024));
        // The orphan ignored SIGTERM, so it took the grace period and a SIGKILL.
        assert!(end.cleanup_ms >= 300, "{}", end.cleanup_ms);
        f.assert_gone(launch.attempt);
        let log = log_of(&launch);
        assert!(
            log.contains("parent done") && log.contains("leftover"),
            "{log}"
        );
    }

    /// The attempt's own supervisor process is the subreaper of its tree: a double-forked
    /// orphan and a child that dropped the marker from its environment are found by the
    /// walk over its descendants, and killed.
    #[tokio::test]
    async fn a_subreaper_finds_its_whole_tree_without_markers() {
        become_subreaper().expect("subreaper");
        let f = fixture();
        let launch = f.sh("setsid -f sh -c 'trap \"\" TERM; exec sleep 300'; \
             env -u HEADROOM_ATTEMPT_ID sleep 300 & \
             sleep 0.3; echo parent done");
        let cfg = SupervisorConfig {
            own_tree: true,
            ..quick()
        };
        let end = run_with(&f, launch.clone(), &cfg).await;
        assert_eq!(end.failure, None, "{end:?}");
        assert!(end.cleanup_verified, "{end:?}");
        assert!(
            log_of(&launch).contains("stopped 2 leftover process(es)"),
            "{}",
            log_of(&launch)
        );
        assert!(procscan::descendants().is_empty(), "the tree is gone");
        f.assert_gone(launch.attempt);
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_job() {
        let f = fixture();
        let launch = f.sh("sleep 300 & sleep 300");
        let attempt = launch.attempt;
        let backend = f.backend.clone();
        let task = tokio::spawn(async move {
            run_attempt(launch, backend, &quick(), CancellationToken::new(), |_| {}).await
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while procscan::pids_with_marker(attempt).len() < 2 && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
        let _ = task.await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !procscan::pids_with_marker(attempt).is_empty()
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        f.assert_gone(attempt);
    }

    /// A fake GPU's fault control file, as a test injects it.
    fn inject(f: &Fixture, gpu: u32, fault: crate::gpu::fake::Fault, text: &str) {
        let dir = f.tmp.path().join("gpus");
        std::fs::write(crate::gpu::fake::fault_file(&dir, gpu, fault), text).expect("fault");
    }

    /// Verification gives up quickly: these tests end unverified on purpose.
    fn impatient() -> SupervisorConfig {
        SupervisorConfig {
            verify_timeout: Duration::from_millis(300),
            ..quick()
        }
    }

    async fn run_with(f: &Fixture, launch: Launch, cfg: &SupervisorConfig) -> AttemptEnd {
        run_attempt(
            launch,
            f.backend.clone(),
            cfg,
            CancellationToken::new(),
            |_| {},
        )
        .await
    }

    #[tokio::test]
    async fn a_failed_process_list_is_not_verified_clean() {
        use crate::gpu::fake::Fault;
        let f = fixture();
        inject(&f, 0, Fault::Processes, "GPU is lost");
        let launch = f.sh("echo 0:512 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.2");
        let end = run_with(&f, launch.clone(), &impatient()).await;
        assert!(!end.cleanup_verified, "unknown read as clean: {end:?}");
        let reason = end.unverified.as_deref().unwrap_or_default();
        assert!(
            reason.contains("GPU 0 could not be read") && reason.contains("GPU is lost"),
            "{reason}"
        );
        assert!(log_of(&launch).contains("GPU is lost"));
        // Its processes were never seen: nothing is learnt, not 0.
        assert_eq!(end.peak_mem_mib, None);
    }

    #[tokio::test]
    async fn a_failed_memory_query_is_unknown_for_that_gpu_only() {
        use crate::gpu::fake::Fault;
        let f = fixture();
        inject(&f, 1, Fault::Memory, "");
        let samples = gpu::read(f.backend.as_ref());
        assert_eq!(samples.len(), 2, "one failing GPU must not empty the node");
        assert_eq!(samples[0].error, None);
        assert_eq!(samples[0].free_mib, 8192);
        assert!(
            samples[1]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("memory info"))
        );
        assert_eq!(samples[1].free_mib, 0, "unknown memory is not free");

        // An attempt on GPU 0 is verified as usual; one on GPU 1 is not.
        let end = run_with(
            &f,
            f.sh("echo 0:256 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.2"),
            &impatient(),
        )
        .await;
        assert!(end.cleanup_verified, "{end:?}");
        assert_eq!(end.peak_mem_mib, Some(256));
        let mut on_1 = f.sh("sleep 0.1");
        on_1.gpus = vec![1];
        let end = run_with(&f, on_1, &impatient()).await;
        assert!(!end.cleanup_verified, "{end:?}");
        assert!(
            end.unverified
                .as_deref()
                .is_some_and(|r| r.contains("GPU 1 could not be read")),
            "{end:?}"
        );
    }

    #[test]
    fn a_device_delta_masked_by_others_freeing_memory_is_unknown_not_zero() {
        let masked = Peak {
            processes: None,
            delta: Some(0),
            unknown: true,
        };
        assert_eq!(masked.result(), (None, PeakSource::DeviceDelta));
        let grown = Peak {
            processes: None,
            delta: Some(512),
            unknown: true,
        };
        assert_eq!(grown.result(), (Some(512), PeakSource::DeviceDelta));
    }

    /// Another attempt's process on the GPU is a neighbour to an ordinary attempt, and
    /// contamination to an exclusive one.
    #[tokio::test]
    async fn an_exclusive_attempt_is_contaminated_by_any_process_not_its_own() {
        let f = fixture();
        let script = format!(
            "{ATTEMPT_VAR}={} sh -c 'echo 256 > \"$HEADROOM_FAKE_GPU_DIR/$$\"; sleep 0.6' & \
             sleep 0.4; wait",
            AttemptId::new()
        );
        let shared = f.run(f.sh(&script)).await;
        assert_eq!(shared.failure, None, "{shared:?}");
        assert!(!shared.contaminated, "{shared:?}");
        let mut exclusive = f.sh(&script);
        exclusive.prestart.exclusive = true;
        let alone = f.run(exclusive).await;
        assert_eq!(alone.failure, None, "{alone:?}");
        assert!(alone.contaminated, "{alone:?}");
    }

    #[tokio::test]
    async fn unavailable_process_memory_learns_the_device_delta_not_zero() {
        use crate::gpu::fake::Fault;
        let f = fixture();
        inject(&f, 0, Fault::NoProcessMemory, "");
        // Someone else's 1000 MiB, there before the attempt: not part of its delta.
        let mut other = procscan::tests::spawn(std::process::Command::new("sleep").arg("30"));
        let dir = f.tmp.path().join("gpus");
        crate::gpu::fake::write_usage(&dir, other.id(), &[(0, 1000)]).expect("usage");
        let launch = f.sh("echo 0:2048 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.5");
        let end = run_with(&f, launch.clone(), &quick()).await;
        let _ = other.kill();
        let _ = other.wait();
        procscan::disown(other.id());
        assert_eq!(end.failure, None, "{end:?}");
        assert!(end.cleanup_verified, "{end:?}");
        assert_eq!(end.peak_mem_mib, Some(2048), "{end:?}");
        assert_eq!(end.peak_source, PeakSource::DeviceDelta);
        assert!(
            end.log_tail.contains("used-memory growth"),
            "{}",
            end.log_tail
        );
        // The other process's memory is unknown too: it still counts as contamination.
        assert!(end.contaminated);
    }

    #[tokio::test]
    async fn pids_that_cannot_be_attributed_are_not_verified_clean() {
        use crate::gpu::fake::{Fault, PID_NAMESPACE_FILE};
        let f = fixture();
        // The driver lists a pid this namespace has no process for.
        inject(&f, 0, Fault::DriverPids, "99999999:512\n");
        let end = run_with(&f, f.sh("sleep 0.1"), &impatient()).await;
        assert!(!end.cleanup_verified, "{end:?}");
        assert!(
            end.unverified
                .as_deref()
                .is_some_and(|r| r.contains("pid 99999999")),
            "{end:?}"
        );

        // Someone else's process holds memory on GPU 0 throughout. Seen from the host's pid
        // namespace it is told apart from the job, and the cleanup is verified.
        let dir = f.tmp.path().join("gpus");
        std::fs::remove_file(crate::gpu::fake::fault_file(&dir, 0, Fault::DriverPids)).expect("rm");
        let mut other = procscan::tests::spawn(std::process::Command::new("sleep").arg("30"));
        crate::gpu::fake::write_usage(&dir, other.id(), &[(0, 1000)]).expect("usage");
        let job = "echo 0:512 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3";
        let end = run_with(&f, f.sh(job), &impatient()).await;
        assert!(end.cleanup_verified, "{end:?}");
        assert_eq!(end.peak_mem_mib, Some(512));

        // An agent in a pid namespace of its own cannot tell its job from that process:
        // nothing is verified (nor killed), and it says what it needs.
        std::fs::write(dir.join(PID_NAMESPACE_FILE), "isolated").expect("isolated");
        let launch = f.sh(job);
        let end = run_with(&f, launch.clone(), &impatient()).await;
        let _ = other.kill();
        let _ = other.wait();
        procscan::disown(other.id());
        assert!(!end.cleanup_verified, "{end:?}");
        assert!(
            end.unverified
                .as_deref()
                .is_some_and(|r| r.contains("hostPID: true")),
            "{end:?}"
        );
        // Its memory was never attributed to it: nothing learnt.
        assert_eq!(end.peak_mem_mib, None);
        f.assert_gone(launch.attempt);
    }

    /// A job that declares `mib` on GPU 0 at `util` % and then runs `secs`; the fake GPU's
    /// power while it runs, from the model's formula (8 GiB GPUs).
    fn loaded(f: &Fixture, mib: u64, util: u32, secs: f64) -> (Launch, f64) {
        let launch = f.sh(&format!(
            "echo 0:{mib}:{util} > $HEADROOM_FAKE_GPU_DIR/$$; sleep {secs}"
        ));
        let model = crate::gpu::fakepower::PowerModel::default();
        (
            launch,
            model.power_w(mib as f64 / 8192.0, f64::from(util) / 100.0),
        )
    }

    fn within(got: Option<f64>, want: f64, share: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= want * share)
    }

    #[tokio::test]
    async fn energy_of_an_attempt_is_the_counter_delta_over_its_run() {
        let f = fixture();
        let (launch, power) = loaded(&f, 4096, 80, 3.0);
        // 60 W idle + 240 W x (25 % x memory share + 75 % x utilization).
        assert_eq!(power, 60.0 + 240.0 * (0.25 * 0.5 + 0.75 * 0.8));
        let cfg = SupervisorConfig {
            sample_every: Duration::from_millis(10),
            ..quick()
        };
        let end = run_with(&f, launch, &cfg).await;
        assert_eq!(end.failure, None, "{end:?}");
        let m = &end.measurements;
        assert_eq!(m.energy_source, Some(EnergySource::Counter), "{m:?}");
        assert!(
            within(m.energy_j, power * 3.0, 0.01),
            "{m:?}: want {}",
            power * 3.0
        );
        assert!(within(m.mean_power_w, power, 0.02), "{m:?}");
        assert!(within(m.max_power_w, power, 1e-9), "{m:?}");
        assert!(within(m.mean_util_pct, 80.0, 0.03), "{m:?}");
        // The idle GPU sat at 39 °C; three seconds at 234 W warm it towards 30 + 0.15 x 234
        // °C with a time constant of 20 s.
        assert_eq!(m.start_temp_c, Some(39.0), "{m:?}");
        let steady = 30.0 + 0.15 * power;
        let warmed = steady - (steady - 39.0) * (-3.0f64 / 20.0).exp();
        assert!(within(m.max_temp_c, warmed, 0.01), "{m:?}: want {warmed}");
        assert_eq!(
            (m.throttled_thermal, m.throttled_power),
            (Some(false), Some(false))
        );
        assert_eq!(m.contamination_reason, None);
    }

    #[tokio::test]
    async fn without_the_energy_counter_power_is_integrated() {
        use crate::gpu::fake::Fault;
        let f = fixture();
        inject(&f, 0, Fault::NoEnergy, "");
        let (launch, power) = loaded(&f, 8192, 50, 2.0);
        let end = f.run(launch).await;
        let m = &end.measurements;
        assert_eq!(m.energy_source, Some(EnergySource::Integrated), "{m:?}");
        // The trapezoid between readings (50 ms apart) blurs the load's two edges: 5 %.
        assert!(
            within(m.energy_j, power * 2.0, 0.05),
            "{m:?}: want {}",
            power * 2.0
        );
    }

    #[tokio::test]
    async fn readings_that_fail_leave_energy_unknown_not_zero() {
        use crate::gpu::fake::Fault;
        let f = fixture();
        inject(&f, 0, Fault::Telemetry, "GPU is lost");
        let end = f.run(loaded(&f, 1024, 50, 0.3).0).await;
        assert_eq!(end.failure, None, "{end:?}");
        let m = &end.measurements;
        assert_eq!((m.energy_j, m.energy_source), (None, None), "{m:?}");
        assert_eq!(
            (m.mean_power_w, m.max_temp_c, m.start_temp_c),
            (None, None, None)
        );
        assert_eq!(
            (m.throttled_thermal, m.throttled_power),
            (None, None),
            "{m:?}"
        );

        // No power reading at all (a GPU older than Volta): nothing to integrate either.
        let f = fixture();
        inject(&f, 0, Fault::NoPower, "");
        let end = f.run(loaded(&f, 1024, 50, 0.3).0).await;
        let m = &end.measurements;
        assert_eq!((m.energy_j, m.mean_power_w), (None, None), "{m:?}");
        assert!(m.max_temp_c.is_some(), "temperature still reads: {m:?}");

        // An attempt on GPU 1 is measured whatever GPU 0 does.
        let mut on_1 = f.sh("echo 1:1024:50 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3");
        on_1.gpus = vec![1];
        let end = f.run(on_1).await;
        assert_eq!(end.measurements.energy_source, Some(EnergySource::Counter));
    }

    #[tokio::test]
    async fn a_throttle_reason_seen_during_the_run_sets_its_flag() {
        let f = fixture();
        // The GPU reports a thermal slowdown for a while in the middle of the run.
        let launch = f.sh("echo 0:1024:90 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3; \
             echo sw_thermal_slowdown > $HEADROOM_FAKE_GPU_DIR/gpu0.throttle; sleep 0.4; \
             rm $HEADROOM_FAKE_GPU_DIR/gpu0.throttle; sleep 0.3");
        let end = f.run(launch).await;
        let m = &end.measurements;
        assert_eq!(m.throttled_thermal, Some(true), "{m:?}");
        assert_eq!(m.throttled_power, Some(false), "{m:?}");
        assert_eq!(
            m.throttle_reasons,
            Some(vec!["sw_thermal_slowdown".to_string()])
        );
        // Energy is still measured: the flag is what leaves the run out of comparisons.
        assert_eq!(m.energy_source, Some(EnergySource::Counter));
    }

    #[tokio::test]
    async fn a_foreign_process_is_named_with_its_pid_and_command() {
        let f = fixture();
        let dir = f.tmp.path().join("gpus");
        let launch = f.sh("echo 0:512 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.6");
        let backend = f.backend.clone();
        let task = tokio::spawn({
            let launch = launch.clone();
            // It outlives the job: verification gives up on it quickly.
            async move {
                run_attempt(
                    launch,
                    backend,
                    &impatient(),
                    CancellationToken::new(),
                    |_| {},
                )
                .await
            }
        });
        // Someone's process appears on GPU 0 while the job runs.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut other = procscan::tests::spawn(std::process::Command::new("sleep").arg("31.5"));
        crate::gpu::fake::write_usage(&dir, other.id(), &[(0, 700)]).expect("usage");
        let end = task.await.expect("attempt");
        let _ = other.kill();
        let _ = other.wait();
        procscan::disown(other.id());
        assert!(end.contaminated, "{end:?}");
        let m = &end.measurements;
        assert_eq!(m.contamination_pid, Some(other.id()), "{m:?}");
        assert!(
            m.contamination_command
                .as_deref()
                .is_some_and(|c| c.ends_with(": sleep 31.5")),
            "{m:?}"
        );
        assert_eq!(
            m.contamination_reason.as_deref(),
            Some("a process of no attempt held 700 MiB on GPU 0 during the run")
        );
    }

    #[test]
    fn param_names_become_variables() {
        assert_eq!(param_var("batch_size"), "HP_BATCH_SIZE");
        assert_eq!(param_var("lr"), "HP_LR");
        assert_eq!(param_var("odd-name.x"), "HP_ODD_NAME_X");
    }

    #[test]
    fn the_log_tail_starts_at_a_line_and_at_the_attempt() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("log");
        let mut text = String::from("earlier attempt\n");
        let start = text.len() as u64;
        for i in 0..1000 {
            text.push_str(&format!("line {i}\n"));
        }
        std::fs::write(&path, &text).expect("write");
        let tail = read_tail(&path, start);
        assert!(tail.len() <= TAIL_BYTES as usize);
        assert!(
            tail.starts_with("line ") && tail.ends_with("line 999\n"),
            "{tail}"
        );
        std::fs::write(&path, "earlier\nnow\n").expect("write");
        assert_eq!(read_tail(&path, 8), "now\n");
        assert_eq!(read_tail(&tmp.path().join("missing"), 0), "");
    }
}
