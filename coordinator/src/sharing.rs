//! Which attempts shared a GPU with another attempt, for how much of their run, and each
//! one's apportioned share of the GPU's energy. Pure: the store reads the attempts that ran
//! beside the ones asked for, this decides.
//!
//! An attempt's `energy_j` is its GPUs' counter delta over its run: the GPU's, other
//! attempts on it included. Its share splits each stretch between two counter readings (any
//! attempt's, on that GPU) among the attempts that ran through the stretch: by their
//! processes' mean utilization where each has one (`utilization_weighted`), else equally
//! (`time_weighted`). Either way the shares of a GPU's attempts add up to the GPU's counter
//! delta over their runs together.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use headroom_shared::AttemptId;
use headroom_shared::api::{AttemptView, CounterWindow, ShareMethod, Sharing};

/// A span of time, in milliseconds since the epoch.
type Span = (i64, i64);

/// An attempt's run, `ended_at` or `now` for one still running; `None` before its job ran.
fn run(a: &AttemptView, now: DateTime<Utc>) -> Option<Span> {
    let from = a.started_at?.timestamp_millis();
    let to = a.ended_at.unwrap_or(now).timestamp_millis();
    Some((from, to.max(from)))
}

fn overlap(a: Span, b: Span) -> Option<Span> {
    let span = (a.0.max(b.0), a.1.min(b.1));
    (span.0 < span.1).then_some(span)
}

/// The length of the union of `spans`.
fn covered(mut spans: Vec<Span>) -> i64 {
    spans.sort_unstable();
    let mut total = 0;
    let mut open: Option<Span> = None;
    for s in spans {
        match open {
            Some(o) if s.0 <= o.1 => open = Some((o.0, o.1.max(s.1))),
            _ => {
                total += open.map_or(0, |o| o.1 - o.0);
                open = Some(s);
            }
        }
    }
    total + open.map_or(0, |o| o.1 - o.0)
}

/// Sets `shared` and `sharing` on each of `views` from the attempts in `beside` (those that
/// ran on the same nodes around the same time; `views` themselves may be among them).
pub fn label(views: &mut [AttemptView], beside: &[AttemptView], now: DateTime<Utc>) {
    let near = Neighbours::of(beside, now);
    for v in views.iter_mut() {
        let sharing = with(v, &near.around(v, now), now);
        v.shared = sharing.is_some();
        v.sharing = sharing;
    }
}

/// Attempts by node, in the order they started, so that those around one are found without
/// looking at every other.
struct Neighbours<'a> {
    by_node: HashMap<&'a str, OnNode<'a>>,
}

/// A node's attempts, (start, attempt) in start order, and the longest run among them.
#[derive(Default)]
struct OnNode<'a> {
    started: Vec<(i64, &'a AttemptView)>,
    longest: i64,
}

impl<'a> Neighbours<'a> {
    fn of(beside: &'a [AttemptView], now: DateTime<Utc>) -> Self {
        let mut by_node: HashMap<&str, OnNode> = HashMap::new();
        for b in beside {
            if let Some((from, to)) = run(b, now) {
                let e = by_node.entry(b.node.as_str()).or_default();
                e.started.push((from, b));
                e.longest = e.longest.max(to - from);
            }
        }
        for n in by_node.values_mut() {
            n.started.sort_by_key(|(from, _)| *from);
        }
        Self { by_node }
    }

    /// Those of `a`'s node that started before it ended and may still have run when it
    /// started (no run is longer than the longest).
    fn around(&self, a: &AttemptView, now: DateTime<Utc>) -> Vec<&'a AttemptView> {
        let (Some(own), Some(n)) = (run(a, now), self.by_node.get(a.node.as_str())) else {
            return vec![];
        };
        let before_end = n.started.partition_point(|(from, _)| *from < own.1);
        n.started[..before_end]
            .iter()
            .rev()
            .take_while(|(from, _)| *from >= own.0 - n.longest)
            .map(|(_, b)| *b)
            .collect()
    }
}

/// How `a` shared its GPUs with the attempts in `beside`; `None`: it ran alone on them.
pub fn of(a: &AttemptView, beside: &[AttemptView], now: DateTime<Utc>) -> Option<Sharing> {
    with(a, &beside.iter().collect::<Vec<_>>(), now)
}

/// [`of`], over the attempts that may have run beside `a`.
fn with(a: &AttemptView, beside: &[&AttemptView], now: DateTime<Utc>) -> Option<Sharing> {
    let own = run(a, now)?;
    let gpus: BTreeSet<u32> = a.gpus.iter().copied().collect();
    let others: Vec<&AttemptView> = beside
        .iter()
        .copied()
        .filter(|b| b.id != a.id && b.node == a.node && b.gpus.iter().any(|g| gpus.contains(g)))
        .filter(|b| run(b, now).and_then(|r| overlap(own, r)).is_some())
        .collect();
    if others.is_empty() {
        return None;
    }
    let length = (own.1 - own.0).max(1);
    let shared_ms = covered(
        others
            .iter()
            .filter_map(|b| run(b, now).and_then(|r| overlap(own, r)))
            .collect(),
    );
    let with: BTreeSet<AttemptId> = others.iter().map(|b| b.id).collect();
    let shares: Option<Vec<(f64, bool)>> = a
        .gpus
        .iter()
        .map(|&g| share_on(a, g, &others, now))
        .collect();
    let by_utilization = shares.as_ref().is_some_and(|s| s.iter().all(|x| x.1));
    Some(Sharing {
        overlap: (shared_ms as f64 / length as f64).clamp(0.0, 1.0),
        with: with.into_iter().collect(),
        energy_share_j: shares.map(|s| s.iter().map(|x| x.0).sum()),
        share_method: if by_utilization {
            ShareMethod::UtilizationWeighted
        } else {
            ShareMethod::TimeWeighted
        },
    })
}

/// When an attempt without counter readings on a GPU was on it: its run.
fn run_on(a: &AttemptView, gpu: u32, now: DateTime<Utc>) -> Option<Span> {
    a.gpus.contains(&gpu).then(|| run(a, now)).flatten()
}

fn window(a: &AttemptView, gpu: u32) -> Option<&CounterWindow> {
    a.measurements
        .counters
        .iter()
        .find(|w| w.gpu == gpu && w.to_j >= w.from_j)
}

/// `a`'s share of GPU `gpu`'s energy over its counter window, and whether every stretch it
/// shared was split by utilization; `None` when it has no window there.
///
/// The counter is the GPU's own clock: readings by different processes are ordered by its
/// value (their timestamps may tie, or disagree by the time a reading takes), and a
/// neighbour with readings ran through a stretch when its window holds both ends. A stretch
/// is split by the attempts' per-process utilization where every attempt in it has one
/// (and they add up to more than 0), else equally. Time only spreads a stretch over
/// neighbours that have no readings of their own (and so no utilization).
fn share_on(
    a: &AttemptView,
    gpu: u32,
    others: &[&AttemptView],
    now: DateTime<Utc>,
) -> Option<(f64, bool)> {
    let own = window(a, gpu)?;
    let micros = |t: DateTime<Utc>| t.timestamp_micros();
    let mut points: Vec<(f64, i64)> =
        vec![(own.from_j, micros(own.from)), (own.to_j, micros(own.to))];
    let mut read: Vec<&CounterWindow> = Vec::new();
    let mut unread: Vec<Span> = Vec::new();
    for b in others {
        match window(b, gpu) {
            Some(w) => {
                read.push(w);
                for (j, t) in [(w.from_j, w.from), (w.to_j, w.to)] {
                    if own.from_j < j && j < own.to_j {
                        points.push((j, micros(t)));
                    }
                }
            }
            None => unread.extend(run_on(b, gpu, now).map(|(s, e)| (s * 1000, e * 1000))),
        }
    }
    points.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let mut share = 0.0;
    let mut by_utilization = true;
    for pair in points.windows(2) {
        let ((j0, t0), (j1, t1)) = (pair[0], pair[1]);
        if j1 <= j0 {
            continue;
        }
        let beside_read: Vec<&CounterWindow> = read
            .iter()
            .copied()
            .filter(|w| w.from_j <= j0 && j1 <= w.to_j)
            .collect();
        // Between two readings the energy is spread evenly over time (all that is known):
        // cut where a neighbour without readings came or went.
        let (t0, t1) = (t0.min(t1), t0.max(t1));
        let mut cuts: Vec<i64> = unread
            .iter()
            .flat_map(|p| [p.0, p.1])
            .filter(|&c| t0 < c && c < t1)
            .chain([t0, t1])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let energy = j1 - j0;
        let pieces: Vec<(f64, usize)> = if cuts.len() < 2 {
            // No time between them: whoever was there at that instant.
            let beside = unread.iter().filter(|p| p.0 <= t0 && t0 <= p.1).count();
            vec![(energy, beside)]
        } else {
            cuts.windows(2)
                .map(|piece| {
                    let (p0, p1) = (piece[0], piece[1]);
                    let beside = unread.iter().filter(|p| p.0 <= p0 && p1 <= p.1).count();
                    (energy * (p1 - p0) as f64 / (t1 - t0) as f64, beside)
                })
                .collect()
        };
        for (energy, beside_unread) in pieces {
            if beside_read.is_empty() && beside_unread == 0 {
                share += energy;
                continue;
            }
            let weights: Option<f64> = beside_read.iter().map(|w| w.util_pct).sum();
            match (own.util_pct, weights) {
                (Some(mine), Some(theirs)) if beside_unread == 0 && mine + theirs > 0.0 => {
                    share += energy * mine / (mine + theirs);
                }
                _ => {
                    by_utilization = false;
                    share += energy / (1 + beside_read.len() + beside_unread) as f64;
                }
            }
        }
    }
    Some((share, by_utilization))
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::JobId;
    use headroom_shared::api::{AttemptPhase, Measurements};

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("time")
    }

    /// An attempt on `node`'s `gpus` from `from` to `to` (ms), its counters read then, on a
    /// GPU whose counter reads `joules(ms)`.
    fn attempt(
        node: &str,
        gpus: &[u32],
        from: i64,
        to: i64,
        joules: fn(i64) -> f64,
    ) -> AttemptView {
        AttemptView {
            id: AttemptId::new(),
            job: JobId::new(),
            number: 1,
            node: node.into(),
            gpus: gpus.to_vec(),
            fence: 1,
            phase: AttemptPhase::Ended,
            leased_at: t(from),
            started_at: Some(t(from)),
            ended_at: Some(t(to)),
            pid: Some(1),
            exit_code: Some(0),
            signal: None,
            failure_class: None,
            success: Some(true),
            estimate_mib: None,
            peak_mem_mib: None,
            peak_source: None,
            cleanup_ms: None,
            cleanup_verified: Some(true),
            log_tail: None,
            estimate_source: String::new(),
            params: Default::default(),
            ladder_step: 0,
            contaminated: Some(false),
            measurements: Measurements {
                counters: gpus
                    .iter()
                    .map(|&gpu| CounterWindow {
                        gpu,
                        from: t(from),
                        to: t(to),
                        from_j: joules(from),
                        to_j: joules(to),
                        util_pct: None,
                    })
                    .collect(),
                ..Measurements::default()
            },
            submitted_by: String::new(),
            waiting: None,
            exclusive_wait_ms: None,
            cooldown_wait_ms: None,
            cooldown_from_temp_c: None,
            cooldown_start_temp_c: None,
            cooldown_timed_out: None,
            background_pid: None,
            background_ready_ms: None,
            background_exit_code: None,
            background_signal: None,
            background_exited_early: None,
            host_peak_mib: None,
            memory_cap_mib: None,
            oom_cause: None,
            oom_neighbour: None,
            shared: false,
            sharing: None,
            metrics: Default::default(),
            metrics_ignored: None,
            rungs: vec![],
            tracking: None,
        }
    }

    /// 100 W until 5 s, then 300 W: a second job's load on top.
    fn gpu_energy(ms: i64) -> f64 {
        let s = ms as f64 / 1000.0;
        if s <= 5.0 {
            100.0 * s
        } else {
            500.0 + 300.0 * (s - 5.0)
        }
    }

    #[test]
    fn overlapping_attempts_are_shared_and_their_shares_add_up_to_the_gpus_delta() {
        let a = attempt("n", &[0], 0, 10_000, gpu_energy);
        let b = attempt("n", &[0], 5_000, 15_000, gpu_energy);
        let mut views = vec![a.clone(), b.clone()];
        label(&mut views, &[a.clone(), b.clone()], t(20_000));
        let (sa, sb) = (
            views[0].sharing.clone().expect("a shared"),
            views[1].sharing.clone().expect("b shared"),
        );
        assert!(views[0].shared && views[1].shared);
        assert_eq!(sa.with, vec![b.id]);
        assert_eq!((sa.overlap, sb.overlap), (0.5, 0.5));
        // a: 0-5 s alone (500 J), 5-10 s half of 1500 J; b: half of that, then 10-15 s alone.
        let (ea, eb) = (sa.energy_share_j.expect("a"), sb.energy_share_j.expect("b"));
        assert!((ea - 1250.0).abs() < 1e-9, "{ea}");
        assert!((eb - (750.0 + 1500.0)).abs() < 1e-9, "{eb}");
        let union = gpu_energy(15_000) - gpu_energy(0);
        assert!((ea + eb - union).abs() < 1e-9);
        assert_eq!(sa.share_method, ShareMethod::TimeWeighted);
    }

    #[test]
    fn attempts_apart_in_time_gpus_or_nodes_are_not_shared() {
        let a = attempt("n", &[0], 0, 10_000, gpu_energy);
        let later = attempt("n", &[0], 10_000, 12_000, gpu_energy);
        let other_gpu = attempt("n", &[1], 0, 10_000, gpu_energy);
        let other_node = attempt("m", &[0], 0, 10_000, gpu_energy);
        let all = [a.clone(), later, other_gpu, other_node];
        assert_eq!(of(&a, &all, t(20_000)), None);
        // Not started yet: nothing shared.
        let mut waiting = attempt("n", &[0], 0, 10_000, gpu_energy);
        waiting.started_at = None;
        assert_eq!(of(&a, &[waiting], t(20_000)), None);
    }

    #[test]
    fn a_running_neighbour_counts_until_now_and_unknown_counters_give_no_share() {
        let a = attempt("n", &[0, 1], 0, 10_000, gpu_energy);
        let mut running = attempt("n", &[1], 8_000, 9_000, gpu_energy);
        running.ended_at = None;
        running.measurements.counters.clear();
        let s = of(&a, &[running.clone()], t(9_000)).expect("shared");
        assert!((s.overlap - 0.1).abs() < 1e-9, "{s:?}");
        // GPU 1 split for 8-9 s with an attempt whose counters are unknown: with no reading
        // in between, a's 10 s window's energy is spread evenly over it.
        let alone = 2.0 * gpu_energy(10_000);
        let split = gpu_energy(10_000) / 10.0 / 2.0;
        let e = s.energy_share_j.expect("a has its windows");
        assert!((e - (alone - split)).abs() < 1e-9, "{e}");

        let mut blind = a.clone();
        blind.measurements.counters.clear();
        assert_eq!(
            of(&blind, &[running], t(9_000))
                .expect("shared")
                .energy_share_j,
            None
        );
    }

    #[test]
    fn readings_at_one_instant_are_ordered_by_the_counter_and_nothing_is_lost() {
        // Both started within the same millisecond, b's start reading a moment after a's
        // (the counter moved 0.1 J between them); a's end reading stamped before b's start.
        let mut a = attempt("n", &[0], 0, 10_000, gpu_energy);
        let mut b = attempt("n", &[0], 0, 15_000, gpu_energy);
        b.measurements.counters[0].from_j += 0.1;
        a.measurements.counters[0].to = t(-1);
        let sa = of(&a, &[b.clone()], t(20_000)).and_then(|s| s.energy_share_j);
        let sb = of(&b, &[a.clone()], t(20_000)).and_then(|s| s.energy_share_j);
        let (sa, sb) = (sa.expect("a"), sb.expect("b"));
        assert!((sa + sb - gpu_energy(15_000)).abs() < 1e-9, "{sa} + {sb}");
        // The 0.1 J before b's first reading is a's alone.
        assert!(
            (sa - (0.1 + (gpu_energy(10_000) - 0.1) / 2.0)).abs() < 1e-9,
            "{sa}"
        );
    }

    #[test]
    fn per_process_utilization_weighs_the_shares_where_every_attempt_has_it() {
        let mut a = attempt("n", &[0], 0, 10_000, gpu_energy);
        let mut b = attempt("n", &[0], 5_000, 15_000, gpu_energy);
        a.measurements.counters[0].util_pct = Some(20.0);
        b.measurements.counters[0].util_pct = Some(60.0);
        let sa = of(&a, &[b.clone()], t(20_000)).expect("a shared");
        let sb = of(&b, &[a.clone()], t(20_000)).expect("b shared");
        assert_eq!(sa.share_method, ShareMethod::UtilizationWeighted);
        assert_eq!(sb.share_method, ShareMethod::UtilizationWeighted);
        let (ea, eb) = (sa.energy_share_j.expect("a"), sb.energy_share_j.expect("b"));
        // 5-10 s (1500 J) split 1:3; each has its time alone to itself.
        assert!((ea - (500.0 + 375.0)).abs() < 1e-9, "{ea}");
        assert!((eb - (1125.0 + 1500.0)).abs() < 1e-9, "{eb}");
        assert!((ea + eb - gpu_energy(15_000)).abs() < 1e-9);

        // One of them without it: both split equally, and say so.
        b.measurements.counters[0].util_pct = None;
        let sa = of(&a, &[b.clone()], t(20_000)).expect("a shared");
        assert_eq!(sa.share_method, ShareMethod::TimeWeighted);
        assert!((sa.energy_share_j.expect("a") - 1250.0).abs() < 1e-9);
        // Neither used the SMs: nothing to weigh by.
        a.measurements.counters[0].util_pct = Some(0.0);
        b.measurements.counters[0].util_pct = Some(0.0);
        let sa = of(&a, &[b], t(20_000)).expect("a shared");
        assert_eq!(sa.share_method, ShareMethod::TimeWeighted);
    }

    #[test]
    fn label_finds_a_long_neighbour_that_started_long_before_among_many() {
        let long = attempt("n", &[0], 0, 200_000, gpu_energy);
        let mut beside = vec![long.clone()];
        // A hundred short runs on GPU 1 in between, and one after.
        beside.extend((0..100).map(|i| attempt("n", &[1], i * 1_000, i * 1_000 + 500, gpu_energy)));
        let late = attempt("n", &[0], 300_000, 301_000, gpu_energy);
        let mut views = vec![
            attempt("n", &[0], 150_000, 151_000, gpu_energy),
            late.clone(),
        ];
        beside.push(views[0].clone());
        beside.push(late);
        label(&mut views, &beside, t(400_000));
        let s = views[0].sharing.clone().expect("shared with the long run");
        assert_eq!(s.with, vec![long.id]);
        assert!(!views[1].shared, "{:?}", views[1].sharing);
        // The same answer as looking at every other.
        assert_eq!(views[0].sharing, of(&views[0], &beside, t(400_000)));
    }

    #[test]
    fn unions_of_spans() {
        assert_eq!(covered(vec![(0, 5), (3, 8), (10, 12)]), 10);
        assert_eq!(covered(vec![]), 0);
        assert_eq!(covered(vec![(2, 4), (0, 10)]), 10);
    }
}
