//! A study's waits between jobs (`after`): storing a study with them, settling the jobs
//! that wait for a job that changed, and `retry --cascade`.
//!
//! A job's `waiting_on` counts its waits not met yet; a claim reads only jobs with none. The
//! change of a job that others wait for only notes itself (`store::waiting`), in its own
//! transaction, which locks no other job; [`settle`] then counts the waiting jobs' waits
//! again, each under its own lock in `seq` order, and cancels those whose `on_failure:
//! cancel` a need's other end calls for.

use std::collections::BTreeMap;

use headroom_shared::api::ExperimentSummary;
use headroom_shared::pending::PendingReason;
use headroom_shared::{JobEvent, JobId};

use super::tx::Tx;
use super::waiting::recount;
use super::{NewDependency, NewExperiment, Result};
use crate::changes::Change;

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
    let at = super::now_ms();
    for exp in exps {
        out.push(super::experiments::create_at(tx, exp, at).await?.0);
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
