//! Fair share and caps: how a lab's users divide the GPUs. Pure: the store reads each
//! waiting user's ledger, their runs not yet charged and their caps; this decides what a run
//! costs, the order users' jobs are looked at, and whether a cap holds a job back.
//!
//! A run costs the GPU memory its lease reserved times how long it ran (MiB-ms), so a 15 GiB
//! job costs more than a 2 GiB one beside it. Usage decays with a half-life: what a user ran
//! one half-life ago counts half. A user's standing is usage / share; waiting jobs go by
//! ascending standing, then by priority and submission within a user (Slurm's fair share,
//! counted in GPU memory rather than in CPUs).

use std::collections::HashMap;

use headroom_shared::api::UserLimits;
use headroom_shared::pending::{PendingReason, UserCapKind};

/// Milliseconds since the Unix epoch, the stores' time unit (fair share sits below `rules`,
/// which orders claims by it, so it names the unit itself).
type Millis = i64;

/// The default half-life of usage (Slurm's `PriorityDecayHalfLife`).
pub const DEFAULT_HALF_LIFE_MS: u64 = 7 * 24 * 3_600_000;

const MS_PER_HOUR: f64 = 3_600_000.0;

/// `value` after `elapsed_ms` of decay; a half-life of 0 forgets at once.
pub fn decay(value: f64, elapsed_ms: i64, half_life_ms: u64) -> f64 {
    if half_life_ms == 0 {
        return 0.0;
    }
    value * 0.5f64.powf(elapsed_ms.max(0) as f64 / half_life_ms as f64)
}

/// An attempt as fair share counts it: one not yet charged to its user's ledger (running,
/// or ended since the last charge).
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub user: String,
    /// GPU memory its lease reserved over all its GPUs.
    pub reserved_mib: u64,
    pub gpus: u32,
    pub started: Option<Millis>,
    pub ended: Option<Millis>,
}

impl Run {
    /// Its cost so far in MiB-ms, decayed from its end (a running one's is not decayed).
    pub fn cost(&self, now: Millis, half_life_ms: u64) -> f64 {
        let Some(started) = self.started else {
            return 0.0;
        };
        let end = self.ended.unwrap_or(now);
        let cost = self.reserved_mib as f64 * (end - started).max(0) as f64;
        decay(cost, now - end, half_life_ms)
    }

    /// It holds its GPUs now (leased or running).
    pub fn holds(&self) -> bool {
        self.ended.is_none()
    }
}

/// The GPU memory a lease reserves: its estimate on each of its GPUs (`totals`, one per
/// GPU), or each whole GPU for a job that runs alone (no estimate).
pub fn reservation(estimate: Option<u64>, totals: impl IntoIterator<Item = u64>) -> u64 {
    totals
        .into_iter()
        .map(|total| estimate.unwrap_or(total))
        .fold(0, u64::saturating_add)
}

/// A user's charged usage as stored: MiB-ms decayed up to `at`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub mib_ms: i64,
    pub at: Millis,
}

impl Ledger {
    /// Its usage decayed to `now`.
    pub fn at(&self, now: Millis, half_life_ms: u64) -> f64 {
        decay(self.mib_ms as f64, now - self.at, half_life_ms)
    }

    /// The ledger once `cost` (MiB-ms, as of `now`) is charged to it.
    pub fn charged(ledger: Option<Ledger>, cost: f64, now: Millis, half_life_ms: u64) -> Ledger {
        let before = ledger.map_or(0.0, |l| l.at(now, half_life_ms));
        Ledger {
            mib_ms: (before + cost).round().min(i64::MAX as f64) as i64,
            at: now,
        }
    }
}

/// A user's standing in fair share.
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    pub user: String,
    pub share: u32,
    /// Decayed usage, its runs not yet charged included.
    pub used_mib_ms: f64,
}

impl Standing {
    /// Usage per unit of share: the lower, the sooner the user's jobs go.
    pub fn normalized(&self) -> f64 {
        self.used_mib_ms / f64::from(self.share.max(1))
    }
}

/// Each user's standing now: their ledger decayed to `now` plus their runs not yet charged.
pub fn standings(
    users: &[(String, u32)],
    ledgers: &HashMap<String, Ledger>,
    runs: &[Run],
    now: Millis,
    half_life_ms: u64,
) -> Vec<Standing> {
    users
        .iter()
        .map(|(user, share)| {
            let charged = ledgers.get(user).map_or(0.0, |l| l.at(now, half_life_ms));
            let running: f64 = runs
                .iter()
                .filter(|r| &r.user == user)
                .map(|r| r.cost(now, half_life_ms))
                .sum();
            Standing {
                user: user.clone(),
                share: *share,
                used_mib_ms: charged + running,
            }
        })
        .collect()
}

/// The order users' waiting jobs go in: lowest standing first; on a tie, the user whose first
/// waiting job was submitted first (`head`, its sequence number), then by name, so every
/// replica orders the same.
pub fn order(mut standings: Vec<Standing>, head: &HashMap<String, i64>) -> Shares {
    standings.sort_by(|a, b| {
        a.normalized()
            .total_cmp(&b.normalized())
            .then_with(|| head.get(&a.user).cmp(&head.get(&b.user)))
            .then_with(|| a.user.cmp(&b.user))
    });
    Shares { order: standings }
}

/// The users of a claim's queue in the order their jobs go.
#[derive(Clone, Debug, Default)]
pub struct Shares {
    order: Vec<Standing>,
}

impl Shares {
    pub fn standings(&self) -> &[Standing] {
        &self.order
    }

    /// Where `user`'s jobs go (0 first); users without a standing go last.
    pub fn rank(&self, user: &str) -> usize {
        self.order
            .iter()
            .position(|s| s.user == user)
            .unwrap_or(self.order.len())
    }

    /// Whether `user` has used more than their share of what the users here used: their
    /// part of the usage above their part of the shares. Nobody is, while nobody used any.
    pub fn over(&self, user: &str) -> bool {
        self.part(user).is_some_and(|(used, share)| used > share)
    }

    /// Whether `user` has used less than their share (a user not here used nothing).
    pub fn under(&self, user: &str) -> bool {
        self.part(user).is_none_or(|(used, share)| used < share)
    }

    /// `user`'s part of the usage and of the shares, each from 0 to 1.
    fn part(&self, user: &str) -> Option<(f64, f64)> {
        let used: f64 = self.order.iter().map(|s| s.used_mib_ms).sum();
        let shares: f64 = self.order.iter().map(|s| f64::from(s.share.max(1))).sum();
        let own = self.order.iter().find(|s| s.user == user)?;
        if used <= 0.0 {
            return Some((0.0, 0.0));
        }
        Some((own.used_mib_ms / used, f64::from(own.share.max(1)) / shares))
    }

    /// Why `user`'s job that found no room waits: another user's jobs go first. `None` for
    /// the first user (their job waits for the resources alone).
    pub fn held_back(&self, user: &str) -> Option<PendingReason> {
        let first = self.order.first()?;
        let own = self.order.iter().find(|s| s.user == user)?;
        (first.user != user).then(|| PendingReason::FairShare {
            user: user.to_string(),
            used_mib_h: mib_hours_2sf(own.used_mib_ms),
            share: own.share,
            ahead: first.user.clone(),
            ahead_used_mib_h: mib_hours_2sf(first.used_mib_ms),
            ahead_share: first.share,
        })
    }
}

/// MiB-ms as MiB-hours to two significant figures: a pending reason's figure, which changes
/// when usage moves by some percent rather than at every claim (a change is a write).
pub fn mib_hours_2sf(mib_ms: f64) -> u64 {
    let h = mib_ms / MS_PER_HOUR;
    if h < 1.0 {
        return h.round() as u64;
    }
    let scale = 10f64.powi(h.log10().floor() as i32 - 1);
    ((h / scale).round() * scale) as u64
}

/// What a user's runs hold now: jobs, GPUs, and reserved GPU memory (MiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub jobs: u64,
    pub gpus: u64,
    pub mib: u64,
}

impl Held {
    pub fn add(&mut self, gpus: u32, mib: u64) {
        self.jobs += 1;
        self.gpus += u64::from(gpus);
        self.mib = self.mib.saturating_add(mib);
    }

    /// What `runs` (a user's) hold.
    pub fn of<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Held {
        let mut held = Held::default();
        for r in runs.into_iter().filter(|r| r.holds()) {
            held.add(r.gpus, r.reserved_mib);
        }
        held
    }
}

/// The cap of `limits` that one more job (`gpus` GPUs reserving `mib`) would pass, as its
/// pending reason; `None` when it stays within every cap.
pub fn over_cap(
    user: &str,
    limits: &UserLimits,
    held: &Held,
    gpus: u32,
    mib: u64,
) -> Option<PendingReason> {
    let checks = [
        (
            UserCapKind::Jobs,
            limits.max_jobs.map(u64::from),
            held.jobs,
            1,
        ),
        (
            UserCapKind::Gpus,
            limits.max_gpus.map(u64::from),
            held.gpus,
            u64::from(gpus),
        ),
        (UserCapKind::GpuMemory, limits.max_gpu_mib, held.mib, mib),
    ];
    checks.into_iter().find_map(|(cap, limit, held, more)| {
        let limit = limit?;
        (held.saturating_add(more) > limit).then(|| PendingReason::UserCap {
            user: user.to_string(),
            cap,
            limit,
            held,
        })
    })
}

/// The caps a claim applies: experiments' `max_concurrent` (the cap, their jobs leased or
/// running), users' caps (their limits, what they hold); this claim's leases are counted in
/// as it makes them.
#[derive(Clone, Debug, Default)]
pub struct Caps {
    pub experiments: HashMap<String, (u32, u32)>,
    pub users: HashMap<String, (UserLimits, Held)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H: u64 = 3_600_000;

    fn standing(user: &str, share: u32, used: f64) -> Standing {
        Standing {
            user: user.into(),
            share,
            used_mib_ms: used,
        }
    }

    #[test]
    fn a_run_costs_its_reserved_memory_times_its_time_decayed_from_its_end() {
        let run = |mib, ended| Run {
            user: "a".into(),
            reserved_mib: mib,
            gpus: 1,
            started: Some(0),
            ended,
        };
        // 15 GiB for an hour costs 7.5 times 2 GiB for the same hour.
        let big = run(15 * 1024, Some(H as i64)).cost(H as i64, H);
        let small = run(2 * 1024, Some(H as i64)).cost(H as i64, H);
        assert_eq!(big / small, 7.5);
        // One half-life after its end it counts half; a running one counts in full so far.
        assert_eq!(
            run(1024, Some(H as i64)).cost(2 * H as i64, H),
            1024.0 * H as f64 / 2.0
        );
        assert_eq!(run(1024, None).cost(2 * H as i64, H), 2048.0 * H as f64);
        // Leased, not started: nothing yet.
        let leased = Run {
            started: None,
            ..run(1024, None)
        };
        assert_eq!(leased.cost(H as i64, H), 0.0);
    }

    #[test]
    fn the_ledger_decays_then_adds() {
        let l = Ledger::charged(None, 1000.0, 0, H);
        assert_eq!(
            l,
            Ledger {
                mib_ms: 1000,
                at: 0
            }
        );
        let l = Ledger::charged(Some(l), 10.0, 2 * H as i64, H);
        assert_eq!(l.mib_ms, 260);
    }

    #[test]
    fn held_back_names_the_user_that_goes_first_with_the_figures() {
        let head = HashMap::new();
        let shares = order(
            vec![
                standing("alice", 1, 20.0 * 1024.0 * H as f64),
                standing("bob", 1, 0.0),
            ],
            &head,
        );
        assert_eq!(shares.rank("bob"), 0);
        assert_eq!(shares.held_back("bob"), None);
        let Some(PendingReason::FairShare {
            ahead, used_mib_h, ..
        }) = shares.held_back("alice")
        else {
            panic!("alice is held back");
        };
        assert_eq!(
            (ahead.as_str(), used_mib_h),
            ("bob", 20_000),
            "20 GiB-h, 2 figures"
        );
    }

    #[test]
    fn caps_name_the_one_a_job_would_pass() {
        let limits = UserLimits {
            max_gpus: Some(2),
            max_gpu_mib: Some(30 * 1024),
            ..Default::default()
        };
        let mut held = Held::default();
        held.add(1, 10 * 1024);
        assert_eq!(over_cap("a", &limits, &held, 1, 10 * 1024), None);
        held.add(1, 10 * 1024);
        let Some(PendingReason::UserCap {
            cap,
            limit,
            held: h,
            ..
        }) = over_cap("a", &limits, &held, 1, 1024)
        else {
            panic!("capped");
        };
        assert_eq!((cap, limit, h), (UserCapKind::Gpus, 2, 2));
        // A CPU-only job passes no GPU cap, but the memory cap still counts what it asks.
        assert_eq!(over_cap("a", &limits, &held, 0, 0), None);
    }

    #[test]
    fn figures_keep_two_significant_digits() {
        let mib_h = |h: f64| h * MS_PER_HOUR;
        assert_eq!(mib_hours_2sf(mib_h(0.4)), 0);
        assert_eq!(mib_hours_2sf(mib_h(7.0)), 7);
        assert_eq!(mib_hours_2sf(mib_h(1234.0)), 1200);
        assert_eq!(mib_hours_2sf(mib_h(98_765.0)), 99_000);
    }

    proptest! {
        /// The ordering rule: users go by usage per unit of share, lowest first, and every
        /// replica (any input order) orders the same.
        #[test]
        fn users_go_by_usage_per_share_whatever_order_they_are_read_in(
            users in proptest::collection::vec((1u32..5, 0u64..1_000_000), 1..12),
            seed in any::<u64>(),
        ) {
            let standings: Vec<Standing> = users
                .iter()
                .enumerate()
                .map(|(i, (share, used))| standing(&format!("u{i}"), *share, *used as f64))
                .collect();
            let head: HashMap<String, i64> = (0..users.len())
                .map(|i| (format!("u{i}"), (i as i64 * 7919 + seed as i64 % 13) % 101))
                .collect();
            let a = order(standings.clone(), &head);
            let mut shuffled = standings.clone();
            shuffled.rotate_left(seed as usize % standings.len());
            shuffled.reverse();
            let b = order(shuffled, &head);
            prop_assert_eq!(a.standings(), b.standings());
            for w in a.standings().windows(2) {
                prop_assert!(w[0].normalized() <= w[1].normalized());
            }
            // Doubling a user's share never moves them later.
            let doubled: Vec<Standing> = standings
                .iter()
                .map(|s| if s.user == "u0" { Standing { share: s.share * 2, ..s.clone() } } else { s.clone() })
                .collect();
            prop_assert!(order(doubled, &head).rank("u0") <= a.rank("u0"));
        }

        /// Over a long run the share of GPU time each of two always-waiting users gets
        /// follows their weights: a unit of time goes to the user of lowest standing.
        #[test]
        fn saturated_users_get_time_in_proportion_to_their_shares(
            wa in 1u32..4,
            wb in 1u32..4,
        ) {
            let mut used = [0.0f64, 0.0];
            let shares = [wa, wb];
            for _ in 0..6000 {
                let s = order(
                    vec![standing("a", wa, used[0]), standing("b", wb, used[1])],
                    &HashMap::new(),
                );
                let i = usize::from(s.standings()[0].user == "b");
                used[i] += 1.0;
            }
            let got = used[0] / used[1];
            let want = f64::from(shares[0]) / f64::from(shares[1]);
            prop_assert!((got / want - 1.0).abs() < 0.01, "{got} vs {want}");
        }
    }
}
