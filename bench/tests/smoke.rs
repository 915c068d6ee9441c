//! Every bench of the suite at a tiny size, so none rots: each runs end to end against the
//! real binaries and task-spooler, every job succeeds, and its report is written with
//! figures that are measured (finite, above zero), not placeholders. The sizes are the
//! suite's own `--tiny` ones.

use headroom_bench::suite::{self, Report};

fn tiny(bench: &str) -> Report {
    suite::run(bench, true).unwrap_or_else(|e| panic!("{bench}: {e:#}"))
}

fn check(r: Report, figures: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let written = r.write(dir.path()).expect("writing the report");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&written[0]).expect("reading it"))
            .expect("a JSON report");
    assert_eq!(json["bench"], r.bench);
    for t in &r.targets {
        assert!(
            t.measured.chars().any(|c| c.is_ascii_digit()) && !t.measured.contains("NaN"),
            "{}: target `{}` measured as `{}`",
            r.bench,
            t.what,
            t.measured
        );
    }
    for f in figures {
        let v = json["figures"]
            .pointer(f)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("{}: no figure {f} in {json}", r.bench));
        assert!(v.is_finite() && v > 0.0, "{}: {f} = {v}", r.bench);
    }
    let md = std::fs::read_to_string(&written[1]).expect("the Markdown report");
    assert!(md.contains('|'), "{}: no table in {md}", r.bench);
    // Whether a job's start waited for an RCU grace period, in both forms.
    let favored = headroom_agent::cgroup::dynmods().map(|(_, on)| on);
    assert_eq!(
        json["machine"]["cgroup_favordynmods"],
        serde_json::json!(favored)
    );
    let said = match favored {
        Some(true) => "cgroup favordynmods on",
        Some(false) => "cgroup favordynmods off",
        None => "cgroup favordynmods not available",
    };
    assert!(md.contains(said), "{}: no `{said}` in {md}", r.bench);
}

/// CPU per job is counted where a `cpuacct` group can be made (root on a host with the v1
/// hierarchy, as CI is); elsewhere the report says "not measured".
fn cpu_counted() -> bool {
    headroom_bench::cpugroup::CpuGroup::create("smoke").is_some()
}

#[test]
fn dispatch() {
    let r = tiny("dispatch");
    let mut figures = vec![
        "/raw_spawn_per_s",
        "/task_spooler_per_s",
        "/sides/0/jobs_per_s",
        "/sides/3/jobs_per_s",
    ];
    if cpu_counted() {
        // headroom's side and task-spooler's.
        figures.extend(["/sides/0/cpu_ms_per_job", "/sides/4/cpu_ms_per_job"]);
    }
    check(r, &figures);
}

#[test]
fn latency() {
    check(
        tiny("latency"),
        &["/headroom_ms/p50", "/task_spooler_ms/p50"],
    );
}

#[test]
fn makespan() {
    check(tiny("makespan"), &["/headroom_s", "/task_spooler_s"]);
}

/// The gap, and where it goes: five parts read off the attempts, each a finite figure (the
/// store's milliseconds can make a part 0, or -1 when clocks round apart).
#[test]
fn slot_free() {
    let r = tiny("slot_free");
    let parts = r.figures["headroom_parts_ms"].as_array().expect("parts");
    assert_eq!(parts.len(), 5, "{parts:?}");
    for p in parts {
        let m = p["median"].as_f64().expect("a median");
        assert!(m.is_finite() && m > -2.0, "{p}");
    }
    check(r, &["/headroom_ms/median", "/task_spooler_ms/median"]);
}

#[test]
fn scale() {
    check(
        tiny("scale"),
        &[
            "/jobs",
            "/jobs_per_s",
            "/claim_ms/p99",
            "/coordinator/rss_mib",
            // Two replicas, each measured.
            "/replicas/0/rss_mib",
            "/replicas/1/rss_mib",
        ],
    );
}

/// The fleet with agent tokens, each agent's requests checked against its own node, served
/// by replicas restarted after the agents registered.
#[test]
fn scale_ceiling() {
    let r = tiny("scale_ceiling");
    assert_eq!(r.figures["agent_tokens"], true);
    assert_eq!(r.figures["restarted"], true);
    check(r, &["/jobs", "/jobs_per_s", "/claim_ms/p99"]);
}

#[test]
fn scale_load() {
    let r = tiny("scale_load");
    // One claim target a load, each load measured on its own database.
    assert_eq!(r.targets.len(), 2, "{:?}", r.targets);
    check(
        r,
        &[
            "/runs/0/jobs_per_s",
            "/runs/0/demand_jobs_per_s",
            "/runs/0/claim_ms/p99",
            "/runs/1/jobs_per_s",
            "/runs/1/claim_ms/p99",
        ],
    );
}

#[test]
fn agent_cpu() {
    let r = tiny("agent_cpu");
    // An idle agent may use no CPU tick in a second: its CPU is measured, zero or more.
    let cpu = r.figures["cpu_ms"].as_f64().expect("cpu_ms");
    assert!(cpu.is_finite() && cpu >= 0.0, "cpu_ms = {cpu}");
    check(r, &["/window_s"]);
}

#[test]
fn metric_lines() {
    let r = tiny("metric_lines");
    assert!(
        r.targets[0].met,
        "bounded series with the latest point: {}",
        r.targets[0].measured
    );
    let mut figures = vec!["/kept_points", "/metrics/wall_s"];
    if cpu_counted() {
        figures.push("/metrics/cpu_ms");
    }
    check(r, &figures);
}

/// The seeds' workloads at a tiny size: headroom and one job per GPU end every job clean,
/// headroom without an OOM where the peaks are declared (the matrix; the farm's 75 ms peak
/// may pass between two samples, and an OOM then teaches its key); the seeds' way, two LoRA
/// jobs on a GPU, runs out of memory at their evaluation peaks, as the farm did.
#[test]
fn useful() {
    let r = tiny("useful");
    for w in ["seed_matrix", "LoRA_farm"] {
        let f = &r.figures[w];
        let jobs = f["jobs"].as_u64().expect("jobs");
        for side in ["headroom", "headroom_phases_learned", "one_per_gpu"] {
            assert_eq!(
                f[side]["clean_runs"].as_u64(),
                Some(jobs),
                "{w} {side}: {f}"
            );
        }
    }
    for side in [
        "headroom",
        "headroom_lengths_declared",
        "headroom_phases_learned",
    ] {
        let matrix = &r.figures["seed_matrix"][side];
        assert_eq!(matrix["ooms"].as_u64(), Some(0), "{side}: {matrix}");
        assert_eq!(
            matrix["clean_runs"].as_u64(),
            r.figures["seed_matrix"]["jobs"].as_u64(),
            "{side}: {matrix}"
        );
    }
    // The farm's runs are all of one length: nothing to declare.
    assert!(r.figures["LoRA_farm"]["headroom_lengths_declared"].is_null());
    let farm = &r.figures["LoRA_farm"]["seeds_way"];
    assert!(farm["ooms"].as_u64() > Some(0), "{farm}");
    check(
        r,
        &[
            "/seed_matrix/best_offline_s",
            "/seed_matrix/headroom/makespan_s",
            "/LoRA_farm/headroom/useful_fraction",
            "/LoRA_farm/seeds_way/makespan_s",
        ],
    );
}
