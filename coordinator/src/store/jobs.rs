//! Jobs: reading them, cancelling and retrying them, and the one place a job's state
//! changes (`transition`), with the building blocks other operations share (locking a job,
//! losing an attempt).

use headroom_shared::api::{JobDetail, JobSummary};
use headroom_shared::checkpoint::Requeue;
use headroom_shared::{ExperimentId, JobEvent, JobId, JobState};

use super::tx::{AttemptsWhere, JobLeased, JobsWhere, Tx};
use super::{JobFilter, Millis, Result, StoreError, now_ms};
use crate::changes::Change;
use crate::rules;

/// A job this transaction holds locked, with its state as read under that lock: its
/// transitions start from that state rather than reading it again.
#[derive(Debug)]
pub(super) struct LockedJob {
    pub id: String,
    pub state: JobState,
}

/// The job, locked.
pub(super) async fn lock_job(tx: &mut dyn Tx, job: &str) -> Result<LockedJob> {
    let state = tx
        .lock_job(job)
        .await?
        .ok_or_else(|| StoreError::not_found("job", job))?;
    Ok(LockedJob {
        id: job.to_string(),
        state,
    })
}

/// A job's state changes by `event` ([`apply`]).
pub(super) async fn transition(
    tx: &mut dyn Tx,
    job: &mut LockedJob,
    event: JobEvent,
) -> Result<JobState> {
    apply(tx, job, event, None).await
}

/// [`transition`] by a lease, which sets the lease's columns of the job in the same write.
pub(super) async fn lease(
    tx: &mut dyn Tx,
    job: &mut LockedJob,
    leased: JobLeased,
) -> Result<JobState> {
    apply(tx, job, JobEvent::Lease, Some(leased)).await
}

/// The one place a job's state changes: the state machine decides, the update is
/// conditional on the state read under the job's lock, and a lost race is a conflict, not
/// a silent overwrite.
async fn apply(
    tx: &mut dyn Tx,
    job: &mut LockedJob,
    event: JobEvent,
    leased: Option<JobLeased>,
) -> Result<JobState> {
    let from = job.state;
    let to = from.on(event)?;
    // A lease always moves a waiting job: its columns are never left unwritten.
    debug_assert!(
        leased.is_none() || to != from,
        "a lease that changes no state"
    );
    let now = now_ms();
    if to != from && tx.set_job_state(&job.id, from, to, now, leased).await? != 1 {
        return Err(StoreError::Conflict {
            job: Some(job.id.clone()),
        });
    }
    job.state = to;
    if to != from {
        // Jobs of a study that wait for this one (`after`) may start, or end, with it.
        super::waiting::changed(tx, &job.id, from, to, now).await?;
        // An end (or a return from one) is noted for the alerts it may raise
        // (`store::alerts::sweep` reads the notes): an insert, no lock taken.
        if to.is_terminal() || from.is_terminal() {
            tx.note_job_end(&job.id, to, now).await?;
        }
    }
    Ok(to)
}

/// The job's columns the outcome rules read (the job is locked by the caller).
pub(super) async fn job_rules(tx: &mut dyn Tx, job: &str) -> Result<rules::JobRules> {
    tx.job_rules(job)
        .await?
        .ok_or_else(|| StoreError::not_found("job", job))
}

/// The job of an attempt, locked (the job first, as every transition locks); `None` when no
/// such attempt exists.
pub(super) async fn lock_job_of(tx: &mut dyn Tx, attempt: &str) -> Result<Option<LockedJob>> {
    Ok(tx
        .lock_job_of_attempt(attempt)
        .await?
        .map(|(id, state)| LockedJob { id, state }))
}

/// Records an active attempt as lost and requeues its job if the policy allows; false when
/// it had already ended (another replica's sweep, or its report, came first).
pub(super) async fn lose_attempt(
    tx: &mut dyn Tx,
    attempt: &str,
    expired_before: Option<Millis>,
) -> Result<bool> {
    let Some(mut job) = lock_job_of(tx, attempt).await? else {
        return Ok(false);
    };
    let now = tx.clock().await?;
    let Some(started) = tx.end_lost(attempt, now, expired_before).await? else {
        return Ok(false);
    };
    let r = job_rules(tx, &job.id).await?;
    let loss = rules::lose(&r, started);
    tx.set_last_failure(&job.id, Some(headroom_shared::FailureClass::Lost))
        .await?;
    tx.set_job_tries(&job.id, r.attempts, loss.max_attempts)
        .await?;
    transition(tx, &mut job, loss.event).await?;
    if started {
        // A run that started is tracked however it ended.
        super::results::at_loss(tx, attempt, now).await?;
    }
    Ok(true)
}

/// Cancels a job not yet ended and asks its live attempts to stop; 1 when it did.
async fn cancel_one(tx: &mut dyn Tx, job: &str) -> Result<u64> {
    let mut locked = lock_job(tx, job).await?;
    if locked.state.is_terminal() {
        return Ok(0);
    }
    transition(tx, &mut locked, JobEvent::Cancel).await?;
    tx.request_cancel(job).await?;
    Ok(1)
}

pub(super) async fn list(tx: &mut dyn Tx, filter: JobFilter) -> Result<Vec<JobSummary>> {
    let exp = filter.experiment.map(|e| e.to_string());
    tx.job_summaries(JobsWhere::Filter {
        experiment: exp.as_deref(),
        state: filter.state,
        limit: filter.limit,
        id_prefix: filter.id_prefix.as_deref(),
        index: filter.index,
    })
    .await
}

pub(super) async fn detail(tx: &mut dyn Tx, id: JobId) -> Result<JobDetail> {
    let id = id.to_string();
    let not_found = || StoreError::not_found("job", &id);
    let summary = tx
        .job_summaries(JobsWhere::Id(&id))
        .await?
        .pop()
        .ok_or_else(not_found)?;
    let mut attempts = tx.attempt_views(AttemptsWhere::Job(&id)).await?;
    super::sharing::label(tx, &mut attempts).await?;
    tx.job_detail(&id, summary, attempts)
        .await?
        .ok_or_else(not_found)
}

pub(super) async fn cancel(tx: &mut dyn Tx, id: JobId) -> Result<(u64, Change)> {
    let n = cancel_one(tx, &id.to_string()).await?;
    Ok((n, Change::work_if(n > 0)))
}

/// The jobs of an existing experiment in the states `which` takes.
async fn jobs_in(
    tx: &mut dyn Tx,
    id: ExperimentId,
    which: fn(JobState) -> bool,
) -> Result<Vec<String>> {
    let id = id.to_string();
    super::experiments::summary(tx, &id).await?;
    Ok(tx
        .jobs_of_experiment(&id)
        .await?
        .into_iter()
        .filter(|&(_, state)| which(state))
        .map(|(job, _)| job)
        .collect())
}

pub(super) async fn cancel_experiment(tx: &mut dyn Tx, id: ExperimentId) -> Result<(u64, Change)> {
    let mut n = 0;
    for job in jobs_in(tx, id, |s| !s.is_terminal()).await? {
        n += cancel_one(tx, &job).await?;
    }
    Ok((n, Change::work_if(n > 0)))
}

/// Asks a running job's live attempt to stop after its checkpoint signal and requeue; 1
/// when it did (a job that runs nothing, or was asked already, is left as it is).
async fn requeue_one(tx: &mut dyn Tx, job: &str) -> Result<u64> {
    let locked = lock_job(tx, job).await?;
    if !matches!(locked.state, JobState::Leased | JobState::Running) {
        return Ok(0);
    }
    Ok(tx.request_requeue(job, Requeue::Requeued).await?.min(1))
}

pub(super) async fn requeue(tx: &mut dyn Tx, id: JobId) -> Result<(u64, Change)> {
    let n = requeue_one(tx, &id.to_string()).await?;
    Ok((n, Change::work_if(n > 0)))
}

pub(super) async fn requeue_experiment(tx: &mut dyn Tx, id: ExperimentId) -> Result<(u64, Change)> {
    let running = |s| matches!(s, JobState::Leased | JobState::Running);
    let mut n = 0;
    for job in jobs_in(tx, id, running).await? {
        n += requeue_one(tx, &job).await?;
    }
    Ok((n, Change::work_if(n > 0)))
}

pub(super) async fn retry(tx: &mut dyn Tx, id: JobId) -> Result<(JobState, Change)> {
    let state = retry_one(tx, &id.to_string()).await?;
    Ok((state, Change::Work))
}

/// Every failed job of the experiment runs once more, in one transaction: all or none.
pub(super) async fn retry_failed(
    tx: &mut dyn Tx,
    id: ExperimentId,
) -> Result<(Vec<JobId>, Change)> {
    let id = id.to_string();
    super::experiments::summary(tx, &id).await?;
    let mut retried = Vec::new();
    for (job, state) in tx.jobs_of_experiment(&id).await? {
        if state == JobState::Failed {
            retry_one(tx, &job).await?;
            retried.push(super::rows::parse(&job, "job id")?);
        }
    }
    let change = Change::work_if(!retried.is_empty());
    Ok((retried, change))
}

async fn retry_one(tx: &mut dyn Tx, id: &str) -> Result<JobState> {
    let mut job = lock_job(tx, id).await?;
    retry_locked(tx, &mut job).await
}

/// A manual retry of a locked job: it waits again, with one more attempt to spend.
pub(super) async fn retry_locked(tx: &mut dyn Tx, job: &mut LockedJob) -> Result<JobState> {
    let state = transition(tx, job, JobEvent::Retry).await?;
    let r = job_rules(tx, &job.id).await?;
    tx.set_job_tries(&job.id, r.attempts, rules::manual_retry(r.attempts))
        .await?;
    Ok(state)
}
