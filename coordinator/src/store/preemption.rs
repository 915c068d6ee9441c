//! A preemption round: reads the nodes that run preemptible jobs and the head of each user's
//! queue, lets [`crate::preempt::choose`] decide, and asks the chosen attempts to stop after
//! their checkpoint signal and requeue (their jobs spend no attempt).

use std::collections::HashMap;

use headroom_shared::checkpoint::Requeue;
use headroom_shared::pending::PendingReason;
use headroom_shared::{JobState, api::UserLimits};

use super::jobs;
use super::leases::key_memory;
use super::tx::Tx;
use super::{Millis, Result};
use crate::changes::Change;
use crate::fair;
use crate::placement::GpuState;
use crate::preempt::{self, Holder, NodeView, Waiter};
use crate::rules::{self, KeyMemory, PendingRow};

/// Jobs read from the head of each user's queue.
const HEAD: u32 = 4;

/// What a round is given.
#[derive(Clone, Copy, Debug)]
pub struct PreemptInput {
    /// Fair share's half-life, as claims weigh usage.
    pub half_life_ms: u64,
    /// A job preempted less than this long ago is not preempted again.
    pub interval_ms: u64,
}

/// A job asked to stop and requeue, and the job it makes room for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preempted {
    pub job: String,
    pub attempt: String,
    pub for_job: String,
    pub node: String,
    pub gpu: u32,
}

pub(super) async fn preempt(
    tx: &mut dyn Tx,
    input: PreemptInput,
) -> Result<(Vec<Preempted>, Change)> {
    // The usual round: no preemptible job runs, and this is its one read.
    let names = tx.preemptible_nodes().await?;
    if names.is_empty() {
        return Ok((vec![], Change::None));
    }
    tx.lock_preemption().await?;
    let now = tx.clock().await?;
    let mut pending = Vec::new();
    for user in tx.waiting_users(1).await? {
        pending.extend(tx.read_pending(&user, 1, HEAD).await?);
    }
    // Those a claim looked at and found no room for (a job held back by fair share or a cap
    // is not waiting for memory).
    pending.retain(|p| {
        p.gpus == 1
            && matches!(
                p.reason,
                Some(
                    PendingReason::NoFreeSlot
                        | PendingReason::NotEnoughMemory { .. }
                        | PendingReason::BehindReservation
                )
            )
    });
    if pending.is_empty() {
        return Ok((vec![], Change::None));
    }
    let mut nodes = Vec::new();
    let mut seqs: HashMap<String, i64> = HashMap::new();
    let all = tx.nodes().await?;
    for name in &names {
        let Some(row) = all.iter().find(|n| &n.name == name) else {
            continue;
        };
        nodes.push(node_view(tx, row, now, input.interval_ms, &mut seqs).await?);
    }
    let shares = standings(tx, &pending, &nodes, now, input.half_life_ms).await?;
    let largest = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
        .max();
    let mut waiters = Vec::new();
    for p in &pending {
        let memory = key_memory(tx, &p.memory_key).await?;
        waiters.push((p, waiter(p, &memory, largest)));
    }
    waiters.sort_by_key(|(p, _)| (shares.rank(&p.user), -p.cursor.priority, p.cursor.seq));
    let waiters: Vec<Waiter> = waiters.into_iter().map(|(_, w)| w).collect();
    let chosen = preempt::choose(&mut nodes, &waiters, &shares);
    // The victims and the jobs they make room for, locked in `seq` order as every operation
    // locks jobs, and read again under their locks: a claim may have placed a waiter, or a
    // victim may have ended, since the round read them.
    seqs.extend(pending.iter().map(|p| (p.id.clone(), p.cursor.seq)));
    let mut to_lock: Vec<&str> = chosen
        .iter()
        .flat_map(|c| [c.job.as_str(), c.for_job.as_str()])
        .collect();
    to_lock.sort_by_key(|j| (seqs.get(*j).copied().unwrap_or(i64::MAX), *j));
    to_lock.dedup();
    let mut states = HashMap::new();
    for job in to_lock {
        states.insert(job.to_string(), jobs::lock_job(tx, job).await?.state);
    }
    let mut done = Vec::new();
    for c in chosen {
        let waiting = states
            .get(&c.for_job)
            .is_some_and(|s| matches!(s, JobState::Queued | JobState::Retrying));
        let running = states
            .get(&c.job)
            .is_some_and(|s| matches!(s, JobState::Leased | JobState::Running));
        if waiting && running && preempt_one(tx, &c.job, now).await? {
            tracing::info!(job = %c.job, attempt = %c.attempt, for_job = %c.for_job, node = %c.node, gpu = c.gpu, "preempting");
            let p = Preempted {
                job: c.job,
                attempt: c.attempt,
                for_job: c.for_job,
                node: c.node,
                gpu: c.gpu,
            };
            super::alerts::preempted(tx, &p, now).await?;
            done.push(p);
        }
    }
    let changed = Change::work_if(!done.is_empty());
    Ok((done, changed))
}

/// Asks the running job's (locked) attempt to stop after its checkpoint signal and requeue;
/// false when it was asked something already.
async fn preempt_one(tx: &mut dyn Tx, job: &str, now: Millis) -> Result<bool> {
    if tx.request_requeue(job, Requeue::Preempted).await? == 0 {
        return Ok(false);
    }
    tx.set_preempted_at(job, now).await?;
    Ok(true)
}

/// A node as preemption sees it: each GPU with every live attempt's estimate placed (live
/// free memory aside: the attempts it would stop still hold theirs), and who holds what.
async fn node_view(
    tx: &mut dyn Tx,
    node: &super::rows::NodeRow,
    now: Millis,
    interval_ms: u64,
    seqs: &mut HashMap<String, i64>,
) -> Result<NodeView> {
    let active = tx.active_on(&node.name).await?;
    let rows: HashMap<String, super::tx::HolderRow> = tx
        .holders_on(&node.name)
        .await?
        .into_iter()
        .map(|h| (h.attempt.clone(), h))
        .collect();
    seqs.extend(rows.values().map(|h| (h.job.clone(), h.seq)));
    let blocked = tx.blocked_gpus(&node.name, now).await?;
    let recent = now.saturating_sub(super::rows::i64_of(interval_ms));
    let holders: Vec<Holder> = active
        .iter()
        .filter_map(|a| {
            let r = rows.get(&a.id)?;
            Some(Holder {
                attempt: a.id.clone(),
                job: r.job.clone(),
                user: r.user.clone(),
                priority: r.priority,
                gpus: a.gpus.clone(),
                estimate: a.estimate,
                alone: a.alone,
                preemptible: r.preemptible && r.preempted_at.is_none_or(|t| t < recent),
                stopping: r.stopping,
            })
        })
        .collect();
    let gpus = node
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| GpuState {
            // Preemption counts each attempt's estimate throughout its run.
            timed: Default::default(),
            index: g.index,
            total_mib: g.total_mib,
            slots: node.plan.slots(i),
            headroom_mib: node.headroom.mib_of(g.total_mib),
            live_free_mib: None,
            placed: active
                .iter()
                .filter(|a| a.gpus.contains(&g.index))
                .map(|a| a.estimate)
                .collect(),
            quarantined: blocked.contains(&g.index),
            held_alone: active.iter().any(|a| a.alone && a.gpus.contains(&g.index)),
        })
        .collect();
    Ok(NodeView {
        name: node.name.clone(),
        gpus,
        holders,
    })
}

/// The fair-share standings of everyone who waits or holds a GPU on these nodes.
async fn standings(
    tx: &mut dyn Tx,
    pending: &[PendingRow],
    nodes: &[NodeView],
    now: Millis,
    half_life_ms: u64,
) -> Result<fair::Shares> {
    let limits: HashMap<String, UserLimits> = tx.user_limits().await?.into_iter().collect();
    let mut head: HashMap<String, i64> = HashMap::new();
    for p in pending {
        let seq = head.entry(p.user.clone()).or_insert(p.cursor.seq);
        *seq = (*seq).min(p.cursor.seq);
    }
    let mut users: Vec<String> = head.keys().cloned().collect();
    users.extend(
        nodes
            .iter()
            .flat_map(|n| n.holders.iter().map(|h| h.user.clone())),
    );
    users.sort();
    users.dedup();
    let users: Vec<(String, u32)> = users
        .into_iter()
        .map(|u| {
            let share = limits.get(&u).map_or(1, |l| l.share);
            (u, share)
        })
        .collect();
    let ledgers = tx.ledgers().await?.into_iter().collect();
    let runs = tx.uncharged_runs().await?;
    let standings = fair::standings(&users, &ledgers, &runs, now, half_life_ms);
    Ok(fair::order(standings, &head))
}

/// A waiting job as preemption weighs it, with the estimate a claim would place it by.
fn waiter(p: &PendingRow, memory: &KeyMemory, largest: Option<u64>) -> Waiter {
    Waiter {
        job: p.id.clone(),
        user: p.user.clone(),
        priority: p.cursor.priority,
        gpus: p.gpus,
        estimate: rules::pending_estimate(p, memory, largest),
        alone: p.alone,
    }
}
