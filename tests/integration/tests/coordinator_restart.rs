//! A coordinator that dies under a running job: the agent keeps the job running, retries
//! with backoff, and its end is accepted once the coordinator is back. Nothing is lost or
//! run twice.

use std::time::Duration;

use headroom_integration_tests::records::DeathWatch;
use headroom_integration_tests::{
    Proc, fake_job, free_port, http_get as get, http_post, wait_until as wait,
};
use headroom_shared::JobState;
use headroom_shared::api::{JobSummary, SubmitResponse};

#[test]
fn jobs_survive_a_coordinator_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let url = format!("http://127.0.0.1:{port}");
    let coord_args = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        dir.path().join("coord").display().to_string(),
        "--lease-ttl".into(),
        "20s".into(),
    ];
    let mut coord = Proc::start(
        "headroom-coordinator",
        &coord_args,
        dir.path().join("coord.log"),
    )
    .expect("coordinator");
    wait("the coordinator", Duration::from_secs(20), || {
        coord.output().contains("listening").then_some(())
    });
    let agent_args: Vec<String> = [
        "--coordinator",
        &url,
        "--node",
        "gpu-1",
        "--gpu-backend",
        "fake",
        "--fake-gpus",
        "1x24GiB",
        "--kill-grace",
        "1s",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.path().join("agent").display().to_string()])
    .collect();
    let _agent =
        Proc::start("headroom-agent", &agent_args, dir.path().join("agent.log")).expect("agent");

    let record = dir.path().join("timeline.jsonl");
    let deaths = DeathWatch::start(record.clone());
    let spec = serde_json::json!({"spec": {"name": "survivor",
        "command": [fake_job().display().to_string(), "--seconds", "3", "--mem", "1GiB",
                    "--record", record.display().to_string()],
        "resources": {"memory": "2GiB"}}});
    let submitted: SubmitResponse = wait("the agent to register", Duration::from_secs(20), || {
        let (status, body) = http_post(&format!("{url}/v1/experiments"), &spec).ok()?;
        (status == 200).then_some(())?;
        serde_json::from_value(body).ok()
    });
    let exp = submitted.experiment.expect("stored");
    let jobs_url = format!("{url}/v1/jobs?experiment={exp}");
    wait("the job to run", Duration::from_secs(20), || {
        let jobs: Vec<JobSummary> = get(&jobs_url).ok()?;
        (jobs[0].state == JobState::Running).then_some(())
    });

    coord.kill9().expect("kill -9 coordinator");
    std::thread::sleep(Duration::from_millis(1500));
    let coord2 = Proc::start(
        "headroom-coordinator",
        &coord_args,
        dir.path().join("coord2.log"),
    )
    .expect("restart");
    let jobs: Vec<JobSummary> = wait("the job to finish", Duration::from_secs(60), || {
        let jobs: Vec<JobSummary> = get(&jobs_url).ok()?;
        jobs[0].state.is_terminal().then_some(jobs)
    });
    assert_eq!(jobs[0].state, JobState::Succeeded, "{}", coord2.output());
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
