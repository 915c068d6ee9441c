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

use crate::supervisor::process::Child;
use headroom_shared::api::BackgroundReport;
use headroom_shared::colocate::Background;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuBackend;
use crate::procscan;
use crate::supervisor::attempt::command::{build_command, spawn};
use crate::supervisor::attempt::launch::Launch;
use crate::supervisor::attempt::launch::NotStarted;
use crate::supervisor::attempt::watch::{Watch, lock};

pub use crate::procscan::{ROLE_BACKGROUND, ROLE_VAR};
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
    ) -> Result<Self, NotStarted> {
        if bg.argv.is_empty() {
            return Err("the background has an empty command".to_string().into());
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
        let spec = build_command(launch, &bg.argv, &env, backend, &log)?;
        let child = spawn(spec, launch, &format!("the background `{}`", bg.argv[0]))?;
        let Some(pid) = Some(child.id()).filter(|&p| p > 0) else {
            return Err("the background vanished at spawn".to_string().into());
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use headroom_shared::colocate::OnBackgroundExit;
    use headroom_shared::{AttemptId, FailureClass};

    use super::*;
    use crate::supervisor::attempt::tests::{fake_gpus, quick};
    use crate::supervisor::attempt::{AttemptEnd, run_attempt};

    /// One fake GPU; the methods below build and run colocated launches on it.
    struct Fixture(crate::supervisor::attempt::tests::Fixture);

    impl std::ops::Deref for Fixture {
        type Target = crate::supervisor::attempt::tests::Fixture;
        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }

    fn fixture() -> Fixture {
        Fixture(fake_gpus("1x8GiB"))
    }

    fn background(script: &str) -> Background {
        Background {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: BTreeMap::from([("BG_ONLY".to_string(), "yes".to_string())]),
            memory_mib: 1024,
            ready_log: None,
            start_timeout_ms: 10_000,
            on_exit: OnBackgroundExit::Fail,
        }
    }

    impl Fixture {
        fn launch(&self, fg: &str, bg: Background) -> Launch {
            Launch {
                background: Some(bg),
                ..self.0.launch(&["sh", "-c", fg])
            }
        }

        async fn run(&self, launch: Launch, cancel: CancellationToken) -> AttemptEnd {
            run_attempt(launch, self.backend.clone(), &quick(), cancel, |_| {}).await
        }

        fn path(&self, name: &str) -> String {
            self.tmp.path().join(name).display().to_string()
        }

        /// The background's process is gone, and nothing of the attempt is alive or on a GPU.
        fn assert_gone(&self, end: &AttemptEnd, attempt: AttemptId) {
            let bg = end.background.as_ref().expect("a background record");
            let pid = bg.pid.expect("the background ran");
            assert!(
                !procscan::is_alive(pid),
                "the background {pid} outlived the attempt"
            );
            assert!(end.cleanup_verified, "{end:?}");
            assert!(procscan::pids_with_marker(attempt).is_empty());
            let samples = self.backend.sample().expect("sample");
            assert!(
                samples
                    .iter()
                    .flat_map(|g| &g.processes)
                    .all(|p| p.attempt != Some(attempt)),
                "GPU memory of the attempt remains: {samples:?}"
            );
        }
    }

    fn millis(path: &str) -> u128 {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn log_of(launch: &Launch) -> String {
        std::fs::read_to_string(&launch.log_path).expect("log")
    }

    #[tokio::test]
    async fn the_foreground_starts_only_once_the_background_holds_memory() {
        let f = fixture();
        let (bg_at, fg_at) = (f.path("bg_mem_ms"), f.path("fg_start_ms"));
        // The background warms up for a second before it takes its GPU memory.
        let bg = background(&format!(
            "sleep 1; date +%s%3N > {bg_at}; echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; \
             echo bg=$BG_ONLY gpus=$CUDA_VISIBLE_DEVICES; exec sleep 300"
        ));
        let fg = format!(
            "date +%s%3N > {fg_at}; echo fg=${{BG_ONLY:-unset}}; \
             echo 0:512 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3"
        );
        let launch = f.launch(&fg, bg);
        let spawned = std::time::SystemTime::now();
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(end.failure(), None, "{end:?}");
        let (bg_mem, fg_start) = (millis(&bg_at), millis(&fg_at));
        assert!(
            fg_start >= bg_mem,
            "the foreground started at {fg_start}, before the background's memory at {bg_mem}"
        );
        let started = end.started_at.expect("started").timestamp_millis() as u128;
        assert!(started >= bg_mem, "{started} < {bg_mem}");
        let waited = end
            .background
            .as_ref()
            .and_then(|b| b.ready_ms)
            .expect("ready");
        assert!(waited >= 1000, "ready after {waited} ms");
        assert!(
            spawned.elapsed().expect("clock").as_millis() >= 1000 + 300,
            "no fixed wait, but not less than the warm-up either"
        );
        // The background is the attempt's own: not foreign, not the foreground's peak.
        assert!(!end.contaminated);
        assert_eq!(end.peak_mem_mib, Some(512));
        let bg_log = std::fs::read_to_string(log_path(&launch.log_path)).expect("bg log");
        assert!(bg_log.contains("bg=yes gpus=0"), "{bg_log}");
        let log = log_of(&launch);
        assert!(log.contains("fg=unset"), "{log}");
        assert!(log.contains("[headroom] background ready after"), "{log}");
        f.assert_gone(&end, launch.attempt);
        assert!(!end.background.as_ref().expect("bg").exited_early);
    }

    #[tokio::test]
    async fn the_background_never_outlives_its_foreground() {
        let f = fixture();
        let bg = || background("echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300");
        // Success, failure, timeout.
        for (fg, timeout, want) in [
            ("sleep 0.2", None, None),
            ("sleep 0.2; exit 3", None, Some(FailureClass::Nonzero)),
            ("sleep 30", Some(200), Some(FailureClass::Timeout)),
        ] {
            let mut launch = f.launch(fg, bg());
            launch.timeout = timeout.map(Duration::from_millis);
            let end = f.run(launch.clone(), CancellationToken::new()).await;
            assert_eq!(end.failure(), want, "{fg}: {end:?}");
            f.assert_gone(&end, launch.attempt);
            let b = end.background.as_ref().expect("bg");
            assert_eq!(b.signal, Some(15), "stopped by SIGTERM: {b:?}");
            assert!(!b.exited_early);
            assert!(log_of(&launch).contains("background stopped with the foreground"));
        }
        // Cancelled.
        let launch = f.launch("sleep 30", bg());
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            c.cancel();
        });
        let end = f.run(launch.clone(), cancel).await;
        assert_eq!(end.failure(), Some(FailureClass::Cancelled), "{end:?}");
        assert!(
            end.started_at.is_some(),
            "cancelled while the foreground ran"
        );
        f.assert_gone(&end, launch.attempt);
        // The foreground killed from outside.
        let launch = f.launch("sleep 30", bg());
        let end = run_attempt(
            launch.clone(),
            f.backend.clone(),
            &quick(),
            CancellationToken::new(),
            |pid| {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                });
            },
        )
        .await;
        assert_eq!(end.failure(), Some(FailureClass::Signal), "{end:?}");
        f.assert_gone(&end, launch.attempt);
    }

    /// A foreground that cannot start after its background did: the background is stopped
    /// with the attempt's verified cleanup and recorded, not left to an unverified kill.
    #[tokio::test]
    async fn a_foreground_that_cannot_start_stops_its_background_verified() {
        let f = fixture();
        let bg = background("echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300");
        let mut launch = f.launch("true", bg);
        launch.argv = vec!["/nonexistent/headroom-no-such-program".into()];
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(end.failure(), Some(FailureClass::LaunchError), "{end:?}");
        assert!(end.cleanup_verified, "{end:?}");
        let b = end.background.as_ref().expect("the background is recorded");
        assert!(b.pid.is_some() && b.ready_ms.is_some(), "{b:?}");
        assert_eq!(b.signal, Some(15), "stopped by SIGTERM: {b:?}");
        f.assert_gone(&end, launch.attempt);
        let log = log_of(&launch);
        assert!(
            log.contains("cannot start") && log.contains("stopping the background"),
            "{log}"
        );
    }

    #[tokio::test]
    async fn readiness_by_a_log_line() {
        let f = fixture();
        let mut bg = background("echo warming up; sleep 0.6; echo 'model READY'; exec sleep 300");
        bg.ready_log = Some("READY$".into());
        let launch = f.launch("echo fg ran", bg);
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(end.failure(), None, "{end:?}");
        let waited = end
            .background
            .as_ref()
            .and_then(|b| b.ready_ms)
            .expect("ready");
        assert!(waited >= 600, "ready after {waited} ms, before the line");
        assert!(log_of(&launch).contains("its log matched `READY$`"));
        f.assert_gone(&end, launch.attempt);
    }

    #[tokio::test]
    async fn a_background_not_ready_in_time_fails_the_attempt_unstarted() {
        let f = fixture();
        let mut bg = background("exec sleep 300");
        bg.start_timeout_ms = 300;
        let marker = f.path("fg_ran");
        let launch = f.launch(&format!("touch {marker}"), bg);
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(
            end.failure(),
            Some(FailureClass::BackgroundNotReady),
            "{end:?}"
        );
        assert_eq!(end.started_at, None);
        assert!(
            !Path::new(&marker).exists(),
            "the foreground must not start"
        );
        assert!(
            end.log_tail.contains(
                "not ready within colocate.start_timeout (300ms): none of its GPU memory was seen"
            ),
            "{}",
            end.log_tail
        );
        f.assert_gone(&end, launch.attempt);
        assert_eq!(end.background.as_ref().and_then(|b| b.ready_ms), None);

        // One that dies while warming up.
        let launch = f.launch(
            &format!("touch {marker}"),
            background("echo no data >&2; exit 4"),
        );
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(
            end.failure(),
            Some(FailureClass::BackgroundNotReady),
            "{end:?}"
        );
        assert!(
            end.log_tail
                .contains("exited (exit code 4) before it was ready"),
            "{}",
            end.log_tail
        );
        let b = end.background.as_ref().expect("bg");
        assert_eq!((b.exit_code, b.exited_early), (Some(4), true));
        assert!(!Path::new(&marker).exists());
    }

    #[tokio::test]
    async fn a_background_that_dies_early_fails_or_flags_the_attempt() {
        let f = fixture();
        let dying = || background("echo 0:256 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.4; exit 5");
        let launch = f.launch("sleep 30", dying());
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(
            end.failure(),
            Some(FailureClass::BackgroundExited),
            "{end:?}"
        );
        assert_eq!(end.signal, Some(15), "the foreground was stopped");
        let b = end.background.as_ref().expect("bg");
        assert_eq!((b.exit_code, b.exited_early), (Some(5), true));
        assert!(
            end.log_tail.contains("on_background_exit: fail"),
            "{}",
            end.log_tail
        );
        f.assert_gone(&end, launch.attempt);

        let mut bg = dying();
        bg.on_exit = OnBackgroundExit::Flag;
        let launch = f.launch("sleep 1", bg);
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(
            end.failure(),
            None,
            "the foreground ran to its end: {end:?}"
        );
        let b = end.background.as_ref().expect("bg");
        assert_eq!((b.exit_code, b.exited_early), (Some(5), true));
        assert!(
            end.log_tail.contains("on_background_exit: flag"),
            "{}",
            end.log_tail
        );
        f.assert_gone(&end, launch.attempt);
    }

    /// The energy and power of a colocated attempt are its GPU's over the foreground's run,
    /// background included; the background, the attempt's own, is no contamination.
    #[tokio::test]
    async fn a_colocated_attempts_figures_are_the_gpus_and_its_background_is_its_own() {
        let f = fixture();
        let bg = background("echo 0:2048:40 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300");
        let launch = f.launch("echo 0:2048:40 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 2", bg);
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        assert_eq!(end.failure(), None, "{end:?}");
        let m = &end.measurements;
        assert!(!end.contaminated, "{end:?}");
        assert_eq!(
            (
                m.contamination_reason.as_deref(),
                m.contamination_pid,
                m.contamination_command.as_deref()
            ),
            (None, None, None),
            "{m:?}"
        );
        let model = crate::gpu::fakepower::PowerModel::default();
        // 8 GiB GPU: the pair holds half of it at 80 %; the foreground alone a quarter at 40 %.
        let pair = model.power_w(0.5, 0.8);
        let alone = model.power_w(0.25, 0.4);
        let max = m.max_power_w.expect("max power");
        assert!(
            (max - pair).abs() <= pair * 0.01,
            "max power {max} W: want the pair's {pair} W, not the foreground's {alone} W"
        );
        // Above what the foreground alone could draw in its 2 s.
        let energy = m.energy_j.expect("energy");
        assert!(
            energy > alone * 2.0 * 1.2 && energy <= pair * 2.0 * 1.1,
            "{energy} J over about 2 s at {pair} W"
        );
        f.assert_gone(&end, launch.attempt);
    }

    #[tokio::test]
    async fn an_exclusive_colocated_attempt_counts_its_background_as_its_own() {
        let f = fixture();
        let bg = background("echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300");
        let mut launch = f.launch("echo 0:512 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 1", bg);
        launch.prestart.exclusive = true;
        let attempt = launch.attempt;
        let end = f.run(launch, CancellationToken::new()).await;
        assert_eq!(end.failure(), None, "{end:?}");
        // Exclusive: any process not the attempt's own would contaminate it; the pair is
        // one attempt.
        assert!(!end.contaminated, "{:?}", end.measurements);
        f.assert_gone(&end, attempt);
    }

    #[tokio::test]
    async fn another_attempts_process_on_a_colocated_gpu_contaminates_it() {
        let f = fixture();
        // A process of another attempt takes memory on the GPU while the pair runs.
        let other = AttemptId::new();
        let dir = f.tmp.path().join("gpus");
        let mut intruder = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sleep 0.5; echo 0:128 > {}/$$; exec sleep 30",
                dir.display()
            ))
            .env(procscan::ATTEMPT_VAR, other.to_string())
            .spawn()
            .expect("spawn");
        let bg = background("echo 0:1024 > $HEADROOM_FAKE_GPU_DIR/$$; exec sleep 300");
        let launch = f.launch("sleep 1.2", bg);
        let end = f.run(launch.clone(), CancellationToken::new()).await;
        let _ = intruder.kill();
        let _ = intruder.wait();
        let _ = std::fs::remove_file(dir.join(intruder.id().to_string()));
        assert_eq!(end.failure(), None, "{end:?}");
        assert!(
            end.contaminated,
            "a process beyond the declared pair was on the GPU"
        );
        // The contamination detail names the intruder, not the pair's background.
        let m = &end.measurements;
        assert_eq!(m.contamination_pid, Some(intruder.id()), "{m:?}");
        let reason = m.contamination_reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(&format!("a process of another attempt ({other})"))
                && reason.contains("128 MiB on GPU 0"),
            "{reason}"
        );
    }
}
