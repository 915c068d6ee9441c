//! Placement: which pending jobs go on which GPUs of a node, as a pure function over a
//! snapshot, so the store, the simulator and property tests run the same code. It also says
//! why each job it could not place still waits (its pending reason).

use headroom_shared::pending::PendingReason;
use headroom_shared::phases::Phases;

use crate::timeline::{Millis, NewRun, Timeline};

/// Part of a GPU's memory an idle GPU may show used (driver context, ECC): 1/32, 2.5 GiB of
/// 80, 0.75 of 24; an H100 with nothing running reports about 0.5 GiB used.
const DRIVER_RESERVE_DIVISOR: u64 = 32;

/// Concurrent CPU-only (`gpus: 0`) jobs per node.
pub const CPU_SLOTS: u32 = 4;

/// One GPU of the node being placed on.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuState {
    pub index: u32,
    pub total_mib: u64,
    /// Slots from the node's plan.
    pub slots: u32,
    pub headroom_mib: u64,
    /// Live free memory reported by the agent's GPU backend, when known.
    pub live_free_mib: Option<u64>,
    /// Estimates of attempts already placed here (`None`: a job that runs alone).
    pub placed: Vec<Option<u64>>,
    /// An attempt's cleanup could not be verified here: place nothing until it is.
    pub quarantined: bool,
    /// An exclusive (or cooling) attempt holds it: its plan slots are all taken, in effect.
    pub held_alone: bool,
    /// The attempts placed here whose memory over time is known (each also in `placed`).
    pub timed: Timeline,
}

impl GpuState {
    fn estimated(&self) -> u64 {
        self.placed.iter().flatten().sum()
    }

    fn has_loner(&self) -> bool {
        self.placed.iter().any(Option::is_none)
    }

    /// No slot can be taken here: all are, in effect, for `alone` (a job that needs the GPU
    /// to itself) as soon as anything is placed.
    fn slots_full(&self, alone: bool) -> bool {
        self.placed.len() as u64 >= u64::from(self.slots)
            || self.has_loner()
            || self.held_alone
            || (alone && !self.placed.is_empty())
    }

    /// Memory left over after placing `estimate` here, or `None` when it does not fit.
    pub fn leftover_after(&self, estimate: Option<u64>) -> Option<u64> {
        self.leftover_for(estimate, false)
    }

    /// [`Self::leftover_after`] for a job that needs the GPU to itself when `alone`.
    pub fn leftover_for(&self, estimate: Option<u64>, alone: bool) -> Option<u64> {
        self.leftover_with(estimate, alone, None)
    }

    /// The most the attempts here and a run of `estimate` would hold together from now on:
    /// the estimates of the attempts without phases, and at the fullest instant the use of
    /// those with phases and of the new run (its estimate throughout when it has none).
    fn most_held_with(&self, estimate: u64, phases: Option<Phases>) -> (u64, NewRun) {
        let new = NewRun::of(estimate, phases, self.timed.now_ms);
        let flat = self.estimated().saturating_sub(self.timed.peaks());
        (flat + self.timed.most_held_with(&new), new)
    }

    /// [`Self::leftover_for`] for a run whose memory over time is known (`phases`): it fits
    /// where at no instant the GPU's runs would hold more than its memory less headroom.
    pub fn leftover_with(
        &self,
        estimate: Option<u64>,
        alone: bool,
        phases: Option<Phases>,
    ) -> Option<u64> {
        if self.quarantined || self.slots_full(alone) {
            return None;
        }
        let budget = self.total_mib.checked_sub(self.headroom_mib)?;
        match estimate {
            // No estimate: the job runs alone the first time, and alone still means the
            // live free memory must be the GPU's (a foreign process may hold it).
            None => (self.placed.is_empty()
                && self
                    .live_free_mib
                    .is_none_or(|free| free >= self.idle_free_mib()))
            .then_some(0),
            Some(e) => {
                let (most, new) = self.most_held_with(e, phases);
                let after = budget.checked_sub(most)?;
                // What is free now need only hold what the run holds as it starts.
                if let Some(free) = self.live_free_mib
                    && free.saturating_sub(self.headroom_mib) < new.held_first()
                {
                    return None;
                }
                Some(after)
            }
        }
    }

    /// Free memory that reads as an idle GPU: all of it but the headroom, or but what a
    /// driver keeps for itself when that is more (a real GPU never reports all its memory
    /// free: its context and ECC reserve), so that `--headroom 0` still lets a job with no
    /// estimate start.
    fn idle_free_mib(&self) -> u64 {
        let reserve = self.total_mib / DRIVER_RESERVE_DIVISOR;
        self.total_mib
            .saturating_sub(self.headroom_mib.max(reserve))
    }

    /// The soonest `estimate` (with `phases`) fits here by time alone: once the runs' phases
    /// here have moved on, with nothing else placed or ended. `None`: not before something
    /// else happens.
    fn fits_from(&self, estimate: u64, alone: bool, phases: Option<Phases>) -> Option<Millis> {
        let new = NewRun::of(estimate, phases, self.timed.now_ms);
        let mut then = self.clone();
        // What will be free then is not read yet: the estimates alone say.
        then.live_free_mib = None;
        self.timed.changes_for(&new).into_iter().find(|&at| {
            then.timed.now_ms = at;
            then.leftover_with(Some(estimate), alone, phases).is_some()
        })
    }

    /// Whether `estimate` could ever fit here once the GPU drains.
    fn could_fit_when_empty(&self, estimate: Option<u64>) -> bool {
        !self.quarantined
            && self.slots > 0
            && match estimate {
                None => true,
                Some(e) => self.total_mib.saturating_sub(self.headroom_mib) >= e,
            }
    }

    /// Why this GPU cannot take `estimate` now, if it cannot.
    fn blocker(&self, estimate: Option<u64>, alone: bool, phases: Option<Phases>) -> Blocker {
        if self.leftover_with(estimate, alone, phases).is_some() {
            return Blocker::Fits;
        }
        if self.quarantined {
            return Blocker::Quarantined;
        }
        if self.slots_full(alone) {
            return Blocker::Slot;
        }
        let budget = self.total_mib.saturating_sub(self.headroom_mib);
        // A job without an estimate needs the whole GPU (less headroom) to itself.
        let needed = estimate.unwrap_or(budget);
        // At the fullest instant of its run, what the others leave it.
        let others = match estimate {
            Some(e) => self.most_held_with(e, phases).0.saturating_sub(e),
            None => self.estimated(),
        };
        let mut available = budget.saturating_sub(others);
        if let Some(free) = self.live_free_mib {
            available = available.min(free.saturating_sub(self.headroom_mib));
        }
        Blocker::Memory { needed, available }
    }

    fn take(&mut self, estimate: Option<u64>, alone: bool, phases: Option<Phases>) {
        self.placed.push(estimate);
        self.held_alone |= alone;
        if let Some(e) = estimate {
            let new = NewRun::of(e, phases, self.timed.now_ms);
            if let Some(free) = self.live_free_mib.as_mut() {
                *free = free.saturating_sub(new.held_first());
            }
            self.timed.add(&new);
        }
    }
}

/// A pending job, in queue order (priority, then submission).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub gpus: u32,
    pub estimate_mib: Option<u64>,
    /// How long it has waited; past the reservation age it holds GPUs for itself.
    pub waited_ms: u64,
    /// It needs its GPUs to itself (`exclusive`, `cooldown`): placed only on GPUs with no
    /// other lease, and nothing else is placed there while it holds them.
    pub alone: bool,
    /// Host memory it holds (`resources.host_memory`, or learned); `None`: not admitted by it.
    pub host_mib: Option<u64>,
    /// Its memory over time, when declared: it may share a GPU whose runs peak elsewhere.
    pub phases: Option<Phases>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Position in the candidate list.
    pub candidate: usize,
    pub gpus: Vec<u32>,
}

#[derive(Clone, Debug)]
pub struct Snapshot {
    pub gpus: Vec<GpuState>,
    /// CPU-only jobs already running on the node.
    pub cpu_jobs: u32,
    /// Jobs older than this reserve GPUs instead of being overtaken forever.
    pub reserve_after_ms: u64,
    /// Host memory the node has left for jobs (its usable memory less what its attempts
    /// hold); `None`: the node does not admit by host memory.
    pub host_free_mib: Option<u64>,
}

/// Why one GPU cannot take a job now.
enum Blocker {
    Fits,
    Quarantined,
    Reserved,
    Slot,
    /// A slot is free, the memory is not.
    Memory {
        needed: u64,
        available: u64,
    },
}

/// A placement pass: what goes where, and why each job looked at and not placed waits.
#[derive(Clone, Debug, Default)]
pub struct Placed {
    pub placements: Vec<Placement>,
    /// By position in the candidate list.
    pub reasons: Vec<(usize, PendingReason)>,
}

/// Places candidates in order, best fit (least memory left over), at most `max` of them.
pub fn place(snapshot: &Snapshot, candidates: &[Candidate], max: usize) -> Vec<Placement> {
    place_explained(snapshot, candidates, max).placements
}

/// The pending reason of a job that did not fit on these GPUs (in their state after the
/// placements before it).
fn reason(gpus: &[GpuState], reserved: &[bool], c: &Candidate) -> PendingReason {
    if c.gpus as usize > gpus.len() {
        return PendingReason::TooManyGpus {
            wanted: c.gpus,
            max: gpus.len() as u32,
        };
    }
    if let Some(needed) = c.estimate_mib {
        let largest = gpus
            .iter()
            .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
            .max()
            .unwrap_or(0);
        if needed > largest {
            return PendingReason::LargerThanEveryGpu {
                needed_mib: needed,
                largest_mib: largest,
            };
        }
    }
    let blockers: Vec<Blocker> = gpus
        .iter()
        .zip(reserved)
        .map(
            |(g, &r)| match g.blocker(c.estimate_mib, c.alone, c.phases) {
                Blocker::Quarantined => Blocker::Quarantined,
                _ if r => Blocker::Reserved,
                b => b,
            },
        )
        .collect();
    let short = blockers
        .iter()
        .filter_map(|b| match b {
            Blocker::Memory { needed, available } => Some((*available, *needed)),
            _ => None,
        })
        .max();
    if let Some((available, needed)) = short {
        return PendingReason::NotEnoughMemory {
            needed_mib: needed,
            available_mib: available,
        };
    }
    if blockers.iter().any(|b| matches!(b, Blocker::Slot)) {
        PendingReason::NoFreeSlot
    } else if blockers.iter().any(|b| matches!(b, Blocker::Reserved)) {
        PendingReason::BehindReservation
    } else {
        PendingReason::GpuQuarantined
    }
}

/// `place`, and the pending reason of every candidate it looked at and did not place.
pub fn place_explained(snapshot: &Snapshot, candidates: &[Candidate], max: usize) -> Placed {
    Placer::new(snapshot).place(candidates, max)
}

/// One placement pass that may take its candidates in batches (a long queue read a window
/// at a time): what earlier batches placed and reserved holds for later ones, so the
/// batches together place exactly as one list would.
pub struct Placer {
    gpus: Vec<GpuState>,
    reserved: Vec<bool>,
    cpu_jobs: u32,
    reserve_after_ms: u64,
    host_free_mib: Option<u64>,
    largest_anywhere: Option<u64>,
    /// The soonest a job left waiting fits though nothing else happens (its neighbours'
    /// phases moved on), and the needs already looked at for it.
    recheck_at: Option<Millis>,
    rechecked: Vec<(u64, bool, Option<Phases>)>,
}

impl Placer {
    /// When to place again though nothing else happens: a job that needs a GPU waits, and a
    /// run with phases changes its use then (its peak begins or ends, or it is due).
    pub fn recheck_at(&self) -> Option<Millis> {
        self.recheck_at
    }

    /// The most memory a GPU of the node offers (its total less its headroom).
    pub fn largest_usable_mib(&self) -> Option<u64> {
        self.gpus
            .iter()
            .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
            .max()
    }

    /// The most memory any live GPU offers (less headroom), where it was looked up: see
    /// [`Self::know_largest_anywhere`]. `None`: not known.
    pub fn largest_anywhere_mib(&self) -> Option<u64> {
        self.largest_anywhere
    }

    /// Tells the pass the most memory any live GPU of the fleet offers, this node's or
    /// another's: a need past it will find no GPU however long it waits.
    pub fn know_largest_anywhere(&mut self, mib: Option<u64>) {
        self.largest_anywhere = mib.max(self.largest_usable_mib());
    }

    pub fn new(snapshot: &Snapshot) -> Self {
        Self {
            gpus: snapshot.gpus.clone(),
            reserved: vec![false; snapshot.gpus.len()],
            cpu_jobs: snapshot.cpu_jobs,
            reserve_after_ms: snapshot.reserve_after_ms,
            host_free_mib: snapshot.host_free_mib,
            largest_anywhere: None,
            recheck_at: None,
            rechecked: Vec::new(),
        }
    }

    /// Whether a later candidate could still be placed: a CPU slot, or a GPU neither
    /// quarantined nor reserved with a slot free. When none is, reading further down the
    /// queue is wasted.
    pub fn open(&self) -> bool {
        self.cpu_jobs < CPU_SLOTS || self.gpu_open()
    }

    /// Whether a later candidate that needs a GPU could still be placed: a GPU neither
    /// quarantined nor reserved with a slot free. When none is, only CPU-only jobs are worth
    /// reading further down the queue.
    pub fn gpu_open(&self) -> bool {
        self.open_gpus().next().is_some()
    }

    /// The GPUs neither quarantined nor reserved with a slot free.
    fn open_gpus(&self) -> impl Iterator<Item = &GpuState> {
        self.gpus
            .iter()
            .zip(&self.reserved)
            .filter(|(g, r)| !**r && !g.quarantined && !g.slots_full(false))
            .map(|(g, _)| g)
    }

    /// The most jobs this node could still take: the free slots of the GPUs neither
    /// quarantined nor reserved, and the free CPU slots (every job holds at least one).
    pub fn open_slots(&self) -> usize {
        let gpu_slots: u64 = self
            .open_gpus()
            .map(|g| u64::from(g.slots).saturating_sub(g.placed.len() as u64))
            .sum();
        let cpu_slots = CPU_SLOTS.saturating_sub(self.cpu_jobs);
        usize::try_from(gpu_slots + u64::from(cpu_slots)).unwrap_or(usize::MAX)
    }

    /// Places `candidates` in order after those of earlier batches, at most `max` of them;
    /// positions in the result are within this batch.
    pub fn place(&mut self, candidates: &[Candidate], max: usize) -> Placed {
        let (gpus, reserved) = (&mut self.gpus, &mut self.reserved);
        let mut out = Vec::new();
        let mut reasons = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            if out.len() >= max {
                break;
            }
            // The node's host memory is admitted like a GPU's: a job that would take more
            // than is left waits, whatever GPU it might find.
            if let (Some(free), Some(needed)) = (self.host_free_mib, c.host_mib)
                && needed > free
            {
                reasons.push((
                    i,
                    PendingReason::NotEnoughHostMemory {
                        needed_mib: needed,
                        available_mib: free,
                    },
                ));
                continue;
            }
            let host = &mut self.host_free_mib;
            let mut hold_host = || {
                if let (Some(free), Some(needed)) = (host.as_mut(), c.host_mib) {
                    *free -= needed;
                }
            };
            if c.gpus == 0 {
                if self.cpu_jobs < CPU_SLOTS {
                    hold_host();
                    self.cpu_jobs += 1;
                    out.push(Placement {
                        candidate: i,
                        gpus: vec![],
                    });
                } else {
                    reasons.push((i, PendingReason::NoFreeSlot));
                }
                continue;
            }
            let mut fitting: Vec<(u64, usize)> = gpus
                .iter()
                .enumerate()
                .filter(|(g, _)| !reserved[*g])
                .filter_map(|(g, gpu)| {
                    gpu.leftover_with(c.estimate_mib, c.alone, c.phases)
                        .map(|left| (left, g))
                })
                .collect();
            if fitting.len() >= c.gpus as usize {
                fitting.sort();
                let chosen: Vec<usize> = fitting
                    .iter()
                    .take(c.gpus as usize)
                    .map(|&(_, g)| g)
                    .collect();
                for &g in &chosen {
                    gpus[g].take(c.estimate_mib, c.alone, c.phases);
                }
                hold_host();
                let mut indices: Vec<u32> = chosen.iter().map(|&g| gpus[g].index).collect();
                indices.sort_unstable();
                out.push(Placement {
                    candidate: i,
                    gpus: indices,
                });
                continue;
            }
            reasons.push((i, reason(gpus, reserved, c)));
            // Each need once a pass: a queue holds many runs alike.
            let need = c.estimate_mib.map(|e| (e, c.alone, c.phases));
            if let Some(need @ (e, alone, phases)) = need
                && !self.rechecked.contains(&need)
            {
                self.rechecked.push(need);
                let soonest = gpus
                    .iter()
                    .zip(reserved.iter())
                    .filter(|(_, r)| !**r)
                    .filter_map(|(g, _)| g.fits_from(e, alone, phases))
                    .min();
                self.recheck_at = self.recheck_at.into_iter().chain(soonest).min();
            }
            if c.waited_ms >= self.reserve_after_ms {
                // A job that waited too long holds the GPUs most likely to free up for it,
                // so smaller jobs behind it stop overtaking it forever.
                let mut possible: Vec<(usize, u64, usize)> = gpus
                    .iter()
                    .enumerate()
                    .filter(|(g, gpu)| !reserved[*g] && gpu.could_fit_when_empty(c.estimate_mib))
                    .map(|(g, gpu)| (gpu.placed.len(), gpu.estimated(), g))
                    .collect();
                if possible.len() >= c.gpus as usize {
                    possible.sort();
                    for &(_, _, g) in possible.iter().take(c.gpus as usize) {
                        reserved[g] = true;
                    }
                }
            }
        }
        Placed {
            placements: out,
            reasons,
        }
    }
}

/// A live node as read-time reasons see it: its GPU count and its largest GPU's memory
/// less headroom.
pub struct LiveNode {
    pub gpus: u32,
    pub largest_mib: u64,
}

/// The reason a waiting job shows when read: what no claim pass can say (no live node, no
/// node with that many GPUs, nothing looked at it yet), and a claim's "larger than every
/// GPU" corrected when another live node has a GPU large enough (a claim sees its own node).
pub fn read_time_reason(
    gpus: u32,
    stored: Option<PendingReason>,
    live: &[LiveNode],
) -> PendingReason {
    let Some(max) = live.iter().map(|n| n.gpus).max() else {
        return PendingReason::NoLiveNode;
    };
    if gpus > max {
        return PendingReason::TooManyGpus { wanted: gpus, max };
    }
    let largest = live.iter().map(|n| n.largest_mib).max().unwrap_or(0);
    match stored {
        Some(PendingReason::LargerThanEveryGpu {
            needed_mib,
            largest_mib,
        }) if needed_mib <= largest => PendingReason::NotEnoughMemory {
            needed_mib,
            available_mib: largest_mib,
        },
        Some(r) => r,
        None => PendingReason::NotConsidered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(index: u32, total: u64, slots: u32) -> GpuState {
        GpuState {
            timed: Default::default(),
            index,
            total_mib: total,
            slots,
            headroom_mib: total / 10,
            live_free_mib: Some(total),
            placed: vec![],
            quarantined: false,
            held_alone: false,
        }
    }

    fn job(est: Option<u64>) -> Candidate {
        Candidate {
            phases: None,
            host_mib: None,
            gpus: 1,
            estimate_mib: est,
            waited_ms: 0,
            alone: false,
        }
    }

    fn exclusive(est: Option<u64>) -> Candidate {
        Candidate {
            phases: None,
            host_mib: None,
            alone: true,
            ..job(est)
        }
    }

    fn snap(gpus: Vec<GpuState>) -> Snapshot {
        Snapshot {
            host_free_mib: None,
            gpus,
            cpu_jobs: 0,
            reserve_after_ms: u64::MAX,
        }
    }

    /// A run of 100 s holding 2,000 MiB, 7 GiB in its last tenth (an evaluation at its end).
    fn evaluating(now_ms: i64) -> (u64, Phases, crate::timeline::TimedRun) {
        let phases = Phases {
            steady_mib: 2000,
            peak_from: 0.9,
            peak_until: 1.0,
            expected_ms: 100_000,
            margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
        };
        let run = crate::timeline::TimedRun::new(7168, phases, now_ms);
        (7168, phases, run)
    }

    /// Two runs of 7 GiB peaks do not fit a 10 GiB GPU (9 GiB less headroom) together
    /// unless their peaks fall apart: beside a run started 50 s ago (its peak due from 80 s
    /// on, widened by the margin) a second one's peak comes after the first is due, and it
    /// starts; beside one started now, or with no phases declared, it waits.
    #[test]
    fn runs_whose_peaks_fall_apart_share_a_gpu_and_runs_whose_peaks_meet_do_not() {
        let (peak, phases, first) = evaluating(0);
        let gpu_with = |now_ms: i64| {
            let mut g = gpu(0, 10_240, 4);
            g.placed = vec![Some(peak)];
            g.timed = Timeline {
                now_ms,
                runs: vec![first],
            };
            g.live_free_mib = Some(10_240 - 2000);
            g
        };
        let timed = Candidate {
            phases: Some(phases),
            ..job(Some(peak))
        };
        assert_eq!(
            place(
                &snap(vec![gpu_with(50_000)]),
                std::slice::from_ref(&timed),
                4
            )
            .len(),
            1
        );
        assert!(place(&snap(vec![gpu_with(0)]), std::slice::from_ref(&timed), 4).is_empty());
        assert!(place(&snap(vec![gpu_with(50_000)]), &[job(Some(peak))], 4).is_empty());
        // A run placed without phases holds its estimate throughout.
        let mut flat = gpu(0, 10_240, 4);
        flat.placed = vec![Some(peak)];
        flat.timed.now_ms = 50_000;
        assert!(place(&snap(vec![flat]), std::slice::from_ref(&timed), 4).is_empty());
        // The first run overdue (past 110 s): its phase is not known, it holds its peak.
        assert!(place(&snap(vec![gpu_with(111_000)]), &[timed], 4).is_empty());
    }

    /// Two runs placed in one pass each count the other's memory over time: the second of
    /// two started now would peak with the first.
    #[test]
    fn runs_placed_together_see_each_other_s_peaks() {
        let (peak, phases, _) = evaluating(0);
        let timed = Candidate {
            phases: Some(phases),
            ..job(Some(peak))
        };
        let placed = place(&snap(vec![gpu(0, 10_240, 4)]), &[timed.clone(), timed], 4);
        assert_eq!(placed.len(), 1);
    }

    /// A job that waits for a peak to pass is looked at again when it would fit by time
    /// alone (its own peak past its neighbour's end), not only at the next event.
    #[test]
    fn a_waiting_run_is_placed_again_when_a_neighbour_s_phase_changes() {
        let (peak, phases, first) = evaluating(0);
        let mut g = gpu(0, 10_240, 4);
        g.placed = vec![Some(peak)];
        g.timed = Timeline {
            now_ms: 1_000,
            runs: vec![first],
        };
        let mut placer = Placer::new(&snap(vec![g.clone()]));
        let timed = Candidate {
            phases: Some(phases),
            ..job(Some(peak))
        };
        assert!(
            placer
                .place(std::slice::from_ref(&timed), 4)
                .placements
                .is_empty()
        );
        // Started 30 s in, its peak (widened: from 110 s) comes as the first run is due.
        assert_eq!(placer.recheck_at(), Some(30_000));
        g.timed.now_ms = 29_999;
        assert!(place(&snap(vec![g.clone()]), std::slice::from_ref(&timed), 4).is_empty());
        g.timed.now_ms = 30_000;
        assert_eq!(place(&snap(vec![g]), &[timed], 4).len(), 1);
        // Nothing waits: nothing to look at again.
        let placer = Placer::new(&snap(vec![gpu(0, 10_240, 4)]));
        assert_eq!(placer.recheck_at(), None);
    }

    /// The live reading need only hold what a run starts with: beside a neighbour at its
    /// peak now, a run whose own peak comes after the neighbour's end starts, though the
    /// GPU has less free than its peak.
    #[test]
    fn a_run_with_phases_is_admitted_by_what_it_starts_with() {
        let (peak, phases, _) = evaluating(0);
        // A neighbour of 5 GiB (peak 5 GiB from 0 to 20 s of its 100 s run), at its peak.
        let neighbour = crate::timeline::TimedRun::new(
            5120,
            Phases {
                steady_mib: 1024,
                peak_from: 0.0,
                peak_until: 0.2,
                expected_ms: 100_000,
                margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
            },
            0,
        );
        let mut g = gpu(0, 10_240, 4);
        g.placed = vec![Some(5120)];
        g.timed = Timeline {
            now_ms: 5_000,
            runs: vec![neighbour],
        };
        g.live_free_mib = Some(10_240 - 5120);
        let timed = Candidate {
            phases: Some(phases),
            ..job(Some(peak))
        };
        assert_eq!(place(&snap(vec![g.clone()]), &[timed], 4).len(), 1);
        // Without phases it needs its 7 GiB free now.
        assert!(place(&snap(vec![g]), &[job(Some(peak))], 4).is_empty());
    }

    /// A node of 8 GiB of host memory for jobs takes two jobs holding 3 GiB each, whatever
    /// room its GPUs have; the third waits saying so, and a CPU-only job is held the same.
    #[test]
    fn host_memory_is_admitted_like_a_gpu_s() {
        let s = Snapshot {
            host_free_mib: Some(8 * 1024),
            ..snap(vec![gpu(0, 24_000, 4)])
        };
        let host = |gpus: u32| Candidate {
            phases: None,
            host_mib: Some(3 * 1024),
            gpus,
            ..job(Some(1000))
        };
        let placed = Placer::new(&s).place(&[host(1), host(1), host(1), host(0)], 8);
        let at: Vec<usize> = placed.placements.iter().map(|p| p.candidate).collect();
        assert_eq!(at, [0, 1]);
        for (i, r) in &placed.reasons {
            assert_eq!(
                r,
                &PendingReason::NotEnoughHostMemory {
                    needed_mib: 3 * 1024,
                    available_mib: 2 * 1024
                },
                "{i}"
            );
        }
        assert_eq!(placed.reasons.len(), 2);
        // A job that declares none, or a node that admits by none, is not held by it.
        let free = Candidate {
            phases: None,
            host_mib: None,
            ..host(1)
        };
        assert_eq!(
            Placer::new(&s)
                .place(&[host(1), host(1), free], 8)
                .placements
                .len(),
            3
        );
        assert_eq!(
            Placer::new(&snap(s.gpus.clone()))
                .place(&[host(1), host(1), host(1)], 8)
                .placements
                .len(),
            3
        );
    }

    #[test]
    fn slots_bound_concurrency() {
        let s = snap(vec![gpu(0, 24_000, 2), gpu(1, 24_000, 1)]);
        let jobs = vec![job(Some(1000)); 5];
        let placed = place(&s, &jobs, 10);
        assert_eq!(placed.len(), 3);
    }

    #[test]
    fn best_fit_picks_the_tightest_gpu() {
        let mut busy = gpu(1, 24_000, 2);
        busy.placed.push(Some(15_000));
        let s = snap(vec![gpu(0, 24_000, 2), busy]);
        let placed = place(&s, &[job(Some(5_000))], 10);
        assert_eq!(placed[0].gpus, vec![1]);
    }

    #[test]
    fn headroom_and_estimates_must_fit() {
        let mut g = gpu(0, 10_000, 4);
        g.placed.push(Some(5_000));
        let s = snap(vec![g]);
        // 5000 + 4000 + 1000 headroom = 10000 fits; 4001 does not.
        assert_eq!(place(&s, &[job(Some(4_000))], 1).len(), 1);
        assert_eq!(place(&s, &[job(Some(4_001))], 1).len(), 0);
    }

    /// `max_concurrent`: a claim leases no more of an experiment than its cap leaves room for
    /// (counting what already runs and what it leases itself), says why of the others, and
    /// places other experiments' jobs past them.
    #[test]
    fn a_claim_keeps_an_experiment_under_its_concurrency_cap() {
        use crate::rules::{PendingRow, claim};
        let pending = |id: &str, exp: &str| PendingRow {
            phases: None,
            first: true,
            id: id.into(),
            gpus: 1,
            declared: Some(1_000),
            since: 0,
            memory_key: "k".into(),
            reason: None,
            alone: false,
            background_mib: None,
            state: headroom_shared::JobState::Queued,
            cursor: Default::default(),
            experiment: exp.into(),
            user: "u".into(),
            max_concurrent: None,
            host_declared: None,
        };
        let s = snap(vec![gpu(0, 24_000, 8), gpu(1, 24_000, 8)]);
        let queue: Vec<PendingRow> = ["a1", "a2", "a3", "a4"]
            .iter()
            .map(|id| pending(id, "capped"))
            .chain([pending("b1", "free")])
            .collect();
        // A cap of 3 with one running: two more, then the free experiment's job.
        let mut caps = crate::fair::Caps {
            experiments: [("capped".to_string(), (3, 1))].into_iter().collect(),
            ..Default::default()
        };
        let plan = claim(
            &mut Placer::new(&s),
            &queue,
            &Default::default(),
            &mut caps,
            &Default::default(),
            0,
            8,
        );
        let leased: Vec<&str> = plan
            .leases
            .iter()
            .map(|l| queue[l.candidate].id.as_str())
            .collect();
        assert_eq!(leased, ["a1", "a2", "b1"]);
        assert_eq!(
            caps.experiments["capped"],
            (3, 3),
            "its count includes this claim's leases"
        );
        let said: Vec<(&str, String)> = plan
            .reasons
            .iter()
            .map(|(i, r)| (queue[*i].id.as_str(), r.to_string()))
            .collect();
        assert_eq!(
            said,
            [
                (
                    "a3",
                    "its experiment's max_concurrent: 3 of at most 3 leased or running".to_string()
                ),
                (
                    "a4",
                    "its experiment's max_concurrent: 3 of at most 3 leased or running".to_string()
                ),
            ]
        );
        // At its cap, the next claim leases none of it.
        let plan = claim(
            &mut Placer::new(&s),
            &queue[2..],
            &Default::default(),
            &mut caps,
            &Default::default(),
            0,
            8,
        );
        let leased: Vec<&str> = plan
            .leases
            .iter()
            .map(|l| queue[2 + l.candidate].id.as_str())
            .collect();
        assert_eq!(leased, ["b1"]);
    }

    /// A colocated pair is one attempt whose memory is the sum of the foreground's estimate
    /// and the background's memory: it fits where the sum fits, takes one slot, and the next
    /// job sees the sum placed.
    #[test]
    fn a_colocated_pair_needs_room_for_both_memories() {
        use crate::rules::{PendingRow, claim};
        let pending = |declared: Option<u64>, background: Option<u64>| PendingRow {
            phases: None,
            first: true,
            id: "j".into(),
            gpus: 1,
            declared,
            since: 0,
            memory_key: "k".into(),
            reason: None,
            alone: false,
            background_mib: background,
            state: headroom_shared::JobState::Queued,
            cursor: Default::default(),
            experiment: "e".into(),
            user: "u".into(),
            max_concurrent: None,
            host_declared: None,
        };
        let learned = Default::default();
        // 10000 total, 1000 headroom: 5000 + 4000 fits, 5000 + 4001 does not.
        let s = snap(vec![gpu(0, 10_000, 2)]);
        let fits = claim(
            &mut Placer::new(&s),
            &[pending(Some(5_000), Some(4_000))],
            &learned,
            &mut Default::default(),
            &Default::default(),
            0,
            1,
        );
        assert_eq!(fits.leases.len(), 1);
        assert_eq!(
            fits.leases[0].estimate,
            Some(9_000),
            "placed by the pair's sum"
        );
        let over = claim(
            &mut Placer::new(&s),
            &[pending(Some(5_000), Some(4_001))],
            &learned,
            &mut Default::default(),
            &Default::default(),
            0,
            1,
        );
        assert!(over.leases.is_empty());
        assert!(
            matches!(
                over.reasons[0].1,
                PendingReason::LargerThanEveryGpu {
                    needed_mib: 9_001,
                    largest_mib: 9_000
                }
            ),
            "{:?}",
            over.reasons
        );
        // The foreground alone (no background for this job) fits the same GPU easily.
        assert_eq!(
            claim(
                &mut Placer::new(&s),
                &[pending(Some(5_000), None)],
                &learned,
                &mut Default::default(),
                &Default::default(),
                0,
                1
            )
            .leases[0]
                .estimate,
            Some(5_000)
        );
        // A pair whose foreground has no estimate yet runs alone on its GPU.
        let alone = claim(
            &mut Placer::new(&s),
            &[pending(None, Some(4_000))],
            &learned,
            &mut Default::default(),
            &Default::default(),
            0,
            1,
        );
        assert_eq!(alone.leases[0].estimate, None);
        // The foreground's share is what its memory key learns from.
        assert_eq!(
            crate::rules::foreground_estimate(Some(9_000), Some(4_000)),
            Some(5_000)
        );
    }

    #[test]
    fn live_free_memory_catches_foreign_processes() {
        let mut g = gpu(0, 10_000, 4);
        g.live_free_mib = Some(3_000); // someone else holds 7 GiB
        let s = snap(vec![g]);
        assert_eq!(place(&s, &[job(Some(2_500))], 1).len(), 0);
        assert_eq!(place(&s, &[job(Some(2_000))], 1).len(), 1);
    }

    #[test]
    fn jobs_without_estimate_run_alone() {
        let s = snap(vec![gpu(0, 10_000, 4)]);
        let placed = place(&s, &[job(None), job(Some(100)), job(None)], 10);
        assert_eq!(placed.len(), 1);
        let mut g = gpu(0, 10_000, 4);
        g.placed.push(Some(100));
        assert!(place(&snap(vec![g]), &[job(None)], 1).is_empty());
    }

    #[test]
    fn a_loner_still_needs_the_live_free_memory() {
        // A foreign process holds 6 GiB of this 10 GiB GPU: "alone" does not fit.
        let mut g = gpu(0, 10_000, 4);
        g.live_free_mib = Some(4_000);
        let s = snap(vec![g.clone()]);
        assert!(place(&s, &[job(None)], 1).is_empty());
        let why = place_explained(&s, &[job(None)], 1).reasons;
        assert_eq!(
            why,
            vec![(
                0,
                PendingReason::NotEnoughMemory {
                    needed_mib: 9_000,
                    available_mib: 3_000
                }
            )]
        );
        // Within the headroom, the GPU counts as free.
        g.live_free_mib = Some(9_500);
        assert_eq!(place(&snap(vec![g]), &[job(None)], 1).len(), 1);
    }

    #[test]
    fn unplaced_jobs_say_why() {
        let mut full = gpu(0, 10_000, 1);
        full.placed.push(Some(1_000));
        let mut q = gpu(1, 10_000, 1);
        q.quarantined = true;
        let s = snap(vec![full.clone(), q.clone()]);
        let two = Candidate {
            phases: None,
            host_mib: None,
            gpus: 3,
            estimate_mib: Some(1),
            waited_ms: 0,
            alone: false,
        };
        let huge = job(Some(1 << 40));
        let why = place_explained(&s, &[job(Some(1_000)), two, huge], 10).reasons;
        assert_eq!(why[0], (0, PendingReason::NoFreeSlot));
        assert_eq!(
            why[1],
            (1, PendingReason::TooManyGpus { wanted: 3, max: 2 })
        );
        assert!(matches!(
            why[2],
            (
                2,
                PendingReason::LargerThanEveryGpu {
                    largest_mib: 9_000,
                    ..
                }
            )
        ));
        let only_q = snap(vec![q]);
        assert_eq!(
            place_explained(&only_q, &[job(Some(1))], 1).reasons,
            vec![(0, PendingReason::GpuQuarantined)]
        );
        // An old big job holds the GPU: the small one behind it waits for the reservation.
        let mut half = gpu(0, 10_000, 2);
        half.placed.push(Some(5_000));
        let mut s = snap(vec![half]);
        s.reserve_after_ms = 1;
        let big = Candidate {
            phases: None,
            host_mib: None,
            gpus: 1,
            estimate_mib: Some(8_000),
            waited_ms: 60_000,
            alone: false,
        };
        let why = place_explained(&s, &[big, job(Some(1_000))], 10).reasons;
        assert!(matches!(why[0].1, PendingReason::NotEnoughMemory { .. }));
        assert_eq!(why[1], (1, PendingReason::BehindReservation));
    }

    #[test]
    fn read_time_reasons_cover_what_no_claim_says() {
        let small = || LiveNode {
            gpus: 2,
            largest_mib: 21_000,
        };
        let big = LiveNode {
            gpus: 8,
            largest_mib: 72_000,
        };
        assert_eq!(read_time_reason(1, None, &[]), PendingReason::NoLiveNode);
        assert_eq!(
            read_time_reason(4, Some(PendingReason::NoFreeSlot), &[small()]),
            PendingReason::TooManyGpus { wanted: 4, max: 2 }
        );
        assert_eq!(
            read_time_reason(1, None, &[small()]),
            PendingReason::NotConsidered
        );
        let huge = PendingReason::LargerThanEveryGpu {
            needed_mib: 40_000,
            largest_mib: 21_000,
        };
        assert_eq!(read_time_reason(1, Some(huge.clone()), &[small()]), huge);
        // Another live node has a GPU large enough: it is only short on the node that looked.
        assert_eq!(
            read_time_reason(1, Some(huge), &[small(), big]),
            PendingReason::NotEnoughMemory {
                needed_mib: 40_000,
                available_mib: 21_000
            }
        );
    }

    #[test]
    fn an_exclusive_job_goes_only_on_a_gpu_with_no_other_lease() {
        let mut busy = gpu(0, 24_000, 2);
        busy.placed.push(Some(1_000));
        let s = snap(vec![busy.clone(), gpu(1, 24_000, 2)]);
        let placed = place(&s, &[exclusive(Some(1_000))], 10);
        assert_eq!(placed.len(), 1);
        assert_eq!(
            placed[0].gpus,
            vec![1],
            "best fit would pick the busy GPU 0"
        );
        // With only the busy GPU it waits for a slot, though slot and memory are free.
        let only_busy = snap(vec![busy]);
        assert_eq!(
            place_explained(&only_busy, &[exclusive(Some(1_000))], 1).reasons,
            vec![(0, PendingReason::NoFreeSlot)]
        );
    }

    #[test]
    fn nothing_joins_a_gpu_an_exclusive_attempt_holds() {
        // Plan 2 on one GPU: two exclusive jobs in one pass do not share it.
        let s = snap(vec![gpu(0, 24_000, 2)]);
        let placed = place(&s, &[exclusive(Some(1_000)), exclusive(Some(1_000))], 10);
        assert_eq!(placed.len(), 1);
        // Nor does an ordinary job after an exclusive one, in this pass or a later one.
        let placed = place(&s, &[exclusive(Some(1_000)), job(Some(1_000))], 10);
        assert_eq!(placed.len(), 1);
        let mut held = gpu(0, 24_000, 2);
        held.placed.push(Some(1_000));
        held.held_alone = true;
        let s = snap(vec![held]);
        assert!(place(&s, &[job(Some(1_000))], 10).is_empty());
        assert_eq!(
            place_explained(&s, &[job(Some(1_000))], 1).reasons,
            vec![(0, PendingReason::NoFreeSlot)]
        );
        // An ordinary job first still keeps the exclusive one off that GPU.
        let s = snap(vec![gpu(0, 24_000, 2)]);
        let placed = place(&s, &[job(Some(1_000)), exclusive(Some(1_000))], 10);
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].candidate, 0);
    }

    #[test]
    fn quarantined_gpus_take_nothing() {
        let mut q = gpu(0, 10_000, 4);
        q.quarantined = true;
        let s = snap(vec![q, gpu(1, 10_000, 1)]);
        let placed = place(&s, &[job(Some(100)), job(Some(100))], 10);
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].gpus, vec![1]);
    }

    #[test]
    fn multi_gpu_jobs_take_distinct_gpus() {
        let s = snap(vec![
            gpu(0, 10_000, 1),
            gpu(1, 10_000, 1),
            gpu(2, 10_000, 1),
        ]);
        let two = Candidate {
            phases: None,
            host_mib: None,
            gpus: 2,
            estimate_mib: Some(1_000),
            waited_ms: 0,
            alone: false,
        };
        let placed = place(&s, &[two.clone(), two], 10);
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].gpus.len(), 2);
    }

    #[test]
    fn an_old_large_job_is_not_overtaken_forever() {
        let mut a = gpu(0, 10_000, 2);
        a.placed.push(Some(5_000));
        let mut s = snap(vec![a]);
        let big = Candidate {
            phases: None,
            host_mib: None,
            gpus: 1,
            estimate_mib: Some(8_000),
            waited_ms: 60_000,
            alone: false,
        };
        let small = job(Some(1_000));
        // Young: the small job backfills.
        s.reserve_after_ms = 120_000;
        assert_eq!(place(&s, &[big.clone(), small.clone()], 10).len(), 1);
        // Old: the GPU is held for the big job.
        s.reserve_after_ms = 30_000;
        assert!(place(&s, &[big, small], 10).is_empty());
    }

    fn arb_gpu() -> impl Strategy<Value = GpuState> {
        (
            1_000u64..80_000,
            0u32..4,
            0u64..30,
            prop::option::of(0u64..80_000),
        )
            .prop_map(|(total, slots, pct, free)| GpuState {
                timed: Default::default(),
                index: 0,
                total_mib: total,
                slots,
                headroom_mib: total * pct / 100,
                live_free_mib: free.map(|f| f.min(total)),
                placed: vec![],
                quarantined: false,
                held_alone: false,
            })
    }

    #[test]
    fn a_job_with_no_estimate_starts_on_an_idle_gpu_with_no_headroom() {
        // An idle 80 GiB GPU as NVML reports it: about 0.5 GiB used by the driver.
        let idle = GpuState {
            timed: Default::default(),
            headroom_mib: 0,
            live_free_mib: Some(81_559 - 530),
            ..gpu(0, 81_559, 1)
        };
        assert_eq!(place(&snap(vec![idle.clone()]), &[job(None)], 1).len(), 1);
        // A foreign process holding 4 GiB is not the driver's reserve.
        let held = GpuState {
            timed: Default::default(),
            live_free_mib: Some(81_559 - 4_096),
            ..idle
        };
        assert!(place(&snap(vec![held]), &[job(None)], 1).is_empty());
    }

    #[test]
    fn a_placer_is_open_while_a_slot_is_free_and_not_reserved() {
        let mut full = gpu(0, 8_000, 1);
        full.placed.push(Some(100));
        let mut p = Placer::new(&Snapshot {
            host_free_mib: None,
            cpu_jobs: CPU_SLOTS,
            ..snap(vec![full.clone(), gpu(1, 8_000, 1)])
        });
        assert!(p.open());
        assert_eq!(p.place(&[job(Some(1_000))], 10).placements.len(), 1);
        assert!(!p.open(), "both GPUs' one slot is taken");
    }

    #[test]
    fn open_slots_count_free_slots_of_gpus_that_can_take_a_job_and_cpu_slots() {
        let mut half = gpu(0, 8_000, 2);
        half.placed.push(Some(100));
        let mut quarantined = gpu(1, 8_000, 3);
        quarantined.quarantined = true;
        let mut held = gpu(2, 8_000, 4);
        held.held_alone = true;
        let s = Snapshot {
            host_free_mib: None,
            cpu_jobs: CPU_SLOTS - 1,
            ..snap(vec![half, quarantined, held, gpu(3, 8_000, 2)])
        };
        let mut p = Placer::new(&s);
        // One on GPU 0, two on GPU 3, one CPU slot.
        assert_eq!(p.open_slots(), 4);
        p.place(&[job(Some(1_000))], 1);
        assert_eq!(p.open_slots(), 3);
    }

    proptest! {
        /// No placement takes more jobs than the placer's open slots: a claim sized by them
        /// leaves nothing out.
        #[test]
        fn open_slots_bound_what_can_be_placed(
            mut gpus in prop::collection::vec(arb_gpu(), 1..6),
            jobs in prop::collection::vec((0u32..3, prop::option::of(1u64..30_000), prop::bool::weighted(0.2)), 0..40),
            busy in prop::collection::vec((prop::option::of(1u64..10_000), prop::bool::weighted(0.3)), 0..6),
            cpu_jobs in 0u32..6,
        ) {
            for (i, g) in gpus.iter_mut().enumerate() { g.index = i as u32; }
            for (g, (est, alone)) in gpus.iter_mut().zip(&busy) {
                g.placed.push(*est);
                g.held_alone = *alone;
            }
            let cands: Vec<Candidate> = jobs.iter().map(|&(n, e, alone)| Candidate {
            phases: None, gpus: n, estimate_mib: e, waited_ms: 0, alone, host_mib: None }).collect();
            let mut placer = Placer::new(&Snapshot { cpu_jobs, ..snap(gpus) });
            let open = placer.open_slots();
            let placed = placer.place(&cands, usize::MAX).placements.len();
            prop_assert!(placed <= open, "{placed} placed, {open} open");
            prop_assert!(placer.open_slots() <= open - placed);
        }

        /// Whatever the queue, no GPU gets more jobs than slots or more estimated memory
        /// than total minus headroom, and a loner is alone.
        #[test]
        fn placements_respect_slots_memory_and_loners(
            mut gpus in prop::collection::vec(arb_gpu(), 1..6),
            jobs in prop::collection::vec((1u32..3, prop::option::of(1u64..30_000), prop::bool::weighted(0.2)), 0..30),
            max in 0usize..40,
            busy in prop::collection::vec((prop::option::of(1u64..10_000), prop::bool::weighted(0.3)), 0..6),
        ) {
            for (i, g) in gpus.iter_mut().enumerate() { g.index = i as u32; }
            // Some GPUs already hold a lease, exclusive or not.
            for (g, (est, alone)) in gpus.iter_mut().zip(&busy) {
                g.placed.push(*est);
                g.held_alone = *alone;
            }
            let cands: Vec<Candidate> = jobs.iter().map(|&(n, e, alone)| Candidate {
            phases: None, gpus: n, estimate_mib: e, waited_ms: 0, alone, host_mib: None }).collect();
            let s = snap(gpus.clone());
            let placed = place(&s, &cands, max);
            prop_assert!(placed.len() <= max);
            let mut per_gpu: Vec<Vec<Option<u64>>> = gpus.iter().map(|g| g.placed.clone()).collect();
            let mut alone_on: Vec<bool> = vec![false; gpus.len()];
            for p in &placed {
                let c = &cands[p.candidate];
                prop_assert_eq!(p.gpus.len(), c.gpus as usize);
                let mut dedup = p.gpus.clone(); dedup.dedup();
                prop_assert_eq!(dedup.len(), p.gpus.len());
                for &g in &p.gpus {
                    // Nothing joins a GPU an exclusive attempt holds, and an exclusive job
                    // goes only where nothing is placed.
                    prop_assert!(!gpus[g as usize].held_alone && !alone_on[g as usize]);
                    if c.alone { prop_assert!(per_gpu[g as usize].is_empty()); }
                    alone_on[g as usize] |= c.alone;
                    per_gpu[g as usize].push(c.estimate_mib);
                }
            }
            for (g, placed) in per_gpu.iter().enumerate() {
                let gpu = &gpus[g];
                let new = &placed[gpu.placed.len()..];
                if new.is_empty() { continue; }
                prop_assert!(placed.len() as u32 <= gpu.slots);
                if placed.iter().any(Option::is_none) {
                    prop_assert_eq!(placed.len(), 1);
                    // Alone still fits the live free memory: nothing foreign beyond the
                    // headroom, or beyond what a driver keeps for itself when that is more.
                    if let Some(free) = gpu.live_free_mib {
                        let kept = gpu.headroom_mib.max(gpu.total_mib / DRIVER_RESERVE_DIVISOR);
                        prop_assert!(free >= gpu.total_mib - kept);
                    }
                }
                let sum: u64 = placed.iter().flatten().sum();
                prop_assert!(sum + gpu.headroom_mib <= gpu.total_mib || placed.iter().all(Option::is_none));
                let sum_new: u64 = new.iter().flatten().sum();
                if let Some(free) = gpu.live_free_mib {
                    prop_assert!(sum_new <= free.saturating_sub(gpu.headroom_mib) || sum_new == 0);
                }
            }
            // Each candidate is placed at most once.
            let mut seen: Vec<usize> = placed.iter().map(|p| p.candidate).collect();
            seen.sort_unstable(); seen.dedup();
            prop_assert_eq!(seen.len(), placed.len());
        }

        /// A queue placed in windows places exactly as placed whole: a long queue read a
        /// window at a time changes nothing but the cost.
        #[test]
        fn batches_place_as_one_list(
            mut gpus in prop::collection::vec(arb_gpu(), 1..5),
            jobs in prop::collection::vec((0u32..3, prop::option::of(1u64..30_000), prop::bool::weighted(0.2), prop::bool::weighted(0.3)), 0..40),
            max in 0usize..40,
            window in 1usize..8,
        ) {
            for (i, g) in gpus.iter_mut().enumerate() { g.index = i as u32; }
            let cands: Vec<Candidate> = jobs.iter().map(|&(n, e, alone, old)| Candidate {
            phases: None,
                host_mib: None,
                gpus: n, estimate_mib: e, waited_ms: if old { 10_000 } else { 0 }, alone,
            }).collect();
            let s = Snapshot { reserve_after_ms: 5_000, ..snap(gpus) };
            let whole = place_explained(&s, &cands, max);
            let mut placer = Placer::new(&s);
            let mut batched = Placed::default();
            for (b, chunk) in cands.chunks(window).enumerate() {
                let left = max - batched.placements.len();
                let p = placer.place(chunk, left);
                let off = b * window;
                batched.placements.extend(p.placements.into_iter().map(|mut x| { x.candidate += off; x }));
                batched.reasons.extend(p.reasons.into_iter().map(|(i, r)| (i + off, r)));
                if batched.placements.len() >= max { break; }
            }
            prop_assert_eq!(whole.placements, batched.placements);
            prop_assert_eq!(whole.reasons, batched.reasons);
        }
    }
}
