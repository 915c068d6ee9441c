//! `headroom plan set` changes concurrency at run time, without restarting anything.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job};
use headroom_shared::JobState;

#[test]
fn plan_set_at_run_time_changes_concurrency() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("1"));
    let spec = format!(
        r#"{{"name": "p", "command": ["{job}", "--seconds", "600"], "runs_per_config": 4,
             "resources": {{"memory": "2GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("p.json", &spec).expect("submit");
    let running = || -> anyhow::Result<usize> {
        Ok(h.jobs(exp)?
            .iter()
            .filter(|j| j.state == JobState::Running)
            .count())
    };
    h.wait_for("one job running", Duration::from_secs(30), || {
        Ok((running()? == 1).then_some(()))
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(running().expect("jobs"), 1, "plan 1 runs one job");

    // Bad plans are refused with the position named, and change nothing.
    let out = h.cli(&["plan", "set", "test-node", "3,x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plan") && err.contains("entry 2"), "{err}");
    let out = h.cli(&["plan", "set", "test-node", "1,1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 GPUs"));

    let out = h.cli_ok(&["plan", "set", "test-node", "3"]);
    assert!(out.contains("plan is now 3"), "{out}");
    h.wait_for("three jobs running", Duration::from_secs(30), || {
        Ok((running()? == 3).then_some(()))
    });
    let nodes = h.cli_ok(&["nodes"]);
    assert!(nodes.contains("plan 3") && nodes.contains("3/3"), "{nodes}");
    h.cli_ok(&["cancel", "p"]);
}
