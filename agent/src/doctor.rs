//! `headroom doctor`: checks what headroom relies on of a node (its driver, NVML's readings,
//! process listing and pid mapping, cgroups, a real allocation and its release) and says,
//! for each, what it means for headroom. Blocking throughout: run it off the runtime.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_shared::api::{GpuSample, TelemetrySample};
use serde::Serialize;

use crate::gpu::{self, BackendChoice, GpuBackend, fake};
use crate::supervisor::attempt::Baseline;

/// Memory the allocation check asks for on each GPU.
const ALLOCATE_MIB: u64 = 512;
/// How long the allocation check waits for the driver to show, then to release, it.
const ALLOCATION_WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// Not supported here, or not checked: headroom falls back (the meaning says how).
    Unavailable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Unavailable => "unavailable",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What it means for headroom.
    pub meaning: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// No check failed.
    pub ok: bool,
    pub backend: String,
    pub checks: Vec<Check>,
}

/// What the checks may do besides reading.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Skip the allocation check (it starts a process on every GPU).
    pub no_allocate: bool,
    /// The Python to look for PyTorch with (default `python3`).
    pub python: Option<String>,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>, meaning: &str) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        meaning: meaning.to_string(),
    }
}

/// Runs every check on the backend `choice` opens. Blocking.
pub fn run(choice: &BackendChoice, opts: &Options) -> Report {
    let mut checks = Vec::new();
    let backend = match gpu::open(choice) {
        Ok(b) => b,
        Err(e) => {
            checks.push(check(
                "backend",
                Status::Fail,
                e.to_string(),
                "the agent cannot start on this node: no GPU can be scheduled",
            ));
            checks.push(cgroups());
            return report("none".into(), checks);
        }
    };
    // Asked to check a node and no driver was found: fake GPUs stand in, and every check
    // of them would pass. That node runs no GPU job, which is what the doctor must say.
    let fell_back = matches!(choice, BackendChoice::Auto { .. }) && backend.kind() == "fake";
    checks.push(if fell_back {
        check(
            "backend",
            Status::Fail,
            backend.describe(),
            "no NVIDIA driver was found, so fake GPUs stand in: this node cannot run GPU \
             jobs. Install the driver, or check the simulator itself with --gpu-backend fake",
        )
    } else {
        check(
            "backend",
            Status::Pass,
            backend.describe(),
            "the agent opens these GPUs",
        )
    });
    checks.extend(on_gpus(backend.as_ref(), opts));
    checks.push(cgroups());
    report(backend.describe(), checks)
}

fn report(backend: String, checks: Vec<Check>) -> Report {
    Report {
        ok: checks.iter().all(|c| c.status != Status::Fail),
        backend,
        checks,
    }
}

/// The checks without which a node must not take work: its GPUs' memory and processes read,
/// and their pids map to this process's (else no attempt's cleanup can be verified).
const REQUIRED: &[&str] = &["memory", "processes", "pid_namespace"];

/// The agent's start check (`--require-doctor`): the doctor's checks of the opened backend,
/// without the allocation. `Err` names each required check that failed, with what it means;
/// other failures are only warned about. Blocking.
pub fn gate(backend: &dyn GpuBackend) -> Result<(), String> {
    let opts = Options {
        no_allocate: true,
        python: None,
    };
    let mut refused = Vec::new();
    for c in on_gpus(backend, &opts)
        .into_iter()
        .filter(|c| c.status == Status::Fail)
    {
        if REQUIRED.contains(&c.name) {
            refused.push(format!("{}: {} ({})", c.name, c.detail, c.meaning));
        } else {
            tracing::warn!(
                "headroom doctor: {} failed: {} ({})",
                c.name,
                c.detail,
                c.meaning
            );
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "headroom doctor: this node must not take work: {}",
            refused.join("; ")
        ))
    }
}

/// The checks of an opened backend.
pub fn on_gpus(backend: &dyn GpuBackend, opts: &Options) -> Vec<Check> {
    let mut checks = Vec::new();
    let samples = gpu::read(backend);
    let facts = backend.facts();
    checks.push(match (&facts.driver_version, &facts.nvml_version) {
        (Ok(d), Ok(n)) => check(
            "driver",
            Status::Pass,
            format!("driver {d}, NVML {n}"),
            "recorded with the node's GPUs",
        ),
        (d, n) => check(
            "driver",
            Status::Unavailable,
            format!(
                "driver {}, NVML {}",
                d.as_deref().unwrap_or_else(|e| e),
                n.as_deref().unwrap_or_else(|e| e)
            ),
            "versions unknown; readings are checked below",
        ),
    });
    checks.push(memory(&samples));
    checks.push(processes(&samples, facts.process_api.as_deref()));
    checks.push(match &facts.pid_namespace {
        Ok(how) => check(
            "pid_namespace",
            Status::Pass,
            how.clone(),
            "GPU processes are attributed to their attempts, and leftovers can be killed",
        ),
        Err(why) => check(
            "pid_namespace",
            Status::Fail,
            why.clone(),
            "GPU processes cannot be told apart: no cleanup is verified, GPUs are quarantined",
        ),
    });
    checks.extend(telemetry(backend));
    checks.push(per_gpu(
        "persistence",
        facts.gpus.iter().map(|g| (g.index, g.persistence.clone())),
        |on| on,
        "on",
        "off",
        "NVML opens in milliseconds; off, each attempt supervisor's start takes seconds \
         (enable it: `nvidia-smi -pm 1` or nvidia-persistenced)",
    ));
    checks.push(per_gpu(
        "mig",
        facts.gpus.iter().map(|g| (g.index, g.mig.clone())),
        |on| !on,
        "disabled",
        "enabled",
        "whole GPUs are scheduled; MIG instances are not (and their processes' memory \
         cannot be sized)",
    ));
    checks.push(match backend.memory_caps() {
        Ok(how) => check(
            "memory_cap",
            Status::Pass,
            how,
            "each attempt is held to its estimate and a slack: one that grows past it runs \
             out of memory alone (`cap_hit`), not its neighbour on the GPU",
        ),
        Err(why) => check(
            "memory_cap",
            Status::Unavailable,
            why,
            "no hard limit per attempt: a job that grows past its estimate may leave a \
             neighbour on its GPU out of memory",
        ),
    });
    let unseeable = checks
        .iter()
        .any(|c| c.status == Status::Fail && matches!(c.name, "processes" | "pid_namespace"));
    checks.push(if opts.no_allocate {
        check(
            "allocation",
            Status::Unavailable,
            "skipped (--no-allocate)",
            "not checked",
        )
    } else if unseeable {
        check(
            "allocation",
            Status::Unavailable,
            "skipped: processes cannot be listed or attributed here (above)",
            "not checked until the failures above are mended",
        )
    } else {
        allocation(backend, opts)
    });
    checks
}

/// The GPUs whose reading failed (in part), with why: their memory and process list are
/// not to be trusted.
fn unreadable(samples: &[GpuSample]) -> Vec<String> {
    samples
        .iter()
        .filter_map(|s| Some(format!("GPU {}: {}", s.index, s.error.as_deref()?)))
        .collect()
}

fn memory(samples: &[GpuSample]) -> Check {
    let failed = unreadable(samples);
    if failed.is_empty() {
        let each: Vec<String> = samples
            .iter()
            .map(|s| {
                let ghost = s
                    .unattributed_mib()
                    .map_or("unknown".to_string(), |u| format!("{u} MiB"));
                format!(
                    "GPU {}: {} MiB used, {} MiB free, unattributed {ghost}",
                    s.index, s.used_mib, s.free_mib
                )
            })
            .collect();
        check(
            "memory",
            Status::Pass,
            each.join("; "),
            "admission reads live free memory; unattributed (ghost) memory is shown and \
             flagged",
        )
    } else {
        check(
            "memory",
            Status::Fail,
            failed.join("; "),
            "these GPUs are unreadable: nothing is placed on them",
        )
    }
}

fn processes(samples: &[GpuSample], api: Option<&str>) -> Check {
    let failed = unreadable(samples);
    if !failed.is_empty() {
        return check(
            "processes",
            Status::Fail,
            failed.join("; "),
            "processes on these GPUs cannot be listed: attempts there are never verified \
             clean and the GPUs are quarantined",
        );
    }
    let unsized_: Vec<u32> = samples
        .iter()
        .filter(|s| s.processes.iter().any(|p| p.used_mib_unknown))
        .map(|s| s.index)
        .collect();
    let listed: usize = samples.iter().map(|s| s.processes.len()).sum();
    let api = api.unwrap_or("the driver's process list");
    if unsized_.is_empty() {
        check(
            "processes",
            Status::Pass,
            format!("{listed} process(es) listed with {api}, each with its memory"),
            "peaks are per process; leftovers and foreign processes are seen",
        )
    } else {
        check(
            "processes",
            Status::Unavailable,
            format!(
                "listed with {api}; the driver cannot size processes' memory on GPUs {unsized_:?}"
            ),
            "peaks there are device deltas, and ghost memory cannot be told",
        )
    }
}

/// Energy counter, power, temperature, clocks and throttle reasons: two readings apart.
fn telemetry(backend: &dyn GpuBackend) -> Vec<Check> {
    let first = backend.telemetry();
    std::thread::sleep(Duration::from_millis(300));
    let second = backend.telemetry();
    let (first, second) = match (first, second) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return vec![check(
                "telemetry",
                Status::Fail,
                e.to_string(),
                "no energy, power or throttle figures: no attempt is clean",
            )];
        }
    };
    let of = |s: &[TelemetrySample], gpu: u32| s.iter().find(|t| t.gpu == gpu).cloned();
    let gpus: Vec<u32> = second.iter().map(|t| t.gpu).collect();
    let mut energy = Vec::new();
    let mut energy_failed = Vec::new();
    for &g in &gpus {
        let (a, b) = (of(&first, g), of(&second, g));
        let why = a
            .as_ref()
            .and_then(|s| s.error.clone())
            .or_else(|| b.as_ref().and_then(|s| s.error.clone()));
        match (a.and_then(|s| s.energy_j), b.and_then(|s| s.energy_j)) {
            (Some(x), Some(y)) if y >= x => {
                energy.push(format!("GPU {g}: +{:.1} J in 0.3 s", y - x));
            }
            (Some(x), Some(y)) => {
                energy_failed.push(format!("GPU {g}: the counter went back ({x} → {y} J)"));
            }
            _ => energy_failed.push(format!(
                "GPU {g}: no total-energy counter{}",
                why.map(|w| format!(" ({w})")).unwrap_or_default()
            )),
        }
    }
    let mut checks = vec![if energy_failed.is_empty() {
        check(
            "energy",
            Status::Pass,
            energy.join("; "),
            "attempts' energy is the counter's delta over their run",
        )
    } else {
        check(
            "energy",
            Status::Fail,
            energy_failed.join("; "),
            "energy is integrated from power readings there (energy_source integrated), \
             only as fine as the sampling",
        )
    }];
    let field = |name: &'static str,
                 status_missing: Status,
                 get: &dyn Fn(&TelemetrySample) -> Option<String>,
                 meaning_ok: &str,
                 meaning_missing: &str| {
        let mut have = Vec::new();
        let mut missing = Vec::new();
        for s in &second {
            match get(s) {
                Some(v) => have.push(format!("GPU {}: {v}", s.gpu)),
                None => missing.push(s.gpu),
            }
        }
        if missing.is_empty() {
            check(name, Status::Pass, have.join("; "), meaning_ok)
        } else {
            check(
                name,
                status_missing,
                format!("not read on GPUs {missing:?}"),
                meaning_missing,
            )
        }
    };
    checks.push(field(
        "power",
        Status::Fail,
        &|s| s.power_w.map(|p| format!("{p:.1} W")),
        "mean and peak power per attempt",
        "no power: without the counter too, attempts there have no energy figure",
    ));
    checks.push(field(
        "temperature",
        Status::Unavailable,
        &|s| s.temperature_c.map(|t| format!("{t:.0} °C")),
        "start and peak temperatures; cooldown until_temp_c works",
        "no temperatures: cooldown until_temp_c never releases a job there",
    ));
    checks.push(field(
        "clocks",
        Status::Unavailable,
        &|s| s.sm_clock_mhz.map(|c| format!("SM {c} MHz")),
        "SM clocks in the telemetry",
        "no clock figures in the telemetry",
    ));
    checks.push(field(
        "throttle_reasons",
        Status::Fail,
        &|s| {
            s.throttle.as_ref().map(|r| {
                if r.is_empty() {
                    "none now".to_string()
                } else {
                    r.join(", ")
                }
            })
        },
        "throttled attempts are flagged (and on_throttle applies)",
        "throttling unknown: no attempt there counts as clean",
    ));
    checks
}

/// One fact per GPU: pass when `good` holds on every GPU, fail when it does not on one,
/// unavailable when it cannot be read on one.
fn per_gpu(
    name: &'static str,
    facts: impl Iterator<Item = (u32, Result<bool, String>)>,
    good: impl Fn(bool) -> bool,
    yes: &str,
    no: &str,
    meaning: &str,
) -> Check {
    let mut status = Status::Pass;
    let mut words = Vec::new();
    for (index, fact) in facts {
        match fact {
            Ok(v) => {
                words.push(format!("GPU {index}: {}", if good(v) { yes } else { no }));
                if !good(v) {
                    status = Status::Fail;
                }
            }
            Err(e) => {
                words.push(format!("GPU {index}: unknown ({e})"));
                if status == Status::Pass {
                    status = Status::Unavailable;
                }
            }
        }
    }
    check(name, status, words.join("; "), meaning)
}

/// Whether per-attempt cgroups can be made here: makes one and removes it.
fn cgroups() -> Check {
    let scope = format!("doctor-{}", std::process::id());
    match crate::cgroup::Cgroups::setup(&scope) {
        Ok(c) => {
            let probe = c.attempt(headroom_shared::AttemptId::new());
            let made = probe.create().and_then(|()| probe.remove());
            let detail = format!(
                "{} (this process's cgroup; an agent under systemd gets its own, delegated \
                 with `Delegate=yes`)",
                c.describe()
            );
            let joins = made.is_ok().then(|| join_cost(&c));
            // Removes the directory the probe was made in.
            drop(crate::cgroup::Tidy(Some(c)));
            match made {
                Ok(()) => {
                    let detail = match joins {
                        Some(Ok((born, ms))) => format!("{detail}; {}", join_words(born, ms)),
                        Some(Err(e)) => format!("{detail}; joining one not measured: {e}"),
                        None => detail,
                    };
                    check(
                        "cgroups",
                        Status::Pass,
                        detail,
                        "each attempt runs in its own cgroup: membership decides what is its \
                         own, cgroup.kill ends it",
                    )
                }
                Err(e) => check(
                    "cgroups",
                    Status::Unavailable,
                    format!("cannot make an attempt's cgroup: {e}"),
                    "attempts are tracked by their environment marker and process tree",
                ),
            }
        }
        Err(why) => check(
            "cgroups",
            Status::Unavailable,
            why,
            "attempts are tracked by their environment marker and process tree",
        ),
    }
}

/// How a job's process gets into its attempt's cgroups here: whether it is born in them
/// (else moved), and the median ms of its start (fork to exec, as a job's), each after a
/// quiet moment, as at a job's start on an idle node.
fn join_cost(c: &crate::cgroup::Cgroups) -> Result<(bool, f64), String> {
    let probes: Vec<_> = (0..3)
        .map(|_| c.attempt(headroom_shared::AttemptId::new()))
        .collect();
    let mut ms = Vec::new();
    let mut born = true;
    let mut result = Ok(());
    for p in &probes {
        std::thread::sleep(std::time::Duration::from_millis(100));
        match start_in(p) {
            Ok((in_cgroup, t)) => {
                born &= in_cgroup;
                ms.push(t);
            }
            Err(e) => {
                result = Err(format!(
                    "cannot start a process in {}: {e}",
                    p.dir().display()
                ));
                break;
            }
        }
    }
    for p in &probes {
        let _ = p.remove();
    }
    result?;
    ms.sort_by(f64::total_cmp);
    Ok((born, ms[ms.len() / 2]))
}

/// Starts `true` in `cgroup` as a job is started; whether it was born there, and the ms its
/// start took. Waits for it to end.
fn start_in(cgroup: &crate::cgroup::AttemptCgroup) -> std::io::Result<(bool, f64)> {
    cgroup.create()?;
    let null = || std::fs::OpenOptions::new().write(true).open("/dev/null");
    let spec = crate::supervisor::process::Spec {
        program: "true".into(),
        args: Vec::new(),
        // The doctor's own `PATH` (`true` is not in `/usr/bin` everywhere: NixOS).
        env: vec![(
            "PATH".into(),
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )],
        cwd: None,
        stdout: null()?.into(),
        stderr: null()?.into(),
        join: Some(cgroup.join()?),
        identity: None,
    };
    let t = std::time::Instant::now();
    let mut child = spec.spawn()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let born = child.born_in_cgroup();
    while child.try_wait()?.is_none() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok((born, ms))
}

/// How a job gets into its attempt's cgroups here and what its start takes, with the host's
/// `favordynmods` advice where a move waits for the kernel.
fn join_words(born: bool, ms: f64) -> String {
    if born {
        return format!(
            "a job starts in its attempt's cgroups in {ms:.2} ms (born in them: no move)"
        );
    }
    let mut words = format!(
        "a job starts in its attempt's cgroups in {ms:.2} ms (moved into them: \
         `clone3` into a cgroup was refused, by a kernel before 5.7 or a seccomp profile)"
    );
    if let Some((mount, false)) = crate::cgroup::dynmods() {
        words.push_str(&format!("; {}", crate::cgroup::dynmods_advice(&mount)));
    }
    words
}

/// A real allocation on each GPU (PyTorch on NVIDIA GPUs, the usage files on fake ones):
/// headroom must see the process, with its memory, and see it released once it ends.
fn allocation(backend: &dyn GpuBackend, opts: &Options) -> Check {
    let fake_dir = backend
        .job_env()
        .into_iter()
        .find(|(k, _)| k == fake::DIR_VAR)
        .map(|(_, v)| v);
    let python = opts.python.clone().unwrap_or_else(|| "python3".into());
    if fake_dir.is_none() && !has_torch(&python) {
        return check(
            "allocation",
            Status::Unavailable,
            format!("PyTorch with CUDA not found by {python}"),
            "not checked: install PyTorch (or pass --python) to see an allocation and its \
             release",
        );
    }
    let mut seen = Vec::new();
    for g in backend.inventory() {
        let baseline = Baseline::of(&gpu::read(backend), &[g.index]);
        let started = match &fake_dir {
            Some(dir) => allocate_fake(dir, g.index),
            None => allocate_torch(&python, g.index),
        };
        let mut child = match started {
            Ok(c) => c,
            Err(e) => {
                return check(
                    "allocation",
                    Status::Fail,
                    format!("GPU {}: cannot allocate: {e}", g.index),
                    "an allocation headroom cannot make cannot be checked",
                );
            }
        };
        let pid = child.id();
        let t0 = Instant::now();
        let held = wait_for(|| {
            let samples = gpu::read(backend);
            let s = samples.iter().find(|s| s.index == g.index)?;
            s.processes
                .iter()
                .find(|p| p.pid == pid && !p.outside_pid_namespace)
                .map(|p| (p.used_mib, s.unattributed_mib()))
        });
        let shown_ms = t0.elapsed().as_millis();
        let _ = child.kill();
        let _ = child.wait();
        if let Some(dir) = &fake_dir {
            let _ = fake::remove_usage(std::path::Path::new(dir), pid);
        }
        let Some((mib, _)) = held else {
            return check(
                "allocation",
                Status::Fail,
                format!(
                    "GPU {}: process {pid} allocated but was not listed within {}s",
                    g.index,
                    ALLOCATION_WAIT.as_secs()
                ),
                "jobs' memory is not seen: peaks, leftovers and cleanup cannot be verified",
            );
        };
        if mib < ALLOCATE_MIB {
            return check(
                "allocation",
                Status::Fail,
                format!(
                    "GPU {}: process {pid} listed with {mib} MiB, allocated {ALLOCATE_MIB} MiB",
                    g.index
                ),
                "jobs' peaks would read low and teach estimates that OOM",
            );
        }
        let t1 = Instant::now();
        // Released: the process is no longer listed, and no more memory than before is held
        // by no one, as an attempt's cleanup decides it (a driver that lags is waited for).
        let released = wait_for(|| {
            let samples = gpu::read(backend);
            let s = samples.iter().find(|s| s.index == g.index)?;
            let gone = !s.processes.iter().any(|p| p.pid == pid);
            let settled = baseline.ghost(&samples, &[g.index]).is_none();
            (gone && settled).then(|| baseline.tells_ghost(&samples, &[g.index]))
        });
        if released == Some(false) {
            return check(
                "allocation",
                Status::Unavailable,
                format!(
                    "GPU {}: process {pid} seen with {mib} MiB and gone once it ended, but \
                     whether its memory came back cannot be told (unattributed memory unknown)",
                    g.index
                ),
                "cleanup verifies the process list only here; ghost memory is not caught",
            );
        }
        if released.is_none() {
            return check(
                "allocation",
                Status::Fail,
                format!(
                    "GPU {}: process {pid} ended, but within {}s the driver still listed it or \
                     its memory stayed held by no one",
                    g.index,
                    ALLOCATION_WAIT.as_secs()
                ),
                "cleanup would not verify: attempts' GPUs would be quarantined",
            );
        }
        seen.push(format!(
            "GPU {}: pid {pid} seen with {mib} MiB after {shown_ms} ms, released in {} ms",
            g.index,
            t1.elapsed().as_millis()
        ));
    }
    check(
        "allocation",
        Status::Pass,
        seen.join("; "),
        "headroom sees a job's process, its memory and its release",
    )
}

/// Polls `f` until it returns `Some`, for at most [`ALLOCATION_WAIT`].
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + ALLOCATION_WAIT;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `python` to run `-c` with, as the doctor may be root: from `/` and with no working
/// directory on `sys.path` (`PYTHONSAFEPATH`, 3.11 and later), so that a `torch.py` planted
/// where the doctor was started is never imported.
fn python_command(python: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.current_dir("/").env("PYTHONSAFEPATH", "1");
    cmd
}

fn has_torch(python: &str) -> bool {
    let child = python_command(python)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    // A wedged driver must not hang the doctor.
    let ok = wait_for(|| child.try_wait().ok().flatten()).is_some_and(|s| s.success());
    let _ = child.kill();
    let _ = child.wait();
    ok
}

/// A process holding [`ALLOCATE_MIB`] on GPU `index` until it is killed, through the fake
/// GPUs' usage files.
fn allocate_fake(dir: &str, index: u32) -> std::io::Result<Child> {
    let mut child = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let usage = [(index, ALLOCATE_MIB)];
    if let Err(e) = fake::write_usage(std::path::Path::new(dir), child.id(), &usage) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child)
}

/// A Python process holding [`ALLOCATE_MIB`] (and its CUDA context) on GPU `index`; it says
/// `ready` once it does.
fn allocate_torch(python: &str, index: u32) -> std::io::Result<Child> {
    let script = format!(
        "import torch, sys\n\
         x = torch.empty({bytes}, dtype=torch.uint8, device='cuda')\n\
         torch.cuda.synchronize()\n\
         print('ready', flush=True)\n\
         sys.stdin.read()\n",
        bytes = ALLOCATE_MIB * 1024 * 1024
    );
    let mut child = python_command(python)
        .args(["-c", &script])
        .env("CUDA_VISIBLE_DEVICES", index.to_string())
        .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    // Read aside: a wedged driver must not hang the doctor.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
    }
    let line = rx.recv_timeout(ALLOCATION_WAIT).unwrap_or_default();
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other(
            "the allocation did not start (no `ready`)",
        ));
    }
    if let Some(stdin) = child.stdin.as_mut() {
        let _ = stdin.flush();
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doctor's Python (run as root on a node) imports nothing from where the doctor was
    /// started: it runs from `/`, with no working directory on `sys.path`.
    #[test]
    fn the_doctors_python_imports_nothing_from_the_working_directory() {
        let Ok(out) = python_command("python3")
            .args([
                "-c",
                "import os, sys; print(os.getcwd()); print('' in sys.path or os.getcwd() in sys.path)",
            ])
            .output()
        else {
            eprintln!("no python3 here");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"/"), "{text}");
        assert_eq!(lines.get(1), Some(&"False"), "{text}");
    }
}
