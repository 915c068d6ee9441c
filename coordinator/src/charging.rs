//! Charges ended runs to their users' fair-share ledgers
//! ([`crate::store::Store::charge_usage`]): claims count the runs not yet charged as they
//! are, so this only keeps that set small. Every replica runs it; each run is charged once
//! (the rows are locked, skipping those another replica holds).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::AppState;

/// Runs charged per transaction.
const BATCH: u32 = 256;
/// How often it looks when the last round charged nothing.
const IDLE: Duration = Duration::from_secs(5);

/// Charges as runs end until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let half_life = state.config.half_life.as_millis() as u64;
    loop {
        let charged = match state.store.charge_usage(half_life, BATCH).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("charging usage: {e}");
                0
            }
        };
        if charged == BATCH as usize {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(IDLE) => {}
        }
    }
}
