//! A dry run's schedule: the spec's jobs, each with its declared or learned estimate and the
//! run time earlier runs of its memory key took, on the live nodes' GPUs and plans through
//! the coordinator's own placement ([`crate::preview`]).

use std::collections::BTreeSet;

use headroom_shared::expand::{ExpandedJob, memory_key};
use headroom_shared::spec::ExperimentSpec;

use super::{ApiError, AppState};
use crate::preview::{EstimateFrom, PreviewGpu, PreviewJob, PreviewNode, SchedulePreview};

/// The jobs of one experiment (or variant) of the spec, in queue order.
pub(super) struct Group<'a> {
    pub name: &'a str,
    pub spec: &'a ExperimentSpec,
    pub jobs: &'a [ExpandedJob],
}

/// `after`: (a job, a job it waits for), by their positions in the groups' jobs in order.
pub(super) async fn schedule(
    s: &AppState,
    groups: &[Group<'_>],
    after: &[(usize, usize)],
) -> Result<SchedulePreview, ApiError> {
    let nodes = s
        .store
        .list_nodes(s.config.lease_ttl.as_millis() as u64)
        .await?;
    let live: Vec<PreviewNode> = nodes
        .iter()
        .filter(|n| n.alive)
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
    let key_of =
        |g: &Group<'_>, j: &ExpandedJob| memory_key(&g.spec.name, &g.spec.memory_key, &j.params);
    let keys: BTreeSet<String> = groups
        .iter()
        .flat_map(|g| g.jobs.iter().map(move |j| key_of(g, j)))
        .collect();
    let history = s.store.key_history(keys.into_iter().collect()).await?;
    let mut jobs = Vec::new();
    for g in groups {
        let declared = g.spec.resources.memory.map(|m| m.mib);
        for j in g.jobs {
            let h = history.get(&key_of(g, j));
            let mut peaks = h.map(|h| h.peaks.clone()).unwrap_or_default();
            let (estimate, from) = crate::rules::effective_estimate(
                declared,
                &mut peaks,
                h.and_then(|h| h.floor),
                largest,
            );
            let background = j.background.as_ref().map(|b| b.memory_mib);
            jobs.push(PreviewJob {
                group: g.name.to_string(),
                gpus: g.spec.resources.gpus,
                estimate_mib: crate::rules::pair_estimate(estimate, background),
                estimate_from: match from {
                    "learned" => EstimateFrom::Learned,
                    "declared" => EstimateFrom::Declared,
                    _ => EstimateFrom::None,
                },
                alone: g.spec.exclusive || g.spec.cooldown.is_some(),
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
