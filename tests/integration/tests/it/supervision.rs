//! How the agent runs a job, seen from outside: under a supervisor process of its own (the
//! agent's child, in a session of its own, the child subreaper of the job's tree: a
//! double-forked grandchild re-parents to it, not to init), in a session and process group of
//! its own, and an attempt is flagged contaminated when a foreign process shares its GPU.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job};
use headroom_shared::JobState;

/// (ppid, pgid, sid) of a process, from `/proc/PID/stat`.
fn ids(pid: u32) -> Option<(u32, u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ids_of(&stat)
}

fn ids_of(stat: &str) -> Option<(u32, u32, u32)> {
    // After the command in parentheses: state ppid pgrp session ...
    let mut f = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    Some((
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    ))
}

fn read_pid(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A job that notes its own ids, leaves a double-forked grandchild (its parent exits at
/// once) and sleeps; returns the job's pid, the grandchild's pid and the agent's pid.
fn job_with_grandchild(h: &Headroom) -> (u32, u32, u32) {
    let stat = h.path("job.stat");
    let gc = h.path("grandchild.pid");
    let script = format!(
        "cat /proc/$$/stat > {stat}.tmp && mv {stat}.tmp {stat}; \
         (sleep 120 & echo $! > {gc}.tmp; mv {gc}.tmp {gc}); exec sleep 120",
        stat = stat.display(),
        gc = gc.display()
    );
    h.submit_spec(
        serde_json::json!({"name": "forker", "command": ["sh", "-c", script],
        "resources": {"memory": "1GiB"}}),
    );
    let job = h.wait_for("the job's ids", Duration::from_secs(30), || {
        Ok(std::fs::read_to_string(&stat).ok())
    });
    let job_pid: u32 = job
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid in stat");
    let grandchild = h.wait_for("the grandchild", Duration::from_secs(30), || {
        Ok(read_pid(&gc))
    });
    (job_pid, grandchild, h.pid().expect("headroom up runs"))
}

#[test]
fn a_job_leads_a_session_and_process_group_of_its_own() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let (job, _, agent) = job_with_grandchild(&h);
    let stat = std::fs::read_to_string(h.path("job.stat")).expect("stat");
    let (_, job_pgid, job_sid) = ids_of(&stat).expect("job ids");
    let (_, agent_pgid, agent_sid) = ids(agent).expect("agent ids");
    assert_eq!(
        (job_pgid, job_sid),
        (job, job),
        "the job leads its own group and session"
    );
    assert_ne!(
        job_pgid, agent_pgid,
        "the job shares the agent's process group"
    );
    assert_ne!(job_sid, agent_sid, "the job shares the agent's session");
}

#[test]
fn a_double_forked_grandchild_reparents_to_the_attempts_supervisor_not_to_init() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let (job, grandchild, agent) = job_with_grandchild(&h);
    let (supervisor, _, _) = ids(job).expect("job ids");
    let (supervisor_parent, supervisor_pgid, supervisor_sid) =
        ids(supervisor).expect("supervisor ids");
    assert_eq!(supervisor_parent, agent, "the agent starts the supervisor");
    assert_eq!(
        (supervisor_pgid, supervisor_sid),
        (supervisor, supervisor),
        "the supervisor leaves the agent's session (a Ctrl-C to the agent does not reach it)"
    );
    // Its parent (a subshell of the job) exits at once; until then the parent is not yet
    // the final one.
    let parent = h.wait_for(
        "the grandchild to lose its parent",
        Duration::from_secs(10),
        || {
            let (ppid, _, _) = ids(grandchild).ok_or_else(|| anyhow::anyhow!("grandchild gone"))?;
            let subshell =
                ppid != job && ppid != supervisor && ids(ppid).is_some_and(|(pp, _, _)| pp == job);
            Ok((!subshell).then_some(ppid))
        },
    );
    assert_eq!(
        parent, supervisor,
        "the orphan re-parented to {parent}, not to its supervisor {supervisor} (no child \
         subreaper?)"
    );
}

#[test]
fn a_foreign_process_during_the_run_flags_the_attempt_contaminated() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let pid_file = h.path("job.pid");
    let spec = |name: &str, pid: &std::path::Path| {
        serde_json::json!({"name": name,
            "command": [fake_job().display().to_string(), "--mem", "1GiB", "--seconds", "6",
                        "--pid-file", pid.display().to_string()],
            "resources": {"memory": "2GiB"}})
    };
    // Alone on its GPU: clean.
    let clean_pid = h.path("clean.pid");
    let clean = h.submit_spec(spec("clean", &clean_pid));
    let jobs = h.wait_done(clean, Duration::from_secs(60));
    let a = &h.first_attempt(jobs[0].id);
    assert_eq!(a.contaminated, Some(false), "nothing else ran: {a:#?}");
    assert_eq!(a.measurements.contamination_reason, None, "{a:#?}");

    let exp = h.submit_spec(spec("shared", &pid_file));
    h.wait_for(
        "the job to hold its memory",
        Duration::from_secs(30),
        || Ok(read_pid(&pid_file)),
    );
    // Someone's notebook appears on the job's GPU while it runs, for a few samples (one a
    // second at most), and is gone before the job ends.
    let foreign = h.foreign_job("1x24GiB", &["--mem", "2GiB", "--seconds", "3"]);
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = &h.first_attempt(jobs[0].id);
    assert_eq!(a.contaminated, Some(true), "{a:#?}");
    // Who it was, as seen while the job ran: the notebook's pid and command, and why.
    let m = &a.measurements;
    assert_eq!(m.contamination_pid, Some(foreign.0.id()), "{a:#?}");
    assert!(
        m.contamination_command
            .as_deref()
            .is_some_and(|c| c.contains("headroom-fake-job --mem 2GiB --seconds 3")),
        "{a:#?}"
    );
    assert_eq!(
        m.contamination_reason.as_deref(),
        Some("a process of no attempt held 2048 MiB on GPU 0 during the run"),
        "{a:#?}"
    );
    let shown = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(
        shown.contains(&format!(
            "contaminated: a process of no attempt held 2048 MiB on GPU 0 during the run (pid {}",
            foreign.0.id()
        )),
        "{shown}"
    );
}
