//! Alerts: subscriptions; events kept in the outbox by the transaction that made them happen
//! (`record`), each with a delivery to every subscription that wants it; deliveries claimed
//! and settled; and the sweep that reads what no single transaction can tell (the notes of
//! jobs' ends in order: an experiment's end, failures in a row; a node's loss; a long wait).

use headroom_shared::JobState;
use headroom_shared::api::alerts::{AlertKind, AlertsView, DeliveryState, SubscriptionView};
use headroom_shared::api::{DriftDirection, DriftView};
use serde_json::json;

use super::tx::{DeliveryRow, NewAlertEvent, Tx};
use super::{Millis, Result, StoreError};
use crate::changes::Change;

/// Notes read per sweep transaction.
const NOTES_PER_SWEEP: u32 = 500;
/// Long waits told per sweep transaction.
const WAITS_PER_SWEEP: u32 = 100;

/// What a sweep is given.
#[derive(Clone, Copy, Debug)]
pub struct AlertSweep {
    /// A node silent this long is lost.
    pub lost_after_ms: u64,
    /// A job queued this long is told of (`None`: never).
    pub pending_after_ms: Option<u64>,
    /// A quarantine this long is told again (`None`: never).
    pub quarantine_after_ms: Option<u64>,
    /// A GPU's drift that lasts this long is told (`None`: drift is not looked at).
    pub drift_after_ms: Option<u64>,
    /// Whether this sweep looks at drift (it reads every node: not every sweep does).
    pub check_drift: bool,
    /// Failed jobs in a row of one experiment that are told of.
    pub failure_streak: u32,
    /// Settled deliveries and their events older than this go.
    pub keep_ms: u64,
}

/// How a delivery's try ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Delivered,
    /// Tried again at `at`.
    Retry {
        error: String,
        at: Millis,
    },
    /// Given up: a dead letter.
    Dead {
        error: String,
    },
}

/// Keeps an event and a delivery of it to every subscription that wants it, in the caller's
/// transaction: it is kept if and only if what it tells of is.
pub(super) async fn record(tx: &mut dyn Tx, event: NewAlertEvent) -> Result<i64> {
    let id = tx.insert_alert_event(&event).await?;
    for sub in tx.subscriptions(None).await? {
        if sub.wants(event.kind, event.subject.as_deref()) {
            let key = uuid::Uuid::new_v4().to_string();
            tx.insert_delivery(&key, id, &sub.id, event.at).await?;
        }
    }
    Ok(id)
}

pub(super) async fn subscribe(
    tx: &mut dyn Tx,
    view: SubscriptionView,
) -> Result<(SubscriptionView, Change)> {
    tx.insert_subscription(&view).await?;
    Ok((view, Change::None))
}

pub(super) async fn subscriptions(
    tx: &mut dyn Tx,
    owner: Option<String>,
) -> Result<Vec<SubscriptionView>> {
    tx.subscriptions(owner.as_deref()).await
}

pub(super) async fn unsubscribe(tx: &mut dyn Tx, id: String) -> Result<((), Change)> {
    if tx.delete_subscription(&id).await? == 0 {
        return Err(StoreError::not_found("alert subscription", id));
    }
    Ok(((), Change::None))
}

pub(super) async fn view(tx: &mut dyn Tx, owner: Option<String>, limit: u32) -> Result<AlertsView> {
    Ok(AlertsView {
        subscriptions: tx.subscriptions(owner.as_deref()).await?,
        deliveries: tx.deliveries(owner.as_deref(), limit).await?,
    })
}

pub(super) async fn claim(
    tx: &mut dyn Tx,
    now: Millis,
    hold_ms: i64,
    limit: u32,
) -> Result<(Vec<(String, u32)>, Change)> {
    let due = tx
        .claim_deliveries(now, now.saturating_add(hold_ms), limit)
        .await?;
    Ok((due, Change::None))
}

pub(super) async fn delivery(tx: &mut dyn Tx, id: String) -> Result<DeliveryRow> {
    tx.delivery(&id)
        .await?
        .ok_or_else(|| StoreError::not_found("alert delivery", id))
}

/// Records how the try a claim made at `tries` ended; false (nothing written) when another
/// claim has taken the delivery since (this one's hold ran out).
pub(super) async fn settle(
    tx: &mut dyn Tx,
    id: String,
    tries: u32,
    outcome: DeliveryOutcome,
    now: Millis,
) -> Result<(bool, Change)> {
    let (state, due, error, at) = match &outcome {
        DeliveryOutcome::Delivered => (DeliveryState::Delivered, None, None, Some(now)),
        DeliveryOutcome::Retry { error, at } => (
            DeliveryState::Pending,
            Some(*at),
            Some(error.as_str()),
            None,
        ),
        DeliveryOutcome::Dead { error } => (DeliveryState::Dead, None, Some(error.as_str()), None),
    };
    let settled = tx.set_delivery(&id, tries, state, due, error, at).await?;
    Ok((settled, Change::None))
}

/// A GPU quarantined by an ended attempt.
pub(super) async fn quarantined(
    tx: &mut dyn Tx,
    node: &str,
    gpu: u32,
    attempt: &str,
    reason: &str,
    now: Millis,
) -> Result<()> {
    record(
        tx,
        NewAlertEvent {
            kind: AlertKind::GpuQuarantined,
            subject: None,
            summary: format!("GPU {gpu} of node {node} quarantined: {reason}"),
            details: json!({"node": node, "gpu": gpu, "attempt": attempt, "reason": reason}),
            at: now,
        },
    )
    .await
    .map(drop)
}

/// A running job asked to stop and requeue for another's.
pub(super) async fn preempted(tx: &mut dyn Tx, p: &super::Preempted, now: Millis) -> Result<()> {
    let Some((user, experiment, name)) = tx.job_owner(&p.job).await? else {
        return Ok(());
    };
    record(
        tx,
        NewAlertEvent {
            kind: AlertKind::JobPreempted,
            subject: Some(user),
            summary: format!(
                "job {} of {name} preempted on node {} GPU {} for job {}; it is requeued",
                p.job, p.node, p.gpu, p.for_job
            ),
            details: json!({
                "experiment": experiment, "experiment_name": name, "job": p.job,
                "attempt": p.attempt, "node": p.node, "gpu": p.gpu, "for_job": p.for_job,
            }),
            at: now,
        },
    )
    .await
    .map(drop)
}

/// One sweep: the notes of jobs' ends in order, lost nodes and long waits, and old
/// deliveries pruned; how many events it kept. One replica's at a time.
pub(super) async fn sweep(tx: &mut dyn Tx, input: AlertSweep) -> Result<(usize, Change)> {
    tx.lock_alerts().await?;
    let now = tx.clock().await?;
    let mut events = 0;
    let notes = tx.alert_notes(NOTES_PER_SWEEP).await?;
    // Each experiment's notes in order, then whether it ended (its jobs as committed now).
    let mut touched: Vec<String> = Vec::new();
    for note in &notes {
        if !touched.contains(&note.experiment) {
            touched.push(note.experiment.clone());
        }
    }
    for experiment in &touched {
        let Some(mut e) = tx.experiment_alerts(experiment).await? else {
            continue;
        };
        let mut any_end = false;
        for note in notes.iter().filter(|n| &n.experiment == experiment) {
            match note.state {
                JobState::Failed => {
                    e.failure_streak = e.failure_streak.saturating_add(1);
                    if e.failure_streak == input.failure_streak {
                        events += 1;
                        record(
                            tx,
                            NewAlertEvent {
                                kind: AlertKind::FailuresInARow,
                                subject: Some(e.submitted_by.clone()),
                                summary: format!(
                                    "{} jobs of {} failed in a row (the last: job {})",
                                    e.failure_streak, e.name, note.job
                                ),
                                details: json!({
                                    "experiment": experiment, "experiment_name": e.name,
                                    "failures": e.failure_streak, "last_job": note.job,
                                }),
                                at: note.at,
                            },
                        )
                        .await?;
                    }
                }
                JobState::Succeeded => e.failure_streak = 0,
                JobState::Pruned => {
                    events += 1;
                    record(
                        tx,
                        NewAlertEvent {
                            kind: AlertKind::JobPruned,
                            subject: Some(e.submitted_by.clone()),
                            summary: format!(
                                "job {} of {} stopped early (pruned)",
                                note.job, e.name
                            ),
                            details: json!({
                                "experiment": experiment, "experiment_name": e.name,
                                "job": note.job,
                            }),
                            at: note.at,
                        },
                    )
                    .await?;
                }
                _ => {}
            }
            if note.state.is_terminal() {
                any_end = true;
            } else {
                // Retried: its next end is told again.
                e.ended_alerted = false;
            }
        }
        if any_end && !e.ended_alerted && !tx.unfinished(Some(experiment)).await? {
            let counts = tx.state_counts(Some(experiment)).await?;
            events += 1;
            record(
                tx,
                NewAlertEvent {
                    kind: AlertKind::ExperimentEnded,
                    subject: Some(e.submitted_by.clone()),
                    summary: format!(
                        "experiment {} ended: {} succeeded, {} failed, {} cancelled, {} pruned",
                        e.name, counts.succeeded, counts.failed, counts.cancelled, counts.pruned
                    ),
                    details: json!({
                        "experiment": experiment, "experiment_name": e.name, "counts": counts,
                    }),
                    at: now,
                },
            )
            .await?;
            e.ended_alerted = true;
        }
        tx.set_experiment_alerts(experiment, e.failure_streak, e.ended_alerted)
            .await?;
    }
    let read: Vec<i64> = notes.iter().map(|n| n.id).collect();
    tx.drop_alert_notes(&read).await?;
    let lost_after = i64::try_from(input.lost_after_ms).unwrap_or(i64::MAX);
    for node in tx.mark_lost_nodes(now.saturating_sub(lost_after)).await? {
        events += 1;
        record(
            tx,
            NewAlertEvent {
                kind: AlertKind::NodeLost,
                subject: None,
                summary: format!(
                    "node {node} is lost: its agent has been silent for over {} s",
                    input.lost_after_ms / 1000
                ),
                details: json!({"node": node, "silent_ms": input.lost_after_ms}),
                at: now,
            },
        )
        .await?;
    }
    if let Some(after) = input.quarantine_after_ms {
        let cutoff = now.saturating_sub(i64::try_from(after).unwrap_or(i64::MAX));
        for (node, gpu, attempt, reason, since) in tx.mark_lasting_quarantines(cutoff).await? {
            events += 1;
            let lasting_ms = now.saturating_sub(since);
            record(
                tx,
                NewAlertEvent {
                    kind: AlertKind::GpuQuarantined,
                    subject: None,
                    summary: format!(
                        "GPU {gpu} of node {node} is still quarantined after {} min: {reason} \
                         (`headroom node release {node} {gpu}` once it is looked at)",
                        lasting_ms / 60_000
                    ),
                    details: json!({"node": node, "gpu": gpu, "attempt": attempt,
                        "reason": reason, "lasting_ms": lasting_ms}),
                    at: now,
                },
            )
            .await?;
        }
    }
    if let Some(after) = input.pending_after_ms {
        let cutoff = now.saturating_sub(i64::try_from(after).unwrap_or(i64::MAX));
        for w in tx.mark_long_waits(cutoff, WAITS_PER_SWEEP).await? {
            events += 1;
            let waited_ms = now.saturating_sub(w.waiting_since);
            let why = w
                .pending_reason
                .as_ref()
                .map_or_else(|| "not yet looked at".to_string(), |r| r.to_string());
            record(
                tx,
                NewAlertEvent {
                    kind: AlertKind::JobPending,
                    subject: Some(w.submitted_by.clone()),
                    summary: format!(
                        "job {} of {} has waited {} min in the queue: {why}",
                        w.job,
                        w.experiment_name,
                        waited_ms / 60_000
                    ),
                    details: json!({
                        "experiment": w.experiment, "experiment_name": w.experiment_name,
                        "job": w.job, "waited_ms": waited_ms, "reason": w.pending_reason,
                    }),
                    at: now,
                },
            )
            .await?;
        }
    }
    if let (Some(after), true) = (input.drift_after_ms, input.check_drift) {
        events += drift(tx, now, input.lost_after_ms, after).await?;
    }
    let keep = i64::try_from(input.keep_ms).unwrap_or(i64::MAX);
    tx.prune_alerts(now.saturating_sub(keep)).await?;
    Ok((events, Change::None))
}

/// Each live GPU's reading against its ledger (the estimates of the attempts placed on it,
/// those with memory phases at what their phase holds):
/// a drift is kept from when it starts, cleared when they agree again, and told once it has
/// lasted `after_ms`. A GPU whose reading failed, or that runs an attempt with no estimate
/// (placed alone, by nothing), has no ledger to compare and is left as it was.
async fn drift(tx: &mut dyn Tx, now: Millis, alive_ms: u64, after_ms: u64) -> Result<usize> {
    let mut told = 0;
    let stored = tx.drifts().await?;
    let mut seen: Vec<(String, u32)> = Vec::new();
    let alive_after = now.saturating_sub(i64::try_from(alive_ms).unwrap_or(i64::MAX));
    for row in tx.nodes().await? {
        if row.agent.is_none() || row.last_seen.is_none_or(|t| t < alive_after) {
            continue;
        }
        let samples = super::nodes::latest_samples(tx, &row).await?;
        let active = tx.active_on(&row.name).await?;
        for g in &row.gpus {
            let here: Vec<&super::Active> = active
                .iter()
                .filter(|a| a.gpus.contains(&g.index))
                .collect();
            let Some(sample) = samples.iter().find(|s| s.index == g.index) else {
                continue;
            };
            if sample.error.is_some() || here.iter().any(|a| a.estimate.is_none()) {
                seen.push((row.name.clone(), g.index));
                continue;
            }
            // A run with memory phases is counted at what they say it holds now.
            let placed: u64 = here.iter().filter_map(|a| a.held_now(now)).sum();
            let previous = stored
                .iter()
                .find(|(n, i, _)| *n == row.name && *i == g.index)
                .map(|(_, _, d)| d);
            seen.push((row.name.clone(), g.index));
            let Some((direction, gap_mib)) =
                crate::rules::drift(placed, sample.used_mib, g.total_mib)
            else {
                if previous.is_some() {
                    tx.clear_drift(&row.name, g.index).await?;
                }
                continue;
            };
            let since = match previous {
                Some(p) if p.direction == direction => p.since,
                _ => super::rows::ts(now),
            };
            let was_lasting = previous.is_some_and(|p| p.direction == direction && p.lasting);
            let lasting_ms = now.saturating_sub(since.timestamp_millis());
            let lasting = was_lasting || lasting_ms >= i64::try_from(after_ms).unwrap_or(i64::MAX);
            let view = DriftView {
                direction,
                gap_mib,
                since,
                lasting,
            };
            tx.put_drift(&row.name, g.index, &view).await?;
            if lasting && !was_lasting {
                told += 1;
                let (node, gpu) = (&row.name, g.index);
                let what = match direction {
                    DriftDirection::Over => "uses more than the estimates placed on it",
                    DriftDirection::Under => "uses less than the estimates placed on it",
                };
                record(
                    tx,
                    NewAlertEvent {
                        kind: AlertKind::GpuDrift,
                        subject: None,
                        summary: format!(
                            "GPU {gpu} of node {node} {what} by {gap_mib} MiB, for {} min \
                             ({} MiB placed, {} MiB used)",
                            lasting_ms / 60_000,
                            placed,
                            sample.used_mib
                        ),
                        details: json!({"node": node, "gpu": gpu, "direction": direction,
                            "gap_mib": gap_mib, "placed_mib": placed,
                            "used_mib": sample.used_mib, "lasting_ms": lasting_ms}),
                        at: now,
                    },
                )
                .await?;
            }
        }
    }
    // GPUs of nodes gone (or no longer there) drift no more.
    for (node, gpu, _) in &stored {
        if !seen.iter().any(|(n, g)| n == node && g == gpu) {
            tx.clear_drift(node, *gpu).await?;
        }
    }
    Ok(told)
}
