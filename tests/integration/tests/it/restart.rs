//! `headroom up` restarted on the same data directory after `kill -9`: queued jobs are still
//! there and run; jobs that were running ran on under their supervisors and the restarted
//! agent re-attaches to them, so each runs once, as the same process, to success.

use std::time::Duration;

use headroom_integration_tests::records::DeathWatch;
use headroom_integration_tests::{
    Headroom, UpOptions, alive, fake_job, kill_supervisors, read_records,
};
use headroom_shared::{FailureClass, JobState};

#[test]
fn restart_after_kill9_keeps_the_queue_and_re_attaches_running_jobs() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    let record = h.path("timeline.jsonl");
    let job = |seconds: &str| {
        serde_json::json!([
            fake_job().display().to_string(),
            "--seconds",
            seconds,
            "--record",
            record.display().to_string()
        ])
    };
    // Submitted first, so it is surely one of the two jobs running at the crash; a lost
    // attempt of it would fail the job.
    let once = h.submit_spec(serde_json::json!({"name": "once", "command": job("4"),
            "retry": {"max_attempts": 1, "on": ["lost"]}, "resources": {"memory": "1GiB"}}));
    let more = h.submit_spec(serde_json::json!({"name": "more", "command": job("4"),
            "runs_per_config": 3, "resources": {"memory": "1GiB"}}));
    let running = h.wait_for("two jobs running", Duration::from_secs(30), || {
        let mut all = h.jobs(more)?;
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
    assert!(
        pids.iter().all(|&p| alive(p)),
        "running jobs outlive the crash"
    );
    h.restart().expect("restart");

    let mut jobs = h.wait_done(more, Duration::from_secs(60));
    jobs.extend(h.wait_done(once, Duration::from_secs(30)));
    for j in &jobs {
        let d = h.job(j.id).expect("job");
        assert_eq!(d.summary.state, JobState::Succeeded, "{d:#?}");
        assert_eq!(
            d.attempts_detail.len(),
            1,
            "ran once: {:#?}",
            d.attempts_detail
        );
    }
    for j in &running {
        assert!(
            pids.contains(&h.first_attempt(j.id).pid.expect("pid")),
            "the running jobs went on as the same processes"
        );
    }
    let starts = read_records(&record)
        .expect("records")
        .iter()
        .filter(|r| r.event == "start")
        .count();
    assert_eq!(starts, 4, "four jobs, four processes");
}

/// `headroom up` with its supervisors killed too (the whole service crashed): the attempts
/// are lost, and the restarted agent kills what is left of them (their orphans) before new
/// work, as the hardening issue's restart sweep says.
#[test]
fn a_crash_that_takes_the_supervisors_loses_their_attempts_and_reruns_them() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("3s"));
    let record = h.path("timeline.jsonl");
    let deaths = DeathWatch::start(record.clone());
    let exp = h.submit_spec(serde_json::json!({"name": "rerun", "command": [
            fake_job().display().to_string(), "--seconds", "600", "--record",
            record.display().to_string()],
            "retry": {"max_attempts": 2, "on": ["lost"]}, "resources": {"memory": "1GiB"}}));
    let jobs = h.wait_for("the job to run", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        Ok((jobs[0].state == JobState::Running).then_some(jobs))
    });
    let pid = h.first_attempt(jobs[0].id).pid.expect("pid");
    h.kill9().expect("kill -9");
    assert_eq!(kill_supervisors(&h.data_dir().join("agent")), 1);
    // Without its supervisor the job dies at once (PR_SET_PDEATHSIG).
    h.wait_for("the job to die", Duration::from_secs(10), || {
        Ok((!alive(pid)).then_some(()))
    });
    h.restart().expect("restart");
    let d = h.wait_for("the job to run again", Duration::from_secs(60), || {
        let d = h.job(jobs[0].id)?;
        Ok((d.attempts_detail.len() == 2 && d.attempts_detail[1].pid.is_some()).then_some(d))
    });
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    let attempts: Vec<String> = d.attempts_detail.iter().map(|a| a.id.to_string()).collect();
    deaths
        .finish()
        .expect("timeline")
        .assert_apart("the job", &attempts)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// The agent and its attempt's supervisor are killed with `kill -9` while a job's
/// double-forked orphan holds GPU memory: the restarted agent kills the orphan (it carries the attempt's marker) before new work.
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
    // Its supervisor dies too (the whole service crashed), leaving the orphan unsupervised.
    assert_eq!(kill_supervisors(&h.data_dir().join("agent")), 1);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(orphan),
        "an orphan outlives a kill -9 of its supervisor (no PDEATHSIG for it)"
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
            .lease_ttl("6s")
            // This test registers for the agent (as the anonymous admin of an open `up`).
            .flags(&["--no-auth"]),
    );
    assert!(
        h.server_log()
            .contains("--no-auth: every local account may submit"),
        "an open up says so:\n{}",
        h.server_log()
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
    // Another registration of the node by its agent instance (its id as before), keeping
    // the attempt: the running agent's id is now unknown to the coordinator.
    let id_file = h.data_dir().join("agent").join("agent.id");
    let previous = std::fs::read_to_string(&id_file).expect("the agent keeps its id");
    let (status, body) = h
        .post(
            "/v1/agents/register",
            &serde_json::json!({"node": node.name, "gpus": gpus, "version": "test",
                "running": [{"attempt": attempt.id, "fence": attempt.fence}],
                "previous": previous.trim()}),
        )
        .expect("register");
    assert_eq!(status, 200, "{body}");
    // Made on the instance's behalf: it keeps the id, as after a registration of its own.
    std::fs::write(&id_file, body["agent"].as_str().expect("agent id")).expect("agent id");
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

/// A supervisor whose attempt ended clean takes the next one (no exec on the way to the
/// job); one whose cleanup could not be verified (its GPU could not be read) exits instead,
/// and the next attempt gets another.
#[test]
fn a_supervisor_takes_the_next_attempt_only_after_a_clean_end() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .flags(&["--verify-timeout", "1s"]),
    );
    let parents = h.path("parents");
    let run = |name: &str, script: &str| {
        let exp = h.submit_spec(serde_json::json!({"name": name, "command": ["sh", "-c",
            format!("echo $PPID >> {}; {script}", parents.display())],
            "resources": {"memory": "100MiB"}}));
        h.wait_done(exp, Duration::from_secs(30))
    };
    let read = || -> Vec<u32> {
        std::fs::read_to_string(&parents)
            .expect("parents")
            .lines()
            .map(|l| l.trim().parse().expect("pid"))
            .collect()
    };
    for i in 0..3 {
        run(&format!("clean{i}"), "true");
    }
    let clean = read();
    assert!(
        clean.windows(2).all(|w| w[0] == w[1]),
        "one supervisor ran the three jobs in turn: {clean:?}"
    );
    // The GPU's process list breaks while the job runs (set by the fake GPUs' own user, as
    // a job's control file does not count): its cleanup cannot be verified.
    let started = h.path("breaks.started");
    let exp = h.submit_spec(serde_json::json!({"name": "breaks", "command": ["sh", "-c",
        format!("echo $PPID >> {}; touch {}; sleep 1", parents.display(), started.display())],
        "resources": {"memory": "100MiB"}}));
    h.wait_for("the job to start", Duration::from_secs(30), || {
        Ok(started.exists().then_some(()))
    });
    std::fs::write(
        h.fake_gpu_dir().join("gpu0.fail-processes"),
        "GPU has fallen off the bus",
    )
    .expect("break the GPU");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(
        h.first_attempt(jobs[0].id).cleanup_verified,
        Some(false),
        "an unreadable GPU was verified clean"
    );
    let broken = read()[3];
    assert_eq!(broken, clean[0], "it ran under the same supervisor");
    h.wait_for("its supervisor to exit", Duration::from_secs(10), || {
        Ok((!alive(broken)).then_some(()))
    });
    std::fs::remove_file(h.fake_gpu_dir().join("gpu0.fail-processes")).expect("heal");
    run("after", "true");
    let after = read()[4];
    assert_ne!(
        after, broken,
        "a supervisor that ended unclean took another attempt"
    );
}
