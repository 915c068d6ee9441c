//! End of attempt -> slot free again: N short jobs back to back on one slot (one fake GPU,
//! plan 1); from a job's last act (its end stamp) to the next job's first (its start stamp),
//! which in headroom includes the verified cleanup of the ended attempt and its report.
//! task-spooler on one slot in the same run for reference. headroom's gap is split by the
//! attempts' own times: the ended job's exit seen by its supervisor, then the next lease
//! (the verified cleanup, the end's report and the claim), the next job's spawn, and its
//! exec to its first act.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use headroom_integration_tests::block_on;

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

/// One headroom job's stamps (ns) and its attempt's times (ms since the epoch).
struct Run {
    start_ns: i128,
    end_ns: i128,
    /// The supervisor saw the job's exit; the lease was taken; the process was started.
    exit_seen_ms: i64,
    leased_ms: i64,
    started_ms: i64,
    cleanup_ms: f64,
}

/// Medians (ms) of where the gaps between consecutive runs went, each gap's parts adding up
/// to it: (part, median) in order.
fn breakdown(mut runs: Vec<Run>) -> Vec<(&'static str, f64)> {
    runs.sort_by_key(|r| r.start_ns);
    let mut parts: [Vec<f64>; 5] = Default::default();
    for w in runs.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let ms = |ns: i128| ns as f64 / 1e6;
        parts[0].push(a.exit_seen_ms as f64 - ms(a.end_ns));
        parts[1].push(a.cleanup_ms);
        parts[2].push((b.leased_ms - a.exit_seen_ms) as f64 - a.cleanup_ms);
        parts[3].push((b.started_ms - b.leased_ms) as f64);
        parts[4].push(ms(b.start_ns) - b.started_ms as f64);
    }
    let names = [
        "the job's last act -> its exit seen by its supervisor",
        "the verified cleanup (the whole tree gone, the GPU released)",
        "the end's journal and report, and the next claim",
        "the next lease -> its process started",
        "the process started -> the job's first act",
    ];
    names
        .into_iter()
        .zip(parts)
        .map(|(n, mut v)| {
            v.sort_by(f64::total_cmp);
            (n, percentile(&v, 0.5))
        })
        .collect()
}

/// The runs of experiment `exp`: each job's stamps in `dir` beside its attempt's times.
fn runs(
    node: &Node,
    exp: headroom_shared::ExperimentId,
    dir: &std::path::Path,
) -> Result<Vec<Run>> {
    let mut out = Vec::new();
    let stamps: BTreeMap<String, (i128, i128)> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let p = e.ok()?.path();
            let name = p.file_stem()?.to_str()?.to_string();
            (p.extension()? == "start").then(|| {
                Some((
                    name,
                    (read_stamp(&p)?, read_stamp(&p.with_extension("end"))?),
                ))
            })?
        })
        .collect();
    for j in block_on(node.api.jobs(Some(exp), None))?? {
        let d = block_on(node.api.job(j.id))??;
        let a = d
            .attempts_detail
            .last()
            .context("a job without an attempt")?;
        let &(start_ns, end_ns) = stamps
            .get(&j.id.to_string())
            .with_context(|| format!("no stamps of job {}", j.id))?;
        out.push(Run {
            start_ns,
            end_ns,
            exit_seen_ms: a
                .ended_at
                .context("an attempt without an end")?
                .timestamp_millis(),
            leased_ms: a.leased_at.timestamp_millis(),
            started_ms: a
                .started_at
                .context("an attempt never started")?
                .timestamp_millis(),
            cleanup_ms: a.cleanup_ms.unwrap_or_default() as f64,
        });
    }
    Ok(out)
}

pub fn run(jobs: usize) -> Result<Report> {
    let job = stamp();
    let (ours, parts) = {
        let node = Node::start(&NodeOptions {
            database_url: None,
            gpus: "1x80GiB",
            plan: "1",
        })?;
        let dir = shared_dir("hr-slot")?;
        let d = dir.path().display().to_string();
        let exp = node.submit("back-to-back", &[&job, &d, "-", "0.05"], jobs)?;
        node.wait_done(exp, Duration::from_secs(600))?;
        (gaps(dir.path())?, breakdown(runs(&node, exp, dir.path())?))
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
    let mut table = format!(
        "{table}\nWhere headroom's gap goes (medians of each part; the store keeps milliseconds):\n\n\
         | part | median |\n| --- | --- |\n"
    );
    for (part, m) in &parts {
        table.push_str(&format!("| {part} | {m:.1} ms |\n"));
    }
    let targets = vec![
        Target::new(
            "median end -> slot free, cleanup verified, at most 1 s",
            format!("{m:.2} ms"),
            m <= 1000.0,
        ),
        Target::new(
            "median end -> next start at or below task-spooler's in the same run",
            format!("{m:.2} ms against {tm:.2} ms ({:.2}x)", m / tm),
            m <= tm,
        ),
    ];
    let figures = serde_json::json!({
        "jobs": jobs,
        "headroom_ms": {"median": m, "p99": p99},
        "task_spooler_ms": {"median": tm, "p99": tp99},
        "headroom_parts_ms": parts.iter().map(|(p, m)| serde_json::json!({"part": p, "median": m})).collect::<Vec<_>>(),
    });
    Ok(Report::new("slot_free", figures, targets, table))
}
