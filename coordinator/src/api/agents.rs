//! The agent protocol: register, long-poll claim, heartbeat, start, finish, hand back, logs.

use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use chrono::{DateTime, Utc};
use headroom_shared::api::{
    Ack, ClaimRequest, ClaimResponse, ErrorCode, FinishReport, FinishResponse, HandBackRequest,
    HeartbeatRequest, HeartbeatResponse, LogAppended, LogChunkQuery, Principal, RegisterRequest,
    RegisterResponse, StartReport,
};
use headroom_shared::{AgentId, AttemptId, Plan};

use super::telemetry::check_telemetry;
use super::{
    ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState, check_node, check_node_name,
    check_samples, parse_id,
};
use crate::store::{ClaimInput, Finished, NodeOf, Registration, Renewal, Started};

pub async fn register(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<RegisterRequest>,
) -> ApiResult<RegisterResponse> {
    if req.node.trim().is_empty() {
        return Err(ApiError::invalid("node", "node name is empty"));
    }
    check_node_name(&who, &req.node)?;
    // A node without GPUs has no plan to store (an agent finding none refuses to start).
    if req.gpus.is_empty() {
        return Err(ApiError::invalid(
            "gpus",
            "a node registers at least one GPU",
        ));
    }
    for (i, g) in req.gpus.iter().enumerate() {
        if req.gpus[..i].iter().any(|o| o.index == g.index) {
            return Err(ApiError::invalid(
                format!("gpus[{i}].index"),
                format!("GPU {} is registered twice", g.index),
            ));
        }
    }
    let plan = match &req.plan {
        Some(p) => Some(
            Plan::parse_for(p, req.gpus.len())
                .map_err(|e| ApiError::invalid("plan", e.to_string()))?,
        ),
        None => None,
    };
    let agent = AgentId::new();
    let reg = s
        .store
        .register_agent(Registration {
            agent,
            node: req.node.clone(),
            gpus: req.gpus,
            plan,
            headroom: req.headroom,
            resume: req.running,
            lease_ttl_ms: s.config.lease_ttl.as_millis() as u64,
            previous: req.previous,
            host_memory_mib: req.host_memory_mib,
        })
        .await?;
    if !reg.lost.is_empty() {
        tracing::warn!(node = %req.node, lost = reg.lost.len(), "attempts of the node's earlier incarnation recorded as lost");
    }
    tracing::info!(node = %req.node, %agent, plan = %reg.plan, "agent registered");
    Ok(ApiJson(RegisterResponse {
        agent,
        lease_ttl_ms: s.config.lease_ttl.as_millis() as u64,
        plan: reg.plan.to_string(),
        lost_attempts: reg.lost,
    }))
}

/// How long after another node's end a waiting claim looks again: that end freed a slot
/// there, not here, unless it taught an estimate that lets a job fit here. Ends that come
/// meanwhile wake it no more often.
const OTHER_NODES_ENDS: Duration = Duration::from_millis(250);

/// Leases work to the agent, holding the request open until work (or a cancellation, or a
/// plan change) appears, so a submitted job starts without waiting for a polling tick.
pub async fn claim(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> ApiResult<ClaimResponse> {
    let agent: AgentId = parse_id(&id, "agent")?;
    check_node(&s, &who, NodeOf::Agent(agent)).await?;
    check_samples(&req.gpus)?;
    headroom_shared::api::bounds::WAIT_MS
        .check(req.wait_ms)
        .map_err(|m| ApiError::invalid("wait_ms", m))?;
    let wait = Duration::from_millis(req.wait_ms).min(s.config.long_poll);
    let deadline = tokio::time::Instant::now() + wait;
    let mut fresh = Some(req.gpus);
    let mut node: Option<String> = None;
    loop {
        // Only changes that may give this claim something to do wake it again; its node is
        // known from its first round.
        let seen = s.changes.work_seen(node.as_deref());
        // Each round that reads the store waits its turn (`crate::admission`); the wait for
        // a change between rounds holds none. The first round not given its turn in time
        // answers busy; a later one waits to the long-poll's end and then answers that
        // nothing came, as that end does: a claim is answered within its long-poll and one
        // turn's wait, inside the time its client gives it.
        let within = match node {
            None => s.admission.wait(),
            Some(_) => deadline.saturating_duration_since(tokio::time::Instant::now()),
        };
        let turn = match s.admission.claim_turn(within).await {
            Ok(turn) => turn,
            // A later round: its earlier one leased nothing and found the plan known.
            Err(_) if node.is_some() => {
                return Ok(ApiJson(ClaimResponse {
                    leases: vec![],
                    cancel: vec![],
                    requeue: vec![],
                    plan: req.known_plan.clone().unwrap_or_default(),
                }));
            }
            Err(busy) => {
                s.metrics.refused(
                    headroom_shared::routes::CLAIM.path,
                    ErrorCode::Busy.status(),
                );
                return Err(busy.into());
            }
        };
        let timer = std::time::Instant::now();
        let claimed = s
            .store
            .claim_jobs(ClaimInput {
                agent,
                gpus: fresh.take(),
                max: req.max,
                lease_ttl_ms: s.config.lease_ttl.as_millis() as u64,
                reserve_after_ms: s.config.reserve_after.as_millis() as u64,
                half_life_ms: s.config.half_life.as_millis() as u64,
                watching: req.watching.clone(),
            })
            .await?;
        s.metrics.observe_claim(timer.elapsed().as_secs_f64());
        drop(turn);
        let (cancel, requeue) = (claimed.cancel, claimed.requeue);
        let recheck = claimed.recheck_in_ms.map(Duration::from_millis);
        let plan = claimed.plan.to_string();
        let now = tokio::time::Instant::now();
        let mut leases = claimed.leases;
        if s.auth.enabled() {
            // Its leases' reports are checked against this node without reading it again.
            for lease in &leases {
                s.owners
                    .remember(NodeOf::Attempt(lease.attempt), &claimed.node);
            }
        } else {
            // Every local account is the anonymous admin: no job runs as a mapped user (a
            // mapping a store kept from a run with tokens included), only as the agent's
            // own or default one.
            for lease in &mut leases {
                lease.run_as = None;
            }
        }
        if !leases.is_empty()
            || !cancel.is_empty()
            || !requeue.is_empty()
            || req.known_plan.as_deref() != Some(plan.as_str())
            || now >= deadline
            || s.changes.is_closing()
        {
            return Ok(ApiJson(ClaimResponse {
                leases,
                cancel,
                requeue,
                plan,
            }));
        }
        let first = node.is_none();
        let node = node.get_or_insert(claimed.node);
        let seen = if first {
            // An end during the first round may have been this node's: look again now.
            match s.changes.with_node(seen, node) {
                Some(seen) => seen,
                None => continue,
            }
        } else {
            seen
        };
        // A run with memory phases reaching or leaving its peak is no store change: the
        // claim looks again then by itself.
        let wait = recheck.map_or(deadline - now, |r| r.min(deadline - now));
        s.changes
            .wait_for_work(node, seen, wait, OTHER_NODES_ENDS)
            .await;
    }
}

pub async fn heartbeat(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<HeartbeatRequest>,
) -> ApiResult<HeartbeatResponse> {
    let agent: AgentId = parse_id(&id, "agent")?;
    check_node(&s, &who, NodeOf::Agent(agent)).await?;
    check_samples(&req.gpus)?;
    // Checked whole first: a refused heartbeat writes nothing. Telemetry is stored first
    // (idempotent: a batch the agent sends again after a lost answer is stored once), so a
    // sample naming a GPU the node lacks refuses the heartbeat before leases are renewed.
    check_telemetry(&req.telemetry)?;
    if req.telemetry_dropped > 0 {
        tracing::debug!(%agent, dropped = req.telemetry_dropped, "agent dropped telemetry samples");
    }
    s.store.record_telemetry(agent, req.telemetry).await?;
    let r = s
        .store
        .renew_leases(Renewal {
            agent,
            attempts: req.attempts,
            gpus: req.gpus,
            lease_ttl_ms: s.config.lease_ttl.as_millis() as u64,
        })
        .await?;
    if !req.released.is_empty() {
        s.store.release_attempts(agent, &req.released).await?;
    }
    Ok(ApiJson(HeartbeatResponse {
        cancel: r.cancel,
        requeue: r.requeue,
        // A stale token refuses the whole heartbeat (409) instead.
        stale: vec![],
        plan: r.plan.to_string(),
    }))
}

pub async fn start(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<StartReport>,
) -> ApiResult<Ack> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    check_node(&s, &who, NodeOf::Attempt(attempt)).await?;
    let started = s
        .store
        .start_attempt(
            attempt,
            req.fence,
            req.pid,
            req.started_at.timestamp_millis(),
        )
        .await?;
    if let Some(started) = started {
        observe_queue_wait(&s, started, req.started_at);
    }
    Ok(ApiJson(Ack { ok: true }))
}

/// Queue wait of fresh submissions: first attempts only (a retry waited after its earlier
/// attempt, not since the submission), once each (not again for a repeated report).
fn observe_queue_wait(s: &AppState, started: Started, at: DateTime<Utc>) {
    if started.number == 1 {
        let waited_ms = at.timestamp_millis() - started.submitted_at;
        s.metrics.observe_submit_to_start(waited_ms as f64 / 1000.0);
    }
}

pub async fn finish(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<FinishReport>,
) -> ApiResult<FinishResponse> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    check_node(&s, &who, NodeOf::Attempt(attempt)).await?;
    record_end(&s, attempt, req, "its agent").await
}

/// Checks and records an attempt's end, reported by `by` (its agent or its supervisor).
pub(super) async fn record_end(
    s: &AppState,
    attempt: AttemptId,
    req: FinishReport,
    by: &str,
) -> ApiResult<FinishResponse> {
    check_samples(&req.gpus)?;
    super::telemetry::check_measurements(&req.measurements)?;
    let failure = req.failure;
    let started_at = req.started.map(|st| st.started_at);
    let Finished { job_state, started } = s.store.end_attempt(attempt, req).await?;
    s.owners.forget(NodeOf::Attempt(attempt));
    if let (Some(started), Some(at)) = (started, started_at) {
        observe_queue_wait(s, started, at);
    }
    tracing::info!(%attempt, failure = ?failure, %job_state, "attempt finished, reported by {by}");
    Ok(ApiJson(FinishResponse { job_state }))
}

pub async fn hand_back(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<HandBackRequest>,
) -> ApiResult<Ack> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    check_node(&s, &who, NodeOf::Attempt(attempt)).await?;
    check_samples(&req.gpus)?;
    s.store.hand_back(attempt, req.fence, &req.gpus).await?;
    s.owners.forget(NodeOf::Attempt(attempt));
    tracing::info!(%attempt, reason = %req.reason, "lease handed back");
    Ok(ApiJson(Ack { ok: true }))
}

pub async fn append_log(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogChunkQuery>,
    body: Bytes,
) -> ApiResult<LogAppended> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    check_node(&s, &who, NodeOf::Attempt(attempt)).await?;
    append(&s, attempt, q, body).await
}

/// Appends a fenced chunk of an attempt's log (from its agent or its supervisor).
pub(super) async fn append(
    s: &AppState,
    attempt: AttemptId,
    q: LogChunkQuery,
    body: Bytes,
) -> ApiResult<LogAppended> {
    s.store.check_log_fence(attempt, q.fence).await?;
    let max = s.config.max_log_bytes;
    let len = match s
        .store
        .append_log(attempt, q.offset, body.to_vec(), max)
        .await
    {
        Err(crate::store::StoreError::Invalid { ref field, .. }) if field == "offset" => {
            // An attempt that ran across an upgrade: the bytes before this chunk are in the
            // file an earlier version kept. Taken into the store first, then this chunk.
            let dir = s.config.data_dir.clone();
            let earlier = tokio::task::spawn_blocking(move || {
                crate::logs::read_legacy(&dir, attempt, 0, u64::MAX)
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(e.to_string()))?;
            if !earlier.is_empty() {
                s.store.append_log(attempt, 0, earlier, max).await?;
            }
            s.store
                .append_log(attempt, q.offset, body.to_vec(), max)
                .await?
        }
        other => other?,
    };
    Ok(ApiJson(LogAppended { len }))
}
