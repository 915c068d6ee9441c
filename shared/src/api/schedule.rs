//! A spec's schedule before it runs, as a dry run answers it: how many of its jobs run at
//! once on the live nodes, which never fit and why, and the expected makespan.

use serde::{Deserialize, Serialize};

/// Where a job's memory estimate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EstimateFrom {
    /// The spec's `resources.memory`.
    Declared,
    /// Peaks of earlier runs of its memory key.
    Learned,
    /// Nothing yet: it runs alone on a GPU.
    None,
}

/// One group's share of the preview.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupPreview {
    pub group: String,
    pub jobs: u32,
    /// Of `SchedulePreview::at_once`, this group's.
    pub at_once: u32,
    /// The group's largest estimate per GPU, and where the estimate of the job that has it
    /// comes from (`None` with `EstimateFrom::None` when no job of it has one).
    pub estimate_mib: Option<u64>,
    pub estimate_from: EstimateFrom,
    /// Jobs no node can ever take, even empty.
    pub never_fit: u32,
    /// Why, in words: each distinct reason once, in queue order.
    pub never_fit_reasons: Vec<String>,
    /// Where the plans' slots allow more of its jobs on a GPU than run there together
    /// (their estimates do not fit side by side, or they run alone), in words.
    pub cannot_share: Option<String>,
    /// Its jobs need no GPU: they take their nodes' CPU slots, and no estimate applies.
    #[serde(default)]
    pub cpu_only: bool,
}

/// What a spec would do on the cluster as it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulePreview {
    /// The plans' slots, all GPUs together.
    pub slots: u32,
    /// Jobs running at the same time on the empty cluster, placed greedily in queue order.
    pub at_once: u32,
    /// Jobs no node can ever take.
    pub never_fit: u32,
    /// By group, in order of first appearance.
    pub groups: Vec<GroupPreview>,
    /// The simulated makespan of the jobs that can run, when each one's duration is known.
    pub makespan_s: Option<f64>,
    /// Jobs that can run whose duration is not known (no makespan while any is).
    pub unknown_durations: u32,
    /// More jobs than a dry run simulates: no makespan.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub too_many_to_simulate: bool,
}
