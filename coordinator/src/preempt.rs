//! Preemption: which running jobs of `preemptible` experiments to stop (after their
//! checkpoint signal) and requeue, so that a waiting job of a user under their share, or of
//! higher priority, gets the GPU memory they hold. Pure, over the nodes as a claim would see
//! them; the fewest jobs that make room, and nothing while room is already on its way.

use crate::fair::Shares;
use crate::placement::GpuState;

/// A running attempt, as preemption weighs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub attempt: String,
    pub job: String,
    pub user: String,
    pub priority: i64,
    pub gpus: Vec<u32>,
    /// What it is placed by (`None`: it runs alone on its GPUs).
    pub estimate: Option<u64>,
    /// Its job needs its GPUs to itself (`exclusive`, `cooldown`).
    pub alone: bool,
    /// Its experiment is `preemptible`, and its job was not preempted lately.
    pub preemptible: bool,
    /// It was asked to stop already (a cancel, a requeue): its memory is on its way back.
    pub stopping: bool,
}

/// One node: its GPUs (with every live attempt's estimate placed) and its attempts.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub name: String,
    pub gpus: Vec<GpuState>,
    pub holders: Vec<Holder>,
}

/// A waiting job that found no room.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    pub job: String,
    pub user: String,
    pub priority: i64,
    pub gpus: u32,
    pub estimate: Option<u64>,
    pub alone: bool,
}

/// A decision: stop `attempt` (of `job`) so that `for_job` fits on `node`'s GPU `gpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub attempt: String,
    pub job: String,
    pub for_job: String,
    pub node: String,
    pub gpu: u32,
}

/// Whether `waiter` may take what `holder` holds: its user is under their share and the
/// holder's over theirs, or it has a higher priority and its user's jobs do not go after the
/// holder's (the claim that follows must place it, not the holder's job again).
pub fn may_preempt(waiter: &Waiter, holder: &Holder, shares: &Shares) -> bool {
    if !holder.preemptible || holder.stopping {
        return false;
    }
    let by_share =
        waiter.user != holder.user && shares.under(&waiter.user) && shares.over(&holder.user);
    let by_priority =
        waiter.priority > holder.priority && shares.rank(&waiter.user) <= shares.rank(&holder.user);
    by_share || by_priority
}

/// The preemptions that let `waiters` (in the order they go) run: for each, nothing when
/// some GPU has room for it already (attempts being stopped count as gone), else the fewest
/// holders it may preempt on one GPU that make room for it (the least memory on a tie).
/// Room made for one waiter is not counted again for the next. Waiters that need more than
/// one GPU are passed over.
pub fn choose(nodes: &mut [NodeView], waiters: &[Waiter], shares: &Shares) -> Vec<Preemption> {
    for n in nodes.iter_mut() {
        let stopping: Vec<Holder> = n.holders.iter().filter(|h| h.stopping).cloned().collect();
        for h in &stopping {
            remove(n, h);
        }
    }
    let mut out = Vec::new();
    for w in waiters.iter().filter(|w| w.gpus == 1) {
        if let Some((n, g)) = room_for(nodes, w) {
            nodes[n].gpus[g].placed.push(w.estimate);
            continue;
        }
        let Some((n, g, victims)) = fewest_victims(nodes, w, shares) else {
            continue;
        };
        let node = &mut nodes[n];
        let gpu = node.gpus[g].index;
        for v in &victims {
            remove(node, v);
            out.push(Preemption {
                attempt: v.attempt.clone(),
                job: v.job.clone(),
                for_job: w.job.clone(),
                node: node.name.clone(),
                gpu,
            });
        }
        node.gpus[g].placed.push(w.estimate);
    }
    out
}

/// A GPU with room for `w` now: (node, GPU) positions.
fn room_for(nodes: &[NodeView], w: &Waiter) -> Option<(usize, usize)> {
    nodes.iter().enumerate().find_map(|(n, node)| {
        node.gpus
            .iter()
            .position(|g| g.leftover_for(w.estimate, w.alone).is_some())
            .map(|g| (n, g))
    })
}

/// Over every GPU, the fewest holders `w` may preempt that make room for it.
fn fewest_victims(
    nodes: &[NodeView],
    w: &Waiter,
    shares: &Shares,
) -> Option<(usize, usize, Vec<Holder>)> {
    let mut best: Option<(usize, u64, usize, usize, Vec<Holder>)> = None;
    for (n, node) in nodes.iter().enumerate() {
        for (g, gpu) in node.gpus.iter().enumerate() {
            if gpu.quarantined {
                continue;
            }
            let mut eligible: Vec<&Holder> = node
                .holders
                .iter()
                .filter(|h| h.gpus.contains(&gpu.index) && may_preempt(w, h, shares))
                .collect();
            // Largest first: the fewest that make room.
            eligible.sort_by_key(|h| std::cmp::Reverse(holds(h, gpu)));
            let mut trial = node.clone();
            let mut chosen: Vec<Holder> = Vec::new();
            for h in eligible {
                if fits(&trial, g, w) {
                    break;
                }
                remove(&mut trial, h);
                chosen.push(h.clone());
            }
            if chosen.is_empty() || !fits(&trial, g, w) {
                continue;
            }
            // None more than needed: give back, smallest first, any the waiter fits without.
            chosen.sort_by_key(|h| holds(h, gpu));
            let mut i = 0;
            while i < chosen.len() {
                let mut without = node.clone();
                for (j, h) in chosen.iter().enumerate() {
                    if j != i {
                        remove(&mut without, h);
                    }
                }
                if fits(&without, g, w) {
                    chosen.remove(i);
                } else {
                    i += 1;
                }
            }
            let freed: u64 = chosen.iter().map(|h| holds(h, gpu)).sum();
            let better = best
                .as_ref()
                .is_none_or(|b| (chosen.len(), freed) < (b.0, b.1));
            if better {
                best = Some((chosen.len(), freed, n, g, chosen));
            }
        }
    }
    best.map(|(_, _, n, g, v)| (n, g, v))
}

fn fits(node: &NodeView, g: usize, w: &Waiter) -> bool {
    node.gpus[g].leftover_for(w.estimate, w.alone).is_some()
}

/// What `h` holds of `gpu` (a job that runs alone holds all of it).
fn holds(h: &Holder, gpu: &GpuState) -> u64 {
    h.estimate.unwrap_or(gpu.total_mib)
}

/// Takes `h` off its node: its estimate off each of its GPUs, and the GPUs it held alone
/// free of that.
fn remove(node: &mut NodeView, h: &Holder) {
    let Some(at) = node.holders.iter().position(|x| x.attempt == h.attempt) else {
        return;
    };
    node.holders.remove(at);
    for gpu in node.gpus.iter_mut().filter(|g| h.gpus.contains(&g.index)) {
        if let Some(i) = gpu.placed.iter().position(|p| *p == h.estimate) {
            gpu.placed.remove(i);
        }
        gpu.held_alone = node
            .holders
            .iter()
            .any(|x| x.alone && x.gpus.contains(&gpu.index));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fair::{self, Standing};
    use proptest::prelude::*;
    use std::collections::HashMap;

    const GIB: u64 = 1024;

    fn gpu(index: u32, slots: u32) -> GpuState {
        GpuState {
            timed: Default::default(),
            index,
            total_mib: 24 * GIB,
            slots,
            headroom_mib: 0,
            live_free_mib: None,
            placed: vec![],
            quarantined: false,
            held_alone: false,
        }
    }

    fn holder(attempt: &str, user: &str, gib: u64, preemptible: bool) -> Holder {
        Holder {
            attempt: attempt.into(),
            job: format!("job-{attempt}"),
            user: user.into(),
            priority: 0,
            gpus: vec![0],
            estimate: Some(gib * GIB),
            alone: false,
            preemptible,
            stopping: false,
        }
    }

    fn node(slots: u32, holders: Vec<Holder>) -> NodeView {
        let mut g = gpu(0, slots);
        g.placed = holders.iter().map(|h| h.estimate).collect();
        NodeView {
            name: "n1".into(),
            gpus: vec![g],
            holders,
        }
    }

    fn waiter(user: &str, gib: u64) -> Waiter {
        Waiter {
            job: format!("w-{user}"),
            user: user.into(),
            priority: 0,
            gpus: 1,
            estimate: Some(gib * GIB),
            alone: false,
        }
    }

    /// `alice` has used a lot, `bob` nothing, with equal shares.
    fn shares() -> Shares {
        let s = |user: &str, used: f64| Standing {
            user: user.into(),
            share: 1,
            used_mib_ms: used,
        };
        fair::order(vec![s("alice", 1e9), s("bob", 0.0)], &HashMap::new())
    }

    #[test]
    fn the_fewest_jobs_that_make_room_are_preempted_and_only_from_an_over_share_user() {
        // 24 GiB: alice holds 4 + 8 + 10 (preemptible); bob needs 12.
        let mut nodes = vec![node(
            4,
            vec![
                holder("a4", "alice", 4, true),
                holder("a8", "alice", 8, true),
                holder("a10", "alice", 10, true),
            ],
        )];
        let got = choose(&mut nodes, &[waiter("bob", 12)], &shares());
        // 2 GiB are free: 10 alone frees 12.
        let stopped: Vec<&str> = got.iter().map(|p| p.attempt.as_str()).collect();
        assert_eq!(stopped, vec!["a10"]);
        assert_eq!(got[0].for_job, "w-bob");

        // Not preemptible: nothing. And alice may not preempt bob, who is under his share.
        let mut nodes = vec![node(4, vec![holder("a10", "alice", 22, false)])];
        assert!(choose(&mut nodes, &[waiter("bob", 12)], &shares()).is_empty());
        let mut nodes = vec![node(4, vec![holder("b", "bob", 22, true)])];
        assert!(choose(&mut nodes, &[waiter("alice", 12)], &shares()).is_empty());
    }

    #[test]
    fn nothing_is_preempted_while_room_is_free_or_on_its_way() {
        let mut nodes = vec![node(4, vec![holder("a", "alice", 10, true)])];
        assert!(choose(&mut nodes, &[waiter("bob", 12)], &shares()).is_empty());
        // Being stopped already: its memory counts as free, and it is not chosen again.
        let mut stopping = holder("a1", "alice", 20, true);
        stopping.stopping = true;
        let mut nodes = vec![node(4, vec![stopping, holder("a2", "alice", 4, true)])];
        assert!(choose(&mut nodes, &[waiter("bob", 12)], &shares()).is_empty());
    }

    #[test]
    fn a_full_plan_frees_a_slot_and_room_made_is_not_counted_twice() {
        // Two slots, both taken by alice's 2 GiB jobs: bob's 2 GiB job needs a slot.
        let mut nodes = vec![node(
            2,
            vec![
                holder("a1", "alice", 2, true),
                holder("a2", "alice", 2, true),
            ],
        )];
        let two = [waiter("bob", 2), {
            let mut w = waiter("bob", 2);
            w.job = "w-bob-2".into();
            w
        }];
        let got = choose(&mut nodes, &two, &shares());
        assert_eq!(got.len(), 2, "one slot each: {got:?}");
        assert_ne!(got[0].attempt, got[1].attempt);
    }

    #[test]
    fn a_higher_priority_preempts_its_own_user_s_lower_priority_job() {
        let mut low = holder("a", "alice", 20, true);
        low.priority = 0;
        let mut w = waiter("alice", 12);
        w.priority = 5;
        let mut nodes = vec![node(4, vec![low])];
        let got = choose(&mut nodes, &[w], &shares());
        assert_eq!(got.len(), 1);
        // A higher priority of a user whose jobs go after the holder's: not.
        let mut bobs = holder("b", "bob", 20, true);
        bobs.priority = 0;
        let mut w = waiter("alice", 12);
        w.priority = 9;
        let mut nodes = vec![node(4, vec![bobs])];
        assert!(choose(&mut nodes, &[w], &shares()).is_empty());
    }

    proptest! {
        /// Whatever the holders, what is chosen makes the waiter fit, and giving any one
        /// victim back would not: never more than needed.
        #[test]
        fn the_victims_are_enough_and_none_is_spare(
            sizes in proptest::collection::vec((1u64..12, any::<bool>()), 1..6),
            need in 1u64..24,
        ) {
            let holders: Vec<Holder> = sizes.iter().enumerate()
                .map(|(i, &(gib, p))| holder(&format!("a{i}"), "alice", gib, p))
                .collect();
            let used: u64 = sizes.iter().map(|s| s.0).sum();
            prop_assume!(used <= 24);
            let before = node(8, holders);
            let mut nodes = vec![before.clone()];
            let w = waiter("bob", need);
            let got = choose(&mut nodes, std::slice::from_ref(&w), &shares());
            if got.is_empty() {
                return Ok(());
            }
            let mut after = before.clone();
            for p in &got {
                let h = before.holders.iter().find(|h| h.attempt == p.attempt).expect("a holder");
                prop_assert!(h.preemptible);
                remove(&mut after, h);
            }
            prop_assert!(fits(&after, 0, &w));
            for p in &got {
                let mut spare = before.clone();
                for q in got.iter().filter(|q| q.attempt != p.attempt) {
                    let h = before.holders.iter().find(|h| h.attempt == q.attempt).expect("a holder");
                    remove(&mut spare, h);
                }
                prop_assert!(!fits(&spare, 0, &w), "{} was not needed", p.attempt);
            }
        }
    }
}
