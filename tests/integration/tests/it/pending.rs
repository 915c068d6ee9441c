//! Pending reasons end to end: a job that cannot fit says so at submit, in `headroom ls`,
//! in `headroom show` and in the API, instead of waiting silently.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job};
use headroom_shared::JobState;
use headroom_shared::pending::PendingReason;

#[test]
fn a_job_larger_than_every_gpu_says_so_everywhere() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB"));
    // The agent must have registered for the submit check to know the GPUs.
    h.wait_agent();
    let spec = h.path("huge.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: huge\ncommand: [\"{}\", \"--seconds\", \"1\"]\nresources: {{memory: 10PiB}}\n",
            fake_job().display()
        ),
    )
    .expect("write spec");
    let out = h.cli(&["submit", spec.to_str().unwrap_or_default()]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: resources.memory: larger than every GPU"),
        "submit warns: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let exp = stdout
        .split('(')
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no experiment id in `{stdout}`"));

    // A claim pass looks at it and stores why it waits, with the figures.
    let job = h.wait_for("a pending reason", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        Ok(jobs.into_iter().find(|j| {
            matches!(
                j.pending_reason,
                Some(PendingReason::LargerThanEveryGpu { .. })
            )
        }))
    });
    assert_eq!(job.state, JobState::Queued);
    let Some(PendingReason::LargerThanEveryGpu {
        needed_mib,
        largest_mib,
    }) = job.pending_reason
    else {
        unreachable!()
    };
    assert_eq!(needed_mib, 10 * 1024 * 1024 * 1024);
    assert!(largest_mib < 24 * 1024, "less headroom: {largest_mib}");

    let ls = h.cli_ok(&["ls"]);
    assert!(ls.contains("WAITING"), "{ls}");
    assert!(ls.contains("larger_than_every_gpu"), "{ls}");
    let show = h.cli_ok(&["show", &job.id.to_string()]);
    assert!(
        show.contains("waiting    larger than every GPU: needs 10485760GiB"),
        "{show}"
    );
}

#[test]
fn jobs_that_fit_but_wait_say_why_and_run_when_they_can() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    // One slot: the second job waits for it.
    let exp = h
        .submit(
            "two.yaml",
            &format!(
                "name: two\ncommand: [\"{}\", \"--seconds\", \"3\"]\nruns_per_config: 2\nresources: {{memory: 1GiB}}\n",
                fake_job().display()
            ),
        )
        .expect("submit");
    let waiting = h.wait_for("a job waiting for a slot", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        Ok(jobs
            .into_iter()
            .find(|j| j.pending_reason == Some(PendingReason::NoFreeSlot)))
    });
    assert_eq!(waiting.state, JobState::Queued);
    let show = h.cli_ok(&["show", &waiting.id.to_string()]);
    assert!(
        show.contains("waiting    no free slot on any GPU"),
        "{show}"
    );
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    assert!(
        jobs.iter().all(|j| j.pending_reason.is_none()),
        "ended jobs do not wait: {jobs:?}"
    );
}
