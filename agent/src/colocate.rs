//! An attempt's colocated background (`colocate`): started first on the attempt's GPU, in the
//! attempt's process tree and carrying its marker (so the attempt's verified cleanup stops
//! it and it is never counted as foreign), awaited until ready on the sampling cadence, and
//! recorded. Its output goes to a log of its own beside the attempt's.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use headroom_shared::api::BackgroundReport;
use headroom_shared::colocate::Background;
use tokio::process::Child;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuBackend;
use crate::procscan;
use crate::supervisor::{Launch, Watch, build_command, lock};

/// Set to `background` in the background's environment: tells its processes from the
/// foreground's (its memory is not the foreground's peak).
pub const ROLE_VAR: &str = "HEADROOM_ROLE";
pub const ROLE_BACKGROUND: &str = "background";
/// Longest readiness pattern line kept while waiting for its end.
const MAX_LINE: usize = 64 * 1024;

/// The background's log: beside the attempt's, `<attempt>.background.log`.
pub fn log_path(attempt_log: &Path) -> PathBuf {
    let stem = attempt_log
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    attempt_log.with_file_name(format!("{stem}.background.log"))
}

/// A running background.
pub(crate) struct Running {
    pub child: Child,
    pub pid: u32,
    pub log_path: PathBuf,
    started: Instant,
    ready: Readiness,
    /// From its start until it was ready.
    pub ready_ms: Option<u64>,
    /// Its exit status once reaped (`Some(None)`: waiting for it failed).
    pub exit: Option<Option<ExitStatus>>,
    /// It exited by itself while it should have run.
    pub exited_early: bool,
}

enum Readiness {
    /// Its first GPU memory seen by the backend.
    GpuMemory,
    /// A line of its log matches.
    Log {
        re: regex::Regex,
        file: Option<File>,
        line: Vec<u8>,
    },
}

/// How the wait for readiness ended.
pub(crate) enum Wait {
    Ready,
    Exited,
    TimedOut(Duration),
    Cancelled,
}

impl Running {
    /// Starts the background with the attempt's environment, GPUs and marker. Blocking-free.
    pub fn spawn(
        launch: &Launch,
        bg: &Background,
        backend: &dyn GpuBackend,
    ) -> Result<Self, String> {
        if bg.argv.is_empty() {
            return Err("the background has an empty command".to_string());
        }
        let ready = match &bg.ready_log {
            None => Readiness::GpuMemory,
            Some(pattern) => Readiness::Log {
                re: regex::RegexBuilder::new(pattern)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("colocate.ready.log is not a valid regex: {e}"))?,
                file: None,
                line: Vec::new(),
            },
        };
        let log_path = log_path(&launch.log_path);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| {
                format!(
                    "cannot open the background's log {}: {e}",
                    log_path.display()
                )
            })?;
        let start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut env = bg.env.clone();
        env.insert(ROLE_VAR.to_string(), ROLE_BACKGROUND.to_string());
        let mut cmd = build_command(launch, &bg.argv, &env, backend, &log)?;
        let spawned = procscan::spawn_owned(|| cmd.spawn(), Child::id);
        drop(cmd);
        let child =
            spawned.map_err(|e| format!("cannot start the background `{}`: {e}", bg.argv[0]))?;
        let Some(pid) = child.id().filter(|&p| p > 0) else {
            return Err("the background vanished at spawn".to_string());
        };
        let ready = match ready {
            Readiness::Log { re, line, .. } => Readiness::Log {
                re,
                line,
                file: File::open(&log_path)
                    .and_then(|mut f| f.seek(SeekFrom::Start(start)).map(|_| f))
                    .ok(),
            },
            other => other,
        };
        Ok(Self {
            child,
            pid,
            log_path,
            started: Instant::now(),
            ready,
            ready_ms: None,
            exit: None,
            exited_early: false,
        })
    }

    /// Waits until the background is ready, exits, `timeout` passes or `cancel` fires.
    /// Looks on the supervisor's sampling cadence (soon at first, then every `sample_every`).
    pub async fn wait_ready(
        &mut self,
        watch: &Arc<Mutex<Watch>>,
        timeout: Duration,
        sample_every: Duration,
        cancel: &CancellationToken,
    ) -> Wait {
        let deadline = self.started + timeout;
        let mut gap = Duration::from_millis(50).min(sample_every);
        let mut next = Instant::now();
        loop {
            tokio::select! {
                biased;
                status = self.child.wait() => {
                    self.exit = Some(status.ok());
                    self.exited_early = true;
                    return Wait::Exited;
                }
                _ = cancel.cancelled() => return Wait::Cancelled,
                _ = tokio::time::sleep_until(deadline) => return Wait::TimedOut(timeout),
                _ = tokio::time::sleep_until(next) => {
                    if self.ready_now(watch).await {
                        self.ready_ms = Some(
                            u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        );
                        return Wait::Ready;
                    }
                    gap = (gap * 2).min(sample_every);
                    next = Instant::now() + gap;
                }
            }
        }
    }

    /// One look: its log for the pattern, or the GPUs for its memory.
    async fn ready_now(&mut self, watch: &Arc<Mutex<Watch>>) -> bool {
        match &mut self.ready {
            Readiness::Log { re, file, line } => {
                let Some(f) = file.as_mut() else {
                    return false;
                };
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match f.read(&mut buf) {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => {
                            for &b in &buf[..n] {
                                if b == b'\n' {
                                    if re.is_match(&String::from_utf8_lossy(line)) {
                                        return true;
                                    }
                                    line.clear();
                                } else if line.len() < MAX_LINE {
                                    line.push(b);
                                }
                            }
                        }
                    }
                }
            }
            Readiness::GpuMemory => {
                let w = watch.clone();
                tokio::task::spawn_blocking(move || lock(&w).step_background_memory())
                    .await
                    .unwrap_or(false)
            }
        }
    }

    /// Reaps it if it has exited; for the watch loop while the foreground runs.
    pub async fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.wait().await.ok();
        self.exit = Some(status);
        status
    }

    /// After the attempt's cleanup (which stopped it): its status, and its record.
    pub fn finish(&mut self) -> BackgroundReport {
        if self.exit.is_none() {
            match self.child.try_wait() {
                Ok(Some(status)) => self.exit = Some(Some(status)),
                Ok(None) => {
                    // Cleanup gave up on it; kill_on_drop and the quarantine take over.
                    let _ = self.child.start_kill();
                }
                Err(_) => self.exit = Some(None),
            }
        }
        procscan::disown(self.pid);
        let status = self.exit.flatten();
        use std::os::unix::process::ExitStatusExt;
        BackgroundReport {
            pid: Some(self.pid),
            ready_ms: self.ready_ms,
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            exited_early: self.exited_early,
        }
    }

    /// `exit 3` / `signal 9` / `unknown status`, for the attempt's log.
    pub fn describe_exit(&self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.exit.flatten() {
            Some(s) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(sig)) => format!("signal {sig}"),
                _ => "unknown status".to_string(),
            },
            None => "unknown status".to_string(),
        }
    }
}
