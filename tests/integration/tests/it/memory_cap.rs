//! A hard GPU memory cap per attempt end to end, on fake GPUs that can hold attempts to one:
//! a job that grows past its estimate runs out of memory at its own cap (`cap_hit`) while the
//! job beside it on the same GPU runs to its end, and a job with `memory_cap: off` gets none.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job, fake_job_spec};
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

/// Without caps, A grows past its estimate (6 GiB, it takes 17) and B, within its own (10
/// GiB, it holds 2 and asks for 6 more), runs out of memory: B's OOM is blamed on A
/// (`neighbour_grew`, naming A's attempt), B is tried again without spending an attempt (it
/// has one) and waits for room, and only A's memory key learns: the next A is placed by what
/// it took, the next B by what it declared.
#[test]
fn a_neighbour_that_grows_is_blamed_and_its_victim_tried_again_for_free() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    h.wait_agent();
    let spec = |name: &str, args: &str, memory: &str| {
        fake_job_spec(name, args, memory, "{max_attempts: 1}")
    };
    let grower = h
        .submit(
            "a.yaml",
            &spec(
                "grower",
                "--mem, 2GiB, --grow, 15GiB, --grow-after, \"0.5\", --seconds, \"5\"",
                "6GiB",
            ),
        )
        .expect("submit");
    let victim = h
        .submit(
            "b.yaml",
            &spec(
                "victim",
                "--mem, 2GiB, --grow, 6GiB, --grow-after, \"2.5\", --seconds, \"3.5\"",
                "10GiB",
            ),
        )
        .expect("submit");
    let a = h.wait_done(grower, Duration::from_secs(60));
    let b = h.wait_done(victim, Duration::from_secs(60));
    assert_eq!(a[0].state, JobState::Succeeded, "{a:?}");
    let grown = h.first_attempt(a[0].id);
    assert_eq!(grown.oom_cause, None);
    let detail = h.job(b[0].id).expect("job");
    assert_eq!(
        b[0].state,
        JobState::Succeeded,
        "{:#?}",
        detail.attempts_detail
    );
    let first = &detail.attempts_detail[0];
    assert_eq!(first.failure_class, Some(FailureClass::Oom), "{first:?}");
    assert_eq!(first.oom_cause, Some(OomCause::NeighbourGrew), "{first:?}");
    assert_eq!(first.oom_neighbour, Some(grown.id));
    assert_eq!(
        detail.attempts_detail.len(),
        2,
        "one retry, though it had no attempt left"
    );
    assert_eq!(
        detail.attempts_detail[1].estimate_mib,
        Some(10 * 1024),
        "the victim's key learned nothing from its OOM: {:#?}",
        detail.attempts_detail
    );
    let shown = h.cli_ok(&["show", &b[0].id.to_string()]);
    assert!(shown.contains("neighbour_grew"), "{shown}");
    // The next of each: A by what it took (its peak and the learned margin), B as declared.
    let again = |name: &str, memory: &str| {
        let exp = h
            .submit(
                &format!("{name}-again.yaml"),
                &spec(name, "--mem, 100MiB, --seconds, \"0.2\"", memory),
            )
            .expect("submit");
        let done = h.wait_done(exp, Duration::from_secs(60));
        h.first_attempt(done[0].id).estimate_mib
    };
    let a_next = again("grower", "6GiB").expect("an estimate");
    assert!(a_next >= 17 * 1024, "{a_next}");
    // It took 8 GiB when it ran to its end: under what it declared, with the margin.
    assert_eq!(again("victim", "10GiB"), Some(10 * 1024));
}
