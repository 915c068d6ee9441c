//! Outcomes survive an agent crash: an agent killed with `kill -9` after its job ended and
//! before it reported the end journals the outcome first, and its next run (same data
//! directory) reports it, within the lease TTL and beyond it (the attempt already recorded
//! lost, its job requeued but not leased again): the job succeeds once, and does not run
//! again.

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

/// Runs one short job on an agent that pauses before reporting its end, kills the agent
/// with `kill -9` once the outcome is journalled, lets `while_down` look at the coordinator,
/// and restarts the agent on the same data directory: the journalled success is reported,
/// and the job ends succeeded with its one attempt, run once.
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
    assert!(
        journalled(&site.data_dir()).is_empty(),
        "the acknowledged outcome leaves the journal ({})",
        entry.display()
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
