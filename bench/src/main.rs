//! `headroom-bench`: how fast `headroom up` starts and churns through jobs, measured against
//! the machine's raw process-spawn rate in the same run (results are ratios, not absolutes).
//!
//! cargo build --release --workspace --bins && target/release/headroom-bench [JOBS]

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use headroom_integration_tests::{Headroom, UpOptions};
use headroom_shared::api::JobDetail;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Sequential spawn-and-wait of `true`: the floor any process launcher pays.
fn raw_spawn_rate(n: usize) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..n {
        Command::new("true").status().context("spawning true")?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Submit-to-start latency of each job, in ms (job creation to the agent's start report).
fn start_latencies(h: &Headroom, exp: headroom_shared::ExperimentId) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for j in h.jobs(exp)? {
        let d: JobDetail = h.job(j.id)?;
        if let Some(started) = d.attempts_detail.first().and_then(|a| a.started_at) {
            out.push(
                (started - d.summary.created_at)
                    .num_microseconds()
                    .unwrap_or(0) as f64
                    / 1000.0,
            );
        }
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn main() -> Result<()> {
    let jobs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(400);
    let h = Headroom::start(UpOptions {
        fake_gpus: "4x80GiB".into(),
        plan: Some("16,16,16,16".into()),
        ..Default::default()
    })?;

    // 1. Idle latency: one job at a time on an idle box.
    let mut idle = Vec::new();
    for i in 0..30 {
        let r = h.submit_api(serde_json::json!({
            "name": format!("idle{i}"), "command": ["true"], "resources": {"memory": "100MiB"}
        }))?;
        let exp = r.experiment.context("stored")?;
        h.wait_done(exp, Duration::from_secs(30));
        idle.extend(start_latencies(&h, exp)?);
    }
    idle.sort_by(f64::total_cmp);

    // 2. Throughput: a burst of short jobs, 64 slots.
    let raw = raw_spawn_rate(jobs)?;
    let t = Instant::now();
    let r = h.submit_api(serde_json::json!({
        "name": "burst", "command": ["true"], "runs_per_config": jobs, "resources": {"memory": "100MiB"}
    }))?;
    let exp = r.experiment.context("stored")?;
    let done = h.wait_done(exp, Duration::from_secs(600));
    let elapsed = t.elapsed().as_secs_f64();
    let ok = done
        .iter()
        .filter(|j| j.state == headroom_shared::JobState::Succeeded)
        .count();
    let rate = jobs as f64 / elapsed;
    let burst = start_latencies(&h, exp)?;

    println!("| measure | value |");
    println!("| --- | --- |");
    println!(
        "| idle submit->start p50 | {:.1} ms |",
        percentile(&idle, 0.5)
    );
    println!(
        "| idle submit->start p99 | {:.1} ms |",
        percentile(&idle, 0.99)
    );
    println!("| raw spawn+wait of `true` | {raw:.0} /s |");
    println!("| headroom jobs of `true` ({jobs}, {ok} succeeded, 64 slots) | {rate:.0} /s |");
    println!("| ratio headroom / raw spawn | {:.2} |", rate / raw);
    println!(
        "| burst submit->start p50 | {:.0} ms |",
        percentile(&burst, 0.5)
    );
    println!(
        "| burst submit->start p99 | {:.0} ms |",
        percentile(&burst, 0.99)
    );
    Ok(())
}
