//! `exclusive: true` and `cooldown` through the real binaries: an attempt waits for its GPU
//! to empty and to cool before its job starts, says so while it waits, records the wait, and
//! nothing else runs on that GPU meanwhile.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, csv_table, fake_job};
use headroom_shared::api::{AttemptPhase, AttemptView};
use headroom_shared::{ExperimentId, FailureClass, JobId, JobState};
use serde_json::json;

/// The fake GPUs' power model control file (`agent::gpu::fake::POWER_MODEL_FILE`).
const POWER_MODEL_FILE: &str = "power-model";

fn job_argv(args: &[&str]) -> Vec<String> {
    std::iter::once(fake_job().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect()
}

fn only_job(h: &Headroom, exp: ExperimentId) -> JobId {
    h.jobs(exp).expect("jobs")[0].id
}

/// Waits until the job's first attempt says it waits for something containing `what`.
fn waiting_for(h: &Headroom, job: JobId, what: &str) -> AttemptView {
    h.wait_for(what, Duration::from_secs(30), || {
        let d = h.job(job)?;
        Ok(d.attempts_detail
            .first()
            .filter(|a| a.waiting.as_deref().is_some_and(|w| w.contains(what)))
            .cloned())
    })
}

fn ms_between(a: chrono::DateTime<chrono::Utc>, b: chrono::DateTime<chrono::Utc>) -> i64 {
    (b - a).num_milliseconds()
}

#[test]
fn cooldown_until_temp_waits_for_the_heated_gpu_to_cool_and_records_it() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("3s"));
    h.wait_agent();
    // A fake GPU that heats and cools in seconds (time constant 2 s instead of 20 s).
    std::fs::write(h.fake_gpu_dir().join(POWER_MODEL_FILE), "tau_s=2").expect("model");
    // Heat it: 20 GiB at 100 % for 5 s, towards 73 °C.
    let heat = h.submit_spec(json!({
        "name": "heat",
        "command": job_argv(&["--mem", "20GiB", "--util", "100", "--seconds", "5"]),
        "resources": {"memory": "21GiB"},
    }));
    let heater = only_job(&h, heat);
    h.wait_for("the heater to run", Duration::from_secs(30), || {
        Ok((h.job(heater)?.summary.state == JobState::Running).then_some(()))
    });
    // Queued behind it: once it ends, the GPU must cool to 45 °C before this one starts.
    let cool = h.submit_spec(json!({
        "name": "energy-run",
        "command": job_argv(&["--mem", "1GiB", "--seconds", "0.2"]),
        "resources": {"memory": "2GiB"},
        "cooldown": {"until_temp_c": 45, "max_wait": "60s"},
    }));
    let job = only_job(&h, cool);
    let seen = waiting_for(&h, job, "cooling:");
    assert_eq!(seen.phase, AttemptPhase::Leased, "{seen:?}");
    assert!(
        seen.started_at.is_none(),
        "the job must not run while it cools"
    );
    let show = h.cli_ok(&["show", &job.to_string()]);
    assert!(
        show.contains("cooling:") && show.contains("°C → 45 °C"),
        "{show}"
    );

    let jobs = h.wait_done(cool, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(job);
    let waited = a.cooldown_wait_ms.expect("cooldown wait recorded");
    let from = a
        .cooldown_from_temp_c
        .expect("temperature when cooling began");
    let start = a.cooldown_start_temp_c.expect("temperature at the start");
    assert!(from > 55.0, "the heater left it hot: {a:?}");
    assert!(start <= 45.0, "started at {start} °C: {a:?}");
    // 2 s x ln((from - 39) / 6): about 3 s from 70 °C.
    assert!((1_000..30_000).contains(&waited), "{waited} ms: {a:?}");
    assert_eq!(a.cooldown_timed_out, Some(false));
    // `started_at` is when the job's process started, after the wait, not at the lease.
    let started = a.started_at.expect("started");
    assert!(
        ms_between(a.leased_at, started) >= waited as i64 - 100,
        "started {} ms after the lease, cooled {waited} ms: {a:?}",
        ms_between(a.leased_at, started)
    );
    assert!(a.waiting.is_none());
    let show = h.cli_ok(&["show", &job.to_string()]);
    assert!(show.contains("cooled"), "{show}");
    // The export has the wait and both temperatures, as the API does.
    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv", "-e", &cool.to_string()]));
    let cell = |name: &str| {
        let i = header.iter().position(|h| h == name).expect(name);
        rows[0][i].clone()
    };
    assert_eq!(cell("cooldown_wait_ms"), waited.to_string());
    assert_eq!(cell("cooldown_timed_out"), "false");
    let exported: f64 = cell("cooldown_start_temp_c")
        .parse()
        .expect("a temperature");
    assert!((exported - start).abs() < 0.01, "{exported} vs {start}");
}

#[test]
fn cooldown_max_wait_fails_the_attempt_with_cooldown_timeout() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("3s"));
    // An idle fake GPU sits at 39 °C: 20 °C is never reached.
    let exp = h.submit_spec(json!({
        "name": "too-cold",
        "command": job_argv(&["--seconds", "0.1"]),
        "resources": {"memory": "1GiB"},
        "cooldown": {"until_temp_c": 20, "max_wait": "2s"},
    }));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Failed);
    assert_eq!(jobs[0].last_failure, Some(FailureClass::CooldownTimeout));
    let a = h.first_attempt(jobs[0].id);
    assert_eq!(a.failure_class, Some(FailureClass::CooldownTimeout));
    assert_eq!(a.pid, None, "the job never started: {a:?}");
    assert_eq!(a.cooldown_timed_out, Some(true));
    assert!(a.cooldown_wait_ms.is_some_and(|w| w >= 1_900), "{a:?}");
    assert!(
        a.log_tail
            .as_deref()
            .is_some_and(|t| t.contains("not cool within max_wait")),
        "{a:?}"
    );
    let ls = h.cli_ok(&["ls", "--state", "failed"]);
    assert!(ls.contains("cooldown_timeout"), "{ls}");
}

#[test]
fn cooldown_seconds_idles_about_that_long() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("3s"));
    let exp = h.submit_spec(json!({
        "name": "idle-first",
        "command": job_argv(&["--seconds", "0.1"]),
        "resources": {"memory": "1GiB"},
        "cooldown": {"seconds": 2},
    }));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(jobs[0].id);
    let waited = a.cooldown_wait_ms.expect("wait recorded");
    assert!((2_000..8_000).contains(&waited), "{a:?}");
    let gap = ms_between(a.leased_at, a.started_at.expect("started"));
    assert!(
        (2_000..10_000).contains(&gap),
        "started {gap} ms after the lease"
    );
    assert!(a.cooldown_start_temp_c.is_some(), "{a:?}");
}

#[test]
fn an_exclusive_job_waits_for_a_foreign_process_to_leave() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2").lease_ttl("3s"));
    let mut foreign = h.foreign_job("1x24GiB", &["--mem", "4GiB", "--seconds", "600"]);
    let pid = foreign.0.id();
    h.wait_for("the foreign process", Duration::from_secs(30), || {
        Ok(h.nodes()?
            .iter()
            .flat_map(|n| &n.gpus)
            .any(|g| g.foreign.iter().any(|p| p.pid == pid))
            .then_some(()))
    });
    let exp = h.submit_spec(json!({
        "name": "alone",
        "command": job_argv(&["--mem", "1GiB", "--seconds", "0.3"]),
        "resources": {"memory": "2GiB"},
        "exclusive": true,
    }));
    let job = only_job(&h, exp);
    let seen = waiting_for(&h, job, &format!("pid {pid}"));
    assert!(seen.started_at.is_none(), "{seen:?}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(h.job(job).expect("job").summary.state, JobState::Leased);
    foreign.0.kill().expect("kill foreign");
    foreign.0.wait().expect("reap foreign");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(job);
    assert!(a.exclusive_wait_ms.is_some_and(|w| w >= 1_000), "{a:?}");
    assert_eq!(a.contaminated, Some(false), "it ran alone: {a:?}");
}

#[test]
fn exclusive_jobs_on_a_gpu_of_plan_2_never_overlap() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2").lease_ttl("3s"));
    let exp = h.submit_spec(json!({
        "name": "one-at-a-time",
        "command": job_argv(&["--mem", "1GiB", "--seconds", "1"]),
        "resources": {"memory": "2GiB"},
        "runs_per_config": 2,
        "exclusive": true,
    }));
    // And an ordinary job that would fit beside either.
    let other = h.submit_spec(json!({
        "name": "neighbour",
        "command": job_argv(&["--mem", "1GiB", "--seconds", "1"]),
        "resources": {"memory": "2GiB"},
    }));
    let mut spans = Vec::new();
    for e in [exp, other] {
        for j in h.wait_done(e, Duration::from_secs(60)) {
            assert_eq!(j.state, JobState::Succeeded);
            let a = h.first_attempt(j.id);
            spans.push((a.leased_at, a.ended_at.expect("ended"), e == exp));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[0].2 || w[1].2 {
            assert!(
                w[1].0 >= w[0].1,
                "an exclusive attempt shared its GPU: {spans:?}"
            );
        }
    }
}

#[test]
fn a_foreign_process_during_an_exclusive_run_contaminates_it() {
    // The intruder arrived during the run, so cleanup cannot tell it from a leftover that
    // shed its marker: it gives up after the verify timeout (and quarantines the GPU).
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .lease_ttl("3s")
            .flags(&["--verify-timeout", "1s"]),
    );
    let exp = h.submit_spec(json!({
        "name": "measured",
        "command": job_argv(&["--mem", "1GiB", "--seconds", "3"]),
        "resources": {"memory": "2GiB"},
        "exclusive": true,
    }));
    let job = only_job(&h, exp);
    h.wait_for("the job to run", Duration::from_secs(30), || {
        Ok((h.job(job)?.summary.state == JobState::Running).then_some(()))
    });
    let _intruder = h.foreign_job("1x24GiB", &["--mem", "1GiB", "--seconds", "600"]);
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    assert_eq!(h.first_attempt(job).contaminated, Some(true));
}
