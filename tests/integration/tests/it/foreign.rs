//! A process headroom did not start holds GPU memory: jobs that would not fit are not
//! admitted, the process is reported and never killed, and work resumes when it exits.

use std::time::Duration;

use headroom_integration_tests::{Headroom, KillOnDrop, UpOptions, alive, fake_job};
use headroom_shared::JobState;
use headroom_shared::pending::PendingReason;

#[test]
fn foreign_memory_blocks_admission_is_reported_and_left_alone() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("4").lease_ttl("3s"));
    // Someone's notebook: 20 GiB on GPU 0, outside headroom.
    let mut foreign = notebook(&h);
    let pid = foreign.0.id();
    h.wait_for(
        "the foreign process to be reported",
        Duration::from_secs(20),
        || {
            let nodes = h.nodes()?;
            let Some(gpu) = nodes.first().and_then(|n| n.gpus.first()) else {
                return Ok(None); // the agent has not registered yet
            };
            Ok(gpu
                .foreign
                .iter()
                .any(|p| p.pid == pid && p.used_mib == 20 * 1024)
                .then_some(()))
        },
    );
    let nodes = h.cli_ok(&["nodes"]);
    assert!(
        nodes.contains(&format!("foreign process {pid}")) && nodes.contains("headroom-fake-job"),
        "{nodes}"
    );

    // 24 GiB - 2.4 GiB headroom - 20 GiB held leaves 1.6 GiB: a 4 GiB job must wait.
    let spec = format!(
        r#"{{"name": "wait-for-memory", "command": ["{job}", "--mem", "3GiB", "--seconds", "0.2"],
             "resources": {{"memory": "4GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("w.json", &spec).expect("submit");
    let why = h.wait_refused(exp, Duration::from_secs(30));
    assert!(
        matches!(why, PendingReason::NotEnoughMemory { .. }),
        "admitted despite foreign memory? {why:?}"
    );
    assert!(alive(pid), "the foreign process must never be killed");

    foreign.0.kill().expect("kill foreign");
    foreign.0.wait().expect("reap foreign");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

#[test]
fn a_node_configured_to_kill_foreign_processes_frees_its_gpus() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .lease_ttl("3s")
            .flags(&["--kill-foreign"]),
    );
    let mut foreign = notebook(&h);
    let pid = foreign.0.id();
    h.wait_for(
        "the foreign process to be killed",
        Duration::from_secs(20),
        || Ok(foreign.0.try_wait()?.map(|_| ())),
    );
    assert!(!alive(pid));
    let spec = format!(
        r#"{{"name": "needs-it", "command": ["{job}", "--mem", "18GiB", "--seconds", "0.2"],
             "resources": {{"memory": "19GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("n.json", &spec).expect("submit");
    assert_eq!(
        h.wait_done(exp, Duration::from_secs(30))[0].state,
        JobState::Succeeded
    );
    assert!(h.server_log().contains("killing a foreign process"));
}

/// Someone's notebook, started outside headroom: 20 GiB of fake memory on GPU 0.
fn notebook(h: &Headroom) -> KillOnDrop {
    h.foreign_job("1x24GiB", &["--mem", "20GiB", "--seconds", "600"])
}

/// `--kill-foreign` kills only a process seen foreign on two heartbeats in a row: short-lived
/// ones, each alive for less than one heartbeat interval, are seen at most once and live on;
/// a lasting one dies.
#[test]
fn kill_foreign_spares_a_process_seen_once_and_kills_one_seen_twice() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            // Heartbeats every 2 s (a third of the TTL).
            .lease_ttl("6s")
            .flags(&["--kill-foreign"]),
    );
    h.wait_agent();
    // Back to back, so that every heartbeat of these 8 s sees one of them.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..8 {
        let mut short = notebook_for(&h, "1.0");
        let pid = short.0.id();
        let status = loop {
            if let Some(st) = short.0.try_wait().expect("wait") {
                break st;
            }
            if let Ok(nodes) = h.nodes() {
                let on_gpu = nodes.iter().flat_map(|n| &n.gpus).flat_map(|g| &g.foreign);
                if on_gpu.into_iter().any(|p| p.pid == pid) {
                    seen.insert(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            status.code(),
            Some(0),
            "a foreign process seen once was killed ({status})\n{}",
            h.server_log()
        );
    }
    assert!(
        !seen.is_empty(),
        "no short foreign process was ever reported: the rule was not exercised"
    );
    assert!(!h.server_log().contains("killing a foreign process"));

    let mut lasting = notebook_for(&h, "600");
    let status = h.wait_for(
        "the lasting foreign process to be killed",
        Duration::from_secs(20),
        || Ok(lasting.0.try_wait()?),
    );
    assert!(!status.success(), "{status}");
    assert!(h.server_log().contains("killing a foreign process"));
}

/// Live memory filled by someone else between the claim and the launch: the agent hands the
/// lease back instead of launching, the attempt is not counted, the job runs on the other
/// GPU, and the coordinator avoids the handed-back GPU for a while even once it is free.
#[test]
fn a_lease_that_no_longer_fits_at_launch_is_handed_back_and_its_gpu_avoided() {
    let h = Headroom::up(
        UpOptions::gpus("2x24GiB")
            // Heartbeats every 20 s: the coordinator's figures come from the claim.
            .lease_ttl("60s"),
    );
    h.wait_agent();
    // The idle agent's claim is waiting, with the free memory it read before this.
    std::thread::sleep(Duration::from_millis(500));
    let mut foreign = notebook_for(&h, "600");
    h.wait_for("the foreign memory", Duration::from_secs(10), || {
        let dir = h.fake_gpu_dir();
        Ok(std::fs::read_dir(dir)?
            .flatten()
            .any(|f| f.file_name().to_string_lossy().parse::<u32>().is_ok())
            .then_some(()))
    });
    let job = |name: &str, seconds: &str| {
        h.submit_spec(serde_json::json!({"name": name,
            "command": [fake_job().display().to_string(), "--mem", "3GiB", "--seconds", seconds],
            "resources": {"memory": "4GiB"}}))
    };
    let late = job("late", "2");
    let running = h.wait_for("the job to run", Duration::from_secs(30), || {
        let jobs = h.jobs(late)?;
        Ok((jobs[0].state == JobState::Running).then(|| jobs[0].clone()))
    });
    let log = h.server_log();
    assert!(log.contains("handing lease back"), "{log}");
    // The GPU is free again before the job ends, so its end reports it free.
    foreign.0.kill().expect("kill the foreign process");
    foreign.0.wait().expect("reap it");
    let jobs = h.wait_done(late, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let d = h.job(running.id).expect("job");
    assert_eq!(
        jobs[0].attempts, 1,
        "the handed-back lease counted as an attempt"
    );
    assert_eq!(d.attempts_detail.len(), 1, "{:#?}", d.attempts_detail);
    assert_eq!(
        d.attempts_detail[0].gpus,
        [1],
        "placed on the full GPU again"
    );
    // Both GPUs are free and equal, and the best fit would take GPU 0: only the avoidance
    // after the hand-back (30 s) sends the next job to GPU 1.
    let next = job("next", "0.2");
    let jobs = h.wait_done(next, Duration::from_secs(60));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(
        d.attempts_detail[0].gpus,
        [1],
        "the handed-back GPU was not avoided"
    );
}

/// A process outside headroom holding 20 GiB on GPU 0 for `seconds`.
fn notebook_for(h: &Headroom, seconds: &str) -> KillOnDrop {
    let n = h.nodes().ok().and_then(|n| n.first().map(|n| n.gpus.len()));
    h.foreign_job(
        &format!("{}x24GiB", n.unwrap_or(1)),
        &["--mem", "20GiB", "--seconds", seconds],
    )
}

/// Whether this `headroom up` gives each attempt a cgroup (root, or a delegated subtree):
/// its agent says so at start.
fn uses_cgroups(h: &Headroom) -> bool {
    let uses = h.server_log().contains("each attempt in its own cgroup");
    if !uses {
        headroom_integration_tests::premise_missing("per-attempt cgroups (root and cgroup v2)");
    }
    uses
}

/// A job that clears its environment (`env -i`, as `apptainer --cleanenv` or `sudo` do) is
/// still its attempt's own: its cgroup says so, not the marker it dropped. Its GPU memory is
/// its peak, it is not contaminated by itself, and a node that kills foreign processes
/// leaves it alone.
#[test]
fn a_job_that_clears_its_environment_is_still_its_attempts_own() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .flags(&["--kill-foreign"]),
    );
    let spec = serde_json::json!({"name": "cleanenv", "command": [
        "env", "-i",
        format!("HEADROOM_FAKE_GPU_DIR={}", h.fake_gpu_dir().display()),
        "HEADROOM_FAKE_GPUS=1x24GiB", "CUDA_VISIBLE_DEVICES=0",
        fake_job().display().to_string(), "--mem", "2GiB", "--seconds", "4"],
        "resources": {"memory": "3GiB"}});
    let exp = h
        .submit("cleanenv.json", &spec.to_string())
        .expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    if !uses_cgroups(&h) {
        // Without cgroups only the marker tells, and this job dropped it: documented.
        assert!(h.server_log().contains("per-attempt cgroups unavailable"));
        return;
    }
    assert_eq!(jobs[0].state, JobState::Succeeded, "{}", h.server_log());
    let a = h.first_attempt(jobs[0].id);
    assert_eq!(a.exit_code, Some(0), "killed as foreign? {a:#?}");
    assert_eq!(
        a.contaminated,
        Some(false),
        "contaminated by itself: {a:#?}"
    );
    assert_eq!(a.peak_mem_mib, Some(2048), "{a:#?}");
    assert!(
        !h.server_log().contains("killing foreign"),
        "{}",
        h.server_log()
    );
}

/// A process outside every attempt that carries an attempt's marker (forged, or a leftover
/// of a copied environment) is not that attempt's: its memory is not the attempt's peak,
/// and it contaminates the attempt's figures as the foreign process it is.
#[test]
fn a_forged_marker_does_not_make_a_process_an_attempts() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").kill_grace("300ms"));
    let spec = format!(
        r#"{{"name": "real", "command": ["{job}", "--mem", "2GiB", "--seconds", "5"],
             "resources": {{"memory": "3GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("real.json", &spec).expect("submit");
    let attempt = h.wait_for("the attempt to run", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        let d = h.job(jobs[0].id)?;
        Ok(d.attempts_detail
            .first()
            .filter(|a| a.pid.is_some())
            .map(|a| a.id))
    });
    let forger = KillOnDrop(
        std::process::Command::new(fake_job())
            .args(["--mem", "1GiB", "--seconds", "600"])
            .env("HEADROOM_FAKE_GPU_DIR", h.fake_gpu_dir())
            .env("HEADROOM_FAKE_GPUS", "1x24GiB")
            .env("CUDA_VISIBLE_DEVICES", "0")
            .env("HEADROOM_ATTEMPT_ID", attempt.to_string())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("forger"),
    );
    // Seen on the GPU beside the attempt for a while, then gone before the job ends (its
    // memory would otherwise keep the cleanup unverified, as foreign memory must).
    std::thread::sleep(Duration::from_secs(2));
    drop(forger);
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    if !uses_cgroups(&h) {
        return;
    }
    let a = h.first_attempt(jobs[0].id);
    assert_eq!(
        a.peak_mem_mib,
        Some(2048),
        "the forger's 1 GiB counted: {a:#?}"
    );
    assert_eq!(
        a.contaminated,
        Some(true),
        "a foreign process used its GPU: {a:#?}"
    );
    assert_eq!(a.cleanup_verified, Some(true), "{a:#?}");
}
