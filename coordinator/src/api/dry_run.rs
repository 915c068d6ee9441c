//! A dry run's schedule: the spec's jobs, each with its declared or learned estimate and the
//! run time earlier runs of its memory key took, on the live nodes' GPUs and plans through
//! the coordinator's own placement ([`crate::preview`]).

use std::collections::BTreeSet;

use headroom_shared::api::NodeView;

use super::{ApiError, AppState};
use crate::preview::{EstimateFrom, PreviewGpu, PreviewJob, PreviewNode, SchedulePreview};
use crate::store::NewExperiment;

/// The schedule of `exps`' jobs (as they would be stored, in order) on the `live` nodes.
/// `after`: (a job, a job it waits for), by their positions in those jobs in order.
pub(super) async fn schedule(
    s: &AppState,
    live: &[NodeView],
    exps: &[NewExperiment],
    after: &[(usize, usize)],
) -> Result<SchedulePreview, ApiError> {
    let live: Vec<PreviewNode> = live
        .iter()
        .map(|n| PreviewNode {
            name: n.name.clone(),
            gpus: n
                .gpus
                .iter()
                .map(|g| PreviewGpu {
                    total_mib: g.total_mib,
                    headroom_mib: g.headroom_mib,
                    slots: g.slots,
                })
                .collect(),
        })
        .collect();
    let largest = live
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
        .max();
    let keys: BTreeSet<String> = exps
        .iter()
        .flat_map(|e| e.jobs.iter().map(|j| j.memory_key.clone()))
        .collect();
    let history = s.store.key_history(keys.into_iter().collect()).await?;
    let mut jobs = Vec::new();
    for e in exps {
        for j in &e.jobs {
            let h = history.get(&j.memory_key);
            let mut peaks = h.map(|h| h.peaks.clone()).unwrap_or_default();
            let (estimate, from) = crate::rules::effective_estimate(
                j.estimate_mib,
                &mut peaks,
                h.and_then(|h| h.floor),
                largest,
                largest,
            );
            let background = j.background.as_ref().map(|b| b.memory_mib);
            jobs.push(PreviewJob {
                group: e.name.clone(),
                gpus: j.gpus,
                estimate_mib: crate::rules::pair_estimate(estimate, background),
                estimate_from: match from {
                    "learned" => EstimateFrom::Learned,
                    "declared" => EstimateFrom::Declared,
                    _ => EstimateFrom::None,
                },
                alone: j.prestart.as_ref().is_some_and(|p| p.holds_gpu()),
                duration_s: h.and_then(|h| h.duration_ms).map(|ms| ms as f64 / 1000.0),
                after: vec![],
            });
        }
    }
    for &(job, needs) in after {
        if let Some(j) = jobs.get_mut(job) {
            j.after.push(needs);
        }
    }
    // Placement over every job, and the simulation: CPU work, off the runtime's threads.
    tokio::task::spawn_blocking(move || crate::preview::preview(&live, &jobs))
        .await
        .map_err(|e| ApiError::internal(format!("the dry run's schedule: {e}")))
}
