//! Outcomes survive an agent crash: an agent killed with `kill -9` after its job ended and
//! before it reported the end journals the outcome first. Its attempt's supervisor, alive,
//! reports it at once (the agent may never come back); with the supervisor killed too, the
//! agent's next run (same data directory) reports it, within the lease TTL and beyond it (the
//! attempt already recorded lost, its job requeued but not leased again). Either way the job
//! succeeds once, and does not run again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, job_of, submit_json,
};
use headroom_integration_tests::{fake_job, read_records, wait_until as wait};
use headroom_shared::api::JobDetail;
use headroom_shared::{ExperimentId, FailureClass, JobState};

/// The agent's test-only pause between journalling an outcome and reporting it.
const PAUSE_VAR: &str = "HEADROOM_TEST_PAUSE_BEFORE_REPORT";

struct Site {
    dir: tempfile::TempDir,
    coord: Coordinator,
}

impl Site {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let coord = Coordinator::start(dir.path(), &["--lease-ttl", "3s"]).expect("coordinator");
        Self { dir, coord }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("gpu-1")
    }

    /// The node's agent, on its one data directory; `pause_ms` holds each end report back
    /// after it is journalled.
    fn agent(&self, pause_ms: Option<u64>) -> Agent {
        let mut opts = AgentOptions::node("gpu-1")
            .kill_grace("300ms")
            .verify_timeout("5s");
        if let Some(ms) = pause_ms {
            opts = opts.env(PAUSE_VAR, &ms.to_string());
        }
        Agent::start(&self.coord.url, self.dir.path(), opts).expect("agent")
    }

    fn submit(&self, spec: serde_json::Value) -> ExperimentId {
        submit_json(&self.coord.url, &spec)
    }

    fn job(&self, exp: ExperimentId) -> Option<JobDetail> {
        job_of(&self.coord.url, exp)
    }
}

/// The outcomes journalled and not yet acknowledged.
fn journalled(data_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data_dir.join("outcomes"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default()
}

fn starts(record: &Path) -> usize {
    read_records(record)
        .expect("records")
        .iter()
        .filter(|r| r.event == "start")
        .count()
}

/// Runs one short job on an agent that pauses before reporting its end, kills the attempt's
/// supervisor and then the agent with `kill -9` once the outcome is journalled, lets
/// `while_down` look at the coordinator, and restarts the agent on the same data directory:
/// the journalled success is reported, and the job ends succeeded with its one attempt, run
/// once.
fn killed_before_reporting(while_down: impl FnOnce(&Site, ExperimentId)) {
    let site = Site::new();
    let record = site.dir.path().join("timeline.jsonl");
    // Held back long enough that only the kill ends the pause.
    let mut agent = site.agent(Some(600_000));
    let exp = site.submit(serde_json::json!({"name": "short", "command": [
        fake_job().display().to_string(), "--seconds", "0.2", "--record",
        record.display().to_string()],
        "retry": {"max_attempts": 3, "on": ["lost"]}}));
    let entry = wait(
        "the outcome to be journalled",
        Duration::from_secs(30),
        || journalled(&site.data_dir()).pop(),
    );
    kill_supervisors(&agent);
    agent.kill9().expect("kill -9");
    let d = site.job(exp).expect("job");
    assert_eq!(
        d.attempts_detail[0].ended_at, None,
        "the end was not reported before the kill: {d:#?}"
    );
    while_down(&site, exp);

    let agent = site.agent(None);
    let done = wait("the job to end", Duration::from_secs(30), || {
        site.job(exp).filter(|d| d.summary.state.is_terminal())
    });
    assert_eq!(
        done.summary.state,
        JobState::Succeeded,
        "{done:#?}\n{}",
        agent.output()
    );
    assert_eq!(done.attempts_detail.len(), 1, "{:#?}", done.attempts_detail);
    let a = &done.attempts_detail[0];
    assert_eq!((a.failure_class, a.exit_code), (None, Some(0)), "{a:#?}");
    // Taken off once the coordinator acknowledged it, which it does after the job ended.
    wait(
        &format!(
            "the acknowledged outcome to leave the journal ({})",
            entry.display()
        ),
        Duration::from_secs(10),
        || journalled(&site.data_dir()).is_empty().then_some(()),
    );
    // Whatever the agent does next, the job does not run again.
    let more = site.submit(serde_json::json!({"name": "after", "command": [
        fake_job().display().to_string(), "--seconds", "0.1"]}));
    wait("a later job to run", Duration::from_secs(30), || {
        site.job(more)
            .filter(|d| d.summary.state == JobState::Succeeded)
    });
    assert_eq!(starts(&record), 1, "the job ran once");
    assert_eq!(site.job(exp).expect("job").attempts_detail.len(), 1);
}

/// Kills (`-9`) the processes of the agent's scope but the agent: its attempts' supervisors.
fn kill_supervisors(agent: &Agent) {
    let own = agent.pid();
    let pids: Vec<u32> = agent
        .scope_pids()
        .into_iter()
        .filter(|&p| Some(p) != own)
        .collect();
    assert!(!pids.is_empty(), "a supervisor waits");
    for &pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait("the supervisors to die", Duration::from_secs(10), || {
        pids.iter()
            .all(|&p| !headroom_integration_tests::alive(p))
            .then_some(())
    });
}

/// The job's end is journalled and handed to the agent, which is killed (`-9`) before it
/// reports it and never comes back: the supervisor reports it, at once rather than after
/// the lease, so the attempt is not lost and the job does not run again. `reattached`: the
/// agent that took the end had re-attached to the running attempt after a first agent's
/// kill (its supervisor then exits after the end instead of waiting for another launch).
fn gone_for_good_after_the_end(reattached: bool) {
    let site = Site::new();
    let record = site.dir.path().join("timeline.jsonl");
    let seconds = if reattached { "3" } else { "0.2" };
    // Dropped, an agent takes its scope's processes with it: the first is kept to the end.
    let mut first = site.agent(if reattached { None } else { Some(600_000) });
    let exp = site.submit(serde_json::json!({"name": "short", "command": [
        fake_job().display().to_string(), "--seconds", seconds, "--record",
        record.display().to_string()],
        "retry": {"max_attempts": 3, "on": ["lost"]}}));
    let mut again = None;
    if reattached {
        wait("the job to start", Duration::from_secs(30), || {
            read_records(&record).ok().filter(|r| !r.is_empty())
        });
        first.kill9().expect("kill -9");
        let second = site.agent(Some(600_000));
        wait("the re-attach", Duration::from_secs(30), || {
            second.output().contains("re-attached").then_some(())
        });
        again = Some(second);
    }
    let agent = again.as_mut().unwrap_or(&mut first);
    wait(
        "the outcome to be journalled",
        Duration::from_secs(30),
        || journalled(&site.data_dir()).pop(),
    );
    agent.kill9().expect("kill -9");
    // Well within the 3 s TTL, and without any agent.
    let done = wait("the job to end", Duration::from_secs(10), || {
        site.job(exp).filter(|d| d.summary.state.is_terminal())
    });
    assert_eq!(done.summary.state, JobState::Succeeded, "{done:#?}");
    assert_eq!(done.attempts_detail.len(), 1, "{:#?}", done.attempts_detail);
    let a = &done.attempts_detail[0];
    assert_eq!((a.failure_class, a.exit_code), (None, Some(0)), "{a:#?}");
    wait("the journal to be cleared", Duration::from_secs(10), || {
        journalled(&site.data_dir()).is_empty().then_some(())
    });
    // Past the TTL nothing changes: the job is not lost, nor run again.
    std::thread::sleep(Duration::from_secs(4));
    let later = site.job(exp).expect("job");
    assert_eq!(
        later.attempts_detail.len(),
        1,
        "{:#?}",
        later.attempts_detail
    );
    assert_eq!(starts(&record), 1, "the job ran once");
    wait("the supervisor to exit", Duration::from_secs(10), || {
        agent.scope_pids().is_empty().then_some(())
    });
}

#[test]
fn an_agent_gone_for_good_before_reporting_an_end_leaves_it_to_the_supervisor() {
    gone_for_good_after_the_end(false);
}

#[test]
fn a_reattached_agent_gone_before_reporting_an_end_leaves_it_to_the_supervisor() {
    gone_for_good_after_the_end(true);
}

#[test]
fn an_outcome_journalled_before_a_kill9_is_reported_by_the_restarted_agent() {
    killed_before_reporting(|_, _| {});
}

#[test]
fn a_late_outcome_of_a_lost_attempt_is_taken_while_its_job_waits() {
    killed_before_reporting(|site, exp| {
        // Down past the TTL: the attempt is recorded lost and the job requeued; no other
        // agent leases it.
        let d = wait("the attempt to be lost", Duration::from_secs(30), || {
            site.job(exp)
                .filter(|d| d.attempts_detail[0].failure_class == Some(FailureClass::Lost))
        });
        assert_eq!(d.summary.state, JobState::Retrying, "{d:#?}");
    });
}
