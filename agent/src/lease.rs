//! One lease, from launch to report: runs the attempt under the supervisor with its start
//! report and log shipping alongside, then journals its end (see [`crate::outcomes`]) and
//! reports it, retrying until the coordinator has heard it (a draining agent gives up after
//! a while: the lease then expires, and the next run reports the journalled end).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use headroom_shared::api::{FinishReport, Lease, StartReport};
use headroom_shared::{AttemptId, FailureClass};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::sync::CancellationToken;

use crate::agent::{Shared, sample};
use crate::attempts::{StopReason, StopSignal};
use crate::backoff::Backoff;
use crate::client::{Client, ClientError};
use crate::outcomes::Outcome;
use crate::supervisor::{self, AttemptEnd, Launch};

/// Tries at reporting an end once the agent drains (about half a minute with the backoff).
const DRAINING_TRIES: u32 = 10;

pub(crate) async fn run(
    shared: Arc<Shared>,
    lease: Lease,
    stop: StopSignal,
    draining: CancellationToken,
) {
    let attempt = lease.attempt;
    let fence = lease.fence;
    let log_path = shared
        .cfg
        .data_dir
        .join("logs")
        .join(format!("{attempt}.log"));
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<u32>();
    let start_client = shared.client.clone();
    let reporter = tokio::spawn(async move {
        if let Ok(pid) = pid_rx.await {
            let report = StartReport {
                fence,
                pid,
                started_at: Utc::now(),
            };
            if let Err(e) = start_client.start(attempt, &report).await {
                tracing::warn!(%attempt, "start report failed: {e}");
            }
        }
    });
    let ship_stop = CancellationToken::new();
    let shipper = tokio::spawn(ship_log(
        shared.client.clone(),
        attempt,
        fence,
        log_path.clone(),
        ship_stop.clone(),
    ));
    let mut env = lease.env;
    // The agent's own marker wins over anything the job sets: the restart sweep finds this
    // agent's processes by it.
    env.insert(crate::sweep::AGENT_VAR.to_string(), shared.scope.clone());
    let gpus = lease.gpus.clone();
    let launch = Launch {
        attempt,
        job: lease.job,
        argv: lease.argv,
        env,
        params: lease.params,
        gpus: lease.gpus,
        timeout: lease.timeout_ms.map(Duration::from_millis),
        log_path: log_path.clone(),
        workdir: None,
    };
    let end: AttemptEnd = supervisor::run_attempt(
        launch,
        shared.backend.clone(),
        &shared.cfg.supervisor,
        stop.cancel.clone(),
        move |pid| {
            let _ = pid_tx.send(pid);
        },
    )
    .await;
    let _ = reporter.await;
    ship_stop.cancel();
    let _ = shipper.await;

    let mut failure = end.failure;
    let mut log_tail = end.log_tail;
    if failure == Some(FailureClass::Cancelled) {
        match stop.reason() {
            Some(StopReason::User) => {}
            Some(StopReason::LeaseLost) => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped: the lease could not be renewed in time\n");
            }
            // Retried as the job's policy says for `lost`, now rather than at lease expiry.
            Some(StopReason::Shutdown) | None => {
                failure = Some(FailureClass::Lost);
                log_tail.push_str("\n[headroom] stopped because the agent shut down\n");
            }
        }
    }
    let report = FinishReport {
        fence,
        failure,
        exit_code: end.exit_code,
        signal: end.signal,
        ended_at: end.ended_at,
        peak_mem_mib: end.peak_mem_mib,
        peak_source: Some(end.peak_source),
        cleanup_ms: end.cleanup_ms,
        cleanup_verified: end.cleanup_verified,
        unverified: end.unverified.clone(),
        contaminated: end.contaminated,
        log_tail,
        gpus: sample(&shared.backend).await,
    };
    // Journalled before anything else: an agent killed from here on reports it on its next
    // run rather than leaving the attempt to be recorded lost and run again.
    let outcome = Outcome { attempt, report };
    let journal = shared.outcomes.clone();
    let entry = outcome.clone();
    match tokio::task::spawn_blocking(move || journal.write(&entry)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(%attempt, "cannot journal the outcome (reporting it anyway): {e}")
        }
        Err(e) => tracing::warn!(%attempt, "outcome journal task failed: {e}"),
    }
    // Leave the running set first (the next claim must not watch this attempt any more),
    // keeping the GPUs quarantined if cleanup was not verified.
    let unverified = (!end.cleanup_verified).then(|| (gpus, end.held_by.clone()));
    shared.attempts.end(attempt, unverified).await;
    shared.metrics.attempt_ended(attempt, &outcome.report);
    if let Some(pause) = crate::outcomes::test_pause_before_report() {
        tokio::time::sleep(pause).await;
    }
    report_outcome(&shared, &outcome, &draining).await;
}

/// Reports an attempt's end, retrying until the coordinator has answered it (once
/// `giving_up` is cancelled, for a few more tries), then takes it out of the journal; one
/// left unanswered stays there for the agent's next run.
pub(crate) async fn report_outcome(
    shared: &Shared,
    outcome: &Outcome,
    giving_up: &CancellationToken,
) {
    let (attempt, report) = (outcome.attempt, &outcome.report);
    // The slot frees on the coordinator only when it hears of the end, so keep trying.
    let mut backoff = Backoff::coordinator();
    loop {
        match shared.client.finish(attempt, report).await {
            Ok(resp) => {
                tracing::info!(%attempt, failure = ?report.failure, job_state = %resp.job_state, "attempt reported");
                break;
            }
            Err(ClientError::Stale(m)) => {
                tracing::warn!(%attempt, "finish refused, the lease is no longer ours: {m}");
                break;
            }
            Err(e) if e.is_transient() => {
                if giving_up.is_cancelled() && backoff.tries() >= DRAINING_TRIES {
                    tracing::warn!(%attempt, "giving up reporting the end (journalled for the next run): {e}");
                    return;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
            // Refused for good: the same report would be refused again on the next run.
            Err(e) => {
                tracing::error!(%attempt, "finish refused: {e}");
                break;
            }
        }
    }
    let journal = shared.outcomes.clone();
    match tokio::task::spawn_blocking(move || journal.remove(attempt)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(%attempt, "cannot clear the journalled outcome: {e}"),
        Err(e) => tracing::warn!(%attempt, "outcome journal task failed: {e}"),
    }
}

/// Ships the attempt's log to the coordinator as it grows, and the rest at the end.
async fn ship_log(
    client: Client,
    attempt: AttemptId,
    fence: i64,
    path: PathBuf,
    stop: CancellationToken,
) {
    const CHUNK: usize = 1 << 20;
    let mut offset: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        // Ship everything there is; at the end, keep going until the file is drained.
        loop {
            let chunk = match read_from(&path, offset, CHUNK).await {
                Ok(c) => c,
                Err(_) => break,
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len() as u64;
            match client.append_log(attempt, fence, offset, chunk).await {
                Ok(()) => offset += n,
                Err(ClientError::Stale(_)) => return,
                Err(e) => {
                    tracing::debug!(%attempt, "log shipping failed, will retry: {e}");
                    break;
                }
            }
            if n < CHUNK as u64 {
                break;
            }
        }
        if last {
            return;
        }
    }
}

async fn read_from(path: &PathBuf, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf).await?;
    Ok(buf)
}
