//! `headroom up` restarted on the same data directory: queued jobs are still there and run;
//! jobs that were running are recorded as lost and requeued if their retry policy allows.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, alive, fake_job};
use headroom_shared::{FailureClass, JobState};

#[test]
fn restart_after_kill9_keeps_queue_and_requeues_lost_jobs() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    let job = fake_job();
    let flag = h.path("second-life");
    // Runs for a long time in its first life, briefly once the flag file exists.
    let script = format!(
        "if [ -e {f} ]; then exec {job} --seconds 0.2; else exec {job} --seconds 600; fi",
        f = flag.display(),
        job = job.display()
    );
    // Submitted first, so it is surely one of the two jobs running at the crash.
    let once = h.submit_spec(
        serde_json::json!({"name": "once", "command": ["sh", "-c", script],
            "retry": {"max_attempts": 1, "on": ["lost"]}, "resources": {"memory": "1GiB"}}),
    );
    let retried = h.submit_spec(
        serde_json::json!({"name": "retried", "command": ["sh", "-c", script],
            "runs_per_config": 3, "resources": {"memory": "1GiB"}}),
    );
    let running = h.wait_for("two jobs running", Duration::from_secs(30), || {
        let mut all = h.jobs(retried)?;
        all.extend(h.jobs(once)?);
        let r: Vec<_> = all
            .into_iter()
            .filter(|j| j.state == JobState::Running)
            .collect();
        Ok((r.len() == 2).then_some(r))
    });
    let pids: Vec<u32> = running
        .iter()
        .map(|j| h.first_attempt(j.id).pid.expect("pid"))
        .collect();

    h.kill9().expect("kill -9");
    // The jobs die with their agent (PR_SET_PDEATHSIG), they do not linger as orphans.
    h.wait_for(
        "the jobs to die with the agent",
        Duration::from_secs(10),
        || Ok(pids.iter().all(|&p| !alive(p)).then_some(())),
    );
    std::fs::write(&flag, "").expect("flag");
    h.restart().expect("restart");

    let jobs = h.wait_done(retried, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:#?}"
    );
    let once_job = &h.wait_done(once, Duration::from_secs(30))[0];
    let d = h.job(once_job.id).expect("job");
    assert_eq!(
        d.summary.state,
        JobState::Failed,
        "max_attempts 1: not requeued"
    );
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    // The one job of `retried` that was running got a second, successful attempt.
    let lost: Vec<_> = jobs
        .iter()
        .map(|j| h.job(j.id).expect("job"))
        .filter(|d| {
            d.attempts_detail
                .iter()
                .any(|a| a.failure_class == Some(FailureClass::Lost))
        })
        .collect();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].attempts_detail.len(), 2);
    assert_eq!(lost[0].attempts_detail[1].success, Some(true));
}

/// The agent is killed with `kill -9` while a job's double-forked orphan holds GPU memory:
/// the restarted agent kills the orphan (it carries the attempt's marker) before new work.
#[test]
fn restarted_agent_kills_orphans_of_its_former_attempts() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let pid_file = h.path("orphan.pid");
    let spec = serde_json::json!({"name": "orphaner", "command": [
        fake_job().display().to_string(), "--seconds", "600", "--orphan-mem", "2GiB",
        "--orphan-seconds", "600", "--ignore-term", "--orphan-pid-file", pid_file.display().to_string()],
        "retry": {"max_attempts": 1}, "resources": {"memory": "4GiB"}});
    let exp = h.submit_spec(spec);
    let orphan: u32 = h.wait_for("the orphan", Duration::from_secs(30), || {
        Ok(std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok()))
    });
    h.kill9().expect("kill -9");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(orphan),
        "an orphan outlives a kill -9 of its agent (no PDEATHSIG for it)"
    );
    h.restart().expect("restart");
    h.wait_for("the orphan to be killed", Duration::from_secs(20), || {
        Ok((!alive(orphan)).then_some(()))
    });
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    let used = h.wait_for("telemetry after restart", Duration::from_secs(20), || {
        Ok(h.nodes()?[0].gpus[0].used_mib)
    });
    assert_eq!(used, 0, "the orphan's fake memory is gone");
}

#[test]
fn a_second_headroom_up_on_the_same_data_dir_is_refused() {
    let h = Headroom::up(UpOptions::default());
    let out = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--gpu-backend",
            "fake",
            "--data-dir",
        ])
        .arg(h.data_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("second headroom up");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another `headroom up` is using the data dir"),
        "{err}"
    );
    // The first one is undisturbed.
    h.wait_for("the first one's node", Duration::from_secs(20), || {
        Ok(h.nodes()?.first().filter(|n| n.alive).map(|_| ()))
    });
}

/// The coordinator forgets an agent while its job runs (another registration took the
/// node): the agent registers again, declares the attempt it still runs with its token, and
/// keeps it: the job runs on, once, to success.
#[test]
fn an_agent_registering_again_resumes_its_running_attempt() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            // Heartbeats every 2 s: the agent hears it was forgotten well before its job ends.
            .lease_ttl("6s"),
    );
    let record = h.path("timeline.jsonl");
    let deaths = headroom_integration_tests::records::DeathWatch::start(record.clone());
    let exp = h.submit_spec(serde_json::json!({"name": "resumed",
            "command": [fake_job().display().to_string(), "--seconds", "8", "--mem", "1GiB",
                        "--record", record.display().to_string()],
            "retry": {"max_attempts": 1}, "resources": {"memory": "2GiB"}}));
    let attempt = h.wait_for("the job to run", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        if jobs[0].state != JobState::Running {
            return Ok(None);
        }
        Ok(h.job(jobs[0].id)?.attempts_detail.first().cloned())
    });
    let node = h.nodes().expect("nodes").remove(0);
    let gpus: Vec<serde_json::Value> = node
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({"index": g.index, "uuid": g.uuid, "name": g.name,
                               "total_mib": g.total_mib})
        })
        .collect();
    // Another registration of the node, keeping the attempt: the running agent's id is
    // now unknown to the coordinator.
    let (status, body) = h
        .post(
            "/v1/agents/register",
            &serde_json::json!({"node": node.name, "gpus": gpus, "version": "test",
                "running": [{"attempt": attempt.id, "fence": attempt.fence}]}),
        )
        .expect("register");
    assert_eq!(status, 200, "{body}");
    h.wait_for(
        "the agent to register again",
        Duration::from_secs(30),
        || Ok(h.server_log().contains("registering again").then_some(())),
    );
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(
        d.summary.state,
        JobState::Succeeded,
        "{:#?}",
        d.attempts_detail
    );
    assert_eq!(d.attempts_detail.len(), 1, "{:#?}", d.attempts_detail);
    let timeline = deaths.finish().expect("records");
    assert_eq!(
        timeline.events(&attempt.id.to_string()),
        ["start", "end"],
        "one process, never stopped"
    );
}
