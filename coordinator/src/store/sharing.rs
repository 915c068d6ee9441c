//! Attempts that shared their GPUs: the store reads, for the attempts a caller asked for,
//! those that ran on the same nodes meanwhile, and `crate::sharing` labels them.

use std::collections::BTreeMap;

use headroom_shared::api::AttemptView;

use super::Result;
use super::tx::{AttemptsWhere, Tx};

/// Sets `shared` and `sharing` on `views`: one read per node they ran on.
pub(super) async fn label(tx: &mut dyn Tx, views: &mut [AttemptView]) -> Result<()> {
    let now = chrono::Utc::now();
    // Per node, the span of time the attempts ran in.
    let mut spans: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for v in views.iter() {
        let Some(started) = v.started_at else {
            continue;
        };
        let (from, to) = (
            started.timestamp_millis(),
            v.ended_at.unwrap_or(now).timestamp_millis(),
        );
        let span = spans.entry(v.node.clone()).or_insert((from, to));
        *span = (span.0.min(from), span.1.max(to));
    }
    let mut beside = Vec::new();
    for (node, (from, to)) in &spans {
        let which = AttemptsWhere::RanOn {
            node,
            from: *from,
            to: *to,
        };
        beside.extend(tx.attempt_views(which).await?);
    }
    crate::sharing::label(views, &beside, now);
    Ok(())
}
