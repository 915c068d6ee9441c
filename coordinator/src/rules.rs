//! The job rules, once for both stores: each transition's decision as a pure function over
//! a snapshot of the rows it touches, returning the writes to make. The backends only read
//! the snapshot (SQL, locks, one transaction) and write what the rule returns.

use std::collections::{BTreeMap, HashMap};

use headroom_shared::api::OomCause;
use headroom_shared::api::{
    AttemptPhase, AttemptRef, FinishReport, GpuSample, Headroom, PeakSource, Principal, Role,
};
use headroom_shared::checkpoint::Requeue;
use headroom_shared::pending::PendingReason;
use headroom_shared::phases::{DECLARED_MARGIN_PERMILLE, Phases};
use headroom_shared::routes::Access;
use headroom_shared::spec::OnThrottle;
use headroom_shared::{AttemptId, FailureClass, JobEvent, JobState, Plan};
use serde_json::Value;

use crate::fair::{self, Caps, Shares};
use crate::placement::{Candidate, Placement, Placer};
use crate::timeline::NewRun;

pub use crate::timeline::Millis;

/// What the rules refuse; the store maps each to its own error once.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("stale fencing token for attempt {attempt}: the lease was lost or reassigned")]
    StaleFence { attempt: AttemptId },
    #[error("plan: {0}")]
    InvalidPlan(#[from] headroom_shared::plan::PlanError),
    /// Stored data the rules cannot use (a headroom or command that no longer parses).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = Refusal> = std::result::Result<T, E>;

/// How long claims skip a GPU after an agent handed a lease on it back (its live memory did
/// not fit at launch): long enough for the memory to settle, short enough not to idle it.
pub const AVOID_AFTER_HAND_BACK_MS: i64 = 30_000;
/// Learned estimates keep this much above the observed p95 peak.
pub const LEARNED_MARGIN: f64 = 1.1;
/// The least margin a learned steady use is counted with ([`steady_margin`]).
pub const STEADY_MARGIN_FLOOR: f64 = 1.02;
/// Runs that must have taught a steady use before its margin narrows to their spread.
pub const AGREEING_RUNS: usize = 3;
/// The least margin, in thousandths of a run's length, learned phases place a run's timing
/// with ([`length_margin`]).
pub const LENGTH_MARGIN_FLOOR_PERMILLE: u64 = 30;
/// An OOM raises its key's estimate to at least this multiple of what the attempt had.
pub const OOM_BUMP: f64 = 1.25;

// ---- estimates ------------------------------------------------------------------------

/// How many of a key's most recent observed peaks its learned estimate is taken over: the
/// key's current behaviour, and a bounded read at every claim however many attempts it had.
pub const LEARNED_WINDOW: u32 = 256;

/// The estimate a job is placed by: max(declared, p95 of observed peaks (the key's latest
/// [`LEARNED_WINDOW`]) x 1.1, the key's floor after OOMs), and where it came from; `None` when
/// nothing is known. A declared figure that every observed peak kept within stands as it is:
/// the margin covers what runs taught, not a figure they confirmed (with it, a model declared
/// at its measured 4,810 MiB was placed at 5,291 once its first run ended). When the margin
/// alone would take it past `largest` (the most a GPU of the node offers) while the p95 peak
/// itself fits there, it runs alone on an idle GPU as a job with no estimate does (`None`): a
/// configuration that ran on such a GPU runs there again, rather than waiting as larger than
/// every GPU. A floor an OOM raised, or a declared figure, past the node's GPUs is kept: a
/// larger GPU may be elsewhere. A floor past `anywhere` (the most any live GPU offers) runs
/// alone on an idle GPU too: the GPU it would wait for does not exist, the most room there is
/// is a GPU of its own, and its attempts are bounded.
pub fn effective_estimate(
    declared: Option<u64>,
    observed_peaks: &mut [u64],
    floor: Option<u64>,
    largest: Option<u64>,
    anywhere: Option<u64>,
) -> (Option<u64>, &'static str) {
    observed_peaks.sort_unstable();
    let confirmed = declared.is_some_and(|d| observed_peaks.last().is_none_or(|&most| most <= d));
    let p95 = (!confirmed && !observed_peaks.is_empty()).then(|| {
        let i = ((observed_peaks.len() - 1) as f64 * 0.95).round() as usize;
        observed_peaks[i]
    });
    let learned = p95.map(|p| (p as f64 * LEARNED_MARGIN).ceil() as u64);
    if let (Some(p), Some(m), Some(l)) = (p95, learned, largest)
        && p <= l
        && m > l
        && floor.is_none_or(|f| f <= l)
        && declared.is_none_or(|d| d <= l)
    {
        return (None, "none");
    }
    if let (Some(f), Some(a)) = (floor, anywhere)
        && f > a
        && p95.is_none_or(|p| p <= a)
        && declared.is_none_or(|d| d <= a)
    {
        return (None, "none");
    }
    let learned = learned.max(floor);
    match (declared, learned) {
        (Some(d), Some(l)) if l > d => (Some(l), "learned"),
        (Some(d), _) => (Some(d), "declared"),
        (None, Some(l)) => (Some(l), "learned"),
        (None, None) => (None, "none"),
    }
}

/// A colocated pair is placed as one attempt whose memory is the sum: the foreground's
/// estimate plus its background's memory. Without a foreground estimate the pair runs alone.
pub fn pair_estimate(foreground: Option<u64>, background: Option<u64>) -> Option<u64> {
    foreground.map(|f| f.saturating_add(background.unwrap_or(0)))
}

/// The foreground's share of an attempt's (pair) estimate, which its memory key learns by.
pub fn foreground_estimate(attempt: Option<u64>, background: Option<u64>) -> Option<u64> {
    attempt.map(|e| e.saturating_sub(background.unwrap_or(0)))
}

/// After an OOM the key's estimate rises at once to this floor: the next placement must be
/// safer than this one, whatever the slower statistics say. It is x1.25 what the attempt had,
/// or, where the OOM's text says how much the failed allocation `asked` for, what it held plus
/// that with the learned margin when that is more: a run whose peak was missed between two
/// samples, or that asked for far more than it held, is placed by its need at once rather than
/// by x1.25 steps, one OOM each. Where its peak could not be read (a run that died before a
/// sample), what it asked for is still the least it needs. `None`: nothing to go by.
pub fn oom_floor(estimate: Option<u64>, peak: Option<u64>, asked: Option<u64>) -> Option<u64> {
    let bumped = estimate
        .max(peak)
        .filter(|b| *b > 0)
        .map(|b| (b as f64 * OOM_BUMP).ceil() as u64);
    let held = peak.unwrap_or(0);
    let needed =
        asked.map(|asked| (held.saturating_add(asked) as f64 * LEARNED_MARGIN).ceil() as u64);
    bumped.max(needed)
}

// ---- claims -----------------------------------------------------------------------------

/// A pending job as a claim reads it.
#[derive(Clone, Debug)]
pub struct PendingRow {
    pub id: String,
    pub gpus: u32,
    pub declared: Option<u64>,
    /// When it last changed state: its wait so far.
    pub since: Millis,
    pub memory_key: String,
    /// The reason stored by the last claim that looked at it.
    pub reason: Option<PendingReason>,
    /// It needs its GPUs to itself (`exclusive`, `cooldown`).
    pub alone: bool,
    /// Memory of its colocated background (`colocate`), which shares its GPU.
    pub background_mib: Option<u64>,
    /// `queued` or `retrying`, as read (and, on PostgreSQL, locked) with the row.
    pub state: JobState,
    /// Its place in the queue (priority, then submission), from which the next window of
    /// pending jobs is read.
    pub cursor: QueueCursor,
    pub experiment: String,
    /// Who submitted it: fair share orders and caps by user.
    pub user: String,
    /// Its experiment's `max_concurrent`.
    pub max_concurrent: Option<u32>,
    /// Host memory its spec declares (`resources.host_memory`).
    pub host_declared: Option<u64>,
    /// Its memory over time (`resources.memory_phases`).
    pub phases: Option<Phases>,
    /// No attempt of it has run yet.
    pub first: bool,
}

/// A place in the queue: priority (higher first), then submission sequence (older first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCursor {
    pub priority: i64,
    pub seq: i64,
}

/// What a memory key has taught: observed GPU memory peaks and the floor after OOMs, and
/// observed host memory peaks.
#[derive(Clone, Debug, Default)]
pub struct KeyMemory {
    pub peaks: Vec<u64>,
    /// What its latest runs that ended well taught, newest first: each one's peak, and its
    /// shape (memory phases), `None` where it told none.
    pub profiles: Vec<(u64, Option<Phases>)>,
    pub floor: Option<u64>,
    pub host_peaks: Vec<u64>,
}

/// What each memory key has taught.
pub type Learned = HashMap<String, KeyMemory>;

/// How many of a key's latest shapes its learned phases cover.
pub const PROFILES_WINDOW: usize = 5;

/// The memory phases a waiting job is placed by: its spec's, else those its key's latest
/// runs taught ([`learned_phases`]) where the key never ran out of memory (it has no floor).
/// `None` for a retry, which may resume from a checkpoint partway through its run: where its
/// peak falls is not known.
pub fn pending_phases(p: &PendingRow, memory: &KeyMemory) -> Option<Phases> {
    if !p.first {
        return None;
    }
    p.phases.or_else(|| {
        memory
            .floor
            .is_none()
            .then(|| learned_phases(&memory.profiles))
            .flatten()
    })
}

/// Phases that cover each of the latest [`PROFILES_WINDOW`] of `profiles` (what runs of one
/// configuration taught, newest first: each one's peak and shape), each from its own start:
/// the peak from the earliest the shapes' peaks began to the latest they ended (in time,
/// since runs differ in length), over the longest run, and a steady use, with the learned
/// margin, of the most any of them held outside its peak: a run that told no shape held its
/// peak for all its run as far as is known (it held near it throughout, or its peak came
/// and went between two looks); its timing placed with a margin as wide as their lengths
/// spread ([`length_margin`]). `None` without a shape among them, or where their peaks
/// together cover more than half a run.
pub fn learned_phases(profiles: &[(u64, Option<Phases>)]) -> Option<Phases> {
    let window = &profiles[..profiles.len().min(PROFILES_WINDOW)];
    let shapes: Vec<Phases> = window.iter().filter_map(|(_, p)| *p).collect();
    let unshaped = window
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(peak, _)| *peak);
    let expected_ms = shapes.iter().map(|p| p.expected_ms).max()?;
    if expected_ms == 0 {
        return None;
    }
    let at = |p: &Phases, share: f64| share * p.expected_ms as f64;
    let from_ms = shapes
        .iter()
        .map(|p| at(p, p.peak_from))
        .fold(f64::INFINITY, f64::min);
    let until_ms = shapes
        .iter()
        .map(|p| at(p, p.peak_until))
        .fold(0.0, f64::max);
    let steadies: Vec<u64> = shapes
        .iter()
        .map(|p| p.steady_mib)
        .chain(unshaped)
        .collect();
    let steady = steadies.iter().copied().max()?;
    let (from, until) = (
        from_ms / expected_ms as f64,
        (until_ms / expected_ms as f64).min(1.0),
    );
    (from < until && until - from <= 0.5).then(|| Phases {
        steady_mib: (steady as f64 * steady_margin(&steadies)).ceil() as u64,
        peak_from: from,
        peak_until: until,
        expected_ms,
        margin_permille: length_margin(&shapes.iter().map(|p| p.expected_ms).collect::<Vec<_>>()),
    })
}

/// The margin (in thousandths of a run's length) by which learned phases take a run's peak
/// to come early or end late, and its run to end late: twice as wide as the taught runs'
/// lengths spread (the longest over the shortest), at least [`LENGTH_MARGIN_FLOOR_PERMILLE`],
/// at most a declared run's [`DECLARED_MARGIN_PERMILLE`], and that until a whole window of
/// runs ([`PROFILES_WINDOW`]) taught it. Runs of one configuration mostly take the same time;
/// a tenth of a 40 s run on each side of its peak is what kept a second run from starting
/// beside it 6 s after the peaks allowed. Twice the spread, and five runs, because a few runs
/// that happened to agree say little of the next: in the simulator, runs whose lengths vary
/// by ±10 % met a neighbour's peak with the spread taken once, or from three runs.
fn length_margin(lengths: &[u64]) -> u64 {
    let (Some(&least), Some(&most)) = (lengths.iter().min(), lengths.iter().max()) else {
        return DECLARED_MARGIN_PERMILLE;
    };
    if lengths.len() < PROFILES_WINDOW || least == 0 {
        return DECLARED_MARGIN_PERMILLE;
    }
    ((most - least).saturating_mul(2000) / least)
        .clamp(LENGTH_MARGIN_FLOOR_PERMILLE, DECLARED_MARGIN_PERMILLE)
}

/// The margin a learned steady use is counted with: as wide as the taught runs' steady uses
/// spread (the most over the least), at least [`STEADY_MARGIN_FLOOR`], at most
/// [`LEARNED_MARGIN`], and [`LEARNED_MARGIN`] until [`AGREEING_RUNS`] runs taught it. A
/// configuration's runs mostly hold the same between their peaks, and those 10 % on top of
/// a steady use that every run showed are what kept two runs of a 3.7 GiB model from sharing
/// a 10 GiB GPU with their peaks apart; runs that differ keep the whole margin.
fn steady_margin(steadies: &[u64]) -> f64 {
    let (Some(&least), Some(&most)) = (steadies.iter().min(), steadies.iter().max()) else {
        return LEARNED_MARGIN;
    };
    if steadies.len() < AGREEING_RUNS || least == 0 {
        return LEARNED_MARGIN;
    }
    (most as f64 / least as f64).clamp(STEADY_MARGIN_FLOOR, LEARNED_MARGIN)
}

/// The host memory a job is admitted with (and its cgroup limited to): max(declared, p95 of
/// its key's host peaks x 1.1), as GPU memory is learned; `None` when nothing is known.
pub fn host_estimate(declared: Option<u64>, host_peaks: &mut [u64]) -> Option<u64> {
    host_peaks.sort_unstable();
    let learned = (!host_peaks.is_empty()).then(|| {
        let i = ((host_peaks.len() - 1) as f64 * 0.95).round() as usize;
        (host_peaks[i] as f64 * LEARNED_MARGIN).ceil() as u64
    });
    declared.max(learned)
}

/// One lease a claim makes: the pending job (by position), its GPUs, and the estimate it is
/// placed by with where that came from.
#[derive(Clone, Debug)]
pub struct Slot {
    pub candidate: usize,
    pub gpus: Vec<u32>,
    pub estimate: Option<u64>,
    pub source: &'static str,
    /// Host memory it is admitted with.
    pub host_mib: Option<u64>,
    /// Its cgroup is limited to `host_mib`: only where its spec declares host memory (a
    /// limit the user set, which what runs taught may raise); learned alone, it admits.
    pub host_limited: bool,
    /// The memory phases it is placed by (its background's memory in its steady use).
    pub phases: Option<Phases>,
    /// What it holds as it starts, when it has memory phases (its peak comes later).
    pub starts_with_mib: Option<u64>,
}

/// What a waiting job is placed by (with its colocated background's memory), from what its
/// memory key has taught; `largest`: the largest usable GPU memory of the nodes at hand, which
/// are every live node.
pub fn pending_estimate(p: &PendingRow, memory: &KeyMemory, largest: Option<u64>) -> Option<u64> {
    pending_estimate_of(p, memory.clone(), largest, largest).0
}

/// [`pending_estimate`] on one node whose GPUs offer at most `largest`, where those of every
/// live node offer at most `anywhere`; with where the estimate comes from.
fn pending_estimate_of(
    p: &PendingRow,
    memory: KeyMemory,
    largest: Option<u64>,
    anywhere: Option<u64>,
) -> (Option<u64>, &'static str) {
    let KeyMemory {
        mut peaks, floor, ..
    } = memory;
    let (estimate, source) = effective_estimate(p.declared, &mut peaks, floor, largest, anywhere);
    (pair_estimate(estimate, p.background_mib), source)
}

/// A claim's decision: which pending jobs go where with which estimate, and why each job it
/// looked at and did not place still waits.
pub struct ClaimPlan {
    pub leases: Vec<Slot>,
    /// By position in the pending list; only those that differ from the stored ones.
    pub reasons: Vec<(usize, PendingReason)>,
}

/// A claim over `pending` (in the order they go: users by fair share, then priority and
/// submission): caps first, then placement of what they leave.
pub fn claim(
    placer: &mut Placer,
    pending: &[PendingRow],
    learned: &Learned,
    caps: &mut Caps,
    shares: &Shares,
    now: Millis,
    max: usize,
) -> ClaimPlan {
    let largest = placer.largest_usable_mib();
    let anywhere = placer.largest_anywhere_mib();
    let estimates: Vec<(Option<u64>, &'static str)> = pending
        .iter()
        .map(|p| {
            let memory = learned.get(&p.memory_key).cloned().unwrap_or_default();
            pending_estimate_of(p, memory, largest, anywhere)
        })
        .collect();
    let phases: Vec<Option<Phases>> = pending
        .iter()
        .map(|p| match learned.get(&p.memory_key) {
            Some(memory) => pending_phases(p, memory),
            None => pending_phases(p, &KeyMemory::default()),
        })
        .collect();
    let hosts: Vec<Option<u64>> = pending
        .iter()
        .map(|p| {
            let mut peaks = learned
                .get(&p.memory_key)
                .map(|k| k.host_peaks.clone())
                .unwrap_or_default();
            host_estimate(p.host_declared, &mut peaks)
        })
        .collect();
    // What a job would reserve, before it has GPUs: a whole GPU is the largest here.
    let reserves = |i: usize| {
        let gpus = std::iter::repeat_n(largest.unwrap_or(0), pending[i].gpus as usize);
        fair::reservation(estimates[i].0, gpus)
    };
    // A job that would take its experiment or its user past a cap (counting the jobs before
    // it here) is not looked at: placement never sees more than the caps leave room for.
    let mut room: HashMap<&str, u32> = HashMap::new();
    let mut held = caps.users.clone();
    let mut capped: Vec<(usize, PendingReason)> = Vec::new();
    let mut open = Vec::new();
    for (i, p) in pending.iter().enumerate() {
        if let Some(&(limit, running)) = caps.experiments.get(&p.experiment) {
            let left = room
                .entry(&p.experiment)
                .or_insert(limit.saturating_sub(running));
            if *left == 0 {
                capped.push((i, PendingReason::ConcurrencyCap { limit, running }));
                continue;
            }
            *left -= 1;
        }
        if let Some((limits, h)) = held.get_mut(&p.user) {
            if let Some(reason) = fair::over_cap(&p.user, limits, h, p.gpus, reserves(i)) {
                capped.push((i, reason));
                continue;
            }
            h.add(p.gpus, reserves(i));
        }
        open.push(i);
    }
    let mut plan = claim_open(
        placer, pending, &open, &estimates, &phases, &hosts, now, max,
    );
    for slot in &plan.leases {
        let p = &pending[slot.candidate];
        if let Some((_, running)) = caps.experiments.get_mut(&p.experiment) {
            *running += 1;
        }
        if let Some((_, h)) = caps.users.get_mut(&p.user) {
            h.add(p.gpus, reserves(slot.candidate));
        }
    }
    // A job that found no room while another user's jobs go first waits for fair share.
    for (i, reason) in &mut plan.reasons {
        if matches!(
            reason,
            PendingReason::NoFreeSlot
                | PendingReason::NotEnoughMemory { .. }
                | PendingReason::BehindReservation
        ) && let Some(held_back) = shares.held_back(&pending[*i].user)
        {
            *reason = held_back;
        }
    }
    // Said with the counts this claim leaves; only reasons that changed are written.
    for (i, reason) in capped {
        let p = &pending[i];
        let now_held =
            match &reason {
                PendingReason::ConcurrencyCap { limit, .. } => caps
                    .experiments
                    .get(&p.experiment)
                    .map(|&(_, running)| PendingReason::ConcurrencyCap {
                        limit: *limit,
                        running,
                    }),
                _ => caps.users.get(&p.user).and_then(|(limits, h)| {
                    fair::over_cap(&p.user, limits, h, p.gpus, reserves(i))
                }),
            };
        plan.reasons.push((i, now_held.unwrap_or(reason)));
    }
    plan.reasons
        .retain(|(i, r)| pending[*i].reason.as_ref() != Some(r));
    plan
}

/// [`claim`] over the pending jobs at positions `open` (positions in the plan are
/// `pending`'s), placed by `estimates` and `phases` (`all`'s).
#[allow(clippy::too_many_arguments)]
fn claim_open(
    placer: &mut Placer,
    all: &[PendingRow],
    open: &[usize],
    estimates: &[(Option<u64>, &'static str)],
    phases: &[Option<Phases>],
    hosts: &[Option<u64>],
    now: Millis,
    max: usize,
) -> ClaimPlan {
    let candidates: Vec<Candidate> = open
        .iter()
        .map(|&i| Candidate {
            host_mib: hosts[i],
            gpus: all[i].gpus,
            estimate_mib: estimates[i].0,
            waited_ms: (now - all[i].since).max(0) as u64,
            alone: all[i].alone,
            // A colocated background holds its memory throughout, the peak's time included.
            phases: phases[i].map(|p| Phases {
                steady_mib: p
                    .steady_mib
                    .saturating_add(all[i].background_mib.unwrap_or(0)),
                ..p
            }),
        })
        .collect();
    let mut placed = placer.place(&candidates, max);
    for (i, _) in &mut placed.reasons {
        *i = open[*i];
    }
    ClaimPlan {
        leases: placed
            .placements
            .into_iter()
            .map(|p: Placement| {
                let i = open[p.candidate];
                let (estimate, source) = estimates[i];
                Slot {
                    candidate: i,
                    gpus: p.gpus,
                    estimate,
                    source,
                    host_mib: hosts[i],
                    host_limited: all[i].host_declared.is_some(),
                    phases: estimate.and(candidates[p.candidate].phases),
                    starts_with_mib: estimate
                        .zip(candidates[p.candidate].phases)
                        .map(|(e, ph)| NewRun::of(e, Some(ph), 0).held_first()),
                }
            })
            .collect(),
        reasons: placed.reasons,
    }
}

// ---- reports and fencing ------------------------------------------------------------------

/// The fencing columns a report is checked against.
pub struct FenceRow {
    pub phase: AttemptPhase,
    pub attempt_fence: i64,
    pub job_fence: i64,
}

/// A report is current when its attempt has not ended and its token is the attempt's and
/// still the job's (a later lease of the job moved the job's token on).
pub fn check_fence(attempt: AttemptId, presented: i64, row: &FenceRow) -> Result<()> {
    if row.phase == AttemptPhase::Ended
        || row.attempt_fence != presented
        || row.job_fence != presented
    {
        return Err(Refusal::StaleFence { attempt });
    }
    Ok(())
}

/// How a finish report stands against its attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    /// The attempt's lease is current.
    OnTime,
    /// The attempt was recorded lost and its job not leased again since (the token is
    /// still the job's): the report replaces the loss, the attempt recorded as it really
    /// ended. `refunded`: the loss gave the attempt back (its start was never heard), which
    /// the report takes back, since the attempt did run.
    Late { refunded: bool },
    /// The attempt's end was recorded by a report with this token already (its supervisor
    /// and then its agent both delivered it): answered, nothing changes.
    Again,
}

/// What a finish report reads of its attempt.
pub struct FinishRow {
    pub fence: FenceRow,
    pub failure: Option<FailureClass>,
    pub started: bool,
}

/// A finish report is taken on time (`check_fence`), late for an attempt recorded lost
/// whose job no later lease moved on, or again for one a report with its token ended;
/// anything else is stale.
pub fn check_finish(attempt: AttemptId, presented: i64, row: &FinishRow) -> Result<Report> {
    let f = &row.fence;
    if f.phase == AttemptPhase::Ended
        && row.failure != Some(FailureClass::Lost)
        && f.attempt_fence == presented
    {
        return Ok(Report::Again);
    }
    if f.phase == AttemptPhase::Ended
        && row.failure == Some(FailureClass::Lost)
        && f.attempt_fence == presented
        && f.job_fence == presented
    {
        return Ok(Report::Late {
            refunded: !row.started,
        });
    }
    check_fence(attempt, presented, f).map(|()| Report::OnTime)
}

/// The job's event for a late report: what the finish rules decided, in place of the loss.
pub fn late_event(event: JobEvent) -> JobEvent {
    match event {
        JobEvent::Succeed => JobEvent::LateEnd {
            succeeded: true,
            retry: false,
        },
        JobEvent::Fail { retry } => JobEvent::LateEnd {
            succeeded: false,
            retry,
        },
        other => other,
    }
}

/// What a heartbeat reads of one attempt it presents.
pub struct RenewalRow {
    pub fence: FenceRow,
    pub failure: Option<FailureClass>,
    /// It is the heartbeating agent's attempt.
    pub ours: bool,
}

/// What a heartbeat does with one attempt it presents: renew it (`Ok(true)`), skip it
/// (`Ok(false)`: it ended by its own report while the heartbeat was on its way, or was
/// handed back; nothing to renew and nothing stale), or refuse the whole heartbeat
/// (`StaleFence`: the lease was lost or is someone else's).
pub fn renewal(attempt: AttemptId, presented: i64, row: Option<&RenewalRow>) -> Result<bool> {
    let Some(r) = row else {
        return Ok(false);
    };
    let stale = || Err(Refusal::StaleFence { attempt });
    if !r.ours || r.fence.attempt_fence != presented {
        return stale();
    }
    if r.fence.phase == AttemptPhase::Ended {
        return if r.failure == Some(FailureClass::Lost) {
            stale()
        } else {
            Ok(false)
        };
    }
    if r.fence.job_fence != presented {
        return stale();
    }
    Ok(true)
}

/// A log chunk is accepted while the attempt's token is current, also after its end (the
/// tail ships last), but not once the attempt was lost and its job moved on to another.
pub fn check_log_fence(
    attempt: AttemptId,
    presented: i64,
    row: &FenceRow,
    failure: Option<FailureClass>,
) -> Result<()> {
    if row.attempt_fence != presented
        || (failure == Some(FailureClass::Lost) && row.job_fence != presented)
    {
        return Err(Refusal::StaleFence { attempt });
    }
    Ok(())
}

/// Whether a re-registering agent keeps an active attempt: it presented the attempt with
/// its current token.
pub fn resumes(presented: &[AttemptRef], attempt: &str, fence: i64) -> bool {
    presented
        .iter()
        .any(|r| r.attempt.to_string() == attempt && r.fence == fence)
}

/// True when some GPU has more free memory than the node's previous samples said: a waiting
/// claim (on any replica) may now place work.
pub fn memory_freed(before: &[GpuSample], after: &[GpuSample]) -> bool {
    after.iter().any(|g| {
        before
            .iter()
            .find(|b| b.index == g.index)
            .is_none_or(|b| g.free_mib > b.free_mib)
    })
}

// ---- outcomes -----------------------------------------------------------------------------

/// The job columns the outcome rules read.
#[derive(Clone, Debug)]
pub struct JobRules {
    pub attempts: u32,
    pub max_attempts: u32,
    pub retry_on: Vec<FailureClass>,
    pub ladder: Vec<BTreeMap<String, Value>>,
    /// Ladder steps applied so far.
    pub ladder_step: u32,
    pub params: BTreeMap<String, Value>,
    pub command: Vec<String>,
    pub shell: bool,
    pub config: u32,
    pub run: u32,
    /// Experiment name and the spec's memory-relevant parameters: the memory key's parts.
    pub experiment: String,
    pub key_params: Vec<String>,
    /// What a run whose GPU throttled is (`flag`, `retry`, `fail`).
    pub on_throttle: OnThrottle,
    /// Memory of its colocated background (`colocate`), which shared its GPU.
    pub background_mib: Option<u64>,
}

/// Decides whether a failed attempt earns another one.
pub fn retry_allowed(
    class: FailureClass,
    started: bool,
    attempts: u32,
    max_attempts: u32,
    retry_on: &[FailureClass],
) -> bool {
    // A lease lost before its process started cost nothing: always requeue.
    if class == FailureClass::Lost && !started {
        return true;
    }
    attempts < max_attempts && retry_on.contains(&class)
}

/// The writes of a lost attempt (the agent went away or re-registered without it).
#[derive(Debug, PartialEq, Eq)]
pub struct Loss {
    /// The job's `max_attempts` after the loss: an attempt that never started is given back.
    pub max_attempts: u32,
    pub event: JobEvent,
}

pub fn lose(job: &JobRules, started: bool) -> Loss {
    let retry = retry_allowed(
        FailureClass::Lost,
        started,
        job.attempts,
        job.max_attempts,
        &job.retry_on,
    );
    Loss {
        max_attempts: job.max_attempts + u32::from(!started),
        event: JobEvent::Fail { retry },
    }
}

/// The job's `max_attempts` once a late report undoes its attempt's loss: an attempt the
/// loss gave back (`refunded`) did run after all, so it is taken back.
pub fn undo_loss(max_attempts: u32, refunded: bool) -> u32 {
    max_attempts.saturating_sub(u32::from(refunded))
}

/// The job's `max_attempts` after a person retries it: one more try than used so far.
pub fn manual_retry(attempts: u32) -> u32 {
    attempts + 1
}

/// The floor a memory key keeps after an OOM asked for `wanted`: floors only rise.
/// `None`: the stored one stands.
pub fn raised_floor(stored: Option<u64>, wanted: u64) -> Option<u64> {
    (stored.is_none_or(|f| wanted > f)).then_some(wanted)
}

/// An OOM ladder step to apply: the job's parameters, argv and memory key after it.
#[derive(Debug, PartialEq)]
pub struct LadderStep {
    pub params: BTreeMap<String, Value>,
    pub argv: Vec<String>,
    pub memory_key: String,
    pub ladder_step: u32,
    pub max_attempts: u32,
}

/// The next ladder step after an OOM, or `None`. Each listed step is a retry of its own (on
/// top of `retry.on`); after them the last step repeats while `retry.max_attempts` allows and
/// it still changes a parameter (halving until it fits). The memory key is recomputed from
/// the parameters the next attempt runs with, so it is placed by their estimate, not by the
/// floor the larger configuration earned.
pub fn next_ladder_step(job: &JobRules) -> Result<Option<LadderStep>> {
    let Some(last) = job.ladder.last() else {
        return Ok(None);
    };
    let listed = (job.ladder_step as usize) < job.ladder.len();
    if !listed && job.attempts >= job.max_attempts {
        return Ok(None);
    }
    let step = job.ladder.get(job.ladder_step as usize).unwrap_or(last);
    let mut params = job.params.clone();
    headroom_shared::spec::apply_ladder_step(&mut params, step);
    if !listed && params == job.params {
        return Ok(None);
    }
    let argv =
        headroom_shared::expand::render(&job.command, job.shell, &params, job.config, job.run)
            .map_err(|e| Refusal::Corrupt(format!("re-rendering the command: {e}")))?;
    let applied = (job.ladder_step as usize + 1).min(job.ladder.len());
    let mut relevant = job.key_params.clone();
    let mut changed: Vec<&String> = job.ladder[..applied]
        .iter()
        .flat_map(|s| s.keys())
        .collect();
    changed.sort();
    changed.dedup();
    for name in changed {
        if !relevant.contains(name) {
            relevant.push(name.clone());
        }
    }
    Ok(Some(LadderStep {
        memory_key: headroom_shared::expand::memory_key(&job.experiment, &relevant, &params),
        argv,
        params,
        ladder_step: job.ladder_step + 1,
        max_attempts: if listed {
            job.max_attempts.max(job.attempts + 1)
        } else {
            job.max_attempts
        },
    }))
}

/// The writes of a finish report, besides recording the attempt's end.
#[derive(Debug)]
pub struct Finish {
    /// Cleanup not verified: quarantine the attempt's GPUs for this reason.
    pub quarantine: Option<String>,
    pub last_failure: Option<FailureClass>,
    /// Raise the attempt's memory key to at least this floor.
    pub floor: Option<u64>,
    pub ladder: Option<LadderStep>,
    pub event: JobEvent,
    /// The attempt does not count against the job's `max_attempts` (it was requeued).
    pub refund: bool,
}

/// Why an attempt ran out of GPU memory, as far as its own figures tell: past its own hard
/// limit (its supervisor says so), or past what it was placed by (its peak above its
/// estimate). `None`: no OOM, or one within both (a neighbour's growth, or a fragmented
/// allocator, may have caused it).
pub fn oom_cause(report: &FinishReport, estimate: Option<u64>) -> Option<OomCause> {
    if report.failure != Some(FailureClass::Oom) {
        return None;
    }
    let past_estimate = match (report.peak_mem_mib, estimate) {
        (Some(peak), Some(e)) => peak > e,
        _ => false,
    };
    report
        .oom_cause
        .or(past_estimate.then_some(OomCause::CapHit))
}

/// How far a GPU's use and the estimates placed on it may be apart before it drifts: 5 % of
/// its memory, at least 1 GiB (a job's memory moves through its phases).
pub fn drift_tolerance_mib(total_mib: u64) -> u64 {
    (total_mib / 20).max(1024)
}

/// Whether a GPU's reading (`used_mib`) drifts from its ledger (`placed_mib`, the estimates
/// of the attempts placed on it), which way and by how much. `None` while they agree within
/// [`drift_tolerance_mib`].
pub fn drift(
    placed_mib: u64,
    used_mib: u64,
    total_mib: u64,
) -> Option<(headroom_shared::api::DriftDirection, u64)> {
    use headroom_shared::api::DriftDirection;
    let tolerance = drift_tolerance_mib(total_mib);
    if used_mib > placed_mib.saturating_add(tolerance) {
        Some((DriftDirection::Over, used_mib - placed_mib))
    } else if placed_mib > used_mib.saturating_add(tolerance) {
        Some((DriftDirection::Under, placed_mib - used_mib))
    } else {
        None
    }
}

/// How many times a job's OOMs may be blamed on neighbours (each retried for free); past
/// them its OOMs are its own, under its retry policy, so a job placed again and again
/// beside the same grower does not loop.
pub const FREE_OOM_RETRIES: u32 = 3;

/// A live attempt beside one that ran out of memory, as [`grown_neighbour`] weighs it.
#[derive(Clone, Debug)]
pub struct Neighbour {
    pub attempt: String,
    pub gpus: Vec<u32>,
    /// What it is counted to hold now on each of its GPUs: what it was placed by, or, where
    /// it was placed by memory phases, what they put it at now.
    pub estimate_mib: Option<u64>,
}

/// Memory past an estimate that is still noise: 5 % of it, at least 256 MiB (a hard
/// memory cap's slack).
pub fn growth_tolerance_mib(estimate_mib: u64) -> u64 {
    (estimate_mib / 20).max(256)
}

/// Which neighbour ran out of memory an attempt that stayed within its own estimate: of the
/// live attempts on one of its GPUs, the one whose processes there hold the most past its
/// estimate (and past [`growth_tolerance_mib`]), by the samples at the attempt's end. `None`
/// when none did, or when it cannot be told (a neighbour with no estimate grew past nothing;
/// a GPU whose process list failed tells nothing): an OOM is only blamed on a neighbour
/// with evidence, never by default.
pub fn grown_neighbour(
    victim: &str,
    victim_gpus: &[u32],
    samples: &[GpuSample],
    neighbours: &[Neighbour],
) -> Option<String> {
    let mut worst: Option<(u64, &str)> = None;
    for s in samples.iter().filter(|s| victim_gpus.contains(&s.index)) {
        if s.error.is_some() {
            continue;
        }
        for n in neighbours
            .iter()
            .filter(|n| n.attempt != victim && n.gpus.contains(&s.index))
        {
            let Some(estimate) = n.estimate_mib else {
                continue;
            };
            let held: u64 = s
                .processes
                .iter()
                .filter(|p| !p.used_mib_unknown)
                .filter(|p| p.attempt.is_some_and(|a| a.to_string() == n.attempt))
                .map(|p| p.used_mib)
                .sum();
            let past = held.saturating_sub(estimate);
            if past > growth_tolerance_mib(estimate) && worst.is_none_or(|(w, _)| past > w) {
                worst = Some((past, n.attempt.as_str()));
            }
        }
    }
    worst.map(|(_, a)| a.to_string())
}

/// How an attempt's peak is recorded: as the agent measured it (per process when it does not
/// say: older agents measured only that way), and nothing without a peak. Both kinds teach
/// the memory key: a device delta also counts what neighbours grew meanwhile (errs high, the
/// safe side); memory a neighbour freed meanwhile can make it low, which an OOM's floor mends.
pub fn peak_source(report: &FinishReport) -> Option<PeakSource> {
    report
        .peak_mem_mib
        .map(|_| report.peak_source.unwrap_or_default())
}

/// A report of a run whose GPU throttled, as the job's `on_throttle` has it: with `retry`
/// or `fail`, the job's success becomes the failure class `throttled`, said in its log
/// tail; with `flag` (or any other end) it is left as it is.
/// A requeued end only where the coordinator asked for that requeue (`asked`): an agent
/// cannot give its jobs free attempts. Any other is taken as `lost`, which the job's
/// retry policy weighs as usual.
pub fn check_requeue(report: &mut FinishReport, asked: Option<Requeue>) {
    if let Some(class) = report.failure
        && class.is_requeue()
        && asked.map(Requeue::class) != Some(class)
    {
        report.failure = Some(FailureClass::Lost);
    }
}

pub fn apply_on_throttle(on_throttle: OnThrottle, report: &mut FinishReport) {
    if on_throttle == OnThrottle::Flag
        || report.failure.is_some()
        || !report.measurements.throttled()
    {
        return;
    }
    report.failure = Some(FailureClass::Throttled);
    let reasons = report
        .measurements
        .throttle_reasons
        .as_deref()
        .unwrap_or_default()
        .join(", ");
    report.log_tail.push_str(&format!(
        "\n[headroom] the GPU slowed its clocks during the run ({reasons}): failure class \
         `throttled` (on_throttle: {})\n",
        on_throttle.as_str()
    ));
}

pub fn finish(
    job: &JobRules,
    attempt_estimate: Option<u64>,
    report: &FinishReport,
) -> Result<Finish> {
    let quarantine = (!report.cleanup_verified).then(|| {
        report
            .unverified
            .clone()
            .unwrap_or_else(|| "cleanup could not be verified".into())
    });
    let Some(class) = report.failure else {
        return Ok(Finish {
            quarantine,
            last_failure: None,
            floor: None,
            ladder: None,
            event: JobEvent::Succeed,
            refund: false,
        });
    };
    if class == FailureClass::Pruned {
        // Stopped by `early_stop`: not a failure, never retried.
        return Ok(Finish {
            quarantine,
            last_failure: None,
            floor: None,
            ladder: None,
            event: JobEvent::Prune,
            refund: false,
        });
    }
    let neighbour_grew =
        class == FailureClass::Oom && report.oom_cause == Some(OomCause::NeighbourGrew);
    if class.is_requeue() || neighbour_grew {
        // Stopped by headroom (a preemption) or a user (`cancel --requeue`) to run again
        // later, after its checkpoint signal; or out of memory because a neighbour grew into
        // it: back to the queue, no attempt spent, nothing learned.
        return Ok(Finish {
            quarantine,
            last_failure: Some(class),
            floor: None,
            ladder: None,
            event: JobEvent::Fail { retry: true },
            refund: true,
        });
    }
    // `on_throttle: retry` is the throttled class's own retry list.
    let retry_on: &[FailureClass] = match (class, job.on_throttle) {
        (FailureClass::Throttled, OnThrottle::Retry) => &[FailureClass::Throttled],
        (FailureClass::Throttled, _) => &[],
        // The node lacks the job's directory or environment: it would fail again the same way.
        (c, _) if c.is_setup() => &[],
        _ => &job.retry_on,
    };
    let mut retry = retry_allowed(class, true, job.attempts, job.max_attempts, retry_on);
    let (mut floor, mut ladder) = (None, None);
    if class == FailureClass::Oom {
        let asked = headroom_shared::oom::tried_to_allocate_mib(&report.log_tail);
        floor = oom_floor(attempt_estimate, report.peak_mem_mib, asked);
        ladder = next_ladder_step(job)?;
        retry |= ladder.is_some();
    }
    Ok(Finish {
        quarantine,
        last_failure: Some(class),
        floor,
        ladder,
        event: JobEvent::Fail { retry },
        refund: false,
    })
}

/// A handed-back lease does not count as an attempt: the job's attempts after it, and its
/// event.
pub fn hand_back(attempts: u32) -> (u32, JobEvent) {
    let left = attempts.saturating_sub(1);
    (
        left,
        JobEvent::HandBack {
            had_attempts: left > 0,
        },
    )
}

// ---- registration ---------------------------------------------------------------------------

/// The plan and headroom a registration leaves: what the agent sent, else what was stored
/// (a stored plan that no longer matches the node's GPUs falls back to one slot per GPU),
/// else the defaults.
pub fn merge_registration(
    n_gpus: usize,
    sent: (Option<&Plan>, Option<Headroom>),
    stored: Option<(String, String)>,
) -> Result<(Plan, Headroom)> {
    let stored = stored.as_ref().map(|(p, h)| (p.as_str(), h.as_str()));
    let plan = match (sent.0, stored) {
        (Some(p), _) => {
            p.check_gpus(n_gpus)?;
            p.clone()
        }
        (None, Some((p, _))) => {
            Plan::parse_for(p, n_gpus).unwrap_or_else(|_| Plan::one_per_gpu(n_gpus))
        }
        (None, None) => Plan::one_per_gpu(n_gpus),
    };
    let headroom = match (sent.1, stored) {
        (Some(h), _) => h,
        (None, Some((_, h))) => h
            .parse()
            .map_err(|_| Refusal::Corrupt(format!("bad headroom `{h}`")))?,
        (None, None) => Headroom::default(),
    };
    Ok((plan, headroom))
}

// ---- who may do what -------------------------------------------------------------------

/// Whether a role may call a route of this access class; `Err` carries the role(s) needed,
/// for the 403 message. `Owner` routes admit users here: `may_act_on` decides per row.
pub fn may_call(access: Access, role: Role) -> std::result::Result<(), &'static str> {
    let allowed = match access {
        Access::Public => true,
        Access::User | Access::Owner => matches!(role, Role::User | Role::Admin),
        Access::Admin => role == Role::Admin,
        Access::Agent => role == Role::Agent,
        Access::Join => role == Role::Join,
        // Only the attempt's own credential, checked by the gate; no role's token.
        Access::Attempt => false,
    };
    if allowed {
        return Ok(());
    }
    Err(match access {
        Access::Public => "none",
        Access::User | Access::Owner => "user or admin",
        Access::Admin => "admin",
        Access::Agent => "agent",
        Access::Join => "join",
        Access::Attempt => "the attempt's own credential",
    })
}

/// Why a stored token whose secret matched is still refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    Revoked,
    Expired,
}

/// A stored token works until revoked or past its expiry (`now` in ms since the epoch).
pub fn token_usable(
    revoked_at: Option<Millis>,
    expires_at: Option<Millis>,
    now: Millis,
) -> std::result::Result<(), TokenRefusal> {
    if revoked_at.is_some() {
        Err(TokenRefusal::Revoked)
    } else if expires_at.is_some_and(|e| e <= now) {
        Err(TokenRefusal::Expired)
    } else {
        Ok(())
    }
}

/// Cancel and retry: the submitter may act on what they submitted, an admin on anything.
/// Whether `who` may act as node `node` (register it, claim and report for it): an agent
/// token acts only as the node it is named after; an admin (the anonymous one of a
/// coordinator without tokens) as any.
pub fn may_act_as_node(who: &Principal, node: &str) -> bool {
    match who.role {
        Role::Admin => true,
        Role::Agent => who.name == node,
        Role::User | Role::Join => false,
    }
}

/// Whether an agent instance may register as a node now: when the node has no live agent
/// (none, or none heard of within `ttl_ms`), or its live agent is this same instance
/// (`previous`). `Err`: how long ago the live agent was heard of.
pub fn may_register(
    holder: Option<&str>,
    last_seen: Option<Millis>,
    previous: Option<&str>,
    now: Millis,
    ttl_ms: u64,
) -> std::result::Result<(), Millis> {
    let (Some(holder), Some(seen)) = (holder, last_seen) else {
        return Ok(());
    };
    let ago = now.saturating_sub(seen);
    if ago >= i64::try_from(ttl_ms).unwrap_or(i64::MAX) || previous == Some(holder) {
        Ok(())
    } else {
        Err(ago.max(0))
    }
}

pub fn may_act_on(who: &Principal, submitted_by: &str) -> bool {
    who.role == Role::Admin || (who.role == Role::User && who.name == submitted_by)
}

#[cfg(test)]
mod host_tests {
    use super::*;

    #[test]
    fn a_host_estimate_is_the_declared_or_the_learned_p95_with_its_margin() {
        assert_eq!(host_estimate(None, &mut []), None);
        assert_eq!(host_estimate(Some(3000), &mut []), Some(3000));
        let mut peaks: Vec<u64> = (1..=100).map(|i| i * 100).collect();
        // p95 of 100..10000 is 9500 (index 94 of 0..99, rounded), times 1.1.
        assert_eq!(host_estimate(Some(3000), &mut peaks), Some(10_450));
        assert_eq!(host_estimate(Some(20_000), &mut peaks), Some(20_000));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(ladder: Vec<BTreeMap<String, Value>>, attempts: u32, max: u32) -> JobRules {
        JobRules {
            attempts,
            max_attempts: max,
            retry_on: vec![],
            ladder,
            ladder_step: 0,
            params: BTreeMap::from([("batch_size".to_string(), serde_json::json!(8))]),
            command: vec!["train".into(), "--bs={batch_size}".into()],
            shell: false,
            config: 0,
            run: 0,
            experiment: "exp".into(),
            key_params: vec![],
            on_throttle: OnThrottle::Flag,
            background_mib: None,
        }
    }

    #[test]
    fn a_gpu_drifts_when_its_use_and_its_ledger_part_past_the_tolerance() {
        use headroom_shared::api::DriftDirection::{Over, Under};
        let total = 24 * 1024;
        assert_eq!(drift_tolerance_mib(total), 1228);
        assert_eq!(drift(8192, 9000, total), None, "within tolerance");
        assert_eq!(drift(8192, 12_288, total), Some((Over, 4096)));
        assert_eq!(drift(16_384, 2048, total), Some((Under, 14_336)));
        assert_eq!(
            drift(0, 3072, total),
            Some((Over, 3072)),
            "memory of no attempt"
        );
        assert_eq!(drift(0, 500, 8192), None, "at least 1 GiB");
    }

    /// The neighbour that grew is the one holding the most past its estimate on the
    /// victim's GPU, by its own processes; one within its estimate and its slack, one on
    /// another GPU, one without an estimate, or a GPU whose reading failed blames no one.
    #[test]
    fn an_oom_within_its_estimate_is_blamed_on_the_neighbour_that_grew() {
        use headroom_shared::api::GpuProcess;
        let (a, b, c) = (AttemptId::new(), AttemptId::new(), AttemptId::new());
        let proc_of = |attempt: AttemptId, mib| GpuProcess {
            pid: 1,
            used_mib: mib,
            attempt: Some(attempt),
            user: None,
            command: None,
            used_mib_unknown: false,
            outside_pid_namespace: false,
            sm_util_pct: None,
        };
        let sample = |index, processes| GpuSample {
            index,
            used_mib: 0,
            free_mib: 0,
            utilization_pct: None,
            power_mw: None,
            temperature_c: None,
            processes,
            error: None,
        };
        let n = |attempt: AttemptId, gpu, estimate| Neighbour {
            attempt: attempt.to_string(),
            gpus: vec![gpu],
            estimate_mib: estimate,
        };
        let victim = AttemptId::new().to_string();
        let grew = [sample(0, vec![proc_of(a, 20_480), proc_of(b, 8_400)])];
        let neighbours = [n(a, 0, Some(8_192)), n(b, 0, Some(8_192))];
        assert_eq!(
            grown_neighbour(&victim, &[0], &grew, &neighbours),
            Some(a.to_string())
        );
        assert_eq!(
            grown_neighbour(&victim, &[0], &grew, &neighbours[1..]),
            None,
            "208 MiB past its estimate is within its slack"
        );
        assert_eq!(grown_neighbour(&victim, &[1], &grew, &neighbours), None);
        assert_eq!(
            grown_neighbour(&victim, &[0], &grew, &[n(a, 0, None)]),
            None,
            "no estimate: grew past nothing"
        );
        let failed = [GpuSample {
            error: Some("process list".into()),
            ..grew[0].clone()
        }];
        assert_eq!(grown_neighbour(&victim, &[0], &failed, &neighbours), None);
        assert_eq!(
            grown_neighbour(
                &victim,
                &[0],
                &[sample(0, vec![proc_of(c, 30_000)])],
                &neighbours
            ),
            None,
            "a process of no live neighbour"
        );

        // The victim is tried again for free, its key's floor untouched.
        let job = rules(vec![], 1, 1);
        let r = FinishReport {
            peak_mem_mib: Some(2_048),
            oom_cause: Some(OomCause::NeighbourGrew),
            ..ended(Some(FailureClass::Oom))
        };
        let f = finish(&job, Some(8_192), &r).expect("finish");
        assert_eq!(f.event, JobEvent::Fail { retry: true });
        assert!(f.refund);
        assert_eq!((f.floor, f.ladder.is_none()), (None, true));
        let own = finish(
            &job,
            Some(8_192),
            &FinishReport {
                oom_cause: None,
                ..r
            },
        )
        .expect("finish");
        assert_eq!(
            own.event,
            JobEvent::Fail { retry: false },
            "its own: no retry left"
        );
        assert!(own.floor.is_some());
    }

    #[test]
    fn an_oom_is_its_own_past_its_cap_or_its_estimate() {
        let oom = |peak: Option<u64>, cause| FinishReport {
            peak_mem_mib: peak,
            oom_cause: cause,
            ..ended(Some(FailureClass::Oom))
        };
        assert_eq!(
            oom_cause(&oom(Some(2600), None), Some(2200)),
            Some(OomCause::CapHit)
        );
        assert_eq!(
            oom_cause(&oom(Some(2100), None), Some(2200)),
            None,
            "within it"
        );
        assert_eq!(
            oom_cause(&oom(None, None), Some(2200)),
            None,
            "no peak: not known"
        );
        assert_eq!(oom_cause(&oom(Some(2600), None), None), None, "no estimate");
        // Its supervisor saw it at its own hard limit.
        let capped = oom(Some(100), Some(OomCause::CapHit));
        assert_eq!(oom_cause(&capped, Some(2200)), Some(OomCause::CapHit));
        let fine = FinishReport {
            peak_mem_mib: Some(9999),
            ..ended(None)
        };
        assert_eq!(oom_cause(&fine, Some(2200)), None, "no OOM");
    }

    /// A verified end that exited 0, classed `failure`.
    fn ended(failure: Option<FailureClass>) -> FinishReport {
        FinishReport {
            fence: 1,
            failure,
            exit_code: Some(0),
            signal: None,
            ended_at: chrono::Utc::now(),
            peak_mem_mib: None,
            peak_source: None,
            cleanup_ms: 1,
            cleanup_verified: true,
            unverified: None,
            contaminated: false,
            measurements: Default::default(),
            log_tail: String::new(),
            gpus: vec![],
            prestart: None,
            background: None,
            host_peak_mib: None,
            started: None,
            metrics: None,
            memory_cap_mib: None,
            oom_cause: None,
        }
    }

    #[test]
    fn a_throttled_success_is_what_on_throttle_says() {
        use headroom_shared::api::Measurements;
        let report = |failure: Option<FailureClass>, throttle: &[&str]| FinishReport {
            measurements: Measurements {
                throttled_thermal: Some(throttle.contains(&"sw_thermal_slowdown")),
                throttled_power: Some(throttle.contains(&"sw_power_cap")),
                throttle_reasons: Some(throttle.iter().map(|r| r.to_string()).collect()),
                ..Measurements::default()
            },
            ..ended(failure)
        };
        let job = |on_throttle, attempts| JobRules {
            on_throttle,
            ..rules(vec![], attempts, 3)
        };
        let outcome = |on_throttle, attempts, mut r: FinishReport| {
            apply_on_throttle(on_throttle, &mut r);
            let f = finish(&job(on_throttle, attempts), None, &r).expect("finish");
            (r.failure, f.event)
        };
        let hot = || report(None, &["sw_power_cap"]);
        assert_eq!(
            outcome(OnThrottle::Flag, 1, hot()),
            (None, JobEvent::Succeed)
        );
        let (class, event) = outcome(OnThrottle::Retry, 1, hot());
        assert_eq!(class, Some(FailureClass::Throttled));
        assert_eq!(event, JobEvent::Fail { retry: true });
        // Retried while attempts remain only.
        let (_, event) = outcome(OnThrottle::Retry, 3, hot());
        assert_eq!(event, JobEvent::Fail { retry: false });
        let (class, event) = outcome(OnThrottle::Fail, 1, hot());
        assert_eq!(class, Some(FailureClass::Throttled));
        assert_eq!(event, JobEvent::Fail { retry: false });
        // Not throttled, or failed anyway: left as it is.
        assert_eq!(outcome(OnThrottle::Fail, 1, report(None, &[])).0, None);
        let failed = report(Some(FailureClass::Nonzero), &["sw_power_cap"]);
        assert_eq!(
            outcome(OnThrottle::Fail, 1, failed).0,
            Some(FailureClass::Nonzero)
        );
        // The log tail says why.
        let mut r = hot();
        apply_on_throttle(OnThrottle::Fail, &mut r);
        assert!(r.log_tail.contains("sw_power_cap") && r.log_tail.contains("on_throttle: fail"));
    }

    #[test]
    fn a_requeued_attempt_goes_back_spending_no_attempt_only_when_it_was_asked() {
        // Its last attempt, with nothing in `retry.on`: requeued all the same.
        let job = rules(vec![], 3, 3);
        for (class, why) in [
            (FailureClass::Preempted, Requeue::Preempted),
            (FailureClass::Requeued, Requeue::Requeued),
        ] {
            let mut r = ended(Some(class));
            check_requeue(&mut r, Some(why));
            let f = finish(&job, None, &r).expect("finish");
            assert_eq!(f.event, JobEvent::Fail { retry: true }, "{class}");
            assert!(f.refund, "{class} spends no attempt");
            assert_eq!(f.last_failure, Some(class));
            // Not asked (or asked otherwise): an agent cannot give its jobs free attempts.
            for asked in [
                None,
                Some(if why == Requeue::Preempted {
                    Requeue::Requeued
                } else {
                    Requeue::Preempted
                }),
            ] {
                let mut r = ended(Some(class));
                check_requeue(&mut r, asked);
                assert_eq!(
                    r.failure,
                    Some(FailureClass::Lost),
                    "{class} asked {asked:?}"
                );
                let f = finish(&job, None, &r).expect("finish");
                assert!(!f.refund);
            }
        }
    }

    fn halve() -> Vec<BTreeMap<String, Value>> {
        vec![BTreeMap::from([(
            "batch_size".to_string(),
            serde_json::json!("/2"),
        )])]
    }

    fn shape(steady_mib: u64, from: f64, until: f64, expected_ms: u64) -> Phases {
        Phases {
            steady_mib,
            peak_from: from,
            peak_until: until,
            expected_ms,
            margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
        }
    }

    #[test]
    fn learned_phases_cover_every_run_they_were_taught_by() {
        let runs = [
            (2600, Some(shape(2000, 0.9, 1.0, 60_000))),
            (3100, Some(shape(2400, 0.9, 1.0, 100_000))),
        ];
        let p = learned_phases(&runs).expect("a shape");
        // From each run's start: the short run's peak from 54 s, the long one's to 100 s.
        assert_eq!((p.steady_mib, p.expected_ms), (2640, 100_000));
        assert!((p.peak_from - 0.54).abs() < 1e-9, "{p:?}");
        assert!((p.peak_until - 1.0).abs() < 1e-9, "{p:?}");
        assert_eq!(learned_phases(&[]), None);
        // Peaks that fall in different places: no one shape places them.
        let apart = [
            (2600, Some(shape(2000, 0.1, 0.2, 60_000))),
            (2600, Some(shape(2000, 0.8, 0.9, 60_000))),
        ];
        assert_eq!(learned_phases(&apart), None);
        // A run that told no shape counts at its peak throughout: one that held near its
        // peak all along raises the steady use to it; one whose peak was missed between
        // looks (its peak its steady use) changes nothing.
        let held = learned_phases(&[(2600, None), runs[0]]).expect("a shape");
        assert_eq!(held.steady_mib, (2600.0 * LEARNED_MARGIN).ceil() as u64);
        let missed = learned_phases(&[(2000, None), runs[0]]).expect("a shape");
        assert_eq!(missed.steady_mib, 2200);
        assert_eq!(learned_phases(&[(2600, None)]), None, "no shape at all");
        // Only the latest few count.
        let mut many = vec![(2600, Some(shape(2000, 0.9, 1.0, 60_000))); PROFILES_WINDOW];
        many.push((9000, None));
        assert_eq!(learned_phases(&many).map(|p| p.steady_mib), Some(2040));
    }

    /// A run's timing is placed with twice the spread of its taught runs' lengths, at least
    /// 3 %, at most the declared tenth, and the tenth until five runs taught it.
    #[test]
    fn a_length_that_runs_agree_on_is_placed_with_twice_their_spread() {
        let taught = |lengths: &[u64]| {
            let runs: Vec<(u64, Option<Phases>)> = lengths
                .iter()
                .map(|l| (3000, Some(shape(2000, 0.5, 0.55, *l))))
                .collect();
            learned_phases(&runs).map(|p| p.margin_permille)
        };
        assert_eq!(taught(&[40_000; 5]), Some(LENGTH_MARGIN_FLOOR_PERMILLE));
        // 40.8 s over 40 s: 2 % spread, 4 % margin.
        assert_eq!(taught(&[40_000, 40_800, 40_200, 40_100, 40_400]), Some(40));
        assert_eq!(taught(&[40_000, 46_000, 40_000, 40_000, 40_000]), Some(100));
        // Four runs, however alike, are not enough; neither is a run that told no length.
        assert_eq!(taught(&[40_000; 4]), Some(DECLARED_MARGIN_PERMILLE));
        let mut four: Vec<(u64, Option<Phases>)> =
            vec![(3000, Some(shape(2000, 0.5, 0.55, 40_000))); 4];
        four.insert(0, (3000, None));
        assert_eq!(
            learned_phases(&four).map(|p| p.margin_permille),
            Some(DECLARED_MARGIN_PERMILLE)
        );
        // Declared phases keep the tenth.
        let declared = headroom_shared::phases::MemoryPhases {
            steady: headroom_shared::size::MemSize::from_mib(2000),
            peak: [0.5, 0.55],
        }
        .check(
            Some(headroom_shared::size::MemSize::from_mib(3000)),
            Some(std::time::Duration::from_secs(40)),
        )
        .expect("valid");
        assert_eq!(declared.margin_permille, DECLARED_MARGIN_PERMILLE);
    }

    #[test]
    fn a_steady_use_that_runs_agree_on_is_counted_with_their_spread() {
        let taught = |steadies: &[u64]| {
            let runs: Vec<(u64, Option<Phases>)> = steadies
                .iter()
                .map(|s| (3000, Some(shape(*s, 0.9, 1.0, 60_000))))
                .collect();
            learned_phases(&runs).map(|p| p.steady_mib)
        };
        // Three runs that held the same: the floor's 2 %.
        assert_eq!(taught(&[2000, 2000, 2000]), Some(2040));
        // As wide as they spread: 2,120 over 2,000 is 6 % on the most.
        assert_eq!(taught(&[2000, 2120, 2050]), Some(2248));
        // Runs that spread more keep the whole margin (2,600 x 1.1, rounded up), and so do
        // two runs, however alike.
        assert_eq!(taught(&[2000, 2600, 2100]), Some(2861));
        assert_eq!(taught(&[2000, 2000]), Some(2200));
        // A run that told no shape counts at its peak among them: the spread is that wide.
        let runs = [
            (3000, None),
            (3000, Some(shape(2000, 0.9, 1.0, 60_000))),
            (3000, Some(shape(2000, 0.9, 1.0, 60_000))),
        ];
        assert_eq!(learned_phases(&runs).map(|p| p.steady_mib), Some(3301));
    }

    #[test]
    fn a_job_is_placed_by_its_declared_phases_else_by_learned_ones_on_its_first_attempt() {
        let declared = shape(1000, 0.5, 0.6, 10_000);
        let taught = KeyMemory {
            profiles: vec![(2600, Some(shape(2000, 0.9, 1.0, 60_000)))],
            ..Default::default()
        };
        let row = |phases: Option<Phases>, first: bool| PendingRow {
            phases,
            first,
            id: "j".into(),
            gpus: 1,
            declared: Some(6_000),
            since: 0,
            memory_key: "k".into(),
            reason: None,
            alone: false,
            background_mib: None,
            state: JobState::Queued,
            cursor: Default::default(),
            experiment: "e".into(),
            user: "u".into(),
            max_concurrent: None,
            host_declared: None,
        };
        assert_eq!(
            pending_phases(&row(Some(declared), true), &taught),
            Some(declared)
        );
        assert_eq!(
            pending_phases(&row(None, true), &taught),
            Some(shape(2200, 0.9, 1.0, 60_000))
        );
        // A retry may resume partway through its run.
        assert_eq!(pending_phases(&row(Some(declared), false), &taught), None);
        assert_eq!(pending_phases(&row(None, false), &taught), None);
        // A key that ran out of memory is placed by its peak; what its spec says still holds.
        let oomed = KeyMemory {
            floor: Some(7_500),
            ..taught.clone()
        };
        assert_eq!(pending_phases(&row(None, true), &oomed), None);
        assert_eq!(
            pending_phases(&row(Some(declared), true), &oomed),
            Some(declared)
        );
    }

    #[test]
    fn estimates_take_the_safest_known_figure() {
        assert_eq!(
            effective_estimate(None, &mut [], None, None, None),
            (None, "none")
        );
        assert_eq!(
            effective_estimate(Some(1000), &mut [], None, None, None),
            (Some(1000), "declared")
        );
        assert_eq!(
            effective_estimate(Some(1000), &mut [500, 600], None, None, None),
            (Some(1000), "declared")
        );
        assert_eq!(
            effective_estimate(Some(1000), &mut [2000], None, None, None),
            (Some(2200), "learned")
        );
        // Runs that kept to what was declared leave it as declared, however close they came;
        // one run past it and the learned p95 with its margin is taken.
        assert_eq!(
            effective_estimate(Some(4810), &mut [4810, 4700, 4810], None, None, None),
            (Some(4810), "declared")
        );
        assert_eq!(
            effective_estimate(Some(4810), &mut [4810, 4700, 4811], None, None, None),
            (Some(5293), "learned")
        );
        // An OOM's floor past the declared figure still raises it.
        assert_eq!(
            effective_estimate(Some(4810), &mut [4810], Some(6013), None, None),
            (Some(6013), "learned")
        );
        assert_eq!(
            effective_estimate(None, &mut [100; 3], Some(900), None, None),
            (Some(900), "learned")
        );
        // p95 of 20 peaks is the 19th smallest.
        let mut peaks: Vec<u64> = (1..=20).map(|i| i * 100).collect();
        assert_eq!(
            effective_estimate(None, &mut peaks, None, None, None),
            (Some(2090), "learned")
        );
    }

    #[test]
    fn the_margin_never_keeps_a_run_from_the_gpu_its_peak_fits() {
        // 20 GiB peak, 21.6 GiB usable: 22 GiB with the margin would fit no GPU; it runs
        // alone on an idle one instead, as a job with no estimate does.
        assert_eq!(
            effective_estimate(None, &mut [20_480], None, Some(22_118), None),
            (None, "none")
        );
        assert_eq!(
            effective_estimate(Some(4_096), &mut [20_480], None, Some(22_118), None),
            (None, "none"),
            "a stale declaration below the peak is no reason to share"
        );
        // Room for the margin: it stays.
        assert_eq!(
            effective_estimate(None, &mut [10_000], None, Some(22_118), None),
            (Some(11_000), "learned")
        );
        // A peak past the GPU, or a floor an OOM raised past it, is kept as it is.
        assert_eq!(
            effective_estimate(None, &mut [23_000], None, Some(22_118), None),
            (Some(25_301), "learned"),
            "23,000 x 1.1, rounded up"
        );
        assert_eq!(
            effective_estimate(None, &mut [20_480], Some(23_000), Some(22_118), None),
            (Some(23_000), "learned")
        );
    }

    /// A floor an OOM raised past this node's GPUs waits for a node whose GPU it fits; past
    /// every live GPU, there is none to wait for: it runs alone on an idle GPU.
    #[test]
    fn a_floor_past_every_live_gpu_runs_alone_rather_than_waiting_for_ever() {
        // 33 GiB after asking for 30; 22 GiB usable here, 76 GiB on another node: it waits.
        assert_eq!(
            effective_estimate(None, &mut [], Some(33_792), Some(22_118), Some(77_824)),
            (Some(33_792), "learned")
        );
        // No live GPU offers it: alone, with or without a declared figure that fits.
        assert_eq!(
            effective_estimate(None, &mut [], Some(33_792), Some(22_118), Some(22_118)),
            (None, "none")
        );
        assert_eq!(
            effective_estimate(
                Some(4096),
                &mut [3000],
                Some(33_792),
                Some(22_118),
                Some(22_118)
            ),
            (None, "none")
        );
        // A declared figure past every GPU is the user's: it is kept, and says so as it waits.
        assert_eq!(
            effective_estimate(Some(40_000), &mut [], Some(50_000), None, Some(22_118)),
            (Some(50_000), "learned")
        );
        // Not known where the live GPUs are: kept.
        assert_eq!(
            effective_estimate(None, &mut [], Some(33_792), Some(22_118), None),
            (Some(33_792), "learned")
        );
    }

    #[test]
    fn a_ladder_step_gets_the_memory_key_of_its_parameters() {
        let step = next_ladder_step(&rules(halve(), 1, 1))
            .expect("step")
            .expect("a step");
        assert_eq!(step.params["batch_size"], serde_json::json!(4));
        assert_eq!(step.argv, vec!["train".to_string(), "--bs=4".into()]);
        assert_eq!(step.memory_key, "exp;batch_size=4");
        assert_eq!(step.max_attempts, 2, "a listed step is a retry of its own");
    }

    #[test]
    fn the_last_step_repeats_while_attempts_remain_and_it_changes_something() {
        let mut job = rules(halve(), 2, 5);
        job.ladder_step = 1;
        let step = next_ladder_step(&job).expect("step").expect("repeats");
        assert_eq!(step.params["batch_size"], serde_json::json!(4));
        assert_eq!(step.max_attempts, 5, "repeats count against max_attempts");
        job.attempts = 5;
        assert!(
            next_ladder_step(&job).expect("step").is_none(),
            "no attempts left"
        );
        job.attempts = 2;
        job.params.insert("batch_size".into(), serde_json::json!(1));
        assert!(
            next_ladder_step(&job).expect("step").is_none(),
            "halving 1 changes nothing"
        );
    }

    #[test]
    fn fences_are_compared_in_one_place() {
        let a = AttemptId::new();
        let row = |phase, af, jf| FenceRow {
            phase,
            attempt_fence: af,
            job_fence: jf,
        };
        assert!(check_fence(a, 3, &row(AttemptPhase::Running, 3, 3)).is_ok());
        for r in [
            row(AttemptPhase::Ended, 3, 3),
            row(AttemptPhase::Running, 2, 3),
            row(AttemptPhase::Running, 3, 4),
        ] {
            assert!(matches!(
                check_fence(a, 3, &r),
                Err(Refusal::StaleFence { .. })
            ));
        }
    }

    #[test]
    fn late_reports_are_taken_for_lost_attempts_whose_job_was_not_leased_again() {
        let a = AttemptId::new();
        let row = |phase, jf, failure, started| FinishRow {
            fence: FenceRow {
                phase,
                attempt_fence: 3,
                job_fence: jf,
            },
            failure,
            started,
        };
        let lost = Some(FailureClass::Lost);
        let check = |r: &FinishRow, presented| check_finish(a, presented, r).ok();
        assert_eq!(
            check(&row(AttemptPhase::Running, 3, None, true), 3),
            Some(Report::OnTime)
        );
        assert_eq!(
            check(&row(AttemptPhase::Ended, 3, lost, true), 3),
            Some(Report::Late { refunded: false })
        );
        assert_eq!(
            check(&row(AttemptPhase::Ended, 3, lost, false), 3),
            Some(Report::Late { refunded: true })
        );
        // Leased again, or a wrong token: stale.
        assert_eq!(check(&row(AttemptPhase::Ended, 4, lost, true), 3), None);
        assert_eq!(check(&row(AttemptPhase::Ended, 3, lost, true), 2), None);
        // An end already reported with this token (by the supervisor, then the agent's
        // journal): answered again, whatever happened to the job since; another token is
        // stale.
        let oom = Some(FailureClass::Oom);
        for jf in [3, 4] {
            assert_eq!(
                check(&row(AttemptPhase::Ended, jf, None, true), 3),
                Some(Report::Again)
            );
            assert_eq!(
                check(&row(AttemptPhase::Ended, jf, oom, true), 3),
                Some(Report::Again)
            );
        }
        assert_eq!(check(&row(AttemptPhase::Ended, 3, oom, true), 2), None);
        assert_eq!(
            late_event(JobEvent::Fail { retry: true }),
            JobEvent::LateEnd {
                succeeded: false,
                retry: true
            }
        );
    }

    #[test]
    fn heartbeats_skip_attempts_that_just_ended_and_refuse_lost_ones() {
        let a = AttemptId::new();
        let row = |phase, af, jf| FenceRow {
            phase,
            attempt_fence: af,
            job_fence: jf,
        };
        let renew = |fence, failure, ours| {
            renewal(
                a,
                3,
                Some(&RenewalRow {
                    fence,
                    failure,
                    ours,
                }),
            )
            .ok()
        };
        let running = || row(AttemptPhase::Running, 3, 3);
        assert_eq!(renew(running(), None, true), Some(true));
        assert_eq!(renew(row(AttemptPhase::Running, 2, 2), None, true), None);
        assert_eq!(renew(running(), None, false), None, "another agent's");
        // Ended by its own report while the heartbeat travelled; the job may have moved on.
        let ended = || row(AttemptPhase::Ended, 3, 4);
        let oom = Some(FailureClass::Oom);
        assert_eq!(renew(ended(), oom, true), Some(false));
        assert_eq!(renew(ended(), None, true), Some(false));
        assert_eq!(renewal(a, 3, None).ok(), Some(false), "handed back");
        // Lost: the coordinator took the lease away.
        assert_eq!(renew(ended(), Some(FailureClass::Lost), true), None);
        let (ended, running) = (ended(), running());
        // Logs: the tail of an ended attempt is welcome until a lost one's job moved on.
        assert!(check_log_fence(a, 3, &ended, oom).is_ok());
        let lost = Some(FailureClass::Lost);
        assert!(check_log_fence(a, 3, &row(AttemptPhase::Ended, 3, 3), lost).is_ok());
        assert!(check_log_fence(a, 3, &ended, lost).is_err());
        assert!(check_log_fence(a, 2, &running, None).is_err());
    }

    #[test]
    fn losses_refund_attempts_that_never_started() {
        let job = rules(vec![], 1, 1);
        assert_eq!(
            lose(&job, false),
            Loss {
                max_attempts: 2,
                event: JobEvent::Fail { retry: true }
            }
        );
        assert_eq!(
            lose(&job, true),
            Loss {
                max_attempts: 1,
                event: JobEvent::Fail { retry: false }
            }
        );
        // A late report takes back exactly what the loss gave.
        assert_eq!(undo_loss(lose(&job, false).max_attempts, true), 1);
        assert_eq!(undo_loss(lose(&job, true).max_attempts, false), 1);
    }

    #[test]
    fn tries_after_a_manual_retry_and_a_hand_back() {
        assert_eq!(manual_retry(3), 4, "one try more than used");
        assert_eq!(
            hand_back(1),
            (
                0,
                JobEvent::HandBack {
                    had_attempts: false
                }
            )
        );
        assert_eq!(hand_back(3), (2, JobEvent::HandBack { had_attempts: true }));
        assert_eq!(hand_back(0).0, 0, "never below zero");
    }

    /// An OOM raises its key to x1.25 what the attempt had, or to what it held plus what the
    /// failed allocation asked for (with the learned margin) when the OOM's text says so and
    /// that is more.
    #[test]
    fn an_oom_floor_covers_what_the_failed_allocation_asked_for() {
        // Nothing said of the allocation: x1.25 the estimate or the peak, the larger.
        assert_eq!(oom_floor(Some(4000), Some(2000), None), Some(5000));
        assert_eq!(oom_floor(None, Some(2000), None), Some(2500));
        assert_eq!(oom_floor(None, None, None), None);
        // A peak missed between samples: 9 GiB held, 6 GiB asked; (9 + 6) GiB x 1.1.
        assert_eq!(
            oom_floor(Some(10_138), Some(9216), Some(6144)),
            Some(16_896)
        );
        // A small allocation on a full GPU: x1.25 is already more.
        assert_eq!(oom_floor(Some(8000), Some(7900), Some(20)), Some(10_000));
        // Without a peak, what it asked for is still the least it needs.
        assert_eq!(oom_floor(Some(4000), None, Some(10_000)), Some(11_000));
        assert_eq!(oom_floor(None, None, Some(10_240)), Some(11_264));
    }

    #[test]
    fn memory_floors_only_rise() {
        assert_eq!(raised_floor(None, 100), Some(100));
        assert_eq!(raised_floor(Some(100), 150), Some(150));
        assert_eq!(raised_floor(Some(150), 100), None);
        assert_eq!(raised_floor(Some(150), 150), None);
    }

    #[test]
    fn freed_memory_is_more_free_on_some_gpu() {
        let s = |free| GpuSample {
            index: 0,
            free_mib: free,
            ..Default::default()
        };
        assert!(memory_freed(&[], &[s(10)]));
        assert!(memory_freed(&[s(5)], &[s(10)]));
        assert!(!memory_freed(&[s(10)], &[s(10)]));
    }

    #[test]
    fn each_access_class_admits_exactly_its_roles() {
        use headroom_shared::api::Role::{Admin, Agent, User};
        let cases = [
            (Access::Public, [true, true, true]),
            (Access::User, [true, true, false]),
            (Access::Owner, [true, true, false]),
            (Access::Admin, [true, false, false]),
            (Access::Agent, [false, false, true]),
        ];
        for (access, want) in cases {
            for (role, ok) in [Admin, User, Agent].into_iter().zip(want) {
                assert_eq!(may_call(access, role).is_ok(), ok, "{access:?} {role}");
            }
        }
        assert_eq!(may_call(Access::Agent, User), Err("agent"));
        assert_eq!(may_call(Access::Admin, Agent), Err("admin"));
    }

    #[test]
    fn tokens_work_until_revoked_or_expired() {
        assert_eq!(token_usable(None, None, 5), Ok(()));
        assert_eq!(token_usable(None, Some(6), 5), Ok(()));
        assert_eq!(token_usable(None, Some(5), 5), Err(TokenRefusal::Expired));
        assert_eq!(
            token_usable(Some(1), Some(9), 5),
            Err(TokenRefusal::Revoked)
        );
    }

    #[test]
    fn only_the_submitter_or_an_admin_may_act_on_a_run() {
        use headroom_shared::api::Role::{Admin, Agent, User};
        let p = |name: &str, role| Principal {
            name: name.into(),
            role,
            token_id: None,
        };
        assert!(may_act_on(&p("alice", User), "alice"));
        assert!(!may_act_on(&p("alice", User), "bob"));
        assert!(may_act_on(&p("root", Admin), "bob"));
        // An agent token named like the submitter is still no user.
        assert!(!may_act_on(&p("bob", Agent), "bob"));
    }
}
