//! SIGTERM (or SIGINT) to `headroom-agent --on-exit stop`: it stops its attempts with the
//! normal verified cleanup, reports them so the coordinator requeues them per policy at once
//! (not at lease expiry), and exits 0. (The default, `detach`, leaves them running for the
//! next agent: `reattach.rs`.)

use std::time::{Duration, Instant};

use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, job_of, running_pid, submit_json,
};
use headroom_integration_tests::{alive, bystander, fake_job, wait_until as wait};
use headroom_shared::{FailureClass, JobState};
use nix::sys::signal::Signal;

fn drains_on(signal: Signal) {
    let dir = tempfile::tempdir().expect("tempdir");
    // Long: a report left to lease expiry would show.
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "60s"]).expect("coordinator");
    let url = &coord.url;
    let mut agent = Agent::start(
        url,
        dir.path(),
        AgentOptions::node("gpu-1")
            .kill_grace("1s")
            .env("HEADROOM_ON_EXIT", "stop"),
    )
    .expect("agent");
    // Ignores SIGTERM: the cleanup must go through the grace period to SIGKILL.
    let exp = submit_json(
        url,
        &serde_json::json!({"name": "long", "command": [
            fake_job().display().to_string(), "--seconds", "600", "--mem", "1GiB", "--ignore-term"],
            "retry": {"max_attempts": 2}}),
    );
    let pid = running_pid(url, exp);

    let sent = Instant::now();
    let status = agent.stop_with(signal, Duration::from_secs(30));
    assert!(status.success(), "exit status {status}\n{}", agent.output());
    assert!(!alive(pid), "the job's process is gone");
    // Reported by the agent: ended and requeued now, well before the 60 s TTL.
    let d = job_of(url, exp).expect("job");
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
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "2s"]).expect("coordinator");
    let url = &coord.url;
    let mut agent = Agent::start(
        url,
        dir.path(),
        AgentOptions::node("gpu-1")
            .env("HEADROOM_ON_EXIT", "stop")
            .kill_grace("300ms")
            .verify_timeout("5s"),
    )
    .expect("agent");
    // A process of another owner on which the job books 3 GiB: cleanup cannot verify the GPU.
    let holder = bystander();
    let script = format!(
        "echo 0:3072 > \"$HEADROOM_FAKE_GPU_DIR/{}\" && exec {} --seconds 600",
        holder.0.id(),
        fake_job().display()
    );
    let exp = submit_json(
        url,
        &serde_json::json!({"name": "leaky", "command": ["sh", "-c", script],
            "resources": {"memory": "1GiB"}}),
    );
    running_pid(url, exp);
    // The booking is in place.
    let booking = agent.fake_gpu_dir().join(holder.0.id().to_string());
    wait("the booking", Duration::from_secs(10), || {
        booking.exists().then_some(())
    });

    let status = agent.stop_with(Signal::SIGTERM, Duration::from_secs(30));
    assert!(status.success(), "exit status {status}\n{}", agent.output());
    let d = job_of(url, exp).expect("job");
    let first = &d.attempts_detail[0];
    assert_eq!(
        first.cleanup_verified,
        Some(false),
        "the agent's report was taken, not the lease's expiry: {first:?}\n{}",
        agent.output()
    );
    assert_eq!(first.failure_class, Some(FailureClass::Lost));
    let nodes = coord.nodes().expect("nodes");
    assert!(
        !nodes[0].gpus[0].quarantine.is_empty(),
        "the GPU is quarantined: {nodes:?}"
    );
}
