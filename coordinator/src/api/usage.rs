//! The usage report: what each user or experiment used over a window, and every user's
//! fair-share standing (`headroom usage`, the dashboard's usage view).

use axum::extract::State;
use headroom_shared::api::usage::{UsageQuery, UsageReport};

use super::{ApiError, ApiJson, ApiQuery, ApiResult, AppState};

/// How far back a report reads when `since` is not given.
const DEFAULT_SINCE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

pub async fn usage(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> ApiResult<UsageReport> {
    let back = match q.since.as_deref() {
        None => DEFAULT_SINCE,
        Some(d) => {
            headroom_shared::settings::duration(d).map_err(|m| ApiError::invalid("since", m))?
        }
    };
    let from = chrono::Utc::now().timestamp_millis()
        - i64::try_from(back.as_millis()).unwrap_or(i64::MAX / 2);
    let half_life = s.config.half_life.as_millis() as u64;
    Ok(ApiJson(s.store.usage_report(from, q.by, half_life).await?))
}
