//! What an attempt's supervisor does itself while its agent is away (crashed, restarting,
//! cut off): renew its lease and report its end, with the key issued with that lease and
//! for that attempt only (checked by the gate, `AttemptCaller`), as slurmstepd reports a
//! step's end to slurmctld whatever became of slurmd. Its metrics go this way too, while it
//! runs, and the answer says whether `early_stop` stops it.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use headroom_shared::api::{
    FinishReport, FinishResponse, LeaseRenewal, LeaseRenewed, LogAppended, LogChunkQuery,
    MetricsAnswer, MetricsReport,
};

use super::{ApiJson, ApiQuery, ApiResult, AppState, AttemptCaller};

pub async fn renew(
    State(s): State<AppState>,
    Extension(AttemptCaller(attempt)): Extension<AttemptCaller>,
    ApiJson(req): ApiJson<LeaseRenewal>,
) -> ApiResult<LeaseRenewed> {
    let ttl_ms = s.config.lease_ttl.as_millis() as u64;
    let asked = s.store.renew_lease(attempt, req.fence, ttl_ms).await?;
    tracing::debug!(%attempt, "lease renewed by its supervisor");
    let requeue = match asked {
        Some(crate::store::StopAsk::Requeue(why)) => Some(why),
        _ => None,
    };
    Ok(ApiJson(LeaseRenewed {
        ttl_ms,
        cancel: asked == Some(crate::store::StopAsk::Cancel),
        requeue,
    }))
}

pub async fn ship_log(
    State(s): State<AppState>,
    Extension(AttemptCaller(attempt)): Extension<AttemptCaller>,
    ApiQuery(q): ApiQuery<LogChunkQuery>,
    body: Bytes,
) -> ApiResult<LogAppended> {
    super::agents::append(&s, attempt, q, body).await
}

pub async fn outcome(
    State(s): State<AppState>,
    Extension(AttemptCaller(attempt)): Extension<AttemptCaller>,
    ApiJson(req): ApiJson<FinishReport>,
) -> ApiResult<FinishResponse> {
    super::agents::record_end(&s, attempt, req, "its supervisor").await
}

pub async fn metrics(
    State(s): State<AppState>,
    Extension(AttemptCaller(attempt)): Extension<AttemptCaller>,
    ApiJson(req): ApiJson<MetricsReport>,
) -> ApiResult<MetricsAnswer> {
    let answer = s
        .store
        .report_metrics(attempt, req.fence, req.metrics)
        .await?;
    if let Some(d) = &answer.prune {
        tracing::info!(%attempt, rung = d.rung, step = d.step, value = d.value, cutoff = ?d.cutoff, "early_stop prunes the attempt");
    }
    Ok(ApiJson(answer))
}
