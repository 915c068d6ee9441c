//! A coordinator that dies under a running job: the agent keeps the job running, retries
//! with backoff, and its end is accepted once the coordinator is back. Nothing is lost or
//! run twice.

use std::time::Duration;

use headroom_integration_tests::records::DeathWatch;
use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, jobs_of, submit_json,
};
use headroom_integration_tests::{fake_job, wait_until as wait};
use headroom_shared::JobState;
use headroom_shared::api::JobSummary;

#[test]
fn jobs_survive_a_coordinator_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut coord = Coordinator::start(dir.path(), &["--lease-ttl", "20s"]).expect("coordinator");
    let url = coord.url.clone();
    let _agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("gpu-1").kill_grace("1s"),
    )
    .expect("agent");

    let record = dir.path().join("timeline.jsonl");
    let deaths = DeathWatch::start(record.clone());
    // Taken once the agent has registered.
    let exp = submit_json(
        &url,
        &serde_json::json!({"name": "survivor",
            "command": [fake_job().display().to_string(), "--seconds", "3", "--mem", "1GiB",
                        "--record", record.display().to_string()],
            "resources": {"memory": "2GiB"}}),
    );
    wait("the job to run", Duration::from_secs(20), || {
        let jobs = jobs_of(&url, exp)?;
        (jobs[0].state == JobState::Running).then_some(())
    });

    coord.kill9().expect("kill -9 coordinator");
    std::thread::sleep(Duration::from_millis(1500));
    coord.start_again("coord2.log").expect("restart");
    let jobs: Vec<JobSummary> = wait("the job to finish", Duration::from_secs(60), || {
        let jobs = jobs_of(&url, exp)?;
        jobs[0].state.is_terminal().then_some(jobs)
    });
    assert_eq!(jobs[0].state, JobState::Succeeded, "{}", coord.output());
    assert_eq!(jobs[0].attempts, 1, "the job ran once, across the crash");
    // One process, which ran to its end (not stopped and started again).
    let timeline = deaths.finish().expect("the record file");
    let starts: Vec<_> = timeline
        .records
        .iter()
        .filter(|r| r.event == "start")
        .collect();
    assert_eq!(starts.len(), 1, "{:?}", timeline.records);
    assert_eq!(timeline.events(&starts[0].attempt), ["start", "end"]);
}
