//! Memory learned from earlier attempts, and the OOM ladder.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job, fake_job_spec, read_records};
use headroom_shared::api::{AttemptView, JobDetail};
use headroom_shared::{FailureClass, JobState};

#[test]
fn a_second_wave_packs_by_what_the_first_wave_used() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB").plan("2,2"));
    let record = h.path("timeline.jsonl");
    let spec = |runs: u32| {
        format!(
            r#"{{"name": "learner", "command": ["{job}", "--mem", "5GiB", "--seconds", "1", "--record", "{record}"],
                 "runs_per_config": {runs}}}"#,
            job = fake_job().display(),
            record = record.display()
        )
    };
    // First wave: nothing declared, nothing known: each job runs alone on its GPU.
    let first = h.submit("w1.json", &spec(2)).expect("submit");
    let jobs = h.wait_done(first, Duration::from_secs(60));
    let gpus: Vec<u32> = jobs.iter().map(|j| j.gpu_indices[0]).collect();
    assert_ne!(gpus[0], gpus[1], "unknown memory: one job per GPU");
    for j in &jobs {
        let a = &h.first_attempt(j.id);
        assert_eq!(a.estimate_source, "none");
        assert_eq!(a.peak_mem_mib, Some(5 * 1024));
    }
    std::fs::remove_file(&record).expect("reset timeline");

    // Second wave of the same key: 5 GiB x 1.1 learned, two fit per GPU.
    let second = h.submit("w2.json", &spec(4)).expect("submit");
    let jobs = h.wait_done(second, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    for j in &jobs {
        let a = &h.first_attempt(j.id);
        assert_eq!(
            (a.estimate_source.as_str(), a.estimate_mib),
            ("learned", Some(5632))
        );
    }
    let records = read_records(&record).expect("records");
    let starts: Vec<_> = records.iter().filter(|r| r.event == "start").collect();
    let ends: Vec<_> = records.iter().filter(|r| r.event == "end").collect();
    let packed = starts.iter().any(|s| {
        starts
            .iter()
            .filter(|o| o.gpus == s.gpus && o.t_ms <= s.t_ms)
            .count()
            - ends
                .iter()
                .filter(|e| e.gpus == s.gpus && e.t_ms <= s.t_ms)
                .count()
            >= 2
    });
    assert!(
        packed,
        "the learned estimate should let two jobs share a GPU: {records:#?}"
    );
    let out = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(out.contains("(learned)"), "{out}");
}

#[test]
fn the_oom_ladder_halves_the_batch_until_it_fits() {
    let h = Headroom::up(UpOptions::default());
    let spec = format!(
        r#"
name: ladder
command: ["{job}", "--mem", "1GiB", "--oom-if-param", "batch_size>64", "--print", "bs={{batch_size}}"]
grid: {{batch_size: [256], grad_accum: [1]}}
resources: {{memory: 2GiB}}
oom_ladder:
  - {{batch_size: "/2", grad_accum: "*2"}}
  - {{batch_size: "/2", grad_accum: "*2"}}
  - {{gradient_checkpointing: true}}
"#,
        job = fake_job().display()
    );
    let exp = h.submit("ladder.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(d.summary.state, JobState::Succeeded);
    let classes: Vec<_> = d.attempts_detail.iter().map(|a| a.failure_class).collect();
    assert_eq!(
        classes,
        vec![Some(FailureClass::Oom), Some(FailureClass::Oom), None]
    );
    let steps: Vec<u32> = d.attempts_detail.iter().map(|a| a.ladder_step).collect();
    assert_eq!(steps, vec![0, 1, 2]);
    let bs: Vec<_> = d
        .attempts_detail
        .iter()
        .map(|a| a.params["batch_size"].clone())
        .collect();
    assert_eq!(
        bs,
        vec![
            serde_json::json!(256),
            serde_json::json!(128),
            serde_json::json!(64)
        ]
    );
    assert_eq!(
        d.attempts_detail[2].params["grad_accum"],
        serde_json::json!(4)
    );
    assert!(d.argv.iter().any(|a| a == "bs=64"), "{:?}", d.argv);
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    assert!(log.contains("bs=64"), "{log}");
    // The CSV has one row per attempt with the parameters it ran with and the step.
    let csv = h.cli_ok(&["export", "--csv"]);
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let headers = r.headers().expect("headers").clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.expect("row")).collect();
    let (bs_col, step_col, class_col) =
        (col("batch_size"), col("ladder_step"), col("failure_class"));
    let got: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r[bs_col].to_string(),
                r[step_col].to_string(),
                r[class_col].to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("256".into(), "0".into(), "oom".into()),
            ("128".into(), "1".into(), "oom".into()),
            ("64".into(), "2".into(), String::new())
        ]
    );
}

/// The memory key is the experiment plus the parameters the spec names, two of them here:
/// a job differing only in another parameter shares what was learned; a job differing in
/// either key parameter does not.
#[test]
fn the_memory_key_composes_every_named_parameter_and_only_those() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB").plan("2,2"));
    let spec = |models: &str, batches: &str, lr: &str| {
        format!(
            r#"{{"name": "keyed", "command": ["{job}", "--mem", "5GiB", "--seconds", "0.3",
                 "--print", "{{model}} {{batch_size}} {{lr}}"],
                 "grid": {{"model": {models}, "batch_size": {batches}, "lr": {lr}}},
                 "memory_key": ["model", "batch_size"]}}"#,
            job = fake_job().display()
        )
    };
    let first = h
        .submit("k1.json", &spec(r#"["a"]"#, "[1]", "[0.1]"))
        .expect("submit");
    let jobs = h.wait_done(first, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);

    let second = h
        .submit("k2.json", &spec(r#"["a", "b"]"#, "[1, 2]", "[0.2]"))
        .expect("submit");
    let jobs = h.wait_done(second, Duration::from_secs(60));
    let mut sources: Vec<(String, String, String)> = jobs
        .iter()
        .map(|j| {
            let a = h.first_attempt(j.id);
            (
                a.params["model"].to_string(),
                a.params["batch_size"].to_string(),
                a.estimate_source,
            )
        })
        .collect();
    sources.sort();
    let want = |m: &str, b: &str, s: &str| (format!("\"{m}\""), b.to_string(), s.to_string());
    assert_eq!(
        sources,
        vec![
            want("a", "1", "learned"),
            want("a", "2", "none"),
            want("b", "1", "none"),
            want("b", "2", "none"),
        ],
        "only (a, 1) was seen before, with another lr"
    );
}

/// A configuration whose first run needed two ladder steps to fit its GPU: its two other runs
/// start at that step and never OOM; the other configuration keeps its own parameters.
#[test]
fn runs_start_at_the_ladder_step_where_their_configuration_last_fit() {
    // One 24 GiB GPU, one slot: the runs go one after another, in order.
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let spec = format!(
        r#"
name: fit
command: ["{job}", "--mem", "{{mem_gib}}GiB", "--seconds", "0.2"]
rows:
  - {{cfg: big, mem_gib: 64}}
  - {{cfg: small, mem_gib: 4}}
runs_per_config: 3
resources: {{memory: 2GiB}}
memory_key: [cfg, mem_gib]
oom_ladder:
  - {{mem_gib: "/2"}}
  - {{mem_gib: "/2"}}
"#,
        job = fake_job().display()
    );
    let exp = h.submit("fit.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let details: Vec<_> = jobs.iter().map(|j| h.job(j.id).expect("job")).collect();
    // The first run of `big`: 64 and 32 GiB overflow the GPU, 16 fits.
    let first: Vec<_> = details[0]
        .attempts_detail
        .iter()
        .map(|a| (a.ladder_step, a.failure_class))
        .collect();
    assert_eq!(
        first,
        [
            (0, Some(FailureClass::Oom)),
            (1, Some(FailureClass::Oom)),
            (2, None)
        ]
    );
    for d in &details[1..3] {
        let a: Vec<_> = d
            .attempts_detail
            .iter()
            .map(|a| (a.ladder_step, a.failure_class, a.params["mem_gib"].clone()))
            .collect();
        assert_eq!(
            a,
            [(2, None, serde_json::json!(16))],
            "started where it fit"
        );
        let shown = h.cli_ok(&["show", &d.summary.id.to_string()]);
        assert!(shown.contains("starts at OOM ladder step 2"), "{shown}");
    }
    for d in &details[3..] {
        assert_eq!(d.attempts_detail.len(), 1);
        assert_eq!(d.attempts_detail[0].ladder_step, 0, "another configuration");
        assert_eq!(d.attempts_detail[0].params["mem_gib"], serde_json::json!(4));
    }
}

/// A configuration whose run used most of its GPU (20 of 24 GiB, more than the usable memory
/// over the learned margin's 1.1) runs again, alone on the GPU: the margin never keeps a job
/// from the GPU its measured peak fits.
#[test]
fn a_configuration_that_peaked_near_its_gpu_s_size_runs_again() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let spec = format!(
        r#"{{"name": "near", "command": ["{job}", "--mem", "20GiB", "--seconds", "0.2"],
             "runs_per_config": 3}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("near.json", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let later = h.job(jobs[2].id).expect("job");
    let a = &later.attempts_detail[0];
    assert_eq!(
        (a.estimate_mib, a.estimate_source.as_str()),
        (None, "none"),
        "past the GPU only by the margin: it runs alone, as a job with no estimate"
    );
}

/// The job's first attempt ran out of memory and its second was placed by the estimate its
/// key learned from it, `learned(first attempt)`.
fn retried_by_what_it_learned(d: &JobDetail, learned: impl FnOnce(&AttemptView) -> u64) {
    let (first, second) = (&d.attempts_detail[0], &d.attempts_detail[1]);
    assert_eq!(first.failure_class, Some(FailureClass::Oom), "{first:?}");
    let needed = learned(first);
    assert_eq!(
        (second.estimate_source.as_str(), second.estimate_mib),
        ("learned", Some(needed)),
        "{:#?}",
        d.attempts_detail
    );
}

/// An OOM whose text says how much the failed allocation asked for (PyTorch's `Tried to
/// allocate`) teaches its key what the run held plus that, with the learned margin, at once:
/// A (declared 4 GiB) holds 2 GiB and asks for 10 more beside B's 14 GiB on a 24 GiB GPU, runs
/// out, and its retry waits for room for 12 GiB and then fits, instead of being placed by x1.25
/// of 4 GiB beside B and running out again.
#[test]
fn an_oom_that_says_what_it_asked_for_is_learned_at_once() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    h.wait_agent();
    let spec = |name: &str, args: &str, memory: &str| {
        fake_job_spec(name, args, memory, "{max_attempts: 2, on: [oom]}")
    };
    let b = h
        .submit(
            "b.yaml",
            &spec("steady", "--mem, 14GiB, --seconds, \"4\"", "14GiB"),
        )
        .expect("submit");
    let a = h
        .submit(
            "a.yaml",
            &spec(
                "asker",
                "--mem, 2GiB, --grow, 10GiB, --grow-after, \"0.5\", --seconds, \"2\"",
                "4GiB",
            ),
        )
        .expect("submit");
    let a = h.wait_done(a, Duration::from_secs(60));
    let b = h.wait_done(b, Duration::from_secs(60));
    assert_eq!(b[0].state, JobState::Succeeded, "{b:?}");
    let detail = h.job(a[0].id).expect("job");
    assert_eq!(
        a[0].state,
        JobState::Succeeded,
        "{:#?}",
        detail.attempts_detail
    );
    retried_by_what_it_learned(&detail, |first| {
        let held = first.peak_mem_mib.expect("the first attempt's peak");
        ((held + 10 * 1024) as f64 * 1.1).ceil() as u64
    });
    assert_eq!(
        detail.attempts_detail.len(),
        2,
        "one OOM, not a ladder of them"
    );
}

/// A run that dies of an OOM before its memory is sampled leaves no peak: what its failed
/// allocation asked for is still the least it needs, and its retry is placed by that. One that
/// asked for more than any GPU has runs alone again and ends, not waiting for ever for a GPU
/// no node has.
#[test]
fn an_oom_with_no_peak_read_is_placed_by_what_it_asked_for() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    h.wait_agent();
    let marker = h.path("first-attempt-done");
    let script = format!(
        "if [ -e {m} ]; then echo accuracy=0.91; else touch {m}; \
         echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.00 GiB.' >&2; \
         exit 1; fi",
        m = marker.display()
    );
    let spec = serde_json::json!({
        "name": "asks", "command": ["sh", "-c", script],
        "retry": {"max_attempts": 2, "on": ["oom"]}
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(
        jobs[0].state,
        JobState::Succeeded,
        "{:#?}",
        d.attempts_detail
    );
    retried_by_what_it_learned(&d, |first| {
        assert_eq!(first.peak_mem_mib, None, "no peak was read: {first:?}");
        11_264 // 10 GiB asked, x1.1
    });

    // 30 GiB asked on a 24 GiB GPU: each retry runs alone, and the job ends failed.
    let spec = format!(
        "name: toobig\ncommand: [{job}, --mem, 30GiB]\nresources: {{gpus: 1}}\n\
         retry: {{max_attempts: 2, on: [oom]}}\n",
        job = fake_job().display()
    );
    let exp = h.submit("toobig.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(jobs[0].state, JobState::Failed, "{:#?}", d.attempts_detail);
    let classes: Vec<_> = d.attempts_detail.iter().map(|a| a.failure_class).collect();
    assert_eq!(classes, vec![Some(FailureClass::Oom); 2]);
    assert_eq!(
        d.attempts_detail[1].estimate_source, "none",
        "past every GPU: alone on an idle one, {:#?}",
        d.attempts_detail
    );
}
