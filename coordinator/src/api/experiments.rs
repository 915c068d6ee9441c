//! Experiments: reading them, their progress, cancellation, retry of their failures and export.

use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use headroom_shared::ExperimentId;
use headroom_shared::api::bounds;
use headroom_shared::api::{
    Ack, CancelResponse, ExperimentSummary, ExportFormat, ExportPage, ExportQuery, Health,
    Principal, Progress, ProgressQuery, RetryFailedResponse,
};

use super::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState, check_owner, parse_id};

/// Liveness: answers whatever the store's state (a store that is down is readiness's to say).
pub async fn live() -> ApiResult<Ack> {
    Ok(ApiJson(Ack { ok: true }))
}

pub async fn health(State(s): State<AppState>) -> ApiResult<Health> {
    let schema_version = s.store.schema_version().await?;
    Ok(ApiJson(Health {
        status: "ok".into(),
        schema_version,
    }))
}

pub async fn list(State(s): State<AppState>) -> ApiResult<Vec<ExperimentSummary>> {
    Ok(ApiJson(s.store.list_experiments().await?))
}

pub async fn get_one(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ExperimentSummary> {
    Ok(ApiJson(
        s.store.experiment(parse_id(&id, "experiment")?).await?,
    ))
}

/// Every attempt's metric series and final values: learning curves.
pub async fn metrics(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<headroom_shared::api::MetricsQuery>,
) -> ApiResult<Vec<headroom_shared::api::AttemptSeries>> {
    use headroom_shared::results::{MAX_POINTS, validate_metric_name};
    if let Some(m) = &q.metric {
        validate_metric_name(m).map_err(|e| ApiError::invalid("metric", e))?;
    }
    let most = MAX_POINTS as u32 + 1;
    let points = match q.points {
        None => most,
        Some(n) if (2..=most).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::invalid(
                "points",
                format!("must be from 2 to {most}"),
            ));
        }
    };
    Ok(ApiJson(
        s.store
            .experiment_series(parse_id(&id, "experiment")?, q.metric, points as usize)
            .await?,
    ))
}

pub async fn cancel(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<headroom_shared::api::CancelQuery>,
) -> ApiResult<CancelResponse> {
    let id: ExperimentId = parse_id(&id, "experiment")?;
    let exp = s.store.experiment(id).await?;
    check_owner(&who, &exp.submitted_by, &format!("experiment {id}"))?;
    if q.requeue {
        let requeued = s.store.requeue_experiment(id).await?;
        return Ok(ApiJson(CancelResponse {
            cancelled: 0,
            requeued,
        }));
    }
    let cancelled = s.store.cancel_experiment(id).await?;
    Ok(ApiJson(CancelResponse {
        cancelled,
        requeued: 0,
    }))
}

/// How long a progress long-poll gathers a run of changes before it answers (a lone change,
/// or one that ends the last job, is answered at once): counting every job of an experiment
/// after each of hundreds of changes a second cost a fifth of the coordinator's CPU while a
/// matrix drained.
const PROGRESS_GATHER: Duration = Duration::from_millis(20);

/// A count reads every job of the experiment, so its cost grows with the experiment: a
/// watcher is answered in a run of changes at most every this many times the last count's
/// time, which keeps a watcher's counts to about a tenth of a database core.
const COUNTS_PER_GATHER: u32 = 10;

/// The longest a run of changes is gathered, however slow counting is.
const PROGRESS_GATHER_MAX: Duration = Duration::from_secs(2);

/// How long the latest progress count took, shared by every watcher.
#[derive(Debug, Default)]
pub struct ProgressPace {
    last_count_us: std::sync::atomic::AtomicU64,
}

impl ProgressPace {
    fn counted(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.last_count_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    fn gather(&self) -> Duration {
        let last = self
            .last_count_us
            .load(std::sync::atomic::Ordering::Relaxed);
        gather_after(Duration::from_micros(last))
    }
}

/// The gathering window after a count that took `last`.
fn gather_after(last: Duration) -> Duration {
    last.saturating_mul(COUNTS_PER_GATHER)
        .clamp(PROGRESS_GATHER, PROGRESS_GATHER_MAX)
}

/// The experiment's counts (every job's without one), timed for the next watcher's pace.
async fn counted(
    s: &AppState,
    experiment: Option<ExperimentId>,
) -> Result<headroom_shared::api::StateCounts, ApiError> {
    let started = std::time::Instant::now();
    let counts = s.store.counts(experiment).await?;
    s.progress.counted(started.elapsed());
    Ok(counts)
}

pub async fn progress(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ProgressQuery>,
) -> ApiResult<Progress> {
    let experiment: Option<ExperimentId> = q
        .experiment
        .as_deref()
        .map(|e| parse_id(e, "experiment"))
        .transpose()?;
    if let Some(ms) = q.timeout_ms {
        bounds::WAIT_MS
            .check(ms)
            .map_err(|m| ApiError::invalid("timeout_ms", m))?;
    }
    let version = match q.after {
        Some(seen) => {
            let wait =
                Duration::from_millis(q.timeout_ms.unwrap_or(10_000)).min(s.config.long_poll);
            let version = s.changes.wait_past(seen, wait).await;
            if version == seen || !s.changes.in_a_run(PROGRESS_GATHER) || s.changes.is_closing() {
                version
            } else {
                // One of a run of changes: answered with the rest of the run a moment later,
                // unless it ended the last job (whoever waits for the end hears it now). Asked
                // without counting: a count reads every job.
                if !s.store.unfinished(experiment).await? {
                    let counts = counted(&s, experiment).await?;
                    return Ok(ApiJson(Progress { version, counts }));
                }
                tokio::time::sleep(s.progress.gather()).await;
                s.changes.version()
            }
        }
        None => s.changes.version(),
    };
    let counts = counted(&s, experiment).await?;
    Ok(ApiJson(Progress { version, counts }))
}

pub async fn export(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ExportQuery>,
) -> Result<Response, ApiError> {
    let experiment = q
        .experiment
        .as_deref()
        .map(|e| parse_id(e, "experiment"))
        .transpose()?;
    if let Some(n) = q.limit {
        bounds::EXPORT_ROWS
            .check(n.into())
            .map_err(|m| ApiError::invalid("limit", m))?;
    }
    let mut rows = s.store.export_rows(experiment).await?;
    if q.clean_only {
        rows.retain(|r| crate::export::is_clean(&r.attempt));
    }
    // A page: JSON always (at most `EXPORT_ROWS.max` rows), CSV when asked for one.
    let after = usize::try_from(q.after.unwrap_or(0)).unwrap_or(usize::MAX);
    let limit = q.limit.map_or(
        match q.format {
            ExportFormat::Json => bounds::EXPORT_ROWS.max as usize,
            ExportFormat::Csv => usize::MAX,
        },
        |n| n as usize,
    );
    let end = after.saturating_add(limit).min(rows.len());
    let page = rows.get(after..end).unwrap_or_default();
    if q.format == ExportFormat::Json {
        return Ok(ApiJson(ExportPage {
            columns: crate::export::describe(),
            rows: page.iter().map(crate::export::to_json).collect(),
            next_after: (end < rows.len()).then_some(end as u64),
        })
        .into_response());
    }
    let csv = crate::export::to_csv(page).map_err(|e| ApiError::internal(format!("csv: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv).into_response())
}

/// Every failed job of the experiment runs once more, in one request.
pub async fn retry_failed(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<RetryFailedResponse> {
    let id: ExperimentId = parse_id(&id, "experiment")?;
    let exp = s.store.experiment(id).await?;
    check_owner(&who, &exp.submitted_by, &format!("experiment {id}"))?;
    let retried = s.store.retry_failed(id).await?;
    Ok(ApiJson(RetryFailedResponse {
        experiment: id,
        retried,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_count_spaces_the_answers_of_a_run_and_a_fast_one_does_not() {
        assert_eq!(gather_after(Duration::ZERO), PROGRESS_GATHER);
        assert_eq!(gather_after(Duration::from_millis(1)), PROGRESS_GATHER);
        // A 30 ms count (100,000 jobs on PostgreSQL): answers 300 ms apart.
        assert_eq!(
            gather_after(Duration::from_millis(30)),
            Duration::from_millis(300)
        );
        assert_eq!(gather_after(Duration::from_secs(60)), PROGRESS_GATHER_MAX);
        let pace = ProgressPace::default();
        assert_eq!(pace.gather(), PROGRESS_GATHER);
        pace.counted(Duration::from_millis(50));
        assert_eq!(pace.gather(), Duration::from_millis(500));
    }
}
