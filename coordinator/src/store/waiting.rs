//! A waiting job's count of its unmet waits (`after`) and the reason it gives, and what a
//! job's change does in its own transaction: it notes itself for the jobs waiting for it
//! (`store::waits` settles them) and, queued again while it waits itself, counts its own
//! waits at once under the lock it holds. Locks no other job.

use headroom_shared::JobState;
use headroom_shared::pending::PendingReason;
use headroom_shared::study::{AfterWhen, OnDependencyFailure};

use super::tx::{Tx, WaitRow};
use super::{Millis, Result};

/// What one wait is, from the state of the job it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitIs {
    Met,
    Pending,
    /// The job it needs ended otherwise than `when` asks (failed, cancelled, pruned).
    EndedOtherwise,
}

pub(crate) fn wait_is(needs: JobState, when: AfterWhen) -> WaitIs {
    match (needs, when) {
        (JobState::Succeeded, _) => WaitIs::Met,
        (s, AfterWhen::Ended) if s.is_terminal() => WaitIs::Met,
        (s, AfterWhen::Succeeded) if s.is_terminal() => WaitIs::EndedOtherwise,
        _ => WaitIs::Pending,
    }
}

/// A job's waits counted: how many are not met, whether one ended otherwise under
/// `on_failure: cancel`, and the reason a waiting job gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    pub unmet: u64,
    pub cancel: bool,
    pub reason: Option<PendingReason>,
}

pub(crate) fn count(waits: &[WaitRow]) -> Counted {
    let mut unmet = 0;
    let mut otherwise = 0;
    let mut cancel = false;
    let mut first: Option<&WaitRow> = None;
    let mut retry: Option<&WaitRow> = None;
    for w in waits {
        match wait_is(w.needs_state, w.when) {
            WaitIs::Met => continue,
            WaitIs::Pending => {}
            WaitIs::EndedOtherwise => {
                otherwise += 1;
                retry.get_or_insert(w);
                cancel |= w.on_failure == OnDependencyFailure::Cancel;
            }
        }
        unmet += 1;
        first.get_or_insert(w);
    }
    Counted {
        unmet,
        cancel,
        reason: first.map(|w| PendingReason::WaitsFor {
            experiment: w.needs_experiment.clone(),
            jobs: unmet,
            when: w.when.as_str().into(),
            ended_otherwise: otherwise,
            retry: retry.map(|w| w.needs.clone()),
        }),
    }
}

/// Counts the job's waits again and records the count and its reason; what was counted.
pub(super) async fn recount(tx: &mut dyn Tx, job: &str) -> Result<Counted> {
    let waits = tx.waits_of(job).await?;
    record(tx, job, &waits).await
}

/// Records the count of `waits` (the job's, as read) and its reason.
async fn record(tx: &mut dyn Tx, job: &str, waits: &[WaitRow]) -> Result<Counted> {
    let counted = count(waits);
    tx.set_waiting_on(job, counted.unmet).await?;
    tx.set_pending_reason(job, counted.reason.as_ref()).await?;
    Ok(counted)
}

/// In the transaction that moved `job` (locked) from `from` to `to`: a job others wait for
/// that ended, or ran again after its end, notes itself for `store::waits::settle`; a job queued again
/// that waits itself counts its own waits now (what it needs may have been retried since it
/// last started).
pub(super) async fn changed(
    tx: &mut dyn Tx,
    job: &str,
    from: JobState,
    to: JobState,
    now: Millis,
) -> Result<()> {
    if from.is_terminal() || to.is_terminal() {
        tx.note_wait_change(job, now).await?;
    }
    if to.is_pending() && !from.is_pending() {
        let waits = tx.waits_of(job).await?;
        if !waits.is_empty() {
            record(tx, job, &waits).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(state: JobState, when: AfterWhen, on: OnDependencyFailure) -> WaitRow {
        WaitRow {
            needs: "n".into(),
            needs_state: state,
            needs_experiment: "lab.train".into(),
            when,
            on_failure: on,
        }
    }

    #[test]
    fn a_wait_is_met_by_success_or_any_end_as_asked() {
        use AfterWhen::*;
        for s in [
            JobState::Queued,
            JobState::Leased,
            JobState::Running,
            JobState::Retrying,
        ] {
            assert_eq!(wait_is(s, Succeeded), WaitIs::Pending);
            assert_eq!(wait_is(s, Ended), WaitIs::Pending);
        }
        assert_eq!(wait_is(JobState::Succeeded, Succeeded), WaitIs::Met);
        for s in [JobState::Failed, JobState::Cancelled, JobState::Pruned] {
            assert_eq!(wait_is(s, Succeeded), WaitIs::EndedOtherwise);
            assert_eq!(wait_is(s, Ended), WaitIs::Met);
        }
    }

    #[test]
    fn counting_names_the_first_unmet_and_cancels_only_as_asked() {
        use OnDependencyFailure::*;
        let c = count(&[
            wait(JobState::Succeeded, AfterWhen::Succeeded, Cancel),
            wait(JobState::Running, AfterWhen::Succeeded, Cancel),
            wait(JobState::Failed, AfterWhen::Succeeded, Wait),
        ]);
        assert_eq!(c.unmet, 2);
        assert!(!c.cancel, "the failed one says wait");
        assert_eq!(
            c.reason.map(|r| r.to_string()),
            Some(
                "waits for 2 jobs of `lab.train` to succeed; 1 ended otherwise: `headroom \
                 retry n --cascade` runs it and the jobs waiting for it again"
                    .into()
            )
        );
        let c = count(&[wait(JobState::Failed, AfterWhen::Succeeded, Cancel)]);
        assert!(c.cancel);
        let c = count(&[wait(JobState::Failed, AfterWhen::Ended, Cancel)]);
        assert_eq!(
            c,
            Counted {
                unmet: 0,
                cancel: false,
                reason: None
            }
        );
    }
}
