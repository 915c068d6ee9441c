//! The `headroom-fake-job` helper under the supervisor, on the fake GPU backend: memory is
//! held and seen, a full GPU is an OOM, orphans are cleaned up, records are written.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::gpu::GpuBackend;
use headroom_agent::gpu::fake::{self, FakeBackend, FakeGpuSpec};
use headroom_agent::procscan;
use headroom_agent::supervisor::attempt::{
    AttemptEnd, Launch, SupervisorConfig, become_subreaper, run_attempt,
};
use headroom_shared::{AttemptId, FailureClass, JobId};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

const FAKE_JOB: &str = env!("CARGO_BIN_EXE_headroom-fake-job");

struct Fixture {
    tmp: TempDir,
    backend: Arc<FakeBackend>,
}

fn fixture(spec: &str) -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spec: FakeGpuSpec = spec.parse().expect("spec");
    let backend = FakeBackend::open(spec, &tmp.path().join("gpus")).expect("fake backend");
    Fixture {
        tmp,
        backend: Arc::new(backend),
    }
}

fn cfg() -> SupervisorConfig {
    SupervisorConfig {
        kill_grace: Duration::from_millis(300),
        verify_timeout: Duration::from_secs(10),
        sample_every: Duration::from_millis(50),
        start_reading_wait: Duration::from_secs(20),
        own_tree: false,
    }
}

impl Fixture {
    fn launch(&self, args: &[&str]) -> Launch {
        let attempt = AttemptId::new();
        Launch {
            attempt,
            job: JobId::new(),
            argv: std::iter::once(FAKE_JOB)
                .chain(args.iter().copied())
                .map(String::from)
                .collect(),
            base_env: headroom_agent::jobenv::for_jobs(std::env::vars_os(), &[]),
            env: BTreeMap::new(),
            params: BTreeMap::new(),
            gpus: vec![0],
            timeout: None,
            log_path: self.tmp.path().join(format!("logs/{attempt}.log")),
            workdir: None,
            environment: None,
            baseline: None,
            prestart: Default::default(),
            background: None,
            run_as: None,
            results: None,
            host_memory_mib: None,
            restart: Default::default(),
            memory_cap_mib: None,
        }
    }

    async fn run(&self, launch: Launch) -> AttemptEnd {
        let backend: Arc<dyn GpuBackend> = self.backend.clone();
        run_attempt(launch, backend, &cfg(), CancellationToken::new(), |_| {}).await
    }

    fn used(&self, gpu: usize) -> u64 {
        self.backend.sample().expect("sample")[gpu].used_mib
    }
}

fn log(launch: &Launch) -> String {
    std::fs::read_to_string(&launch.log_path).expect("log")
}

#[tokio::test]
async fn holds_memory_on_its_gpu_and_releases_it() {
    let f = fixture("2x8GiB");
    let mut launch = f.launch(&["--mem", "3GiB", "--seconds", "0.5"]);
    launch.gpus = vec![1];
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), None, "{end:?}\n{}", log(&launch));
    assert_eq!(end.peak_mem_mib, Some(3072));
    assert!(end.cleanup_verified);
    assert!(log(&launch).contains("step 1/1 loss"));
    assert_eq!((f.used(0), f.used(1)), (0, 0));
    // The file was removed at exit.
    let files: Vec<_> = std::fs::read_dir(f.backend.dir())
        .expect("dir")
        .flatten()
        .filter(|e| {
            // The lock files and the GPUs' shared power state are the directory's own.
            ![
                fake::LOCK_FILE,
                fake::POWER_LOCK_FILE,
                fake::POWER_STATE_FILE,
            ]
            .contains(&e.file_name().to_str().unwrap_or(""))
        })
        .collect();
    assert!(files.is_empty(), "{files:?}");
}

#[tokio::test]
async fn memory_beyond_the_gpu_is_a_torch_oom() {
    let f = fixture("4GiB");
    // Someone else already holds 3 GiB of the 4.
    let holder_pid = f.tmp.path().join("holder.pid");
    let mut holder = procscan::spawn_owned(
        || {
            Command::new(FAKE_JOB)
                .args(["--mem", "3GiB", "--seconds", "30", "--pid-file"])
                .arg(&holder_pid)
                .envs(f.backend.job_env())
                .env("CUDA_VISIBLE_DEVICES", "0")
                .stdout(Stdio::null())
                .spawn()
        },
        |c| Some(c.id()),
    )
    .expect("spawn holder");
    wait_for_file(&holder_pid);
    assert_eq!(f.used(0), 3072);

    let launch = f.launch(&["--mem", "2GiB"]);
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Oom), "{end:?}");
    assert_eq!(end.exit_code, Some(1));
    assert!(
        end.log_tail.contains(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2048 MiB. \
             GPU 0 has a total capacity of 4096 MiB of which 1024 MiB is free."
        ),
        "{}",
        end.log_tail
    );
    // 1 GiB still fits.
    let end = f.run(f.launch(&["--mem", "1GiB", "--seconds", "0"])).await;
    assert_eq!(end.failure(), None, "{end:?}");

    let _ = holder.kill();
    let _ = holder.wait();
    procscan::disown(holder.id());
}

#[tokio::test]
async fn a_parameter_above_a_bound_is_an_oom() {
    let f = fixture("8GiB");
    for (batch, want) in [(128, Some(FailureClass::Oom)), (32, None)] {
        let mut launch = f.launch(&["--oom-if-param", "batch_size>64", "--seconds", "0"]);
        launch
            .params
            .insert("batch_size".into(), serde_json::json!(batch));
        let end = f.run(launch).await;
        assert_eq!(end.failure(), want, "batch {batch}: {end:?}");
    }
}

#[tokio::test]
async fn exit_code_print_and_records() {
    let f = fixture("8GiB");
    let record = f.tmp.path().join("record.jsonl");
    let record_arg = record.to_str().expect("utf-8 path");
    let mut launch = f.launch(&[
        "--exit",
        "3",
        "--seconds",
        "0.1",
        "--mem",
        "100MiB",
        "--print",
        "hello from the job",
        "--record",
        record_arg,
    ]);
    launch.gpus = vec![0];
    let end = f.run(launch.clone()).await;
    assert_eq!(end.failure(), Some(FailureClass::Nonzero));
    assert_eq!(end.exit_code, Some(3));
    assert!(log(&launch).contains("hello from the job"));

    let text = std::fs::read_to_string(&record).expect("record");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["event"], "start");
    assert_eq!(lines[1]["event"], "end");
    for line in &lines {
        assert_eq!(line["job"], launch.job.to_string());
        assert_eq!(line["attempt"], launch.attempt.to_string());
        assert_eq!(line["gpus"], "0");
        assert_eq!(line["mem_mib"], 100);
        assert_eq!(line["pid"], end.pid.expect("pid"));
    }
    assert!(lines[1]["t_ms"].as_u64() >= lines[0]["t_ms"].as_u64());
}

/// The field's lost 31 runs: a daemonized grandchild in its own session, holding GPU memory
/// and ignoring SIGTERM, outliving its job.
#[tokio::test]
async fn an_orphan_holding_memory_and_ignoring_sigterm_is_cleaned_up() {
    become_subreaper().expect("subreaper");
    let f = fixture("2x8GiB");
    let orphan_pid_file = f.tmp.path().join("orphan.pid");
    let launch = f.launch(&[
        "--mem",
        "1GiB",
        "--seconds",
        "0.3",
        "--ignore-term",
        "--orphan-mem",
        "2GiB",
        "--orphan-seconds",
        "300",
        "--orphan-pid-file",
        orphan_pid_file.to_str().expect("utf-8 path"),
    ]);
    let end = f.run(launch.clone()).await;
    let text = log(&launch);
    assert_eq!(end.failure(), None, "{end:?}\n{text}");
    assert!(end.cleanup_verified, "{end:?}\n{text}");
    // Both held memory at once: the job and its orphan.
    assert_eq!(end.peak_mem_mib, Some(3072), "{text}");
    assert!(
        end.cleanup_ms >= 300,
        "the orphan ignored SIGTERM: {}",
        end.cleanup_ms
    );
    assert!(text.contains("left an orphan"), "{text}");
    assert!(text.contains("leftover"), "{text}");

    let orphan: u32 = std::fs::read_to_string(&orphan_pid_file)
        .expect("orphan pid")
        .trim()
        .parse()
        .expect("pid");
    assert!(!procscan::is_alive(orphan), "orphan {orphan} survived");
    assert!(procscan::pids_with_marker(launch.attempt).is_empty());
    assert_eq!((f.used(0), f.used(1)), (0, 0));
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn a_missing_program_is_a_launch_error() {
    let f = fixture("1x24GiB");
    let mut launch = f.launch(&[]);
    launch.argv = vec!["/no/such/program".into(), "--flag".into()];
    let end = headroom_agent::supervisor::attempt::run_attempt(
        launch,
        f.backend.clone(),
        &cfg(),
        tokio_util::sync::CancellationToken::new(),
        |_| {},
    )
    .await;
    assert_eq!(
        end.failure(),
        Some(headroom_shared::FailureClass::LaunchError)
    );
    assert!(
        end.log_tail.contains("/no/such/program"),
        "{}",
        end.log_tail
    );
}

/// SIGTERM is recorded when it arrives, and the end as the job's last act: a test can tell
/// when a stopped job really ended.
#[test]
fn sigterm_and_the_end_are_recorded_with_their_time() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let record = tmp.path().join("record.jsonl");
    let mut child = Command::new(FAKE_JOB)
        .args(["--seconds", "60", "--record"])
        .arg(&record)
        .env("HEADROOM_ATTEMPT_ID", "a1")
        .env("HEADROOM_JOB_ID", "j1")
        .stdout(Stdio::null())
        .spawn()
        .expect("fake job");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&record).is_ok_and(|t| t.ends_with('\n')) {
        assert!(Instant::now() < deadline, "no start record");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("kill");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    let text = std::fs::read_to_string(&record).expect("record");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let events: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(events, ["start", "term", "end"], "{text}");
    let t: Vec<u64> = lines.iter().filter_map(|l| l["t_ms"].as_u64()).collect();
    assert!(t[1] >= sent && t[2] >= t[1], "{text}");
}

/// An evaluation peak: the job grows for `--grow-for` seconds and gives the memory back, as
/// the fake GPU's usage file shows; a second job whose peak meets the first's steady memory
/// on a GPU too small for both fails with CUDA's OOM text, and its record says `oom`.
#[test]
fn a_peak_is_held_for_its_time_and_one_that_does_not_fit_is_an_oom() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("gpus");
    let record = tmp.path().join("record.jsonl");
    let job = |args: &[&str]| {
        Command::new(FAKE_JOB)
            .args(args)
            .arg("--record")
            .arg(&record)
            .env(fake::DIR_VAR, &dir)
            .env(fake::SPEC_VAR, "1x10GiB")
            .env("CUDA_VISIBLE_DEVICES", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fake job")
    };
    let peaks = [
        "--mem",
        "4GiB",
        "--grow",
        "3GiB",
        "--grow-after",
        "0.3",
        "--grow-for",
        "0.6",
        "--seconds",
        "2.5",
    ];
    let mut first = job(&peaks);
    let held = |pid: u32| std::fs::read_to_string(dir.join(pid.to_string())).unwrap_or_default();
    let seen_over = |want: &str, within: Duration| {
        let deadline = Instant::now() + within;
        while held(first.id()).trim() != want {
            assert!(
                Instant::now() < deadline,
                "never held {want}: {}",
                held(first.id())
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    seen_over("0:7168", Duration::from_secs(5));
    seen_over("0:4096", Duration::from_secs(5));
    // 4 GiB held, 4 + 3 asked: 11 GiB do not fit in 10.
    let second = job(&[
        "--mem",
        "4GiB",
        "--grow",
        "3GiB",
        "--grow-after",
        "0.2",
        "--seconds",
        "1",
    ])
    .wait_with_output()
    .expect("second job");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains("CUDA out of memory. Tried to allocate 3072 MiB"),
        "{stderr}"
    );
    assert!(first.wait().expect("first job").success());
    let text = std::fs::read_to_string(&record).expect("record");
    let events: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .filter_map(|l| Some(format!("{}:{}", l["event"].as_str()?, l["mem_mib"])))
        .collect();
    assert_eq!(
        events,
        ["start:4096", "start:4096", "oom:7168", "end:4096"],
        "{text}"
    );
}

/// Without fake GPUs (no HEADROOM_FAKE_GPU_DIR, as under an agent on real GPUs) `--mem`
/// holds nothing, says so, and the job runs: the quickstart works on any machine.
#[test]
fn without_fake_gpus_mem_holds_nothing_and_the_job_runs() {
    let out = Command::new(FAKE_JOB)
        .args(["--mem", "6GiB", "--seconds", "0.1"])
        .env_remove(fake::DIR_VAR)
        .env_remove(fake::SPEC_VAR)
        .output()
        .expect("fake job");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("no fake GPUs here"), "{stdout}");
    assert!(stdout.contains("holding 0 MiB"), "{stdout}");
}

/// A colocated job of `examples/seed-003.yaml` as the agent gets it: the background (the
/// fake job with `--delay`) warms up for a second before it holds memory, the foreground
/// starts only after that memory is seen, holds its own beside it, and the background is
/// stopped when the foreground ends.
#[tokio::test]
async fn a_colocated_job_of_the_seed_003_example_runs_on_fake_gpus() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/seed-003.yaml"
    ))
    .expect("example");
    let spec = headroom_shared::spec::ExperimentSpec::from_text(&text).expect("spec");
    let jobs = headroom_shared::expand::expand(&spec, 1, 1000).expect("expands");
    let job = jobs
        .iter()
        .find(|j| {
            j.background.is_some() && j.params["fg"] == "mnist_ff" && j.params["bg"] == "resnet20"
        })
        .expect("a colocated job of pair 1");
    let f = fixture("8GiB");
    let mut launch = f.launch(&[]);
    launch.argv = job.argv.clone();
    launch.params = job.params.clone();
    launch.background = job.background.clone();
    // `headroom-fake-job` is found on PATH, as on a node where headroom is installed.
    let bin = Path::new(FAKE_JOB)
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    launch.env.insert("PATH".into(), path);
    let t0 = Instant::now();
    let end = f.run(launch.clone()).await;
    let log = log(&launch);
    assert_eq!(end.failure(), None, "{end:?}\n{log}");
    let bg = end.background.as_ref().expect("background record");
    assert!(bg.ready_ms.is_some_and(|ms| ms >= 1000), "{bg:?}");
    // Stopped with the foreground: SIGTERM, which the fake job answers by exiting 128 + 15.
    assert!(
        bg.signal == Some(15) || bg.exit_code == Some(143),
        "stopped with the foreground: {bg:?}"
    );
    assert!(!bg.exited_early);
    assert!(!procscan::is_alive(bg.pid.expect("pid")));
    assert_eq!(end.peak_mem_mib, Some(500), "the foreground's own memory");
    assert!(log.contains("foreground=mnist_ff_colocated_0"), "{log}");
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "warm-up then 2 s of training"
    );
    assert!(end.cleanup_verified);
    assert_eq!(f.used(0), 0, "nothing of the pair is left on the GPU");
    let bg_log = std::fs::read_to_string(headroom_agent::supervisor::colocate::log_path(
        &launch.log_path,
    ))
    .expect("background log");
    assert!(bg_log.contains("background=resnet20"), "{bg_log}");
    assert!(bg_log.contains("holding 800 MiB"), "{bg_log}");
}

/// Fake GPUs that hold attempts to memory caps (a driver or kernel that enforces one): an
/// attempt that grows past its cap runs out of memory with CUDA's text naming the limit,
/// while its neighbour on the same GPU, within its own, ends clean; the cap is lifted at
/// the end. Where the GPUs cannot hold attempts to one, none is set and the same growth
/// fits the GPU.
#[tokio::test]
async fn an_attempt_that_grows_past_its_cap_fails_alone() {
    let f = fixture("1x24GiB");
    let dir = f.tmp.path().join("gpus");
    std::fs::write(dir.join(fake::MEMORY_CAPS_FILE), "").expect("caps on");
    let grows = [
        "--mem",
        "2GiB",
        "--grow",
        "6GiB",
        "--grow-after",
        "0.5",
        "--seconds",
        "3",
    ];
    let mut grower = f.launch(&grows);
    grower.memory_cap_mib = Some(4096);
    let mut steady = f.launch(&["--mem", "3GiB", "--seconds", "2"]);
    steady.memory_cap_mib = Some(4096);
    let (a, b) = tokio::join!(f.run(grower.clone()), f.run(steady.clone()));
    let text = log(&grower);
    assert_eq!(a.failure(), Some(FailureClass::Oom), "{text}");
    assert_eq!(a.memory_cap_mib, Some(4096));
    assert!(text.contains("GPU memory cap: 4096 MiB"), "{text}");
    assert!(
        text.contains("CUDA out of memory") && text.contains("limit is 4096 MiB"),
        "{text}"
    );
    assert_eq!(b.failure(), None, "{}", log(&steady));
    assert_eq!(b.memory_cap_mib, Some(4096));
    assert!(
        !fake::cap_file(&dir, &grower.attempt.to_string()).exists(),
        "the cap is lifted at the end"
    );

    std::fs::remove_file(dir.join(fake::MEMORY_CAPS_FILE)).expect("caps off");
    let mut uncapped = f.launch(&grows);
    uncapped.memory_cap_mib = Some(4096);
    let end = f.run(uncapped.clone()).await;
    assert_eq!(end.failure(), None, "{}", log(&uncapped));
    assert_eq!(end.memory_cap_mib, None);
}
