//! Jobs and attempts as users see them: listing, detail, cancel, retry, logs.

use headroom_shared::api::bounds;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use headroom_shared::api::{
    AttemptPhase, AttemptView, CancelResponse, ErrorCode, JobDetail, JobSummary, JobsQuery,
    LogQuery, Principal, RetryResponse,
};
use headroom_shared::{AttemptId, JobId, JobState, routes};

use super::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState, check_owner, parse_id};
use crate::placement::{LiveNode, read_time_reason};
use crate::store::JobFilter;

pub async fn list(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<JobsQuery>,
) -> ApiResult<Vec<JobSummary>> {
    let state = match q.state.as_deref() {
        Some(st) => Some(
            st.parse::<JobState>()
                .map_err(|e| ApiError::invalid("state", e.to_string()))?,
        ),
        None => None,
    };
    if let Some(p) = &q.id_prefix {
        bounds::ID_PREFIX
            .check(p)
            .map_err(|m| ApiError::invalid("id_prefix", m))?;
    }
    if let Some(n) = q.limit {
        bounds::JOBS
            .check(n.into())
            .map_err(|m| ApiError::invalid("limit", m))?;
    }
    let filter = JobFilter {
        experiment: q
            .experiment
            .as_deref()
            .map(|e| parse_id(e, "experiment"))
            .transpose()?,
        state,
        limit: q.limit,
        id_prefix: q.id_prefix,
        index: q.index,
    };
    let mut jobs = s.store.list_jobs(filter).await?;
    read_time_reasons(&s, jobs.iter_mut()).await?;
    Ok(ApiJson(jobs))
}

pub async fn get_one(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<JobDetail> {
    let mut d = s.store.job(parse_id(&id, "job")?).await?;
    read_time_reasons(&s, std::iter::once(&mut d.summary)).await?;
    if !may_see(&s, &who, &d.summary.submitted_by) {
        for v in d.env.values_mut() {
            *v = REDACTED.to_string();
        }
        for a in &mut d.attempts_detail {
            redact_attempt(a);
        }
    }
    Ok(ApiJson(d))
}

/// What another user's secrets read as.
const REDACTED: &str = "<redacted>";

/// Whether `who` sees the `env` values and logs of jobs `submitted_by` submitted: their own,
/// an admin any, everyone any where the lab shares them (`--shared-visibility`).
fn may_see(s: &AppState, who: &Principal, submitted_by: &str) -> bool {
    s.config.shared_visibility || crate::rules::may_act_on(who, submitted_by)
}

fn redact_attempt(a: &mut AttemptView) {
    if a.log_tail.is_some() {
        a.log_tail = Some(REDACTED.to_string());
    }
}

/// Reasons no claim pass can give, because no agent claims: no live node, or none with
/// that many GPUs; and a job no pass looked at yet says so.
async fn read_time_reasons<'a>(
    s: &AppState,
    jobs: impl Iterator<Item = &'a mut JobSummary>,
) -> Result<(), ApiError> {
    let mut nodes = None;
    for j in jobs.filter(|j| j.state.is_pending()) {
        if nodes.is_none() {
            let alive = s.config.lease_ttl.as_millis() as u64;
            nodes = Some(s.store.list_nodes(alive).await?);
        }
        let live: Vec<LiveNode> = nodes
            .iter()
            .flatten()
            .filter(|n| n.alive)
            .map(|n| LiveNode {
                gpus: n.gpus.len() as u32,
                largest_mib: n
                    .gpus
                    .iter()
                    .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
                    .max()
                    .unwrap_or(0),
            })
            .collect();
        j.pending_reason = Some(read_time_reason(j.gpus, j.pending_reason.take(), &live));
    }
    Ok(())
}

pub async fn cancel(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<headroom_shared::api::CancelQuery>,
) -> ApiResult<CancelResponse> {
    let id: JobId = parse_id(&id, "job")?;
    let job = s.store.job(id).await?;
    check_owner(&who, &job.summary.submitted_by, &format!("job {id}"))?;
    if q.requeue {
        let requeued = s.store.requeue_job(id).await?;
        return Ok(ApiJson(CancelResponse {
            cancelled: 0,
            requeued,
        }));
    }
    let cancelled = s.store.cancel_job(id).await?;
    Ok(ApiJson(CancelResponse {
        cancelled,
        requeued: 0,
    }))
}

pub async fn retry(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<headroom_shared::api::RetryQuery>,
) -> ApiResult<RetryResponse> {
    let id: JobId = parse_id(&id, "job")?;
    let job = s.store.job(id).await?;
    check_owner(&who, &job.summary.submitted_by, &format!("job {id}"))?;
    if !q.cascade {
        let state = s.store.retry_job(id).await?;
        return Ok(ApiJson(RetryResponse {
            state,
            retried: vec![],
        }));
    }
    // The jobs waiting for it are the submitter's too: a study is one submitter's.
    let retried = s.store.retry_cascade(id).await?;
    let state = s.store.job(id).await?.summary.state;
    Ok(ApiJson(RetryResponse { state, retried }))
}

pub async fn attempt(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<AttemptView> {
    let mut a = s.store.attempt(parse_id(&id, "attempt")?).await?;
    if !may_see(&s, &who, &a.submitted_by) {
        redact_attempt(&mut a);
    }
    Ok(ApiJson(a))
}

const LOG_READ_MAX: u64 = 1 << 20;

/// Log bytes from `offset`; headers say the next offset and whether the attempt has ended
/// (so `logs -f` knows when to stop).
pub async fn read_log(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Response, ApiError> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    let owner = s.store.attempt_row(attempt).await?.submitted_by;
    if !may_see(&s, &who, &owner) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "the log of attempt {attempt} is `{owner}`'s: only they or an admin may read it \
                 (this token: `{}`; a lab may share logs with --shared-visibility)",
                who.name
            ),
        ));
    }
    bounds::WAIT_MS
        .check(q.wait_ms)
        .map_err(|m| ApiError::invalid("wait_ms", m))?;
    let wait = Duration::from_millis(q.wait_ms).min(s.config.long_poll);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Before the reads: a chunk stored after them wakes the wait below.
        let seen = s.changes.version();
        let ended = s.store.attempt_row(attempt).await?.phase == AttemptPhase::Ended;
        let mut bytes = s.store.read_log(attempt, q.offset, LOG_READ_MAX).await?;
        if bytes.is_empty() && ended && s.store.read_log(attempt, 0, 1).await?.is_empty() {
            // An attempt that ended under an earlier version has its log in a file (and
            // none in the store).
            let dir = s.config.data_dir.clone();
            bytes = tokio::task::spawn_blocking(move || {
                crate::logs::read_legacy(&dir, attempt, q.offset, LOG_READ_MAX)
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        let now = tokio::time::Instant::now();
        if !bytes.is_empty() || ended || now >= deadline || s.changes.is_closing() {
            let mut headers = HeaderMap::new();
            let next = q.offset + bytes.len() as u64;
            headers.insert(routes::LOG_OFFSET_HEADER, HeaderValue::from(next));
            headers.insert(
                routes::ATTEMPT_ENDED_HEADER,
                HeaderValue::from_static(if ended { "true" } else { "false" }),
            );
            return Ok((headers, bytes).into_response());
        }
        // Wake on new log bytes (on any replica) or any job change (the attempt may end).
        s.changes.wait_past(seen, deadline - now).await;
    }
}
