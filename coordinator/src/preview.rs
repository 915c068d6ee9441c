//! A spec's schedule before it runs (`headroom submit --dry-run`): on the live nodes' GPUs
//! and plans, through the coordinator's own placement, how many of its jobs run at once,
//! which never fit and why, where the plan's slots promise sharing that the estimates do not
//! allow, and the makespan the simulator expects when durations are known. Pure, no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use headroom_shared::api::schedule::{EstimateFrom, GroupPreview, SchedulePreview};

use crate::placement::{Candidate, GpuState, Placer, Snapshot};
use crate::simulate::{self, Cluster, Job, Policy};

/// A job of the spec, in queue order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreviewJob {
    /// Its variant or experiment: what the preview sums by.
    pub group: String,
    /// GPUs on one node; 0: a CPU-only job.
    pub gpus: u32,
    /// Per GPU; `None`: it runs alone on each of its GPUs.
    pub estimate_mib: Option<u64>,
    pub estimate_from: EstimateFrom,
    /// It needs its GPUs to itself (`exclusive`, `cooldown`).
    pub alone: bool,
    /// Known from earlier runs of its memory key.
    pub duration_s: Option<f64>,
    /// The jobs (positions in the preview's list) it waits for (a study's `after`): it starts
    /// once they have ended.
    pub after: Vec<usize>,
}

/// One GPU of a live node, as its plan and headroom leave it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreviewGpu {
    pub total_mib: u64,
    pub headroom_mib: u64,
    /// Slots from the node's plan.
    pub slots: u32,
}

/// A live node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreviewNode {
    pub name: String,
    pub gpus: Vec<PreviewGpu>,
}

/// Most jobs whose makespan a dry run simulates.
pub const MAX_SIMULATED: usize = 5_000;

/// The preview of `jobs` (in queue order) on `nodes` with nothing running.
pub fn preview(nodes: &[PreviewNode], jobs: &[PreviewJob]) -> SchedulePreview {
    let snapshots = snapshots(nodes);
    let candidates: Vec<Candidate> = jobs.iter().map(candidate).collect();

    // A job fits if some node, empty, takes it; jobs of one shape share the answer.
    let mut fits_by_shape: BTreeMap<(u32, Option<u64>, bool), bool> = BTreeMap::new();
    let fits: Vec<bool> = candidates
        .iter()
        .map(|c| {
            *fits_by_shape
                .entry((c.gpus, c.estimate_mib, c.alone))
                .or_insert_with(|| {
                    snapshots.iter().any(|s| {
                        !Placer::new(s)
                            .place(std::slice::from_ref(c), 1)
                            .placements
                            .is_empty()
                    })
                })
        })
        .collect();

    // At once: of the jobs free to start (waiting for none), what placement takes.
    let free: Vec<usize> = (0..jobs.len())
        .filter(|&i| jobs[i].after.is_empty())
        .collect();
    let free_candidates: Vec<Candidate> = free.iter().map(|&i| candidates[i].clone()).collect();
    let mut running = vec![false; jobs.len()];
    for (c, _, _) in simulate::place_on_nodes(&snapshots, &free_candidates) {
        running[free[c]] = true;
    }

    let mut order: Vec<&str> = Vec::new();
    let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, j) in jobs.iter().enumerate() {
        let m = members.entry(j.group.as_str()).or_default();
        if m.is_empty() {
            order.push(j.group.as_str());
        }
        m.push(i);
    }
    let groups = order
        .iter()
        .map(|g| {
            let idx = members.get(g).map(Vec::as_slice).unwrap_or_default();
            group_preview(g, idx, jobs, nodes, &fits, &running)
        })
        .collect();

    let runnable: Vec<usize> = (0..jobs.len()).filter(|&i| fits[i]).collect();
    let unknown = runnable
        .iter()
        .filter(|&&i| known_duration(&jobs[i]).is_none())
        .count();
    // The simulator's cost grows with the square of the jobs (5,000: about 1.5 s of a core):
    // a dry run of more says so rather than hold a request for minutes.
    let too_many = runnable.len() > MAX_SIMULATED;
    let makespan_s = (unknown == 0 && !too_many).then(|| makespan(nodes, jobs, &runnable, &order));

    SchedulePreview {
        slots: nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .fold(0u32, |sum, g| sum.saturating_add(g.slots)),
        at_once: count(running.iter().filter(|r| **r).count()),
        never_fit: count(fits.iter().filter(|f| !**f).count()),
        groups,
        makespan_s,
        unknown_durations: count(unknown),
        too_many_to_simulate: too_many,
    }
}

/// Each node empty, as a claim would see it; GPUs numbered across the cluster, in order.
fn snapshots(nodes: &[PreviewNode]) -> Vec<Snapshot> {
    let mut index = 0u32;
    nodes
        .iter()
        .map(|n| Snapshot {
            host_free_mib: None,
            gpus: n
                .gpus
                .iter()
                .map(|g| {
                    index = index.saturating_add(1);
                    GpuState {
                        timed: Default::default(),
                        index: index - 1,
                        total_mib: g.total_mib,
                        slots: g.slots,
                        headroom_mib: g.headroom_mib,
                        // Nothing runs: the plan's memory, not a live reading.
                        live_free_mib: None,
                        placed: vec![],
                        quarantined: false,
                        held_alone: false,
                    }
                })
                .collect(),
            cpu_jobs: 0,
            reserve_after_ms: u64::MAX,
        })
        .collect()
}

fn candidate(j: &PreviewJob) -> Candidate {
    Candidate {
        host_mib: None,
        gpus: j.gpus,
        estimate_mib: j.estimate_mib,
        waited_ms: 0,
        alone: j.alone,
        phases: None,
    }
}

fn group_preview(
    group: &str,
    idx: &[usize],
    jobs: &[PreviewJob],
    nodes: &[PreviewNode],
    fits: &[bool],
    running: &[bool],
) -> GroupPreview {
    let mut never_fit_reasons: Vec<String> = Vec::new();
    for &i in idx.iter().filter(|&&i| !fits[i]) {
        let why = never_fit_reason(nodes, &jobs[i]);
        if !never_fit_reasons.contains(&why) {
            never_fit_reasons.push(why);
        }
    }
    let largest = idx
        .iter()
        .map(|&i| &jobs[i])
        .filter(|j| j.estimate_mib.is_some())
        .max_by_key(|j| j.estimate_mib);
    GroupPreview {
        group: group.to_string(),
        jobs: count(idx.len()),
        at_once: count(idx.iter().filter(|&&i| running[i]).count()),
        estimate_mib: largest.and_then(|j| j.estimate_mib),
        estimate_from: largest.map_or(EstimateFrom::None, |j| j.estimate_from),
        never_fit: count(idx.iter().filter(|&&i| !fits[i]).count()),
        never_fit_reasons,
        cannot_share: cannot_share(nodes, idx.iter().filter(|&&i| fits[i]).map(|&i| &jobs[i])),
        cpu_only: idx.iter().all(|&i| jobs[i].gpus == 0),
    }
}

/// Memory a GPU offers a job once empty, as placement reckons it (`None`: none, its
/// headroom is all of it or it has no plan slot).
fn usable(g: &PreviewGpu) -> Option<u64> {
    if g.slots == 0 {
        return None;
    }
    g.total_mib.checked_sub(g.headroom_mib)
}

/// Why no node, even empty, takes `job`, in words.
fn never_fit_reason(nodes: &[PreviewNode], job: &PreviewJob) -> String {
    let most_gpus = nodes.iter().map(|n| n.gpus.len()).max();
    let Some(most_gpus) = most_gpus else {
        return "no live node".to_string();
    };
    if job.gpus == 0 {
        return "no node has a CPU slot".to_string();
    }
    if job.gpus as usize > most_gpus {
        return format!(
            "asks {}, the largest node has {most_gpus}",
            gpus_word(job.gpus)
        );
    }
    let Some(largest) = nodes.iter().flat_map(|n| &n.gpus).filter_map(usable).max() else {
        return "no GPU has a plan slot and memory past its headroom".to_string();
    };
    let needs = match job.estimate_mib {
        Some(e) if job.gpus > 1 => format!("needs {} and {}", gib(e), gpus_word(job.gpus)),
        Some(e) => format!("needs {}", gib(e)),
        None => format!("needs {} to itself", gpus_word(job.gpus)),
    };
    let per_gpu = job.estimate_mib.unwrap_or(0);
    if per_gpu > largest {
        return format!(
            "{needs}; the largest GPU has {} usable after headroom",
            gib(largest)
        );
    }
    // Each GPU would do; no node has enough of them.
    let most = nodes
        .iter()
        .map(|n| {
            n.gpus
                .iter()
                .filter(|g| usable(g).is_some_and(|u| u >= per_gpu))
                .count()
        })
        .max()
        .unwrap_or(0);
    format!(
        "{needs}; no node has {} with a plan slot and that much usable after headroom (at most {most})",
        gpus_word(job.gpus)
    )
}

/// Where the plans allow more of these jobs on one GPU than can run there together, in
/// words; `None` when the slots and the estimates agree. Said of the group's smallest
/// estimate, so that it holds for any of its jobs.
fn cannot_share<'a>(
    nodes: &[PreviewNode],
    jobs: impl Iterator<Item = &'a PreviewJob>,
) -> Option<String> {
    let on_gpus: Vec<&PreviewJob> = jobs.filter(|j| j.gpus > 0).collect();
    let most_slots = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.slots)
        .max()
        .unwrap_or(0);
    if on_gpus.is_empty() || most_slots < 2 {
        return None;
    }
    if on_gpus.iter().any(|j| j.alone) {
        return Some(format!(
            "exclusive: each runs alone on its GPUs, though the plan allows up to {most_slots} on one"
        ));
    }
    if on_gpus.iter().any(|j| j.estimate_mib.is_none()) {
        return Some(format!(
            "no memory estimate yet: each runs alone on a GPU, though the plan allows up to {most_slots} on one"
        ));
    }
    let smallest = on_gpus.iter().filter_map(|j| j.estimate_mib).min()?;
    let mixed = on_gpus.iter().any(|j| j.estimate_mib != Some(smallest));
    // GPUs alike in slots, memory and how many fit, counted in cluster order.
    let mut kinds: Vec<((u32, u64, u64), u32)> = Vec::new();
    for g in nodes.iter().flat_map(|n| &n.gpus) {
        let Some(u) = usable(g) else { continue };
        if g.slots < 2 || u < smallest || smallest == 0 {
            continue;
        }
        let fit = (u / smallest).min(u64::from(g.slots));
        if fit >= u64::from(g.slots) {
            continue;
        }
        match kinds.iter_mut().find(|(k, _)| *k == (g.slots, u, fit)) {
            Some((_, n)) => *n += 1,
            None => kinds.push(((g.slots, u, fit), 1)),
        }
    }
    if kinds.is_empty() {
        return None;
    }
    let each = if mixed { "at least " } else { "" };
    let said: Vec<String> = kinds
        .iter()
        .map(|&((slots, u, fit), n)| {
            let k = fit + 1;
            let gpus = if n == 1 { "1 GPU".to_string() } else { format!("each of {n} GPUs") };
            let outcome = if fit == 1 {
                "no two share a GPU".to_string()
            } else {
                format!("at most {fit} share a GPU")
            };
            format!(
                "the plan allows {slots} on {gpus}, but {} of {each}{} need {each}{} and a GPU has {} usable after headroom: {outcome}",
                number_word(k),
                gib(smallest),
                gib(smallest.saturating_mul(k)),
                gib(u)
            )
        })
        .collect();
    Some(said.join("; "))
}

/// The simulator's makespan for the `runnable` of `jobs` (each with a known duration) on the
/// empty cluster, each holding its estimate for its whole run as declared, in one attempt,
/// each starting once those it waits for have ended (a need that never fits waits for none).
fn makespan(nodes: &[PreviewNode], all: &[PreviewJob], runnable: &[usize], groups: &[&str]) -> f64 {
    let at: BTreeMap<usize, usize> = runnable.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let after: Vec<Vec<usize>> = runnable
        .iter()
        .map(|&i| {
            all[i]
                .after
                .iter()
                .filter_map(|n| at.get(n).copied())
                .collect()
        })
        .collect();
    let jobs: Vec<&PreviewJob> = runnable.iter().map(|&i| &all[i]).collect();
    let gpus = nodes.iter().flat_map(|n| &n.gpus);
    let cluster = Cluster {
        gpus_mib: gpus.clone().map(|g| g.total_mib).collect(),
        plan: gpus.clone().map(|g| g.slots).collect(),
        headroom_mib: gpus.map(|g| g.headroom_mib).collect(),
        nodes: nodes.iter().map(|n| count(n.gpus.len())).collect(),
    };
    let sim: Vec<Job> = jobs
        .iter()
        .map(|j| {
            let use_mib = j.estimate_mib.unwrap_or(0);
            Job {
                kind: groups.iter().position(|g| *g == j.group).unwrap_or(0),
                steady_mib: use_mib,
                peak_mib: use_mib,
                peak_from: 0.0,
                peak_until: 1.0,
                duration_s: known_duration(j).unwrap_or(0.0),
                declared_mib: j.estimate_mib,
                gpus: j.gpus,
                alone: j.alone,
            }
        })
        .collect();
    simulate::simulate_after(&cluster, &sim, Policy::Declared, &after).makespan_s
}

/// A duration the simulator can run: finite and not negative.
fn known_duration(j: &PreviewJob) -> Option<f64> {
    j.duration_s.filter(|d| d.is_finite() && *d >= 0.0)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn gib(mib: u64) -> String {
    format!("{:.1} GiB", mib as f64 / 1024.0)
}

fn gpus_word(n: u32) -> String {
    if n == 1 {
        "1 GPU".to_string()
    } else {
        format!("{n} GPUs")
    }
}

fn number_word(n: u64) -> String {
    match n {
        2 => "two".to_string(),
        3 => "three".to_string(),
        4 => "four".to_string(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024;

    /// Seed 004's farm: 7 GPUs of 23.52 GiB, headroom 10 %, plan 2 each, on one node.
    fn farm() -> Vec<PreviewNode> {
        let total = 24_084;
        vec![PreviewNode {
            name: "farm".into(),
            gpus: vec![
                PreviewGpu {
                    total_mib: total,
                    headroom_mib: total / 10,
                    slots: 2,
                };
                7
            ],
        }]
    }

    fn job(group: &str, gpus: u32, estimate_mib: Option<u64>) -> PreviewJob {
        PreviewJob {
            group: group.into(),
            gpus,
            estimate_mib,
            estimate_from: if estimate_mib.is_some() {
                EstimateFrom::Learned
            } else {
                EstimateFrom::None
            },
            alone: false,
            duration_s: None,
            after: vec![],
        }
    }

    fn two_gpu_nodes(n: usize) -> Vec<PreviewNode> {
        (0..n)
            .map(|i| PreviewNode {
                name: format!("n{i}"),
                gpus: vec![
                    PreviewGpu {
                        total_mib: 24 * GIB,
                        headroom_mib: 2 * GIB,
                        slots: 2,
                    };
                    2
                ],
            })
            .collect()
    }

    #[test]
    fn the_lora_farm_has_fourteen_slots_and_runs_seven_at_once() {
        let jobs = vec![job("lora", 1, Some(15 * GIB)); 14];
        let p = preview(&farm(), &jobs);
        assert_eq!((p.slots, p.at_once, p.never_fit), (14, 7, 0));
        let g = &p.groups[0];
        assert_eq!((g.jobs, g.at_once, g.never_fit), (14, 7, 0));
        assert_eq!(
            (g.estimate_mib, g.estimate_from),
            (Some(15 * GIB), EstimateFrom::Learned)
        );
        let why = g.cannot_share.as_deref().unwrap_or_default();
        assert_eq!(
            why,
            "the plan allows 2 on each of 7 GPUs, but two of 15.0 GiB need 30.0 GiB and a GPU \
             has 21.2 GiB usable after headroom: no two share a GPU"
        );
        // 9 GiB between evaluations: two fit side by side, every slot runs.
        let p = preview(&farm(), &vec![job("lora", 1, Some(9 * GIB)); 14]);
        assert_eq!((p.slots, p.at_once), (14, 14));
        assert_eq!(p.groups[0].cannot_share, None);
    }

    #[test]
    fn a_job_larger_than_every_gpu_never_fits_and_says_the_sizes() {
        let jobs = vec![
            job("big", 1, Some(22 * GIB)),
            job("big", 1, Some(22 * GIB)),
            job("small", 1, Some(GIB)),
        ];
        let p = preview(&farm(), &jobs);
        assert_eq!((p.never_fit, p.at_once), (2, 1));
        let big = &p.groups[0];
        assert_eq!(
            (big.group.as_str(), big.never_fit, big.at_once),
            ("big", 2, 0)
        );
        assert_eq!(
            big.never_fit_reasons,
            vec!["needs 22.0 GiB; the largest GPU has 21.2 GiB usable after headroom"]
        );
        let two = PreviewJob {
            gpus: 2,
            ..job("wide", 1, Some(22 * GIB))
        };
        let p = preview(&farm(), &[two]);
        assert_eq!(
            p.groups[0].never_fit_reasons,
            vec!["needs 22.0 GiB and 2 GPUs; the largest GPU has 21.2 GiB usable after headroom"]
        );
    }

    #[test]
    fn a_job_asking_more_gpus_than_any_node_has_never_fits() {
        let p = preview(
            &two_gpu_nodes(3),
            &[job("wide", 4, Some(GIB)), job("pair", 2, Some(GIB))],
        );
        assert_eq!((p.never_fit, p.at_once), (1, 1));
        assert_eq!(
            p.groups[0].never_fit_reasons,
            vec!["asks 4 GPUs, the largest node has 2"]
        );
        // Six GPUs, but never two large enough on one node.
        let mut nodes = two_gpu_nodes(3);
        for n in &mut nodes {
            n.gpus[1].total_mib = 8 * GIB;
        }
        let p = preview(&nodes, &[job("pair", 2, Some(10 * GIB))]);
        assert_eq!(
            p.groups[0].never_fit_reasons,
            vec![
                "needs 10.0 GiB and 2 GPUs; no node has 2 GPUs with a plan slot and that much \
                 usable after headroom (at most 1)"
            ]
        );
        assert!(
            preview(&[], &[job("x", 0, None)]).groups[0].never_fit_reasons == vec!["no live node"]
        );
    }

    #[test]
    fn cpu_jobs_run_at_once_whatever_the_gpus_hold() {
        let mut jobs = vec![job("gpu", 1, Some(15 * GIB)); 14];
        jobs.extend(vec![job("cpu", 0, None); 3]);
        let p = preview(&farm(), &jobs);
        assert_eq!(p.at_once, 7 + 3);
        assert_eq!(
            (p.groups[1].at_once, p.groups[1].cannot_share.clone()),
            (3, None)
        );
        // A node with no GPU runs them too.
        let cpu_node = PreviewNode {
            name: "cpu".into(),
            gpus: vec![],
        };
        let p = preview(
            &[cpu_node],
            &[job("cpu", 0, None), job("gpu", 1, Some(GIB))],
        );
        assert_eq!((p.at_once, p.never_fit), (1, 1));
    }

    #[test]
    fn a_job_that_waits_starts_after_what_it_waits_for() {
        // 7 trainings of 100 s, each followed by its evaluation of 50 s: the evaluations are
        // not running at once at the start, and the makespan holds them after their training.
        let timed = |group: &str, s: f64| PreviewJob {
            duration_s: Some(s),
            ..job(group, 1, Some(15 * GIB))
        };
        let mut jobs: Vec<PreviewJob> = (0..7).map(|_| timed("train", 100.0)).collect();
        jobs.extend((0..7).map(|i| PreviewJob {
            after: vec![i],
            ..timed("eval", 50.0)
        }));
        let p = preview(&farm(), &jobs);
        assert_eq!(p.at_once, 7);
        assert_eq!((p.groups[0].at_once, p.groups[1].at_once), (7, 0));
        assert_eq!(p.makespan_s, Some(150.0));
        // One pair: waiting, the evaluation runs after the training (150 s); free, beside it.
        let pair = vec![
            timed("train", 100.0),
            PreviewJob {
                after: vec![0],
                ..timed("eval", 50.0)
            },
        ];
        assert_eq!(preview(&farm(), &pair).makespan_s, Some(150.0));
        let free: Vec<PreviewJob> = pair
            .into_iter()
            .map(|j| PreviewJob { after: vec![], ..j })
            .collect();
        assert_eq!(preview(&farm(), &free).makespan_s, Some(100.0));
    }

    #[test]
    fn past_the_simulated_bound_the_makespan_is_not_guessed() {
        let timed = PreviewJob {
            duration_s: Some(100.0),
            ..job("many", 1, Some(GIB))
        };
        let p = preview(&farm(), &vec![timed; MAX_SIMULATED + 1]);
        assert_eq!((p.makespan_s, p.too_many_to_simulate), (None, true));
        assert_eq!(p.at_once, 14);
    }

    #[test]
    fn the_makespan_is_known_when_every_duration_is() {
        let timed = PreviewJob {
            duration_s: Some(100.0),
            ..job("lora", 1, Some(15 * GIB))
        };
        let mut jobs = vec![timed; 14];
        let p = preview(&farm(), &jobs);
        assert_eq!((p.makespan_s, p.unknown_durations), (Some(200.0), 0));
        // One unknown: no makespan, and how many are unknown.
        jobs[3].duration_s = None;
        let p = preview(&farm(), &jobs);
        assert_eq!((p.makespan_s, p.unknown_durations), (None, 1));
        // A job that never fits does not hold the makespan back.
        jobs[3] = PreviewJob {
            duration_s: None,
            ..job("huge", 1, Some(40 * GIB))
        };
        let p = preview(&farm(), &jobs);
        assert_eq!((p.makespan_s, p.never_fit), (Some(200.0), 1));
    }

    #[test]
    fn jobs_without_an_estimate_or_exclusive_run_alone_and_say_so() {
        let p = preview(&farm(), &vec![job("new", 1, None); 14]);
        assert_eq!(p.at_once, 7);
        assert!(
            p.groups[0]
                .cannot_share
                .as_deref()
                .is_some_and(|s| s.starts_with("no memory estimate yet")),
            "{p:?}"
        );
        let exclusive = PreviewJob {
            alone: true,
            ..job("x", 1, Some(GIB))
        };
        let p = preview(&farm(), &vec![exclusive; 14]);
        assert_eq!(p.at_once, 7);
        assert!(
            p.groups[0]
                .cannot_share
                .as_deref()
                .is_some_and(|s| s.starts_with("exclusive"))
        );
        // The same input, the same preview; and it survives JSON.
        let again = preview(&farm(), &vec![job("new", 1, None); 14]);
        assert_eq!(again, preview(&farm(), &vec![job("new", 1, None); 14]));
        let json = serde_json::to_string(&again).unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<SchedulePreview>(&json).ok(),
            Some(again)
        );
    }
}
