//! A whole matrix packed by plan and memory on fake GPUs: the timeline the jobs record
//! themselves never shows more jobs than slots nor more estimated memory than fits.

use std::collections::HashMap;
use std::time::Duration;

use headroom_integration_tests::{Headroom, Record, UpOptions, fake_job, read_records};
use headroom_shared::JobState;

const GIB: u64 = 1024;

/// Replays start/end events; returns the peak concurrency per GPU and checks the limits.
fn check_timeline(
    records: &[Record],
    slots: &[u32],
    estimate_mib: u64,
    total_mib: u64,
) -> Vec<u32> {
    let mut events: Vec<&Record> = records.iter().collect();
    // Ends before starts at the same millisecond: a slot freed then taken is not overlap.
    events.sort_by_key(|r| (r.t_ms, r.event == "start"));
    let mut on: HashMap<u32, u32> = HashMap::new();
    let mut peak = vec![0; slots.len()];
    let budget = total_mib - total_mib / 10;
    for r in events {
        let gpu: u32 = r.gpus.parse().expect("one GPU per job");
        let n = on.entry(gpu).or_default();
        if r.event == "start" {
            *n += 1;
            assert!(
                *n <= slots[gpu as usize],
                "GPU {gpu} ran {n} jobs with {} slots",
                slots[gpu as usize]
            );
            assert!(
                u64::from(*n) * estimate_mib <= budget,
                "GPU {gpu}: {n} x {estimate_mib} MiB above total minus headroom"
            );
            peak[gpu as usize] = peak[gpu as usize].max(*n);
        } else if r.event == "end" {
            *n -= 1;
        }
    }
    peak
}

#[test]
fn matrix_of_24_packs_by_plan_and_memory() {
    let h = Headroom::up(UpOptions::gpus("4x24GiB").plan("2,2,1,1"));
    let record = h.path("timeline.jsonl");
    let spec = format!(
        r#"
name: packing
command: ["{job}", "--mem", "8GiB", "--seconds", "{{secs}}", "--record", "{record}", "--print", "lr={{lr}}"]
grid:
  lr: [0.1, 0.01, 0.001]
  secs: [0.4, 0.6]
runs_per_config: 4
resources: {{gpus: 1, memory: 9GiB}}
"#,
        job = fake_job().display(),
        record = record.display()
    );
    let exp = h.submit("packing.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    assert_eq!(jobs.len(), 24);
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:#?}"
    );

    let records = read_records(&record).expect("records");
    assert_eq!(records.iter().filter(|r| r.event == "start").count(), 24);
    let peak = check_timeline(&records, &[2, 2, 1, 1], 9 * GIB, 24 * GIB);
    assert!(
        peak[0] == 2 || peak[1] == 2,
        "the plan's second slots were never used: {peak:?}"
    );
    // The jobs saw the GPU the scheduler gave them, and the parameters as HP_*.
    let csv = h.cli_ok(&["export", "--csv", "--experiment", &exp.to_string()]);
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers = reader.headers().expect("header").clone();
    for col in [
        "lr",
        "secs",
        "success",
        "failure_class",
        "gpus",
        "started_at",
        "ended_at",
        "exit_code",
    ] {
        assert!(
            headers.iter().any(|h| h == col),
            "no column {col} in {headers:?}"
        );
    }
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("row")).collect();
    assert_eq!(rows.len(), 24);
    let success = headers
        .iter()
        .position(|h| h == "success")
        .expect("success column");
    assert!(rows.iter().all(|r| &r[success] == "true"));
}

#[test]
fn memory_estimates_bind_before_slots() {
    // 11 GiB twice is above 24 GiB minus 10 % headroom: one job per GPU despite two slots.
    let h = Headroom::up(UpOptions::gpus("2x24GiB").plan("2,2"));
    let record = h.path("timeline.jsonl");
    let spec = format!(
        r#"{{"name": "big", "command": ["{job}", "--mem", "10GiB", "--seconds", "0.3", "--record", "{record}"],
            "runs_per_config": 6, "resources": {{"memory": "11GiB"}}}}"#,
        job = fake_job().display(),
        record = record.display()
    );
    let exp = h.submit("big.json", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    let peak = check_timeline(
        &read_records(&record).expect("records"),
        &[1, 1],
        11 * GIB,
        24 * GIB,
    );
    assert_eq!(peak, vec![1, 1]);
}

/// `headroom simulate` replays a finished experiment's jobs (each at its measured peak for its
/// duration) on other GPUs and another plan: where the plan alone would pair two jobs whose
/// peaks do not fit one GPU, it shows the OOMs, and headroom's placement none.
#[test]
fn a_finished_experiment_replays_on_other_gpus_and_plans() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB").plan("1,1"));
    let spec = format!(
        r#"
name: replayed
command: ["{job}", "--mem", "6GiB", "--seconds", "0.3"]
runs_per_config: 4
resources: {{gpus: 1, memory: 7GiB}}
"#,
        job = fake_job().display(),
    );
    let exp = h.submit("replayed.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:#?}"
    );

    let out = h.cli(&["simulate", "replayed", "--gpus", "2x10GiB", "--plan", "2,2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("4 jobs of replayed"), "{stdout}");
    let row = |policy: &str| -> Vec<String> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {policy} |")))
            .unwrap_or_else(|| panic!("no row for {policy}: {stdout}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    let header = row("policy");
    let column = |name: &str| {
        header
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name}: {stdout}"))
    };
    let (ooms, failed) = (column("OOMs"), column("failed"));
    assert_ne!(
        row("plan only (FIFO)")[ooms],
        "0",
        "two 6 GiB peaks on a 10 GiB GPU: {stdout}"
    );
    for policy in ["exclusive", "headroom, declared", "headroom, learned"] {
        assert_eq!(row(policy)[ooms], "0", "{policy}: {stdout}");
        assert_eq!(row(policy)[failed], "0", "{policy}: {stdout}");
    }
    // Declared estimates held for the whole run bound the makespan of any queue order.
    let reserved: f64 = row("headroom, declared")[column("/ reserved bound")]
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(reserved >= 1.0, "{stdout}");
    assert!(
        stdout.contains("reserved bound: no queue order ends sooner"),
        "{stdout}"
    );

    for (plan, said) in [("2,x", "--plan"), ("2,2,2", "--plan")] {
        let out = h.cli(&["simulate", "replayed", "--gpus", "2x10GiB", "--plan", plan]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(said),
            "{plan}: {stderr}"
        );
    }
    let out = h.cli(&["simulate", "nope", "--gpus", "2x10GiB", "--plan", "1,1"]);
    assert!(!out.status.success());
}

/// The most runs that were running at once, from their start and end records.
fn most_at_once(records: &[Record]) -> usize {
    let mut events: Vec<&Record> = records.iter().collect();
    events.sort_by_key(|r| (r.t_ms, r.event == "start"));
    let (mut on, mut most) = (0usize, 0usize);
    for r in events {
        match r.event.as_str() {
            "start" => on += 1,
            "end" | "oom" => on = on.saturating_sub(1),
            _ => {}
        }
        most = most.max(on);
    }
    most
}

/// Runs that declare where their peak falls (`resources.memory_phases` with
/// `expected_duration`) share a GPU their peaks could not share at once: three runs holding
/// 2,000 MiB, 7 GiB in their last tenth, on one 10 GiB GPU (9 GiB less headroom). Two run at
/// once with their peaks apart, and none runs out of memory (two peaks together would: 14 GiB);
/// the same runs declaring only their peak run one at a time. A spec whose phases cannot be
/// placed in time is refused, naming the field.
#[test]
fn runs_whose_peaks_fall_apart_share_a_gpu() {
    let h = Headroom::up(UpOptions::gpus("1x10GiB").plan("4"));
    h.wait_agent();
    let spec = |name: &str, record: &std::path::Path, phases: &str| {
        format!(
            r#"
name: {name}
command: ["{job}", "--mem", "2000MiB", "--grow", "5168MiB", "--grow-after", "2.7", "--seconds", "3", "--record", "{record}"]
runs_per_config: 3
expected_duration: 3s
resources: {{gpus: 1, memory: 7GiB{phases}}}
retry: {{max_attempts: 1}}
"#,
            job = fake_job().display(),
            record = record.display()
        )
    };
    let phased = ", memory_phases: {steady: 2000MiB, peak: [0.9, 1.0]}";
    for (name, phases, together) in [("apart", phased, 2), ("peaks", "", 1)] {
        let record = h.path(&format!("{name}.jsonl"));
        let exp = h
            .submit(&format!("{name}.yaml"), &spec(name, &record, phases))
            .expect("submit");
        let jobs = h.wait_done(exp, Duration::from_secs(60));
        assert!(
            jobs.iter().all(|j| j.state == JobState::Succeeded),
            "{name}: {jobs:#?}"
        );
        let records = read_records(&record).expect("records");
        assert!(
            records.iter().all(|r| r.event != "oom"),
            "{name}: {records:#?}"
        );
        assert_eq!(most_at_once(&records), together, "{name}: {records:#?}");
    }

    let unplaceable =
        spec("no-length", &h.path("x.jsonl"), phased).replace("expected_duration: 3s\n", "");
    std::fs::write(h.path("no-length.yaml"), unplaceable).expect("write");
    let out = h.cli(&["submit", h.path("no-length.yaml").to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("resources.memory_phases"),
        "{stderr}"
    );
}

/// A configuration's runs declare only their peak; the first that ends well teaches where
/// its peak fell, and its next runs share the GPU with their peaks apart: four runs holding
/// 1,500 MiB, 7 GiB in their last tenth, on one 12 GiB GPU (10.8 GiB less headroom; two
/// peaks together would need 14 GiB). The first runs alone; after it the other three run at
/// once, staggered, one peak beside two steady uses, and none runs out of memory. The 7 GiB
/// declared, which the first run's peak kept to, stays 7 GiB: at 1.1x it (7.7 GiB) only two
/// would fit. The run's shape is shown with its attempt.
#[test]
fn a_configuration_s_runs_share_a_gpu_once_one_taught_where_its_peak_falls() {
    let h = Headroom::up(
        UpOptions::gpus("1x12GiB")
            .plan("4")
            .env("HEADROOM_SAMPLE_EVERY", "100ms"),
    );
    h.wait_agent();
    let record = h.path("learned.jsonl");
    let spec = format!(
        r#"
name: learned
command: ["{job}", "--mem", "1500MiB", "--grow", "5668MiB", "--grow-after", "2.7", "--seconds", "3", "--record", "{record}"]
runs_per_config: 4
resources: {{gpus: 1, memory: 7GiB}}
retry: {{max_attempts: 1}}
"#,
        job = fake_job().display(),
        record = record.display()
    );
    let exp = h.submit("learned.yaml", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(90));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:#?}"
    );
    let records = read_records(&record).expect("records");
    assert!(records.iter().all(|r| r.event != "oom"), "{records:#?}");
    assert_eq!(most_at_once(&records), 3, "{records:#?}");
    let first = jobs.iter().find(|j| j.index == 0).expect("the first run");
    let shape = h
        .first_attempt(first.id)
        .measurements
        .memory_profile
        .expect("its shape");
    assert!((1500..1700).contains(&shape.steady_mib), "{shape:?}");
    assert!((0.85..=0.95).contains(&shape.peak_from), "{shape:?}");
    let show = h.cli_ok(&["show", &first.id.to_string()]);
    assert!(show.contains("memory over time: 15"), "{show}");
}
