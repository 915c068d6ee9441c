//! Experiments: storing a matrix of jobs at once, reading experiments with their counts, and
//! the export (one row per attempt).

use std::collections::BTreeMap;
use std::sync::Arc;

use headroom_shared::api::source::Source;
use headroom_shared::api::{AttemptView, ExperimentSummary, JobSummary, StateCounts};
use headroom_shared::{ExperimentId, JobId};

use super::tx::{AttemptsWhere, JobsWhere, Tx};
use super::{
    ExportRow, Millis, NewExperiment, Result, StoreError, Tallies, UserJobs, now_ms, rows,
};
use crate::changes::Change;

pub(super) async fn summary(tx: &mut dyn Tx, id: &str) -> Result<ExperimentSummary> {
    let row = tx
        .experiment_row(id)
        .await?
        .ok_or_else(|| StoreError::not_found("experiment", id))?;
    let counts = tx.state_counts(Some(id)).await?;
    rows::experiment(id, row, counts)
}

pub(super) async fn create(
    tx: &mut dyn Tx,
    exp: NewExperiment,
) -> Result<(ExperimentSummary, Change)> {
    create_at(tx, exp, now_ms()).await
}

/// [`create`], created at `at`: a study's experiments share one time, so that they list in
/// the file's order (by their ids) whatever order they are queued in.
pub(super) async fn create_at(
    tx: &mut dyn Tx,
    exp: NewExperiment,
    at: Millis,
) -> Result<(ExperimentSummary, Change)> {
    tx.insert_experiment(&exp, at).await?;
    let id = exp.id.to_string();
    // Configurations an earlier run of the same key fit only at a ladder step start there.
    for (job, step, attempt) in tx.fits_of_experiment(&id).await? {
        super::ladder::start_at_step(tx, &job, step, &super::ladder::fit_note(step, &attempt))
            .await?;
    }
    Ok((summary(tx, &id).await?, Change::Work))
}

pub(super) async fn list(tx: &mut dyn Tx) -> Result<Vec<ExperimentSummary>> {
    let ids = tx.experiment_ids().await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in &ids {
        out.push(summary(tx, id).await?);
    }
    Ok(out)
}

pub(super) async fn get(tx: &mut dyn Tx, id: ExperimentId) -> Result<ExperimentSummary> {
    summary(tx, &id.to_string()).await
}

pub(super) async fn counts(tx: &mut dyn Tx, id: Option<ExperimentId>) -> Result<StateCounts> {
    let id = id.map(|e| e.to_string());
    tx.state_counts(id.as_deref()).await
}

pub(super) async fn unfinished(tx: &mut dyn Tx, id: Option<ExperimentId>) -> Result<bool> {
    let id = id.map(|e| e.to_string());
    tx.unfinished(id.as_deref()).await
}

/// What `/metrics` counts from the store.
pub(super) async fn tallies(tx: &mut dyn Tx) -> Result<Tallies> {
    let outcomes = tx.outcome_counts().await?;
    let mut by_user: BTreeMap<String, UserJobs> = BTreeMap::new();
    for (user, state, n) in tx.user_job_counts().await? {
        let u = by_user.entry(user).or_default();
        if state.is_pending() {
            u.queued += n;
        } else {
            u.running += n;
        }
    }
    Ok(Tallies {
        outcomes,
        by_user: by_user.into_iter().collect(),
    })
}

/// One export row per attempt, in job order.
pub(super) async fn export(tx: &mut dyn Tx, id: Option<ExperimentId>) -> Result<Vec<ExportRow>> {
    let id = id.map(|e| e.to_string());
    let jobs = tx
        .job_summaries(JobsWhere::Filter {
            experiment: id.as_deref(),
            state: None,
            limit: None,
            id_prefix: None,
            index: None,
        })
        .await?;
    let mut attempts = tx
        .attempt_views(AttemptsWhere::Experiment(id.as_deref()))
        .await?;
    super::sharing::label(tx, &mut attempts).await?;
    let sources = tx
        .experiment_sources(id.as_deref())
        .await?
        .into_iter()
        .filter_map(|(id, s)| Some((id, Arc::new(s?))))
        .collect();
    Ok(export_rows(jobs, attempts, &sources))
}

/// One export row per attempt, in job order: both backends read jobs and attempts, this joins.
fn export_rows(
    jobs: Vec<JobSummary>,
    attempts: Vec<AttemptView>,
    sources: &BTreeMap<String, Arc<Source>>,
) -> Vec<ExportRow> {
    let mut by_job: BTreeMap<JobId, Vec<AttemptView>> = BTreeMap::new();
    for a in attempts {
        by_job.entry(a.job).or_default().push(a);
    }
    let mut out = Vec::new();
    for job in jobs {
        for attempt in by_job.remove(&job.id).unwrap_or_default() {
            out.push(ExportRow {
                experiment: job.experiment_name.clone(),
                source: sources.get(&job.experiment.to_string()).cloned(),
                job: job.clone(),
                attempt,
            });
        }
    }
    out
}
