//! Submit -> start on an idle node: single submissions from the CLI (`headroom submit`, its
//! process start included) alternating with `tsp` submissions, the job reading the clock
//! first thing (`headroom-bench-stamp`). headroom on SQLite, durable.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use headroom_integration_tests::binary;

use super::{Report, Target, now_ns, percentile, read_stamp, shared_dir, stamp};
use crate::system::{Node, NodeOptions, run_ok};
use crate::tsp::TaskSpooler;

fn wait_stamp(path: &std::path::Path) -> Result<i128> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = read_stamp(path) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            bail!("the job never wrote {}", path.display());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

pub fn run(submissions: usize) -> Result<Report> {
    let node = Node::start(&NodeOptions {
        database_url: None,
        gpus: "8x80GiB",
        plan: "1,1,1,1,1,1,1,1",
    })?;
    let tsp = TaskSpooler::start(8)?;
    let dir = shared_dir("hr-latency")?;
    let job = stamp();
    let cli = binary("headroom");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    // Warm both (supervisors waiting, task-spooler's server started, page cache).
    for i in 0..submissions + 5 {
        let spec = dir.path().join(format!("spec{i}.json"));
        std::fs::write(
            &spec,
            serde_json::json!({"name": format!("lat{i}"),
                "command": [&job, dir.path(), format!("h{i}")]})
            .to_string(),
        )?;
        let t0 = now_ns();
        run_ok(
            Command::new(&cli)
                .args(["submit", "--server", &node.url])
                .arg(&spec)
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            "headroom submit",
        )?;
        let h = wait_stamp(&dir.path().join(format!("h{i}.start")))? - t0;

        let d = dir.path().display().to_string();
        let t0 = now_ns();
        tsp.submit(&[&job, &d, &format!("t{i}")])?;
        let t = wait_stamp(&dir.path().join(format!("t{i}.start")))? - t0;
        if i >= 5 {
            ours.push(h as f64 / 1e6);
            theirs.push(t as f64 / 1e6);
        }
        // Both idle again before the next pair.
        std::thread::sleep(Duration::from_millis(30));
    }
    ours.sort_by(f64::total_cmp);
    theirs.sort_by(f64::total_cmp);
    let (h50, h99) = (percentile(&ours, 0.5), percentile(&ours, 0.99));
    let (t50, t99) = (percentile(&theirs, 0.5), percentile(&theirs, 0.99));
    let table = format!(
        "| side | submissions | p50 | p90 | p99 |\n| --- | --- | --- | --- | --- |\n\
         | headroom (CLI, SQLite) | {n} | {h50:.2} ms | {:.2} ms | {h99:.2} ms |\n\
         | task-spooler (`tsp`) | {n} | {t50:.2} ms | {:.2} ms | {t99:.2} ms |\n",
        percentile(&ours, 0.9),
        percentile(&theirs, 0.9),
        n = ours.len()
    );
    let targets = vec![
        Target::new(
            "p50 no higher than task-spooler's",
            format!("{h50:.2} against {t50:.2} ms ({:.2}x)", h50 / t50),
            h50 <= t50,
        ),
        Target::new(
            "p99 at most 2x task-spooler's",
            format!("{h99:.2} against {t99:.2} ms ({:.2}x)", h99 / t99),
            h99 <= 2.0 * t99,
        ),
    ];
    let figures = serde_json::json!({
        "submissions": ours.len(),
        "headroom_ms": {"p50": h50, "p90": percentile(&ours, 0.9), "p99": h99},
        "task_spooler_ms": {"p50": t50, "p90": percentile(&theirs, 0.9), "p99": t99},
    });
    Ok(Report::new("latency", figures, targets, table))
}
