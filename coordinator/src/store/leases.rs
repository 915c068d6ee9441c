//! Leases and attempts: claiming jobs for a node, renewing, starting, finishing and handing
//! back leases, and losing those whose lease ran out. Every report is fenced: its token must
//! still be the attempt's and the job's.

use headroom_shared::api::{
    AttemptPhase, AttemptView, FinishReport, GpuSample, Lease, OomCause, RequeueOrder,
};
use headroom_shared::{AgentId, AttemptId, FailureClass, JobEvent, JobState};

use super::Active;
use super::jobs::LockedJob;
use super::results;
use super::rows::{self, NodeRow, i64_of, parse};
use super::tx::{AttemptsWhere, FinishRead, JobLeased, NewAttempt, Tx};
use super::{
    ClaimInput, Claimed, Finished, Millis, Renewal, Renewed, Result, Started, StopAsk, StoreError,
    jobs, nodes, now_ms,
};
use crate::changes::Change;
use crate::fair::{self, Caps, Shares};
use crate::placement::{GpuState, Placer, Snapshot};
use crate::rules::{self, AVOID_AFTER_HAND_BACK_MS, Learned, Slot};
use headroom_shared::api::UserLimits;
use std::collections::HashMap;

/// Most pending jobs read (and, on PostgreSQL, locked) at a time by a claim; it reads the next
/// window while its node could take more, at most [`CLAIM_WINDOWS`] of them: a node with a
/// free slot and little memory would otherwise read the whole queue at every claim, holding
/// its locks meanwhile.
const CLAIM_WINDOW: u32 = 512;
const CLAIM_WINDOWS: usize = 16;

/// The size of a claim's `k`th window (from 1) for a node that can take `max` more: the first a
/// few times that (locking 512 rows to lease 8 made concurrent claims skip each other's
/// locks and write a row lock each), doubling up to [`CLAIM_WINDOW`] while jobs ahead do
/// not fit.
fn window_size(max: usize, k: usize) -> u32 {
    let first = (max as u64)
        .saturating_mul(4)
        .clamp(32, u64::from(CLAIM_WINDOW));
    let grown = first.saturating_mul(1u64 << (k.saturating_sub(1)).min(16));
    grown.min(u64::from(CLAIM_WINDOW)) as u32
}

/// One queue a claim reads a window at a time: one user's (fair share), or everyone's.
struct Queue {
    user: Option<String>,
    after: Option<rules::QueueCursor>,
    more: bool,
}

impl Queue {
    fn of(user: impl Into<Option<String>>) -> Self {
        Self {
            user: user.into(),
            after: None,
            more: true,
        }
    }
}

/// The fair-share order of the users whose jobs are in `pending` (a claim's first window):
/// their ledgers and runs not yet charged, read now; a tie goes to the user whose first
/// waiting job is older.
async fn share_order(
    tx: &mut dyn Tx,
    pending: &[rules::PendingRow],
    limits: &HashMap<String, UserLimits>,
    now: Millis,
    half_life_ms: u64,
) -> Result<Shares> {
    let mut head: HashMap<String, i64> = HashMap::new();
    for p in pending {
        let seq = head.entry(p.user.clone()).or_insert(p.cursor.seq);
        *seq = (*seq).min(p.cursor.seq);
    }
    let users: Vec<(String, u32)> = head
        .keys()
        .map(|u| (u.clone(), limits.get(u).map_or(1, |l| l.share)))
        .collect();
    let ledgers = tx.ledgers().await?.into_iter().collect();
    let runs = tx.uncharged_runs().await?;
    let standings = fair::standings(&users, &ledgers, &runs, now, half_life_ms);
    Ok(fair::order(standings, &head))
}

/// Checks a report's fencing token, locking the job and then the attempt (one read); returns
/// the job and the attempt's phase.
async fn check_fence(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    fence: i64,
) -> Result<(LockedJob, AttemptPhase)> {
    let (id, state, row) = tx
        .lock_job_and_fence(&attempt.to_string())
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    rules::check_fence(attempt, fence, &row)?;
    Ok((LockedJob { id, state }, row.phase))
}

/// What a memory key has taught of GPU memory: its observed peaks, the shapes of its runs
/// and its OOM floor (not its host memory).
pub(in crate::store) async fn key_memory(tx: &mut dyn Tx, key: &str) -> Result<rules::KeyMemory> {
    let super::tx::KeyPeaks { peaks, profiles } = tx.peaks(key).await?;
    Ok(rules::KeyMemory {
        peaks,
        profiles,
        floor: tx.floor(key).await?,
        host_peaks: Vec::new(),
    })
}

/// Leases a waiting job, locked by the claim's read of the queue (`job`, with the state read
/// there).
async fn lease_job(
    tx: &mut dyn Tx,
    to: &LeaseTo<'_>,
    mut job: LockedJob,
    slot: &Slot,
) -> Result<Lease> {
    let row = tx
        .lease_row(&job.id)
        .await?
        .ok_or_else(|| StoreError::not_found("job", &job.id))?;
    let mut new = rows::lease_row_into(row, AttemptId::new(), &job.id, &slot.gpus, slot.estimate)?;
    let (key, key_hash) = crate::attempt_keys::new_key();
    new.lease.report_key = Some(headroom_shared::api::AttemptKey(key));
    new.lease.host_memory_mib = slot.host_mib.filter(|_| slot.host_limited);
    new.lease.starts_with_mib = slot.starts_with_mib;
    tx.insert_attempt(&NewAttempt {
        id: new.lease.attempt.to_string(),
        job: &job.id,
        number: new.lease.number,
        node: to.node,
        agent: to.agent,
        gpus: &slot.gpus,
        fence: new.lease.fence,
        estimate_mib: slot.estimate,
        estimate_source: slot.source,
        leased_at: to.now,
        expires_at: to.now.saturating_add(i64_of(to.ttl_ms)),
        memory_key: &new.memory_key,
        params: &new.lease.params,
        ladder_step: new.ladder_step,
        report_key_hash: &key_hash,
        reserved_mib: to.reserves(slot),
        host_mib: slot.host_mib,
        phases: slot.phases,
    })
    .await?;
    let leased = JobLeased {
        attempts: new.lease.number,
        fence: new.lease.fence,
    };
    jobs::lease(tx, &mut job, leased).await?;
    Ok(new.lease)
}

pub(super) async fn claim(tx: &mut dyn Tx, mut input: ClaimInput) -> Result<(Claimed, Change)> {
    // Claims for one node serialize on its row: each sees the slots the previous one took.
    let node: NodeRow = nodes::of_agent(tx, input.agent, true).await?;
    let mut changed = Change::None;
    let now = tx.clock().await?;
    let samples = match input.gpus.take() {
        Some(g) => {
            // Memory freed here concerns this claim alone, which reads it now.
            if nodes::record_samples(tx, &node, &g, now).await? {
                changed = Change::Shown;
            }
            g
        }
        // Woken: what the latest end freed shows there (see `nodes::latest_samples`).
        None => nodes::latest_samples(tx, &node).await?,
    };
    let to = LeaseTo::new(&node, &input, now);
    let active = tx.active_on(&node.name).await?;
    let blocked = tx.blocked_gpus(&node.name, now).await?;
    let snapshot = node_snapshot(&node, &samples, &active, &blocked, &input, now);
    // In the claim's transaction, not one of its own: a claim round is one store operation.
    let (cancel, requeue) =
        pending_cancels(tx, input.agent, std::mem::take(&mut input.watching)).await?;
    if input.max == 0 {
        let claimed = Claimed {
            leases: vec![],
            cancel,
            requeue,
            plan: node.plan,
            node: node.name,
            recheck_in_ms: None,
        };
        return Ok((claimed, changed));
    }
    // The queue is read a window at a time for as long as this node could take more, so a
    // job that fits starts whatever number of jobs that fit nowhere wait ahead of it. With
    // several users waiting, each user's queue is read (a window each) and their jobs go in
    // fair-share order.
    let mut placer = Placer::new(&snapshot);
    let mut learned = Learned::new();
    let mut leases = Vec::new();
    let mut caps = Caps::default();
    let limits: HashMap<String, UserLimits> = tx.user_limits().await?.into_iter().collect();
    let mut checked = std::collections::HashSet::new();
    let mut caps_locked = false;
    let mut fleet_known = false;
    let max = input.max as usize;
    let users = tx.waiting_users(node.gpus.len() as u32).await?;
    let mut queues: Vec<Queue> = if users.len() > 1 {
        users.into_iter().map(Queue::of).collect()
    } else {
        vec![Queue::of(None)]
    };
    let mut shares = Shares::default();
    // Windows sized by what the node can take, not by what its agent asks for (an agent
    // asks for many): a node with one slot open reads a few rows, not hundreds.
    let room = max.min(placer.open_slots());
    for window in 1.. {
        let size = window_size(room, window);
        // The first window whatever is free (its jobs' pending reasons stay current); past
        // it, with every GPU taken, only the jobs that need none (a CPU slot may be free).
        let gpus = if window == 1 || placer.gpu_open() {
            node.gpus.len() as u32
        } else {
            0
        };
        let mut pending = Vec::new();
        for q in queues.iter_mut().filter(|q| q.more) {
            let rows = tx
                .lock_pending(q.user.as_deref(), gpus, q.after, size)
                .await?;
            q.more = rows.len() == size as usize;
            q.after = rows.last().map(|r| r.cursor).or(q.after);
            pending.extend(rows);
        }
        if window == 1 && queues.len() > 1 {
            shares = share_order(tx, &pending, &limits, now, input.half_life_ms).await?;
        }
        if queues.len() > 1 {
            // Stable: each user's jobs keep their queue's order.
            pending.sort_by_key(|p| shares.rank(&p.user));
        }
        // Experiments with `max_concurrent` and capped users: counted once each, under one
        // lock that every claim of a capped job takes (on PostgreSQL; SQLite has one writer),
        // so claims for other nodes or on other replicas never pass a cap together.
        for p in &pending {
            if let Some(cap) = p.max_concurrent
                && checked.insert(p.experiment.clone())
            {
                if !caps_locked {
                    tx.lock_concurrency_caps().await?;
                    caps_locked = true;
                }
                let running = tx.active_jobs_of(&p.experiment).await?;
                caps.experiments
                    .insert(p.experiment.clone(), (cap, running));
            }
            if let Some(l) = limits.get(&p.user)
                && l.is_capped()
                && !caps.users.contains_key(&p.user)
            {
                if !caps_locked {
                    tx.lock_concurrency_caps().await?;
                    caps_locked = true;
                }
                let held = tx.held_by(&p.user).await?;
                caps.users.insert(p.user.clone(), (l.clone(), held));
            }
        }
        // What each memory key has taught so far, read once per key.
        for p in &pending {
            if !learned.contains_key(&p.memory_key) {
                let mut memory = key_memory(tx, &p.memory_key).await?;
                // A floor past this node's GPUs: whether any live GPU could take it, looked
                // up once (it waits for that node, or runs alone where none is).
                if memory.floor > placer.largest_usable_mib() && !fleet_known {
                    let anywhere = nodes::largest_live_usable(tx, input.lease_ttl_ms, now).await?;
                    placer.know_largest_anywhere(anywhere);
                    fleet_known = true;
                }
                memory.host_peaks = tx.host_peaks(&p.memory_key).await?;
                learned.insert(p.memory_key.clone(), memory);
            }
        }
        let plan = rules::claim(
            &mut placer,
            &pending,
            &learned,
            &mut caps,
            &shares,
            now,
            max - leases.len(),
        );
        for slot in &plan.leases {
            let p = &pending[slot.candidate];
            let job = LockedJob {
                id: p.id.clone(),
                state: p.state,
            };
            leases.push(lease_job(tx, &to, job, slot).await?);
        }
        for (i, reason) in &plan.reasons {
            tx.set_pending_reason(&pending[*i].id, Some(reason)).await?;
        }
        if !(queues.iter().any(|q| q.more)
            && leases.len() < max
            && window < CLAIM_WINDOWS
            && placer.open())
        {
            break;
        }
    }
    // A lease takes work; no other node's claim gets any from it.
    if !leases.is_empty() {
        changed = Change::Shown;
    }
    let claimed = Claimed {
        leases,
        cancel,
        requeue,
        plan: node.plan,
        node: node.name,
        recheck_in_ms: placer
            .recheck_at()
            .map(|at| u64::try_from(at - now).unwrap_or(0)),
    };
    Ok((claimed, changed))
}

/// Of `of`, the attempts a user asked to cancel, and those to stop and requeue, in the
/// order given.
async fn pending_cancels(
    tx: &mut dyn Tx,
    agent: AgentId,
    of: Vec<AttemptId>,
) -> Result<(Vec<AttemptId>, Vec<RequeueOrder>)> {
    if of.is_empty() {
        return Ok((vec![], vec![]));
    }
    let watching: Vec<String> = of.iter().map(AttemptId::to_string).collect();
    let wanted: HashMap<String, StopAsk> = tx
        .cancel_requested(agent, &watching)
        .await?
        .into_iter()
        .collect();
    let (mut cancel, mut requeue) = (Vec::new(), Vec::new());
    // In the order the agent asked.
    for (a, id) in watching.iter().zip(of) {
        match wanted.get(a) {
            Some(StopAsk::Cancel) => cancel.push(id),
            Some(&StopAsk::Requeue(why)) => requeue.push(RequeueOrder { attempt: id, why }),
            None => {}
        }
    }
    Ok((cancel, requeue))
}

pub(super) async fn renew(tx: &mut dyn Tx, r: Renewal) -> Result<(Renewed, Change)> {
    let node = nodes::of_agent(tx, r.agent, true).await?;
    // One read and one write for all of the agent's attempts, not two statements each: in a
    // lab of long runs, heartbeats are most of the database's work. The read locks the rows
    // in job order, as the lease sweep locks them: in the agent's order, a heartbeat and a
    // sweep could each wait for the other.
    let ids: Vec<String> = r.attempts.iter().map(|a| a.attempt.to_string()).collect();
    let rows = tx.lock_renewal_rows(&ids, r.agent).await?;
    // A stale token for any attempt refuses the whole heartbeat, before it writes.
    let mut renew = Vec::new();
    for (a, id) in r.attempts.iter().zip(&ids) {
        if rules::renewal(a.attempt, a.fence, rows.get(id))? {
            renew.push((id.clone(), a.waiting.clone()));
        }
    }
    // Renewals change nothing anyone waits for; freed memory may let a claim place work.
    let now = tx.clock().await?;
    let freed = nodes::record_samples(tx, &node, &r.gpus, now).await?;
    let until = now.saturating_add(i64_of(r.lease_ttl_ms));
    let asked = tx.renew_attempts(&renew, until).await?;
    let (mut cancel, mut requeue) = (Vec::new(), Vec::new());
    for (a, id) in r.attempts.iter().zip(&ids) {
        match asked.get(id).cloned().flatten() {
            Some(StopAsk::Cancel) => cancel.push(a.attempt),
            Some(StopAsk::Requeue(why)) => requeue.push(RequeueOrder {
                attempt: a.attempt,
                why,
            }),
            None => {}
        }
    }
    let renewed = Renewed {
        cancel,
        requeue,
        plan: node.plan,
    };
    Ok((renewed, Change::freed_if(freed, &node.name)))
}

/// A supervisor renews its attempt's lease itself (its agent is away): fenced as a
/// heartbeat is; what was asked of the attempt.
pub(super) async fn renew_one(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    fence: i64,
    ttl_ms: u64,
) -> Result<(Option<StopAsk>, Change)> {
    check_fence(tx, attempt, fence).await?;
    let until = tx.clock().await?.saturating_add(i64_of(ttl_ms));
    let cancel = tx
        .extend_lease(&attempt.to_string(), until)
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    Ok((cancel, Change::None))
}

/// The digest of the attempt's key; `None` when it has none (leased before keys existed).
pub(super) async fn attempt_key(tx: &mut dyn Tx, attempt: AttemptId) -> Result<Option<String>> {
    tx.attempt_key(&attempt.to_string())
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))
}

pub(super) async fn start(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    fence: i64,
    pid: u32,
    at: Millis,
) -> Result<(Option<Started>, Change)> {
    let (mut job, phase) = check_fence(tx, attempt, fence).await?;
    if phase != AttemptPhase::Leased {
        return Ok((None, Change::None)); // a repeated report
    }
    let (started, timed_on) = mark_started(tx, attempt, &mut job, pid, at).await?;
    // A start frees nothing and queues nothing: watchers see it, claims sleep on; but a run
    // placed by memory phases is counted at its peak until its start says where its phases
    // fall: from then on its node holds less.
    let change = match timed_on {
        Some(node) => Change::Freed(node),
        None => Change::Shown,
    };
    Ok((Some(started), change))
}

/// A leased attempt's job runs: the one place an attempt's start is written (its start
/// report, or its end's report when that came first). With its node where it was placed by
/// memory phases.
async fn mark_started(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    job: &mut LockedJob,
    pid: u32,
    at: Millis,
) -> Result<(Started, Option<String>)> {
    let (submitted_at, number, timed_on) = tx
        .set_running(&attempt.to_string(), pid, at)
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    if job.state != JobState::Cancelled {
        jobs::transition(tx, job, JobEvent::Start).await?;
    }
    let started = Started {
        submitted_at,
        number,
    };
    Ok((started, timed_on))
}

pub(super) async fn finish(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    mut report: FinishReport,
) -> Result<(Finished, Change)> {
    let id = attempt.to_string();
    let not_found = || StoreError::not_found("attempt", attempt);
    // Only an end that quarantines its GPUs takes its node's row (before the job's, as every
    // operation does), so that no claim of the node places on them meanwhile. Others leave
    // it to the node's claims and heartbeats: holding it to the commit made a node's finishes
    // and claims run one at a time on PostgreSQL.
    if !report.cleanup_verified {
        tx.lock_node_of_attempt(&id).await?.ok_or_else(not_found)?;
    }
    // The job and then the attempt, locked by the read of what the end decides by.
    let FinishRead {
        job,
        job_state,
        node,
        row,
        requeue,
        rules: mut rules_of_job,
        results,
    } = tx.lock_finish_read(&id).await?.ok_or_else(not_found)?;
    let mut job = LockedJob {
        id: job,
        state: job_state,
    };
    let standing = rules::check_finish(attempt, report.fence, &row)?;
    if standing == rules::Report::Again {
        // Its supervisor reported it while the agent was away, and the agent's journal now
        // does: the end is recorded once.
        return Ok((
            Finished {
                job_state: job.state,
                started: None,
            },
            Change::None,
        ));
    }
    if let rules::Report::Late { refunded } = standing {
        // Undo what recording the attempt lost wrote to its job, before the report applies.
        rules_of_job.max_attempts = rules::undo_loss(rules_of_job.max_attempts, refunded);
        tx.set_job_tries(&job.id, rules_of_job.attempts, rules_of_job.max_attempts)
            .await?;
        tx.set_last_failure(&job.id, None).await?;
        tx.set_pending_reason(&job.id, None).await?;
    }
    let started = match report.started {
        Some(s) if standing == rules::Report::OnTime && row.fence.phase == AttemptPhase::Leased => {
            // Ended before its start report was taken: started here, as that report would.
            let at = s.started_at.timestamp_millis();
            Some(mark_started(tx, attempt, &mut job, s.pid, at).await?.0)
        }
        _ => None,
    };
    rules::apply_on_throttle(rules_of_job.on_throttle, &mut report);
    rules::check_requeue(&mut report, requeue);
    let ended = tx
        .set_ended(&id, &report, rules::peak_source(&report))
        .await?
        .ok_or_else(not_found)?;
    // The attempt was placed by the pair's memory; the job's own key learns its own.
    let estimate = rules::foreground_estimate(ended.estimate_mib, rules_of_job.background_mib);
    if report.oom_cause.is_none() {
        let (cause, neighbour) = match rules::oom_cause(&report, estimate) {
            Some(cause) => (Some(cause), None),
            // Blamed on a neighbour only with evidence that it stayed within its own
            // estimate, and not forever: past a few free tries its OOMs are its own again.
            None if report.failure == Some(FailureClass::Oom)
                && report
                    .peak_mem_mib
                    .zip(estimate)
                    .is_some_and(|(peak, e)| peak <= e)
                && tx.neighbour_grew_count(&job.id).await? < rules::FREE_OOM_RETRIES =>
            {
                let n = grown_neighbour(tx, &id, &node, &ended.gpus, &report.gpus).await?;
                if let Some((grew, Some(estimate))) = &n {
                    // It grew past what its memory phases counted it at: its key's runs are
                    // placed by their peak from now on, as after an OOM of its own.
                    if let Some(key) = tx.memory_key_of(grew).await? {
                        let stored = tx.lock_floor(&key).await?;
                        if let Some(floor) = rules::raised_floor(stored, *estimate) {
                            tx.set_floor(&key, floor).await?;
                        }
                    }
                }
                let n = n.map(|(grew, _)| grew);
                (n.is_some().then_some(OomCause::NeighbourGrew), n)
            }
            None => (None, None),
        };
        if let Some(cause) = cause {
            tx.set_oom_cause(&id, cause, neighbour.as_deref()).await?;
            report.oom_cause = Some(cause);
        }
    }
    let mut f = rules::finish(&rules_of_job, estimate, &report)?;
    if standing != rules::Report::OnTime {
        f.event = rules::late_event(f.event);
    }
    if let Some(reason) = &f.quarantine {
        for &gpu in &ended.gpus {
            let now = now_ms();
            tx.quarantine(&node, gpu, &id, reason, now).await?;
            super::alerts::quarantined(tx, &node, gpu, &id, reason, now).await?;
        }
    }
    if let Some(class) = f.last_failure {
        tx.set_last_failure(&job.id, Some(class)).await?;
    }
    if f.refund {
        tx.set_job_tries(
            &job.id,
            rules_of_job.attempts,
            rules_of_job.max_attempts + 1,
        )
        .await?;
    }
    if let Some(wanted) = f.floor {
        let stored = tx.lock_floor(&ended.memory_key).await?;
        if let Some(floor) = rules::raised_floor(stored, wanted) {
            tx.set_floor(&ended.memory_key, floor).await?;
        }
    }
    if let Some(l) = &f.ladder {
        tx.set_job_ladder(&job.id, l).await?;
    }
    let job_state = jobs::transition(tx, &mut job, f.event).await?;
    if report.failure.is_none() && rules_of_job.ladder_step > 0 {
        super::ladder::spread_fit(tx, &job.id, rules_of_job.ladder_step, &id).await?;
    }
    results::at_end(tx, &id, &results, report.metrics.as_ref(), now_ms()).await?;
    if !report.gpus.is_empty() {
        // Last: the row is held from here to the commit (every finish of the node writes it).
        tx.set_end_samples(&node, &report.gpus).await?;
    }
    // Its slot is free on its node; a job back in the queue is work for every node.
    let change = if job_state.is_terminal() {
        Change::Freed(node)
    } else {
        Change::Work
    };
    Ok((Finished { job_state, started }, change))
}

/// The neighbour that grew into an attempt's memory ([`rules::grown_neighbour`]): by the
/// samples its end carried, else by its node's latest ones. A neighbour placed by memory
/// phases grew past what they count it at now; then with the estimate it was placed by.
async fn grown_neighbour(
    tx: &mut dyn Tx,
    attempt: &str,
    node: &str,
    gpus: &[u32],
    at_end: &[GpuSample],
) -> Result<Option<(String, Option<u64>)>> {
    let now = now_ms();
    let active = tx.active_on(node).await?;
    let neighbours: Vec<rules::Neighbour> = active
        .iter()
        .map(|a| rules::Neighbour {
            attempt: a.id.clone(),
            gpus: a.gpus.clone(),
            estimate_mib: a.held_now(now),
        })
        .collect();
    let grew = match rules::grown_neighbour(attempt, gpus, at_end, &neighbours) {
        Some(n) => Some(n),
        None => {
            let latest = tx
                .nodes()
                .await?
                .into_iter()
                .find(|n| n.name == node)
                .map(|n| n.samples)
                .unwrap_or_default();
            rules::grown_neighbour(attempt, gpus, &latest, &neighbours)
        }
    };
    Ok(grew.map(|id| {
        let phased = active
            .iter()
            .find(|a| a.id == id)
            .and_then(|a| a.timed().and(a.estimate));
        (id, phased)
    }))
}

pub(super) async fn hand_back(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    fence: i64,
    gpus: Vec<GpuSample>,
) -> Result<((), Change)> {
    let id = attempt.to_string();
    let node = tx
        .lock_node_of_attempt(&id)
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    let (mut job, phase) = check_fence(tx, attempt, fence).await?;
    if phase != AttemptPhase::Leased {
        return Err(StoreError::StaleFence { attempt });
    }
    let on = tx
        .delete_attempt(&id)
        .await?
        .ok_or(StoreError::StaleFence { attempt })?;
    let until = tx.clock().await? + AVOID_AFTER_HAND_BACK_MS;
    for gpu in on {
        tx.avoid_gpu(&node, gpu, until).await?;
    }
    let r = jobs::job_rules(tx, &job.id).await?;
    let (left, event) = rules::hand_back(r.attempts);
    tx.set_job_tries(&job.id, left, r.max_attempts).await?;
    tx.set_node_samples(&node, &gpus, now_ms()).await?;
    jobs::transition(tx, &mut job, event).await?;
    Ok(((), Change::Work))
}

pub(super) async fn expire_due(tx: &mut dyn Tx) -> Result<(Vec<AttemptId>, Change)> {
    let now = tx.clock().await?;
    expire(tx, now).await
}

pub(super) async fn expire(tx: &mut dyn Tx, now: Millis) -> Result<(Vec<AttemptId>, Change)> {
    // Every replica sweeps: an attempt another sweep (or a late report) ended first is not
    // lost twice.
    let mut lost = Vec::new();
    for a in tx.expired(now).await? {
        // Checked again under the job's lock: a renewal may have committed since the read.
        if jobs::lose_attempt(tx, &a, Some(now)).await? {
            lost.push(parse(&a, "attempt id")?);
        }
    }
    let changed = Change::work_if(!lost.is_empty());
    Ok((lost, changed))
}

/// An attempt; `labelled`: with what the attempts beside it tell (`shared`).
pub(super) async fn attempt(tx: &mut dyn Tx, id: AttemptId, labelled: bool) -> Result<AttemptView> {
    let mut views = tx.attempt_views(AttemptsWhere::Id(&id.to_string())).await?;
    if labelled {
        super::sharing::label(tx, &mut views).await?;
    }
    views
        .pop()
        .ok_or_else(|| StoreError::not_found("attempt", id))
}

pub(super) async fn check_log_fence(tx: &mut dyn Tx, attempt: AttemptId, fence: i64) -> Result<()> {
    let (row, failure) = tx
        .log_fence_row(&attempt.to_string())
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", attempt))?;
    Ok(rules::check_log_fence(attempt, fence, &row, failure)?)
}

/// The placement snapshot of one node: its GPUs with plan slots, headroom, live free memory,
/// what is placed on them, and which are blocked (quarantined or avoided).
fn node_snapshot(
    node: &rows::NodeRow,
    samples: &[GpuSample],
    active: &[Active],
    blocked: &[u32],
    input: &ClaimInput,
    now: Millis,
) -> Snapshot {
    let (gpus, plan, headroom) = (&node.gpus, &node.plan, &node.headroom);
    Snapshot {
        // Attempts leased before host memory was admitted hold none by this count.
        host_free_mib: node.host_memory_mib.map(|usable| {
            let held: u64 = active.iter().filter_map(|a| a.host_mib).sum();
            usable.saturating_sub(held)
        }),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuState {
                index: g.index,
                total_mib: g.total_mib,
                slots: plan.slots(i),
                headroom_mib: headroom.mib_of(g.total_mib),
                live_free_mib: samples
                    .iter()
                    .find(|s| s.index == g.index)
                    .map(|s| s.free_mib),
                placed: active
                    .iter()
                    .filter(|a| a.gpus.contains(&g.index))
                    .map(|a| a.estimate)
                    .collect(),
                timed: crate::timeline::Timeline {
                    now_ms: now,
                    runs: active
                        .iter()
                        .filter(|a| a.gpus.contains(&g.index))
                        .filter_map(Active::timed)
                        .collect(),
                },
                held_alone: active.iter().any(|a| a.alone && a.gpus.contains(&g.index)),
                // A GPU whose last reading failed is unknown, so not placeable.
                quarantined: blocked.contains(&g.index)
                    || samples
                        .iter()
                        .any(|s| s.index == g.index && s.error.is_some()),
            })
            .collect(),
        cpu_jobs: active.iter().filter(|a| a.gpus.is_empty()).count() as u32,
        reserve_after_ms: input.reserve_after_ms,
    }
}

/// Where a claim's leases go.
struct LeaseTo<'a> {
    pub node: &'a str,
    /// The node's GPUs: a job that runs alone reserves the whole of each of its GPUs.
    pub gpus: &'a [headroom_shared::api::GpuInfo],
    pub agent: AgentId,
    pub now: Millis,
    pub ttl_ms: u64,
}

impl<'a> LeaseTo<'a> {
    pub fn new(node: &'a rows::NodeRow, input: &ClaimInput, now: Millis) -> Self {
        Self {
            node: &node.name,
            gpus: &node.gpus,
            agent: input.agent,
            now,
            ttl_ms: input.lease_ttl_ms,
        }
    }
}

impl LeaseTo<'_> {
    /// The GPU memory a lease reserves over its GPUs: its estimate on each, or each whole GPU
    /// for a job that runs alone.
    fn reserves(&self, slot: &Slot) -> u64 {
        let totals = slot.gpus.iter().map(|i| {
            self.gpus
                .iter()
                .find(|g| g.index == *i)
                .map_or(0, |g| g.total_mib)
        });
        fair::reservation(slot.estimate, totals)
    }
}

// ---- results ------------------------------------------------------------------------------

/// A running attempt's metrics so far (fenced, refused once it ended): kept, and its new
/// rungs decided; the answer says whether it is stopped.
pub(super) async fn report_metrics(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    fence: i64,
    metrics: headroom_shared::results::AttemptMetrics,
) -> Result<(headroom_shared::api::MetricsAnswer, Change)> {
    metrics.check().map_err(|message| StoreError::Invalid {
        field: "metrics".into(),
        message,
    })?;
    // An ended attempt's token is stale: its end's report carried the last word.
    check_fence(tx, attempt, fence).await?;
    let prune = results::record(tx, &attempt.to_string(), &metrics).await?;
    Ok((headroom_shared::api::MetricsAnswer { prune }, Change::None))
}

/// What an attempt's tracked run is made of: its view (figures, params, final metrics) and
/// its experiment's row.
pub(super) async fn tracking_record(
    tx: &mut dyn Tx,
    which: AttemptId,
) -> Result<(headroom_shared::api::AttemptView, super::tx::TrackingRow)> {
    let row = tx
        .tracking_row(&which.to_string())
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", which))?;
    let view = attempt(tx, which, true).await?;
    Ok((view, row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_a_few_times_what_it_can_take_then_looks_further_ahead() {
        assert_eq!(window_size(8, 1), 32);
        assert_eq!(window_size(1, 1), 32);
        assert_eq!(window_size(64, 1), 256);
        assert_eq!(window_size(8, 2), 64);
        assert_eq!(window_size(8, 5), 512);
        assert_eq!(window_size(1000, 1), CLAIM_WINDOW);
        assert_eq!(window_size(usize::MAX, 16), CLAIM_WINDOW);
        // Behind jobs that fit nowhere, a claim still looks thousands of jobs ahead.
        let ahead: u32 = (1..=CLAIM_WINDOWS).map(|k| window_size(1, k)).sum();
        assert!(ahead > 6000, "{ahead}");
    }
}
