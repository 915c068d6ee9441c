//! Makespan: N x `sleep S` on K slots against the ideal ceil(N/K) x S, for headroom (one grid
//! submit; K/2 fake GPUs with plan 2 each) and task-spooler (a `tsp` per job), from just
//! before the first submission to the last job's end.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Report, Target};
use crate::system::{Node, NodeOptions};
use crate::tsp::TaskSpooler;

pub struct Size {
    pub jobs: usize,
    pub slots: usize,
    pub seconds: f64,
}

pub fn run(size: &Size) -> Result<Report> {
    let ideal = (size.jobs.div_ceil(size.slots)) as f64 * size.seconds;
    let secs = size.seconds.to_string();
    let gpus = size.slots.div_ceil(2);
    let node = Node::start(&NodeOptions {
        database_url: None,
        gpus: &format!("{gpus}x80GiB"),
        plan: &vec!["2"; gpus].join(","),
    })?;
    let warm = node.submit("warm", &["true"], size.slots)?;
    node.wait_done(warm, Duration::from_secs(60))?;
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let exp = node.submit("sleeps", &["sleep", &secs], size.jobs)?;
    node.wait_done(exp, Duration::from_secs_f64(ideal * 10.0 + 60.0))?;
    let ours = t.elapsed().as_secs_f64();
    drop(node);

    let tsp = TaskSpooler::start(size.slots)?;
    let t = Instant::now();
    tsp.submit_many(&["sleep", &secs], size.jobs)?;
    tsp.wait_finished(size.jobs, Duration::from_secs_f64(ideal * 10.0 + 60.0))?;
    let theirs = t.elapsed().as_secs_f64();

    let (r, rt) = (ours / ideal, theirs / ideal);
    let table = format!(
        "| side | {n} x `sleep {secs}` on {k} slots | vs ideal {ideal:.1} s |\n| --- | --- | --- |\n\
         | headroom (SQLite) | {ours:.3} s | {r:.3} |\n| task-spooler | {theirs:.3} s | {rt:.3} |\n",
        n = size.jobs,
        k = size.slots
    );
    let targets = vec![Target::new(
        "makespan at most 1.02x the ideal",
        format!("{r:.3}x (task-spooler {rt:.3}x)"),
        r <= 1.02,
    )];
    let figures = serde_json::json!({
        "jobs": size.jobs, "slots": size.slots, "seconds": size.seconds, "ideal_s": ideal,
        "headroom_s": ours, "task_spooler_s": theirs,
    });
    Ok(Report::new("makespan", figures, targets, table))
}
