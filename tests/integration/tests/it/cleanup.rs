//! Every end of an attempt kills its whole process tree, double-forked orphans included,
//! and the fake GPU memory they held is freed.

use std::time::Duration;

use headroom_integration_tests::{
    Headroom, KillOnDrop, UpOptions, alive, books_for, bystander, fake_job, stat_fields,
    supervisor_pids,
};
use headroom_shared::JobState;
use headroom_shared::pending::PendingReason;

/// The job holds 1 GiB and 300 MiB of host RAM, spawns a grandchild in a new session that
/// holds 4 GiB for ten minutes and ignores SIGTERM, then exits 0 after a second: cleanup
/// kills the orphan and verifies its memory freed, through the attempt's cgroup where the
/// agent gives it one (which also measures the host RAM peak), and through the process tree
/// with `--no-cgroups`.
fn orphan_is_killed_and_its_memory_freed(flags: &[&str]) {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").kill_grace("500ms").flags(flags));
    let pid_file = h.path("orphan.pid");
    let spec = format!(
        r#"{{"name": "orphan", "command": ["{job}", "--mem", "1GiB", "--seconds", "1",
             "--host-mem", "300MiB",
             "--orphan-mem", "4GiB", "--orphan-seconds", "600", "--ignore-term",
             "--orphan-pid-file", "{pid}"], "resources": {{"memory": "6GiB"}}}}"#,
        job = fake_job().display(),
        pid = pid_file.display()
    );
    let exp = h.submit("orphan.json", &spec).expect("submit");
    let orphan: u32 = h.wait_for("the orphan to start", Duration::from_secs(30), || {
        Ok(std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok()))
    });
    assert!(alive(orphan));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    assert!(!alive(orphan), "the orphan {orphan} outlived its attempt");
    let detail = h.job(jobs[0].id).expect("job");
    let attempt = &detail.attempts_detail[0];
    assert_eq!(attempt.cleanup_verified, Some(true));
    assert!(
        attempt.peak_mem_mib.unwrap_or(0) >= 5 * 1024,
        "peak {:?}",
        attempt.peak_mem_mib
    );
    let log = h.server_log();
    if flags.is_empty() && !log.contains("each attempt in its own cgroup") {
        headroom_integration_tests::premise_missing("per-attempt cgroups (root and cgroup v2)");
    }
    if log.contains("each attempt in its own cgroup") {
        assert!(flags.is_empty(), "{log}");
        assert!(
            attempt.host_peak_mib.is_some_and(|p| p >= 300),
            "host RAM peak {:?}",
            attempt.host_peak_mib
        );
    } else {
        assert!(log.contains("per-attempt cgroups unavailable"), "{log}");
        assert_eq!(attempt.host_peak_mib, None);
    }
    // The node reports the memory back once the attempt has ended.
    let used = h.nodes().expect("nodes")[0].gpus[0].used_mib;
    assert_eq!(used, Some(0), "fake memory still held after cleanup");
}

#[test]
fn orphan_that_left_the_session_is_killed_and_its_memory_freed() {
    orphan_is_killed_and_its_memory_freed(&[]);
}

#[test]
fn orphan_is_killed_by_its_process_tree_without_cgroups() {
    orphan_is_killed_and_its_memory_freed(&["--no-cgroups"]);
}

/// A leftover that escaped the attempt's marker (here: fake memory booked on a process of
/// another owner) keeps the GPU quarantined and visible until it is gone, or a person
/// releases the GPU.
#[test]
fn an_unverified_cleanup_quarantines_the_gpu_until_released() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .plan("2")
            .kill_grace("300ms")
            .lease_ttl("3s")
            .flags(&["--verify-timeout", "1s"]),
    );
    let leak = |name: &str| -> KillOnDrop {
        // A process of someone else, on which the job books 3 GiB as it exits.
        let holder = bystander();
        let exp = h.submit_spec(serde_json::json!({"name": name,
            "command": books_for(holder.0.id()), "resources": {"memory": "1GiB"}}));
        let jobs = h.wait_done(exp, Duration::from_secs(30));
        let a = &h.first_attempt(jobs[0].id);
        assert_eq!(a.cleanup_verified, Some(false));
        holder
    };
    let queued_behind = |name: &str| {
        h.submit_spec(
            serde_json::json!({"name": name, "command": ["true"], "resources": {"memory": "1GiB"}}),
        )
    };

    // 1. Quarantine lifts by itself once the leftover is gone.
    let holder = leak("leak1");
    let nodes = h.cli_ok(&["nodes"]);
    assert!(
        nodes.contains("QUARANTINED") && nodes.contains(&format!("pid {}", holder.0.id())),
        "{nodes}"
    );
    let waiting = queued_behind("after-leak1");
    let why = h.wait_refused(waiting, Duration::from_secs(30));
    assert_eq!(
        why,
        PendingReason::GpuQuarantined,
        "placed on a quarantined GPU?"
    );
    assert!(
        alive(holder.0.id()),
        "the leftover of another owner is not killed"
    );
    drop(holder);
    h.wait_done(waiting, Duration::from_secs(30));
    assert!(h.nodes().expect("nodes")[0].gpus[0].quarantine.is_empty());

    // 2. Or a person looks and releases the GPU.
    let _holder = leak("leak2");
    let waiting = queued_behind("after-leak2");
    let why = h.wait_refused(waiting, Duration::from_secs(30));
    assert_eq!(why, PendingReason::GpuQuarantined);
    let out = h.cli_ok(&["node", "release", "test-node", "0"]);
    assert!(out.contains("1 quarantine(s) lifted"), "{out}");
    let jobs = h.wait_done(waiting, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

/// Children a job leaves unreaped become its supervisor's when the job exits (it is their
/// subreaper): the supervisor reaps them, during the attempt and while it waits for the
/// next, so none piles up as a zombie under a supervisor that serves many attempts.
#[test]
fn backgrounded_children_leave_no_zombie_under_any_supervisor() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2").kill_grace("300ms"));
    // The shell becomes a `sleep` that never reaps the two it started: they are zombies
    // when it exits, handed to the supervisor.
    let spec = r#"{"name": "zombies", "command": ["sh", "-c",
        "sleep 0.05 & sleep 0.05 & exec sleep 0.4"],
        "runs_per_config": 6, "resources": {"memory": "1GiB"}}"#;
    let exp = h.submit("zombies.json", spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let supervisors = supervisor_pids(&h.data_dir().join("agent"));
    assert!(
        !supervisors.is_empty(),
        "supervisors wait for the next lease"
    );
    let zombies = || -> Vec<(u32, u32)> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return vec![];
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|p| {
                let f = stat_fields(p)?;
                let parent: u32 = f.get(1)?.parse().ok()?;
                (f.first().map(String::as_str) == Some("Z") && supervisors.contains(&parent))
                    .then_some((p, parent))
            })
            .collect()
    };
    // Reaping follows each exit at once; give the last ones a moment.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !zombies().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        zombies().is_empty(),
        "(zombie, supervisor): {:?}",
        zombies()
    );
}

/// An agent that exits with nothing running removes its attempts' cgroup directory: a node
/// (or a developer's machine running this suite) does not collect one per agent run.
#[test]
fn an_agent_leaves_no_cgroup_directory_behind() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").kill_grace("300ms"));
    let spec = r#"{"name": "one", "command": ["true"]}"#;
    let exp = h.submit("one.json", spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let log = h.server_log();
    let Some(dir) = log
        .lines()
        .find_map(|l| l.split("each attempt in its own cgroup under ").nth(1))
        .and_then(|rest| rest.split(" (").next())
        .map(std::path::PathBuf::from)
    else {
        assert!(log.contains("per-attempt cgroups unavailable"), "{log}");
        return;
    };
    assert!(dir.is_dir(), "{}", dir.display());
    h.stop().expect("stop");
    assert!(!dir.exists(), "{} is left", dir.display());
}
