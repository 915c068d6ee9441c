//! SIGTERM (or SIGINT) to `headroom-agent`: it stops its attempts with the normal verified
//! cleanup, reports them so the coordinator requeues them per policy at once (not at lease
//! expiry), and exits 0.

use std::time::{Duration, Instant};

use headroom_integration_tests::{
    Proc, alive, fake_job, free_port, http_get, http_post, wait_until as wait,
};
use headroom_shared::api::{JobDetail, JobSummary, SubmitResponse};
use headroom_shared::{ExperimentId, FailureClass, JobState};
use nix::sys::signal::Signal;

fn job(url: &str, exp: ExperimentId) -> Option<JobDetail> {
    let jobs: Vec<JobSummary> = http_get(&format!("{url}/v1/jobs?experiment={exp}")).ok()?;
    http_get(&format!("{url}/v1/jobs/{}", jobs.first()?.id)).ok()
}

fn drains_on(signal: Signal) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let url = format!("http://127.0.0.1:{port}");
    let coord_args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &dir.path().join("coord").display().to_string(),
        // Long: a report left to lease expiry would show.
        "--lease-ttl",
        "60s",
    ]
    .map(String::from)
    .to_vec();
    let _coord = Proc::start(
        "headroom-coordinator",
        &coord_args,
        dir.path().join("coord.log"),
    )
    .expect("coordinator");
    wait("the coordinator", Duration::from_secs(30), || {
        http_get::<serde_json::Value>(&format!("{url}/v1/health"))
            .ok()
            .map(|_| ())
    });
    let agent_args: Vec<String> = [
        "--coordinator",
        &url,
        "--node",
        "gpu-1",
        "--gpu-backend",
        "fake",
        "--fake-gpus",
        "1x24GiB",
        "--kill-grace",
        "1s",
        "--data-dir",
        &dir.path().join("agent").display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut agent =
        Proc::start("headroom-agent", &agent_args, dir.path().join("agent.log")).expect("agent");
    // Ignores SIGTERM: the cleanup must go through the grace period to SIGKILL.
    let spec = serde_json::json!({"spec": {"name": "long", "command": [
        fake_job().display().to_string(), "--seconds", "600", "--mem", "1GiB", "--ignore-term"],
        "retry": {"max_attempts": 2}}});
    let exp = wait("a submission", Duration::from_secs(20), || {
        let (status, body) = http_post(&format!("{url}/v1/experiments"), &spec).ok()?;
        (status == 200).then_some(())?;
        serde_json::from_value::<SubmitResponse>(body)
            .ok()?
            .experiment
    });
    let pid = wait("the job to run", Duration::from_secs(30), || {
        let d = job(&url, exp)?;
        (d.summary.state == JobState::Running).then_some(())?;
        d.attempts_detail.first()?.pid
    });

    let sent = Instant::now();
    agent.signal(signal).expect("signal");
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .and_then(|s| s.ok_or_else(|| anyhow::anyhow!("still running after 30 s")))
        .unwrap_or_else(|e| panic!("the agent did not exit: {e}\n{}", agent.output()));
    assert!(status.success(), "exit status {status}\n{}", agent.output());
    assert!(!alive(pid), "the job's process is gone");
    // Reported by the agent: ended and requeued now, well before the 60 s TTL.
    let d = job(&url, exp).expect("job");
    let first = &d.attempts_detail[0];
    assert_eq!(first.failure_class, Some(FailureClass::Lost), "{first:?}");
    assert_eq!(first.cleanup_verified, Some(true), "{first:?}");
    assert!(
        first
            .log_tail
            .as_deref()
            .unwrap_or_default()
            .contains("agent shut down"),
        "{first:?}"
    );
    assert!(
        matches!(d.summary.state, JobState::Queued | JobState::Retrying),
        "requeued per its retry policy: {:?}",
        d.summary.state
    );
    assert!(sent.elapsed() < Duration::from_secs(30));
}

#[test]
fn sigterm_stops_reports_and_exits_zero() {
    drains_on(Signal::SIGTERM);
}

#[test]
fn sigint_stops_reports_and_exits_zero() {
    drains_on(Signal::SIGINT);
}

/// A drain whose cleanup outlasts the lease TTL (a leftover that cannot be verified gone):
/// heartbeats keep the lease through it, so the end is reported, not expired, and the GPU's
/// quarantine is recorded.
#[test]
fn a_drain_longer_than_the_ttl_keeps_its_lease_and_reports_the_quarantine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let url = format!("http://127.0.0.1:{port}");
    let coord_args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &dir.path().join("coord").display().to_string(),
        "--lease-ttl",
        "2s",
    ]
    .map(String::from)
    .to_vec();
    let _coord = Proc::start(
        "headroom-coordinator",
        &coord_args,
        dir.path().join("coord.log"),
    )
    .expect("coordinator");
    wait("the coordinator", Duration::from_secs(30), || {
        http_get::<serde_json::Value>(&format!("{url}/v1/health"))
            .ok()
            .map(|_| ())
    });
    let agent_args: Vec<String> = [
        "--coordinator",
        &url,
        "--node",
        "gpu-1",
        "--gpu-backend",
        "fake",
        "--fake-gpus",
        "1x24GiB",
        "--kill-grace",
        "300ms",
        "--verify-timeout",
        "5s",
        "--data-dir",
        &dir.path().join("agent").display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut agent =
        Proc::start("headroom-agent", &agent_args, dir.path().join("agent.log")).expect("agent");
    // A process of another owner on which the job books 3 GiB: cleanup cannot verify the GPU.
    let holder = headroom_integration_tests::KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep"),
    );
    let script = format!(
        "echo 0:3072 > \"$HEADROOM_FAKE_GPU_DIR/{}\" && exec {} --seconds 600",
        holder.0.id(),
        fake_job().display()
    );
    let spec = serde_json::json!({"spec": {"name": "leaky", "command": ["sh", "-c", script],
        "resources": {"memory": "1GiB"}}});
    let exp = wait("a submission", Duration::from_secs(20), || {
        let (status, body) = http_post(&format!("{url}/v1/experiments"), &spec).ok()?;
        (status == 200).then_some(())?;
        serde_json::from_value::<SubmitResponse>(body)
            .ok()?
            .experiment
    });
    wait("the job to run", Duration::from_secs(30), || {
        let d = job(&url, exp)?;
        (d.summary.state == JobState::Running).then_some(())?;
        d.attempts_detail.first()?.pid
    });
    // The booking is in place.
    let booking = dir
        .path()
        .join("agent")
        .join("fake-gpus")
        .join(holder.0.id().to_string());
    wait("the booking", Duration::from_secs(10), || {
        booking.exists().then_some(())
    });

    agent.signal(Signal::SIGTERM).expect("signal");
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .and_then(|s| s.ok_or_else(|| anyhow::anyhow!("still running after 30 s")))
        .unwrap_or_else(|e| panic!("the agent did not exit: {e}\n{}", agent.output()));
    assert!(status.success(), "exit status {status}\n{}", agent.output());
    let d = job(&url, exp).expect("job");
    let first = &d.attempts_detail[0];
    assert_eq!(
        first.cleanup_verified,
        Some(false),
        "the agent's report was taken, not the lease's expiry: {first:?}\n{}",
        agent.output()
    );
    assert_eq!(first.failure_class, Some(FailureClass::Lost));
    let nodes: Vec<headroom_shared::api::NodeView> =
        http_get(&format!("{url}/v1/nodes")).expect("nodes");
    assert!(
        !nodes[0].gpus[0].quarantine.is_empty(),
        "the GPU is quarantined: {nodes:?}"
    );
}
