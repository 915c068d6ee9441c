//! The supervisor's tests of one attempt, and the fake-GPU fixture the tests of the modules
//! it runs share.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use headroom_shared::api::PeakSource;
use headroom_shared::prestart::Prestart;
use headroom_shared::{AttemptId, FailureClass, JobId};
use tokio_util::sync::CancellationToken;

use super::command::*;
use super::launch::*;
use super::log::*;
use super::watch::*;
use super::*;
use crate::gpu::{self, GpuBackend};
use crate::gpu::{FakeBackend, FakeGpuSpec};
use crate::procscan::{self, ATTEMPT_VAR};
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
    pub(crate) fn launch(&self, argv: &[&str]) -> Launch {
        let attempt = AttemptId::new();
        Launch {
            attempt,
            job: JobId::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            base_env: crate::jobenv::for_jobs(std::env::vars_os(), &[]),
            env: BTreeMap::new(),
            params: BTreeMap::new(),
            gpus: vec![0],
            timeout: None,
            log_path: self.tmp.path().join(format!("logs/{attempt}.log")),
            workdir: None,
            environment: None,
            baseline: None,
            prestart: Prestart::default(),
            background: None,
            run_as: None,
            results: None,
            host_memory_mib: None,
            restart: Default::default(),
            memory_cap_mib: None,
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
        start_reading_wait: Duration::from_secs(20),
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

    assert_eq!(end.failure(), None, "{end:?}");
    assert_eq!((end.exit_code, end.signal), (Some(0), None));
    assert_eq!(end.pid, Some(seen.load(Ordering::SeqCst)));
    assert!(end.started_at.is_some_and(|s| s <= end.ended_at));
    assert!(end.cleanup_verified);
    assert_eq!(end.peak_mem_mib, None);
    // The verified cleanup's reading, which the end reports: every GPU, none unreadable.
    let after = end.gpus_after.as_ref().expect("the cleanup's reading");
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|g| g.error.is_none()), "{after:?}");
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
    assert_eq!(end.failure(), Some(FailureClass::Nonzero));
    assert_eq!(end.exit_code, Some(3));

    let end = f.run(f.sh("kill -KILL $$")).await;
    assert_eq!(end.failure(), Some(FailureClass::Signal));
    assert_eq!((end.exit_code, end.signal), (None, Some(9)));
}

#[tokio::test]
async fn oom_text_in_the_log_makes_an_oom_failure() {
    let f = fixture();
    let launch = f.sh("echo step 1; \
         echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB' >&2; \
         exit 1");
    let end = f.run(launch).await;
    assert_eq!(end.failure(), Some(FailureClass::Oom), "{end:?}");
    assert!(end.log_tail.contains("CUDA out of memory"));

    // The same text followed by success is a success.
    let end = f
        .run(f.sh("echo 'CUDA error: out of memory'; exit 0"))
        .await;
    assert_eq!(end.failure(), None);
}

/// A log left long unscanned at the end (its rest is scanned off the supervisor's runtime,
/// a short rest on it) says the same: the OOM after 300 KB of output is seen.
#[tokio::test]
async fn oom_text_at_the_end_of_a_long_log_is_seen() {
    let f = fixture();
    let end = f
        .run(
            f.sh("yes 'epoch 1 step 1 loss 0.5' | head -c 300000; echo; \
             echo 'torch.OutOfMemoryError: CUDA out of memory.' >&2; exit 1"),
        )
        .await;
    assert_eq!(end.failure(), Some(FailureClass::Oom), "{end:?}");
    assert!(end.log_tail.contains("CUDA out of memory"));
}

/// The job's environment is activated as `activate` would: its `bin/` first on `PATH` (so
/// `python` is its interpreter), `VIRTUAL_ENV` set; one the node lacks is the attempt's
/// `environment` failure, and nothing starts.
#[tokio::test]
async fn a_job_runs_with_its_environment_and_one_the_node_lacks_fails_on_its_own() {
    use headroom_shared::api::source::Environment;
    let f = fixture();
    let venv = f.tmp.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).expect("venv");
    let mut launch = f.sh("echo \"venv=$VIRTUAL_ENV path=$PATH\"");
    launch
        .base_env
        .insert("PATH".into(), "/usr/bin:/bin".into());
    launch.environment = Some(Environment::Venv(venv.display().to_string()));
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None, "{end:?}");
    let want = format!("venv={0} path={0}/bin:/usr/bin:/bin", venv.display());
    assert!(log_of(&launch).contains(&want), "{}", log_of(&launch));

    let mut launch = f.sh("echo started");
    launch.environment = Some(Environment::Conda("no-such-env".into()));
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Environment));
    assert_eq!(end.pid, None);
    assert!(
        end.log_tail.contains("no conda environment `no-such-env`"),
        "{}",
        end.log_tail
    );
    assert!(!log_of(&launch).contains("started"));
}

/// A job that cannot start (its working directory is gone) says so at once, though its
/// GPUs are still opening (NVML on a node without persistence mode): its command is readied
/// while the start reading waits, and a command that cannot be readied does not wait for it.
#[tokio::test]
async fn a_launch_error_does_not_wait_for_the_gpus_to_open() {
    let f = fixture();
    let opened = f.backend.clone();
    let opening = crate::gpu::lazy::Opening::new(move || {
        std::thread::sleep(Duration::from_secs(3));
        Ok(opened.clone())
    });
    opening.start();
    let backend: Arc<dyn GpuBackend> = Arc::new(crate::gpu::lazy::LazyBackend::new(
        opening,
        Vec::new(),
        vec![0],
    ));
    let mut launch = f.sh("echo started");
    // What the agent read at admission: the start does not read the GPUs for it.
    launch.baseline = Some(Baseline::default());
    launch.workdir = Some(f.tmp.path().join("gone"));
    let began = std::time::Instant::now();
    let end = run_attempt(
        launch.clone(),
        backend,
        &quick(),
        CancellationToken::new(),
        |_| {},
    )
    .await;
    let took = began.elapsed();
    assert_eq!(end.failure(), Some(FailureClass::Workdir), "{end:?}");
    assert_eq!(end.pid, None);
    assert!(
        took < Duration::from_millis(1500),
        "the launch error waited {took:?} for the GPUs to open"
    );
}

/// A job that fails saying `Permission denied` while it ran as a user the agent chose gets
/// a line naming that user and the mappings that fix it, instead of the bare error.
#[tokio::test]
async fn a_job_denied_its_files_is_told_who_it_ran_as_and_what_fixes_it() {
    let f = fixture();
    let script =
        "echo \"python3: can't open file 'train.py': [Errno 13] Permission denied\" >&2; exit 2";
    let mut launch = f.sh(script);
    launch.run_as = None;
    let end = f.run(launch).await;
    assert_eq!(end.failure(), Some(FailureClass::Nonzero));
    assert!(
        !end.log_tail.contains("ran as the Unix user"),
        "{}",
        end.log_tail
    );
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let mut launch = f.sh(script);
    launch.run_as = Some(headroom_shared::api::RunAs {
        unix_user: "nobody".into(),
        allow_root: false,
    });
    launch.workdir = Some("/".into());
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Nonzero));
    for said in [
        "ran as the Unix user `nobody`",
        "--unix-user root --allow-root",
        "sudo headroom up",
    ] {
        assert!(end.log_tail.contains(said), "{said}: {}", end.log_tail);
        assert!(log_of(&launch).contains(said));
    }
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
    assert_eq!(end.failure(), Some(FailureClass::LaunchError));
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
    // Its own class: the node lacks the directory, the job is not to blame.
    assert_eq!(end.failure(), Some(FailureClass::Workdir));
    assert!(
        end.log_tail.contains("working directory") && end.log_tail.contains("does not exist"),
        "{}",
        end.log_tail
    );

    let end = f.run(f.launch(&[])).await;
    assert_eq!(end.failure(), Some(FailureClass::LaunchError));
}

#[tokio::test]
async fn a_job_past_its_timeout_is_stopped() {
    let f = fixture();
    let mut launch = f.launch(&["sleep", "30"]);
    launch.timeout = Some(Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Timeout));
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
    assert_eq!(end.failure(), Some(FailureClass::Timeout));
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
    assert_eq!(end.failure(), Some(FailureClass::Cancelled));
    assert!(end.cleanup_verified);
    assert!(log_of(&launch).contains("[headroom] asked to stop"));
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
    assert_eq!(end.failure(), Some(FailureClass::Cancelled));
    assert_eq!(end.pid, None);
}

#[tokio::test]
async fn peak_memory_sums_the_attempts_processes() {
    let f = fixture();
    let launch = f.sh("echo 512 > $HEADROOM_FAKE_GPU_DIR/$$; \
         sh -c 'echo 1:256 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.6' & \
         sleep 0.3; echo 0:2048 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.3; wait");
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None, "{end:?}");
    assert_eq!(end.peak_mem_mib, Some(2048 + 256));
    f.assert_gone(launch.attempt);
}

/// A run that ended well tells the shape of its memory over time: its steady use, where its
/// peak fell and its length; a failed run tells none (its next runs are not placed by it).
#[tokio::test]
async fn a_run_that_ended_well_tells_where_its_peak_fell() {
    let f = fixture();
    let shaped = "echo 0:1000 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 1.6; \
                  echo 0:4000 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.4";
    let end = f.run(f.sh(shaped)).await;
    assert_eq!(end.failure(), None, "{end:?}");
    assert_eq!(end.peak_mem_mib, Some(4000));
    let p = end.measurements.memory_profile.expect("a shape");
    assert_eq!(p.steady_mib, 1000, "{p:?}");
    assert!((0.7..=0.8).contains(&p.peak_from), "{p:?}");
    assert!((p.peak_until - 1.0).abs() < 1e-9, "{p:?}");
    assert!((1900..=2600).contains(&p.expected_ms), "{p:?}");

    let failed = f.run(f.sh(&format!("{shaped}; exit 3"))).await;
    assert_eq!(failed.failure(), Some(FailureClass::Nonzero), "{failed:?}");
    assert_eq!(failed.measurements.memory_profile, None);
    let flat = f
        .run(f.sh("echo 0:1000 > $HEADROOM_FAKE_GPU_DIR/$$; sleep 0.7"))
        .await;
    assert_eq!(
        flat.measurements.memory_profile, None,
        "no peak to place by"
    );
}

/// A look that could not read one of a run's GPUs saw less than the run held there: the run
/// tells no shape (a dip it never had could place its configuration's next runs too low).
#[tokio::test]
async fn a_run_with_a_gpu_unread_at_one_look_tells_no_shape() {
    let f = fixture();
    let two = |script: &str| Launch {
        gpus: vec![0, 1],
        ..f.sh(script)
    };
    let shaped = |fault: &str| {
        format!(
            "d=$HEADROOM_FAKE_GPU_DIR; echo 0:1000,1:1000 > $d/$$; sleep 0.6; {fault} \
             sleep 1.0; echo 0:1000,1:4000 > $d/$$; sleep 0.4"
        )
    };
    let clean = f.run(two(&shaped(""))).await;
    assert_eq!(clean.failure(), None, "{clean:?}");
    assert!(
        clean.measurements.memory_profile.is_some(),
        "two GPUs read at every look tell a shape: {clean:?}"
    );
    let unread = f
        .run(two(&shaped(
            "echo 'Unknown Error' > $d/gpu1.fail-processes; sleep 0.4; rm $d/gpu1.fail-processes;",
        )))
        .await;
    assert_eq!(unread.failure(), None, "{unread:?}");
    assert_eq!(unread.measurements.memory_profile, None, "{unread:?}");
}

#[tokio::test]
async fn children_left_behind_by_a_successful_job_are_stopped() {
    let f = fixture();
    let launch = f.sh("sleep 300 & echo started");
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None);
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
    assert_eq!(end.failure(), None, "{end:?}");
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
    assert_eq!(end.failure(), None, "{end:?}");
    assert!(end.cleanup_verified, "{end:?}");
    assert!(
        log_of(&launch).contains("stopped 2 leftover process(es)"),
        "{}",
        log_of(&launch)
    );
    assert_eq!(procscan::descendants(), Ok(vec![]), "the tree is gone");
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
    while procscan::pids_with_marker(attempt).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let _ = task.await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !procscan::pids_with_marker(attempt).is_empty() && std::time::Instant::now() < deadline {
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
    // Not verified: no reading stands for "gone"; the end reads the GPUs anew.
    assert!(end.gpus_after.is_none(), "{end:?}");
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
    assert_eq!(shared.failure(), None, "{shared:?}");
    assert!(!shared.contaminated, "{shared:?}");
    let mut exclusive = f.sh(&script);
    exclusive.prestart.exclusive = true;
    let alone = f.run(exclusive).await;
    assert_eq!(alone.failure(), None, "{alone:?}");
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
    assert_eq!(end.failure(), None, "{end:?}");
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
    assert_eq!(end.failure(), None, "{end:?}");
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
    assert_eq!(end.failure(), None, "{end:?}");
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

/// The job starts from its launch's variables only: nothing of the process that runs it
/// (the supervisor's environment is the agent's) is inherited.
#[tokio::test]
async fn a_job_inherits_nothing_of_its_supervisors_environment() {
    let f = fixture();
    // Cargo sets this on the test process: it stands for anything the agent was started with.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let mut launch = f.sh("env");
    launch.base_env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None, "{}", end.log_tail);
    let env = log_of(&launch);
    assert!(env.contains("PATH=/usr/bin:/bin"), "{env}");
    assert!(env.contains("HEADROOM_ATTEMPT_ID="), "{env}");
    assert!(!env.contains("CARGO_MANIFEST_DIR"), "{env}");
}

/// The job's `TMPDIR` is its attempt's own: made for it (0700) under the node's temporary
/// directory, there while it runs, gone once the attempt ended clean.
#[tokio::test]
async fn a_job_gets_a_private_temporary_directory_gone_with_its_attempt() {
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    let launch = f.sh("echo tmp=$TMPDIR; touch $TMPDIR/scratch; stat -c 'mode=%a' $TMPDIR");
    let dir = super::command::tmp_dir(&launch);
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None, "{end:?}");
    let log = std::fs::read_to_string(&launch.log_path).expect("log");
    assert!(log.contains(&format!("tmp={}", dir.display())), "{log}");
    assert!(log.contains("mode=700"), "{log}");
    assert!(end.cleanup_verified, "{end:?}");
    assert!(!dir.exists(), "{} outlived its attempt", dir.display());
    // A name planted where the next attempt's would be is refused, not used.
    let next = f.sh("true");
    let planted = super::command::tmp_dir(&next);
    std::fs::create_dir(&planted).expect("plant");
    std::fs::set_permissions(
        &planted,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let end = f.run(next).await;
    assert_eq!(end.failure(), Some(FailureClass::LaunchError), "{end:?}");
    assert!(std::fs::metadata(&planted).is_ok_and(|m| m.mode() & 0o777 == 0o777));
    let _ = std::fs::remove_dir(&planted);
}

/// Runs `launch`, asking for a requeueing stop (its checkpoint signal first) after `after`.
async fn run_requeued(f: &Fixture, launch: Launch, after: Duration) -> AttemptEnd {
    let (cancel, checkpoint) = (CancellationToken::new(), CancellationToken::new());
    let c = checkpoint.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        c.cancel();
    });
    run_attempt_reporting(
        launch,
        f.backend.clone(),
        &quick(),
        cancel,
        checkpoint,
        |_| {},
        None,
    )
    .await
}

fn checkpointed(f: &Fixture, script: &str, lead_ms: u64) -> Launch {
    let mut launch = f.sh(script);
    launch.restart.checkpoint = Some(headroom_shared::checkpoint::Checkpoint {
        signal: "USR1".into(),
        lead_ms,
    });
    launch.restart.job_dir = Some(job_dir(f.tmp.path(), launch.job));
    launch
}

/// A job that saves its step on USR1 and exits: what a training script does.
const SAVES_ON_USR1: &str = "trap 'echo 7 > \"$HEADROOM_JOB_DIR/step\"; exit 0' USR1; \
     echo \"restarts=$HEADROOM_RESTART_COUNT why=${HEADROOM_STOP_REASON:-none}\"; \
     while true; do sleep 0.05; done";

#[tokio::test]
async fn a_requeue_signals_the_job_which_saves_in_its_job_dir_and_is_stopped_by_headroom() {
    use crate::supervisor::classify::{self, StopReason};
    use headroom_shared::checkpoint::Requeue;
    let f = fixture();
    let launch = checkpointed(&f, SAVES_ON_USR1, 10_000);
    let dir = launch.restart.job_dir.clone().expect("a job dir");
    let t0 = std::time::Instant::now();
    let end = run_requeued(&f, launch.clone(), Duration::from_millis(300)).await;
    // It exited 0 after its signal, well within its lead: stopped all the same.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(end.exit_code, Some(0));
    let told = end
        .facts
        .told(Some(StopReason::Requeue(Requeue::Preempted)));
    assert_eq!(classify::decide(&told), Some(FailureClass::Preempted));
    assert_eq!(
        std::fs::read_to_string(dir.join("step")).expect("saved"),
        "7\n"
    );
    let log = log_of(&launch);
    assert!(log.contains("sent SIGUSR1 (checkpoint)"), "{log}");
    assert!(log.contains("restarts=0 why=none"), "{log}");
    assert!(end.cleanup_verified);
    f.assert_gone(launch.attempt);

    // The next attempt of the job: the same directory, told why and how many times.
    let mut next = checkpointed(
        &f,
        "cat \"$HEADROOM_JOB_DIR/step\"; echo \"restarts=$HEADROOM_RESTART_COUNT why=$HEADROOM_STOP_REASON\"",
        10_000,
    );
    next.job = launch.job;
    next.restart.job_dir = launch.restart.job_dir.clone();
    next.restart.count = 1;
    next.restart.previous_end = Some(FailureClass::Preempted);
    let end = f.run(next.clone()).await;
    assert_eq!(end.failure(), None);
    assert!(
        log_of(&next).contains("7\nrestarts=1 why=preempted"),
        "{}",
        log_of(&next)
    );
}

#[tokio::test]
async fn a_job_that_ignores_its_checkpoint_signal_is_stopped_after_its_lead() {
    let f = fixture();
    let launch = checkpointed(&f, "trap '' USR1; sleep 30", 400);
    let t0 = std::time::Instant::now();
    let end = run_requeued(&f, launch.clone(), Duration::from_millis(100)).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "stopped before its lead: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(end.signal, Some(15), "the usual stop after the lead");
    assert_eq!(end.failure(), Some(FailureClass::Cancelled));
    assert!(end.cleanup_verified);
    f.assert_gone(launch.attempt);

    // Without a checkpoint signal, a requeue stops it at once.
    let mut launch = f.launch(&["sleep", "30"]);
    launch.restart.checkpoint = None;
    let t0 = std::time::Instant::now();
    let end = run_requeued(&f, launch.clone(), Duration::from_millis(100)).await;
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(end.signal, Some(15));
}

#[tokio::test]
async fn a_job_gets_its_checkpoint_signal_its_lead_before_its_timeout() {
    let f = fixture();
    let mut launch = checkpointed(
        &f,
        "trap 'echo 3 > \"$HEADROOM_JOB_DIR/step\"' USR1; while true; do sleep 0.05; done",
        600,
    );
    launch.timeout = Some(Duration::from_millis(1200));
    let dir = launch.restart.job_dir.clone().expect("a job dir");
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Timeout));
    assert_eq!(
        std::fs::read_to_string(dir.join("step")).expect("saved"),
        "3\n"
    );
    let log = log_of(&launch);
    let signal = log.find("sent SIGUSR1").expect("signalled");
    let timeout = log.find("timeout after").expect("timed out");
    assert!(signal < timeout, "{log}");
}
