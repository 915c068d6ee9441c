//! The REST API's request and response bodies (`/v1`), shared by server, agent and CLI.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::expand::ExpandedJob;
use crate::ids::{AgentId, AttemptId, ExperimentId, JobId, StudyId};
use crate::pending::PendingReason;
use crate::prestart::{Prestart, PrestartReport};
use crate::size::MemSize;
use crate::state::{FailureClass, JobState};

mod agent;
pub mod alerts;
pub mod bounds;
mod export;
mod measurements;
pub mod schedule;
pub mod source;
pub mod usage;
pub use agent::*;
pub use export::*;
pub use measurements::*;
pub use usage::UserLimits;

/// Every error the API returns: `{"error": {"code", "message", "field"?}}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The attempt the error is about (`stale_fence`: the attempt whose lease is no longer
    /// the caller's), for programs to act on without reading the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<AttemptId>,
}

/// What went wrong, for programs: the server sets it, clients match on it (never on text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A field of the request is wrong; `field` names it. 422.
    Invalid,
    /// The request is malformed (not JSON, a bad id, a bad query string). 400.
    BadRequest,
    /// No such experiment, job, attempt or node. 404.
    NotFound,
    /// The report carries a stale fencing token: the lease is someone else's now. 409.
    StaleFence,
    /// The coordinator no longer knows this agent: register again. 409.
    UnknownAgent,
    /// The job is not in a state that allows this. 409.
    Conflict,
    /// The store cannot be reached; try again. 503.
    StoreUnavailable,
    /// No token, or one the coordinator does not know (wrong, revoked). 401.
    Unauthenticated,
    /// The token's role may not do this; the message names the role needed. 403.
    Forbidden,
    /// Too many failed authentications from this address: wait. 429.
    Throttled,
    /// The coordinator is busy (a claim waited too long for its turn at the store, or a
    /// token for its verification): try again (`Retry-After` says in how many seconds at
    /// the soonest). 503.
    Busy,
    /// A bug or a corrupt row. 500.
    Internal,
    /// A code this build does not know (a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The HTTP status the server answers with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Invalid => 422,
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::StaleFence | ErrorCode::UnknownAgent | ErrorCode::Conflict => 409,
            ErrorCode::Throttled => 429,
            ErrorCode::StoreUnavailable | ErrorCode::Busy => 503,
            ErrorCode::Internal | ErrorCode::Unknown => 500,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Invalid => "invalid",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::StaleFence => "stale_fence",
            ErrorCode::UnknownAgent => "unknown_agent",
            ErrorCode::Conflict => "conflict",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::Throttled => "throttled",
            ErrorCode::Busy => "busy",
            ErrorCode::Internal => "internal",
            ErrorCode::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---- experiments and jobs -------------------------------------------------------------

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitRequest {
    /// The spec as a JSON document (YAML is converted by the client).
    #[cfg_attr(feature = "openapi", schema(value_type = crate::spec::ExperimentSpec))]
    pub spec: Value,
    /// Overrides the spec's `seed`.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Expand and return the jobs without storing anything.
    #[serde(default)]
    pub dry_run: bool,
    /// The directory the jobs run in (absolute): where the client was run, or the spec's
    /// `workdir` resolved against the spec file. Without it (and without an absolute
    /// `workdir` in the spec), the job user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The repository state of `workdir` at submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<source::GitState>,
    /// The uploaded bundle the jobs run from; required by `code: snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<source::Snapshot>,
    /// The Python environment the client resolved: the spec's `environment` (a relative
    /// venv made absolute), or, where the spec says `inherit` or nothing, the submitter's
    /// activated one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<source::Environment>,
    /// A study's variants that run from a source of their own (their own `workdir`,
    /// `environment` or bundle), by variant name; the others take the fields above.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, VariantSource>,
}

/// Where one variant of a study runs from, as the client resolved it (see
/// [`SubmitRequest`]'s fields of the same names).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VariantSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<source::GitState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<source::Snapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<source::Environment>,
}

/// One variant of a submitted study: its experiment (`None` for a dry run) and job count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmittedVariant {
    /// Its name in the study (`train`); its experiment is named `STUDY.VARIANT`.
    pub variant: String,
    pub name: String,
    pub experiment: Option<ExperimentId>,
    pub jobs: u64,
    pub seed: u64,
    /// GPUs per job, the declared memory per GPU and the parameters its estimate is learned
    /// by (`resources`, `memory_key`).
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemSize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_key: Vec<String>,
    /// The variants it waits for (`after`), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// How long one of its runs is expected to take (ms), by which the study's jobs are
    /// queued (longest first), and where that comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_from: Option<LengthFrom>,
}

/// Where a variant's expected run length comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LengthFrom {
    /// Its `expected_duration`.
    Declared,
    /// The mean run time of the latest successful runs of its configurations (its memory
    /// keys), the longest of them: an earlier submission of the same experiment name.
    Learned,
}

/// The study an experiment was submitted in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StudyRef {
    pub id: StudyId,
    pub name: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitResponse {
    /// `None` for a dry run.
    pub experiment: Option<ExperimentId>,
    pub name: String,
    pub seed: u64,
    pub jobs: u64,
    pub dry_run: bool,
    /// The expanded jobs, for a dry run: the first 1,000 at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<Vec<ExpandedJob>>,
    /// How many jobs of a dry run `preview` leaves out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preview_omitted: u64,
    /// What may keep the jobs waiting, e.g. larger than every GPU of every live node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A study's id (`None` for a single experiment or a dry run); `experiment` is `None`
    /// then, and `variants` lists its experiments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study: Option<StudyId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<SubmittedVariant>,
    /// A dry run's schedule on the live nodes: what runs at once, what never fits and why,
    /// the expected makespan (`None` when stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<schedule::SchedulePreview>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Jobs per state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateCounts {
    pub queued: u64,
    pub leased: u64,
    pub running: u64,
    pub retrying: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Stopped by `early_stop`.
    #[serde(default)]
    pub pruned: u64,
}

impl StateCounts {
    pub fn add(&mut self, state: JobState, n: u64) {
        let slot = match state {
            JobState::Queued => &mut self.queued,
            JobState::Leased => &mut self.leased,
            JobState::Running => &mut self.running,
            JobState::Retrying => &mut self.retrying,
            JobState::Succeeded => &mut self.succeeded,
            JobState::Failed => &mut self.failed,
            JobState::Cancelled => &mut self.cancelled,
            JobState::Pruned => &mut self.pruned,
        };
        *slot += n;
    }

    pub fn total(&self) -> u64 {
        self.queued
            + self.leased
            + self.running
            + self.retrying
            + self.succeeded
            + self.failed
            + self.cancelled
            + self.pruned
    }

    pub fn finished(&self) -> u64 {
        self.succeeded + self.failed + self.cancelled + self.pruned
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExperimentSummary {
    pub id: ExperimentId,
    pub name: String,
    pub seed: u64,
    pub created_at: DateTime<Utc>,
    pub counts: StateCounts,
    /// Name of the token that submitted it (`anonymous` where the coordinator has no tokens).
    #[serde(default = "anonymous")]
    pub submitted_by: String,
    /// Where its jobs run from: working directory, code, environment.
    #[serde(default, skip_serializing_if = "source::Source::is_empty")]
    pub source: source::Source,
    /// The study it was submitted in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study: Option<StudyRef>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobSummary {
    pub id: JobId,
    pub experiment: ExperimentId,
    pub experiment_name: String,
    pub index: u32,
    pub config: u32,
    pub run: u32,
    pub state: JobState,
    pub priority: i32,
    pub params: BTreeMap<String, Value>,
    pub attempts: u32,
    pub max_attempts: u32,
    pub gpus: u32,
    pub estimate_mib: Option<u64>,
    /// Node and GPUs of the current or last attempt.
    pub node: Option<String>,
    pub gpu_indices: Vec<u32>,
    pub last_failure: Option<FailureClass>,
    pub created_at: DateTime<Utc>,
    /// Name of the token that submitted the job's experiment.
    #[serde(default = "anonymous")]
    pub submitted_by: String,
    /// Why a waiting (`queued` or `retrying`) job is not running yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<PendingReason>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub profile: String,
    pub timeout_ms: Option<u64>,
    pub retry_on: Vec<FailureClass>,
    pub memory_key: String,
    pub oom_ladder: Vec<BTreeMap<String, Value>>,
    /// Ladder steps applied so far.
    pub ladder_step: u32,
    pub attempts_detail: Vec<AttemptView>,
    /// What each attempt waits for before the job starts (`exclusive`, `cooldown`).
    #[serde(default)]
    pub prestart: Option<Prestart>,
    /// Why the job starts at its ladder step: another run of its configuration fit only
    /// there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder_from: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AttemptPhase {
    Leased,
    Running,
    Ended,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    pub id: AttemptId,
    pub job: JobId,
    pub number: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    pub fence: i64,
    pub phase: AttemptPhase,
    pub leased_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// `None` while running and on success.
    pub failure_class: Option<FailureClass>,
    pub success: Option<bool>,
    pub estimate_mib: Option<u64>,
    pub peak_mem_mib: Option<u64>,
    /// How `peak_mem_mib` was measured (`None` when there is no peak).
    #[serde(default)]
    pub peak_source: Option<PeakSource>,
    pub cleanup_ms: Option<u64>,
    pub cleanup_verified: Option<bool>,
    pub log_tail: Option<String>,
    /// Where `estimate_mib` came from: `declared`, `learned` (peaks of earlier attempts of the
    /// same memory key) or `none` (the job ran alone on its GPU).
    #[serde(default)]
    pub estimate_source: String,
    /// The parameters this attempt ran with (after `ladder_step` OOM ladder steps).
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    #[serde(default)]
    pub ladder_step: u32,
    /// A process of no attempt used its GPU while it ran (energy figures are suspect).
    #[serde(default)]
    pub contaminated: Option<bool>,
    /// Energy, power, temperature, utilization and throttling over the run, and what
    /// contaminated it.
    #[serde(flatten)]
    pub measurements: Measurements,
    /// Another attempt ran on one of its GPUs during its run (its GPU figures are not its
    /// own: left out of `--clean-only`).
    #[serde(default)]
    pub shared: bool,
    /// With whom, for how much of its run, and its apportioned energy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// Name of the token that submitted the attempt's experiment.
    #[serde(default = "anonymous")]
    pub submitted_by: String,
    /// While the job has not started: what the attempt waits for (`waiting for GPU 0 to
    /// empty: pid 4242`, `cooling: 52 °C → 40 °C`).
    #[serde(default)]
    pub waiting: Option<String>,
    /// Exclusive attempts: how long it waited for its GPUs to hold no process.
    #[serde(default)]
    pub exclusive_wait_ms: Option<u64>,
    /// Cooldown: how long it waited, the hottest GPU's temperature when cooling began and
    /// when the job was released, and whether `max_wait` passed first.
    #[serde(default)]
    pub cooldown_wait_ms: Option<u64>,
    #[serde(default)]
    pub cooldown_from_temp_c: Option<f64>,
    #[serde(default)]
    pub cooldown_start_temp_c: Option<f64>,
    #[serde(default)]
    pub cooldown_timed_out: Option<bool>,
    /// Colocated runs (`colocate`): the background's pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_pid: Option<u32>,
    /// How long the foreground waited for its background to be ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_ready_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_signal: Option<i32>,
    /// The background exited by itself before its foreground ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_exited_early: Option<bool>,
    /// Highest host RAM its processes used together (MiB), from its cgroup; absent where
    /// attempts have no cgroup with a memory controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_peak_mib: Option<u64>,
    /// The hard GPU memory limit it ran under (MiB on each of its GPUs), where the node
    /// enforces one (`memory_cap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap_mib: Option<u64>,
    /// Why it ran out of GPU memory (`cap_hit`: past its own limit or estimate;
    /// `neighbour_grew`: a neighbour grew past its estimate, `oom_neighbour`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_cause: Option<OomCause>,
    /// The attempt on its GPU that grew past its estimate and ran it out of memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_neighbour: Option<AttemptId>,
    /// What the run reported of itself: each metric's final value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    /// Metric lines it printed that were ignored (malformed, not a number, too many names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_ignored: Option<u64>,
    /// `early_stop`'s decision at each rung it reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rungs: Vec<crate::results::RungDecision>,
    /// Where its results went (`tracking`): the MLflow run, or why they did not get there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CancelResponse {
    /// Jobs that were cancelled by this call.
    pub cancelled: u64,
    /// With `requeue`: running jobs asked to stop after their checkpoint signal and run
    /// again later (none are cancelled).
    #[serde(default)]
    pub requeued: u64,
}

/// `POST /v1/jobs/{id}/cancel` and `/v1/experiments/{id}/cancel`: `requeue` stops running
/// jobs after their `checkpoint` signal and queues them again, without spending an attempt,
/// instead of cancelling them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[serde(deny_unknown_fields)]
pub struct CancelQuery {
    #[serde(default)]
    pub requeue: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    /// Changes whenever any job changes; pass it back as `after` to wait for the next change.
    pub version: u64,
    pub counts: StateCounts,
}

// ---- nodes ------------------------------------------------------------------------

/// GPU memory kept free on every GPU: a share of its total or a fixed size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Headroom {
    Percent(f64),
    Fixed(MemSize),
}

impl Default for Headroom {
    fn default() -> Self {
        Headroom::Percent(10.0)
    }
}

impl Headroom {
    pub fn mib_of(&self, total_mib: u64) -> u64 {
        match self {
            Headroom::Percent(p) => ((total_mib as f64) * p / 100.0).ceil() as u64,
            Headroom::Fixed(m) => m.mib,
        }
    }
}

impl fmt::Display for Headroom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Headroom::Percent(p) => write!(f, "{p}%"),
            Headroom::Fixed(m) => write!(f, "{m}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("headroom `{0}` is neither a percentage (`10%`, 0 to 90) nor a size (`2GiB`)")]
pub struct HeadroomError(String);

impl FromStr for Headroom {
    type Err = HeadroomError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(p) if (0.0..=90.0).contains(&p) => Ok(Headroom::Percent(p)),
                _ => Err(HeadroomError(s.to_string())),
            };
        }
        t.parse::<MemSize>()
            .map(Headroom::Fixed)
            .map_err(|_| HeadroomError(s.to_string()))
    }
}

/// In the OpenAPI document: the string form (`10%` or `2GiB`).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Headroom {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "GPU memory kept free: a percentage of the total (`10%`, 0 to 90) or a size (`2GiB`)",
            ))
            .examples([serde_json::json!("10%")])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Headroom {}

impl TryFrom<String> for Headroom {
    type Error = HeadroomError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Headroom> for String {
    fn from(h: Headroom) -> String {
        h.to_string()
    }
}

/// A GPU as the agent found it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total_mib: u64,
}

/// A process seen on a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuProcess {
    pub pid: u32,
    pub used_mib: u64,
    /// The attempt it belongs to, when it belongs to one.
    #[serde(default)]
    pub attempt: Option<AttemptId>,
    /// Owner and command line, filled for processes of no attempt (foreign: another user,
    /// a notebook, an orphan from before headroom) so people can see who holds the memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The driver cannot tell this process's memory (NVML `UsedGpuMemory::Unavailable`, e.g.
    /// under MIG or in some containers): `used_mib` is 0 and means nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub used_mib_unknown: bool,
    /// A process of another pid namespace (another container): `pid` is the driver's
    /// (host) pid, not one the agent can signal. Never the agent's, never killed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outside_pid_namespace: bool,
    /// Its share of the GPU's SM time over the driver's last sample period (NVML's
    /// per-process utilization), percent; `None` where the driver does not give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_util_pct: Option<u32>,
}

/// Live state of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuSample {
    pub index: u32,
    pub used_mib: u64,
    pub free_mib: u64,
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    #[serde(default)]
    pub power_mw: Option<u64>,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
    /// Set when part of this GPU's reading failed (memory or process list): what is missing
    /// is unknown, never "free" or "clean". Such a GPU is not placeable and an attempt on it
    /// cannot be verified clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl GpuSample {
    /// Used memory that no listed process accounts for ("ghost" memory: the driver's own
    /// reserve, a process the driver does not list, memory a dead process left behind);
    /// `None` when it cannot be told (the reading failed, or the driver cannot size a
    /// process's memory).
    pub fn unattributed_mib(&self) -> Option<u64> {
        if self.error.is_some() || self.processes.iter().any(|p| p.used_mib_unknown) {
            return None;
        }
        let listed = self
            .processes
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.used_mib));
        Some(self.used_mib.saturating_sub(listed))
    }
}

/// How much more unattributed memory than a GPU had before an attempt is still noise: the
/// larger of 256 MiB and 1 % of its memory.
pub fn ghost_tolerance_mib(total_mib: u64) -> u64 {
    (total_mib / 100).max(256)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    pub name: String,
    pub agent: Option<AgentId>,
    pub plan: String,
    pub headroom: Headroom,
    pub last_seen: Option<DateTime<Utc>>,
    pub alive: bool,
    pub gpus: Vec<GpuView>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total_mib: u64,
    pub used_mib: Option<u64>,
    pub free_mib: Option<u64>,
    pub slots: u32,
    pub slots_used: u32,
    /// Sum of the estimates of attempts placed here.
    pub estimated_mib: u64,
    pub headroom_mib: u64,
    pub attempts: Vec<AttemptId>,
    /// Processes on this GPU that belong to no attempt: counted in admission through live
    /// free memory, reported, never killed.
    #[serde(default)]
    pub foreign: Vec<GpuProcess>,
    /// Why nothing is placed here: attempts whose cleanup could not be verified.
    #[serde(default)]
    pub quarantine: Vec<QuarantineView>,
    /// The last reading of this GPU failed (in part): nothing is placed here until it reads
    /// again, and its memory figures are not to be trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Used memory no listed process accounts for, at the last reading ("ghost" memory: the
    /// driver's reserve, a process the driver does not list, memory left behind); `None`
    /// when it cannot be told.
    #[serde(default)]
    pub unattributed_mib: Option<u64>,
    /// A gap between what is placed here (`estimated_mib`) and what the GPU uses, as the
    /// coordinator last saw it: absent while they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftView>,
}

/// Which way a GPU's use drifts from what is placed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DriftDirection {
    /// It uses more than its attempts' estimates: one grew past its estimate, or memory no
    /// attempt accounts for (a foreign process, ghost memory). Jobs placed beside them risk
    /// OOM.
    Over,
    /// Its attempts' estimates hold more than it uses: memory reserved and idle, jobs
    /// waiting for room that is there.
    Under,
}

impl DriftDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftDirection::Over => "over",
            DriftDirection::Under => "under",
        }
    }
}

impl FromStr for DriftDirection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "over" => Ok(DriftDirection::Over),
            "under" => Ok(DriftDirection::Under),
            _ => Err(format!("unknown drift direction `{s}`")),
        }
    }
}

/// A gap between a GPU's ledger (the estimates placed on it) and its reading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DriftView {
    pub direction: DriftDirection,
    /// How far apart, MiB, at the last look.
    pub gap_mib: u64,
    /// Since when it has drifted this way.
    pub since: DateTime<Utc>,
    /// It has lasted past the coordinator's `--alert-drift-after` (counted in
    /// `headroom_gpus_drifting`, told as `gpu-drift`).
    pub lasting: bool,
}

/// A GPU held back because an attempt's cleanup could not be verified.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuarantineView {
    pub attempt: AttemptId,
    pub reason: String,
    pub since: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetPlanRequest {
    pub plan: String,
}

// ---- small answers and query strings ----------------------------------------------------

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    pub status: String,
    pub schema_version: i64,
}

/// The answer of calls that only acknowledge (start, hand-back).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Ack {
    pub ok: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogAppended {
    /// The log's length after the append.
    pub len: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryResponse {
    pub state: JobState,
    /// With `cascade`: the job and the jobs waiting for it (`after`) that run again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retried: Vec<JobId>,
}

/// `POST /v1/jobs/{id}/retry?cascade=true`: also the jobs of its study that wait for it
/// (and for those, on down) and have ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[serde(deny_unknown_fields)]
pub struct RetryQuery {
    #[serde(default)]
    pub cascade: bool,
}

/// `POST /v1/experiments/{id}/retry`: the failed jobs that run once more (none: nothing
/// had failed).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryFailedResponse {
    pub experiment: ExperimentId,
    pub retried: Vec<JobId>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Released {
    /// Quarantines lifted.
    pub released: u64,
}

/// `GET /v1/jobs` filters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct JobsQuery {
    /// Only this experiment's (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(value_type = Option<crate::ids::ExperimentId>))]
    pub experiment: Option<String>,
    /// Only jobs in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(value_type = Option<crate::state::JobState>))]
    pub state: Option<String>,
    /// At most this many jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Only jobs whose id starts with this (a short id, as git takes one: hex digits and
    /// dashes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_prefix: Option<String>,
    /// Only the job of this index in its experiment (with `experiment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

/// `GET /v1/progress`: with `after`, wait up to `timeout_ms` for the version to move past it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct ProgressQuery {
    /// Only this experiment's (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(value_type = Option<crate::ids::ExperimentId>))]
    pub experiment: Option<String>,
    /// A `version` seen before: wait until the counts change past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// How long to wait with `after` (ms; default 10000, capped by the server's long-poll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `GET /v1/attempts/{id}/log`: bytes from `offset`, waiting up to `wait_ms` for some.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct LogQuery {
    /// Where to start reading (the `x-log-offset` of the previous read).
    #[serde(default)]
    pub offset: u64,
    /// How long to wait for bytes when none are there yet (ms, capped by the server).
    #[serde(default)]
    pub wait_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_round_trip_and_unknown_ones_decode() {
        let body: ErrorBody =
            serde_json::from_str(r#"{"error": {"code": "stale_fence", "message": "m"}}"#)
                .expect("decodes");
        assert_eq!(body.error.code, ErrorCode::StaleFence);
        assert_eq!(
            serde_json::to_value(ErrorCode::StoreUnavailable).expect("encodes"),
            "store_unavailable"
        );
        assert_eq!(ErrorCode::StoreUnavailable.as_str(), "store_unavailable");
        let newer: ErrorBody = serde_json::from_str(
            r#"{"error": {"code": "rate_limited", "message": "m", "field": "x"}}"#,
        )
        .expect("a newer server's code still decodes");
        assert_eq!(newer.error.code, ErrorCode::Unknown);
    }
}

// ---- tokens and roles ------------------------------------------------------------------

/// Who a request acts as where the coordinator has no tokens (loopback only): an admin.
pub const ANONYMOUS: &str = "anonymous";

fn anonymous() -> String {
    ANONYMOUS.to_string()
}

/// What a token may do: `admin` (everything a user may, plus plans, quarantines and
/// tokens), `user` (read, submit, cancel and retry their own), `agent` (register, claim,
/// heartbeat and report).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    User,
    Agent,
    /// May only exchange itself, once per node, for that node's agent credential
    /// (`POST /v1/agents/join`): what a DaemonSet's agents share, as kubelets share a
    /// bootstrap token.
    Join,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Agent => "agent",
            Role::Join => "join",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            "agent" => Ok(Role::Agent),
            "join" => Ok(Role::Join),
            other => Err(format!(
                "`{other}` is not a role (admin, user, agent or join)"
            )),
        }
    }
}

/// `GET /v1/whoami`: the caller's token's name and role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WhoAmI {
    pub name: String,
    pub role: Role,
    /// The Unix user its jobs run as where agents run as root (`None`: the agents' default
    /// user): a client on the nodes' host checks its working directory against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_user: Option<String>,
}

/// The identity a request acts as: a token's name and role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// The id of the token it presented (`hr_<id>_...`); `None` for a token configured in
    /// the clear. What a join token may make is found by it.
    #[serde(skip)]
    pub token_id: Option<String>,
}

impl Principal {
    /// Where the coordinator has no tokens: everything is allowed, as before tokens existed.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.to_string(),
            role: Role::Admin,
            token_id: None,
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// Who holds it (`alice`, `gpu-node-3`): letters, digits, `_ - . @`.
    pub name: String,
    pub role: Role,
    /// How long it works (`90d`, `12h`); never expires when left out. The credentials a join
    /// token makes expire with it.
    #[serde(default)]
    pub expires_in: Option<String>,
    /// Role `join` only, and required there: the nodes it may make, as names or patterns
    /// (`gpu-*`: `*` any run of characters, `?` one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
}

/// A token the coordinator keeps (its secret is stored hashed and never shown again).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenView {
    /// The public part of the token (`hr_<id>_...`), for `token revoke`.
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// After this the token is refused (401); `None`: never.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// A join token's nodes: the names (`*` any run, `?` one character) it may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
}

/// A user: every token of this name is theirs; their role is the tokens' role; with
/// `unix_user`, their jobs run as that Unix user on nodes whose agent runs as root.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    pub name: String,
    pub role: Role,
    #[serde(default)]
    pub unix_user: Option<String>,
    /// Whether `unix_user` may be root (refused otherwise).
    #[serde(default)]
    pub allow_root: bool,
    /// What they may hold at once and their weight in fair share.
    #[serde(flatten)]
    pub limits: UserLimits,
    pub created_at: DateTime<Utc>,
}

/// Creates a user or changes one (`headroom user create`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutUserRequest {
    pub role: Role,
    #[serde(default)]
    pub unix_user: Option<String>,
    #[serde(default)]
    pub allow_root: bool,
    /// Weight in fair share (`--share`): a user of share 2 is due twice the GPU memory-time
    /// of a user of share 1. At least 1.
    #[serde(default = "usage::default_share")]
    pub share: u32,
    /// The most of their jobs leased or running at once.
    #[serde(default)]
    pub max_jobs: Option<u32>,
    /// The most GPUs their jobs hold at once.
    #[serde(default)]
    pub max_gpus: Option<u32>,
    /// The most GPU memory (MiB) their jobs reserve at once.
    #[serde(default)]
    pub max_gpu_mib: Option<u64>,
}

/// A join token asks for the agent credential of a node that has none yet.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub node: String,
}

/// A new token: `token` is the secret, shown this once.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

/// `GET /v1/experiments/{id}/metrics`: which metric, and how many points per series.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct MetricsQuery {
    /// Only this metric (every metric by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Most points per series, evenly spread with the first and the latest kept (default
    /// and most: 513, every point kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub points: Option<u32>,
}

/// One attempt's metric series, for learning curves (`GET /v1/experiments/{id}/metrics`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptSeries {
    pub attempt: AttemptId,
    pub job: JobId,
    /// The job's index in its experiment.
    pub index: u64,
    pub number: u32,
    /// The parameters it ran with.
    pub params: BTreeMap<String, Value>,
    /// Its job's state now.
    pub state: JobState,
    /// Still running: its series grows.
    pub live: bool,
    pub finals: BTreeMap<String, f64>,
    pub series: BTreeMap<String, Vec<crate::results::Point>>,
    pub ignored: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rungs: Vec<crate::results::RungDecision>,
}
