//! The export: one row per attempt with the job's parameters as columns, the seeds'
//! `summary.csv` without hand work, and which rows are clean measurements. Its columns are
//! declared once (`FIXED`, `OUTCOME`, `MEASURED`, `CODE`: name, type, unit, meaning, value; the
//! figures between come from `Measurements::FIGURES`); the CSV file, the JSON pages
//! and their column list are all read from that table.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use headroom_shared::api::{AttemptView, ColumnType, ExportColumn, FIGURES, Figure, Measurements};
use headroom_shared::expand::value_text;
use serde_json::{Map, Value};

use crate::store::ExportRow;

/// Whether an attempt's figures can go in an energy comparison (`clean_only`): not
/// contaminated, not sharing its GPUs with another attempt, no memory nobody accounted for
/// on them (`ghost_mib`), not throttled for temperature or power, and, if it ran on GPUs,
/// with figures that cover its whole run and its throttle reasons read (unknown is not
/// clean). Failure is no reason: `success` tells it; but an attempt `early_stop` stopped, or
/// one stopped to requeue its job (preempted, requeued), is a partial run, whose figures
/// compare with no finished one's.
pub fn is_clean(a: &AttemptView) -> bool {
    use headroom_shared::FailureClass as F;
    let m = &a.measurements;
    if matches!(
        a.failure_class,
        Some(F::Pruned | F::Preempted | F::Requeued)
    ) {
        return false;
    }
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

/// One value of a row, typed: the CSV writes it as text, the JSON as its JSON value.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Empty,
    Text(String),
    Int(i64),
    Num(f64),
    /// A figure the CSV prints with three decimals (a duration, a fraction).
    Num3(f64),
    Bool(bool),
    Time(DateTime<Utc>),
    Ints(Vec<u32>),
}

impl Cell {
    fn csv(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Text(t) => t.clone(),
            Cell::Int(i) => i.to_string(),
            Cell::Num(x) => x.to_string(),
            Cell::Num3(x) => format!("{x:.3}"),
            Cell::Bool(b) => b.to_string(),
            Cell::Time(t) => t.to_rfc3339(),
            Cell::Ints(v) => v.iter().map(u32::to_string).collect::<Vec<_>>().join(";"),
        }
    }

    fn json(self) -> Value {
        match self {
            Cell::Empty => Value::Null,
            Cell::Text(t) => Value::String(t),
            Cell::Int(i) => i.into(),
            Cell::Num(x) | Cell::Num3(x) => x.into(),
            Cell::Bool(b) => b.into(),
            Cell::Time(t) => Value::String(t.to_rfc3339()),
            Cell::Ints(v) => v.into(),
        }
    }
}

fn text(v: Option<impl ToString>) -> Cell {
    v.map_or(Cell::Empty, |t| Cell::Text(t.to_string()))
}

fn int(v: Option<impl Into<i128>>) -> Cell {
    v.map_or(Cell::Empty, |i| {
        Cell::Int(i64::try_from(i.into()).unwrap_or(i64::MAX))
    })
}

fn num(v: Option<f64>) -> Cell {
    v.map_or(Cell::Empty, Cell::Num)
}

fn flag(v: Option<bool>) -> Cell {
    v.map_or(Cell::Empty, Cell::Bool)
}

fn time(v: Option<DateTime<Utc>>) -> Cell {
    v.map_or(Cell::Empty, Cell::Time)
}

/// One column: its header, type, unit, meaning, whether `clean_only` reads it, and its value.
#[derive(Clone, Copy)]
struct Column {
    name: &'static str,
    kind: ColumnType,
    unit: Option<&'static str>,
    about: &'static str,
    decides_clean: bool,
    figure: bool,
    value: Of,
}

/// Where a column's value comes from.
#[derive(Clone, Copy)]
enum Of {
    Row(fn(&ExportRow) -> Cell),
    /// A figure of the attempt's measurements (`Figure::get`).
    Figure(fn(&Measurements) -> Option<f64>),
}

impl Column {
    fn value(&self, r: &ExportRow) -> Cell {
        match self.value {
            Of::Row(f) => f(r),
            Of::Figure(get) => num(get(&r.attempt.measurements)),
        }
    }

    /// A figure's column: its name, unit and meaning as `measurements!` declares them.
    fn of_figure(f: &'static Figure) -> Column {
        Column {
            name: f.name,
            kind: ColumnType::Number,
            unit: Some(f.unit),
            about: f.about,
            decides_clean: false,
            figure: true,
            value: Of::Figure(f.get),
        }
    }
}

const fn col(
    name: &'static str,
    kind: ColumnType,
    unit: Option<&'static str>,
    about: &'static str,
    value: fn(&ExportRow) -> Cell,
) -> Column {
    Column {
        name,
        kind,
        unit,
        about,
        decides_clean: false,
        figure: false,
        value: Of::Row(value),
    }
}

impl Column {
    const fn clean(mut self) -> Self {
        self.decides_clean = true;
        self
    }

    const fn figure(mut self) -> Self {
        self.figure = true;
        self
    }

    fn describe(&self) -> ExportColumn {
        ExportColumn {
            name: self.name.to_string(),
            kind: self.kind,
            unit: self.unit.map(str::to_string),
            description: self.about.to_string(),
            decides_clean: self.decides_clean,
            figure: self.figure,
        }
    }
}

use ColumnType::{Boolean, Integer, List, Number, String as Str, Time};

const MIB: Option<&str> = Some("MiB");
const MS: Option<&str> = Some("ms");
const J: Option<&str> = Some("J");
const C: Option<&str> = Some("°C");

/// Where the job's parameters go: after these columns, before the others.
const FIXED: &[Column] = &[
    col("experiment", Str, None, "The experiment's name", |r| {
        Cell::Text(r.experiment.clone())
    }),
    col("job_id", Str, None, "The job's id", |r| {
        Cell::Text(r.job.id.to_string())
    }),
    col(
        "job_index",
        Integer,
        None,
        "The job's index in its experiment",
        |r| int(Some(r.job.index)),
    ),
    col(
        "config",
        Integer,
        None,
        "The parameter combination's index",
        |r| int(Some(r.job.config)),
    ),
    col("run", Integer, None, "The run of that combination", |r| {
        int(Some(r.job.run))
    }),
    col(
        "attempt",
        Integer,
        None,
        "The attempt's number (1: first)",
        |r| int(Some(r.attempt.number)),
    ),
    col("attempt_id", Str, None, "The attempt's id", |r| {
        Cell::Text(r.attempt.id.to_string())
    }),
];

const OUTCOME: &[Column] = &[
    col(
        "success",
        Boolean,
        None,
        "Whether the attempt succeeded",
        |r| flag(r.attempt.success),
    ),
    col(
        "failure_class",
        Str,
        None,
        "Why it failed (oom, timeout, exit...)",
        |r| text(r.attempt.failure_class),
    ),
    col("node", Str, None, "The node it ran on", |r| {
        Cell::Text(r.attempt.node.clone())
    }),
    col("gpus", List, None, "The GPU indices it held", |r| {
        Cell::Ints(r.attempt.gpus.clone())
    }),
    col(
        "started_at",
        Time,
        None,
        "When the job's process started",
        |r| time(r.attempt.started_at),
    ),
    col("ended_at", Time, None, "When the attempt ended", |r| {
        time(r.attempt.ended_at)
    }),
    col(
        "duration_s",
        Number,
        Some("s"),
        "From start to end",
        |r| match (r.attempt.started_at, r.attempt.ended_at) {
            (Some(s), Some(e)) => Cell::Num3((e - s).num_milliseconds() as f64 / 1000.0),
            _ => Cell::Empty,
        },
    )
    .figure(),
    col(
        "exit_code",
        Integer,
        None,
        "The process's exit status",
        |r| int(r.attempt.exit_code),
    ),
    col(
        "signal",
        Integer,
        None,
        "The signal that ended the process",
        |r| int(r.attempt.signal),
    ),
    col(
        "estimate_mib",
        Integer,
        MIB,
        "GPU memory admitted for (per GPU)",
        |r| int(r.attempt.estimate_mib),
    ),
    col(
        "estimate_source",
        Str,
        None,
        "Where the estimate came from",
        |r| Cell::Text(r.attempt.estimate_source.clone()),
    ),
    col(
        "peak_mem_mib",
        Integer,
        MIB,
        "Peak GPU memory of the job's processes",
        |r| int(r.attempt.peak_mem_mib),
    )
    .figure(),
    col("peak_source", Str, None, "How the peak was measured", |r| {
        text(r.attempt.peak_source.map(|s| s.as_str()))
    }),
    col(
        "ladder_step",
        Integer,
        None,
        "OOM ladder step the attempt ran at",
        |r| int(Some(r.attempt.ladder_step)),
    ),
    col(
        "cleanup_ms",
        Integer,
        MS,
        "Time to verified cleanup after the end",
        |r| int(r.attempt.cleanup_ms),
    ),
    col(
        "cleanup_verified",
        Boolean,
        None,
        "Whether the GPUs were seen released",
        |r| flag(r.attempt.cleanup_verified),
    ),
];

/// After the figures (`Measurements::FIGURES`, written between).
const MEASURED: &[Column] = &[
    col(
        "energy_source",
        Str,
        None,
        "How the energy was measured",
        |r| text(r.attempt.measurements.energy_source.map(|s| s.as_str())),
    ),
    col(
        "first_reading_ms",
        Integer,
        MS,
        "Start to the first energy reading",
        |r| int(r.attempt.measurements.first_reading_ms),
    ),
    col(
        "covers_run",
        Boolean,
        None,
        "Whether the figures cover the whole run",
        |r| flag(r.attempt.measurements.covers_run),
    )
    .clean(),
    col(
        "shared",
        Boolean,
        None,
        "Whether another attempt ran on its GPUs",
        |r| Cell::Bool(r.attempt.shared),
    )
    .clean(),
    col(
        "shared_overlap",
        Number,
        None,
        "Part of the run shared (0 to 1)",
        |r| {
            r.attempt
                .sharing
                .as_ref()
                .map_or(Cell::Empty, |s| Cell::Num3(s.overlap))
        },
    ),
    col(
        "energy_share_j",
        Number,
        J,
        "Apportioned share of shared GPUs' energy (an estimate)",
        |r| num(r.attempt.sharing.as_ref().and_then(|s| s.energy_share_j)),
    )
    .figure(),
    col(
        "energy_share_method",
        Str,
        None,
        "How the share was apportioned",
        |r| text(r.attempt.sharing.as_ref().map(|s| s.share_method.as_str())),
    ),
    col(
        "throttled_thermal",
        Boolean,
        None,
        "Whether a GPU throttled for heat",
        |r| flag(r.attempt.measurements.throttled_thermal),
    )
    .clean(),
    col(
        "throttled_power",
        Boolean,
        None,
        "Whether a GPU throttled for power",
        |r| flag(r.attempt.measurements.throttled_power),
    )
    .clean(),
    col(
        "contaminated",
        Boolean,
        None,
        "Whether a foreign process used its GPUs",
        |r| flag(r.attempt.contaminated),
    )
    .clean(),
    col(
        "clean",
        Boolean,
        None,
        "Whether its figures can go in an energy comparison (what clean_only keeps)",
        |r| Cell::Bool(is_clean(&r.attempt)),
    ),
    col(
        "contamination_reason",
        Str,
        None,
        "What contaminated it",
        |r| text(r.attempt.measurements.contamination_reason.as_ref()),
    ),
    col(
        "contamination_pid",
        Integer,
        None,
        "The foreign process",
        |r| int(r.attempt.measurements.contamination_pid),
    ),
    col(
        "contamination_command",
        Str,
        None,
        "The foreign process's command",
        |r| text(r.attempt.measurements.contamination_command.as_ref()),
    ),
    col(
        "ghost_mib",
        Integer,
        MIB,
        "GPU memory no process accounted for",
        |r| int(r.attempt.measurements.ghost_mib),
    )
    .clean(),
    col(
        "exclusive_wait_ms",
        Integer,
        MS,
        "Wait for an exclusive GPU to empty",
        |r| int(r.attempt.exclusive_wait_ms),
    ),
    col(
        "cooldown_wait_ms",
        Integer,
        MS,
        "Wait for the GPU to cool",
        |r| int(r.attempt.cooldown_wait_ms),
    ),
    col(
        "cooldown_from_temp_c",
        Number,
        C,
        "Temperature the cooldown began at",
        |r| num(r.attempt.cooldown_from_temp_c),
    ),
    col(
        "cooldown_start_temp_c",
        Number,
        C,
        "Temperature the job started at",
        |r| num(r.attempt.cooldown_start_temp_c),
    ),
    col(
        "cooldown_timed_out",
        Boolean,
        None,
        "Whether the cooldown gave up",
        |r| flag(r.attempt.cooldown_timed_out),
    ),
    col(
        "background_pid",
        Integer,
        None,
        "The colocated background's process",
        |r| int(r.attempt.background_pid),
    ),
    col(
        "background_ready_ms",
        Integer,
        MS,
        "Start to the background's readiness",
        |r| int(r.attempt.background_ready_ms),
    ),
    col(
        "background_exit_code",
        Integer,
        None,
        "The background's exit status",
        |r| int(r.attempt.background_exit_code),
    ),
    col(
        "background_signal",
        Integer,
        None,
        "The signal that ended the background",
        |r| int(r.attempt.background_signal),
    ),
    col(
        "background_exited_early",
        Boolean,
        None,
        "Whether the background ended before the job",
        |r| flag(r.attempt.background_exited_early),
    ),
];

/// Where the experiment's jobs ran from, as its submitter's client recorded it.
const CODE: &[Column] = &[
    col(
        "workdir",
        Str,
        None,
        "The directory the jobs ran in (with a snapshot, the one it was taken from)",
        |r| text(r.source.as_ref().and_then(|s| s.workdir.as_ref())),
    ),
    col(
        "git_commit",
        Str,
        None,
        "The commit checked out in the working directory at submit",
        |r| {
            text(
                r.source
                    .as_ref()
                    .and_then(|s| s.git.as_ref())
                    .map(|g| &g.commit),
            )
        },
    ),
    col(
        "git_dirty",
        Boolean,
        None,
        "Whether the checkout had uncommitted changes at submit",
        |r| {
            flag(
                r.source
                    .as_ref()
                    .and_then(|s| s.git.as_ref())
                    .map(|g| g.dirty),
            )
        },
    ),
    col(
        "code_hash",
        Str,
        None,
        "The SHA-256 of the code bundle the jobs ran from (`code: snapshot`)",
        |r| {
            text(
                r.source
                    .as_ref()
                    .and_then(|s| s.snapshot.as_ref())
                    .map(|b| &b.hash),
            )
        },
    ),
];

/// The columns after the parameters: the outcome, each figure, the other measurements,
/// where the code came from.
static AFTER_PARAMS: LazyLock<Vec<Column>> = LazyLock::new(|| {
    OUTCOME
        .iter()
        .copied()
        .chain(FIGURES.iter().map(Column::of_figure))
        .chain(MEASURED.iter().copied())
        .chain(CODE.iter().copied())
        .collect()
});

/// Every column but the parameters, in the order they are written.
fn columns() -> impl Iterator<Item = &'static Column> {
    FIXED.iter().chain(AFTER_PARAMS.iter())
}

/// The export's columns, as the JSON pages list them.
pub fn describe() -> Vec<ExportColumn> {
    columns().map(Column::describe).collect()
}

/// A parameter's column: its name, or `params.NAME` where the name is one of the fixed
/// columns (a grid axis named `node` or `run`), so neither hides the other.
fn param_column(name: &str) -> Cow<'_, str> {
    if columns().any(|c| c.name == name) || name.starts_with("params.") {
        format!("params.{name}").into()
    } else {
        name.into()
    }
}

/// A metric's column: `metric.NAME`. Parameter names hold no `.` and no fixed column
/// starts so, so it never collides with either.
fn metric_column(name: &str) -> String {
    format!("metric.{name}")
}

/// The parameters this attempt ran with (the OOM ladder may have changed them).
fn ran_with(r: &ExportRow) -> &std::collections::BTreeMap<String, Value> {
    if r.attempt.params.is_empty() {
        &r.job.params
    } else {
        &r.attempt.params
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
    let metrics: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.attempt.metrics.keys().map(String::as_str))
        .collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let header: Vec<Cow<'_, str>> = FIXED
        .iter()
        .map(|c| c.name.into())
        .chain(params.iter().map(|p| param_column(p)))
        .chain(metrics.iter().map(|m| metric_column(m).into()))
        .chain(AFTER_PARAMS.iter().map(|c| c.name.into()))
        .collect();
    w.write_record(header.iter().map(|c| inert(c).into_owned()))?;
    for r in rows {
        let cells =
            |cols: &[Column]| -> Vec<String> { cols.iter().map(|c| c.value(r).csv()).collect() };
        let ran_with = ran_with(r);
        let mut rec = cells(FIXED);
        rec.extend(
            params
                .iter()
                .map(|p| ran_with.get(*p).map(value_text).unwrap_or_default()),
        );
        // A metric the run never reported is empty, never 0.
        rec.extend(metrics.iter().map(|m| {
            r.attempt
                .metrics
                .get(*m)
                .map(|v| Cell::Num(*v).csv())
                .unwrap_or_default()
        }));
        rec.extend(cells(&AFTER_PARAMS));
        w.write_record(rec.iter().map(|c| inert(c).into_owned()))?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// One JSON row: every column by name, `params`, the parameters it ran with, and
/// `metrics`, the run's final values (each also as a `metric.NAME` column). Values keep
/// their types (no spreadsheet quoting: JSON is not opened as a formula).
pub fn to_json(r: &ExportRow) -> Map<String, Value> {
    let mut row: Map<String, Value> = columns()
        .map(|c| (c.name.to_string(), c.value(r).json()))
        .collect();
    row.insert(
        "params".into(),
        Value::Object(
            ran_with(r)
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
    );
    for (name, v) in &r.attempt.metrics {
        row.insert(metric_column(name), Value::from(*v));
    }
    row.insert(
        "metrics".into(),
        Value::Object(
            r.attempt
                .metrics
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(*v)))
                .collect(),
        ),
    );
    row
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
