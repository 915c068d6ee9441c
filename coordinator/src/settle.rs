//! Settles a study's waits (`after`) after the changes that move them: each job that ended
//! (or ran again) while others wait for it noted itself in its own transaction; this task
//! counts the waiting jobs' waits again in transactions of their own
//! ([`crate::store::Store::settle_waits`]), so a job's end never locks another job. Every
//! replica runs it; settling is idempotent under each waiting job's lock.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::AppState;

/// Notes read per round.
const BATCH: u32 = 256;
/// How long it waits for a change before looking anyway (another replica's note, a retry
/// after an error).
const IDLE: Duration = Duration::from_secs(1);

/// Settles notes as they come until `shutdown`.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    loop {
        let seen = state.changes.version();
        let settled = match round(&state).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("settling waits: {e}");
                0
            }
        };
        if settled > 0 {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = state.changes.wait_past(seen, IDLE) => {}
        }
    }
}

/// One round: the oldest notes, each job's settled; how many jobs' notes were. A job whose
/// settling fails is said and left for the next round; the others' go on.
async fn round(state: &AppState) -> Result<usize, crate::store::StoreError> {
    let due = state.store.wait_changes_due(BATCH).await?;
    let mut settled = 0;
    for (job, ids) in due {
        match state.store.settle_waits(job, ids).await {
            Ok(counted) => {
                settled += 1;
                tracing::debug!(%job, counted, "waits settled");
            }
            Err(e) => tracing::warn!(%job, "settling the waits on this job: {e}"),
        }
    }
    Ok(settled)
}
