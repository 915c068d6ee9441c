//! Dispatch throughput: N trivial one-GPU jobs (`true`, one grid submit) on 8 fake GPUs, plan
//! 1 and 2 each, on SQLite and PostgreSQL, against task-spooler draining the same N jobs on 8
//! slots and the raw spawn rate (`true`, 8 in flight) as the ceiling, all in one run. CPU per
//! job of each side from its CPU-accounting group.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use headroom_integration_tests::Postgres;
use serde::Serialize;

use super::{Report, Target};
use crate::system::{Node, NodeOptions};
use crate::tsp::TaskSpooler;

pub struct Size {
    pub jobs: usize,
    pub gpus: usize,
}

#[derive(Debug, Serialize)]
pub struct Side {
    pub name: String,
    pub jobs_per_s: f64,
    /// CPU of everything the side ran (servers, clients, supervisors, jobs) per job, ms.
    pub cpu_ms_per_job: Option<f64>,
}

/// `true` spawned and reaped with `in_flight` running at once: the ceiling of any launcher.
pub fn raw_spawn_rate(n: usize, in_flight: usize) -> Result<f64> {
    let t = Instant::now();
    let mut running: std::collections::VecDeque<Child> = Default::default();
    for _ in 0..n {
        if running.len() >= in_flight
            && let Some(mut c) = running.pop_front()
        {
            c.wait()?;
        }
        running.push_back(
            Command::new("/bin/true")
                .stdin(Stdio::null())
                .spawn()
                .context("spawning /bin/true")?,
        );
    }
    for mut c in running {
        c.wait()?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// task-spooler's server takes at most 1000 connections, and every queued job's client holds
/// one while it waits: a full queue behind held slots can be this deep at most.
pub const TSP_QUEUE_MAX: usize = 980;

/// task-spooler on `slots` slots, two ways: its users' way (a `tsp` per job, each job
/// starting as soon as a slot is free), from the first submission to the last end; and the
/// drain alone of a queue filled behind jobs holding every slot, then released at once
/// (at most [`TSP_QUEUE_MAX`] deep). CPU per job from the first way.
pub fn tsp(jobs: usize, slots: usize) -> Result<(Side, Side)> {
    let t = TaskSpooler::start_counted(slots)?;
    let cpu0 = t.cpu_ms();
    let start = Instant::now();
    t.submit_many(&["true"], jobs)?;
    t.wait_finished(jobs, Duration::from_secs(600))?;
    let all = start.elapsed();
    let cpu = match (cpu0, t.cpu_ms()) {
        (Some(a), Some(b)) => Some((b - a) / jobs as f64),
        _ => None,
    };
    drop(t);

    let queued = jobs.min(TSP_QUEUE_MAX);
    let t = TaskSpooler::start(slots)?;
    let gate = t.block(slots)?;
    t.submit_many(&["true"], queued)?;
    let d = Instant::now();
    gate.open()?;
    t.wait_finished(queued + slots, Duration::from_secs(600))?;
    let drain = d.elapsed();
    Ok((
        Side {
            name: format!("task-spooler, {slots} slots: a `tsp` per job, submit to last end"),
            jobs_per_s: jobs as f64 / all.as_secs_f64(),
            cpu_ms_per_job: cpu,
        },
        Side {
            name: format!("task-spooler, {slots} slots: drain alone of {queued} queued"),
            jobs_per_s: queued as f64 / drain.as_secs_f64(),
            cpu_ms_per_job: None,
        },
    ))
}

/// headroom on `gpus` fake GPUs with `per_gpu` slots each: submit of N jobs to their end.
pub fn headroom(
    store: &str,
    database_url: Option<&str>,
    gpus: usize,
    per_gpu: usize,
    jobs: usize,
) -> Result<Side> {
    let plan = vec![per_gpu.to_string(); gpus].join(",");
    let node = Node::start(&NodeOptions {
        database_url,
        gpus: &format!("{gpus}x80GiB"),
        plan: &plan,
    })?;
    // Warm: supervisors waiting for leases, connections open (task-spooler's server is up).
    let warm = node.submit("warm", &["true"], gpus * per_gpu * 2)?;
    node.wait_done(warm, Duration::from_secs(120))?;
    std::thread::sleep(Duration::from_millis(300));
    let cpu0 = node.cpu_ms();
    let t = Instant::now();
    let exp = node.submit("burst", &["true"], jobs)?;
    node.wait_done(exp, Duration::from_secs(900))?;
    let rate = jobs as f64 / t.elapsed().as_secs_f64();
    // The last ends are reported before their supervisors are back waiting.
    std::thread::sleep(Duration::from_millis(300));
    let cpu = match (cpu0, node.cpu_ms()) {
        (Some(a), Some(b)) => Some((b - a) / jobs as f64),
        _ => None,
    };
    Ok(Side {
        name: format!("headroom, {store}, {gpus} GPUs x plan {per_gpu}"),
        jobs_per_s: rate,
        cpu_ms_per_job: cpu,
    })
}

pub fn run(size: &Size) -> Result<Report> {
    let n = size.jobs;
    let raw = raw_spawn_rate(n, 8)?;
    let (tsp_all, tsp_drain) = tsp(n, size.gpus)?;
    let pg = Postgres::start_durable()?;
    let url = pg.url();
    let mut sides = vec![
        headroom("SQLite", None, size.gpus, 1, n)?,
        headroom("SQLite", None, size.gpus, 2, n)?,
        headroom("PostgreSQL", Some(&url), size.gpus, 1, n)?,
        headroom("PostgreSQL", Some(&url), size.gpus, 2, n)?,
    ];
    // task-spooler once more at the end, so drift over the run weighs on both.
    let (tsp_all2, tsp_drain2) = tsp(n, size.gpus)?;
    let tsp_rate = (tsp_all.jobs_per_s + tsp_all2.jobs_per_s) / 2.0;
    let drain_rate = (tsp_drain.jobs_per_s + tsp_drain2.jobs_per_s) / 2.0;
    let tsp_cpu = tsp_all
        .cpu_ms_per_job
        .zip(tsp_all2.cpu_ms_per_job)
        .map(|(a, b)| (a + b) / 2.0);
    sides.extend([tsp_all, tsp_drain, tsp_all2, tsp_drain2]);

    let mut table = format!(
        "raw spawn of `true`, 8 in flight: {raw:.0}/s\n\n| side | {n} jobs of `true` | vs task-spooler | vs its drain alone | vs raw spawn | CPU ms per job | vs task-spooler's |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for s in &sides {
        table.push_str(&format!(
            "| {} | {:.0}/s | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            s.name,
            s.jobs_per_s,
            s.jobs_per_s / tsp_rate,
            s.jobs_per_s / drain_rate,
            s.jobs_per_s / raw,
            s.cpu_ms_per_job
                .map_or("not measured".into(), |c| format!("{c:.2}")),
            s.cpu_ms_per_job
                .zip(tsp_cpu)
                .map_or("-".into(), |(c, t)| format!("{:.2}", c / t)),
        ));
    }
    let by = |name: &str| sides.iter().find(|s| s.name.contains(name));
    let sqlite = by("SQLite, 8 GPUs x plan 1")
        .or(by("SQLite"))
        .map_or(0.0, |s| s.jobs_per_s);
    let postgres = by("PostgreSQL").map_or(0.0, |s| s.jobs_per_s);
    let targets = vec![
        Target::new(
            "SQLite at least 1.5x task-spooler's rate",
            format!(
                "{:.2}x ({sqlite:.0} against {tsp_rate:.0}/s)",
                sqlite / tsp_rate
            ),
            sqlite >= 1.5 * tsp_rate,
        ),
        Target::new(
            "PostgreSQL at least 1.0x task-spooler's rate",
            format!(
                "{:.2}x ({postgres:.0} against {tsp_rate:.0}/s)",
                postgres / tsp_rate
            ),
            postgres >= tsp_rate,
        ),
    ];
    let figures = serde_json::json!({
        "jobs": n, "raw_spawn_per_s": raw, "sides": sides,
        "task_spooler_per_s": tsp_rate, "task_spooler_drain_alone_per_s": drain_rate,
    });
    Ok(Report::new("dispatch", figures, targets, table))
}
