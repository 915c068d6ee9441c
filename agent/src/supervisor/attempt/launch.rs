//! What an attempt is given (`Launch`, `SupervisorConfig`) and what it gives back
//! (`AttemptEnd`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::api::{BackgroundReport, GpuSample, Measurements, PeakSource};
use headroom_shared::prestart::Prestart;
use headroom_shared::{AttemptId, FailureClass, JobId};

use super::watch::Baseline;
use crate::supervisor::classify::{self, EndFacts, Unstarted};

/// Everything needed to run one attempt (sent to the attempt's supervisor process as JSON).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    pub attempt: AttemptId,
    pub job: JobId,
    /// Run directly, without a shell.
    pub argv: Vec<String>,
    /// What the job starts from instead of the supervisor's environment: the agent's
    /// pass-through variables ([`crate::jobenv`]); nothing else is inherited.
    #[serde(default)]
    pub base_env: BTreeMap<String, String>,
    /// Profile and job variables, already merged.
    pub env: BTreeMap<String, String>,
    /// Passed as `HP_<NAME>` variables.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Physical GPU indices, passed as `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    pub timeout: Option<Duration>,
    /// stdout and stderr are appended here; parent directories are created.
    pub log_path: PathBuf,
    /// Where the job runs (its user's home when `None`), entered as its user.
    pub workdir: Option<PathBuf>,
    /// The Python environment activated for it (`environment`).
    #[serde(default)]
    pub environment: Option<headroom_shared::api::source::Environment>,
    /// What was on the GPUs just before, from a reading the caller made anyway (the agent's
    /// admission), so that the job's start does not wait for another; `None`: read here.
    #[serde(default)]
    pub baseline: Option<Baseline>,
    /// What the attempt waits for before the job starts ([`crate::supervisor::prestart`]); exclusive
    /// attempts count any other process on their GPUs as contamination.
    #[serde(default)]
    pub prestart: Prestart,
    /// A colocated background to start first and wait for (`colocate`).
    #[serde(default)]
    pub background: Option<headroom_shared::colocate::Background>,
    /// The Unix user the job runs as (its processes, its log); `None`: the supervisor's own
    /// (an agent not running as root).
    #[serde(default)]
    pub run_as: Option<headroom_shared::api::RunAs>,
    /// What its output is read for (`metrics`, `early_stop`'s rungs).
    #[serde(default)]
    pub results: Option<headroom_shared::results::ResultsSpec>,
    /// Its cgroup's memory limit (MiB), where attempts have cgroups.
    #[serde(default)]
    pub host_memory_mib: Option<u64>,
    /// What it is told of its job's restarts, and the signal it gets before a stop that
    /// requeues it or its timeout.
    #[serde(default)]
    pub restart: Restart,
    /// The hard GPU memory limit to hold its processes to (MiB on each of its GPUs), where
    /// the backend can set one (`memory_cap`).
    #[serde(default)]
    pub memory_cap_mib: Option<u64>,
}

/// An attempt's part in its job's restarts.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Restart {
    /// The signal sent `lead` before a requeueing stop or the timeout (`checkpoint`).
    #[serde(default)]
    pub checkpoint: Option<headroom_shared::checkpoint::Checkpoint>,
    /// `HEADROOM_JOB_DIR`: the job's own directory, the same for each of its attempts here.
    #[serde(default)]
    pub job_dir: Option<PathBuf>,
    /// `HEADROOM_RESTART_COUNT`: the job's attempts before this one.
    #[serde(default)]
    pub count: u32,
    /// `HEADROOM_STOP_REASON`: how the previous attempt ended (`preempted`, `timeout`, ...).
    #[serde(default)]
    pub previous_end: Option<headroom_shared::FailureClass>,
}

#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Longest wait, after SIGKILL, for the attempt's processes to leave its GPUs.
    pub verify_timeout: Duration,
    /// Interval of GPU memory sampling (peak memory) and of log scanning.
    pub sample_every: Duration,
    /// Longest wait for a job's start reading (the GPU backend opening) before its exec.
    pub start_reading_wait: Duration,
    /// This process is the child subreaper of the attempt's whole tree (the attempt's own
    /// supervisor process): its processes are found among this process's descendants, a
    /// walk over the tree, instead of by reading every process's environment for the marker.
    pub own_tree: bool,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            kill_grace: Duration::from_secs(10),
            verify_timeout: Duration::from_secs(30),
            sample_every: Duration::from_secs(1),
            start_reading_wait: Duration::from_secs(20),
            own_tree: false,
        }
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptEnd {
    /// What its class is decided from ([`AttemptEnd::failure`]).
    pub facts: EndFacts,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// `None` when the process never started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the main process exited, or when headroom decided to stop it.
    pub ended_at: DateTime<Utc>,
    pub pid: Option<u32>,
    /// Highest GPU memory seen at once over the attempt's processes; `None` when none of its
    /// processes was ever seen on a GPU, or their memory could not be told at all.
    pub peak_mem_mib: Option<u64>,
    /// How `peak_mem_mib` was measured: per process, or (when the driver gives no
    /// per-process memory) as the growth of the GPUs' used memory since the attempt began.
    pub peak_source: PeakSource,
    /// From the end of the main process (or the decision to stop it) until verified clean.
    pub cleanup_ms: u64,
    /// No process of the attempt is alive and none remains on a GPU, and no process that
    /// was not there before the attempt holds memory on its GPUs.
    pub cleanup_verified: bool,
    /// When not verified: what is left (pid, user, command, memory).
    pub unverified: Option<String>,
    /// The pids still holding memory when verification gave up; the GPUs are clean again
    /// once none of them is on them.
    pub held_by: Vec<u32>,
    /// The GPUs as the verified cleanup last read them (nothing of the attempt left): what
    /// the end reports, read once; `None` when not verified or never started (read anew).
    pub gpus_after: Option<Vec<GpuSample>>,
    /// GPUs whose unattributed memory stayed above these limits (MiB) after the attempt's
    /// processes were gone: clean again once it is at or below them.
    pub ghost_limits: Vec<(u32, u64)>,
    /// A process of no attempt used the attempt's GPUs while it ran.
    pub contaminated: bool,
    /// Energy, power, temperature, utilization and throttling of its GPUs over the run, and
    /// the first process that contaminated it.
    pub measurements: Measurements,
    /// The last ~4 KiB of this attempt's log.
    pub log_tail: String,
    /// What became of the colocated background, when the attempt had one.
    pub background: Option<BackgroundReport>,
    /// What the run reported of itself (`metrics`, `HEADROOM_METRIC` lines).
    pub metrics: Option<headroom_shared::results::AttemptMetrics>,
    /// The hard GPU memory limit its processes ran under (MiB on each GPU), if one was set.
    pub memory_cap_mib: Option<u64>,
}

impl AttemptEnd {
    /// Its failure class as the attempt alone tells it (`None`: success); the supervisor
    /// adds why it cancelled ([`crate::supervisor::report`]).
    pub fn failure(&self) -> Option<FailureClass> {
        classify::decide(&self.facts)
    }
}

/// The end of an attempt whose job never started, for `why`.
pub(crate) fn not_started(why: Unstarted, log_tail: String) -> AttemptEnd {
    AttemptEnd {
        facts: EndFacts::not_started(why),
        exit_code: None,
        signal: None,
        started_at: None,
        ended_at: Utc::now(),
        pid: None,
        peak_mem_mib: None,
        peak_source: PeakSource::Processes,
        cleanup_ms: 0,
        cleanup_verified: true,
        unverified: None,
        held_by: vec![],
        gpus_after: None,
        ghost_limits: vec![],
        contaminated: false,
        measurements: Measurements::default(),
        log_tail,
        background: None,
        metrics: None,
        memory_cap_mib: None,
    }
}

/// Why one of the attempt's processes did not start: the attempt's end then, and what its
/// log says.
#[derive(Debug)]
pub(crate) struct NotStarted {
    pub why: Unstarted,
    pub message: String,
}

impl NotStarted {
    pub fn new(why: Unstarted, message: String) -> Self {
        Self { why, message }
    }
}

impl From<String> for NotStarted {
    fn from(message: String) -> Self {
        Self::new(Unstarted::LaunchFailed, message)
    }
}
