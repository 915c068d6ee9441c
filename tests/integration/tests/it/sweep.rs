//! The restart sweep: an agent killed with `kill -9` together with its attempts' supervisors
//! and down longer than the lease TTL (its attempt already recorded lost, so the coordinator
//! reports nothing to clean up) kills the
//! orphans of its former attempts before it takes new work, and leaves the jobs of another
//! agent on the same host alone. Quarantines a killed agent left behind lift by themselves
//! once their leftovers are gone.

use std::path::Path;
use std::time::Duration;

use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, job_of, running_pid, submit_json,
};
use headroom_integration_tests::{
    Headroom, UpOptions, alive, books_for, bystander, fake_job, kill_supervisors, scope_pids,
    wait_until as wait,
};
use headroom_shared::{FailureClass, JobState};

fn agent(url: &str, dir: &Path, node: &str, log: &str) -> Agent {
    let opts = AgentOptions::node(node)
        .kill_grace("300ms")
        .verify_timeout("5s")
        .log(log);
    Agent::start(url, dir, opts).expect("agent")
}

#[test]
fn an_agent_down_longer_than_the_ttl_kills_its_orphans_before_taking_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "2s"]).expect("coordinator");
    let url = &coord.url;
    // Another agent of the same host, with a job of its own.
    let _other = agent(url, dir.path(), "other", "other.log");
    let neighbour = submit_json(
        url,
        &serde_json::json!({"name": "neighbour",
            "command": [fake_job().display().to_string(), "--seconds", "600"]}),
    );
    let neighbour_pid = running_pid(url, neighbour);

    let mut first = agent(url, dir.path(), "gpu-1", "agent.log");
    let pid_file = dir.path().join("orphan.pid");
    let orphaner = submit_json(
        url,
        &serde_json::json!({"name": "orphaner", "command": [
            fake_job().display().to_string(), "--seconds", "600", "--orphan-mem", "2GiB",
            "--orphan-seconds", "600", "--orphan-pid-file", pid_file.display().to_string()],
            "retry": {"max_attempts": 1}, "resources": {"memory": "4GiB"}}),
    );
    let orphan: u32 = wait("the orphan", Duration::from_secs(30), || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    first.kill9().expect("kill -9");
    // The attempt's supervisor dies too (the whole service crashed): only the double-forked
    // orphan, which left the job's process group, is left running unsupervised.
    assert_eq!(kill_supervisors(&first.data_dir), 1);
    // Down longer than the TTL: the coordinator records the attempt lost and will not name
    // it to the agent when it comes back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let d = loop {
        if let Some(d) = job_of(url, orphaner).filter(|d| d.summary.state.is_terminal()) {
            break d;
        }
        // Seen once on a loaded machine: what still held the lease, if anything did.
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the attempt to be recorded lost: {:?}\nleft in the agent's \
             scope: {:?}\ncoordinator:\n{}\nagent:\n{}",
            job_of(url, orphaner),
            scope_pids(&first.data_dir)
                .iter()
                .map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " "))
                .collect::<Vec<_>>(),
            coord.output(),
            first.output(),
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    assert!(alive(orphan), "the orphan outlives its agent");

    // New work waits for the agent; when it starts it looks for the orphan.
    let probe = dir.path().join("probe.txt");
    let script = format!(
        "if [ -r /proc/{orphan}/status ] && ! grep -q '^State:.*Z' /proc/{orphan}/status; \
         then echo alive > {p}; else echo gone > {p}; fi",
        p = probe.display()
    );
    let _probe_exp = submit_json(
        url,
        &serde_json::json!({"name": "probe", "command": ["sh", "-c", script],
            "resources": {"memory": "1GiB"}}),
    );
    let restarted = agent(url, dir.path(), "gpu-1", "agent2.log");
    let seen = wait("the probe job", Duration::from_secs(60), || {
        std::fs::read_to_string(&probe)
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(
        seen.trim(),
        "gone",
        "the orphan of the lost attempt was alive when new work started\n{}",
        restarted.output()
    );
    assert!(!alive(orphan));
    assert!(
        alive(neighbour_pid),
        "the other agent's job on the same host must survive the sweep"
    );
}

#[test]
fn a_quarantine_left_by_a_killed_agent_lifts_by_itself_after_its_restart() {
    let mut h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .lease_ttl("3s")
            .flags(&["--verify-timeout", "1s"]),
    );
    // A process of another owner on which the job books 3 GiB as it exits: cleanup cannot
    // verify the GPU, which is quarantined until that process is gone.
    let holder = bystander();
    let exp = h.submit_spec(serde_json::json!({"name": "leak",
        "command": books_for(holder.0.id()), "resources": {"memory": "1GiB"}}));
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let a = &h.first_attempt(jobs[0].id);
    assert_eq!(a.cleanup_verified, Some(false));
    assert!(!h.nodes().expect("nodes")[0].gpus[0].quarantine.is_empty());

    // The agent dies; the leftover goes while it is down.
    h.kill9().expect("kill -9");
    drop(holder);
    h.restart().expect("restart");
    h.wait_for(
        "the quarantine to lift by itself",
        Duration::from_secs(30),
        || {
            Ok(h.nodes()?
                .first()
                .filter(|n| n.alive && n.gpus.first().is_some_and(|g| g.quarantine.is_empty()))
                .map(|_| ()))
        },
    );
    let after = h.submit_spec(serde_json::json!({"name": "after", "command": ["true"],
            "resources": {"memory": "1GiB"}}));
    let jobs = h.wait_done(after, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}
