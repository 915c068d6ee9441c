//! GPU readings fail closed: a GPU whose memory or process list cannot be read gets no work
//! and quarantines the attempt that was on it, memory the driver cannot tell per process is
//! learnt from the device's used memory (never as 0), and an agent that cannot map the
//! driver's pids verifies and kills nothing. Faults are injected through the fake backend's
//! control files; every start names the backend it uses.

use std::path::PathBuf;
use std::time::Duration;

use headroom_integration_tests::{
    Headroom, KillOnDrop, Proc, UpOptions, alive, fake_job, wait_until,
};
use headroom_shared::api::PeakSource;
use headroom_shared::pending::PendingReason;
use headroom_shared::{ExperimentId, JobState};

fn fake_dir(h: &Headroom) -> PathBuf {
    h.fake_gpu_dir()
}

fn submit(h: &Headroom, spec: serde_json::Value) -> ExperimentId {
    h.submit_spec(spec)
}

#[test]
fn a_gpu_whose_memory_cannot_be_read_gets_no_work_until_it_reads_again() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("3s"));
    let fault = fake_dir(&h).join("gpu0.fail-memory");
    std::fs::write(&fault, "GPU is lost").expect("inject");
    let exp = submit(
        &h,
        serde_json::json!({"name": "wait", "command": ["true"], "resources": {"memory": "1GiB"}}),
    );
    h.wait_for(
        "the GPU's error in `nodes`",
        Duration::from_secs(20),
        || {
            // The node may not have registered yet: no node is no answer.
            let nodes = h.nodes()?;
            let error = nodes
                .first()
                .and_then(|n| n.gpus.first())
                .and_then(|g| g.error.as_ref());
            Ok(error.filter(|e| e.contains("GPU is lost")).map(|_| ()))
        },
    );
    // No figures for it: an unknown is never shown as 0 used or 0 free.
    let gpu = h.nodes().expect("nodes")[0].gpus[0].clone();
    assert_eq!((gpu.used_mib, gpu.free_mib), (None, None), "{gpu:?}");
    let nodes = h.cli_ok(&["nodes"]);
    assert!(
        nodes.contains("CANNOT BE READ") && nodes.contains("GPU is lost"),
        "{nodes}"
    );
    let row = nodes
        .lines()
        .find(|l| l.contains("Fake GPU"))
        .expect("the GPU's row");
    // GPU, NAME (two words here), TOTAL, USED, FREE, ...
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.get(4..6), Some(&["?", "?"][..]), "{row}");
    // Left for its memory, or avoided after a claim that leased it on the older reading
    // was handed back at launch.
    let why = h.wait_refused(exp, Duration::from_secs(30));
    assert!(
        matches!(
            why,
            PendingReason::NotEnoughMemory { .. } | PendingReason::GpuQuarantined
        ),
        "placed on a GPU whose memory is unknown? {why:?}"
    );
    std::fs::remove_file(&fault).expect("heal");
    // A claim already waiting when the fault appeared may have leased the job on its older
    // reading; the agent then handed it back, and the GPU is avoided for 30 s after that.
    let jobs = h.wait_done(exp, Duration::from_secs(90));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

#[test]
fn a_process_list_that_fails_quarantines_the_gpu_with_the_error() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .lease_ttl("3s")
            .flags(&["--verify-timeout", "1s"]),
    );
    // The GPU's process list breaks while the job runs (the driver lost the GPU): as the
    // fake GPUs' own user sets it (a job's control file would not count).
    let started = h.path("started");
    let exp = submit(
        &h,
        serde_json::json!({"name": "breaks", "command": ["sh", "-c",
            format!("touch {}; sleep 1", started.display())],
            "resources": {"memory": "1GiB"}}),
    );
    h.wait_for("the job to start", Duration::from_secs(30), || {
        Ok(started.exists().then_some(()))
    });
    std::fs::write(
        fake_dir(&h).join("gpu0.fail-processes"),
        "GPU has fallen off the bus",
    )
    .expect("break the GPU");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let attempt = &h.first_attempt(jobs[0].id);
    assert_eq!(
        attempt.cleanup_verified,
        Some(false),
        "an unreadable GPU was verified clean"
    );
    let quarantine = h.nodes().expect("nodes")[0].gpus[0].quarantine.clone();
    assert!(
        quarantine
            .iter()
            .any(|q| q.reason.contains("GPU has fallen off the bus")),
        "{quarantine:?}"
    );

    let next = submit(
        &h,
        serde_json::json!({"name": "next", "command": ["true"], "resources": {"memory": "1GiB"}}),
    );
    // Several heartbeats (every second with a 3 s lease): an unreadable GPU does not count
    // as "the leftovers are gone", so the quarantine stays.
    let why = h.wait_refused(next, Duration::from_secs(30));
    assert_eq!(why, PendingReason::GpuQuarantined);
    assert!(
        !h.nodes().expect("nodes")[0].gpus[0].quarantine.is_empty(),
        "quarantine lifted while the GPU cannot be read"
    );
    // The GPU reads again and nothing is left on it: the quarantine lifts by itself.
    std::fs::remove_file(fake_dir(&h).join("gpu0.fail-processes")).expect("heal");
    let jobs = h.wait_done(next, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

#[test]
fn memory_the_driver_cannot_tell_per_process_is_learnt_from_the_device() {
    let h = Headroom::start(UpOptions {
        fake_gpus: "1x24GiB".into(),
        ..Default::default()
    })
    .expect("headroom up");
    std::fs::write(fake_dir(&h).join("gpu0.no-process-memory"), "").expect("inject");
    let exp = submit(
        &h,
        serde_json::json!({"name": "unavailable", "command": [fake_job(), "--mem", "3GiB",
            "--seconds", "1.5"]}),
    );
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let attempt = &h.job(jobs[0].id).expect("job").attempts_detail[0];
    assert_eq!(attempt.peak_mem_mib, Some(3072), "{attempt:?}");
    assert_eq!(
        attempt.peak_source,
        Some(PeakSource::DeviceDelta),
        "{attempt:?}"
    );
    assert_eq!(attempt.cleanup_verified, Some(true));
    // `show` says how the peak was taken next to it, not only in the log tail.
    let show = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(
        show.contains("peak 3GiB (GPU used-memory growth)"),
        "{show}"
    );
    assert!(
        show.contains("used-memory growth since the start"),
        "{show}"
    );
    let csv = h.cli_ok(&["export", "--csv", "--experiment", &exp.to_string()]);
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let headers = r.headers().expect("headers").clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let (peak, source) = (col("peak_mem_mib"), col("peak_source"));
    let rows: Vec<(String, String)> = r
        .records()
        .map(|x| x.expect("row"))
        .map(|x| (x[peak].to_string(), x[source].to_string()))
        .collect();
    assert_eq!(rows, [("3072".to_string(), "device_delta".to_string())]);
}

#[test]
fn an_agent_that_cannot_map_pids_neither_verifies_nor_kills() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .lease_ttl("3s")
            .flags(&["--verify-timeout", "1s", "--kill-foreign"]),
    );
    let dir = fake_dir(&h);
    std::fs::write(dir.join("pid-namespace"), "isolated").expect("isolated");
    // Someone's process holding memory: its pid means nothing to an isolated agent.
    let other = KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep"),
    );
    std::fs::write(dir.join(other.0.id().to_string()), "0:2048\n").expect("usage");
    h.wait_agent();
    let exp = submit(
        &h,
        serde_json::json!({"name": "job", "command": ["true"], "resources": {"memory": "1GiB"}}),
    );
    // Not run: the GPU's reading is unknown (a claim that leased it on an older reading is
    // handed back at launch).
    let why = h.wait_refused(exp, Duration::from_secs(30));
    assert!(
        matches!(
            why,
            PendingReason::NotEnoughMemory { .. } | PendingReason::GpuQuarantined
        ),
        "{why:?}"
    );
    let job = h.jobs(exp).expect("jobs")[0].clone();
    let detail = h.job(job.id).expect("job");
    assert!(
        detail
            .attempts_detail
            .iter()
            .all(|a| a.started_at.is_none()),
        "ran on a GPU it cannot read: {:?}",
        detail.attempts_detail
    );
    assert!(
        alive(other.0.id()),
        "--kill-foreign killed a pid it cannot attribute"
    );
    let log = h.server_log();
    assert!(log.contains("hostPID: true"), "{log}");
    drop(other);
    // The process is gone: the GPU reads as empty, which needs no pid mapping. (A hand-back
    // at launch, see above, makes the GPU avoided for 30 s.)
    let jobs = h.wait_done(exp, Duration::from_secs(90));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

#[test]
fn every_start_names_its_gpu_backend() {
    let h = Headroom::up(UpOptions::default());
    let log = h.server_log();
    assert!(
        log.contains("headroom: --gpu-backend fake: 2 fake GPUs of 24 GiB"),
        "{log}"
    );

    // `auto`: NVML when a driver library exists, fake GPUs only when none does.
    let tmp = tempfile::tempdir().expect("tempdir");
    let agent = Proc::start(
        "headroom-agent",
        &[
            "--coordinator".into(),
            "http://127.0.0.1:9".into(),
            "--gpu-backend".into(),
            "auto".into(),
            "--data-dir".into(),
            tmp.path().join("data").display().to_string(),
        ],
        tmp.path().join("agent.log"),
    )
    .expect("agent");
    let line = wait_until("the agent's start line", Duration::from_secs(20), || {
        agent
            .output()
            .lines()
            .find(|l| l.starts_with("headroom-agent: "))
            .map(str::to_string)
    });
    let driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
    if driver {
        assert!(line.starts_with("headroom-agent: NVML: "), "{line}");
    } else {
        assert_eq!(
            line,
            "headroom-agent: no NVIDIA driver: 4 fake GPUs of 24 GiB"
        );
    }
}
