//! GPU telemetry series: storing an agent's batches, reading a GPU's or an attempt's window,
//! and pruning what retention no longer keeps.

use headroom_shared::api::{AttemptTelemetry, AttemptView, GpuInfo, GpuSeries, TelemetrySample};
use headroom_shared::{AgentId, AttemptId};

use super::tx::{AttemptsWhere, Tx};
use super::{Result, Retention, SeriesWindow, StoreError, nodes, now_ms};
use crate::changes::Change;

pub(super) async fn record(
    tx: &mut dyn Tx,
    agent: AgentId,
    samples: Vec<TelemetrySample>,
) -> Result<(u64, Change)> {
    // No row lock: telemetry must not queue behind the node's claims.
    let node = nodes::of_agent(tx, agent, false).await?;
    check_telemetry_gpus(&node.gpus, &samples)?;
    Ok((
        tx.insert_telemetry(&node.name, &samples).await?,
        Change::None,
    ))
}

pub(super) async fn of_gpu(
    tx: &mut dyn Tx,
    node: String,
    gpu: u32,
    window: SeriesWindow,
) -> Result<Vec<TelemetrySample>> {
    let gpus = nodes::gpus(tx, &node, false).await?;
    nodes::check_gpu(&node, &gpus, gpu)?;
    tx.series(&node, gpu, &window).await
}

pub(super) async fn of_attempt(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    limit: u32,
) -> Result<AttemptTelemetry> {
    let a = tx
        .attempt_views(AttemptsWhere::Id(&attempt.to_string()))
        .await?
        .pop()
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    let window = attempt_window(&a, limit);
    let mut gpus = Vec::new();
    for &gpu in &a.gpus {
        let samples = match &window {
            Some(w) => tx.series(&a.node, gpu, w).await?,
            None => Vec::new(),
        };
        gpus.push(GpuSeries {
            node: a.node.clone(),
            gpu,
            samples,
        });
    }
    Ok(attempt_telemetry(&a, gpus))
}

pub(super) async fn prune(tx: &mut dyn Tx, keep: Retention) -> Result<(u64, Change)> {
    let mut gone = tx.prune_older(keep.older_than, keep.batch).await?;
    for node in tx.nodes().await? {
        for g in &node.gpus {
            let left = u64::from(keep.batch).saturating_sub(gone);
            if left == 0 {
                return Ok((gone, Change::None));
            }
            // The newest sample beyond the count kept: it and older ones go.
            if let Some(cutoff) = tx
                .series_cutoff(&node.name, g.index, keep.keep_per_gpu)
                .await?
            {
                gone += tx
                    .prune_to(&node.name, g.index, cutoff, left as u32)
                    .await?;
            }
        }
    }
    Ok((gone, Change::None))
}

/// The stored telemetry of a node's GPUs must name GPUs the node has.
fn check_telemetry_gpus(gpus: &[GpuInfo], samples: &[TelemetrySample]) -> Result<()> {
    match samples
        .iter()
        .position(|s| !gpus.iter().any(|g| g.index == s.gpu))
    {
        None => Ok(()),
        Some(i) => Err(StoreError::Invalid {
            field: format!("telemetry[{i}].gpu"),
            message: format!(
                "GPU {} is not one of the node's {} GPUs",
                samples[i].gpu,
                gpus.len()
            ),
        }),
    }
}

/// The window of an attempt's telemetry: its run, start to end (or now); `None` before it
/// started.
fn attempt_window(a: &AttemptView, limit: u32) -> Option<SeriesWindow> {
    let since = a.started_at?.timestamp_millis();
    Some(SeriesWindow {
        since,
        until: a.ended_at.map_or_else(now_ms, |t| t.timestamp_millis()),
        limit,
    })
}

fn attempt_telemetry(a: &AttemptView, gpus: Vec<GpuSeries>) -> AttemptTelemetry {
    AttemptTelemetry {
        attempt: a.id,
        node: a.node.clone(),
        from: a.started_at,
        to: a
            .started_at
            .map(|_| a.ended_at.unwrap_or_else(chrono::Utc::now)),
        gpus,
    }
}
