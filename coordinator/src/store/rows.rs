//! One row decoder for both backends: each backend exposes its rows through `Cols` (as an
//! `exec::RowRef`), and every table's columns are turned into domain types here, once.

use std::sync::LazyLock;

use chrono::{DateTime, TimeZone, Utc};
use headroom_shared::api::{
    AttemptPhase, AttemptView, EnergySource, FIGURES, GpuInfo, GpuSample, Headroom, JobSummary,
    Measurements, QuarantineView,
};
use headroom_shared::{FailureClass, Plan};
use serde::de::DeserializeOwned;

use super::{Active, Millis, Result, StoreError};
use crate::rules::{FenceRow, JobRules, PendingRow, RenewalRow};

/// Typed reads of one result row's columns, by position. JSON columns are TEXT on SQLite
/// and JSONB on PostgreSQL; either way they come out decoded.
pub(crate) trait Cols {
    fn text(&self, i: usize) -> Result<String>;
    fn text_opt(&self, i: usize) -> Result<Option<String>>;
    fn int(&self, i: usize) -> Result<i64>;
    fn int_opt(&self, i: usize) -> Result<Option<i64>>;
    fn flag(&self, i: usize) -> Result<bool>;
    fn flag_opt(&self, i: usize) -> Result<Option<bool>>;
    fn bytes(&self, i: usize) -> Result<Vec<u8>>;
    fn json<T: DeserializeOwned>(&self, i: usize) -> Result<T>;
    fn json_opt<T: DeserializeOwned>(&self, i: usize) -> Result<Option<T>>;

    fn parsed<T: std::str::FromStr>(&self, i: usize, what: &str) -> Result<T> {
        parse(&self.text(i)?, what)
    }

    fn parsed_opt<T: std::str::FromStr>(&self, i: usize, what: &str) -> Result<Option<T>> {
        self.text_opt(i)?.map(|s| parse(&s, what)).transpose()
    }

    fn mib_opt(&self, i: usize) -> Result<Option<u64>> {
        Ok(opt_u64(self.int_opt(i)?))
    }

    fn time(&self, i: usize) -> Result<DateTime<Utc>> {
        Ok(ts(self.int(i)?))
    }
}

/// A row's columns from the `.1`th on: a parser written for a read of its own reads them
/// where a joined read puts them after others.
pub(crate) struct After<'r, C>(pub &'r C, pub usize);

impl<C: Cols> Cols for After<'_, C> {
    fn text(&self, i: usize) -> Result<String> {
        self.0.text(i + self.1)
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        self.0.text_opt(i + self.1)
    }
    fn int(&self, i: usize) -> Result<i64> {
        self.0.int(i + self.1)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        self.0.int_opt(i + self.1)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        self.0.flag(i + self.1)
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        self.0.flag_opt(i + self.1)
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        self.0.bytes(i + self.1)
    }
    fn json<T: DeserializeOwned>(&self, i: usize) -> Result<T> {
        self.0.json(i + self.1)
    }
    fn json_opt<T: DeserializeOwned>(&self, i: usize) -> Result<Option<T>> {
        self.0.json_opt(i + self.1)
    }
}

pub(crate) fn ts(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

pub(crate) fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("bad {what} `{s}`")))
}

pub(crate) fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|x| x.max(0) as u64)
}

pub(crate) fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(i64_of)
}

pub(crate) fn i64_of(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// The columns `job_summary` reads, in order (`j` jobs, `e` experiments, `a` the job's
/// latest attempt).
pub(crate) const JOB_COLUMNS: &str = "j.id, j.experiment_id, e.name, j.idx, j.config, j.run, \
     j.state, j.priority, j.params, j.attempts, j.max_attempts, j.gpus, j.estimate_mib, a.node, \
     a.gpus, j.last_failure, j.created_at, j.pending_reason, j.submitted_by";

pub(crate) const JOB_FROM: &str = "FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
     LEFT JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts";

/// An experiment's own columns.
pub struct ExperimentRow {
    pub name: String,
    pub seed: i64,
    pub created_at: Millis,
    pub submitted_by: String,
    pub source: Option<headroom_shared::api::source::Source>,
    pub study: Option<headroom_shared::api::StudyRef>,
}

/// An experiment from its own columns, with its counts.
pub(crate) fn experiment(
    id: &str,
    r: ExperimentRow,
    counts: headroom_shared::api::StateCounts,
) -> Result<headroom_shared::api::ExperimentSummary> {
    Ok(headroom_shared::api::ExperimentSummary {
        counts,
        id: parse(id, "experiment id")?,
        name: r.name,
        seed: r.seed as u64,
        created_at: ts(r.created_at),
        submitted_by: r.submitted_by,
        source: r.source.unwrap_or_default(),
        study: r.study,
    })
}

pub(crate) fn job_summary(r: &impl Cols) -> Result<JobSummary> {
    let state = r.parsed(6, "job state")?;
    Ok(JobSummary {
        id: r.parsed(0, "job id")?,
        experiment: r.parsed(1, "experiment id")?,
        experiment_name: r.text(2)?,
        index: r.int(3)? as u32,
        config: r.int(4)? as u32,
        run: r.int(5)? as u32,
        state,
        priority: r.int(7)? as i32,
        params: r.json(8)?,
        attempts: r.int(9)? as u32,
        max_attempts: r.int(10)? as u32,
        gpus: r.int(11)? as u32,
        estimate_mib: r.mib_opt(12)?,
        node: r.text_opt(13)?,
        gpu_indices: r.json_opt(14)?.unwrap_or_default(),
        last_failure: r.parsed_opt(15, "failure class")?,
        created_at: r.time(16)?,
        // Only a waiting job has a reason; a stale one of a job that moved on is not shown.
        pending_reason: if state.is_pending() {
            r.json_opt(17)?
        } else {
            None
        },
        submitted_by: r.text(18)?,
    })
}

/// The columns `attempt_view` reads, in order: these, then the figures' columns not among
/// them ([`ATTEMPT_COLUMNS`]).
const BASE_ATTEMPT_COLUMNS: &str = "id, job_id, number, node, gpus, fence, phase, \
     leased_at, started_at, ended_at, pid, exit_code, signal, failure_class, estimate_mib, \
     peak_mem_mib, cleanup_ms, cleanup_verified, log_tail, estimate_source, params, \
     ladder_step, contaminated, peak_source, submitted_by, energy_mj, energy_source, \
     mean_power_mw, max_power_mw, max_temp_mdeg, start_temp_mdeg, mean_util_mpct, \
     throttled_thermal, throttled_power, throttle_reasons, contamination_reason, \
     contamination_pid, contamination_command, waiting, exclusive_wait_ms, \
     cooldown_wait_ms, cooldown_from_mdeg, cooldown_start_mdeg, cooldown_timed_out, \
     background_pid, background_ready_ms, background_exit_code, background_signal, \
     background_exited_early, host_peak_mib, first_reading_ms, covers_run, energy_counters, \
     ghost_mib, memory_cap_mib, oom_cause, oom_neighbour, memory_profile";

/// Every column `attempt_view` reads, by name in order: the base ones, then each figure's
/// (`Measurements::FIGURES`) that is not among them, so a new figure is read once its
/// migration adds its column.
static ATTEMPT_COLUMN_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut names: Vec<&'static str> = BASE_ATTEMPT_COLUMNS.split(", ").map(str::trim).collect();
    for f in FIGURES {
        if !names.contains(&f.column) {
            names.push(f.column);
        }
    }
    names.extend(RESULT_COLUMNS);
    names
});

/// What the run achieved, last in [`ATTEMPT_COLUMNS`].
const RESULT_COLUMNS: [&str; 4] = ["metric_finals", "metrics_ignored", "rungs", "tracking"];

/// [`ATTEMPT_COLUMN_NAMES`] as a select list.
pub(crate) static ATTEMPT_COLUMNS: LazyLock<String> =
    LazyLock::new(|| ATTEMPT_COLUMN_NAMES.join(", "));

pub(crate) fn phase(s: &str) -> Result<AttemptPhase> {
    match s {
        "leased" => Ok(AttemptPhase::Leased),
        "running" => Ok(AttemptPhase::Running),
        "ended" => Ok(AttemptPhase::Ended),
        other => Err(StoreError::Corrupt(format!("bad attempt phase `{other}`"))),
    }
}

pub(crate) fn attempt_view(r: &impl Cols) -> Result<AttemptView> {
    let phase = phase(&r.text(6)?)?;
    let failure_class: Option<FailureClass> = r.parsed_opt(13, "failure class")?;
    Ok(AttemptView {
        id: r.parsed(0, "attempt id")?,
        job: r.parsed(1, "job id")?,
        number: r.int(2)? as u32,
        node: r.text(3)?,
        gpus: r.json(4)?,
        fence: r.int(5)?,
        phase,
        leased_at: r.time(7)?,
        started_at: r.int_opt(8)?.map(ts),
        ended_at: r.int_opt(9)?.map(ts),
        pid: r.int_opt(10)?.map(|p| p as u32),
        exit_code: r.int_opt(11)?.map(|c| c as i32),
        signal: r.int_opt(12)?.map(|s| s as i32),
        success: (phase == AttemptPhase::Ended).then_some(failure_class.is_none()),
        failure_class,
        estimate_mib: r.mib_opt(14)?,
        peak_mem_mib: r.mib_opt(15)?,
        cleanup_ms: r.mib_opt(16)?,
        cleanup_verified: r.flag_opt(17)?,
        log_tail: r.text_opt(18)?,
        estimate_source: r.text(19)?,
        params: r.json(20)?,
        ladder_step: r.int(21)? as u32,
        contaminated: r.flag_opt(22)?,
        peak_source: r.parsed_opt(23, "peak source")?,
        submitted_by: r.text(24)?,
        measurements: measurements(r, 25)?,
        // Only an attempt whose job has not started waits.
        waiting: if phase == AttemptPhase::Leased {
            r.text_opt(38)?
        } else {
            None
        },
        exclusive_wait_ms: r.mib_opt(39)?,
        cooldown_wait_ms: r.mib_opt(40)?,
        cooldown_from_temp_c: r.int_opt(41)?.map(from_mdeg),
        cooldown_start_temp_c: r.int_opt(42)?.map(from_mdeg),
        cooldown_timed_out: r.flag_opt(43)?,
        // After the 13 measurement columns (25..=37) and the exclusive/cooldown ones (38..=43), in ATTEMPT_COLUMNS order.
        background_pid: r.int_opt(44)?.map(|p| p as u32),
        background_ready_ms: r.mib_opt(45)?,
        background_exit_code: r.int_opt(46)?.map(|c| c as i32),
        background_signal: r.int_opt(47)?.map(|s| s as i32),
        background_exited_early: r.flag_opt(48)?,
        host_peak_mib: r.mib_opt(49)?,
        memory_cap_mib: r.mib_opt(54)?,
        oom_cause: r.parsed_opt(55, "OOM cause")?,
        oom_neighbour: r.parsed_opt(56, "attempt id")?,
        // Set by the store's read of its neighbours (`store::sharing`).
        shared: false,
        sharing: None,
        metrics: r.json_opt(results_at())?.unwrap_or_default(),
        metrics_ignored: r.mib_opt(results_at() + 1)?,
        rungs: r.json_opt(results_at() + 2)?.unwrap_or_default(),
        tracking: r.text_opt(results_at() + 3)?,
    })
}

/// Where [`RESULT_COLUMNS`] start.
fn results_at() -> usize {
    ATTEMPT_COLUMN_NAMES.len() - RESULT_COLUMNS.len()
}

/// Decodes the measurement columns of [`ATTEMPT_COLUMNS`] from `at` on; the figures by their
/// columns' names.
fn measurements(r: &impl Cols, at: usize) -> Result<Measurements> {
    let mut m = Measurements {
        energy_source: r.parsed_opt(at + 1, "energy source")?,
        throttled_thermal: r.flag_opt(at + 7)?,
        throttled_power: r.flag_opt(at + 8)?,
        throttle_reasons: r.json_opt(at + 9)?,
        contamination_reason: r.text_opt(at + 10)?,
        contamination_pid: r
            .int_opt(at + 11)?
            .map(|p| u32::try_from(p.max(0)).unwrap_or(u32::MAX)),
        contamination_command: r.text_opt(at + 12)?,
        // After the columns up to `host_peak_mib` (49), in ATTEMPT_COLUMNS order.
        first_reading_ms: r.mib_opt(50)?,
        covers_run: r.flag_opt(51)?,
        counters: r.json_opt(52)?.unwrap_or_default(),
        ghost_mib: r.mib_opt(53)?,
        // JSON `null`: a run that ended well told no shape.
        memory_profile: r.json_opt::<Option<_>>(57)?.flatten(),
        ..Measurements::default()
    };
    for (f, &i) in FIGURES.iter().zip(FIGURE_AT.iter()) {
        (f.set)(&mut m, r.int_opt(i)?.map(|x| x as f64 / 1000.0));
    }
    Ok(m)
}

/// Where each figure's column stands in [`ATTEMPT_COLUMN_NAMES`] (every one is there: that
/// list is made from them).
static FIGURE_AT: LazyLock<Vec<usize>> = LazyLock::new(|| {
    FIGURES
        .iter()
        .map(|f| {
            ATTEMPT_COLUMN_NAMES
                .iter()
                .position(|c| *c == f.column)
                .unwrap_or(usize::MAX)
        })
        .collect()
});

/// A report's measurements as the columns store them (figures in milli-units, as
/// `gpu_telemetry`).
pub(crate) struct MeasureRow {
    /// Each of `FIGURES`, in its order.
    pub figures: Vec<Option<i64>>,
    pub energy_source: Option<&'static str>,
    pub throttled_thermal: Option<bool>,
    pub throttled_power: Option<bool>,
    pub throttle_reasons: Option<Vec<String>>,
    pub contamination_reason: Option<String>,
    pub contamination_pid: Option<i64>,
    pub contamination_command: Option<String>,
}

pub(crate) fn measure_row(m: &Measurements) -> MeasureRow {
    MeasureRow {
        figures: FIGURES.iter().map(|f| milli((f.get)(m))).collect(),
        energy_source: m.energy_source.map(EnergySource::as_str),
        throttled_thermal: m.throttled_thermal,
        throttled_power: m.throttled_power,
        throttle_reasons: m.throttle_reasons.clone(),
        contamination_reason: m.contamination_reason.clone(),
        contamination_pid: m.contamination_pid.map(i64::from),
        contamination_command: m.contamination_command.clone(),
    }
}

/// Temperatures are stored in milli-degrees C (as telemetry is).
pub(crate) fn mdeg(c: Option<f64>) -> Option<i64> {
    c.filter(|c| c.is_finite())
        .map(|c| (c * 1000.0).round() as i64)
}

fn from_mdeg(m: i64) -> f64 {
    m as f64 / 1000.0
}

/// The columns `token_row` reads, in order.
pub(crate) const TOKEN_COLUMNS: &str = concat!(
    "id, name, role, created_by, created_at, revoked_at, secret_hash, expires_at, nodes, ",
    "secret_digest"
);

pub(crate) fn token_row(r: &impl Cols) -> Result<super::StoredToken> {
    Ok(super::StoredToken {
        view: headroom_shared::api::TokenView {
            id: r.text(0)?,
            name: r.text(1)?,
            role: r.parsed(2, "role")?,
            created_by: r.text(3)?,
            created_at: r.time(4)?,
            revoked_at: r.int_opt(5)?.map(ts),
            expires_at: r.int_opt(7)?.map(ts),
            nodes: r.json_opt(8)?,
        },
        secret_hash: r.text(6)?,
        secret_digest: r.text_opt(9)?,
    })
}

/// The columns of `JobDetail` beyond the summary, in order.
pub(crate) const DETAIL_COLUMNS: &str = "argv, env, profile, timeout_ms, retry_on, memory_key, ladder, ladder_step, prestart, \
     ladder_from";

pub(crate) fn job_detail(
    summary: JobSummary,
    r: &impl Cols,
    attempts: Vec<AttemptView>,
) -> Result<headroom_shared::api::JobDetail> {
    Ok(headroom_shared::api::JobDetail {
        summary,
        argv: r.json(0)?,
        env: r.json(1)?,
        profile: r.text(2)?,
        timeout_ms: r.mib_opt(3)?,
        retry_on: r.json(4)?,
        memory_key: r.text(5)?,
        oom_ladder: r.json(6)?,
        ladder_step: r.int(7)? as u32,
        attempts_detail: attempts,
        prestart: r.json_opt(8)?,
        ladder_from: r.text_opt(9)?,
    })
}

/// The columns [`job_rules`] reads (`j` jobs, `e` experiments).
pub(crate) const RULES_COLUMNS: &str = "j.attempts, j.max_attempts, j.retry_on, j.ladder, \
     j.ladder_step, j.params, j.command, j.shell, j.config, j.run, e.name, \
     e.spec -> 'memory_key', e.spec -> 'on_throttle', j.background_mib";

pub(crate) fn job_rules(r: &impl Cols) -> Result<JobRules> {
    Ok(JobRules {
        attempts: r.int(0)?.max(0) as u32,
        max_attempts: r.int(1)?.max(0) as u32,
        retry_on: r.json(2)?,
        ladder: r.json(3)?,
        ladder_step: r.int(4)?.max(0) as u32,
        params: r.json(5)?,
        command: r.json(6)?,
        shell: r.flag(7)?,
        config: r.int(8)? as u32,
        run: r.int(9)? as u32,
        experiment: r.text(10)?,
        key_params: r.json_opt(11)?.unwrap_or_default(),
        // Specs stored before `on_throttle` existed flag.
        on_throttle: r.json_opt(12)?.unwrap_or_default(),
        background_mib: r.mib_opt(13)?,
    })
}

/// A report's fencing columns: `a.phase, a.fence, j.fence`.
pub(crate) fn fence_row(r: &impl Cols) -> Result<FenceRow> {
    Ok(FenceRow {
        phase: phase(&r.text(0)?)?,
        attempt_fence: r.int(1)?,
        job_fence: r.int(2)?,
    })
}

/// What a finish report reads: `a.phase, a.fence, j.fence, a.failure_class, started`.
pub(crate) fn finish_row(r: &impl Cols) -> Result<crate::rules::FinishRow> {
    Ok(crate::rules::FinishRow {
        fence: fence_row(r)?,
        failure: r.parsed_opt(3, "failure class")?,
        started: r.flag(4)?,
    })
}

/// Everything an attempt's end reads before it writes, in one read: its fencing and outcome
/// columns, a stop asked of it, its job's rules and its experiment's results settings.
pub struct FinishRead {
    pub job: String,
    pub job_state: headroom_shared::JobState,
    /// Where the attempt was leased.
    pub node: String,
    pub row: crate::rules::FinishRow,
    pub requeue: Option<headroom_shared::checkpoint::Requeue>,
    pub rules: JobRules,
    pub results: AttemptResults,
}

/// An attempt's experiment, its results settings and the rung decisions taken while it ran.
pub struct AttemptResults {
    pub experiment: String,
    pub spec: Option<headroom_shared::results::ResultsSpec>,
    pub decided: Vec<headroom_shared::results::RungDecision>,
}

/// The columns [`finish_read`] reads (`a` the attempt, `j` its job, `e` its experiment).
pub(crate) fn finish_read_columns() -> String {
    format!(
        "j.id, j.state, a.node, a.phase, a.fence, j.fence, a.failure_class, \
         a.started_at IS NOT NULL, a.requeue, j.experiment_id, e.results, a.rungs, \
         {RULES_COLUMNS}"
    )
}

pub(crate) fn finish_read(r: &impl Cols) -> Result<FinishRead> {
    let attempt = After(r, 3);
    Ok(FinishRead {
        job: r.text(0)?,
        job_state: r.parsed(1, "job state")?,
        node: r.text(2)?,
        row: finish_row(&attempt)?,
        requeue: attempt
            .text_opt(5)?
            .as_deref()
            .and_then(headroom_shared::checkpoint::Requeue::parse),
        results: attempt_results(&After(r, 9))?,
        rules: job_rules(&After(r, 12))?,
    })
}

/// `experiment_id, results, rungs`.
pub(crate) fn attempt_results(r: &impl Cols) -> Result<AttemptResults> {
    Ok(AttemptResults {
        experiment: r.text(0)?,
        spec: r.json_opt(1)?,
        decided: r.json_opt(2)?.unwrap_or_default(),
    })
}

/// What ending an attempt by its report returns: where it ran and how it was placed.
pub struct Ended {
    pub node: String,
    pub gpus: Vec<u32>,
    pub memory_key: String,
    pub estimate_mib: Option<u64>,
}

/// What ending an attempt returns: `node, gpus, memory_key, estimate_mib`.
pub(crate) fn ended(r: &impl Cols) -> Result<Ended> {
    Ok(Ended {
        node: r.text(0)?,
        gpus: r.json(1)?,
        memory_key: r.text(2)?,
        estimate_mib: r.mib_opt(3)?,
    })
}

/// What a heartbeat reads of an attempt: `a.phase, a.fence, j.fence, a.failure_class,
/// a.agent_id = <the agent>`.
pub(crate) fn renewal_row(r: &impl Cols) -> Result<RenewalRow> {
    Ok(RenewalRow {
        fence: fence_row(r)?,
        failure: r.parsed_opt(3, "failure class")?,
        ours: r.flag(4)?,
    })
}

/// Columns of an active attempt: `a.id, a.gpus, a.estimate_mib, a.fence, j.prestart,
/// a.host_estimate_mib, a.started_at` and the memory phases it was placed by.
pub(crate) const ACTIVE_COLUMNS: &str = "a.id, a.gpus, a.estimate_mib, a.fence, j.prestart, \
     a.host_estimate_mib, a.started_at, a.placed_phases";

pub(crate) fn active(r: &impl Cols) -> Result<Active> {
    Ok(Active {
        id: r.text(0)?,
        gpus: r.json(1)?,
        estimate: r.mib_opt(2)?,
        fence: r.int(3)?,
        alone: r
            .json_opt::<headroom_shared::prestart::Prestart>(4)?
            .is_some_and(|p| p.holds_gpu()),
        host_mib: r.mib_opt(5)?,
        started_ms: r.int_opt(6)?,
        phases: r.json_opt(7)?,
    })
}

/// A user's share and caps from `share, max_jobs, max_gpus, max_gpu_mib` at `i`..
pub(crate) fn user_limits(r: &impl Cols, i: usize) -> Result<headroom_shared::api::UserLimits> {
    let u32_opt = |v: Option<i64>| v.map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX));
    Ok(headroom_shared::api::UserLimits {
        share: u32::try_from(r.int(i)?.max(1)).unwrap_or(u32::MAX),
        max_jobs: u32_opt(r.int_opt(i + 1)?),
        max_gpus: u32_opt(r.int_opt(i + 2)?),
        max_gpu_mib: r.mib_opt(i + 3)?,
    })
}

/// Columns of a pending job, read by [`pending`].
pub(crate) const PENDING_COLUMNS: &str = "id, gpus, estimate_mib, updated_at, memory_key, pending_reason, prestart, background_mib, \
     priority, seq, state, experiment_id, submitted_by, \
     (SELECT max_concurrent FROM experiments e WHERE e.id = jobs.experiment_id), \
     (SELECT host_memory_mib FROM experiments e WHERE e.id = jobs.experiment_id), \
     (SELECT memory_phases FROM experiments e WHERE e.id = jobs.experiment_id), attempts";

pub(crate) fn pending(r: &impl Cols) -> Result<PendingRow> {
    Ok(PendingRow {
        id: r.text(0)?,
        gpus: r.int(1)?.max(0) as u32,
        declared: r.mib_opt(2)?,
        since: r.int(3)?,
        memory_key: r.text(4)?,
        reason: r.json_opt(5)?,
        alone: r
            .json_opt::<headroom_shared::prestart::Prestart>(6)?
            .is_some_and(|p| p.holds_gpu()),
        background_mib: r.mib_opt(7)?,
        cursor: crate::rules::QueueCursor {
            priority: r.int(8)?,
            seq: r.int(9)?,
        },
        state: r.parsed(10, "job state")?,
        experiment: r.text(11)?,
        user: r.text(12)?,
        max_concurrent: r
            .int_opt(13)?
            .map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX)),
        host_declared: r.mib_opt(14)?,
        phases: r.json_opt(15)?,
        first: r.int(16)? == 0,
    })
}

/// A node as stored: `name, agent_id, gpus, plan, headroom, telemetry, last_seen`.
pub struct NodeRow {
    pub name: String,
    pub agent: Option<String>,
    pub gpus: Vec<GpuInfo>,
    pub plan: Plan,
    pub headroom: Headroom,
    pub samples: Vec<GpuSample>,
    pub last_seen: Option<Millis>,
    /// Host memory usable by jobs; `None`: not admitted by it.
    pub host_memory_mib: Option<u64>,
}

pub(crate) const NODE_COLUMNS: &str =
    "name, agent_id, gpus, plan, headroom, telemetry, last_seen, host_memory_mib";

pub(crate) fn node(r: &impl Cols) -> Result<NodeRow> {
    Ok(NodeRow {
        name: r.text(0)?,
        agent: r.text_opt(1)?,
        gpus: r.json(2)?,
        plan: r.parsed(3, "plan")?,
        headroom: r.parsed(4, "headroom")?,
        samples: r.json_opt(5)?.unwrap_or_default(),
        last_seen: r.int_opt(6)?,
        host_memory_mib: r.mib_opt(7)?,
    })
}

/// A quarantine row: `gpu, attempt_id, reason, since`.
pub(crate) fn quarantine(r: &impl Cols) -> Result<(u32, QuarantineView)> {
    Ok((
        r.int(0)? as u32,
        QuarantineView {
            attempt: r.parsed(1, "attempt id")?,
            reason: r.text(2)?,
            since: r.time(3)?,
        },
    ))
}

/// The job columns a new lease is made of (`j` jobs, `e` experiments).
pub(crate) const LEASE_COLUMNS: &str = "j.argv, j.env, j.params, e.name, j.memory_key, \
     j.timeout_ms, j.attempts, j.fence, j.ladder_step, j.prestart, j.background, u.unix_user, \
     u.allow_root, e.source, e.results, e.checkpoint, j.last_failure, e.memory_cap_off";

pub struct LeaseRow {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub params: std::collections::BTreeMap<String, serde_json::Value>,
    pub experiment: String,
    pub memory_key: String,
    pub timeout_ms: Option<u64>,
    pub attempts: i64,
    pub fence: i64,
    pub ladder_step: i64,
    pub prestart: Option<headroom_shared::prestart::Prestart>,
    pub background: Option<headroom_shared::colocate::Background>,
    /// The submitter's Unix user, as mapped now.
    pub run_as: Option<headroom_shared::api::RunAs>,
    pub source: Option<headroom_shared::api::source::Source>,
    pub results: Option<headroom_shared::results::ResultsSpec>,
    pub checkpoint: Option<headroom_shared::checkpoint::Checkpoint>,
    /// How the job's last attempt ended, when it failed or was requeued.
    pub last_failure: Option<headroom_shared::FailureClass>,
    /// `memory_cap: off`.
    pub memory_cap_off: bool,
}

pub(crate) fn lease_row(r: &impl Cols) -> Result<LeaseRow> {
    Ok(LeaseRow {
        argv: r.json(0)?,
        env: r.json(1)?,
        params: r.json(2)?,
        experiment: r.text(3)?,
        memory_key: r.text(4)?,
        timeout_ms: r.mib_opt(5)?,
        attempts: r.int(6)?,
        fence: r.int(7)?,
        ladder_step: r.int(8)?,
        prestart: r.json_opt(9)?,
        background: r.json_opt(10)?,
        run_as: match r.text_opt(11)? {
            Some(unix_user) => Some(headroom_shared::api::RunAs {
                unix_user,
                allow_root: r.flag_opt(12)?.unwrap_or(false),
            }),
            None => None,
        },
        source: r.json_opt(13)?,
        results: r.json_opt(14)?,
        checkpoint: r.json_opt(15)?,
        last_failure: match r.text_opt(16)? {
            Some(c) => Some(parse(&c, "failure class")?),
            None => None,
        },
        memory_cap_off: r.flag_opt(17)?.unwrap_or(false),
    })
}

/// A lease about to be written: what the agent gets, and the attempt columns beside it.
pub(crate) struct NewLease {
    pub lease: headroom_shared::api::Lease,
    pub memory_key: String,
    pub ladder_step: i64,
}

/// The lease the agent gets for attempt `attempt` of `job` (number `attempts + 1`, token
/// `fence + 1`).
pub(crate) fn lease_row_into(
    row: LeaseRow,
    attempt: headroom_shared::AttemptId,
    job: &str,
    gpus: &[u32],
    estimate: Option<u64>,
) -> Result<NewLease> {
    Ok(NewLease {
        lease: headroom_shared::api::Lease {
            attempt,
            job: parse(job, "job id")?,
            fence: row.fence + 1,
            number: (row.attempts + 1) as u32,
            experiment: row.experiment,
            argv: row.argv,
            env: row.env,
            params: row.params,
            gpus: gpus.to_vec(),
            estimate_mib: estimate,
            timeout_ms: row.timeout_ms,
            prestart: row.prestart,
            background: row.background,
            run_as: row.run_as,
            source: row.source,
            results: row.results,
            report_key: None,
            host_memory_mib: None,
            checkpoint: row.checkpoint,
            previous_end: row.last_failure,
            memory_cap_off: row.memory_cap_off,
            starts_with_mib: None,
        },
        memory_key: row.memory_key,
        ladder_step: row.ladder_step,
    })
}

// ---- GPU telemetry ------------------------------------------------------------------

pub(crate) const TELEMETRY_COLUMNS: &str = "gpu, at, used_mib, free_mib, total_mib, \
     utilization_pct, power_mw, energy_mj, temperature_mdeg, sm_clock_mhz, throttle, error";

/// A telemetry sample in the stored (integer) units.
#[derive(Clone, Debug)]
pub(crate) struct TelemetryRow {
    pub gpu: i64,
    pub at: Millis,
    pub used_mib: Option<i64>,
    pub free_mib: Option<i64>,
    pub total_mib: Option<i64>,
    pub utilization_pct: Option<i64>,
    pub power_mw: Option<i64>,
    pub energy_mj: Option<i64>,
    pub temperature_mdeg: Option<i64>,
    pub sm_clock_mhz: Option<i64>,
    pub throttle: Option<Vec<String>>,
    pub error: Option<String>,
}

/// Milli-units, rounded (the API validated the figures as finite).
fn milli(v: Option<f64>) -> Option<i64> {
    v.map(|x| (x * 1000.0).round() as i64)
}

pub(crate) fn telemetry_row(s: &headroom_shared::api::TelemetrySample) -> TelemetryRow {
    TelemetryRow {
        gpu: i64::from(s.gpu),
        at: s.at.timestamp_millis(),
        used_mib: opt_i64(s.used_mib),
        free_mib: opt_i64(s.free_mib),
        total_mib: opt_i64(s.total_mib),
        utilization_pct: s.utilization_pct.map(i64::from),
        power_mw: milli(s.power_w),
        energy_mj: milli(s.energy_j),
        temperature_mdeg: milli(s.temperature_c),
        sm_clock_mhz: s.sm_clock_mhz.map(i64::from),
        throttle: s.throttle.clone(),
        error: s.error.clone(),
    }
}

/// Decodes [`TELEMETRY_COLUMNS`].
pub(crate) fn telemetry_sample(r: &impl Cols) -> Result<headroom_shared::api::TelemetrySample> {
    let unmilli = |v: Option<i64>| v.map(|x| x as f64 / 1000.0);
    let small = |v: Option<i64>| v.map(|x| u32::try_from(x.max(0)).unwrap_or(u32::MAX));
    Ok(headroom_shared::api::TelemetrySample {
        gpu: small(Some(r.int(0)?)).unwrap_or_default(),
        at: r.time(1)?,
        used_mib: opt_u64(r.int_opt(2)?),
        free_mib: opt_u64(r.int_opt(3)?),
        total_mib: opt_u64(r.int_opt(4)?),
        utilization_pct: small(r.int_opt(5)?),
        power_w: unmilli(r.int_opt(6)?),
        energy_j: unmilli(r.int_opt(7)?),
        temperature_c: unmilli(r.int_opt(8)?),
        sm_clock_mhz: small(r.int_opt(9)?),
        throttle: r.json_opt(10)?,
        error: r.text_opt(11)?,
    })
}
