//! The job state machine: the one place that decides which state follows which event.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a job stands. `queued -> leased -> running -> succeeded | failed | cancelled |
/// pruned`, with `retrying` between attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Leased,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Cancelled,
    /// Stopped by `early_stop`: behind the others at a rung. Not a failure, not retried.
    Pruned,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Leased,
        JobState::Running,
        JobState::Retrying,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Pruned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Pruned => "pruned",
        }
    }

    /// Waiting for a lease.
    pub fn is_pending(self) -> bool {
        matches!(self, JobState::Queued | JobState::Retrying)
    }

    /// Holding a lease on a node.
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Leased | JobState::Running)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Pruned
        )
    }

    /// The state after `event`, or an error when the event makes no sense in this state.
    pub fn on(self, event: JobEvent) -> Result<JobState, TransitionError> {
        use JobEvent as E;
        use JobState as S;
        let next = match (self, event) {
            (S::Queued | S::Retrying, E::Lease) => S::Leased,
            (S::Leased, E::Start) => S::Running,
            // A lease given back unused: the job waits again, no retry counted.
            (S::Leased, E::HandBack { had_attempts }) => {
                if had_attempts {
                    S::Retrying
                } else {
                    S::Queued
                }
            }
            (S::Leased | S::Running, E::Succeed) => S::Succeeded,
            (S::Leased | S::Running, E::Prune) => S::Pruned,
            (S::Leased | S::Running, E::Fail { retry: true }) => S::Retrying,
            (S::Leased | S::Running, E::Fail { retry: false }) => S::Failed,
            // The late end of an attempt recorded lost replaces the loss: the job, not leased
            // again since, takes the outcome the attempt really had.
            (
                S::Retrying | S::Failed,
                E::LateEnd {
                    succeeded: true, ..
                },
            ) => S::Succeeded,
            (S::Retrying | S::Failed, E::LateEnd { retry: true, .. }) => S::Retrying,
            (S::Retrying | S::Failed, E::LateEnd { retry: false, .. }) => S::Failed,
            (S::Retrying | S::Failed, E::Prune) => S::Pruned,
            // The attempt of a cancelled job still reports its end; the job stays cancelled.
            (
                S::Cancelled,
                E::Succeed | E::Fail { .. } | E::Prune | E::HandBack { .. } | E::LateEnd { .. },
            ) => S::Cancelled,
            (s, E::Cancel) if !s.is_terminal() => S::Cancelled,
            (S::Failed | S::Cancelled | S::Succeeded | S::Pruned, E::Retry) => S::Retrying,
            (state, event) => return Err(TransitionError { state, event }),
        };
        Ok(next)
    }
}

/// Something that happens to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEvent {
    /// An agent leased it.
    Lease,
    /// The agent launched its process.
    Start,
    /// The agent gave the lease back without launching.
    HandBack { had_attempts: bool },
    /// The attempt ended well.
    Succeed,
    /// The attempt failed (or was lost); `retry` when the policy allows another attempt.
    Fail { retry: bool },
    /// The attempt was stopped by `early_stop`.
    Prune,
    /// The end of an attempt already recorded lost arrived after all, and the job was not
    /// leased again: it replaces the loss. `succeeded`, else `retry` as for `Fail`.
    LateEnd { succeeded: bool, retry: bool },
    /// A user cancelled it.
    Cancel,
    /// A user asked for another attempt of an ended job.
    Retry,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a {state} job cannot take event {event:?}")]
pub struct TransitionError {
    pub state: JobState,
    pub event: JobEvent,
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown job state `{0}`")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// Why an attempt did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// CUDA out-of-memory text in the log.
    Oom,
    /// Ran past its `timeout`.
    Timeout,
    /// A user cancelled it.
    Cancelled,
    /// Its agent went away (crash, restart, lease expired).
    Lost,
    /// The process could not be started.
    LaunchError,
    /// Exited with a non-zero code.
    Nonzero,
    /// Killed by a signal it did not get from headroom.
    Signal,
    /// Its GPUs did not cool to `cooldown.until_temp_c` within `max_wait` (never started).
    CooldownTimeout,
    /// Exclusive: its GPUs still held a process when the wait for them to empty ran out
    /// (never started).
    GpuBusy,
    /// Its colocated background was not ready within `colocate.start_timeout` (or exited
    /// before it was): the foreground never started.
    BackgroundNotReady,
    /// Its colocated background exited while it ran, with `on_background_exit: fail`.
    BackgroundExited,
    /// Its GPU slowed its clocks for temperature or power while it ran, with
    /// `on_throttle: retry` or `fail` (its job's own end was a success).
    Throttled,
    /// Its working directory is missing on its node, or its user may not enter it (never
    /// started; not retried).
    Workdir,
    /// Its Python environment (`environment`) is missing on its node (never started; not
    /// retried).
    Environment,
    /// Killed by the kernel at its cgroup's memory limit (`resources.host_memory`, or what
    /// its runs taught): the node's host memory, not its GPU's.
    HostOom,
    /// Stopped by `early_stop` at a rung where its metric fell behind (not a failure of the
    /// job: it ends `pruned`, never retried).
    Pruned,
    /// Stopped for a user under their share, or a job of higher priority (`preemptible:
    /// true`), after its `checkpoint` signal: requeued without spending an attempt.
    Preempted,
    /// Stopped by `headroom cancel --requeue`, after its `checkpoint` signal: requeued
    /// without spending an attempt.
    Requeued,
}

impl FailureClass {
    pub const ALL: [FailureClass; 18] = [
        FailureClass::Oom,
        FailureClass::Timeout,
        FailureClass::Cancelled,
        FailureClass::Lost,
        FailureClass::LaunchError,
        FailureClass::Nonzero,
        FailureClass::Signal,
        FailureClass::CooldownTimeout,
        FailureClass::GpuBusy,
        FailureClass::BackgroundNotReady,
        FailureClass::BackgroundExited,
        FailureClass::Throttled,
        FailureClass::Workdir,
        FailureClass::Environment,
        FailureClass::HostOom,
        FailureClass::Pruned,
        FailureClass::Preempted,
        FailureClass::Requeued,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Oom => "oom",
            FailureClass::Timeout => "timeout",
            FailureClass::Cancelled => "cancelled",
            FailureClass::Lost => "lost",
            FailureClass::LaunchError => "launch_error",
            FailureClass::Nonzero => "nonzero",
            FailureClass::Signal => "signal",
            FailureClass::CooldownTimeout => "cooldown_timeout",
            FailureClass::GpuBusy => "gpu_busy",
            FailureClass::BackgroundNotReady => "background_not_ready",
            FailureClass::BackgroundExited => "background_exited",
            FailureClass::Throttled => "throttled",
            FailureClass::Workdir => "workdir",
            FailureClass::Environment => "environment",
            FailureClass::HostOom => "host_oom",
            FailureClass::Pruned => "pruned",
            FailureClass::Preempted => "preempted",
            FailureClass::Requeued => "requeued",
        }
    }

    /// Stopped by headroom to run again later: the job goes back to the queue and the
    /// attempt is not counted against its `max_attempts`.
    pub fn is_requeue(self) -> bool {
        matches!(self, FailureClass::Preempted | FailureClass::Requeued)
    }

    /// What the node could not set up for the job (its directory, its environment): the
    /// same job fails the same way there again.
    pub fn is_setup(self) -> bool {
        matches!(self, FailureClass::Workdir | FailureClass::Environment)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureClass {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_through_its_life() {
        let s = JobState::Queued;
        let s = s.on(JobEvent::Lease).expect("lease");
        let s = s.on(JobEvent::Start).expect("start");
        assert_eq!(s.on(JobEvent::Succeed), Ok(JobState::Succeeded));
        assert_eq!(s.on(JobEvent::Fail { retry: true }), Ok(JobState::Retrying));
        assert_eq!(s.on(JobEvent::Fail { retry: false }), Ok(JobState::Failed));
    }

    #[test]
    fn ended_jobs_stay_ended() {
        for s in [JobState::Succeeded, JobState::Failed] {
            assert!(s.on(JobEvent::Lease).is_err());
            assert!(s.on(JobEvent::Start).is_err());
            assert!(s.on(JobEvent::Cancel).is_err());
            assert!(s.on(JobEvent::Succeed).is_err());
        }
        // The late report of a cancelled job's attempt changes nothing.
        assert_eq!(
            JobState::Cancelled.on(JobEvent::Succeed),
            Ok(JobState::Cancelled)
        );
        assert_eq!(JobState::Failed.on(JobEvent::Retry), Ok(JobState::Retrying));
    }

    #[test]
    fn a_late_end_replaces_the_loss_of_a_job_not_leased_again() {
        let late = |succeeded, retry| JobEvent::LateEnd { succeeded, retry };
        for s in [JobState::Retrying, JobState::Failed] {
            assert_eq!(s.on(late(true, false)), Ok(JobState::Succeeded));
            assert_eq!(s.on(late(false, true)), Ok(JobState::Retrying));
            assert_eq!(s.on(late(false, false)), Ok(JobState::Failed));
        }
        assert_eq!(
            JobState::Cancelled.on(late(true, false)),
            Ok(JobState::Cancelled)
        );
        // Leased again, or ended by it already: no late end applies.
        for s in [JobState::Leased, JobState::Running, JobState::Succeeded] {
            assert!(s.on(late(true, false)).is_err());
        }
    }

    #[test]
    fn a_lease_cannot_be_taken_twice() {
        assert!(JobState::Leased.on(JobEvent::Lease).is_err());
        assert!(JobState::Running.on(JobEvent::Lease).is_err());
        assert_eq!(
            JobState::Leased.on(JobEvent::HandBack {
                had_attempts: false
            }),
            Ok(JobState::Queued)
        );
    }

    #[test]
    fn names_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().ok(), Some(s));
        }
        for c in FailureClass::ALL {
            assert_eq!(c.as_str().parse::<FailureClass>().ok(), Some(c));
        }
    }
}
