//! Useful work on the seeds' workloads: how much of the GPUs' memory-time becomes finished,
//! clean runs, for headroom (`headroom-coordinator` and an agent on fake GPUs; on the matrix
//! also given one study that declares each model's run length, queued longest first; on
//! both, one study that also declares each run's peak and memory phases), the seeds' own
//! way (task-spooler with a slot per plan entry, an OOMed run tried again after the seeds'
//! cleanup wait), one job per GPU (task-spooler with a slot per GPU), and the best schedule
//! found offline ([`crate::offline`]), in one run.
//!
//! Every job is `headroom-fake-job` holding its steady memory, growing to its peak for its
//! peak phase and back: a run that does not fit fails with CUDA's OOM text, as on a GPU. Each
//! run's start, end or OOM is recorded (a file per kind of job), and the figures come from
//! those records: the makespan from just before the first submission to the last end, the
//! runs that ended clean, the OOMs, the runs repeated.
//!
//! With `HEADROOM_BENCH_TRACE=DIR`, each headroom side's attempts are written to
//! `DIR/<workload>-<side>.jsonl` (`bench/scripts/useful-trace` sums them up per experiment):
//! which runs waited, and behind what.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use headroom_integration_tests::block_on;
use headroom_shared::ExperimentId;
use headroom_shared::api::SubmitRequest;

use super::{Report, Target, now_ns, shared_dir};
use crate::offline;
use crate::sim::{Cluster, Job};
use crate::system::{Node, NodeOptions};
use crate::tsp::TaskSpooler;
use crate::workloads;

/// The seeds' wait for a GPU's memory to come back before an OOMed run is tried again (seed
/// 000: `sleep 10` after the cleanup), scaled as the durations are.
const SEEDS_CLEANUP_WAIT_S: f64 = 10.0;
/// Tries of a run in the task-spooler sides, the first included.
const SEEDS_TRIES: u32 = 4;

/// One workload at the size it runs: its GPUs, its jobs (durations already scaled) and the
/// factor they were scaled by.
struct Workload {
    name: &'static str,
    cluster: Cluster,
    jobs: Vec<Job>,
    scale: f64,
}

fn scaled(mut jobs: Vec<Job>, scale: f64) -> Vec<Job> {
    for j in &mut jobs {
        j.duration_s *= scale;
    }
    jobs
}

fn workloads_at(tiny: bool) -> Result<Vec<Workload>> {
    let (mut matrix, mut mjobs) = workloads::seed_matrix()?;
    let (mut farm, mut fjobs) = workloads::lora_farm()?;
    let (mscale, fscale) = if tiny {
        // One run of each model on two GPUs; two GPUs of the farm with their four jobs.
        let mut seen = std::collections::BTreeSet::new();
        mjobs.retain(|j| seen.insert(j.kind));
        for c in [&mut matrix, &mut farm] {
            c.gpus_mib.truncate(2);
            c.plan.truncate(2);
            c.headroom_mib.truncate(2);
        }
        fjobs.truncate(4);
        (1.0 / 500.0, 1.5 / 3600.0)
    } else {
        // The matrix's runs take 2 to 38 s, the farm's 40 s (its evaluation peak 2 s: the
        // agent samples memory at least once a second).
        (1.0 / 20.0, 40.0 / 3600.0)
    };
    let all = vec![
        Workload {
            name: "seed matrix",
            cluster: matrix,
            jobs: scaled(mjobs, mscale),
            scale: mscale,
        },
        Workload {
            name: "LoRA farm",
            cluster: farm,
            jobs: scaled(fjobs, fscale),
            scale: fscale,
        },
    ];
    // `HEADROOM_BENCH_WORKLOADS=farm` (words of their names, comma-separated) runs those
    // only: a change's before and after in half the time.
    let Some(chosen) = std::env::var_os(WORKLOADS_VAR) else {
        return Ok(all);
    };
    let chosen = chosen.to_string_lossy().to_lowercase();
    let picked: Vec<Workload> = all
        .into_iter()
        .filter(|w| {
            chosen
                .split(',')
                .any(|word| !word.trim().is_empty() && w.name.to_lowercase().contains(word.trim()))
        })
        .collect();
    if picked.is_empty() {
        bail!("{WORKLOADS_VAR}={chosen}: names no workload (`matrix`, `farm`)");
    }
    Ok(picked)
}

const WORKLOADS_VAR: &str = "HEADROOM_BENCH_WORKLOADS";

/// The fake GPUs as the agent and the fake job read them: `10240MiB,10240MiB`.
fn gpu_spec(c: &Cluster) -> String {
    c.gpus_mib
        .iter()
        .map(|m| format!("{m}MiB"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The kinds of jobs in the order they first appear: the first job of each (a kind's runs are
/// alike), with how many runs of it there are.
fn kinds(jobs: &[Job]) -> Vec<(&Job, usize)> {
    let mut out: Vec<(&Job, usize)> = Vec::new();
    for j in jobs {
        match out.iter_mut().find(|(k, _)| k.kind == j.kind) {
            Some(e) => e.1 += 1,
            None => out.push((j, 1)),
        }
    }
    out
}

/// `headroom-fake-job`'s arguments for one run of `j`, recording to `record`.
fn job_argv(j: &Job, record: &Path) -> Vec<String> {
    let d = j.duration_s;
    let mut a = vec![
        headroom_integration_tests::fake_job().display().to_string(),
        "--mem".into(),
        format!("{}MiB", j.steady_mib),
        "--seconds".into(),
        format!("{d:.3}"),
        "--record".into(),
        record.display().to_string(),
    ];
    let more = j.peak_mib.saturating_sub(j.steady_mib);
    if more > 0 && j.peak_from < 1.0 {
        a.extend([
            "--grow".into(),
            format!("{more}MiB"),
            "--grow-after".into(),
            format!("{:.3}", j.peak_from * d),
        ]);
        if j.peak_until < 1.0 {
            a.extend([
                "--grow-for".into(),
                format!("{:.3}", (j.peak_until - j.peak_from) * d),
            ]);
        }
    }
    a
}

/// What one side did with a workload, from its runs' records.
#[derive(Debug, Default)]
struct Outcome {
    makespan_s: f64,
    /// Runs that ended clean, and the memory-time (MiB x s) they did.
    clean: usize,
    clean_work: f64,
    ooms: usize,
    /// Runs beyond one per job (an OOMed run tried again).
    repeated: usize,
    /// Each job that did not succeed, with its attempts (headroom's side).
    unfinished: Vec<String>,
}

impl Outcome {
    /// The clean runs' memory-time over every GPU's memory for the makespan.
    fn useful(&self, c: &Cluster) -> f64 {
        let memory: f64 = c.gpus_mib.iter().map(|m| *m as f64).sum();
        self.clean_work / (memory * self.makespan_s)
    }

    /// Clean memory-time per second.
    fn rate(&self) -> f64 {
        self.clean_work / self.makespan_s
    }
}

/// Reads the records in `dir` (`kind-K.jsonl`) of runs started at `t0_ms`.
fn outcome(dir: &Path, w: &Workload, t0_ms: f64) -> Result<Outcome> {
    let mut o = Outcome::default();
    let mut last = t0_ms;
    for (job, _) in kinds(&w.jobs) {
        let path = record_path(dir, job.kind);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        for line in text.lines() {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("a record: {line}"))?;
            let t = v["t_ms"].as_f64().context("a record without t_ms")?;
            match v["event"].as_str() {
                Some("end") => {
                    o.clean += 1;
                    o.clean_work += offline::work(job);
                    last = last.max(t);
                }
                Some("oom") => {
                    o.ooms += 1;
                    last = last.max(t);
                }
                _ => {}
            }
        }
    }
    o.repeated = (o.clean + o.ooms).saturating_sub(w.jobs.len());
    o.makespan_s = (last - t0_ms) / 1000.0;
    Ok(o)
}

fn record_path(dir: &Path, kind: usize) -> PathBuf {
    dir.join(format!("kind-{kind}.jsonl"))
}

fn now_ms() -> f64 {
    now_ns() as f64 / 1e6
}

/// How long a side may take: ten times the best schedule, and a minute to start.
fn deadline(best_s: f64) -> Duration {
    Duration::from_secs_f64(best_s * 10.0 + 60.0)
}

/// How headroom is given a workload.
#[derive(Clone, Copy, PartialEq)]
enum Submitted {
    /// One experiment per kind of job, in the workload's order.
    Experiments,
    /// One study of a variant per kind, in the workload's order, each declaring how long its
    /// runs take (`expected_duration`, as the seeds knew each model's epoch): queued longest
    /// first.
    StudyWithLengths,
    /// The same study, each kind also declaring its peak and where in its run the peak falls
    /// (`resources.memory_phases`, as the seeds knew their evaluation's): runs whose peaks
    /// fall apart share a GPU.
    StudyWithPhases,
}

impl Submitted {
    fn name(self) -> &'static str {
        match self {
            Self::Experiments => "experiments",
            Self::StudyWithLengths => "lengths",
            Self::StudyWithPhases => "phases",
        }
    }
}

/// headroom: each kind of job's runs declaring their peak where the workload declares one
/// (the matrix) and nothing where it does not (the farm: headroom learns); an OOMed run gets
/// as many tries as the seeds' way gives it (headroom retries only `lost` by default). With
/// `taught`, the same submission runs once before, untimed, on the same node: what its runs
/// taught (peaks, lengths, where each run's peak fell) is what a lab's second sweep starts
/// from.
fn headroom_side(w: &Workload, best_s: f64, how: Submitted, taught: bool) -> Result<Outcome> {
    let plan = w
        .cluster
        .plan
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let node = Node::start(&NodeOptions {
        database_url: None,
        gpus: &gpu_spec(&w.cluster),
        plan: &plan,
    })?;
    if taught {
        let first = shared_dir("hr-useful")?;
        let exps = submit_side(&node, w, how, first.path())?;
        wait_side(&node, w, &exps, best_s)?;
    }
    let records = shared_dir("hr-useful")?;
    let t0 = now_ms();
    let exps = submit_side(&node, w, how, records.path())?;
    wait_side(&node, w, &exps, best_s)?;
    let mut o = outcome(records.path(), w, t0)?;
    if let Some(dir) = std::env::var_os(TRACE_VAR) {
        let side = format!(
            "{}-{}{}",
            w.name,
            how.name(),
            if taught { "-again" } else { "" }
        );
        trace(
            &node,
            &exps,
            t0,
            &Path::new(&dir).join(format!("{}.jsonl", side.replace(' ', "-"))),
        )?;
    }
    for exp in exps {
        for j in block_on(node.api.jobs(Some(exp), None))?? {
            if j.state == headroom_shared::JobState::Succeeded {
                continue;
            }
            let d = block_on(node.api.job(j.id))??;
            let attempts = d
                .attempts_detail
                .iter()
                .map(|a| {
                    format!(
                        "{}: {:?} {:?}, estimate {:?} ({}), peak {:?}",
                        a.number,
                        a.failure_class,
                        a.oom_cause,
                        a.estimate_mib,
                        a.estimate_source,
                        a.peak_mem_mib
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            o.unfinished
                .push(format!("{} {:?}: {attempts}", j.id, j.state));
        }
    }
    Ok(o)
}

/// Where each headroom side's attempts are written, when set: a folder.
const TRACE_VAR: &str = "HEADROOM_BENCH_TRACE";

/// Writes each attempt of `exps` as a JSON line to `path`: its job, GPUs, lease, start and end
/// (ms from `t0_ms`), the estimate it was placed by and where that came from, its peak and the
/// shape it told: where a side's time went.
fn trace(node: &Node, exps: &[ExperimentId], t0_ms: f64, path: &Path) -> Result<()> {
    let ms = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis() as f64 - t0_ms;
    let mut lines = String::new();
    for &exp in exps {
        for j in block_on(node.api.jobs(Some(exp), None))?? {
            for a in block_on(node.api.job(j.id))??.attempts_detail {
                let line = serde_json::json!({
                    "experiment": exp, "job": j.id, "attempt": a.number, "gpus": a.gpus,
                    "leased_ms": ms(a.leased_at), "started_ms": a.started_at.map(ms),
                    "ended_ms": a.ended_at.map(ms), "estimate_mib": a.estimate_mib,
                    "estimate_source": a.estimate_source, "peak_mib": a.peak_mem_mib,
                    "memory_profile": a.measurements.memory_profile,
                });
                lines.push_str(&format!("{line}\n"));
            }
        }
    }
    std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))
}

/// Submits `w` to `node` as `how` says, each run recording into `records`; the experiments
/// stored.
fn submit_side(
    node: &Node,
    w: &Workload,
    how: Submitted,
    records: &Path,
) -> Result<Vec<ExperimentId>> {
    let specs: Vec<serde_json::Value> = kinds(&w.jobs)
        .into_iter()
        .map(|(j, runs)| {
            let kind = j.kind;
            let mut resources = serde_json::json!({"gpus": 1});
            if let Some(m) = j.declared_mib {
                resources["memory"] = format!("{m}MiB").into();
            }
            if how == Submitted::StudyWithPhases {
                resources["memory"] = format!("{}MiB", j.peak_mib).into();
                resources["memory_phases"] = serde_json::json!({
                    "steady": format!("{}MiB", j.steady_mib),
                    "peak": [j.peak_from, j.peak_until],
                });
            }
            let mut spec = serde_json::json!({
                "name": format!("{}-{kind}", w.name.replace(' ', "-")),
                "command": job_argv(j, &record_path(records, kind)),
                "runs_per_config": runs,
                "resources": resources,
                "retry": {"max_attempts": SEEDS_TRIES, "on": ["oom", "lost"]},
            });
            if how != Submitted::Experiments {
                spec["expected_duration"] = j.duration_s.into();
            }
            spec
        })
        .collect();
    let requests = match how {
        Submitted::Experiments => specs,
        Submitted::StudyWithLengths | Submitted::StudyWithPhases => vec![serde_json::json!({
            "name": w.name.replace(' ', "-"),
            "experiments": specs,
        })],
    };
    let mut exps: Vec<ExperimentId> = Vec::new();
    for spec in requests {
        let req = SubmitRequest {
            spec,
            seed: None,
            dry_run: false,
            ..Default::default()
        };
        let r = block_on(node.api.submit(&req))?.context("submit refused")?;
        exps.extend(r.experiment);
        exps.extend(r.variants.iter().filter_map(|v| v.experiment));
    }
    if exps.is_empty() {
        bail!("{}: nothing was stored", w.name);
    }
    Ok(exps)
}

/// Waits until every job of `exps` ended, or fails past the side's deadline.
fn wait_side(node: &Node, w: &Workload, exps: &[ExperimentId], best_s: f64) -> Result<()> {
    let until = Instant::now() + deadline(best_s);
    for &exp in exps {
        loop {
            let p = block_on(
                node.api
                    .progress_within(Some(exp), None, Duration::from_secs(2)),
            )??;
            if p.counts.finished() == p.counts.total() {
                break;
            }
            if Instant::now() > until {
                bail!(
                    "{}: {} of {} jobs ended in time",
                    w.name,
                    p.counts.finished(),
                    p.counts.total()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The wrapper each task-spooler job runs: it takes a free slot (a lock file bound to a GPU),
/// runs the job on that GPU, and after a failure waits the cleanup time and tries again, as
/// the seeds' runner did. Arguments: the lock folder, tries, the wait, the slots
/// (`GPU.SLOT ...`), then the job.
const SLOT_SCRIPT: &str = r#"dir=$1 tries=$2 wait=$3 slots=$4; shift 4
n=0
while :; do
  n=$((n+1))
  while :; do
    for s in $slots; do
      CUDA_VISIBLE_DEVICES=${s%%.*} flock -n -E 75 "$dir/slot-$s" "$@"
      rc=$?
      [ $rc -eq 75 ] || break 2
    done
    sleep 0.01
  done
  [ $rc -eq 0 ] && exit 0
  [ $n -ge $tries ] && exit $rc
  sleep $wait
done"#;

/// task-spooler with `slots[g]` slots bound to GPU g (filled one per GPU first).
fn task_spooler(w: &Workload, slots: &[u32], best_s: f64) -> Result<Outcome> {
    let total: u32 = slots.iter().sum();
    let tsp = TaskSpooler::start(total as usize)?;
    let locks = tempfile::Builder::new()
        .prefix("hr-useful-slots")
        .tempdir()?;
    let fake = shared_dir("hr-useful-gpus")?;
    let records = shared_dir("hr-useful")?;
    let most = slots.iter().copied().max().unwrap_or(0);
    let slot_list = (0..most)
        .flat_map(|s| {
            slots
                .iter()
                .enumerate()
                .filter(move |(_, n)| s < **n)
                .map(move |(g, _)| format!("{g}.{s}"))
        })
        .collect::<Vec<_>>()
        .join(" ");
    let wait = format!("{:.3}", SEEDS_CLEANUP_WAIT_S * w.scale);
    let tries = SEEDS_TRIES.to_string();
    let (dir, spec) = (
        format!("HEADROOM_FAKE_GPU_DIR={}", fake.path().display()),
        format!("HEADROOM_FAKE_GPUS={}", gpu_spec(&w.cluster)),
    );
    let lock_dir = locks.path().display().to_string();
    let t0 = now_ms();
    for j in &w.jobs {
        let job = job_argv(j, &record_path(records.path(), j.kind));
        let mut argv: Vec<&str> = vec![
            "sh",
            "-c",
            SLOT_SCRIPT,
            "sh",
            &lock_dir,
            &tries,
            &wait,
            &slot_list,
            "env",
            &dir,
            &spec,
        ];
        argv.extend(job.iter().map(String::as_str));
        tsp.submit(&argv)?;
    }
    tsp.wait_finished(w.jobs.len(), deadline(best_s))?;
    outcome(records.path(), w, t0)
}

struct Sides {
    best: offline::Schedule,
    bound_s: f64,
    headroom: Outcome,
    /// headroom given one study that declares each kind's length, where the workload has
    /// kinds of more than one length (the matrix).
    with_lengths: Option<Outcome>,
    /// headroom given one study that declares each kind's length, peak and memory phases.
    with_phases: Outcome,
    /// headroom given its best submission without phases a second time, on the node the
    /// first ran on: placed by what the first taught (where each kind's peak falls).
    taught: Outcome,
    seeds: Outcome,
    per_gpu: Outcome,
}

fn run_workload(w: &Workload) -> Result<Sides> {
    let best = offline::best(&w.cluster, &w.jobs, 64, 1)
        .with_context(|| format!("{}: a job fits no GPU", w.name))?;
    let bound_s = offline::lower_bound(&w.cluster, &w.jobs);
    let headroom = headroom_side(w, best.makespan_s, Submitted::Experiments, false)?;
    let lengths: std::collections::BTreeSet<u64> =
        w.jobs.iter().map(|j| j.duration_s.to_bits()).collect();
    let with_lengths = (lengths.len() > 1)
        .then(|| headroom_side(w, best.makespan_s, Submitted::StudyWithLengths, false))
        .transpose()?;
    let with_phases = headroom_side(w, best.makespan_s, Submitted::StudyWithPhases, false)?;
    // Its best way without phases declared, submitted a second time.
    let again = match with_lengths {
        Some(_) => Submitted::StudyWithLengths,
        None => Submitted::Experiments,
    };
    let taught = headroom_side(w, best.makespan_s, again, true)?;
    let seeds = task_spooler(w, &w.cluster.plan, best.makespan_s)?;
    let per_gpu = task_spooler(w, &vec![1; w.cluster.plan.len()], best.makespan_s)?;
    Ok(Sides {
        best,
        bound_s,
        headroom,
        with_lengths,
        with_phases,
        taught,
        seeds,
        per_gpu,
    })
}

pub fn run(tiny: bool) -> Result<Report> {
    let mut table = String::from(
        "| workload | side | makespan | vs best offline | clean runs | memory-time used by clean runs | OOMs | runs repeated |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let mut figures = BTreeMap::new();
    let mut targets = Vec::new();
    for w in workloads_at(tiny)? {
        let s = run_workload(&w)?;
        let best = s.best.makespan_s;
        let row = |side: &str, o: &Outcome| {
            format!(
                "| {} | {side} | {:.1} s | {:.2}x | {} of {} | {:.1} % | {} | {} |\n",
                w.name,
                o.makespan_s,
                o.makespan_s / best,
                o.clean,
                w.jobs.len(),
                100.0 * o.useful(&w.cluster),
                o.ooms,
                o.repeated
            )
        };
        table.push_str(&row("headroom", &s.headroom));
        if let Some(o) = &s.with_lengths {
            table.push_str(&row(
                "headroom, one study declaring each model's run length (queued longest first)",
                o,
            ));
        }
        table.push_str(&row(
            "headroom, one study declaring each model's run length, peak and memory phases",
            &s.with_phases,
        ));
        table.push_str(&row(
            "headroom, its best way without phases submitted again (phases learned from the first)",
            &s.taught,
        ));
        for u in s
            .headroom
            .unfinished
            .iter()
            .chain(s.with_lengths.iter().flat_map(|o| &o.unfinished))
            .chain(&s.with_phases.unfinished)
            .chain(&s.taught.unfinished)
        {
            eprintln!("useful: {}: headroom's job {u}", w.name);
        }
        table.push_str(&row(
            "task-spooler, a slot per plan entry, OOMs retried",
            &s.seeds,
        ));
        table.push_str(&row("task-spooler, one job per GPU", &s.per_gpu));
        let full: f64 = w.jobs.iter().map(offline::work).sum();
        let memory: f64 = w.cluster.gpus_mib.iter().map(|m| *m as f64).sum();
        table.push_str(&format!(
            "| {} | best schedule found offline (lower bound {:.1} s) | {best:.1} s | 1.00x | {n} of {n} | {:.1} % | 0 | 0 |\n",
            w.name,
            s.bound_s,
            100.0 * full / (memory * best),
            n = w.jobs.len(),
        ));
        let side = |o: &Outcome| {
            serde_json::json!({
                "makespan_s": o.makespan_s, "vs_best": o.makespan_s / best,
                "clean_runs": o.clean, "useful_fraction": o.useful(&w.cluster),
                "ooms": o.ooms, "runs_repeated": o.repeated, "unfinished": o.unfinished,
            })
        };
        let key = w.name.replace(' ', "_");
        figures.insert(
            key.clone(),
            serde_json::json!({
                "jobs": w.jobs.len(), "gpus": w.cluster.gpus_mib.len(),
                "plan": w.cluster.plan, "duration_scale": w.scale,
                "best_offline_s": best, "lower_bound_s": s.bound_s,
                "headroom": side(&s.headroom),
                "headroom_lengths_declared": s.with_lengths.as_ref().map(side),
                "headroom_phases_declared": side(&s.with_phases),
                "headroom_phases_learned": side(&s.taught),
                "seeds_way": side(&s.seeds),
                "one_per_gpu": side(&s.per_gpu),
            }),
        );
        let sides = std::iter::once(("", &s.headroom))
            .chain(s.with_lengths.as_ref().map(|o| (", lengths declared", o)))
            .chain(std::iter::once((", phases declared", &s.with_phases)))
            .chain(std::iter::once((", submitted again", &s.taught)));
        for (how, o) in sides {
            let name = format!("{}{how}", w.name);
            targets.push(Target::new(
                &format!("{name}: no OOM"),
                format!("{} OOMs", o.ooms),
                o.ooms == 0,
            ));
            targets.push(Target::new(
                &format!("{name}: makespan within 1.05x the best offline schedule"),
                format!(
                    "{:.2}x ({:.1} s against {best:.1} s)",
                    o.makespan_s / best,
                    o.makespan_s
                ),
                o.makespan_s <= 1.05 * best,
            ));
            if w.name == "seed matrix" {
                let r = o.rate() / s.seeds.rate();
                targets.push(Target::new(
                    &format!("{name}: at least 1.3x the seeds' way's clean work per second"),
                    format!("{r:.2}x"),
                    r >= 1.3,
                ));
            }
        }
    }
    Ok(Report::new(
        "useful",
        serde_json::to_value(figures)?,
        targets,
        table,
    ))
}
