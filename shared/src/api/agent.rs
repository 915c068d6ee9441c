//! The agent protocol: registration, claims and leases, heartbeats with telemetry, and the
//! reports of an attempt's start and end.

use super::*;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisterRequest {
    pub node: String,
    pub gpus: Vec<GpuInfo>,
    /// Applied when given; otherwise the node keeps its stored plan (default one per GPU).
    #[serde(default)]
    pub plan: Option<String>,
    #[serde(default)]
    pub headroom: Option<Headroom>,
    pub version: String,
    /// Attempts this agent is still running from an earlier registration (after a
    /// coordinator restart or a partition): they stay its own if their tokens are current.
    #[serde(default)]
    pub running: Vec<AttemptRef>,
    /// The agent id this agent instance (its data directory) registered with last: a node
    /// whose agent is alive is registered again only by that same instance.
    #[serde(default)]
    pub previous: Option<AgentId>,
    /// The node's host memory usable by jobs (its total less the agent's host headroom), in
    /// MiB: jobs are admitted against it. `None`: the node does not admit by host memory.
    #[serde(default)]
    pub host_memory_mib: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisterResponse {
    pub agent: AgentId,
    pub lease_ttl_ms: u64,
    pub plan: String,
    /// Attempts of this node that this registration does not keep, now recorded as lost:
    /// stop them.
    pub lost_attempts: Vec<AttemptId>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimRequest {
    /// Live memory per GPU, read just before the request.
    pub gpus: Vec<GpuSample>,
    /// Most leases to hand out.
    pub max: u32,
    /// Running attempts the agent wants to hear cancellations for.
    #[serde(default)]
    pub watching: Vec<AttemptId>,
    /// The plan the agent knows; a different one answers at once.
    #[serde(default)]
    pub known_plan: Option<String>,
    /// Long-poll: how long to wait for work (ms).
    #[serde(default)]
    pub wait_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimResponse {
    pub leases: Vec<Lease>,
    pub cancel: Vec<AttemptId>,
    /// Of the attempts watched, those to stop (after their `checkpoint` signal) and run
    /// again later.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeue: Vec<RequeueOrder>,
    pub plan: String,
}

/// An attempt to stop and requeue, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequeueOrder {
    pub attempt: AttemptId,
    pub why: crate::checkpoint::Requeue,
}

/// A job leased to an agent: everything needed to run it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lease {
    pub attempt: AttemptId,
    pub job: JobId,
    pub fence: i64,
    pub number: u32,
    pub experiment: String,
    pub argv: Vec<String>,
    /// Profile and job variables, merged (job wins).
    pub env: BTreeMap<String, String>,
    pub params: BTreeMap<String, Value>,
    pub gpus: Vec<u32>,
    pub estimate_mib: Option<u64>,
    pub timeout_ms: Option<u64>,
    /// What the attempt waits for before its job starts (`exclusive`, `cooldown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prestart: Option<Prestart>,
    /// The colocated background to start first (`colocate`); `estimate_mib` includes its
    /// memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<crate::colocate::Background>,
    /// The Unix user the submitter maps to: the job runs as it where the agent runs as root
    /// (the agent's default user when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<RunAs>,
    /// Where the job runs from: its working directory, code bundle and environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<super::source::Source>,
    /// What the run's output is read for (`metrics`, `metric_step`) and the rungs it reports
    /// (`early_stop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<crate::results::ResultsSpec>,
    /// The attempt's own credential: with it, and for this attempt only, its supervisor
    /// renews the lease and reports the outcome itself while its agent is away. Never
    /// handed to the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub report_key: Option<AttemptKey>,
    /// Host memory the attempt is admitted with (MiB): where cgroups allow, its cgroup's
    /// memory limit, past which the kernel kills it (`host_oom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_mib: Option<u64>,
    /// The signal the job gets before a requeueing stop or its timeout (`checkpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::Checkpoint>,
    /// How the job's previous attempt ended (`HEADROOM_STOP_REASON`): `preempted`,
    /// `requeued`, `timeout`, ...; none for its first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_end: Option<crate::FailureClass>,
    /// `memory_cap: off`: no hard GPU memory limit, even where the node can set one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_cap_off: bool,
    /// What the run holds as it starts (MiB per GPU) when it declared memory phases: its
    /// peak (`estimate_mib`) comes later, placed apart from its neighbours' peaks, so
    /// admission checks free memory against this. `None`: against `estimate_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_with_mib: Option<u64>,
}

/// Why an attempt ran out of GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// It passed its own hard limit (`memory_cap`), or grew past its own estimate.
    CapHit,
    /// It stayed within its own estimate while a neighbour on its GPU grew past theirs
    /// (`oom_neighbour` names the neighbour's attempt): its retry spends no attempt and its
    /// memory key learns nothing from it.
    NeighbourGrew,
}

impl OomCause {
    pub fn as_str(self) -> &'static str {
        match self {
            OomCause::CapHit => "cap_hit",
            OomCause::NeighbourGrew => "neighbour_grew",
        }
    }
}

impl std::str::FromStr for OomCause {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cap_hit" => Ok(OomCause::CapHit),
            "neighbour_grew" => Ok(OomCause::NeighbourGrew),
            _ => Err(format!("unknown OOM cause `{s}`")),
        }
    }
}

/// An attempt's key, as it travels (a plain string); `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptKey(pub String);

impl std::fmt::Debug for AttemptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptKey(<redacted>)")
    }
}

/// A supervisor renewing its attempt's lease itself (its agent is away).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LeaseRenewal {
    pub fence: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseRenewed {
    /// The lease now lasts this long from when the coordinator received the renewal.
    pub ttl_ms: u64,
    /// A user cancelled the job: stop it.
    pub cancel: bool,
    /// Stop it (after its `checkpoint` signal) and run it again later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<crate::checkpoint::Requeue>,
}

/// Who a job runs as on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunAs {
    pub unix_user: String,
    /// The admin allowed this user's jobs to run as root.
    #[serde(default)]
    pub allow_root: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptRef {
    pub attempt: AttemptId,
    pub fence: i64,
    /// Why the attempt's job has not started yet (`cooling: 52 °C → 40 °C`), while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatRequest {
    pub gpus: Vec<GpuSample>,
    pub attempts: Vec<AttemptRef>,
    /// Ended attempts whose leftovers are now gone: lift their GPUs' quarantine.
    #[serde(default)]
    pub released: Vec<AttemptId>,
    /// GPU telemetry sampled since the last answered heartbeat (oldest first), stored by the
    /// coordinator as each GPU's series.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telemetry: Vec<TelemetrySample>,
    /// Samples the agent dropped (oldest first) because its buffer was full while the
    /// coordinator could not be reached, since it started.
    #[serde(default)]
    pub telemetry_dropped: u64,
}

/// One GPU's reading at one instant, as the agent's sampler takes it (default once a
/// second). A reading the GPU does not support, or that failed, is absent (`null`), never 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TelemetrySample {
    pub gpu: u32,
    pub at: DateTime<Utc>,
    #[serde(default)]
    pub used_mib: Option<u64>,
    #[serde(default)]
    pub free_mib: Option<u64>,
    #[serde(default)]
    pub total_mib: Option<u64>,
    /// GPU (SM) utilization over the driver's last sample period, 0-100.
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    /// Board power draw.
    #[serde(default)]
    pub power_w: Option<f64>,
    /// The GPU's total-energy counter (NVML: since the driver was loaded; Volta and newer):
    /// an attempt's energy is the difference of two readings.
    #[serde(default)]
    pub energy_j: Option<f64>,
    #[serde(default)]
    pub temperature_c: Option<f64>,
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    /// Why clocks are held down now (NVML clock event reasons), e.g. `sw_thermal_slowdown`,
    /// `sw_power_cap`; empty: none; absent: not available.
    #[serde(default)]
    pub throttle: Option<Vec<String>>,
    /// What could not be read, when something that should be could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/nodes/{name}/gpus/{gpu}/telemetry`: a time window of one GPU's series.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct TelemetryQuery {
    /// RFC 3339; default: the last hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// RFC 3339; default: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    /// Most samples, the newest kept (default and cap 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One GPU's stored samples, oldest first.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuSeries {
    pub node: String,
    pub gpu: u32,
    pub samples: Vec<TelemetrySample>,
}

/// `GET /v1/attempts/{id}/telemetry`: the attempt's GPUs over its run (start to end, or to
/// now while it runs). Empty series before it started.
/// `GET /v1/attempts/{id}/telemetry`'s query string.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct AttemptTelemetryQuery {
    /// Most samples per GPU, the newest kept (default 10,000; at most 100,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptTelemetry {
    pub attempt: AttemptId,
    pub node: String,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub gpus: Vec<GpuSeries>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    pub cancel: Vec<AttemptId>,
    /// Attempts to stop (after their `checkpoint` signal) and run again later.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeue: Vec<RequeueOrder>,
    /// Always empty now: a heartbeat naming an attempt whose lease was lost or reassigned
    /// is refused whole with 409 `stale_fence` naming the attempt. Kept for older agents.
    #[serde(default)]
    pub stale: Vec<AttemptId>,
    pub plan: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StartReport {
    pub fence: i64,
    pub pid: u32,
    pub started_at: DateTime<Utc>,
}

/// A job's start as its end's report carries it: an attempt that ends before its start was
/// reported is started and ended by one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobStarted {
    pub pid: u32,
    pub started_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FinishReport {
    pub fence: i64,
    /// `None` means success.
    pub failure: Option<FailureClass>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_at: DateTime<Utc>,
    pub peak_mem_mib: Option<u64>,
    /// How `peak_mem_mib` was measured; absent means per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_source: Option<PeakSource>,
    pub cleanup_ms: u64,
    pub cleanup_verified: bool,
    /// What is left when cleanup could not be verified (pids, commands, memory): the
    /// attempt's GPUs stay quarantined until it is gone or a person releases them.
    #[serde(default)]
    pub unverified: Option<String>,
    #[serde(default)]
    pub contaminated: bool,
    /// What the supervisor measured over the run (absent from older supervisors' reports).
    #[serde(flatten)]
    pub measurements: Measurements,
    pub log_tail: String,
    /// GPU memory after cleanup, so the next placement sees the freed memory at once.
    pub gpus: Vec<GpuSample>,
    /// What the wait before the job's start was (`exclusive`, `cooldown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prestart: Option<PrestartReport>,
    /// What became of the attempt's colocated background, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<BackgroundReport>,
    /// Highest host RAM the attempt's processes used together (MiB), from its cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_peak_mib: Option<u64>,
    /// The job's start, when it started: recorded with the end where no start report was
    /// taken before it (a repeated start changes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<JobStarted>,
    /// What the run reported of itself (`metrics`, `HEADROOM_METRIC` lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<crate::results::AttemptMetrics>,
    /// The hard GPU memory limit the attempt ran under (MiB on each of its GPUs), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap_mib: Option<u64>,
    /// Why it ran out of GPU memory, when it did and that is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_cause: Option<OomCause>,
}

/// A running attempt's metrics so far, from its supervisor (replaces what was sent before).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetricsReport {
    pub fence: i64,
    pub metrics: crate::results::AttemptMetrics,
}

/// The answer to a metrics report: whether `early_stop` stops the attempt.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetricsAnswer {
    /// The rung where it fell behind: stop it, its end is `pruned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<crate::results::RungDecision>,
}

/// A colocated background's record in a finish report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackgroundReport {
    /// `None` when it could not be started.
    pub pid: Option<u32>,
    /// From its start until it was ready (the foreground's wait); `None`: never ready.
    pub ready_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// It exited by itself while its foreground still ran (or before it was ready), rather
    /// than being stopped when the foreground ended.
    pub exited_early: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FinishResponse {
    pub job_state: JobState,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HandBackRequest {
    pub fence: i64,
    pub reason: String,
    pub gpus: Vec<GpuSample>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams), into_params(parameter_in = Query))]
pub struct LogChunkQuery {
    pub fence: i64,
    pub offset: u64,
}
