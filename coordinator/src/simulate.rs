//! A discrete-event packing simulator over the coordinator's own placement
//! ([`crate::placement`], not a copy): jobs with a steady memory use, a peak
//! phase and a duration run on simulated nodes' GPUs under a policy; a job holds one or
//! more GPUs of one node, or none (a CPU-only job, in one of its node's CPU slots). A GPU
//! whose jobs' actual use passes its memory OOMs the job whose use just rose (requeued, up
//! to three attempts). It reports makespan, mean completion time, memory utilization and
//! OOMs, and the makespan's ratio to a lower bound.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::placement::{CPU_SLOTS, Candidate, GpuState, Placer, Snapshot};

/// The most attempts a job gets; past them it is failed.
pub const MAX_ATTEMPTS: u32 = 3;
/// The soonest a simulated placement looks again at jobs that wait only for time to pass.
const RECHECK_EVERY_S: f64 = 1.0;
/// Pending jobs one placement pass looks at, in queue order (the coordinator claims a window
/// of the queue at a time too).
const WINDOW: usize = 256;

/// How jobs are packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// One job per GPU.
    Exclusive,
    /// Fill the plan's slots, ignoring memory (the seeds' scripts).
    PlanOnly,
    /// headroom: the plan's slots and memory, with each job's declared estimate.
    Declared,
    /// headroom with learned estimates: a job's estimate is the highest use seen of its
    /// `kind` so far (its declared one until then), as headroom learns from peaks.
    Learned,
    /// headroom with each job's declared estimate, its memory phases and its length
    /// (`resources.memory_phases`, `expected_duration`): runs whose peaks fall apart share.
    Phased,
    /// headroom learning both: estimates as [`Policy::Learned`], and the memory phases of a
    /// kind from its runs that ended well ([`crate::rules::learned_phases`]), for first
    /// attempts of kinds that never ran out of memory.
    LearnedPhased,
}

impl Policy {
    pub const ALL: [Policy; 6] = [
        Policy::Exclusive,
        Policy::PlanOnly,
        Policy::Declared,
        Policy::Learned,
        Policy::Phased,
        Policy::LearnedPhased,
    ];

    /// Placement keeps each GPU's headroom and reads its live use.
    fn headroom(self) -> bool {
        matches!(
            self,
            Policy::Declared | Policy::Learned | Policy::Phased | Policy::LearnedPhased
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exclusive => "exclusive",
            Policy::PlanOnly => "plan only (FIFO)",
            Policy::Declared => "headroom, declared",
            Policy::Learned => "headroom, learned",
            Policy::Phased => "headroom, declared with memory phases",
            Policy::LearnedPhased => "headroom, learned with memory phases",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Cluster {
    /// Each GPU's memory.
    pub gpus_mib: Vec<u64>,
    /// Slots per GPU.
    pub plan: Vec<u32>,
    /// Memory headroom keeps free on each GPU.
    pub headroom_mib: Vec<u64>,
    /// GPUs per node, in the order of `gpus_mib` (0: a node with CPU slots and no GPU).
    /// A multi-GPU job's GPUs are on one node, as the coordinator places a node at a time.
    /// GPUs past those counted form one last node: an empty list is one node of every GPU.
    pub nodes: Vec<u32>,
}

impl Cluster {
    /// Every GPU on one node.
    pub fn one_node(gpus_mib: Vec<u64>, plan: Vec<u32>, headroom_mib: Vec<u64>) -> Self {
        Self {
            gpus_mib,
            plan,
            headroom_mib,
            nodes: Vec::new(),
        }
    }

    /// Each node's GPUs, as indices into `gpus_mib`.
    pub fn node_gpus(&self) -> Vec<Vec<usize>> {
        let n = self.gpus_mib.len();
        let mut out = Vec::new();
        let mut next = 0usize;
        for &count in &self.nodes {
            let end = next.saturating_add(count as usize).min(n);
            out.push((next..end).collect());
            next = end;
        }
        if next < n || out.is_empty() {
            out.push((next..n).collect());
        }
        out
    }
}

#[derive(Clone, Debug)]
pub struct Job {
    /// Jobs of one kind (one model, one configuration) share what is learned of them.
    pub kind: usize,
    pub steady_mib: u64,
    /// The highest use, held from `peak_from` to `peak_until` (fractions of the run).
    pub peak_mib: u64,
    pub peak_from: f64,
    pub peak_until: f64,
    pub duration_s: f64,
    /// What its spec declares (`resources.memory`); `None`: nothing.
    pub declared_mib: Option<u64>,
    /// GPUs it holds, all on one node, each using its steady and peak memory; 0: a CPU-only
    /// job (no GPU, a CPU slot of its node: [`CPU_SLOTS`]).
    pub gpus: u32,
    /// It needs its GPUs to itself (`exclusive`): [`Candidate::alone`].
    pub alone: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub makespan_s: f64,
    pub mean_completion_s: f64,
    pub ooms: u32,
    /// Jobs that ran to their end.
    pub completed: u32,
    /// Jobs that ran out of attempts (or fit no GPU).
    pub failed: u32,
    /// Time-averaged used memory over all GPUs' memory, until the makespan.
    pub memory_utilization: f64,
    pub lower_bound_s: f64,
    /// For a policy that holds each job's declared estimate for its whole run (headroom,
    /// declared): no order of the queue ends sooner ([`reserved_bound`]).
    pub reserved_bound_s: Option<f64>,
    /// Most jobs a GPU held at once, and most memory in use on one (checks).
    pub max_jobs_on_a_gpu: u32,
    pub max_used_fraction: f64,
    /// Each user's mean wait from submission to first start, and when their last job
    /// ended ([`simulate_queue`]).
    pub mean_wait_by_user: Vec<f64>,
    pub last_end_by_user: Vec<f64>,
}

impl Report {
    pub fn bound_ratio(&self) -> f64 {
        if self.lower_bound_s > 0.0 {
            self.makespan_s / self.lower_bound_s
        } else {
            1.0
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    PeakStarts,
    PeakEnds,
    Ends,
    /// A job submitted later joins the queue (`run` is the job).
    Arrives,
    /// A waiting job may fit now by time alone (a run's phase changes).
    Recheck,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    at: f64,
    seq: u64,
    run: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Earliest first (the heap is a max-heap), then in the order scheduled.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

struct Running {
    job: usize,
    node: usize,
    /// Empty for a CPU-only job.
    gpus: Vec<usize>,
    estimate: Option<u64>,
    in_peak: bool,
    /// When it started (ms), for fair share's cost.
    started_ms: i64,
    /// Its memory over time, as placement was told it.
    phases: Option<headroom_shared::phases::Phases>,
}

/// Who submitted a job and when (seconds from the start): a queue of several users.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Submission {
    pub user: usize,
    pub at_s: f64,
}

/// The order waiting jobs go in.
#[derive(Clone, Debug, PartialEq)]
pub enum Order {
    /// Priority and submission alone: the first to submit holds the GPUs.
    Fifo,
    /// headroom's fair share ([`crate::fair`]): users by decayed GPU memory-time per unit of
    /// `shares[user]` (1 past the list), then submission.
    FairShare { shares: Vec<u32>, half_life_s: f64 },
}

/// What a run reserved over its GPUs: its estimate on each, or its steady use where the
/// policy places by none.
fn reserved(job: &Job, estimate: Option<u64>) -> u64 {
    estimate
        .filter(|e| *e > 0)
        .unwrap_or(job.steady_mib)
        .saturating_mul(u64::from(job.gpus))
}

/// What one pass placed: the candidate (its position), the node, the GPUs (their
/// [`GpuState::index`]; none for a CPU-only job).
pub(crate) type NodePlacement = (usize, usize, Vec<u32>);

/// One placement pass over the nodes in order, each placing what the nodes before it left,
/// in queue order, through its own [`Placer`] (the coordinator's claim): a job's GPUs are on
/// one node.
pub(crate) fn place_on_nodes(nodes: &[Snapshot], candidates: &[Candidate]) -> Vec<NodePlacement> {
    place_on_nodes_rechecked(nodes, candidates).0
}

/// [`place_on_nodes`], and when to place again though nothing else happens
/// ([`Placer::recheck_at`]).
fn place_on_nodes_rechecked(
    nodes: &[Snapshot],
    candidates: &[Candidate],
) -> (Vec<NodePlacement>, Option<i64>) {
    let mut left: Vec<usize> = (0..candidates.len()).collect();
    let mut out = Vec::new();
    let mut recheck: Option<i64> = None;
    for (n, snapshot) in nodes.iter().enumerate() {
        if left.is_empty() {
            break;
        }
        let batch: Vec<Candidate> = left.iter().map(|&i| candidates[i].clone()).collect();
        let mut placer = Placer::new(snapshot);
        let placed = placer.place(&batch, usize::MAX).placements;
        recheck = recheck.into_iter().chain(placer.recheck_at()).min();
        let mut taken = vec![false; left.len()];
        for p in placed {
            taken[p.candidate] = true;
            out.push((left[p.candidate], n, p.gpus));
        }
        left = left
            .iter()
            .zip(&taken)
            .filter(|(_, t)| !**t)
            .map(|(i, _)| *i)
            .collect();
    }
    out.sort_by_key(|p| p.0);
    (out, recheck)
}

/// Runs `jobs` (queued at time 0, in order) on `cluster` under `policy`.
pub fn simulate(cluster: &Cluster, jobs: &[Job], policy: Policy) -> Report {
    simulate_after(cluster, jobs, policy, &[])
}

/// [`simulate`], job `j` starting only once every job `after[j]` names has ended (a study's
/// `after`; a job that fails for good ends too). A job missing from `after` waits for none.
pub fn simulate_after(
    cluster: &Cluster,
    jobs: &[Job],
    policy: Policy,
    after: &[Vec<usize>],
) -> Report {
    simulate_queue(cluster, jobs, policy, after, &[], &Order::Fifo)
}

/// [`simulate_after`] with users: job `j` joins the queue at `submissions[j].at_s` (at 0 past
/// the list) and waiting jobs go in `order`. The report's `mean_wait_by_user` is each user's
/// mean wait from submission to first start.
pub fn simulate_queue(
    cluster: &Cluster,
    jobs: &[Job],
    policy: Policy,
    after: &[Vec<usize>],
    submissions: &[Submission],
    order: &Order,
) -> Report {
    let submission = |j: usize| submissions.get(j).copied().unwrap_or_default();
    let users = (0..jobs.len())
        .map(|j| submission(j).user)
        .max()
        .map_or(0, |u| u + 1);
    let mut ledgers: BTreeMap<usize, crate::fair::Ledger> = BTreeMap::new();
    let mut first_start: Vec<Option<f64>> = vec![None; jobs.len()];
    let to_ms = |s: f64| (s * 1000.0).round() as i64;
    let half_life_ms = match order {
        Order::FairShare { half_life_s, .. } => Some(to_ms(*half_life_s).max(0) as u64),
        Order::Fifo => None,
    };
    let mut needs: Vec<usize> = (0..jobs.len())
        .map(|j| {
            after
                .get(j)
                .map_or(0, |a| a.iter().filter(|&&n| n < jobs.len()).count())
        })
        .collect();
    let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); jobs.len()];
    for (j, a) in after.iter().enumerate().take(jobs.len()) {
        for &n in a.iter().filter(|&&n| n < jobs.len()) {
            dependants[n].push(j);
        }
    }
    let n_gpus = cluster.gpus_mib.len();
    let node_gpus = cluster.node_gpus();
    let mut queue: VecDeque<usize> = (0..jobs.len())
        .filter(|&j| submission(j).at_s <= 0.0)
        .collect();
    let mut attempts = vec![0u32; jobs.len()];
    let mut learned: BTreeMap<usize, u64> = BTreeMap::new();
    // Kinds' shapes from runs that ended well (newest first), and kinds that ran out of
    // memory (with `Policy::LearnedPhased`).
    let mut shapes: BTreeMap<usize, Vec<(u64, Option<headroom_shared::phases::Phases>)>> =
        BTreeMap::new();
    let mut oomed: std::collections::BTreeSet<usize> = Default::default();
    let mut running: BTreeMap<u64, Running> = BTreeMap::new();
    let mut events = BinaryHeap::new();
    let (mut seq, mut next_run) = (0u64, 0u64);
    let mut used = vec![0u64; n_gpus];
    let mut now = 0.0f64;
    let mut report = Report::default();
    let mut next_recheck: Option<f64> = None;
    let shape_of = |job: &Job| headroom_shared::phases::Phases {
        steady_mib: job.steady_mib,
        peak_from: job.peak_from,
        peak_until: job.peak_until,
        expected_ms: to_ms(job.duration_s).max(1) as u64,
        margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
    };
    // What placement knows of a job's memory over time: declared (`Policy::Phased`), or
    // learned from its kind's runs that ended well (`Policy::LearnedPhased`).
    let phases_of =
        |j: usize,
         shapes: &BTreeMap<usize, Vec<(u64, Option<headroom_shared::phases::Phases>)>>,
         oomed: &std::collections::BTreeSet<usize>,
         first: bool| {
            let job = &jobs[j];
            match policy {
                Policy::Phased => job.declared_mib.is_some().then(|| shape_of(job)),
                Policy::LearnedPhased if first && !oomed.contains(&job.kind) => shapes
                    .get(&job.kind)
                    .and_then(|s| crate::rules::learned_phases(s)),
                _ => None,
            }
        };
    let mut completion_sum = 0.0;
    let mut used_integral = 0.0;
    let capacity: u64 = cluster.gpus_mib.iter().sum();
    let over = |used: &[u64], gpus: &[usize]| gpus.iter().any(|&g| used[g] > cluster.gpus_mib[g]);

    let mut schedule = |events: &mut BinaryHeap<Event>, at: f64, run: u64, kind: Kind| {
        seq += 1;
        events.push(Event { at, seq, run, kind });
    };
    for j in (0..jobs.len()).filter(|&j| submission(j).at_s > 0.0) {
        schedule(&mut events, submission(j).at_s, j as u64, Kind::Arrives);
    }

    loop {
        // Place what fits now, through the coordinator's placement, a node at a time.
        let estimate_of = |j: usize, learned: &BTreeMap<usize, u64>| -> Option<u64> {
            match policy {
                Policy::Exclusive | Policy::PlanOnly => Some(0),
                Policy::Declared | Policy::Phased => jobs[j].declared_mib,
                Policy::Learned | Policy::LearnedPhased => {
                    learned.get(&jobs[j].kind).copied().or(jobs[j].declared_mib)
                }
            }
        };
        let gpu_state = |g: usize| GpuState {
            timed: crate::timeline::Timeline {
                now_ms: to_ms(now),
                runs: running
                    .values()
                    .filter(|r| r.gpus.contains(&g))
                    .filter_map(|r| {
                        Some(crate::timeline::TimedRun::new(
                            r.estimate?,
                            r.phases?,
                            r.started_ms,
                        ))
                    })
                    .collect(),
            },
            index: g as u32,
            total_mib: cluster.gpus_mib[g],
            slots: match policy {
                Policy::Exclusive => 1,
                _ => cluster.plan.get(g).copied().unwrap_or(0),
            },
            headroom_mib: match policy.headroom() {
                true => cluster.headroom_mib.get(g).copied().unwrap_or(0),
                false => 0,
            },
            live_free_mib: policy
                .headroom()
                .then(|| cluster.gpus_mib[g].saturating_sub(used[g])),
            placed: running
                .values()
                .filter(|r| r.gpus.contains(&g))
                .map(|r| r.estimate)
                .collect(),
            quarantined: false,
            held_alone: running
                .values()
                .any(|r| jobs[r.job].alone && r.gpus.contains(&g)),
        };
        let snapshots: Vec<Snapshot> = node_gpus
            .iter()
            .enumerate()
            .map(|(n, gpus)| Snapshot {
                host_free_mib: None,
                gpus: gpus.iter().map(|&g| gpu_state(g)).collect(),
                cpu_jobs: running
                    .values()
                    .filter(|r| r.node == n && r.gpus.is_empty())
                    .count() as u32,
                reserve_after_ms: u64::MAX,
            })
            .collect();
        // The window: queued jobs whose needs have all ended, in queue order (with fair
        // share, users by their standing first, as each claim orders them).
        let mut waiting: Vec<usize> = queue.iter().copied().filter(|&j| needs[j] == 0).collect();
        if let (Order::FairShare { shares, .. }, Some(half_life)) = (order, half_life_ms) {
            let runs: Vec<crate::fair::Run> = running
                .values()
                .map(|r| crate::fair::Run {
                    user: submission(r.job).user.to_string(),
                    reserved_mib: reserved(&jobs[r.job], r.estimate),
                    gpus: jobs[r.job].gpus,
                    started: Some(r.started_ms),
                    ended: None,
                })
                .collect();
            let ledgers: std::collections::HashMap<String, crate::fair::Ledger> =
                ledgers.iter().map(|(u, l)| (u.to_string(), *l)).collect();
            let users: Vec<(String, u32)> = (0..users)
                .map(|u| (u.to_string(), shares.get(u).copied().unwrap_or(1)))
                .collect();
            let standings = crate::fair::standings(&users, &ledgers, &runs, to_ms(now), half_life);
            let shares = crate::fair::order(standings, &std::collections::HashMap::new());
            waiting.sort_by_key(|&j| shares.rank(&submission(j).user.to_string()));
        }
        waiting.truncate(WINDOW);
        let candidates: Vec<Candidate> = waiting
            .iter()
            .map(|&j| Candidate {
                host_mib: None,
                gpus: jobs[j].gpus,
                estimate_mib: estimate_of(j, &learned),
                waited_ms: 0,
                alone: jobs[j].alone,
                phases: phases_of(j, &shapes, &oomed, attempts[j] == 0),
            })
            .collect();
        let (placed, recheck) = place_on_nodes_rechecked(&snapshots, &candidates);
        // Looked at again no sooner than a second on: a simulated hour of rechecks a
        // millisecond apart would take the simulator, not placement, all its time.
        if let Some(at) = recheck.map(|ms| (ms as f64 / 1000.0).max(now + RECHECK_EVERY_S))
            && at > now
            && next_recheck.is_none_or(|r| r <= now || at < r)
        {
            next_recheck = Some(at);
            schedule(&mut events, at, 0, Kind::Recheck);
        }
        let mut taken = vec![false; waiting.len()];
        let mut started_now = Vec::new();
        for (c, node, gpus) in placed {
            let j = waiting[c];
            let gpus: Vec<usize> = gpus.into_iter().map(|g| g as usize).collect();
            taken[c] = true;
            attempts[j] += 1;
            first_start[j].get_or_insert(now);
            next_run += 1;
            started_now.push(next_run);
            let job = &jobs[j];
            for &g in &gpus {
                used[g] += job.steady_mib;
            }
            running.insert(
                next_run,
                Running {
                    job: j,
                    node,
                    gpus,
                    estimate: candidates[c].estimate_mib,
                    in_peak: false,
                    started_ms: to_ms(now),
                    phases: candidates[c].phases,
                },
            );
            schedule(&mut events, now + job.duration_s, next_run, Kind::Ends);
            schedule(
                &mut events,
                now + job.peak_from * job.duration_s,
                next_run,
                Kind::PeakStarts,
            );
            schedule(
                &mut events,
                now + job.peak_until * job.duration_s,
                next_run,
                Kind::PeakEnds,
            );
        }
        let started: std::collections::BTreeSet<usize> = waiting
            .iter()
            .zip(&taken)
            .filter(|(_, t)| **t)
            .map(|(j, _)| *j)
            .collect();
        queue.retain(|j| !started.contains(j));
        // A start whose steady use does not fit OOMs at once (placement that ignores memory),
        // in the order they started, until the rest fit.
        for run in started_now {
            let Some(r) = running.get(&run) else {
                continue;
            };
            if !over(&used, &r.gpus) {
                continue;
            }
            let Some(r) = running.remove(&run) else {
                continue;
            };
            let job = &jobs[r.job];
            for &g in &r.gpus {
                used[g] -= job.steady_mib;
            }
            report.ooms += 1;
            learn(&mut learned, job);
            oomed.insert(job.kind);
            if attempts[r.job] < MAX_ATTEMPTS {
                queue.push_back(r.job);
            } else {
                report.failed += 1;
                completion_sum += now;
                for &d in &dependants[r.job] {
                    needs[d] -= 1;
                }
            }
        }
        for g in 0..n_gpus {
            let on = running.values().filter(|r| r.gpus.contains(&g)).count() as u32;
            report.max_jobs_on_a_gpu = report.max_jobs_on_a_gpu.max(on);
        }

        let Some(ev) = events.pop() else {
            break;
        };
        used_integral += used.iter().sum::<u64>() as f64 * (ev.at - now);
        now = ev.at;
        if ev.kind == Kind::Arrives {
            queue.push_back(ev.run as usize);
            continue;
        }
        if ev.kind == Kind::Recheck {
            continue;
        }
        // A run that ends (or OOMs) now is charged to its user's ledger.
        let charge = |ledgers: &mut BTreeMap<usize, crate::fair::Ledger>, r: &Running| {
            if let Some(half_life) = half_life_ms {
                let cost =
                    reserved(&jobs[r.job], r.estimate) as f64 * (to_ms(now) - r.started_ms) as f64;
                let user = submission(r.job).user;
                let l = ledgers.get(&user).copied();
                ledgers.insert(
                    user,
                    crate::fair::Ledger::charged(l, cost, to_ms(now), half_life),
                );
            }
        };
        let Some(r) = running.get_mut(&ev.run) else {
            continue; // an OOM ended this run before
        };
        let job = &jobs[r.job];
        match ev.kind {
            Kind::PeakStarts => {
                r.in_peak = true;
                let rise = job.peak_mib.saturating_sub(job.steady_mib);
                for &g in &r.gpus {
                    used[g] += rise;
                }
                if over(&used, &r.gpus) {
                    // The job whose use just rose asks for memory that is not there.
                    let Some(r) = running.remove(&ev.run) else {
                        continue;
                    };
                    charge(&mut ledgers, &r);
                    for &g in &r.gpus {
                        used[g] -= job.peak_mib;
                    }
                    report.ooms += 1;
                    learn(&mut learned, job);
                    oomed.insert(job.kind);
                    if attempts[r.job] < MAX_ATTEMPTS {
                        queue.push_front(r.job);
                    } else {
                        report.failed += 1;
                        completion_sum += now;
                        for &d in &dependants[r.job] {
                            needs[d] -= 1;
                        }
                    }
                } else {
                    for &g in &r.gpus {
                        let frac = used[g] as f64 / cluster.gpus_mib[g] as f64;
                        report.max_used_fraction = report.max_used_fraction.max(frac);
                    }
                }
            }
            Kind::Arrives | Kind::Recheck => {}
            Kind::PeakEnds => {
                if r.in_peak {
                    r.in_peak = false;
                    let rise = job.peak_mib.saturating_sub(job.steady_mib);
                    for &g in &r.gpus {
                        used[g] -= rise;
                    }
                }
            }
            Kind::Ends => {
                let Some(r) = running.remove(&ev.run) else {
                    continue;
                };
                charge(&mut ledgers, &r);
                let user = submission(r.job).user;
                if report.last_end_by_user.len() <= user {
                    report.last_end_by_user.resize(user + 1, 0.0);
                }
                report.last_end_by_user[user] = now;
                let held = if r.in_peak {
                    job.peak_mib
                } else {
                    job.steady_mib
                };
                for &g in &r.gpus {
                    used[g] -= held;
                }
                learn(&mut learned, job);
                // As a supervisor tells a shape: a peak a tenth above steady, at most half
                // the run; else none.
                let told = (job.peak_mib * 10 >= job.steady_mib * 11
                    && job.peak_until - job.peak_from <= 0.5)
                    .then(|| shape_of(job));
                let kind = shapes.entry(job.kind).or_default();
                kind.insert(0, (job.peak_mib, told));
                kind.truncate(crate::rules::PROFILES_WINDOW);
                completion_sum += now;
                report.completed += 1;
                for &d in &dependants[r.job] {
                    needs[d] -= 1;
                }
            }
        }
    }
    report.makespan_s = now;
    report.mean_completion_s = if jobs.is_empty() {
        0.0
    } else {
        completion_sum / jobs.len() as f64
    };
    report.memory_utilization = if now > 0.0 && capacity > 0 {
        used_integral / (capacity as f64 * now)
    } else {
        0.0
    };
    report.lower_bound_s = lower_bound(cluster, jobs);
    if policy == Policy::Declared {
        report.reserved_bound_s = Some(reserved_bound(cluster, jobs));
    }
    // Jobs that could never be placed (larger than every GPU) stay queued: failed.
    report.failed += queue.len() as u32;
    report.mean_wait_by_user = (0..users)
        .map(|u| {
            let waits: Vec<f64> = (0..jobs.len())
                .filter(|&j| submission(j).user == u)
                .filter_map(|j| first_start[j].map(|s| s - submission(j).at_s))
                .collect();
            waits.iter().sum::<f64>() / waits.len().max(1) as f64
        })
        .collect();
    report
}

/// What a run teaches of its kind: the highest use it reached (or tried to).
fn learn(learned: &mut BTreeMap<usize, u64>, job: &Job) {
    learned
        .entry(job.kind)
        .and_modify(|m| *m = (*m).max(job.peak_mib))
        .or_insert(job.peak_mib);
}

/// No schedule ends sooner than the longest job, than the jobs' memory-time over the GPUs'
/// memory, than their GPU time over the slots (one slot per GPU per job), or than the
/// CPU-only jobs' run time over the nodes' CPU slots.
pub fn lower_bound(cluster: &Cluster, jobs: &[Job]) -> f64 {
    let longest = jobs.iter().map(|j| j.duration_s).fold(0.0, f64::max);
    let memory_time: f64 = jobs
        .iter()
        .map(|j| j.steady_mib as f64 * j.duration_s * f64::from(j.gpus))
        .sum();
    let capacity: u64 = cluster.gpus_mib.iter().sum();
    let slots: u32 = cluster.plan.iter().sum();
    let gpu_time: f64 = jobs.iter().map(|j| j.duration_s * f64::from(j.gpus)).sum();
    let cpu_time: f64 = jobs
        .iter()
        .filter(|j| j.gpus == 0)
        .map(|j| j.duration_s)
        .sum();
    let cpu_slots = CPU_SLOTS as usize * cluster.node_gpus().len();
    longest
        .max(memory_time / capacity.max(1) as f64)
        .max(gpu_time / f64::from(slots.max(1)))
        .max(cpu_time / cpu_slots.max(1) as f64)
}

/// No schedule that holds each job's declared estimate for its whole run ends sooner than
/// the jobs' estimate-time over the GPUs' memory less headroom (placement never estimates a
/// GPU past that), nor than [`lower_bound`]. A job declaring nothing, or needing its GPUs to
/// itself, holds whole GPUs, each counted as the smallest one's. Like [`lower_bound`], it
/// bounds schedules that run every job (a report with jobs failed is not held to it).
pub fn reserved_bound(cluster: &Cluster, jobs: &[Job]) -> f64 {
    let budgets = cluster
        .gpus_mib
        .iter()
        .zip(&cluster.headroom_mib)
        .map(|(total, headroom)| total.saturating_sub(*headroom));
    let smallest = budgets.clone().min().unwrap_or(0);
    let budget: u64 = budgets.sum();
    let held: f64 = jobs
        .iter()
        .map(|j| {
            let per_gpu = match j.declared_mib {
                Some(d) if j.alone => d.max(smallest),
                Some(d) => d,
                None => smallest,
            };
            per_gpu as f64 * j.duration_s * f64::from(j.gpus)
        })
        .sum();
    lower_bound(cluster, jobs).max(held / budget.max(1) as f64)
}

/// The policies side by side on one workload, as a Markdown table.
pub fn comparison(cluster: &Cluster, jobs: &[Job]) -> String {
    let mut out = String::from(
        "| policy | makespan | / lower bound | / reserved bound | / exclusive | mean completion | memory used | OOMs | failed |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let exclusive = simulate(cluster, jobs, Policy::Exclusive).makespan_s;
    // What first-come order costs: the same reservations, every run's length known in
    // advance and the longest started first.
    let longest = longest_first(jobs);
    let rows = Policy::ALL
        .into_iter()
        .map(|p| (p.name(), simulate(cluster, jobs, p)))
        .chain([
            (
                "headroom, declared, longest first (every length known in advance)",
                simulate(cluster, &longest, Policy::Declared),
            ),
            (
                "headroom, declared with memory phases, longest first",
                simulate(cluster, &longest, Policy::Phased),
            ),
        ]);
    for (name, r) in rows {
        let vs_exclusive = if exclusive > 0.0 {
            r.makespan_s / exclusive
        } else {
            1.0
        };
        let vs_reserved = match r.reserved_bound_s {
            Some(b) if b > 0.0 => format!("{:.2}", r.makespan_s / b),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "| {} | {} | {:.2} | {} | {:.2} | {} | {:.0} % | {} | {} |\n",
            name,
            seconds(r.makespan_s),
            r.bound_ratio(),
            vs_reserved,
            vs_exclusive,
            seconds(r.mean_completion_s),
            100.0 * r.memory_utilization,
            r.ooms,
            r.failed
        ));
    }
    out
}

/// `jobs` in the order of their lengths, the longest first (ties in queue order): the order
/// that knowing every run's length before it starts would allow.
pub fn longest_first(jobs: &[Job]) -> Vec<Job> {
    let mut out = jobs.to_vec();
    out.sort_by(|a, b| b.duration_s.total_cmp(&a.duration_s));
    out
}

/// Seconds, with a decimal below 100.
fn seconds(s: f64) -> String {
    if s < 100.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(mib: u64, secs: f64) -> Job {
        Job {
            kind: 0,
            steady_mib: mib,
            peak_mib: mib,
            peak_from: 0.5,
            peak_until: 0.6,
            duration_s: secs,
            declared_mib: Some(mib),
            gpus: 1,
            alone: false,
        }
    }

    fn cluster(gpus: usize, slots: u32, nodes: Vec<u32>) -> Cluster {
        Cluster {
            nodes,
            ..Cluster::one_node(vec![10_240; gpus], vec![slots; gpus], vec![1024; gpus])
        }
    }

    #[test]
    fn four_small_jobs_share_two_gpus_where_exclusive_runs_them_in_two_rounds() {
        let cluster = cluster(2, 2, vec![]);
        let jobs = vec![job(4096, 100.0); 4];
        let shared = simulate(&cluster, &jobs, Policy::Declared);
        assert_eq!(
            (shared.makespan_s, shared.completed, shared.ooms),
            (100.0, 4, 0)
        );
        assert_eq!(shared.max_jobs_on_a_gpu, 2);
        let exclusive = simulate(&cluster, &jobs, Policy::Exclusive);
        assert_eq!((exclusive.makespan_s, exclusive.completed), (200.0, 4));
        assert_eq!(exclusive.mean_completion_s, 150.0);
        // Two of 5 GiB do not fit beside the headroom: one per GPU, two rounds.
        let big = simulate(&cluster, &vec![job(5120, 100.0); 4], Policy::Declared);
        assert_eq!((big.makespan_s, big.max_jobs_on_a_gpu), (200.0, 1));
        // Memory ignored, the second pair OOMs at once and waits its turn.
        let plan_only = simulate(&cluster, &vec![job(6144, 100.0); 4], Policy::PlanOnly);
        assert!(plan_only.ooms > 0, "{plan_only:?}");
        // Holding 5 GiB each on 9 GiB budgets, no order beats 4 x 5 x 100 / 18 GiB-s.
        let bound = reserved_bound(&cluster, &vec![job(5120, 100.0); 4]);
        assert!(
            (bound - 4.0 * 5120.0 * 100.0 / 18_432.0).abs() < 1e-9,
            "{bound}"
        );
        assert!(big.reserved_bound_s == Some(bound) && big.makespan_s >= bound);
        assert_eq!(
            plan_only.reserved_bound_s, None,
            "a bound of declared estimates only"
        );
        let table = comparison(&cluster, &jobs);
        // Each policy, and two of them longest first.
        assert_eq!(table.lines().count(), 2 + Policy::ALL.len() + 2, "{table}");
        assert!(
            table.contains("| headroom, declared | 100 s | 1.00 | 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| exclusive | 200 s | 2.00 | - |"),
            "{table}"
        );
    }

    #[test]
    fn a_two_gpu_job_holds_two_gpus_of_one_node_at_once() {
        let two = Job {
            gpus: 2,
            ..job(5120, 100.0)
        };
        // Two nodes of two GPUs: one job on each, both at once, each using both its GPUs.
        let r = simulate(
            &cluster(4, 1, vec![2, 2]),
            &vec![two.clone(); 2],
            Policy::Declared,
        );
        assert_eq!(
            (r.makespan_s, r.completed, r.max_jobs_on_a_gpu),
            (100.0, 2, 1)
        );
        assert!((r.memory_utilization - 0.5).abs() < 1e-9, "{r:?}");
        // Three GPUs on one node and one on another: only the first holds such a job.
        let r = simulate(
            &cluster(4, 1, vec![3, 1]),
            &vec![two.clone(); 2],
            Policy::Declared,
        );
        assert_eq!((r.makespan_s, r.completed), (200.0, 2), "{r:?}");
        // Four nodes of one GPU: four GPUs, none of them two on one node.
        let r = simulate(
            &cluster(4, 1, vec![1; 4]),
            std::slice::from_ref(&two),
            Policy::Declared,
        );
        assert_eq!((r.completed, r.failed), (0, 1), "{r:?}");
        // No node listed: one node of every GPU, as before nodes were.
        let r = simulate(&cluster(4, 1, vec![]), &vec![two; 2], Policy::Declared);
        assert_eq!(r.makespan_s, 100.0);
    }

    #[test]
    fn a_cpu_job_never_waits_for_a_gpu() {
        let cpu = Job {
            gpus: 0,
            ..job(0, 50.0)
        };
        let jobs = vec![job(8192, 100.0), job(8192, 100.0), cpu.clone()];
        let r = simulate(&cluster(1, 1, vec![]), &jobs, Policy::Declared);
        assert_eq!((r.makespan_s, r.completed), (200.0, 3));
        assert!((r.mean_completion_s - 350.0 / 3.0).abs() < 1e-9, "{r:?}");
        // A node with no GPU runs them too, a node's CPU slots at a time.
        let no_gpu = Cluster {
            nodes: vec![0],
            ..Cluster::one_node(vec![], vec![], vec![])
        };
        let n = CPU_SLOTS as usize + 1;
        let r = simulate(&no_gpu, &vec![cpu; n], Policy::Declared);
        assert_eq!((r.makespan_s, r.completed), (100.0, n as u32), "{r:?}");
        assert_eq!(r.lower_bound_s, 62.5, "five 50 s runs over four CPU slots");
    }

    #[test]
    fn an_exclusive_job_is_alone_on_its_gpu() {
        let alone = Job {
            alone: true,
            ..job(4096, 100.0)
        };
        // Plan 2 and memory for both, yet nothing joins it, in its pass nor at a later one
        // (its peak at 50 s places again).
        for jobs in [
            vec![alone.clone(), job(4096, 100.0)],
            vec![job(4096, 100.0), alone.clone()],
        ] {
            let r = simulate(&cluster(1, 2, vec![]), &jobs, Policy::Declared);
            assert_eq!((r.makespan_s, r.max_jobs_on_a_gpu), (200.0, 1), "{r:?}");
        }
        // Holding a whole GPU of 9 GiB budget for 100 s: two such jobs on one GPU take 200 s.
        let c = cluster(1, 2, vec![]);
        assert_eq!(reserved_bound(&c, &vec![alone; 2]), 200.0);
    }

    /// Fair share in the simulator: a user who submits 10 jobs a minute after another's 200
    /// waits about one job's length under fair share, most of the other's queue under FIFO;
    /// with shares 2:1 and equal queues, the share-2 user gets two thirds of the GPU time
    /// while both wait (their last job ends at about 3/4 of the makespan).
    #[test]
    fn fair_share_starts_a_later_user_s_jobs_and_shares_follow_their_weights() {
        let cluster = Cluster::one_node(vec![24 * 1024], vec![2], vec![0]);
        let jobs: Vec<Job> = (0..210).map(|_| job(2048, 10.0)).collect();
        let submissions: Vec<Submission> = (0..210)
            .map(|j| Submission {
                user: usize::from(j >= 200),
                at_s: if j >= 200 { 60.0 } else { 0.0 },
            })
            .collect();
        let fair = Order::FairShare {
            shares: vec![1, 1],
            half_life_s: 7.0 * 86_400.0,
        };
        let run = |order: &Order| {
            simulate_queue(&cluster, &jobs, Policy::Declared, &[], &submissions, order)
        };
        let (fifo, shared) = (run(&Order::Fifo), run(&fair));
        assert_eq!(shared.completed, 210);
        assert!(
            shared.mean_wait_by_user[1] <= 30.0,
            "{:?}",
            shared.mean_wait_by_user
        );
        assert!(
            fifo.mean_wait_by_user[1] >= 900.0,
            "{:?}",
            fifo.mean_wait_by_user
        );
        assert!(
            (shared.makespan_s - fifo.makespan_s).abs() < 1e-6,
            "no GPU time lost"
        );

        let equal: Vec<Submission> = (0..300)
            .map(|j| Submission {
                user: j % 2,
                at_s: 0.0,
            })
            .collect();
        let jobs: Vec<Job> = (0..300).map(|_| job(2048, 10.0)).collect();
        let weighted = Order::FairShare {
            shares: vec![2, 1],
            half_life_s: 7.0 * 86_400.0,
        };
        let r = simulate_queue(&cluster, &jobs, Policy::Declared, &[], &equal, &weighted);
        let share2_done = r.last_end_by_user[0] / r.makespan_s;
        assert!((share2_done - 0.75).abs() < 0.03, "{share2_done}");
    }
}
