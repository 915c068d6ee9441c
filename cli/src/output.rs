//! What the CLI prints: tables, job detail, logs, progress.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use headroom_shared::api::{
    AttemptPhase, AttemptTelemetry, AttemptView, ExperimentSummary, GpuSeries, JobDetail,
    JobSummary, NodeView, PeakSource, StateCounts, SubmitResponse, TelemetrySample, TokenView,
};
use headroom_shared::expand::value_text;
use headroom_shared::{AttemptId, ExperimentId, FailureClass, JobId, MemSize};
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

/// Prints rows under a header, each column as wide as its widest cell (a long experiment
/// name moves no other column out of line; wide characters count double), two spaces
/// apart; `right` columns align right; the last column is not padded.
fn table(header: &[&str], right: &[usize], rows: Vec<Vec<String>>) {
    use unicode_width::UnicodeWidthStr;
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.width());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, w)) in cells.into_iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w.saturating_sub(cell.width()));
            match (i == last, right.contains(&i)) {
                (_, true) => text.push_str(&format!("{pad}{cell}")),
                (true, false) => text.push_str(cell),
                (false, false) => text.push_str(&format!("{cell}{pad}")),
            }
            if i != last {
                text.push_str("  ");
            }
        }
        outln!("{}", text.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

pub fn jobs_table(jobs: &[JobSummary]) {
    let rows = jobs
        .iter()
        .map(|j| {
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
            vec![
                j.id.to_string(),
                j.experiment_name.clone(),
                j.index.to_string(),
                j.state.as_str().to_string(),
                j.attempts.to_string(),
                place,
                j.last_failure.map_or("-", |f| f.as_str()).to_string(),
                j.pending_reason
                    .as_ref()
                    .map_or("-", |r| r.code())
                    .to_string(),
                j.submitted_by.clone(),
                params_text(j),
            ]
        })
        .collect();
    table(
        &[
            "JOB",
            "EXPERIMENT",
            "INDEX",
            "STATE",
            "ATT",
            "NODE:GPUS",
            "FAILURE",
            "WAITING",
            "BY",
            "PARAMS",
        ],
        &[2, 4],
        rows,
    );
}

/// What the run reported of itself, early stopping's decisions and where its results went.
fn results_lines(a: &AttemptView) -> Vec<String> {
    let mut lines = Vec::new();
    if !a.metrics.is_empty() || a.metrics_ignored.is_some_and(|n| n > 0) {
        let values = a
            .metrics
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let ignored = match a.metrics_ignored {
            Some(n) if n > 0 => {
                format!("  ({n} metric line(s) ignored: malformed or not a number)")
            }
            _ => String::new(),
        };
        lines.push(format!("metrics {values}{ignored}"));
    }
    for r in &a.rungs {
        let verdict = match (r.pruned, r.cutoff) {
            (true, Some(c)) => format!("pruned: behind the cutoff {c}"),
            (true, None) => "pruned: too few attempts reached it (bootstrap_count)".into(),
            (false, Some(c)) => format!("goes on: cutoff {c}"),
            (false, None) => "goes on".into(),
        };
        lines.push(format!(
            "early_stop rung {} at step {}: {} among {} attempt(s), {verdict}",
            r.rung, r.step, r.value, r.competitors
        ));
    }
    if let Some(t) = &a.tracking {
        lines.push(format!("tracking {t}"));
    }
    lines
}

fn counts_text(c: &StateCounts) -> String {
    format!(
        "{} queued, {} running, {} retrying, {} succeeded, {} failed, {} cancelled{}",
        c.queued + c.leased,
        c.running,
        c.retrying,
        c.succeeded,
        c.failed,
        c.cancelled,
        if c.pruned > 0 {
            format!(", {} pruned", c.pruned)
        } else {
            String::new()
        }
    )
}

pub fn experiments_table(exps: &[ExperimentSummary]) {
    let rows = exps
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.name.clone(),
                e.submitted_by.clone(),
                e.counts.total().to_string(),
                counts_text(&e.counts),
            ]
        })
        .collect();
    table(
        &["EXPERIMENT", "NAME", "BY", "JOBS", "PROGRESS"],
        &[3],
        rows,
    );
}

/// Where an experiment's jobs run from, as `show` prints it.
pub fn source(s: &headroom_shared::api::source::Source) {
    use headroom_shared::api::source::EnvironmentFrom;
    match (&s.snapshot, &s.workdir) {
        (Some(b), dir) => outln!(
            "code       snapshot {} ({}){}{}",
            &b.hash[..b.hash.len().min(12)],
            bytesize::ByteSize::b(b.bytes).display().iec(),
            dir.as_ref().map_or(String::new(), |d| format!(" of {d}")),
            if b.subdir.is_empty() {
                String::new()
            } else {
                format!(", runs in {}", b.subdir)
            }
        ),
        (None, Some(d)) => outln!("workdir    {d}"),
        (None, None) => outln!("workdir    the job user's home"),
    }
    if let Some(g) = &s.git {
        outln!(
            "git        {}{}{}",
            &g.commit[..g.commit.len().min(12)],
            g.branch
                .as_ref()
                .map_or(String::new(), |b| format!(" on {b}")),
            if g.dirty {
                format!(
                    ", with uncommitted changes{}",
                    g.diff_hash.as_ref().map_or(String::new(), |h| format!(
                        " (diff {})",
                        &h[..h.len().min(12)]
                    ))
                )
            } else {
                String::new()
            }
        );
    }
    if let Some(e) = &s.environment {
        let from = match s.environment_from {
            Some(EnvironmentFrom::Spec) => " (the spec's)",
            Some(EnvironmentFrom::Submitter) => " (the submitter's, taken at submit)",
            None => "",
        };
        outln!("python     {e}{from}");
    }
}

/// A job with its attempts, and where its experiment's jobs run from.
pub fn job_detail(d: &JobDetail, exp: &ExperimentSummary) {
    let j = &d.summary;
    outln!("job        {}", j.id);
    outln!("experiment {} ({})", j.experiment_name, j.experiment);
    if let Some(study) = &exp.study {
        outln!("study      {} ({})", study.name, study.id);
    }
    outln!("submitted  by {}", j.submitted_by);
    outln!(
        "index      {} (config {}, run {})",
        j.index,
        j.config,
        j.run
    );
    outln!("state      {}", j.state);
    if let Some(why) = &j.pending_reason {
        outln!("waiting    {why}");
    }
    outln!("params     {}", params_text(j));
    outln!("command    {}", d.argv.join(" "));
    self::source(&exp.source);
    outln!(
        "resources  {} GPU(s), declared estimate {}, memory key `{}`",
        j.gpus,
        j.estimate_mib.map(mib).unwrap_or_else(|| "none".into()),
        d.memory_key
    );
    if !d.oom_ladder.is_empty() {
        outln!(
            "oom ladder {} of {} steps applied",
            d.ladder_step,
            d.oom_ladder.len()
        );
    }
    if let Some(why) = &d.ladder_from {
        outln!("           {why}");
    }
    if let Some(p) = &d.prestart {
        outln!("before     {}", prestart_text(p));
    }
    outln!("profile    {}", d.profile);
    if let Some(t) = d.timeout_ms {
        outln!("timeout    {}", humantime_ms(t));
    }
    outln!(
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
            (_, Some(FailureClass::Pruned)) => "pruned (early_stop)".to_string(),
            (_, Some(c)) if c.is_requeue() => format!("{c} (requeued, no attempt spent)"),
            (_, Some(c)) => match a.oom_cause {
                Some(cause) => format!("failed: {c} ({})", cause.as_str()),
                None => format!("failed: {c}"),
            },
            _ => format!("{:?}", a.phase).to_lowercase(),
        };
        outln!(
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
            outln!("      {} -> {}", s.to_rfc3339(), e.to_rfc3339());
        }
        for line in prestart_lines(a).into_iter().chain(measure_lines(a)) {
            outln!("      {line}");
        }
        if let Some(line) = background_line(a) {
            outln!("      {line}");
        }
        for line in results_lines(a) {
            outln!("      {line}");
        }
    }
    if let Some(tail) = d.attempts_detail.last().and_then(|a| a.log_tail.as_deref())
        && !tail.trim().is_empty()
    {
        outln!("log tail of the last attempt:");
        for line in tail
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            outln!("  | {line}");
        }
    }
}

/// `show --telemetry`: one block per GPU of the attempt.
/// `background pid 41: ready after 1234 ms; exited early (exit 3)`, for a colocated attempt.
pub fn background_line(a: &headroom_shared::api::AttemptView) -> Option<String> {
    let pid = a.background_pid?;
    let ready = match a.background_ready_ms {
        Some(ms) => format!("ready after {ms} ms"),
        None => "never ready".to_string(),
    };
    let how = a
        .background_exit_code
        .map(|c| format!("exit {c}"))
        .or(a.background_signal.map(|s| format!("signal {s}")))
        .unwrap_or_else(|| "status unknown".into());
    let end = if a.background_exited_early == Some(true) {
        format!("exited early ({how})")
    } else {
        format!("stopped with the foreground ({how})")
    };
    Some(format!("background pid {pid}: {ready}; {end}"))
}

pub fn attempt_telemetry(number: u32, t: &AttemptTelemetry) {
    if t.from.is_none() {
        outln!("telemetry of attempt #{number}: not started");
        return;
    }
    for series in &t.gpus {
        outln!("telemetry of attempt #{number}, GPU {}:", series.gpu);
        for line in telemetry_lines(series) {
            outln!("      {line}");
        }
    }
}

/// The summary of one GPU's series: each reading a GPU could not give says so.
pub fn telemetry_lines(series: &GpuSeries) -> Vec<String> {
    let s = &series.samples;
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return vec![
            "no samples in the attempt's window (telemetry off on the agent, or pruned)".into(),
        ];
    };
    const NA: &str = "not available";
    let floats =
        |f: fn(&TelemetrySample) -> Option<f64>| -> Vec<f64> { s.iter().filter_map(f).collect() };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let mut out = vec![format!(
        "{} samples over {}",
        s.len(),
        humantime_secs(((last.at - first.at).num_milliseconds().max(0) / 1000) as u64)
    )];
    let power = floats(|x| x.power_w);
    out.push(if power.is_empty() {
        format!("power        {NA}")
    } else {
        format!(
            "power        mean {:.1} W, max {:.1} W",
            mean(&power),
            max(&power)
        )
    });
    let energy = floats(|x| x.energy_j);
    out.push(match (energy.first(), energy.last()) {
        (Some(a), Some(b)) if energy.len() >= 2 => {
            format!(
                "energy       {:.1} J (counter, first to last sample)",
                b - a
            )
        }
        _ => format!("energy       {NA}"),
    });
    let temp = floats(|x| x.temperature_c);
    out.push(if temp.is_empty() {
        format!("temperature  {NA}")
    } else {
        format!(
            "temperature  {:.1} °C at start, max {:.1} °C",
            temp[0],
            max(&temp)
        )
    });
    let util = floats(|x| x.utilization_pct.map(f64::from));
    out.push(if util.is_empty() {
        format!("utilization  {NA}")
    } else {
        format!("utilization  mean {:.0} %", mean(&util))
    });
    let used = s.iter().filter_map(|x| x.used_mib).max();
    out.push(match used {
        Some(m) => format!("memory       peak {} used on the GPU", mib(m)),
        None => format!("memory       {NA}"),
    });
    let clock = floats(|x| x.sm_clock_mhz.map(f64::from));
    out.push(if clock.is_empty() {
        format!("SM clock     {NA}")
    } else {
        format!("SM clock     mean {:.0} MHz", mean(&clock))
    });
    let known: Vec<&Vec<String>> = s.iter().filter_map(|x| x.throttle.as_ref()).collect();
    out.push(if known.is_empty() {
        format!("throttling   {NA}")
    } else {
        let mut seen: Vec<(String, usize)> = Vec::new();
        for reason in known.iter().flat_map(|r| r.iter()) {
            match seen.iter_mut().find(|(r, _)| r == reason) {
                Some((_, n)) => *n += 1,
                None => seen.push((reason.clone(), 1)),
            }
        }
        if seen.is_empty() {
            "throttling   none".into()
        } else {
            format!(
                "throttling   {}",
                seen.iter()
                    .map(|(r, n)| format!("{r} ({n} of {} samples)", known.len()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    });
    let errors = s.iter().filter(|x| x.error.is_some()).count();
    if errors > 0 {
        out.push(format!("{errors} samples could not be read in full"));
    }
    out
}

/// An ended attempt's measurements, compactly: energy, mean and max power, temperatures,
/// utilization and flags; then who contaminated it. Unknown figures read `-`.
fn measure_lines(a: &AttemptView) -> Vec<String> {
    if a.phase != AttemptPhase::Ended || a.pid.is_none() || a.gpus.is_empty() {
        return vec![];
    }
    let m = &a.measurements;
    let fig = |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |x| format!("{x:.1} {unit}"));
    let energy = match (m.energy_j, m.energy_source) {
        (Some(j), Some(src)) => format!("{j:.1} J ({})", src.as_str()),
        _ => "- (not measured)".to_string(),
    };
    let mut flags: Vec<&str> = Vec::new();
    if m.throttled_thermal == Some(true) {
        flags.push("THROTTLED thermal");
    }
    if m.throttled_power == Some(true) {
        flags.push("THROTTLED power");
    }
    if m.throttled_thermal.is_none() || m.throttled_power.is_none() {
        flags.push("throttling unknown");
    }
    if a.contaminated == Some(true) {
        flags.push("CONTAMINATED");
    }
    if a.shared {
        flags.push("SHARED");
    }
    let ghost = match m.ghost_mib {
        Some(0) => None,
        Some(g) => Some(format!("GHOST memory: {g} MiB held by no listed process")),
        None => Some("ghost memory unknown".to_string()),
    };
    if let Some(g) = &ghost {
        flags.push(g);
    }
    let late = match (m.covers_run, m.first_reading_ms) {
        (Some(true), _) => None,
        (_, Some(ms)) => Some(format!("PARTIAL: figures begin {ms} ms after the start")),
        _ => Some("PARTIAL: figures do not cover the run".to_string()),
    };
    if let Some(late) = &late {
        flags.push(late);
    }
    let mut lines = vec![format!(
        "energy {energy}  power mean {}, max {}  temp {} at start, max {}  util {}{}",
        fig(m.mean_power_w, "W"),
        fig(m.max_power_w, "W"),
        fig(m.start_temp_c, "°C"),
        fig(m.max_temp_c, "°C"),
        fig(m.mean_util_pct, "%"),
        if flags.is_empty() {
            String::new()
        } else {
            format!("  {}", flags.join(", "))
        }
    )];
    if let Some(sh) = &a.sharing {
        lines.push(format!(
            "shared its GPUs for {:.0} % of its run with {}; its share of the energy: {} ({}, \
             an estimate)",
            sh.overlap * 100.0,
            sh.with
                .iter()
                .map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            fig(sh.energy_share_j, "J"),
            sh.share_method.as_str()
        ));
    }
    if let Some(p) = &m.memory_profile {
        lines.push(format!(
            "memory over time: {} MiB steady, its peak from {:.0} % to {:.0} % of its {:.1} s \
             (what its configuration's next runs may be placed by)",
            p.steady_mib,
            p.peak_from * 100.0,
            p.peak_until * 100.0,
            p.expected_ms as f64 / 1000.0
        ));
    }
    if let Some(reason) = &m.contamination_reason {
        lines.push(format!(
            "contaminated: {reason} (pid {}, {})",
            m.contamination_pid
                .map_or("?".to_string(), |p| p.to_string()),
            m.contamination_command.as_deref().unwrap_or("?")
        ));
    }
    lines
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
        outln!(
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
        outln!(
            "  {:>3}  {:<18}  {:>9}  {:>9}  {:>9}  {:>9}  SLOTS",
            "GPU",
            "NAME",
            "TOTAL",
            "USED",
            "FREE",
            "PLACED"
        );
        for g in &n.gpus {
            outln!(
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
                outln!("       CANNOT BE READ (no work placed here): {e}");
            }
            for q in &g.quarantine {
                outln!(
                    "       QUARANTINED since {} (attempt {}): {}",
                    q.since.to_rfc3339(),
                    q.attempt,
                    q.reason
                );
            }
            match g.unattributed_mib {
                Some(0) => {}
                Some(u) => outln!(
                    "       unattributed {} (used memory no listed process holds{})",
                    mib(u),
                    if u > headroom_shared::api::ghost_tolerance_mib(g.total_mib) {
                        ": GHOST memory"
                    } else {
                        ""
                    }
                ),
                None if g.error.is_none() => {
                    outln!("       unattributed memory unknown (process memory not given)")
                }
                None => {}
            }
            if let Some(d) = &g.drift {
                let minutes = (chrono::Utc::now() - d.since).num_minutes().max(0);
                let (way, what) = match d.direction {
                    headroom_shared::api::DriftDirection::Over => ("over", "uses more than placed"),
                    headroom_shared::api::DriftDirection::Under => {
                        ("under", "uses less than placed")
                    }
                };
                outln!(
                    "       {} {way} by {} for {minutes} min ({what})",
                    if d.lasting { "DRIFT" } else { "drift" },
                    mib(d.gap_mib),
                );
            }
            for p in &g.foreign {
                outln!(
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
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A user's caps in words (`4 GPUs, 80GiB`); `-` for none.
pub fn caps_text(l: &headroom_shared::api::UserLimits) -> String {
    let plural = |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let caps: Vec<String> = [
        l.max_jobs.map(|n| plural(n, "job", "jobs")),
        l.max_gpus.map(|n| plural(n, "GPU", "GPUs")),
        l.max_gpu_mib
            .map(|m| format!("{} of GPU memory", headroom_shared::MemSize { mib: m })),
    ]
    .into_iter()
    .flatten()
    .collect();
    if caps.is_empty() {
        "-".to_string()
    } else {
        caps.join(", ")
    }
}

pub fn users_table(users: &[headroom_shared::api::UserView]) {
    outln!(
        "{:<24}  {:<6}  {:<16}  {:<7}  {:>5}  {:<20}",
        "NAME",
        "ROLE",
        "UNIX USER",
        "ROOT",
        "SHARE",
        "CAPS"
    );
    for u in users {
        outln!(
            "{:<24}  {:<6}  {:<16}  {:<7}  {:>5}  {}",
            u.name,
            u.role.as_str(),
            u.unix_user.as_deref().unwrap_or("-"),
            if u.allow_root { "allowed" } else { "-" },
            u.limits.share,
            caps_text(&u.limits)
        );
    }
}

/// `headroom usage`: a row per user (or experiment), then each user's fair-share standing.
pub fn usage_table(r: &headroom_shared::api::usage::UsageReport) {
    use headroom_shared::api::usage::UsageBy;
    let since = r.since.format("%Y-%m-%d %H:%M");
    outln!("usage since {since} UTC");
    let what = match r.by {
        UsageBy::User => "USER",
        UsageBy::Experiment => "EXPERIMENT",
    };
    outln!(
        "{:<28}  {:>9}  {:>10}  {:>10}  {:>10}  {:>8}  JOBS ENDED",
        what,
        "GPU-H",
        "GIB-H",
        "KWH",
        "CLEAN KWH",
        "ATTEMPTS"
    );
    for row in &r.rows {
        let label = match &row.name {
            Some(name) => format!("{name} ({})", &row.key[..row.key.len().min(8)]),
            None => row.key.clone(),
        };
        let jobs: Vec<String> = row.jobs.iter().map(|(s, n)| format!("{n} {s}")).collect();
        outln!(
            "{:<28}  {:>9.2}  {:>10.2}  {:>10.3}  {:>10.3}  {:>8}  {}",
            label,
            row.gpu_hours,
            row.gib_hours,
            row.energy_kwh,
            row.clean_energy_kwh,
            row.attempts,
            if jobs.is_empty() {
                "-".to_string()
            } else {
                jobs.join(", ")
            }
        );
    }
    let days = r.half_life_s as f64 / 86_400.0;
    outln!("\nfair share (half-life {days:.1} days; the lowest per share goes first)");
    outln!(
        "{:<24}  {:>5}  {:>12}  {:>12}  {:>7}  {:>5}  {:>10}",
        "USER",
        "SHARE",
        "USED GIB-H",
        "PER SHARE",
        "RUNNING",
        "GPUS",
        "RESERVED"
    );
    for s in &r.shares {
        outln!(
            "{:<24}  {:>5}  {:>12.2}  {:>12.2}  {:>7}  {:>5}  {:>10}",
            s.user,
            s.share,
            s.used_gib_hours,
            s.normalized,
            s.running_jobs,
            s.running_gpus,
            headroom_shared::MemSize { mib: s.running_mib }.to_string()
        );
    }
}

pub fn tokens_table(tokens: &[TokenView]) {
    outln!(
        "{:<16}  {:<20}  {:<6}  {:<12}  {:<20}  {:<20}  REVOKED",
        "ID",
        "NAME",
        "ROLE",
        "CREATED BY",
        "CREATED",
        "EXPIRES"
    );
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".into())
    };
    for t in tokens {
        outln!(
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
    if resp.variants.is_empty() {
        outln!(
            "dry run: experiment {} expands to {} jobs (seed {}); nothing stored",
            resp.name,
            resp.jobs,
            resp.seed
        );
        preview_jobs(resp.preview.as_deref().unwrap_or_default());
        if resp.preview_omitted > 0 {
            outln!("  ... and {} more jobs, not shown", resp.preview_omitted);
        }
    } else {
        study_preview(resp);
    }
    if let Some(s) = &resp.schedule {
        schedule(s);
    }
}

/// A dry run's schedule on the live nodes, as placement would run it.
fn schedule(s: &headroom_shared::api::schedule::SchedulePreview) {
    use headroom_shared::api::schedule::EstimateFrom;
    outln!(
        "\nschedule on the live nodes ({} slot{} in their plans): {} job{} at once{}",
        s.slots,
        if s.slots == 1 { "" } else { "s" },
        s.at_once,
        if s.at_once == 1 { "" } else { "s" },
        if s.never_fit > 0 {
            format!(", {} never fit", s.never_fit)
        } else {
            String::new()
        }
    );
    for g in &s.groups {
        let estimate = match (g.estimate_mib, g.estimate_from) {
            _ if g.cpu_only => "on CPU slots (no GPU)".into(),
            (Some(m), EstimateFrom::Learned) => format!("{} learned", mib(m)),
            (Some(m), _) => format!("{} declared", mib(m)),
            (None, _) => "no estimate: alone on a GPU".into(),
        };
        outln!(
            "  {}: {} job{}, {} at once, {estimate}",
            g.group,
            g.jobs,
            if g.jobs == 1 { "" } else { "s" },
            g.at_once
        );
        if let Some(why) = &g.cannot_share {
            outln!("    {why}");
        }
        for why in &g.never_fit_reasons {
            outln!("    never fits: {why}");
        }
    }
    match s.makespan_s {
        _ if s.at_once == 0 => outln!("  no job can run on the live nodes"),
        _ if s.too_many_to_simulate => outln!(
            "  makespan not simulated: more jobs than a dry run simulates (the first thousands \
             of a matrix tell as much)"
        ),
        Some(m) => outln!(
            "  expected makespan: {} (run times of earlier runs of each memory key)",
            humantime::format_duration(Duration::from_secs(m.round() as u64))
        ),
        None => outln!(
            "  makespan unknown: {} job{} of no earlier run of their memory key",
            s.unknown_durations,
            if s.unknown_durations == 1 { "" } else { "s" }
        ),
    }
}

/// A study's dry run: each variant's count, resources and memory key, then its first jobs
/// (the preview holds the variants' jobs in order).
fn study_preview(resp: &SubmitResponse) {
    outln!(
        "dry run: study {} expands to {} jobs in {} experiments (seed {}); nothing stored",
        resp.name,
        resp.jobs,
        resp.variants.len(),
        resp.seed
    );
    queue_line(resp);
    let mut rest = resp.preview.as_deref().unwrap_or_default();
    for v in &resp.variants {
        outln!("\n{}", variant_line(v));
        let n = rest.len().min(v.jobs as usize);
        let (mine, after) = rest.split_at(n);
        preview_jobs(mine);
        rest = after;
        if (n as u64) < v.jobs {
            outln!("  ... and {} more jobs, not shown", v.jobs - n as u64);
        }
    }
}

/// One variant of a study: its experiment, count, resources, memory key and waits.
fn variant_line(v: &headroom_shared::api::SubmittedVariant) -> String {
    let mut line = format!(
        "{} ({} job{}, seed {}): {} GPU{}",
        v.name,
        v.jobs,
        if v.jobs == 1 { "" } else { "s" },
        v.seed,
        v.gpus,
        if v.gpus == 1 { "" } else { "s" }
    );
    match v.memory {
        Some(m) => line.push_str(&format!(", {m} each")),
        None if v.gpus == 0 => line.push_str(" (a CPU slot of its node)"),
        None => line.push_str(", no memory declared (learned, or alone on a GPU)"),
    }
    if !v.memory_key.is_empty() {
        line.push_str(&format!(", memory key {}", v.memory_key.join(",")));
    }
    if !v.after.is_empty() {
        line.push_str(&format!(", after {}", v.after.join(", ")));
    }
    if let (Some(ms), Some(from)) = (v.expected_ms, v.expected_from) {
        let from = match from {
            headroom_shared::api::LengthFrom::Declared => "declared",
            headroom_shared::api::LengthFrom::Learned => "learned from its earlier runs",
        };
        let d = std::time::Duration::from_secs(ms.div_ceil(1000));
        line.push_str(&format!(
            ", runs of {} ({from})",
            humantime::format_duration(d)
        ));
    }
    line
}

/// What `submit` prints of a study it stored.
pub fn study_submitted(resp: &SubmitResponse, study: headroom_shared::StudyId) {
    outln!(
        "submitted study {} ({study}): {} jobs in {} experiments, seed {}",
        resp.name,
        resp.jobs,
        resp.variants.len(),
        resp.seed
    );
    for v in &resp.variants {
        let id = v.experiment.map(|e| e.to_string()).unwrap_or_default();
        outln!("  {id}  {}", variant_line(v));
    }
    queue_line(resp);
}

/// The order a study's jobs were queued in, where some variant's run length is known.
fn queue_line(resp: &SubmitResponse) {
    let lengths: Vec<Option<u64>> = resp.variants.iter().map(|v| v.expected_ms).collect();
    if lengths.iter().all(Option::is_none) {
        return;
    }
    let order: Vec<&str> = headroom_shared::study::queue_order(&lengths)
        .into_iter()
        .filter_map(|i| resp.variants.get(i).map(|v| v.variant.as_str()))
        .collect();
    outln!("queued longest first: {}", order.join(", "));
}

fn preview_jobs(jobs: &[headroom_shared::expand::ExpandedJob]) {
    for j in jobs {
        let params: Vec<String> = j
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect();
        outln!(
            "{:>5}  {}  | {}",
            j.index,
            params.join(" "),
            j.argv.join(" ")
        );
    }
}

/// Waits for the experiment (or all jobs), showing a progress bar named after it (`name`, or
/// asked for) on standard error; `summary`: the counts at the end on standard output. Exit
/// code 0 only when every job succeeded, else [`crate::JOBS_FAILED_EXIT`].
pub async fn wait(
    api: &Api,
    experiment: Option<ExperimentId>,
    name: Option<String>,
    summary: bool,
) -> Result<i32> {
    let name = match (name, experiment) {
        (Some(name), _) => name,
        (None, Some(id)) => api.experiment(id).await?.name,
        (None, None) => "all jobs".to_string(),
    };
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
        ProgressStyle::with_template(
            "{prefix} {elapsed_precise} [{bar:30}] {pos}/{len} done  {msg}",
        )
        .map_err(|e| anyhow!("{e}"))?
        .progress_chars("=> "),
    );
    bar.set_prefix(name.clone());
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
                "{name}: {}/{} done, {}",
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
    if summary {
        outln!("{name} done: {}", counts_text(c));
    } else {
        eprintln!("{name} done: {}", counts_text(c));
    }
    Ok(if c.failed + c.cancelled == 0 {
        0
    } else {
        crate::JOBS_FAILED_EXIT
    })
}

/// `headroom logs`: the log of a job's latest attempt (or of attempt `number`, or of the
/// attempt named by its id); `tail`: only its last lines; `follow`: until the attempt ends.
pub async fn logs(
    api: &Api,
    id: &str,
    follow: bool,
    number: Option<u32>,
    tail: Option<usize>,
) -> Result<()> {
    // A full id is a job's or an attempt's; anything shorter names a job.
    let job = match id.parse::<JobId>() {
        Ok(job) => api.find_job(job).await?,
        Err(_) => Some(api.job(crate::resolve_job(api, id).await?).await?),
    };
    let attempt: AttemptId = match (job, number) {
        (Some(d), None) => d
            .attempts_detail
            .last()
            .map(|a| a.id)
            .ok_or_else(|| anyhow!("job {} has not started yet", d.summary.id))?,
        (Some(d), Some(n)) => d
            .attempts_detail
            .iter()
            .find(|a| a.number == n)
            .map(|a| a.id)
            .ok_or_else(|| {
                anyhow!(
                    "--attempt: job {} has no attempt #{n} (it has {})",
                    d.summary.id,
                    d.attempts_detail.len()
                )
            })?,
        (None, Some(_)) => bail!("--attempt picks an attempt of a job: no job `{id}`"),
        (None, None) => id
            .parse()
            .map_err(|_| anyhow!("no job or attempt `{id}`"))?,
    };
    let mut offset = 0;
    let mut out = std::io::stdout();
    if let Some(lines) = tail {
        // What is there now, keeping only its last `lines` lines as it is read.
        let mut kept: Vec<u8> = Vec::new();
        loop {
            let chunk = api.log(attempt, offset, 0).await?;
            offset = chunk.next;
            if chunk.bytes.is_empty() {
                break;
            }
            kept.extend_from_slice(&chunk.bytes);
            let start = last_lines_start(&kept, lines);
            kept.drain(..start);
        }
        out.write_all(&kept)?;
        out.flush()?;
        if !follow {
            return Ok(());
        }
    }
    loop {
        let chunk = api
            .log(attempt, offset, if follow { 10_000 } else { 0 })
            .await?;
        out.write_all(&chunk.bytes)?;
        out.flush()?;
        offset = chunk.next;
        // Answers come a megabyte at a time: without `-f`, read on to what is there now.
        if chunk.bytes.is_empty() && (!follow || chunk.ended) {
            return Ok(());
        }
        if chunk.bytes.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Where the last `n` lines of `text` start (a last line without its newline counts).
fn last_lines_start(text: &[u8], n: usize) -> usize {
    if n == 0 {
        return text.len();
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    body.iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(n - 1)
        .map_or(0, |(i, _)| i + 1)
}

/// What a job's attempts wait for before it starts, in words.
fn prestart_text(p: &headroom_shared::prestart::Prestart) -> String {
    use headroom_shared::prestart::{Cooldown, OnCooldownTimeout};
    let mut parts = Vec::new();
    if p.exclusive {
        parts.push("exclusive: waits for its GPUs to empty, runs alone".to_string());
    } else if p.cooldown.is_some() {
        parts.push("runs alone".to_string());
    }
    match &p.cooldown {
        Some(Cooldown::Seconds { ms }) => parts.push(format!("cooldown {}", humantime_ms(*ms))),
        Some(Cooldown::UntilTemp {
            temp_c,
            max_wait_ms,
            on_timeout,
        }) => parts.push(format!(
            "cooldown until {temp_c} °C (max_wait {}, then {})",
            humantime_ms(*max_wait_ms),
            match on_timeout {
                OnCooldownTimeout::Fail => "fail: cooldown_timeout",
                OnCooldownTimeout::Start => "start anyway",
            }
        )),
        None => {}
    }
    parts.join("; ")
}

/// An attempt's wait before its job started: what it waits for now, or what it waited.
fn prestart_lines(a: &headroom_shared::api::AttemptView) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = &a.waiting {
        out.push(format!("waiting: {w}"));
    }
    if let Some(ms) = a.exclusive_wait_ms {
        out.push(format!(
            "waited {:.1} s for its GPUs to empty",
            ms as f64 / 1000.0
        ));
    }
    if let Some(ms) = a.cooldown_wait_ms {
        let temp = |t: Option<f64>| t.map_or_else(|| "?".to_string(), |t| format!("{t:.0} °C"));
        out.push(format!(
            "cooled {:.1} s: {} -> {}{}",
            ms as f64 / 1000.0,
            temp(a.cooldown_from_temp_c),
            temp(a.cooldown_start_temp_c),
            if a.cooldown_timed_out == Some(true) {
                "  (max_wait passed first)"
            } else {
                ""
            }
        ));
    }
    out
}

#[cfg(test)]
mod tail_tests {
    use super::last_lines_start;

    #[test]
    fn the_last_lines_are_found_with_or_without_a_final_newline() {
        let t = b"a\nb\nc\n";
        assert_eq!(&t[last_lines_start(t, 2)..], b"b\nc\n");
        assert_eq!(&t[last_lines_start(t, 9)..], t);
        assert_eq!(&t[last_lines_start(t, 0)..], b"");
        let u = b"a\nb\nc";
        assert_eq!(&u[last_lines_start(u, 1)..], b"c");
        assert_eq!(&u[last_lines_start(u, 2)..], b"b\nc");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_s_caps_read_as_words() {
        use headroom_shared::api::UserLimits;
        assert_eq!(caps_text(&UserLimits::default()), "-");
        let caps = UserLimits {
            max_jobs: Some(1),
            max_gpus: Some(4),
            max_gpu_mib: Some(80 * 1024),
            ..Default::default()
        };
        assert_eq!(caps_text(&caps), "1 job, 4 GPUs, 80GiB of GPU memory");
    }

    #[test]
    fn show_tells_what_became_of_a_background() {
        let view = |extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "id": headroom_shared::AttemptId::new(), "job": headroom_shared::JobId::new(),
                "number": 1, "node": "n", "gpus": [0], "fence": 1, "phase": "ended",
                "leased_at": at(0),
            });
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            serde_json::from_value::<headroom_shared::api::AttemptView>(v).expect("view")
        };
        assert_eq!(background_line(&view(serde_json::json!({}))), None);
        assert_eq!(
            background_line(&view(serde_json::json!({"background_pid": 41,
                "background_ready_ms": 1234, "background_signal": 15,
                "background_exited_early": false}))),
            Some(
                "background pid 41: ready after 1234 ms; stopped with the foreground (signal 15)"
                    .into()
            )
        );
        assert_eq!(
            background_line(&view(serde_json::json!({"background_pid": 41,
                "background_exit_code": 3, "background_exited_early": true}))),
            Some("background pid 41: never ready; exited early (exit 3)".into())
        );
    }

    fn at(secs: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("time")
    }

    #[test]
    fn telemetry_summary_has_the_figures_and_says_what_is_not_available() {
        let sample = |t: i64, w: f64, j: f64, c: f64| TelemetrySample {
            gpu: 0,
            at: at(t),
            power_w: Some(w),
            energy_j: Some(j),
            temperature_c: Some(c),
            utilization_pct: Some(50),
            used_mib: Some(1024 * t as u64),
            throttle: Some(if t == 2 {
                vec!["sw_thermal_slowdown".into()]
            } else {
                vec![]
            }),
            ..TelemetrySample::default()
        };
        let series = GpuSeries {
            node: "n".into(),
            gpu: 0,
            samples: vec![
                sample(0, 100.0, 1000.0, 40.0),
                sample(1, 300.0, 1200.0, 60.0),
                sample(2, 200.0, 1450.0, 55.0),
            ],
        };
        let lines = telemetry_lines(&series);
        assert_eq!(lines[0], "3 samples over 2s");
        assert_eq!(lines[1], "power        mean 200.0 W, max 300.0 W");
        assert_eq!(
            lines[2],
            "energy       450.0 J (counter, first to last sample)"
        );
        assert_eq!(lines[3], "temperature  40.0 °C at start, max 60.0 °C");
        assert_eq!(lines[4], "utilization  mean 50 %");
        assert_eq!(lines[5], "memory       peak 2GiB used on the GPU");
        assert_eq!(lines[6], "SM clock     not available");
        assert_eq!(
            lines[7],
            "throttling   sw_thermal_slowdown (1 of 3 samples)"
        );

        // A GPU without power or energy readings: never shown as 0.
        let mut bare = series.clone();
        for s in &mut bare.samples {
            s.power_w = None;
            s.energy_j = None;
            s.throttle = None;
        }
        let lines = telemetry_lines(&bare);
        assert_eq!(lines[1], "power        not available");
        assert_eq!(lines[2], "energy       not available");
        assert_eq!(lines[7], "throttling   not available");
        bare.samples.clear();
        assert!(telemetry_lines(&bare)[0].starts_with("no samples"));
    }
}
