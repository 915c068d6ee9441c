//! What a job's metric lines cost: one job printing N `HEADROOM_METRIC` lines as fast as it
//! can, and the same N plain lines read by two `metrics:` patterns (one matching every line,
//! one none), against the same job printing N plain lines of the same length with no metric
//! read (its log read, kept and shipped all the same), on one slot of the real system; the
//! CPU of everything the node ran (coordinator, agent, supervisors, the job) from its
//! `cpuacct` group, and what the attempt kept (its series bounded, its final value over every
//! line).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use headroom_shared::api::AttemptSeries;
use headroom_shared::results::MAX_POINTS;

use super::{Report, Target};
use crate::system::{Node, NodeOptions};

/// `awk` printing `lines` lines: metric lines, or plain ones of the same length.
fn printer(lines: usize, metrics: bool) -> Vec<String> {
    let prefix = if metrics {
        "HEADROOM_METRIC"
    } else {
        "plain_output___"
    };
    vec![
        "awk".into(),
        format!(
            "BEGIN {{{{ for (i = 1; i <= {lines}; i++) \
             printf \"{prefix} {{{{\\\"step\\\": %d, \\\"loss\\\": %.6f}}}}\\n\", i, 1 / i }}}}"
        ),
    ]
}

/// Patterns over the plain lines: one that matches each (`loss`), one that matches none.
fn patterns() -> serde_json::Value {
    serde_json::json!({
        "loss": {"pattern": "\"loss\": ([0-9.]+)"},
        "never": {"pattern": "Test Accuracy: ([0-9.]+)%", "take": "max"},
    })
}

/// One run of `argv` on the node (with `metrics`, the spec's patterns): the node's CPU it
/// took (ms; `None` where no group could be made), its wall time, and the experiment.
fn one_run(
    node: &Node,
    name: &str,
    argv: &[String],
    metrics: Option<serde_json::Value>,
) -> Result<(Option<f64>, Duration, headroom_shared::ExperimentId)> {
    let before = node.cpu_ms();
    let t = Instant::now();
    let mut spec = serde_json::json!({"name": name, "command": argv,
        "resources": {"memory": "100MiB"}});
    if let Some(m) = metrics {
        spec["metrics"] = m;
    }
    let req = headroom_shared::api::SubmitRequest {
        spec,
        ..Default::default()
    };
    let exp = headroom_integration_tests::block_on(node.api.submit(&req))?
        .context("submit refused")?
        .experiment
        .context("stored")?;
    node.wait_done(exp, Duration::from_secs(1800))?;
    let wall = t.elapsed();
    let used = before.zip(node.cpu_ms()).map(|(b, a)| a - b);
    Ok((used, wall, exp))
}

pub fn run(lines: usize) -> Result<Report> {
    let node = Node::start(&NodeOptions {
        database_url: None,
        gpus: "1x80GiB",
        plan: "1",
    })?;
    // A warm-up: the first attempt's supervisor starts, the store warms.
    one_run(&node, "warm", &["true".to_string()], None)?;
    let (plain_cpu, plain_wall, _) = one_run(&node, "plain", &printer(lines, false), None)?;
    let (metric_cpu, metric_wall, exp) = one_run(&node, "metrics", &printer(lines, true), None)?;
    let (pattern_cpu, pattern_wall, pattern_exp) =
        one_run(&node, "patterns", &printer(lines, false), Some(patterns()))?;
    let by_pattern: Vec<AttemptSeries> = headroom_integration_tests::block_on(
        node.api
            .experiment_metrics(pattern_exp, &Default::default()),
    )?
    .context("metrics")?;
    let pattern_kept = by_pattern
        .first()
        .and_then(|a| a.series.get("loss"))
        .map_or(0, Vec::len);

    let series: Vec<AttemptSeries> = headroom_integration_tests::block_on(
        node.api.experiment_metrics(exp, &Default::default()),
    )?
    .context("metrics")?;
    let Some(a) = series.first() else {
        bail!("the metric run reported no metrics");
    };
    let kept = a.series.get("loss").map_or(0, Vec::len);
    let last_step = a.series.get("loss").and_then(|s| s.last()).map(|p| p.step);
    let final_loss = a.finals.get("loss").copied();
    let per_10k = |cpu: Option<f64>| cpu.map(|c| c / lines as f64 * 10_000.0);
    let extra = per_10k(metric_cpu.zip(plain_cpu).map(|(m, p)| (m - p).max(0.0)));
    let pattern_extra = per_10k(pattern_cpu.zip(plain_cpu).map(|(m, p)| (m - p).max(0.0)));
    let shown = |v: Option<f64>| v.map_or("not measured".to_string(), |v| format!("{v:.1} ms"));
    let table = format!(
        "| job printing {lines} lines | node CPU | per 10^4 lines | wall |\n| --- | --- | --- | --- |\n\
         | plain lines | {} | {} | {:.1} s |\n\
         | `HEADROOM_METRIC` lines | {} | {} | {:.1} s |\n\
         | the metric lines' own cost | | {} | |\n\
         | plain lines read by 2 `metrics:` patterns | {} | {} | {:.1} s |\n\
         | the patterns' own cost | | {} | |\n\n\
         Series kept: {kept} points of {lines} (bound {MAX_POINTS} + the latest), last step \
         {}, final `loss` {}.\n",
        shown(plain_cpu),
        shown(per_10k(plain_cpu)),
        plain_wall.as_secs_f64(),
        shown(metric_cpu),
        shown(per_10k(metric_cpu)),
        metric_wall.as_secs_f64(),
        shown(extra),
        shown(pattern_cpu),
        shown(per_10k(pattern_cpu)),
        pattern_wall.as_secs_f64(),
        shown(pattern_extra),
        last_step.map_or("-".into(), |s| s.to_string()),
        final_loss.map_or("-".into(), |v| v.to_string()),
    );
    let targets = vec![
        Target::new(
            "series kept within its bound, the latest point and the final value over every line",
            format!("{kept} points, last step {last_step:?}"),
            kept <= MAX_POINTS + 1 && last_step == Some(lines as u64) && final_loss.is_some(),
        ),
        Target::new(
            "metric lines cost the node at most 50 ms of CPU per 10^4 beyond plain lines",
            shown(extra),
            extra.is_none_or(|e| e <= 50.0),
        ),
        Target::new(
            "two patterns cost the node at most 50 ms of CPU per 10^4 lines beyond none",
            format!("{}, {pattern_kept} points kept", shown(pattern_extra)),
            pattern_extra.is_none_or(|e| e <= 50.0) && (1..=MAX_POINTS + 1).contains(&pattern_kept),
        ),
    ];
    let figures = serde_json::json!({
        "lines": lines,
        "kept_points": kept,
        "plain": {"cpu_ms": plain_cpu, "wall_s": plain_wall.as_secs_f64()},
        "metrics": {"cpu_ms": metric_cpu, "wall_s": metric_wall.as_secs_f64()},
        "patterns": {"cpu_ms": pattern_cpu, "wall_s": pattern_wall.as_secs_f64(), "kept_points": pattern_kept},
        "extra_cpu_ms_per_10k_lines": extra,
        "pattern_extra_cpu_ms_per_10k_lines": pattern_extra,
    });
    Ok(Report::new("metric_lines", figures, targets, table))
}
