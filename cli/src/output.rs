//! What the CLI prints: tables, job detail, logs, progress.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Result, anyhow};
use headroom_shared::api::{
    ExperimentSummary, JobDetail, JobSummary, NodeView, PeakSource, StateCounts, SubmitResponse,
    TokenView,
};
use headroom_shared::expand::value_text;
use headroom_shared::{AttemptId, ExperimentId, JobId, MemSize};
use indicatif::{ProgressBar, ProgressStyle};

use crate::client::Api;

fn mib(m: u64) -> String {
    MemSize::from_mib(m).to_string()
}

fn params_text(j: &JobSummary) -> String {
    j.params
        .iter()
        .map(|(k, v)| format!("{k}={}", value_text(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn jobs_table(jobs: &[JobSummary]) {
    println!(
        "{:<36}  {:<16}  {:>5}  {:<10}  {:>3}  {:<12}  {:<10}  {:<21}  {:<12}  PARAMS",
        "JOB", "EXPERIMENT", "INDEX", "STATE", "ATT", "NODE:GPUS", "FAILURE", "WAITING", "BY"
    );
    for j in jobs {
        let place = match &j.node {
            Some(n) => format!(
                "{n}:{}",
                j.gpu_indices
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => "-".into(),
        };
        println!(
            "{:<36}  {:<16}  {:>5}  {:<10}  {:>3}  {:<12}  {:<10}  {:<21}  {:<12}  {}",
            j.id,
            j.experiment_name,
            j.index,
            j.state.as_str(),
            j.attempts,
            place,
            j.last_failure.map(|f| f.as_str()).unwrap_or("-"),
            j.pending_reason.as_ref().map(|r| r.code()).unwrap_or("-"),
            j.submitted_by,
            params_text(j)
        );
    }
}

fn counts_text(c: &StateCounts) -> String {
    format!(
        "{} queued, {} running, {} retrying, {} succeeded, {} failed, {} cancelled",
        c.queued + c.leased,
        c.running,
        c.retrying,
        c.succeeded,
        c.failed,
        c.cancelled
    )
}

pub fn experiments_table(exps: &[ExperimentSummary]) {
    println!(
        "{:<36}  {:<20}  {:<12}  {:>6}  PROGRESS",
        "EXPERIMENT", "NAME", "BY", "JOBS"
    );
    for e in exps {
        println!(
            "{:<36}  {:<20}  {:<12}  {:>6}  {}",
            e.id,
            e.name,
            e.submitted_by,
            e.counts.total(),
            counts_text(&e.counts)
        );
    }
}

pub fn job_detail(d: &JobDetail) {
    let j = &d.summary;
    println!("job        {}", j.id);
    println!("experiment {} ({})", j.experiment_name, j.experiment);
    println!("submitted  by {}", j.submitted_by);
    println!(
        "index      {} (config {}, run {})",
        j.index, j.config, j.run
    );
    println!("state      {}", j.state);
    if let Some(why) = &j.pending_reason {
        println!("waiting    {why}");
    }
    println!("params     {}", params_text(j));
    println!("command    {}", d.argv.join(" "));
    println!(
        "resources  {} GPU(s), declared estimate {}, memory key `{}`",
        j.gpus,
        j.estimate_mib.map(mib).unwrap_or_else(|| "none".into()),
        d.memory_key
    );
    if !d.oom_ladder.is_empty() {
        println!(
            "oom ladder {} of {} steps applied",
            d.ladder_step,
            d.oom_ladder.len()
        );
    }
    println!("profile    {}", d.profile);
    if let Some(t) = d.timeout_ms {
        println!("timeout    {}", humantime_ms(t));
    }
    println!(
        "attempts   {} of at most {} (retry on: {})",
        j.attempts,
        j.max_attempts,
        d.retry_on
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for a in &d.attempts_detail {
        let outcome = match (a.success, a.failure_class) {
            (Some(true), _) => "succeeded".to_string(),
            (_, Some(c)) => format!("failed: {c}"),
            _ => format!("{:?}", a.phase).to_lowercase(),
        };
        println!(
            "  #{} {}  node {} GPU {}  {}  exit {}  estimate {} ({})  peak {}  cleanup {}{}{}",
            a.number,
            a.id,
            a.node,
            a.gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            outcome,
            a.exit_code
                .map(|c| c.to_string())
                .or(a.signal.map(|s| format!("signal {s}")))
                .unwrap_or_else(|| "-".into()),
            a.estimate_mib.map(mib).unwrap_or_else(|| "-".into()),
            if a.estimate_source == "none" {
                "ran alone"
            } else {
                a.estimate_source.as_str()
            },
            match (a.peak_mem_mib, a.peak_source) {
                (Some(m), Some(PeakSource::DeviceDelta)) =>
                    format!("{} ({})", mib(m), PeakSource::DeviceDelta.describe()),
                (Some(m), _) => mib(m),
                (None, _) => "-".into(),
            },
            match (a.cleanup_verified, a.cleanup_ms) {
                (Some(true), Some(ms)) => format!("verified in {ms} ms"),
                (Some(false), _) => "NOT verified".into(),
                _ => "-".into(),
            },
            if a.ladder_step > 0 {
                format!("  ladder step {}", a.ladder_step)
            } else {
                String::new()
            },
            if a.contaminated == Some(true) {
                "  CONTAMINATED"
            } else {
                ""
            }
        );
        if let (Some(s), Some(e)) = (a.started_at, a.ended_at) {
            println!("      {} -> {}", s.to_rfc3339(), e.to_rfc3339());
        }
    }
    if let Some(tail) = d.attempts_detail.last().and_then(|a| a.log_tail.as_deref())
        && !tail.trim().is_empty()
    {
        println!("log tail of the last attempt:");
        for line in tail
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("  | {line}");
        }
    }
}

fn humantime_ms(ms: u64) -> String {
    humantime_secs(ms / 1000)
}

fn humantime_secs(s: u64) -> String {
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

pub fn nodes_table(nodes: &[NodeView]) {
    for n in nodes {
        println!(
            "node {}  plan {}  headroom {}  {}",
            n.name,
            n.plan,
            n.headroom,
            if n.alive {
                "alive"
            } else {
                "NOT SEEN RECENTLY"
            }
        );
        println!(
            "  {:>3}  {:<18}  {:>9}  {:>9}  {:>9}  {:>9}  SLOTS",
            "GPU", "NAME", "TOTAL", "USED", "FREE", "PLACED"
        );
        for g in &n.gpus {
            println!(
                "  {:>3}  {:<18}  {:>9}  {:>9}  {:>9}  {:>9}  {}/{}",
                g.index,
                g.name,
                mib(g.total_mib),
                g.used_mib.map(mib).unwrap_or_else(|| "?".into()),
                g.free_mib.map(mib).unwrap_or_else(|| "?".into()),
                mib(g.estimated_mib),
                g.slots_used,
                g.slots
            );
            if let Some(e) = &g.error {
                println!("       CANNOT BE READ (no work placed here): {e}");
            }
            for q in &g.quarantine {
                println!(
                    "       QUARANTINED since {} (attempt {}): {}",
                    q.since.to_rfc3339(),
                    q.attempt,
                    q.reason
                );
            }
            for p in &g.foreign {
                println!(
                    "       foreign process {} ({}) holds {}: {}",
                    p.pid,
                    p.user.as_deref().unwrap_or("?"),
                    mib(p.used_mib),
                    p.command.as_deref().unwrap_or("?")
                );
            }
        }
    }
}

/// What the coordinator warned about at submit (e.g. a job larger than every GPU).
/// `--output`: tables for people, JSON (the API's own types and field names) for programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Prints `v` as the API returns it (pretty JSON).
pub fn json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn tokens_table(tokens: &[TokenView]) {
    println!(
        "{:<16}  {:<20}  {:<6}  {:<12}  {:<20}  {:<20}  REVOKED",
        "ID", "NAME", "ROLE", "CREATED BY", "CREATED", "EXPIRES"
    );
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".into())
    };
    for t in tokens {
        println!(
            "{:<16}  {:<20}  {:<6}  {:<12}  {:<20}  {:<20}  {}",
            t.id,
            t.name,
            t.role.as_str(),
            t.created_by,
            t.created_at.format("%Y-%m-%d %H:%M:%S"),
            time(t.expires_at),
            time(t.revoked_at)
        );
    }
}

pub fn warnings(resp: &SubmitResponse) {
    for w in &resp.warnings {
        eprintln!("warning: {w}");
    }
}

pub fn preview(resp: &SubmitResponse) {
    println!(
        "dry run: experiment {} expands to {} jobs (seed {}); nothing stored",
        resp.name, resp.jobs, resp.seed
    );
    for j in resp.preview.iter().flatten() {
        let params: Vec<String> = j
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect();
        println!(
            "{:>5}  {}  | {}",
            j.index,
            params.join(" "),
            j.argv.join(" ")
        );
    }
}

/// Waits for the experiment (or all jobs), showing a progress bar; exit code 0 only when
/// every job succeeded.
pub async fn wait(api: &Api, experiment: Option<ExperimentId>) -> Result<i32> {
    let mut p = api.progress(experiment, None).await?;
    // Without a terminal the bar is invisible: print a line now and then instead.
    let terminal = std::io::stderr().is_terminal();
    let mut last_line = std::time::Instant::now();
    let bar = if terminal {
        ProgressBar::new(p.counts.total())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} done  {msg}")
            .map_err(|e| anyhow!("{e}"))?
            .progress_chars("=> "),
    );
    loop {
        bar.set_length(p.counts.total());
        bar.set_position(p.counts.finished());
        bar.set_message(format!(
            "{} running, {} waiting, {} failed",
            p.counts.running + p.counts.leased,
            p.counts.queued + p.counts.retrying,
            p.counts.failed
        ));
        if p.counts.finished() == p.counts.total() {
            break;
        }
        if !terminal && last_line.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "progress: {}/{} done, {}",
                p.counts.finished(),
                p.counts.total(),
                counts_text(&p.counts)
            );
            last_line = std::time::Instant::now();
        }
        p = api.progress(experiment, Some(p.version)).await?;
    }
    bar.finish();
    let c = &p.counts;
    println!("done: {}", counts_text(c));
    Ok(if c.failed + c.cancelled == 0 { 0 } else { 2 })
}

pub async fn logs(api: &Api, id: &str, follow: bool) -> Result<()> {
    let attempt: AttemptId = match id.parse::<JobId>() {
        Ok(job) => match api.find_job(job).await? {
            Some(d) => d
                .attempts_detail
                .last()
                .map(|a| a.id)
                .ok_or_else(|| anyhow!("job {job} has not started yet"))?,
            None => id
                .parse()
                .map_err(|_| anyhow!("no job or attempt `{id}`"))?,
        },
        Err(_) => return Err(anyhow!("`{id}` is not a job or attempt id")),
    };
    let mut offset = 0;
    let mut out = std::io::stdout();
    loop {
        let chunk = api
            .log(attempt, offset, if follow { 10_000 } else { 0 })
            .await?;
        out.write_all(&chunk.bytes)?;
        out.flush()?;
        offset = chunk.next;
        if !follow || (chunk.ended && chunk.bytes.is_empty()) {
            return Ok(());
        }
        if chunk.bytes.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
