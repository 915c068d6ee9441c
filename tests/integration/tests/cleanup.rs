//! Every end of an attempt kills its whole process tree, double-forked orphans included,
//! and the fake GPU memory they held is freed.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, alive, fake_job};
use headroom_shared::JobState;

#[test]
fn orphan_that_left_the_session_is_killed_and_its_memory_freed() {
    let h = Headroom::start(UpOptions {
        fake_gpus: "1x24GiB".into(),
        kill_grace: "500ms".into(),
        ..Default::default()
    })
    .expect("headroom up");
    let pid_file = h.path("orphan.pid");
    // The job holds 1 GiB, spawns a grandchild in a new session that holds 4 GiB for ten
    // minutes and ignores SIGTERM, then exits 0 after a second.
    let spec = format!(
        r#"{{"name": "orphan", "command": ["{job}", "--mem", "1GiB", "--seconds", "1",
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
    // The node reports the memory back once the attempt has ended.
    let used = h.nodes().expect("nodes")[0].gpus[0].used_mib;
    assert_eq!(used, Some(0), "fake memory still held after cleanup");
}
