//! Nodes: an agent's registration (and what it leaves of the node's earlier attempts), plans,
//! the latest samples, quarantine, and the node views `headroom nodes` shows.

use headroom_shared::api::{GpuInfo, GpuSample, GpuView, Headroom, NodeView, QuarantineView};
use headroom_shared::{AgentId, AttemptId, Plan};

use super::rows::{self, NodeRow, i64_of, parse};
use super::tx::Tx;
use super::{Active, Millis, NodeOf, Registered, Registration, Result, StoreError, jobs};
use crate::changes::Change;
use crate::rules;

/// The agent's node; locked when `lock` (claims, heartbeats and reports of one node
/// serialize on it).
pub(super) async fn of_agent(tx: &mut dyn Tx, agent: AgentId, lock: bool) -> Result<NodeRow> {
    tx.node_of_agent(agent, lock)
        .await?
        .ok_or(StoreError::UnknownAgent { agent })
}

/// A node's GPUs; locked when `lock`.
pub(super) async fn gpus(tx: &mut dyn Tx, node: &str, lock: bool) -> Result<Vec<GpuInfo>> {
    tx.node_gpus(node, lock)
        .await?
        .ok_or_else(|| StoreError::not_found("node", node))
}

/// The most memory any GPU of a live node (an agent heard of within `alive_within_ms`)
/// offers, less its headroom; `None` with no live node.
pub(super) async fn largest_live_usable(
    tx: &mut dyn Tx,
    alive_within_ms: u64,
    now: Millis,
) -> Result<Option<u64>> {
    Ok(tx
        .nodes()
        .await?
        .iter()
        .filter(|r| alive(r, alive_within_ms, now))
        .flat_map(|r| {
            r.gpus
                .iter()
                .map(|g| g.total_mib.saturating_sub(r.headroom.mib_of(g.total_mib)))
        })
        .max())
}

/// Stores the node's latest samples over those of its row (read under the node's lock);
/// true when some GPU has more free memory than before, which may let a waiting claim (on
/// any replica) place work.
pub(super) async fn record_samples(
    tx: &mut dyn Tx,
    node: &NodeRow,
    gpus: &[GpuSample],
    now: Millis,
) -> Result<bool> {
    tx.set_node_samples(&node.name, gpus, now).await?;
    Ok(rules::memory_freed(&node.samples, gpus))
}

pub(super) async fn register(tx: &mut dyn Tx, reg: Registration) -> Result<(Registered, Change)> {
    let now = tx.clock().await?;
    let stored = tx.lock_node_settings(&reg.node).await?;
    // Under the node's lock: two instances registering at once see each other.
    if let Some((holder, seen)) = tx.node_holder(&reg.node).await? {
        let previous = reg.previous.map(|a| a.to_string());
        if let Err(ago) = rules::may_register(
            holder.as_deref(),
            seen,
            previous.as_deref(),
            now,
            reg.lease_ttl_ms,
        ) {
            return Err(StoreError::NodeHeld {
                node: reg.node,
                agent: holder.unwrap_or_default(),
                seen_ms_ago: ago,
            });
        }
    }
    let (plan, headroom) =
        rules::merge_registration(reg.gpus.len(), (reg.plan.as_ref(), reg.headroom), stored)?;
    tx.upsert_node(&reg.node, reg.agent, &reg.gpus, &plan, &headroom, now)
        .await?;
    tx.set_host_memory(&reg.node, reg.host_memory_mib).await?;
    // Attempts the agent still runs with a current token stay its own; the rest belonged to
    // an incarnation that is gone.
    let until = now.saturating_add(i64_of(reg.lease_ttl_ms));
    let mut lost = Vec::new();
    for a in tx.active_on(&reg.node).await? {
        let resumed = rules::resumes(&reg.resume, &a.id, a.fence)
            && tx.resume_attempt(&a.id, reg.agent, until).await?;
        if !resumed && jobs::lose_attempt(tx, &a.id, None).await? {
            lost.push(parse(&a.id, "attempt id")?);
        }
    }
    Ok((Registered { plan, lost }, Change::Work))
}

/// The node an agent or an attempt belongs to; `None` when unknown.
pub(super) async fn node_of(tx: &mut dyn Tx, of: NodeOf) -> Result<Option<String>> {
    match of {
        NodeOf::Agent(agent) => Ok(tx.node_of_agent(agent, false).await?.map(|n| n.name)),
        NodeOf::Attempt(attempt) => tx.node_of_attempt(&attempt.to_string()).await,
    }
}

/// Lets another agent instance register as the node at once: its agent counts as gone.
pub(super) async fn takeover(tx: &mut dyn Tx, node: String) -> Result<((), Change)> {
    if tx.lock_node_settings(&node).await?.is_none() {
        return Err(StoreError::not_found("node", node));
    }
    tx.forget_node_seen(&node).await?;
    Ok(((), Change::Work))
}

pub(super) async fn set_plan(
    tx: &mut dyn Tx,
    node: String,
    plan: String,
) -> Result<(Plan, Change)> {
    let gpus = gpus(tx, &node, true).await?;
    let plan = Plan::parse_for(&plan, gpus.len())?;
    tx.set_plan(&node, &plan).await?;
    Ok((plan, Change::Work))
}

/// The node's latest GPU reading: its own (a claim's or a heartbeat's) or the one its latest
/// attempt end brought (taken after that end's verified cleanup), whichever was stored later;
/// in the same millisecond the end's (the node's may have been read before that end). Ends
/// keep theirs apart so that they need not take the node's row.
pub(super) async fn latest_samples(tx: &mut dyn Tx, node: &NodeRow) -> Result<Vec<GpuSample>> {
    Ok(match tx.end_samples(&node.name).await? {
        Some((end, at)) if node.last_seen.is_none_or(|seen| at >= seen) => end,
        _ => node.samples.clone(),
    })
}

pub(super) async fn list(tx: &mut dyn Tx, alive_within_ms: u64) -> Result<Vec<NodeView>> {
    let now = tx.clock().await?;
    let drifts = tx.drifts().await?;
    let mut out = Vec::new();
    for mut row in tx.nodes().await? {
        row.samples = latest_samples(tx, &row).await?;
        let active = tx.active_on(&row.name).await?;
        let quarantine = tx.quarantine_of(&row.name).await?;
        let mut view = node_view(row, &active, &quarantine, alive_within_ms, now)?;
        for g in &mut view.gpus {
            g.drift = drifts
                .iter()
                .find(|(n, i, _)| *n == view.name && *i == g.index)
                .map(|(_, _, d)| d.clone());
        }
        out.push(view);
    }
    Ok(out)
}

pub(super) async fn release_attempts(
    tx: &mut dyn Tx,
    agent: AgentId,
    attempts: Vec<AttemptId>,
) -> Result<(u64, Change)> {
    let node = of_agent(tx, agent, true).await?;
    let attempts: Vec<String> = attempts.iter().map(AttemptId::to_string).collect();
    let n = tx.release_quarantine_of(&node.name, &attempts).await?;
    Ok((n, Change::freed_if(n > 0, &node.name)))
}

pub(super) async fn release_gpu(tx: &mut dyn Tx, node: String, gpu: u32) -> Result<(u64, Change)> {
    let gpus = gpus(tx, &node, true).await?;
    check_gpu(&node, &gpus, gpu)?;
    let n = tx.release_quarantine_on(&node, gpu).await?;
    Ok((n, Change::freed_if(n > 0, &node)))
}

/// Whether a node's agent was heard of within `alive_within_ms`.
fn alive(row: &NodeRow, alive_within_ms: u64, now: Millis) -> bool {
    row.agent.is_some()
        && row
            .last_seen
            .is_some_and(|t| now - t <= rows::i64_of(alive_within_ms))
}

/// A node as `headroom nodes` shows it, from its stored row, active attempts and quarantine.
fn node_view(
    row: rows::NodeRow,
    active: &[Active],
    quarantine: &[(u32, QuarantineView)],
    alive_within_ms: u64,
    now: Millis,
) -> Result<NodeView> {
    let gpus = gpu_views(
        &row.gpus,
        &row.plan,
        &row.headroom,
        &row.samples,
        active,
        quarantine,
    )?;
    Ok(NodeView {
        alive: alive(&row, alive_within_ms, now),
        agent: row.agent.map(|a| rows::parse(&a, "agent id")).transpose()?,
        name: row.name,
        plan: row.plan.to_string(),
        headroom: row.headroom,
        last_seen: row.last_seen.map(rows::ts),
        gpus,
    })
}

/// What `headroom nodes` shows of each GPU of a node.
fn gpu_views(
    gpus: &[GpuInfo],
    plan: &Plan,
    headroom: &Headroom,
    samples: &[GpuSample],
    active: &[Active],
    quarantine: &[(u32, QuarantineView)],
) -> Result<Vec<GpuView>> {
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            let sample = samples.iter().find(|s| s.index == g.index);
            // A GPU that cannot be read has no figures: an unknown is never 0 used or free.
            let read = sample.filter(|s| s.error.is_none());
            let here: Vec<&Active> = active
                .iter()
                .filter(|a| a.gpus.contains(&g.index))
                .collect();
            Ok(GpuView {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                total_mib: g.total_mib,
                used_mib: read.map(|s| s.used_mib),
                free_mib: read.map(|s| s.free_mib),
                error: sample.and_then(|s| s.error.clone()),
                unattributed_mib: sample.and_then(GpuSample::unattributed_mib),
                slots: plan.slots(i),
                slots_used: here.len() as u32,
                estimated_mib: here.iter().filter_map(|a| a.estimate).sum(),
                headroom_mib: headroom.mib_of(g.total_mib),
                attempts: here
                    .iter()
                    .map(|a| {
                        a.id.parse()
                            .map_err(|_| StoreError::Corrupt(format!("bad attempt id `{}`", a.id)))
                    })
                    .collect::<Result<_>>()?,
                foreign: sample
                    .map(|s| {
                        s.processes
                            .iter()
                            .filter(|p| p.attempt.is_none())
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default(),
                quarantine: quarantine
                    .iter()
                    .filter(|(gpu, _)| *gpu == g.index)
                    .map(|(_, q)| q.clone())
                    .collect(),
                drift: None,
            })
        })
        .collect()
}

/// A GPU index must name one of the node's GPUs.
pub(crate) fn check_gpu(node: &str, gpus: &[GpuInfo], gpu: u32) -> Result<()> {
    if gpus.iter().any(|g| g.index == gpu) {
        Ok(())
    } else {
        Err(StoreError::not_found("GPU", format!("{node}/{gpu}")))
    }
}
