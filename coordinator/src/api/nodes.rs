//! Nodes, their GPUs and concurrency plans.

use axum::Extension;
use axum::extract::State;
use headroom_shared::api::{Ack, NodeView, Principal, Released, SetPlanRequest};

use super::{ApiError, ApiJson, ApiPath, ApiResult, AppState};

pub async fn list(State(s): State<AppState>) -> ApiResult<Vec<NodeView>> {
    let alive = s.config.lease_ttl.as_millis() as u64;
    Ok(ApiJson(s.store.list_nodes(alive).await?))
}

/// Changes a node's plan at run time: new placements use it at once, nothing restarts.
pub async fn set_plan(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<SetPlanRequest>,
) -> ApiResult<NodeView> {
    let plan = s.store.set_plan(&name, &req.plan).await?;
    tracing::info!(node = %name, %plan, "plan changed");
    let alive = s.config.lease_ttl.as_millis() as u64;
    s.store
        .list_nodes(alive)
        .await?
        .into_iter()
        .find(|n| n.name == name)
        .map(ApiJson)
        .ok_or_else(|| {
            ApiError::new(
                headroom_shared::api::ErrorCode::NotFound,
                format!("no node {name}"),
            )
        })
}

/// Lifts a GPU's quarantine after a person looked at what was left on it.
pub async fn release_gpu(
    State(s): State<AppState>,
    ApiPath((name, gpu)): ApiPath<(String, u32)>,
) -> ApiResult<Released> {
    let released = s.store.release_gpu(&name, gpu).await?;
    tracing::info!(node = %name, gpu, released, "quarantine lifted by hand");
    Ok(ApiJson(Released { released }))
}

/// Lets another agent instance register as the node at once: for a node whose agent is gone
/// for good (its machine died) or must make way. Its running attempts are recorded lost when
/// the next agent registers.
pub async fn takeover(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Ack> {
    s.store.takeover(&name).await?;
    tracing::warn!(node = %name, by = %who.name, "node takeover allowed by an admin");
    Ok(ApiJson(Ack { ok: true }))
}
