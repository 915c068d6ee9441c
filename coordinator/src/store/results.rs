//! What runs achieved: an attempt's metrics as its supervisor reports them while it runs
//! (fenced in `leases`) and with its end, early stopping's decision at each rung it reaches, the series behind
//! learning curves, and the outbox of results to write to a tracking server.

use headroom_shared::api::AttemptSeries;
use headroom_shared::results::{AttemptMetrics, RungDecision};
use headroom_shared::{AttemptId, ExperimentId};

use super::tx::{AttemptResults, Tx};
use super::{Millis, Result, StoreError};
use crate::changes::Change;
use crate::early_stop;

/// What an attempt's end adds: its metrics as the end reports them (kept, and its rung
/// values entered in the ledger for the attempts after it; decisions are taken only while
/// it runs), and its results due to its tracking server. Metrics that break their bounds
/// are left out, never the end.
/// `read`: what the end read of the attempt's results settings before it wrote.
pub(super) async fn at_end(
    tx: &mut dyn Tx,
    attempt: &str,
    read: &AttemptResults,
    metrics: Option<&AttemptMetrics>,
    now: Millis,
) -> Result<()> {
    let AttemptResults {
        experiment,
        spec: results,
        decided,
    } = read;
    match metrics.map(|m| (m, m.check())) {
        Some((_, Err(why))) => {
            tracing::warn!(%attempt, "the end's metrics are left out: {why}");
        }
        Some((m, Ok(()))) => {
            tx.set_attempt_metrics(attempt, &m.finals, m.ignored, &m.series)
                .await?;
            if results.as_ref().is_some_and(|r| r.early_stop.is_some()) {
                // Up to the rung that stopped it, if one did: it ran on a little after.
                let last = decided.iter().find(|d| d.pruned).map(|d| d.rung);
                for at in m.rungs.iter().filter(|r| last.is_none_or(|l| r.rung <= l)) {
                    tx.insert_rung_value(experiment, attempt, at).await?;
                }
            }
        }
        None => {}
    }
    if results.as_ref().is_some_and(|r| r.tracking.is_some()) {
        tx.set_tracking(attempt, Some("waiting to be written"), Some(now))
            .await?;
    }
    Ok(())
}

/// [`at_end`] of an attempt recorded lost: no metrics came with its end.
pub(super) async fn at_loss(tx: &mut dyn Tx, attempt: &str, now: Millis) -> Result<()> {
    let Some(read) = tx.results_of_attempt(attempt).await? else {
        return Err(StoreError::not_found("attempt", attempt));
    };
    at_end(tx, attempt, &read, None, now).await
}

/// Keeps `metrics` as the running attempt's, and decides the rungs it reached since its
/// last report, in order, up to the first that stops it; that one (or an earlier stop) is
/// returned. Each rung's value enters the experiment's ledger whatever is decided.
pub(super) async fn record(
    tx: &mut dyn Tx,
    attempt: &str,
    metrics: &AttemptMetrics,
) -> Result<Option<RungDecision>> {
    tx.set_attempt_metrics(attempt, &metrics.finals, metrics.ignored, &metrics.series)
        .await?;
    let Some(AttemptResults {
        experiment,
        spec: results,
        mut decided,
    }) = tx.results_of_attempt(attempt).await?
    else {
        return Err(StoreError::not_found("attempt", attempt));
    };
    let Some(rule) = results.and_then(|r| r.early_stop) else {
        return Ok(None);
    };
    if let Some(stop) = decided.iter().find(|d| d.pruned) {
        return Ok(Some(*stop));
    }
    let new: Vec<_> = metrics.rungs.iter().skip(decided.len()).copied().collect();
    if new.is_empty() {
        return Ok(None);
    }
    let mut stop = None;
    for at in new {
        let others = tx.rung_values(&experiment, at.rung, attempt).await?;
        tx.insert_rung_value(&experiment, attempt, &at).await?;
        let d = early_stop::decide(&rule, at, &others);
        decided.push(d);
        if d.pruned {
            stop = Some(d);
            break;
        }
    }
    tx.set_attempt_rungs(attempt, &decided).await?;
    Ok(stop)
}

/// Every attempt's series of an experiment that reported metrics (only `metric`, where
/// given), each thinned to `points`.
pub(super) async fn series(
    tx: &mut dyn Tx,
    id: ExperimentId,
    metric: Option<String>,
    points: usize,
) -> Result<Vec<AttemptSeries>> {
    // An unknown experiment is a 404, not an empty list.
    tx.experiment_row(&id.to_string())
        .await?
        .ok_or_else(|| StoreError::not_found("experiment", id))?;
    tx.experiment_series(&id.to_string(), metric.as_deref())
        .await?
        .into_iter()
        .map(|mut r| {
            if let Some(m) = &metric {
                r.finals.retain(|k, _| k == m);
            }
            for s in r.series.values_mut() {
                *s = headroom_shared::results::thin(s, points);
            }
            Ok(AttemptSeries {
                attempt: super::rows::parse(&r.attempt, "attempt id")?,
                job: super::rows::parse(&r.job, "job id")?,
                index: u64::try_from(r.index).unwrap_or(0),
                number: u32::try_from(r.number).unwrap_or(0),
                params: r.params,
                state: super::rows::parse(&r.state, "job state")?,
                live: r.phase != "ended",
                finals: r.finals,
                series: r.series,
                ignored: r.ignored,
                rungs: r.rungs,
            })
        })
        .collect()
}

/// Claims attempts whose tracking is due, for `hold_ms` (another replica takes them after).
pub(super) async fn claim_tracking(
    tx: &mut dyn Tx,
    now: Millis,
    hold_ms: i64,
    limit: u32,
) -> Result<(Vec<(AttemptId, u32)>, Change)> {
    let claimed = tx
        .claim_tracking(now, now.saturating_add(hold_ms), limit)
        .await?
        .into_iter()
        .map(|(id, tries)| Ok((super::rows::parse(&id, "attempt id")?, tries)))
        .collect::<Result<Vec<_>>>()?;
    Ok((claimed, Change::None))
}

/// Records where an attempt's results went (or why not), and when to try again (`None`:
/// done).
pub(super) async fn set_tracking(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    note: String,
    due: Option<Millis>,
) -> Result<((), Change)> {
    tx.set_tracking(&attempt.to_string(), Some(&note), due)
        .await?;
    Ok(((), Change::None))
}
