//! Agent overhead: CPU of one idle agent with 8 fake GPUs sampling telemetry at the default
//! 1 Hz (and of its waiting supervisors), as a share of one core over a window.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use headroom_integration_tests::{children_of, stat_fields};

use super::{Report, Target};
use crate::system::{Node, NodeOptions};

/// CPU ms of `pid` and of its live children (waiting supervisors), reaped ones included.
fn cpu_ms(pid: u32) -> f64 {
    let one = |p: u32| {
        stat_fields(p).map_or(0.0, |f| {
            f.get(11..15)
                .map(|v| v.iter().filter_map(|x| x.parse::<f64>().ok()).sum::<f64>() * 10.0)
                .unwrap_or_default()
        })
    };
    one(pid) + children_of(pid).into_iter().map(one).sum::<f64>()
}

pub fn run(window: Duration) -> Result<Report> {
    let node = Node::start(&NodeOptions {
        database_url: None,
        gpus: "8x80GiB",
        plan: "1,1,1,1,1,1,1,1",
    })?;
    let pid = node
        .agent
        .as_ref()
        .and_then(|a| a.pid())
        .context("the agent is not running")?;
    // Past start-up (registration, the first supervisors).
    std::thread::sleep(Duration::from_secs(2));
    let (c0, t) = (cpu_ms(pid), Instant::now());
    std::thread::sleep(window);
    let used = cpu_ms(pid) - c0;
    let share = used / t.elapsed().as_millis() as f64 * 100.0;
    let table = format!(
        "| agent, 8 fake GPUs, telemetry 1 Hz, idle | window | CPU | share of one core |\n| --- | --- | --- | --- |\n\
         | agent and its waiting supervisors | {:.0} s | {used:.0} ms | {share:.2} % |\n",
        window.as_secs_f64()
    );
    let targets = vec![Target::new(
        "agent CPU at most 1 % of a core",
        format!("{share:.2} %"),
        share <= 1.0,
    )];
    let figures =
        serde_json::json!({"window_s": window.as_secs_f64(), "cpu_ms": used, "core_pct": share});
    Ok(Report::new("agent_cpu", figures, targets, table))
}
