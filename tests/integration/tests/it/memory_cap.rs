//! A hard GPU memory cap per attempt end to end, on fake GPUs that can hold attempts to one:
//! a job that grows past its estimate runs out of memory at its own cap (`cap_hit`) while the
//! job beside it on the same GPU runs to its end, and a job with `memory_cap: off` gets none.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job};
use headroom_shared::api::OomCause;
use headroom_shared::{FailureClass, JobState};

#[test]
fn a_job_that_grows_past_its_cap_fails_alone_and_says_so() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    h.wait_agent();
    std::fs::write(h.fake_gpu_dir().join("memory-caps"), "").expect("caps on");
    let job = fake_job().display().to_string();
    // Placed by 4 GiB each: the grower takes 8 GiB at its second second.
    let grower = h
        .submit(
            "grower.yaml",
            &format!(
                "name: grower\ncommand: [{job}, --mem, 2GiB, --grow, 6GiB, --grow-after, \"1\", \
                 --seconds, \"4\"]\nresources: {{gpus: 1, memory: 4GiB}}\n"
            ),
        )
        .expect("submit");
    let steady = h
        .submit(
            "steady.yaml",
            &format!(
                "name: steady\ncommand: [{job}, --mem, 3GiB, --seconds, \"3\"]\n\
                 resources: {{gpus: 1, memory: 4GiB}}\n"
            ),
        )
        .expect("submit");
    let grown = h.wait_done(grower, Duration::from_secs(60));
    let calm = h.wait_done(steady, Duration::from_secs(60));
    assert_eq!(calm[0].state, JobState::Succeeded, "{calm:?}");
    assert_eq!(
        grown[0].state,
        JobState::Failed,
        "{grown:?} {:?}",
        h.first_attempt(grown[0].id).log_tail
    );
    assert_eq!(grown[0].last_failure, Some(FailureClass::Oom));
    let a = h.first_attempt(grown[0].id);
    assert_eq!(a.oom_cause, Some(OomCause::CapHit), "{a:?}");
    // 4 GiB and its slack (5% or 256 MiB, the more).
    assert_eq!(a.memory_cap_mib, Some(4096 + 256));
    assert!(
        a.log_tail
            .as_deref()
            .is_some_and(|t| t.contains("limit is 4352 MiB") && t.contains("cap_hit")),
        "{:?}",
        a.log_tail
    );
    let b = h.first_attempt(calm[0].id);
    assert_eq!((b.memory_cap_mib, b.oom_cause), (Some(4352), None));

    // `memory_cap: off`: no limit, and the same growth fits the GPU.
    let free = h
        .submit(
            "free.yaml",
            &format!(
                "name: free\ncommand: [{job}, --mem, 2GiB, --grow, 6GiB, --grow-after, \"1\", \
                 --seconds, \"2\"]\nresources: {{gpus: 1, memory: 4GiB}}\nmemory_cap: off\n"
            ),
        )
        .expect("submit");
    let done = h.wait_done(free, Duration::from_secs(60));
    assert_eq!(done[0].state, JobState::Succeeded, "{done:?}");
    assert_eq!(h.first_attempt(done[0].id).memory_cap_mib, None);
}
