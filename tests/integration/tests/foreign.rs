//! A process headroom did not start holds GPU memory: jobs that would not fit are not
//! admitted, the process is reported and never killed, and work resumes when it exits.

use std::process::{Command, Stdio};
use std::time::Duration;

use headroom_integration_tests::{Headroom, KillOnDrop, UpOptions, alive, fake_job};
use headroom_shared::JobState;

#[test]
fn foreign_memory_blocks_admission_is_reported_and_left_alone() {
    let h = Headroom::start(UpOptions {
        fake_gpus: "1x24GiB".into(),
        plan: Some("4".into()),
        lease_ttl: "3s".into(),
        ..Default::default()
    })
    .expect("headroom up");
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
    std::thread::sleep(Duration::from_secs(2));
    let jobs = h.jobs(exp).expect("jobs");
    assert_eq!(
        jobs[0].state,
        JobState::Queued,
        "admitted despite foreign memory"
    );
    assert!(alive(pid), "the foreign process must never be killed");

    foreign.0.kill().expect("kill foreign");
    foreign.0.wait().expect("reap foreign");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}

#[test]
fn a_node_configured_to_kill_foreign_processes_frees_its_gpus() {
    let h = Headroom::start(UpOptions {
        fake_gpus: "1x24GiB".into(),
        lease_ttl: "3s".into(),
        extra: vec!["--kill-foreign".into()],
        ..Default::default()
    })
    .expect("headroom up");
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
    KillOnDrop(
        Command::new(fake_job())
            .args(["--mem", "20GiB", "--seconds", "600"])
            .env("HEADROOM_FAKE_GPU_DIR", h.data_dir().join("fake-gpus"))
            .env("HEADROOM_FAKE_GPUS", "1x24GiB")
            .env("CUDA_VISIBLE_DEVICES", "0")
            .stdout(Stdio::null())
            .spawn()
            .expect("foreign process"),
    )
}
