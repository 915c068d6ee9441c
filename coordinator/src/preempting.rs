//! Preemption rounds ([`crate::store::Store::preempt`]): every few seconds, running jobs of
//! `preemptible` experiments are asked to stop after their checkpoint signal and requeue for
//! waiting jobs of users under their share (or of higher priority). Every replica runs it;
//! a round takes a lock, so two never make room for the same job.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::store::PreemptInput;

/// How often a round looks (a round with no preemptible job running is one read).
const EVERY: Duration = Duration::from_secs(2);

/// Runs rounds until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let input = PreemptInput {
        half_life_ms: state.config.half_life.as_millis() as u64,
        interval_ms: state.config.preempt_interval.as_millis() as u64,
    };
    loop {
        if let Err(e) = state.store.preempt(input).await {
            tracing::warn!("preemption round: {e}");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}
