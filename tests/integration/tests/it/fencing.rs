//! Self-fencing under a partition that drops packets: sockets stay open, nothing arrives,
//! nothing fails fast. The cut-off agent must stop its attempt before the coordinator can
//! give the lease away (so the job never runs twice), and its late reports get 409.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, job_of, submit_json,
};
use headroom_integration_tests::{
    DroppingLink, alive, fake_job, read_records, run_binary, wait_until as wait,
};
use headroom_shared::FailureClass;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn agent(url: &str, node: &str, dir: &std::path::Path) -> Agent {
    let opts = AgentOptions::node(node)
        .kill_grace("500ms")
        .verify_timeout("5s");
    Agent::start(url, dir, opts).expect("agent")
}

#[test]
fn a_black_holed_agent_stops_its_attempt_before_the_lease_is_given_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "3s"]).expect("coordinator");
    let url = coord.url.clone();
    let link = DroppingLink::new(coord.port).expect("link");
    let cut_off = agent(
        &format!("http://127.0.0.1:{}", link.port),
        "cut-off",
        dir.path(),
    );

    let record = dir.path().join("timeline.jsonl");
    let exp = submit_json(
        &url,
        &serde_json::json!({"name": "once-at-a-time", "command": [
            fake_job().display().to_string(), "--seconds", "600", "--record", record.display().to_string()],
            "retry": {"max_attempts": 3}}),
    );
    let pid = wait("the first attempt to run", Duration::from_secs(30), || {
        job_of(&url, exp)?.attempts_detail.first()?.pid
    });

    // Watch the first attempt's process closely: when did it really end?
    let died_at = Arc::new(AtomicI64::new(0));
    let d = died_at.clone();
    std::thread::spawn(move || {
        while alive(pid) {
            std::thread::sleep(Duration::from_millis(5));
        }
        d.store(now_ms(), Ordering::SeqCst);
    });

    link.drop_packets();
    // A second agent, reachable, takes the job once the coordinator expires the lease.
    let _rescuer = agent(&url, "rescuer", dir.path());
    let second_start = wait(
        "the second attempt to start",
        Duration::from_secs(60),
        || {
            read_records(&record)
                .ok()?
                .into_iter()
                .filter(|r| r.event == "start")
                .nth(1)
                .map(|r| r.t_ms)
        },
    );
    let died = died_at.load(Ordering::SeqCst);
    assert!(
        died > 0 && died < second_start,
        "the cut-off agent's attempt ended at {died} (0: still running), the job started \
         again elsewhere at {second_start}: it ran twice\n{}",
        cut_off.output()
    );

    // The partition heals: the agent's late end report is refused and changes nothing.
    link.heal();
    wait(
        "the late finish to be refused",
        Duration::from_secs(60),
        || {
            cut_off
                .output()
                .contains("finish refused, the lease is no longer ours")
                .then_some(())
        },
    );
    let d = job_of(&url, exp).expect("job");
    let first = &d.attempts_detail[0];
    assert_eq!(first.failure_class, Some(FailureClass::Lost));
    assert!(
        !first
            .log_tail
            .as_deref()
            .unwrap_or_default()
            .contains("lease could not be renewed"),
        "the stale report was taken: {first:?}"
    );
    assert!(d.attempts_detail.len() >= 2, "{}", coord.output());
}

/// The guarantee cannot hold when the kill grace eats the lease TTL: refused at start, naming
/// both settings, by `headroom up` and by an agent whose coordinator has that TTL.
#[test]
fn a_kill_grace_that_does_not_fit_the_lease_ttl_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let up_dir = dir.path().join("up").display().to_string();
    let (status, err) = run_binary(
        "headroom",
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--gpu-backend",
            "fake",
            "--kill-grace",
            "10s",
            "--lease-ttl",
            "10s",
            "--data-dir",
            &up_dir,
        ],
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("--kill-grace 10s") && err.contains("--lease-ttl 10s"),
        "{err}"
    );

    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "10s"]).expect("coordinator");
    let url = &coord.url;
    let agent_dir = dir.path().join("agent").display().to_string();
    let (status, err) = run_binary(
        "headroom-agent",
        &[
            "--coordinator",
            url,
            "--gpu-backend",
            "fake",
            "--kill-grace",
            "10s",
            "--data-dir",
            &agent_dir,
        ],
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("--kill-grace 10s") && err.contains("--lease-ttl 10s"),
        "{err}"
    );
}

/// A short TTL and no fault at all: every lease is renewed in time, so no attempt is lost.
/// Each new supervisor must get a current deadline at launch, and keep getting renewals
/// however the launch and a heartbeat interleave.
///
/// At this TTL the coordinator must answer each heartbeat within 266 ms. Its store is on a
/// memory file system: on a disk a build or another test keeps busy, its commits waited
/// 435 ms on `fsync`, and the agent rightly fenced the whole node, which is a fault, not the
/// interleaving this test is about.
#[test]
fn a_one_second_ttl_without_faults_loses_no_attempt() {
    let h = headroom_integration_tests::Headroom::up(
        headroom_integration_tests::UpOptions::gpus("2x24GiB")
            .lease_ttl("1s")
            .kill_grace("300ms")
            .plan("8,8")
            .in_memory(),
    );
    h.wait_agent();
    let exp = h.submit_spec(serde_json::json!({"name": "short-ttl",
        "command": ["sleep", "0.3"], "runs_per_config": 400,
        "resources": {"memory": "100MiB"}, "retry": {"max_attempts": 1}}));
    let jobs = h.wait_done(exp, Duration::from_secs(180));
    let lost: Vec<_> = jobs
        .iter()
        .filter(|j| j.attempts != 1 || j.state != headroom_shared::JobState::Succeeded)
        .collect();
    // A node-wide fence says how long the heartbeat in flight had waited; none means a
    // supervisor alone missed its renewals.
    let log = h.server_log();
    let fences: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("leases not renewed"))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of 400 jobs lost an attempt: {:?}\nthe agent's fences: {fences:#?}",
        lost.len(),
        lost.first()
    );
}

/// A driver slow to answer must not hold the lease renewals: with each reading of the GPUs
/// taking 3 s (as NVML's calls may on a node whose driver is busy) and a 4 s TTL (a heartbeat
/// must be answered within about 2 s of its due time), a running job runs to its end rather
/// than being fenced, and the agent says its heartbeats went without the reading.
#[test]
fn a_gpu_reading_slower_than_the_fence_allows_does_not_fence_the_node() {
    let h = headroom_integration_tests::Headroom::up(
        headroom_integration_tests::UpOptions::gpus("1x24GiB")
            .lease_ttl("4s")
            .kill_grace("300ms"),
    );
    h.wait_agent();
    let exp = h.submit_spec(serde_json::json!({"name": "slow-driver",
        "command": ["sleep", "10"], "resources": {"memory": "100MiB"},
        "retry": {"max_attempts": 1}}));
    h.wait_for("the job to run", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        Ok((jobs[0].state == headroom_shared::JobState::Running).then_some(()))
    });
    // The fake backend's control file for it.
    std::fs::write(h.fake_gpu_dir().join("read-delay"), "3s").expect("read-delay");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(
        (jobs[0].state, jobs[0].attempts, jobs[0].last_failure),
        (headroom_shared::JobState::Succeeded, 1, None),
        "{:?}\n{}",
        jobs[0],
        h.server_log()
    );
    // Said once while the readings stay slow, not at each heartbeat.
    let log = h.server_log();
    assert_eq!(
        log.matches("the heartbeat goes without it").count(),
        1,
        "the late reading told other than once:\n{log}"
    );
}
