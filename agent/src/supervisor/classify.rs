//! Decides an attempt's failure class, in one place: [`decide`] weighs the facts its
//! supervisor recorded ([`EndFacts`]: how its job ended or why it never started, what
//! headroom did to stop it and why, OOM text in its log). Pure; everything else only records
//! facts.
//!
//! `throttled` is not decided here: `on_throttle` is the coordinator's policy, applied there
//! to the throttle flags the end reports (`coordinator::rules::apply_on_throttle`).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use headroom_shared::FailureClass;
use serde::{Deserialize, Serialize};

/// Why the agent stopped an attempt before it ended by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A user cancelled the job.
    User,
    /// The lease could not be renewed in time: the coordinator may give the job to another
    /// node, so this one must not keep running it.
    LeaseLost,
    /// The agent is shutting down (SIGTERM, SIGINT).
    Shutdown,
    /// `early_stop`: its metric fell behind at a rung.
    Pruned,
    /// To run again later (a preemption, `cancel --requeue`), after its checkpoint signal.
    Requeue(headroom_shared::checkpoint::Requeue),
}

/// How an attempt's job (its foreground process) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// It ran, but its exit status was lost (waiting for it failed, or it could not be killed
    /// in time).
    StatusLost,
    /// It never started, for this reason.
    NotStarted(Unstarted),
    /// Nobody saw it end: its supervisor died without journalling an outcome.
    Unseen,
}

impl Ended {
    /// The end of a process that ran, from its exit status (`None`: lost).
    pub fn of(status: Option<ExitStatus>) -> Self {
        match status.map(|s| (s.code(), s.signal())) {
            Some((Some(code), _)) => Ended::Code(code),
            Some((None, Some(sig))) => Ended::Signal(sig),
            Some((None, None)) | None => Ended::StatusLost,
        }
    }
}

/// Why an attempt's job never started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unstarted {
    /// Its log, its process, its colocated background or its supervisor could not be started.
    LaunchFailed,
    /// A stop came first (a cancel, see [`EndFacts::stop`]).
    Stopped,
    /// Exclusive: its GPUs still held a process when the wait for them to empty ran out.
    GpusBusy,
    /// Its GPUs did not cool within `max_wait`, with `on_timeout: fail`.
    CooldownTimedOut,
    /// Its colocated background exited, or was not ready within `colocate.start_timeout`.
    BackgroundNotReady,
    /// Its working directory is missing here, or its user may not enter it.
    Workdir,
    /// Its Python environment (`environment`) is missing here.
    Environment,
}

/// What headroom did to end the run: the first such stop. What the job did after it (exit
/// non-zero on SIGTERM, die by SIGKILL) is its reaction, not its failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Its cancel token fired: a user's cancel, the lease lost (the agent's stop or the
    /// supervisor's own fence), the agent's shutdown. Why: [`EndFacts::cancel_reason`].
    Cancel,
    /// It ran past its `timeout`.
    Timeout,
    /// Its colocated background exited while it ran, with `on_background_exit: fail`.
    BackgroundExited,
}

/// Everything the class of an attempt's end is decided from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndFacts {
    pub ended: Ended,
    pub stop: Option<Stopped>,
    /// Why the supervisor cancelled, once it says ([`EndFacts::told`]); `None` while only the
    /// attempt knows of the cancel, which is then the user's.
    pub cancel_reason: Option<StopReason>,
    /// CUDA out-of-memory text was found in the attempt's log.
    pub saw_oom: bool,
}

impl EndFacts {
    /// A job that ran and ended as `ended`, stopped by headroom as `stop` (if it was).
    pub fn ran(ended: Ended, stop: Option<Stopped>, saw_oom: bool) -> Self {
        Self {
            ended,
            stop,
            cancel_reason: None,
            saw_oom,
        }
    }

    /// A job that never started, for `why`.
    pub fn not_started(why: Unstarted) -> Self {
        Self {
            ended: Ended::NotStarted(why),
            stop: (why == Unstarted::Stopped).then_some(Stopped::Cancel),
            cancel_reason: None,
            saw_oom: false,
        }
    }

    /// An attempt whose end nobody saw (its supervisor died without an outcome).
    pub fn unseen() -> Self {
        Self {
            ended: Ended::Unseen,
            stop: None,
            cancel_reason: None,
            saw_oom: false,
        }
    }

    /// With the supervisor's account of a cancel: why it asked for the stop. A cancel it has
    /// no reason for is taken as the agent's shutdown.
    pub fn told(self, reason: Option<StopReason>) -> Self {
        Self {
            cancel_reason: match self.stop {
                Some(Stopped::Cancel) => Some(reason.unwrap_or(StopReason::Shutdown)),
                _ => self.cancel_reason,
            },
            ..self
        }
    }
}

/// The failure class of an attempt's end, `None` for success.
///
/// Precedence: an end nobody saw is `lost`, and a job that could not start for a reason of
/// its own (launch, busy GPUs, cooldown, background) has that reason's class; then what
/// headroom did to the job (a cancel: `cancelled`, or `lost` when the lease was lost or the
/// agent shut down; a timeout; the background's exit) wins over how the job reacted to being
/// stopped; then OOM text explains a non-zero exit or a signal (e.g. `SIGABRT` after a CUDA
/// error). OOM text in a job that still exited 0 (it recovered, e.g. by retrying with a
/// smaller batch) is a success.
pub fn decide(f: &EndFacts) -> Option<FailureClass> {
    use FailureClass as F;
    match f.ended {
        Ended::Unseen => return Some(F::Lost),
        Ended::NotStarted(Unstarted::LaunchFailed) => return Some(F::LaunchError),
        Ended::NotStarted(Unstarted::GpusBusy) => return Some(F::GpuBusy),
        Ended::NotStarted(Unstarted::CooldownTimedOut) => return Some(F::CooldownTimeout),
        Ended::NotStarted(Unstarted::BackgroundNotReady) => return Some(F::BackgroundNotReady),
        Ended::NotStarted(Unstarted::Workdir) => return Some(F::Workdir),
        Ended::NotStarted(Unstarted::Environment) => return Some(F::Environment),
        Ended::NotStarted(Unstarted::Stopped)
        | Ended::Code(_)
        | Ended::Signal(_)
        | Ended::StatusLost => {}
    }
    match f.stop {
        Some(Stopped::Cancel) => {
            return Some(match f.cancel_reason {
                None | Some(StopReason::User) => F::Cancelled,
                Some(StopReason::Pruned) => F::Pruned,
                Some(StopReason::Requeue(why)) => why.class(),
                // Retried as the job's policy says for `lost`, now rather than at lease expiry.
                Some(StopReason::LeaseLost | StopReason::Shutdown) => F::Lost,
            });
        }
        Some(Stopped::Timeout) => return Some(F::Timeout),
        Some(Stopped::BackgroundExited) => return Some(F::BackgroundExited),
        None => {}
    }
    match f.ended {
        Ended::Code(0) => None,
        // Stopped before it started, with no stop on record: still headroom's doing.
        Ended::NotStarted(_) => Some(F::Cancelled),
        _ if f.saw_oom => Some(F::Oom),
        Ended::Signal(_) => Some(F::Signal),
        // A lost exit status is no success.
        Ended::Code(_) | Ended::StatusLost | Ended::Unseen => Some(F::Nonzero),
    }
}

/// Why headroom stopped a job whose cancel made its end `lost`, for its log tail.
pub fn lost_note(f: &EndFacts) -> Option<&'static str> {
    if f.stop != Some(Stopped::Cancel) || decide(f) != Some(FailureClass::Lost) {
        return None;
    }
    match f.cancel_reason {
        Some(StopReason::LeaseLost) => Some("stopped: the lease could not be renewed in time"),
        _ => Some("stopped because the agent shut down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureClass as F;
    use headroom_shared::checkpoint::Requeue;
    use proptest::prelude::*;

    fn ran(ended: Ended, stop: Option<Stopped>, oom: bool) -> Option<F> {
        decide(&EndFacts::ran(ended, stop, oom))
    }

    #[test]
    fn how_the_job_ended_alone() {
        let (code, sig) = (Ended::Code, Ended::Signal);
        // (ended, saw_oom) -> class, with no stop by headroom.
        let table: &[(Ended, bool, Option<F>)] = &[
            (code(0), false, None),
            (code(1), false, Some(F::Nonzero)),
            (code(-1), false, Some(F::Nonzero)),
            (sig(9), false, Some(F::Signal)),
            (Ended::StatusLost, false, Some(F::Nonzero)),
            // OOM text explains a failure, but not a success.
            (code(0), true, None),
            (code(2), true, Some(F::Oom)),
            (sig(6), true, Some(F::Oom)),
            (Ended::StatusLost, true, Some(F::Oom)),
        ];
        for &(ended, oom, want) in table {
            assert_eq!(ran(ended, None, oom), want, "{ended:?} oom={oom}");
        }
    }

    #[test]
    fn a_stop_by_headroom_wins_over_how_the_job_reacted() {
        for ended in [
            Ended::Code(0),
            Ended::Code(143),
            Ended::Signal(9),
            Ended::Signal(15),
            Ended::StatusLost,
        ] {
            for oom in [false, true] {
                let at = format!("{ended:?} oom={oom}");
                // A timeout whose process died by SIGKILL (or exited 0 on SIGTERM) is a timeout.
                assert_eq!(
                    ran(ended, Some(Stopped::Timeout), oom),
                    Some(F::Timeout),
                    "{at}"
                );
                // A cancel that also saw OOM text is a cancel.
                assert_eq!(
                    ran(ended, Some(Stopped::Cancel), oom),
                    Some(F::Cancelled),
                    "{at}"
                );
                assert_eq!(
                    ran(ended, Some(Stopped::BackgroundExited), oom),
                    Some(F::BackgroundExited),
                    "{at}"
                );
            }
        }
    }

    #[test]
    fn a_cancel_is_classed_by_why_the_supervisor_asked() {
        let cancelled = EndFacts::ran(Ended::Signal(15), Some(Stopped::Cancel), true);
        assert_eq!(decide(&cancelled), Some(F::Cancelled), "the attempt alone");
        for (reason, want) in [
            (Some(StopReason::User), F::Cancelled),
            (Some(StopReason::Pruned), F::Pruned),
            (Some(StopReason::Requeue(Requeue::Preempted)), F::Preempted),
            (Some(StopReason::Requeue(Requeue::Requeued)), F::Requeued),
            (Some(StopReason::LeaseLost), F::Lost),
            (Some(StopReason::Shutdown), F::Lost),
            // A cancel the supervisor has no reason for: the agent's shutdown.
            (None, F::Lost),
        ] {
            let told = cancelled.told(reason);
            assert_eq!(decide(&told), Some(want), "{reason:?}");
            assert_eq!(
                lost_note(&told).is_some(),
                want == F::Lost,
                "a lost end says why: {reason:?}"
            );
        }
        assert_eq!(
            lost_note(&cancelled.told(Some(StopReason::LeaseLost))),
            Some("stopped: the lease could not be renewed in time")
        );
        assert_eq!(
            lost_note(&cancelled.told(None)),
            Some("stopped because the agent shut down")
        );
        // Before the start, too.
        let unstarted = EndFacts::not_started(Unstarted::Stopped);
        assert_eq!(decide(&unstarted), Some(F::Cancelled));
        assert_eq!(
            decide(&unstarted.told(Some(StopReason::LeaseLost))),
            Some(F::Lost)
        );
    }

    #[test]
    fn a_reason_for_a_stop_that_was_no_cancel_changes_nothing() {
        // The agent's stop came after the job had ended by itself, or timed out.
        for reason in [None, Some(StopReason::LeaseLost), Some(StopReason::User)] {
            let exited = EndFacts::ran(Ended::Code(3), None, false).told(reason);
            assert_eq!(decide(&exited), Some(F::Nonzero), "{reason:?}");
            assert_eq!(lost_note(&exited), None);
            let timed_out = EndFacts::ran(Ended::Signal(9), Some(Stopped::Timeout), false);
            assert_eq!(decide(&timed_out.told(reason)), Some(F::Timeout));
            let busy = EndFacts::not_started(Unstarted::GpusBusy).told(reason);
            assert_eq!(decide(&busy), Some(F::GpuBusy));
        }
    }

    #[test]
    fn a_job_that_never_started_has_its_reasons_class() {
        for (why, want) in [
            (Unstarted::LaunchFailed, F::LaunchError),
            (Unstarted::Stopped, F::Cancelled),
            (Unstarted::GpusBusy, F::GpuBusy),
            (Unstarted::CooldownTimedOut, F::CooldownTimeout),
            (Unstarted::BackgroundNotReady, F::BackgroundNotReady),
            (Unstarted::Workdir, F::Workdir),
            (Unstarted::Environment, F::Environment),
        ] {
            assert_eq!(decide(&EndFacts::not_started(why)), Some(want), "{why:?}");
        }
        // A launch error stays one, whatever else was recorded.
        for stop in [None, Some(Stopped::Cancel), Some(Stopped::Timeout)] {
            for oom in [false, true] {
                let f = EndFacts {
                    stop,
                    saw_oom: oom,
                    ..EndFacts::not_started(Unstarted::LaunchFailed)
                };
                assert_eq!(decide(&f), Some(F::LaunchError));
                assert_eq!(
                    decide(&f.told(Some(StopReason::LeaseLost))),
                    Some(F::LaunchError)
                );
            }
        }
        // Stopped before its start with no stop on record: still not a success.
        let f = EndFacts {
            stop: None,
            ..EndFacts::not_started(Unstarted::Stopped)
        };
        assert_eq!(decide(&f), Some(F::Cancelled));
    }

    #[test]
    fn an_end_nobody_saw_is_lost() {
        assert_eq!(decide(&EndFacts::unseen()), Some(F::Lost));
        assert_eq!(lost_note(&EndFacts::unseen()), None, "it was not stopped");
    }

    #[test]
    fn an_exit_status_is_read_as_code_signal_or_lost() {
        assert_eq!(Ended::of(Some(ExitStatus::from_raw(0))), Ended::Code(0));
        assert_eq!(
            Ended::of(Some(ExitStatus::from_raw(3 << 8))),
            Ended::Code(3)
        );
        assert_eq!(Ended::of(Some(ExitStatus::from_raw(9))), Ended::Signal(9));
        assert_eq!(Ended::of(None), Ended::StatusLost);
    }

    fn ended() -> impl Strategy<Value = Ended> {
        prop_oneof![
            (-1i32..256).prop_map(Ended::Code),
            (1i32..65).prop_map(Ended::Signal),
            Just(Ended::StatusLost),
            Just(Ended::Unseen),
            prop_oneof![
                Just(Unstarted::LaunchFailed),
                Just(Unstarted::Stopped),
                Just(Unstarted::GpusBusy),
                Just(Unstarted::CooldownTimedOut),
                Just(Unstarted::BackgroundNotReady),
                Just(Unstarted::Workdir),
                Just(Unstarted::Environment),
            ]
            .prop_map(Ended::NotStarted),
        ]
    }

    fn stop() -> impl Strategy<Value = Option<Stopped>> {
        prop_oneof![
            Just(None),
            Just(Some(Stopped::Cancel)),
            Just(Some(Stopped::Timeout)),
            Just(Some(Stopped::BackgroundExited)),
        ]
    }

    fn reason() -> impl Strategy<Value = Option<StopReason>> {
        prop_oneof![
            Just(None),
            Just(Some(StopReason::User)),
            Just(Some(StopReason::LeaseLost)),
            Just(Some(StopReason::Shutdown)),
            Just(Some(StopReason::Requeue(Requeue::Preempted))),
        ]
    }

    proptest! {
        /// Only a job that ran, exited 0 and was not stopped by headroom succeeds.
        #[test]
        fn success_is_only_a_clean_exit(
            ended in ended(), stop in stop(), reason in reason(), oom in any::<bool>(),
        ) {
            let f = EndFacts { ended, stop, cancel_reason: reason, saw_oom: oom };
            prop_assert_eq!(
                decide(&f).is_none(),
                ended == Ended::Code(0) && stop.is_none()
            );
        }
    }
}
