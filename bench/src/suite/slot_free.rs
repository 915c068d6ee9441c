//! End of attempt -> slot free again: N short jobs back to back on one slot (one fake GPU,
//! plan 1); from a job's last act (its end stamp) to the next job's first (its start stamp),
//! which in headroom includes the verified cleanup of the ended attempt and its report.
//! task-spooler on one slot in the same run for reference.

use std::time::Duration;

use anyhow::{Result, bail};

use super::{Report, Target, percentile, read_stamp, shared_dir, stamp};
use crate::system::{Node, NodeOptions};
use crate::tsp::TaskSpooler;

/// Gaps (ms) between each job's end and the next one's start, from the stamps in `dir`.
fn gaps(dir: &std::path::Path) -> Result<Vec<f64>> {
    let mut runs = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "start") {
            let end = p.with_extension("end");
            match (read_stamp(&p), read_stamp(&end)) {
                (Some(s), Some(e)) => runs.push((s, e)),
                _ => bail!("{} has no end stamp", p.display()),
            }
        }
    }
    runs.sort();
    let mut g: Vec<f64> = runs
        .windows(2)
        .map(|w| (w[1].0 - w[0].1) as f64 / 1e6)
        .collect();
    g.sort_by(f64::total_cmp);
    Ok(g)
}

pub fn run(jobs: usize) -> Result<Report> {
    let job = stamp();
    let ours = {
        let node = Node::start(&NodeOptions {
            database_url: None,
            gpus: "1x80GiB",
            plan: "1",
        })?;
        let dir = shared_dir("hr-slot")?;
        let d = dir.path().display().to_string();
        let exp = node.submit("back-to-back", &[&job, &d, "-", "0.05"], jobs)?;
        node.wait_done(exp, Duration::from_secs(600))?;
        gaps(dir.path())?
    };
    let theirs = {
        let tsp = TaskSpooler::start(1)?;
        let dir = shared_dir("hr-slot-tsp")?;
        let d = dir.path().display().to_string();
        for i in 0..jobs {
            tsp.submit(&[&job, &d, &format!("t{i}"), "0.05"])?;
        }
        tsp.wait_finished(jobs, Duration::from_secs(600))?;
        gaps(dir.path())?
    };
    let (m, p99) = (percentile(&ours, 0.5), percentile(&ours, 0.99));
    let (tm, tp99) = (percentile(&theirs, 0.5), percentile(&theirs, 0.99));
    let table = format!(
        "| side | gaps | median | p99 |\n| --- | --- | --- | --- |\n\
         | headroom (cleanup verified, SQLite) | {} | {m:.2} ms | {p99:.2} ms |\n\
         | task-spooler (nothing verified) | {} | {tm:.2} ms | {tp99:.2} ms |\n",
        ours.len(),
        theirs.len()
    );
    let targets = vec![Target::new(
        "median end -> slot free, cleanup verified, at most 1 s",
        format!("{m:.2} ms"),
        m <= 1000.0,
    )];
    let figures = serde_json::json!({
        "jobs": jobs,
        "headroom_ms": {"median": m, "p99": p99},
        "task_spooler_ms": {"median": tm, "p99": tp99},
    });
    Ok(Report::new("slot_free", figures, targets, table))
}
