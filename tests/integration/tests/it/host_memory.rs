//! Host memory admission end to end: a node stating 8 GiB of host memory for jobs runs jobs
//! declaring 3 GiB two at a time whatever its GPU slots, and, with per-attempt cgroups (root),
//! a job that allocates past its limit is killed as `host_oom` while the job beside it on the
//! node runs to its end.

use std::time::{Duration, Instant};

use headroom_integration_tests::{Headroom, UpOptions};
use headroom_shared::{FailureClass, JobState};

#[test]
fn jobs_are_admitted_by_host_memory_and_one_past_its_limit_is_killed_alone() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("4").flags(&[
        "--host-memory",
        "8GiB",
        "--host-headroom",
        "0%",
    ]));
    h.wait_agent();
    let exp = h
        .submit(
            "hostmem.yaml",
            "name: hostmem\ncommand: [sleep, \"1.5\"]\nruns_per_config: 4\n\
             resources: {gpus: 1, memory: 1GiB, host_memory: 3GiB}\n",
        )
        .expect("submit");
    // Four GPU slots, host memory for two: never three at once, and the others say why.
    let (mut most, mut said) = (0, false);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = h.jobs(exp).expect("jobs");
        let on = jobs.iter().filter(|j| j.state.is_active()).count();
        most = most.max(on);
        said |= jobs.iter().any(|j| {
            j.pending_reason
                .as_ref()
                .is_some_and(|r| r.code() == "not_enough_host_memory")
        });
        if jobs.iter().all(|j| j.state == JobState::Succeeded) {
            break;
        }
        assert!(Instant::now() < deadline, "{jobs:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(most, 2, "two of 3 GiB in 8 GiB");
    assert!(said, "the third waited saying host memory");

    // Past its limit: killed by the kernel as host_oom; the job beside it ends well.
    let hog = h
        .submit(
            "hog.yaml",
            "name: hog\ncommand: [python3, -c, \"import time; x = b'x' * (600 * 1024 * 1024); \
             time.sleep(3)\"]\nresources: {gpus: 1, memory: 1GiB, host_memory: 200MiB}\n",
        )
        .expect("submit");
    let calm = h
        .submit(
            "calm.yaml",
            "name: calm\ncommand: [sleep, \"3\"]\n\
             resources: {gpus: 1, memory: 1GiB, host_memory: 200MiB}\n",
        )
        .expect("submit");
    let hog_jobs = h.wait_done(hog, Duration::from_secs(60));
    let calm_jobs = h.wait_done(calm, Duration::from_secs(60));
    assert_eq!(calm_jobs[0].state, JobState::Succeeded, "{calm_jobs:?}");
    if !h.server_log().contains("each attempt in its own cgroup") {
        headroom_integration_tests::premise_missing("per-attempt cgroups (root and cgroup v2)");
        return;
    }
    assert_eq!(hog_jobs[0].state, JobState::Failed, "{hog_jobs:?}");
    assert_eq!(hog_jobs[0].last_failure, Some(FailureClass::HostOom));
    let attempt = h.first_attempt(hog_jobs[0].id);
    assert!(
        attempt
            .log_tail
            .as_deref()
            .is_some_and(|t| t.contains("host_oom: killed by the kernel")),
        "{:?}",
        attempt.log_tail
    );
}
