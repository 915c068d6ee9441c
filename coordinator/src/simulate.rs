//! A discrete-event packing simulator over the coordinator's own placement
//! ([`crate::placement`], not a copy): jobs with a steady memory use, a peak
//! phase and a duration run on simulated GPUs under a policy. A GPU whose jobs' actual use
//! passes its memory OOMs the job whose use just rose (requeued, up to three attempts). It
//! reports makespan, mean completion time, memory utilization and OOMs, and the makespan's
//! ratio to a lower bound.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::placement::{self, Candidate, GpuState, Snapshot};

/// The most attempts a job gets; past them it is failed.
pub const MAX_ATTEMPTS: u32 = 3;
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
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::Exclusive,
        Policy::PlanOnly,
        Policy::Declared,
        Policy::Learned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exclusive => "exclusive",
            Policy::PlanOnly => "plan only (FIFO)",
            Policy::Declared => "headroom, declared",
            Policy::Learned => "headroom, learned",
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
    gpu: usize,
    estimate: Option<u64>,
    in_peak: bool,
}

/// Runs `jobs` (queued at time 0, in order) on `cluster` under `policy`.
pub fn simulate(cluster: &Cluster, jobs: &[Job], policy: Policy) -> Report {
    let n_gpus = cluster.gpus_mib.len();
    let mut queue: VecDeque<usize> = (0..jobs.len()).collect();
    let mut attempts = vec![0u32; jobs.len()];
    let mut learned: BTreeMap<usize, u64> = BTreeMap::new();
    let mut running: BTreeMap<u64, Running> = BTreeMap::new();
    let mut events = BinaryHeap::new();
    let (mut seq, mut next_run) = (0u64, 0u64);
    let mut used = vec![0u64; n_gpus];
    let mut now = 0.0f64;
    let mut report = Report::default();
    let mut completion_sum = 0.0;
    let mut used_integral = 0.0;
    let capacity: u64 = cluster.gpus_mib.iter().sum();

    let mut schedule = |events: &mut BinaryHeap<Event>, at: f64, run: u64, kind: Kind| {
        seq += 1;
        events.push(Event { at, seq, run, kind });
    };

    loop {
        // Place what fits now, through the coordinator's placement.
        let estimate_of = |j: usize, learned: &BTreeMap<usize, u64>| -> Option<u64> {
            match policy {
                Policy::Exclusive | Policy::PlanOnly => Some(0),
                Policy::Declared => jobs[j].declared_mib,
                Policy::Learned => learned.get(&jobs[j].kind).copied().or(jobs[j].declared_mib),
            }
        };
        let snapshot = Snapshot {
            gpus: (0..n_gpus)
                .map(|g| GpuState {
                    index: g as u32,
                    total_mib: cluster.gpus_mib[g],
                    slots: match policy {
                        Policy::Exclusive => 1,
                        _ => cluster.plan[g],
                    },
                    headroom_mib: match policy {
                        Policy::Declared | Policy::Learned => cluster.headroom_mib[g],
                        _ => 0,
                    },
                    live_free_mib: match policy {
                        Policy::Declared | Policy::Learned => {
                            Some(cluster.gpus_mib[g].saturating_sub(used[g]))
                        }
                        _ => None,
                    },
                    placed: running
                        .values()
                        .filter(|r| r.gpu == g)
                        .map(|r| r.estimate)
                        .collect(),
                    quarantined: false,
                    held_alone: false,
                })
                .collect(),
            cpu_jobs: 0,
            reserve_after_ms: u64::MAX,
        };
        let waiting: Vec<usize> = queue.iter().copied().take(WINDOW).collect();
        let candidates: Vec<Candidate> = waiting
            .iter()
            .map(|&j| Candidate {
                gpus: 1,
                estimate_mib: estimate_of(j, &learned),
                waited_ms: 0,
                alone: false,
            })
            .collect();
        let placed = placement::place(&snapshot, &candidates, candidates.len());
        let mut taken = vec![false; waiting.len()];
        let mut started_now = Vec::new();
        for p in &placed {
            let j = waiting[p.candidate];
            let gpu = p.gpus[0] as usize;
            taken[p.candidate] = true;
            attempts[j] += 1;
            next_run += 1;
            started_now.push(next_run);
            let job = &jobs[j];
            running.insert(
                next_run,
                Running {
                    job: j,
                    gpu,
                    estimate: candidates[p.candidate].estimate_mib,
                    in_peak: false,
                },
            );
            used[gpu] += job.steady_mib;
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
        let rest = queue.split_off(waiting.len());
        queue = waiting
            .iter()
            .zip(&taken)
            .filter(|(_, t)| !**t)
            .map(|(j, _)| *j)
            .chain(rest)
            .collect();
        // A start whose steady use does not fit OOMs at once (placement that ignores memory),
        // in the order they started, until the rest fit.
        for run in started_now {
            let gpu = running[&run].gpu;
            if used[gpu] <= cluster.gpus_mib[gpu] {
                continue;
            }
            let r = running.remove(&run).expect("running");
            let job = &jobs[r.job];
            used[gpu] -= job.steady_mib;
            report.ooms += 1;
            learn(&mut learned, job);
            if attempts[r.job] < MAX_ATTEMPTS {
                queue.push_back(r.job);
            } else {
                report.failed += 1;
                completion_sum += now;
            }
        }
        for g in 0..n_gpus {
            let on = running.values().filter(|r| r.gpu == g).count() as u32;
            report.max_jobs_on_a_gpu = report.max_jobs_on_a_gpu.max(on);
        }

        let Some(ev) = events.pop() else {
            break;
        };
        used_integral += used.iter().sum::<u64>() as f64 * (ev.at - now);
        now = ev.at;
        let Some(r) = running.get_mut(&ev.run) else {
            continue; // an OOM ended this run before
        };
        let job = &jobs[r.job];
        match ev.kind {
            Kind::PeakStarts => {
                r.in_peak = true;
                used[r.gpu] += job.peak_mib.saturating_sub(job.steady_mib);
                let gpu = r.gpu;
                if used[gpu] > cluster.gpus_mib[gpu] {
                    // The job whose use just rose asks for memory that is not there.
                    let r = running.remove(&ev.run).expect("running");
                    used[gpu] -= job.peak_mib;
                    report.ooms += 1;
                    learn(&mut learned, job);
                    if attempts[r.job] < MAX_ATTEMPTS {
                        queue.push_front(r.job);
                    } else {
                        report.failed += 1;
                        completion_sum += now;
                    }
                } else {
                    let frac = used[gpu] as f64 / cluster.gpus_mib[gpu] as f64;
                    report.max_used_fraction = report.max_used_fraction.max(frac);
                }
            }
            Kind::PeakEnds => {
                if r.in_peak {
                    r.in_peak = false;
                    used[r.gpu] -= job.peak_mib.saturating_sub(job.steady_mib);
                }
            }
            Kind::Ends => {
                let r = running.remove(&ev.run).expect("running");
                used[r.gpu] -= if r.in_peak {
                    job.peak_mib
                } else {
                    job.steady_mib
                };
                learn(&mut learned, job);
                completion_sum += now;
                report.completed += 1;
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
/// memory, or than their run time over the slots (one slot per GPU per job).
pub fn lower_bound(cluster: &Cluster, jobs: &[Job]) -> f64 {
    let longest = jobs.iter().map(|j| j.duration_s).fold(0.0, f64::max);
    let memory_time: f64 = jobs
        .iter()
        .map(|j| j.steady_mib as f64 * j.duration_s)
        .sum();
    let capacity: u64 = cluster.gpus_mib.iter().sum();
    let slots: u32 = cluster.plan.iter().sum();
    let run_time: f64 = jobs.iter().map(|j| j.duration_s).sum();
    longest
        .max(memory_time / capacity.max(1) as f64)
        .max(run_time / f64::from(slots.max(1)))
}

/// No schedule that holds each job's declared estimate for its whole run ends sooner than
/// the jobs' estimate-time over the GPUs' memory less headroom (placement never estimates a
/// GPU past that), nor than [`lower_bound`]. A job declaring nothing runs alone: it holds
/// a whole GPU, counted as the smallest one's. Like [`lower_bound`], it bounds schedules
/// that run every job (a report with jobs failed is not held to it).
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
        .map(|j| j.declared_mib.unwrap_or(smallest) as f64 * j.duration_s)
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
    for policy in Policy::ALL {
        let r = simulate(cluster, jobs, policy);
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
            policy.name(),
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
        }
    }

    #[test]
    fn four_small_jobs_share_two_gpus_where_exclusive_runs_them_in_two_rounds() {
        let cluster = Cluster {
            gpus_mib: vec![10_240; 2],
            plan: vec![2, 2],
            headroom_mib: vec![1024; 2],
        };
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
        assert_eq!(table.lines().count(), 2 + Policy::ALL.len(), "{table}");
        assert!(
            table.contains("| headroom, declared | 100 s | 1.00 | 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| exclusive | 200 s | 2.00 | - |"),
            "{table}"
        );
    }
}
