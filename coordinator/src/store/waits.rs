//! A study's waits between jobs (`after`): storing a study with them, what a job's change
//! does to the jobs waiting for it, and `retry --cascade`.
//!
//! A job's `waiting_on` counts its waits not met yet; a claim reads only jobs with none. The
//! change of a job that others wait for (an end, or a retry of an ended one) only notes itself
//! (`wait_changes`) in its own transaction, which locks no other job; [`settle`] then counts
//! the waiting jobs' waits again, each under its own lock in `seq` order, and cancels those
//! whose `on_failure: cancel` a need's other end calls for. A waiting job that is queued
//! again (retried, handed back) counts its own waits at once, under the lock it holds.

use headroom_shared::api::ExperimentSummary;
use headroom_shared::pending::PendingReason;
use headroom_shared::study::{AfterWhen, OnDependencyFailure};
use std::collections::BTreeMap;

use headroom_shared::{JobEvent, JobId, JobState};

use super::tx::{Tx, WaitRow};
use super::{NewDependency, NewExperiment, Result};
use crate::changes::Change;

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

/// Stores a study's experiments and their waits, all or none: every waiting job waits for
/// all it needs (each is new, so queued) and says what for.
pub(super) async fn create_study(
    tx: &mut dyn Tx,
    exps: Vec<NewExperiment>,
    waits: Vec<NewDependency>,
) -> Result<(Vec<ExperimentSummary>, Change)> {
    let experiment_of: BTreeMap<JobId, &str> = exps
        .iter()
        .flat_map(|e| e.jobs.iter().map(move |j| (j.id, e.name.as_str())))
        .collect();
    // Each waiting job's reason: how many it waits for, naming the first one's experiment.
    let mut reasons: BTreeMap<JobId, PendingReason> = BTreeMap::new();
    for w in &waits {
        match reasons.get_mut(&w.job) {
            Some(PendingReason::WaitsFor { jobs, .. }) => *jobs += 1,
            _ => {
                reasons.insert(
                    w.job,
                    PendingReason::WaitsFor {
                        experiment: experiment_of
                            .get(&w.needs)
                            .copied()
                            .unwrap_or_default()
                            .to_string(),
                        jobs: 1,
                        when: w.when.as_str().into(),
                        ended_otherwise: 0,
                        retry: None,
                    },
                );
            }
        }
    }
    let ids: Vec<String> = exps.iter().map(|e| e.id.to_string()).collect();
    let mut out = Vec::with_capacity(exps.len());
    for exp in exps {
        out.push(super::experiments::create(tx, exp).await?.0);
    }
    tx.insert_waits(&waits).await?;
    for id in &ids {
        tx.count_new_waits(id).await?;
    }
    for (job, reason) in &reasons {
        tx.set_pending_reason(&job.to_string(), Some(reason))
            .await?;
    }
    Ok((out, Change::Work))
}

/// Counts the job's waits again and records the count and its reason; what was counted.
async fn recount(tx: &mut dyn Tx, job: &str) -> Result<Counted> {
    let counted = count(&tx.waits_of(job).await?);
    tx.set_waiting_on(job, counted.unmet).await?;
    tx.set_pending_reason(job, counted.reason.as_ref()).await?;
    Ok(counted)
}

/// In the transaction that moved `job` (locked) from `from` to `to`: a job others wait for
/// that ended, or ran again after its end, notes itself for [`settle`]; a job queued again
/// that waits itself counts its own waits now (what it needs may have been retried since it
/// last started).
pub(super) async fn changed(
    tx: &mut dyn Tx,
    job: &str,
    from: JobState,
    to: JobState,
) -> Result<()> {
    if from.is_terminal() || to.is_terminal() {
        let now = tx.clock().await?;
        tx.note_wait_change(job, now).await?;
    }
    if to.is_pending() && !from.is_pending() && !tx.waits_of(job).await?.is_empty() {
        recount(tx, job).await?;
    }
    Ok(())
}

/// Settles the notes `ids` of `job`: each waiting job that waits for it, locked in `seq`
/// order, counts its waits again; one whose need ended otherwise than it asks, under
/// `on_failure: cancel`, is cancelled (and notes itself for those waiting for it in turn).
/// The notes are dropped with it, all or none.
pub(super) async fn settle(tx: &mut dyn Tx, job: String, ids: Vec<i64>) -> Result<(u32, Change)> {
    let mut moved = 0;
    for (d, state) in tx.dependants(&job).await? {
        if !state.is_pending() {
            continue;
        }
        let mut locked = super::jobs::lock_job(tx, &d).await?;
        if !locked.state.is_pending() {
            continue;
        }
        let counted = recount(tx, &d).await?;
        if counted.cancel {
            super::jobs::transition(tx, &mut locked, JobEvent::Cancel).await?;
        }
        moved += 1;
    }
    tx.drop_wait_changes(&ids).await?;
    Ok((moved, Change::work_if(moved > 0)))
}

/// The oldest notes of changed jobs, at most `limit`, by job: (job, its notes).
pub(super) async fn due(tx: &mut dyn Tx, limit: u32) -> Result<Vec<(String, Vec<i64>)>> {
    let mut by_job: Vec<(String, Vec<i64>)> = Vec::new();
    for (id, job) in tx.wait_changes_due(limit).await? {
        match by_job.iter_mut().find(|(j, _)| *j == job) {
            Some((_, ids)) => ids.push(id),
            None => by_job.push((job, vec![id])),
        }
    }
    Ok(by_job)
}

/// `retry --cascade`: the job, then every job waiting for it (and for those, on down) that
/// has ended, run again; each waits again for what it needs. The ids retried, in order.
pub(super) async fn retry_cascade(tx: &mut dyn Tx, id: JobId) -> Result<(Vec<JobId>, Change)> {
    let mut retried = Vec::new();
    let mut next = vec![id.to_string()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(job) = next.pop() {
        if !seen.insert(job.clone()) {
            continue;
        }
        let mut locked = super::jobs::lock_job(tx, &job).await?;
        // The job asked for is retried as `retry` does (refused where it has not ended);
        // the jobs waiting for it where they ended.
        if retried.is_empty() || locked.state.is_terminal() {
            super::jobs::retry_locked(tx, &mut locked).await?;
            retried.push(super::rows::parse(&job, "job id")?);
        }
        let mut deps: Vec<String> = tx
            .dependants(&job)
            .await?
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        deps.reverse();
        next.extend(deps);
    }
    let change = Change::work_if(!retried.is_empty());
    Ok((retried, change))
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
