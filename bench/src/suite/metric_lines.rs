//! What a job's metric lines cost: one job printing N `HEADROOM_METRIC` lines as fast as it
//! can, against the same job printing N plain lines of the same length (its log read, kept
//! and shipped all the same), on one slot of the real system; the CPU of everything the node
//! ran (coordinator, agent, supervisors, the job) from its `cpuacct` group, and what the
//! attempt kept (its series bounded, its final value over every line).

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

/// One run of `argv` on the node: the node's CPU it took (ms; `None` where no group could
/// be made), its wall time, and the experiment.
fn one_run(
    node: &Node,
    name: &str,
    argv: &[String],
) -> Result<(Option<f64>, Duration, headroom_shared::ExperimentId)> {
    let before = node.cpu_ms();
    let t = Instant::now();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let exp = node.submit(name, &argv, 1)?;
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
    one_run(&node, "warm", &["true".to_string()])?;
    let (plain_cpu, plain_wall, _) = one_run(&node, "plain", &printer(lines, false))?;
    let (metric_cpu, metric_wall, exp) = one_run(&node, "metrics", &printer(lines, true))?;

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
    let shown = |v: Option<f64>| v.map_or("not measured".to_string(), |v| format!("{v:.1} ms"));
    let table = format!(
        "| job printing {lines} lines | node CPU | per 10^4 lines | wall |\n| --- | --- | --- | --- |\n\
         | plain lines | {} | {} | {:.1} s |\n\
         | `HEADROOM_METRIC` lines | {} | {} | {:.1} s |\n\
         | the metric lines' own cost | | {} | |\n\n\
         Series kept: {kept} points of {lines} (bound {MAX_POINTS} + the latest), last step \
         {}, final `loss` {}.\n",
        shown(plain_cpu),
        shown(per_10k(plain_cpu)),
        plain_wall.as_secs_f64(),
        shown(metric_cpu),
        shown(per_10k(metric_cpu)),
        metric_wall.as_secs_f64(),
        shown(extra),
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
    ];
    let figures = serde_json::json!({
        "lines": lines,
        "kept_points": kept,
        "plain": {"cpu_ms": plain_cpu, "wall_s": plain_wall.as_secs_f64()},
        "metrics": {"cpu_ms": metric_cpu, "wall_s": metric_wall.as_secs_f64()},
        "extra_cpu_ms_per_10k_lines": extra,
    });
    Ok(Report::new("metric_lines", figures, targets, table))
}
