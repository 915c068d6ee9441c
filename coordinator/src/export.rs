//! `export --csv`: one row per attempt with the job's parameters as columns, the seeds'
//! `summary.csv` without hand work, and which rows are clean measurements.

use std::collections::BTreeSet;

use headroom_shared::api::AttemptView;
use headroom_shared::expand::value_text;

use crate::store::ExportRow;

const FIXED: &[&str] = &[
    "experiment",
    "job_id",
    "job_index",
    "config",
    "run",
    "attempt",
    "attempt_id",
];
const OUTCOME: &[&str] = &[
    "success",
    "failure_class",
    "node",
    "gpus",
    "started_at",
    "ended_at",
    "duration_s",
    "exit_code",
    "signal",
    "estimate_mib",
    "estimate_source",
    "peak_mem_mib",
    "peak_source",
    "ladder_step",
    "cleanup_ms",
    "cleanup_verified",
    "energy_j",
    "energy_source",
    "first_reading_ms",
    "covers_run",
    "shared",
    "shared_overlap",
    "energy_share_j",
    "energy_share_method",
    "mean_power_w",
    "max_power_w",
    "max_temp_c",
    "start_temp_c",
    "mean_util_pct",
    "throttled_thermal",
    "throttled_power",
    "contaminated",
    "contamination_reason",
    "contamination_pid",
    "contamination_command",
    "ghost_mib",
    "exclusive_wait_ms",
    "cooldown_wait_ms",
    "cooldown_from_temp_c",
    "cooldown_start_temp_c",
    "cooldown_timed_out",
    "background_pid",
    "background_ready_ms",
    "background_exit_code",
    "background_signal",
    "background_exited_early",
];

/// Whether an attempt's figures can go in an energy comparison (`clean_only`): not
/// contaminated, not sharing its GPUs with another attempt, no memory nobody accounted for
/// on them (`ghost_mib`), not throttled for temperature or power, and, if it ran on GPUs,
/// with figures that cover its whole run and its throttle reasons read (unknown is not
/// clean). Failure is no reason: `success` tells it.
pub fn is_clean(a: &AttemptView) -> bool {
    let m = &a.measurements;
    if a.contaminated == Some(true) || a.shared || m.ghost_mib.is_some_and(|g| g > 0) {
        return false;
    }
    if m.throttled() {
        return false;
    }
    let ran_on_gpus = a.pid.is_some() && !a.gpus.is_empty();
    !ran_on_gpus
        || (m.covers_run == Some(true)
            && m.ghost_mib.is_some()
            && m.throttled_thermal.is_some()
            && m.throttled_power.is_some())
}

/// A parameter's column: its name, or `params.NAME` where the name is one of the fixed
/// columns (a grid axis named `node` or `run`), as the Python client spreads a job's
/// parameters, so neither hides the other.
fn param_column(name: &str) -> std::borrow::Cow<'_, str> {
    if FIXED.contains(&name) || OUTCOME.contains(&name) || name.starts_with("params.") {
        format!("params.{name}").into()
    } else {
        name.into()
    }
}

/// A cell a spreadsheet will not run: text that starts like a formula (`=`, `+`, `-`, `@`, a
/// tab or a return: a parameter value, a foreign process's command line) gets a leading `'`,
/// as OWASP advises; numbers (`-0.5`, `+3`) stay numbers.
fn inert(cell: &str) -> std::borrow::Cow<'_, str> {
    let formula = cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
    if formula && cell.parse::<f64>().is_err() {
        format!("'{cell}").into()
    } else {
        cell.into()
    }
}

pub fn to_csv(rows: &[ExportRow]) -> Result<String, csv::Error> {
    let params: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| {
            r.job
                .params
                .keys()
                .chain(r.attempt.params.keys())
                .map(String::as_str)
        })
        .collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let header: Vec<std::borrow::Cow<'_, str>> = FIXED
        .iter()
        .map(|&c| c.into())
        .chain(params.iter().map(|p| param_column(p)))
        .chain(OUTCOME.iter().map(|&c| c.into()))
        .collect();
    w.write_record(header.iter().map(|c| inert(c).into_owned()))?;
    let opt = |v: Option<String>| v.unwrap_or_default();
    for r in rows {
        let (j, a) = (&r.job, &r.attempt);
        let mut rec: Vec<String> = vec![
            r.experiment.clone(),
            j.id.to_string(),
            j.index.to_string(),
            j.config.to_string(),
            j.run.to_string(),
            a.number.to_string(),
            a.id.to_string(),
        ];
        // The parameters this attempt ran with (the OOM ladder may have changed them).
        let ran_with = if a.params.is_empty() {
            &j.params
        } else {
            &a.params
        };
        for p in &params {
            rec.push(ran_with.get(*p).map(value_text).unwrap_or_default());
        }
        let duration = match (a.started_at, a.ended_at) {
            (Some(s), Some(e)) => {
                Some(format!("{:.3}", (e - s).num_milliseconds() as f64 / 1000.0))
            }
            _ => None,
        };
        rec.extend([
            opt(a.success.map(|s| s.to_string())),
            opt(a.failure_class.map(|c| c.to_string())),
            a.node.clone(),
            a.gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(";"),
            opt(a.started_at.map(|t| t.to_rfc3339())),
            opt(a.ended_at.map(|t| t.to_rfc3339())),
            opt(duration),
            opt(a.exit_code.map(|c| c.to_string())),
            opt(a.signal.map(|s| s.to_string())),
            opt(a.estimate_mib.map(|m| m.to_string())),
            a.estimate_source.clone(),
            opt(a.peak_mem_mib.map(|m| m.to_string())),
            opt(a.peak_source.map(|s| s.as_str().to_string())),
            a.ladder_step.to_string(),
            opt(a.cleanup_ms.map(|m| m.to_string())),
            opt(a.cleanup_verified.map(|v| v.to_string())),
        ]);
        let m = &a.measurements;
        let figure = |v: Option<f64>| opt(v.map(|x| x.to_string()));
        rec.extend([
            figure(m.energy_j),
            opt(m.energy_source.map(|s| s.as_str().to_string())),
            opt(m.first_reading_ms.map(|v| v.to_string())),
            opt(m.covers_run.map(|v| v.to_string())),
            a.shared.to_string(),
            opt(a.sharing.as_ref().map(|s| format!("{:.3}", s.overlap))),
            figure(a.sharing.as_ref().and_then(|s| s.energy_share_j)),
            opt(a
                .sharing
                .as_ref()
                .map(|s| s.share_method.as_str().to_string())),
            figure(m.mean_power_w),
            figure(m.max_power_w),
            figure(m.max_temp_c),
            figure(m.start_temp_c),
            figure(m.mean_util_pct),
            opt(m.throttled_thermal.map(|v| v.to_string())),
            opt(m.throttled_power.map(|v| v.to_string())),
            opt(a.contaminated.map(|v| v.to_string())),
            opt(m.contamination_reason.clone()),
            opt(m.contamination_pid.map(|p| p.to_string())),
            opt(m.contamination_command.clone()),
            opt(m.ghost_mib.map(|v| v.to_string())),
        ]);
        // The wait before the job started: for an exclusive GPU to empty, for it to cool.
        rec.extend([
            opt(a.exclusive_wait_ms.map(|v| v.to_string())),
            opt(a.cooldown_wait_ms.map(|v| v.to_string())),
            figure(a.cooldown_from_temp_c),
            figure(a.cooldown_start_temp_c),
            opt(a.cooldown_timed_out.map(|v| v.to_string())),
        ]);
        // The colocated background's record; empty when the attempt ran alone.
        rec.extend([
            opt(a.background_pid.map(|v| v.to_string())),
            opt(a.background_ready_ms.map(|v| v.to_string())),
            opt(a.background_exit_code.map(|v| v.to_string())),
            opt(a.background_signal.map(|v| v.to_string())),
            opt(a.background_exited_early.map(|v| v.to_string())),
        ]);
        w.write_record(rec.iter().map(|c| inert(c).into_owned()))?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::inert;

    /// A value a spreadsheet would run as a formula is made text; numbers stay numbers.
    #[test]
    fn formulas_are_made_text_and_numbers_stay_numbers() {
        for formula in [
            "=HYPERLINK(\"http://x\")",
            "+cmd|' /C calc'!A0",
            "-2+3",
            "@SUM(A1)",
            "\tx",
        ] {
            assert_eq!(inert(formula), format!("'{formula}"), "{formula}");
        }
        for plain in ["-0.5", "+3", "-1e-4", "adam", "0.001", "", "a=b"] {
            assert_eq!(inert(plain), plain, "{plain}");
        }
    }
}
