//! Alert subscriptions (`headroom alerts`): a user subscribes to their own jobs' events and
//! the lab's machines'; an admin may subscribe lab-wide. Each sees and removes their own
//! (an admin, every one); a webhook's URL is shown by its scheme and host only.

use axum::Extension;
use axum::extract::State;
use headroom_shared::api::alerts::{AlertsView, NewSubscription, SubscriptionView};
use headroom_shared::api::{ErrorCode, Principal, Role};

use super::{ApiError, ApiJson, ApiPath, ApiResult, AppState, check_owner};

/// Deliveries a listing shows.
const LISTED: u32 = 200;
/// Subscriptions one user may keep.
const MAX_PER_USER: usize = 50;

fn owner_filter(who: &Principal) -> Option<String> {
    (who.role != Role::Admin).then(|| who.name.clone())
}

fn redacted(mut v: SubscriptionView) -> SubscriptionView {
    v.target = v.target.redacted();
    v
}

pub async fn list(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
) -> ApiResult<AlertsView> {
    let mut view = s.store.alerts(owner_filter(&who), LISTED).await?;
    view.subscriptions = view.subscriptions.into_iter().map(redacted).collect();
    Ok(ApiJson(view))
}

pub async fn subscribe(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(mut req): ApiJson<NewSubscription>,
) -> ApiResult<SubscriptionView> {
    req.on.sort();
    req.on.dedup();
    if req.on.is_empty() {
        return Err(ApiError::invalid(
            "on",
            "name at least one event (experiment-ended, failures-in-a-row, gpu-quarantined, \
             node-lost, job-pending, job-pruned, job-preempted)",
        ));
    }
    if req.lab_wide && who.role != Role::Admin {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "lab_wide: only an admin may hear of every user's jobs (this token: `{}`, role {})",
                who.name, who.role
            ),
        ));
    }
    s.config
        .alerts
        .check_target(&req.target)
        .map_err(|(field, m)| ApiError::invalid(field, m))?;
    if s.store.subscriptions(Some(who.name.clone())).await?.len() >= MAX_PER_USER {
        return Err(ApiError::invalid(
            "on",
            format!(
                "`{}` keeps {MAX_PER_USER} subscriptions already: remove one first",
                who.name
            ),
        ));
    }
    let view = SubscriptionView {
        id: uuid::Uuid::new_v4().to_string(),
        owner: who.name.clone(),
        on: req.on,
        target: req.target,
        lab_wide: req.lab_wide,
        created_at: chrono::Utc::now(),
    };
    let view = s.store.subscribe(view).await?;
    tracing::info!(id = %view.id, owner = %view.owner, target = %view.target.redacted(), "alerts subscribed");
    Ok(ApiJson(redacted(view)))
}

pub async fn unsubscribe(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<SubscriptionView> {
    let not_found = || ApiError::new(ErrorCode::NotFound, format!("no alert subscription {id}"));
    let view = s
        .store
        .subscriptions(None)
        .await?
        .into_iter()
        .find(|v| v.id == id)
        .ok_or_else(not_found)?;
    check_owner(&who, &view.owner, "this subscription")?;
    s.store.unsubscribe(id.clone()).await?;
    tracing::info!(id = %id, owner = %view.owner, "alerts unsubscribed");
    Ok(ApiJson(redacted(view)))
}
