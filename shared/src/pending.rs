//! Pending reasons: why a waiting job is not running yet, as Slurm's pending reasons say
//! it, with the figures that decided it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::size::MemSize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum PendingReason {
    /// No agent has looked at it yet (it was just queued, or sits deep in the queue).
    NotConsidered,
    /// No node is alive to run it.
    NoLiveNode,
    /// Every GPU it could use has all its plan slots taken (or runs a job that runs alone).
    NoFreeSlot,
    /// A GPU has a free slot, but not the memory: `needed_mib` against the most that any
    /// GPU has left after placed estimates, live free memory and headroom.
    NotEnoughMemory { needed_mib: u64, available_mib: u64 },
    /// The node's host memory left for jobs (its usable memory less what its attempts hold)
    /// is less than the job holds (`resources.host_memory`, or learned from its runs).
    NotEnoughHostMemory { needed_mib: u64, available_mib: u64 },
    /// The GPUs that could take it are quarantined (cleanup not verified) or avoided for a
    /// while after a hand-back.
    GpuQuarantined,
    /// The GPUs it fits on are held for an older job that waited too long.
    BehindReservation,
    /// It asks for more GPUs than any live node has.
    TooManyGpus { wanted: u32, max: u32 },
    /// Its estimate exceeds every GPU's memory less headroom: it can never be placed.
    LargerThanEveryGpu { needed_mib: u64, largest_mib: u64 },
    /// Its experiment has `max_concurrent` (`limit`) jobs leased or running already.
    ConcurrencyCap { limit: u32, running: u32 },
    /// Its user holds `held` of the `limit` their cap allows (`headroom user create
    /// --max-jobs/--max-gpus/--max-gpu-memory`); memory in MiB.
    UserCap {
        user: String,
        cap: UserCapKind,
        limit: u64,
        held: u64,
    },
    /// Fair share: its user has used more GPU memory-time (decayed, per unit of share) than
    /// `ahead`, whose jobs wait too and go first. Usage in MiB-hours, to two significant
    /// figures.
    FairShare {
        user: String,
        used_mib_h: u64,
        share: u32,
        ahead: String,
        ahead_used_mib_h: u64,
        ahead_share: u32,
    },
    /// It waits (a study's `after`) for `jobs` jobs of `experiment` to end as `when` asks
    /// (`succeeded` or `ended`); `ended_otherwise` of them ended otherwise and wait for a
    /// retry.
    WaitsFor {
        experiment: String,
        jobs: u64,
        when: String,
        #[serde(default)]
        ended_otherwise: u64,
        /// The first job that ended otherwise: the one to retry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry: Option<String>,
    },
}

impl PendingReason {
    /// A short name for tables (`headroom ls`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotConsidered => "not_considered",
            Self::NoLiveNode => "no_live_node",
            Self::NoFreeSlot => "no_free_slot",
            Self::NotEnoughMemory { .. } => "not_enough_memory",
            Self::NotEnoughHostMemory { .. } => "not_enough_host_memory",
            Self::GpuQuarantined => "gpu_quarantined",
            Self::BehindReservation => "behind_reservation",
            Self::TooManyGpus { .. } => "too_many_gpus",
            Self::LargerThanEveryGpu { .. } => "larger_than_every_gpu",
            Self::WaitsFor { .. } => "waits_for",
            Self::ConcurrencyCap { .. } => "concurrency_cap",
            Self::UserCap { .. } => "user_cap",
            Self::FairShare { .. } => "fair_share",
        }
    }
}

/// Which of a user's caps: running jobs, GPUs, or GiB of GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum UserCapKind {
    Jobs,
    Gpus,
    GpuMemory,
}

impl fmt::Display for UserCapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Jobs => "jobs",
            Self::Gpus => "GPUs",
            Self::GpuMemory => "GPU memory",
        })
    }
}

/// MiB-hours as GiB-hours, one decimal.
fn gib_hours(mib_h: u64) -> String {
    format!("{:.1} GiB-h", mib_h as f64 / 1024.0)
}

fn mib(m: u64) -> MemSize {
    MemSize { mib: m }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotConsidered => f.write_str("waiting for an agent to consider it"),
            Self::NoLiveNode => f.write_str("no live node: start an agent"),
            Self::NoFreeSlot => f.write_str("no free slot on any GPU"),
            Self::NotEnoughMemory {
                needed_mib,
                available_mib,
            } => write!(
                f,
                "not enough memory: needs {}, at most {} available on a GPU",
                mib(*needed_mib),
                mib(*available_mib)
            ),
            Self::NotEnoughHostMemory {
                needed_mib,
                available_mib,
            } => write!(
                f,
                "not enough host memory: needs {}, the node has {} left for jobs",
                mib(*needed_mib),
                mib(*available_mib)
            ),
            Self::GpuQuarantined => f.write_str("the GPUs it fits on are quarantined"),
            Self::BehindReservation => f.write_str("waiting behind a reservation for an older job"),
            Self::TooManyGpus { wanted, max } => {
                write!(
                    f,
                    "asks for {wanted} GPUs, no live node has more than {max}"
                )
            }
            Self::LargerThanEveryGpu {
                needed_mib,
                largest_mib,
            } => write!(
                f,
                "larger than every GPU: needs {}, the largest GPU offers {} (less headroom)",
                mib(*needed_mib),
                mib(*largest_mib)
            ),
            Self::ConcurrencyCap { limit, running } => write!(
                f,
                "its experiment's max_concurrent: {running} of at most {limit} leased or running"
            ),
            Self::UserCap {
                user,
                cap,
                limit,
                held,
            } => match cap {
                UserCapKind::GpuMemory => write!(
                    f,
                    "{user}'s cap: holds {} of GPU memory, at most {}",
                    mib(*held),
                    mib(*limit)
                ),
                UserCapKind::Jobs => {
                    let s = if *held == 1 { "" } else { "s" };
                    write!(f, "{user}'s cap: holds {held} job{s}, at most {limit}")
                }
                UserCapKind::Gpus => {
                    let s = if *held == 1 { "" } else { "s" };
                    write!(f, "{user}'s cap: holds {held} GPU{s}, at most {limit}")
                }
            },
            Self::FairShare {
                user,
                used_mib_h,
                share,
                ahead,
                ahead_used_mib_h,
                ahead_share,
            } => write!(
                f,
                "fair share: {user} used {} (share {share}), {ahead} {} (share {ahead_share}) \
                 and goes first",
                gib_hours(*used_mib_h),
                gib_hours(*ahead_used_mib_h)
            ),
            Self::WaitsFor {
                experiment,
                jobs,
                when,
                ended_otherwise,
                retry,
            } => {
                let s = if *jobs == 1 { "" } else { "s" };
                let verb = if when == "ended" { "end" } else { "succeed" };
                write!(f, "waits for {jobs} job{s} of `{experiment}` to {verb}")?;
                if *ended_otherwise > 0 {
                    let job = retry.as_deref().unwrap_or("JOB");
                    write!(
                        f,
                        "; {ended_otherwise} ended otherwise: `headroom retry {job} --cascade` \
                         runs it and the jobs waiting for it again"
                    )?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_and_name_their_figures() {
        let r = PendingReason::LargerThanEveryGpu {
            needed_mib: 10 * 1024 * 1024 * 1024,
            largest_mib: 22_118,
        };
        let json = serde_json::to_string(&r).expect("json");
        assert!(json.contains("larger_than_every_gpu"), "{json}");
        assert_eq!(
            serde_json::from_str::<PendingReason>(&json).ok(),
            Some(r.clone())
        );
        assert!(r.to_string().contains("larger than every GPU"), "{r}");
    }
}
