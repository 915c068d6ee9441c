//! Nodes: an agent's registration (and what it leaves of the node's earlier attempts), plans,
//! the latest samples, quarantine, and the node views `headroom nodes` shows.

use headroom_shared::api::{GpuInfo, GpuSample, NodeView};
use headroom_shared::{AgentId, AttemptId, Plan};

use super::rows::{NodeRow, i64_of, parse};
use super::tx::Tx;
use super::{Registered, Registration, Result, StoreError, jobs, node_view, now_ms};
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

/// Stores the node's latest samples; true when some GPU has more free memory than before,
/// which may let a waiting claim (on any replica) place work.
pub(super) async fn record_samples(
    tx: &mut dyn Tx,
    node: &str,
    gpus: &[GpuSample],
) -> Result<bool> {
    let before = tx.node_samples(node).await?;
    tx.set_node_samples(node, gpus, now_ms()).await?;
    Ok(rules::memory_freed(&before, gpus))
}

pub(super) async fn register(tx: &mut dyn Tx, reg: Registration) -> Result<(Registered, bool)> {
    let now = now_ms();
    let stored = tx.lock_node_settings(&reg.node).await?;
    let (plan, headroom) =
        rules::merge_registration(reg.gpus.len(), (reg.plan.as_ref(), reg.headroom), stored)?;
    tx.upsert_node(&reg.node, reg.agent, &reg.gpus, &plan, &headroom, now)
        .await?;
    // Attempts the agent still runs with a current token stay its own; the rest belonged to
    // an incarnation that is gone.
    let until = now.saturating_add(i64_of(reg.lease_ttl_ms));
    let mut lost = Vec::new();
    for a in tx.active_on(&reg.node).await? {
        let resumed = rules::resumes(&reg.resume, &a.id, a.fence)
            && tx.resume_attempt(&a.id, reg.agent, until).await?;
        if !resumed && jobs::lose_attempt(tx, &a.id).await? {
            lost.push(parse(&a.id, "attempt id")?);
        }
    }
    Ok((Registered { plan, lost }, true))
}

pub(super) async fn set_plan(tx: &mut dyn Tx, node: String, plan: String) -> Result<(Plan, bool)> {
    let gpus = gpus(tx, &node, true).await?;
    let plan = Plan::parse_for(&plan, gpus.len())?;
    tx.set_plan(&node, &plan).await?;
    Ok((plan, true))
}

pub(super) async fn list(tx: &mut dyn Tx, alive_within_ms: u64) -> Result<Vec<NodeView>> {
    let now = now_ms();
    let mut out = Vec::new();
    for row in tx.nodes().await? {
        let active = tx.active_on(&row.name).await?;
        let quarantine = tx.quarantine_of(&row.name).await?;
        out.push(node_view(row, &active, &quarantine, alive_within_ms, now)?);
    }
    Ok(out)
}

pub(super) async fn release_attempts(
    tx: &mut dyn Tx,
    agent: AgentId,
    attempts: Vec<AttemptId>,
) -> Result<(u64, bool)> {
    let node = of_agent(tx, agent, true).await?;
    let attempts: Vec<String> = attempts.iter().map(AttemptId::to_string).collect();
    let n = tx.release_quarantine_of(&node.name, &attempts).await?;
    Ok((n, n > 0))
}

pub(super) async fn release_gpu(tx: &mut dyn Tx, node: String, gpu: u32) -> Result<(u64, bool)> {
    let gpus = gpus(tx, &node, true).await?;
    super::check_gpu(&node, &gpus, gpu)?;
    let n = tx.release_quarantine_on(&node, gpu).await?;
    Ok((n, n > 0))
}
