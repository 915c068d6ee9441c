//! headroom-fake-job: a stand-in for a training script, for tests and demos. It holds fake GPU
//! memory through the fake backend's files, fails with PyTorch's OOM text when the memory
//! does not fit, and can misbehave the ways real jobs do (ignore SIGTERM, leave orphans).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use headroom_agent::gpu::fake::{self, FakeGpuSpec};
use headroom_shared::MemSize;
use signal_hook::consts::SIGTERM;

/// Simulates a GPU training job on the fake GPU backend.
#[derive(Debug, Parser)]
#[command(name = "headroom-fake-job", version)]
struct Args {
    /// Fake GPU memory to hold on the first GPU of CUDA_VISIBLE_DEVICES (e.g. `2GiB`).
    /// Without HEADROOM_FAKE_GPU_DIR (no fake GPUs, e.g. real ones) nothing is held.
    #[arg(long, value_name = "SIZE")]
    mem: Option<MemSize>,
    /// Host RAM to allocate and touch at start and hold until the end (e.g. `256MiB`): what
    /// the attempt's cgroup counts as its host RAM peak.
    #[arg(long, value_name = "SIZE")]
    host_mem: Option<MemSize>,
    /// How long to run.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    seconds: f64,
    /// Exit code at the end.
    #[arg(long, value_name = "CODE", default_value_t = 0)]
    exit: u8,
    /// Append a JSON line to FILE (under an exclusive lock, one write each) at start, when
    /// SIGTERM arrives (`term`) and as the last act before exiting (`end`, whatever the exit).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Print and keep running on SIGTERM.
    #[arg(long)]
    ignore_term: bool,
    /// Leave an orphan holding SIZE: a grandchild in a session of its own (`setsid -f`).
    #[arg(long, value_name = "SIZE")]
    orphan_mem: Option<MemSize>,
    /// How long the orphan runs.
    #[arg(long, value_name = "F", default_value_t = 300.0)]
    orphan_seconds: f64,
    /// Where the orphan writes its pid (default: a file in the temporary directory).
    #[arg(long, value_name = "FILE")]
    orphan_pid_file: Option<PathBuf>,
    /// Write this process's pid to FILE once its memory is held.
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,
    /// Behave as a CUDA OOM when parameter NAME (env HP_NAME) is above VALUE: `batch_size>64`.
    #[arg(long, value_name = "NAME>VALUE")]
    oom_if_param: Option<ParamAbove>,
    /// GPU utilization to declare, percent (0-100), with or without `--mem`: the fake GPU's
    /// power and temperature follow it.
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(0..=100))]
    util: Option<u32>,
    /// Print TEXT to stdout at start (repeatable).
    #[arg(long, value_name = "TEXT")]
    print: Vec<String>,
    /// Wait F seconds before taking the GPU memory (a job that loads data first, like a
    /// colocated background warming up); SIGTERM still ends it meanwhile.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    delay: f64,
    /// Grow by SIZE of GPU memory after `--grow-after` seconds (an evaluation pass, a longer
    /// batch), failing with CUDA's OOM text when it does not fit or passes the attempt's cap.
    #[arg(long, value_name = "SIZE")]
    grow: Option<MemSize>,
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    grow_after: f64,
    /// Give the grown memory back after F seconds (an evaluation's peak, then training
    /// again); without it the job holds it to its end.
    #[arg(long, value_name = "F")]
    grow_for: Option<f64>,
}

#[derive(Clone, Debug)]
struct ParamAbove {
    name: String,
    value: f64,
}

impl FromStr for ParamAbove {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || format!("`{s}` is not NAME>VALUE (e.g. `batch_size>64`)");
        let (name, value) = s.split_once('>').ok_or_else(err)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(err());
        }
        Ok(Self {
            name: name.to_string(),
            value: value.trim().parse().map_err(|_| err())?,
        })
    }
}

impl ParamAbove {
    fn holds(&self) -> bool {
        std::env::var(format!("HP_{}", self.name.to_ascii_uppercase()))
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|v| v > self.value)
    }
}

/// Fails the way the job would, with a message for its log.
struct Exit(u8, String);

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(Exit(code, msg)) => {
            if !msg.is_empty() {
                eprintln!("{msg}");
            }
            ExitCode::from(code)
        }
    }
}

fn usage(msg: String) -> Exit {
    Exit(2, format!("headroom-fake-job: {msg}"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn record(path: &Path, event: &str, mem_mib: u64) -> Result<(), Exit> {
    let json = serde_json::json!({
        "event": event,
        "job": env("HEADROOM_JOB_ID"),
        "attempt": env("HEADROOM_ATTEMPT_ID"),
        "gpus": env("CUDA_VISIBLE_DEVICES"),
        "pid": std::process::id(),
        "mem_mib": mem_mib,
        "t_ms": unix_ms(),
    });
    let line = format!("{json}\n");
    let write = || -> std::io::Result<()> {
        let mut f = File::options().create(true).append(true).open(path)?;
        // Jobs running side by side append to one file: one whole line each, in one write, so
        // that a SIGKILL cannot leave half a line for the next record to run into.
        f.lock()?;
        f.write_all(line.as_bytes())
    };
    write().map_err(|e| usage(format!("cannot record to {}: {e}", path.display())))
}

/// An OOM, noted in the record (`oom`, with the memory it would have held in all) when there
/// is one.
fn recorded_oom(args: &Args, e: Exit, asked_mib: u64) -> Exit {
    if let Some(path) = &args.record
        && e.1.contains("CUDA out of memory")
        && let Err(Exit(_, msg)) = record(path, "oom", asked_mib)
    {
        eprintln!("{msg}");
    }
    e
}

/// PyTorch's message, so that the agent classifies the failure as `oom`.
fn oom(tried_mib: u64, gpu: u32, total_mib: Option<u64>, free_mib: Option<u64>) -> Exit {
    let mut msg = format!(
        "Traceback (most recent call last):\n  File \"train.py\", line 42, in <module>\n\
         torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib} MiB."
    );
    if let (Some(total), Some(free)) = (total_mib, free_mib) {
        msg.push_str(&format!(
            " GPU {gpu} has a total capacity of {total} MiB of which {free} MiB is free."
        ));
    }
    Exit(1, msg)
}

/// The first GPU this process may use.
fn my_gpu() -> u32 {
    env("CUDA_VISIBLE_DEVICES")
        .as_deref()
        .and_then(fake::first_visible_gpu)
        .unwrap_or(0)
}

fn fake_spec() -> Result<Option<FakeGpuSpec>, Exit> {
    env(fake::SPEC_VAR)
        .map(|s| {
            s.parse()
                .map_err(|e| usage(format!("{}: {e}", fake::SPEC_VAR)))
        })
        .transpose()
}

/// Holds `mib` on `gpu` (what this process held before included) if it fits, and within
/// the attempt's memory cap where the fake GPUs have one, as one step under the
/// directory's lock.
fn hold(dir: &Path, gpu: u32, mib: u64, util: u32) -> Result<(), Exit> {
    let spec = fake_spec()?;
    let io = |what: &str, e: std::io::Error| usage(format!("{what} {}: {e}", dir.display()));
    fs::create_dir_all(dir).map_err(|e| io("cannot create", e))?;
    let _lock = fake::lock_dir(dir).map_err(|e| io("cannot lock", e))?;
    if let Some(spec) = &spec {
        let total = spec.total_mib(gpu).ok_or_else(|| {
            usage(format!(
                "GPU {gpu} is not one of the {} fake GPUs",
                spec.gpu_count()
            ))
        })?;
        let me = std::process::id();
        let uses = fake::read_usage(dir, spec.gpu_count()).map_err(|e| io("cannot read", e))?;
        let mine = uses
            .iter()
            .filter(|u| u.pid == me && u.gpu == gpu)
            .map(|u| u.mib)
            .sum::<u64>();
        let used = fake::used_on(&uses, gpu).saturating_sub(mine);
        let more = mib.saturating_sub(mine);
        if used.saturating_add(mib) > total {
            return Err(oom(
                more,
                gpu,
                Some(total),
                Some(total.saturating_sub(used + mine)),
            ));
        }
        if let Some((attempt, cap)) = attempt_cap(dir) {
            // The attempt's processes on this GPU, this one as it would be.
            let theirs: u64 = uses
                .iter()
                .filter(|u| u.gpu == gpu && u.pid != me && attempt.contains(&u.pid))
                .map(|u| u.mib)
                .sum();
            if theirs.saturating_add(mib) > cap {
                let mut e = oom(
                    more,
                    gpu,
                    Some(total),
                    Some(total.saturating_sub(used + mine)),
                );
                e.1.push_str(&format!(
                    " (the attempt's GPU memory limit is {cap} MiB, of which it holds {} MiB)",
                    theirs + mine
                ));
                return Err(e);
            }
        }
    }
    fake::write_usage_util(dir, std::process::id(), &[(gpu, mib, util)])
        .map_err(|e| io("cannot write", e))
}

/// The attempt's processes and its memory cap (MiB), where the fake GPUs hold it to one.
fn attempt_cap(dir: &Path) -> Option<(Vec<u32>, u64)> {
    let attempt: headroom_shared::AttemptId =
        env(headroom_agent::procscan::ATTEMPT_VAR)?.parse().ok()?;
    let cap = fake::read_cap(dir, &attempt.to_string())?;
    Some((headroom_agent::procscan::pids_with_marker(attempt), cap))
}

/// Where fake GPU memory is held; `None` (with a note in the job's log) where there are no
/// fake GPUs, e.g. under an agent on real GPUs: the job then runs holding nothing, so that
/// demos such as the quickstart work on any machine.
fn fake_dir() -> Option<PathBuf> {
    let dir = env(fake::DIR_VAR).map(PathBuf::from);
    if dir.is_none() {
        println!(
            "headroom-fake-job: {} is not set (no fake GPUs here): --mem holds no GPU memory",
            fake::DIR_VAR
        );
    }
    dir
}

/// Starts a grandchild that leaves this job's session and process group, and waits until it
/// holds its memory, so that callers can rely on it being there.
fn leave_orphan(args: &Args, mem: MemSize) -> Result<(), Exit> {
    let exe = std::env::current_exe().map_err(|e| usage(format!("own path: {e}")))?;
    let pid_file = args.orphan_pid_file.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "headroom-fake-job-orphan-{}.pid",
            std::process::id()
        ))
    });
    let _ = fs::remove_file(&pid_file);
    // `setsid -f` forks: the grandchild re-parents (to the agent, a subreaper) and keeps the
    // environment, hence the attempt's marker.
    let mut cmd = Command::new("setsid");
    cmd.arg("-f")
        .arg(&exe)
        .arg("--mem")
        .arg(format!("{}MiB", mem.mib))
        .arg("--seconds")
        .arg(args.orphan_seconds.to_string())
        .arg("--pid-file")
        .arg(&pid_file);
    if args.ignore_term {
        cmd.arg("--ignore-term");
    }
    let status = cmd
        .status()
        .map_err(|e| usage(format!("cannot run `setsid -f` (util-linux): {e}")))?;
    if !status.success() {
        return Err(usage(format!("`setsid -f` failed: {status}")));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(pid) = fs::read_to_string(&pid_file)
            && !pid.trim().is_empty()
        {
            println!("left an orphan (pid {}) holding {mem}", pid.trim());
            if args.orphan_pid_file.is_none() {
                let _ = fs::remove_file(&pid_file);
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(usage("the orphan did not start within 10s".to_string()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run(args: &Args) -> Result<u8, Exit> {
    let term = Arc::new(AtomicBool::new(false));
    let mem_mib = args.mem.map_or(0, |m| m.mib);
    // Every byte written, so every page is resident; held to the end of `run`.
    let _host: Vec<u8> = vec![1; args.host_mem.map_or(0, |m| m.mib as usize * 1024 * 1024)];
    {
        // A thread of its own notes SIGTERM (with the time it arrived, in the record) and
        // either ignores it or asks the main loop to stop.
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM])
            .map_err(|e| usage(format!("cannot handle SIGTERM: {e}")))?;
        let (term, ignore, path) = (term.clone(), args.ignore_term, args.record.clone());
        std::thread::spawn(move || {
            for _ in signals.forever() {
                if let Some(path) = &path
                    && let Err(Exit(_, msg)) = record(path, "term", mem_mib)
                {
                    eprintln!("{msg}");
                }
                if ignore {
                    println!("headroom-fake-job: got SIGTERM, ignoring it");
                } else {
                    term.store(true, Ordering::SeqCst);
                }
            }
        });
    }

    for text in &args.print {
        println!("{text}");
    }
    let gpu = my_gpu();
    if let Some(cond) = &args.oom_if_param
        && cond.holds()
    {
        let tried = args.mem.map_or(1024, |m| m.mib);
        return Err(oom(tried, gpu, None, None));
    }

    if args.delay > 0.0 {
        let until = Instant::now() + Duration::from_secs_f64(args.delay.min(3.0e7));
        while Instant::now() < until {
            if term.load(Ordering::SeqCst) {
                println!("got SIGTERM while warming up, exiting");
                return Ok(0);
            }
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(20)));
        }
    }
    let dir = (args.mem.is_some() || args.util.is_some())
        .then(fake_dir)
        .flatten();
    // What this process really holds: nothing without fake GPUs.
    let mem_mib = if dir.is_some() { mem_mib } else { 0 };
    if let Some(dir) = &dir
        && let Err(e) = hold(dir, gpu, mem_mib, args.util.unwrap_or(0))
    {
        return Err(recorded_oom(args, e, mem_mib));
    }
    let release = || {
        if let Some(dir) = &dir {
            let _ = fake::remove_usage(dir, std::process::id());
        }
    };
    if let Some(path) = &args.pid_file {
        fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| usage(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.record {
        record(path, "start", mem_mib)?;
    }
    if let Some(mem) = args.orphan_mem {
        leave_orphan(args, mem)?;
    }
    println!(
        "fake job pid {} on GPU {gpu} holding {mem_mib} MiB for {}s",
        std::process::id(),
        args.seconds
    );

    let grow_at = args.grow.filter(|_| dir.is_some()).map(|g| {
        (
            Instant::now() + Duration::from_secs_f64(args.grow_after.clamp(0.0, 3.0e7)),
            g,
        )
    });
    let mut grown = false;
    let mut shrink_at = None;
    // A step per second, at least one, so the log shows progress.
    // Bounded (a year) so that any number makes a valid duration.
    let seconds = if args.seconds.is_finite() {
        args.seconds.clamp(0.0, 365.0 * 86400.0)
    } else {
        0.0
    };
    let steps = (seconds.ceil() as u64).clamp(1, 100_000);
    let step = Duration::from_secs_f64(seconds / steps as f64);
    for k in 1..=steps {
        let until = Instant::now() + step;
        while Instant::now() < until {
            if term.load(Ordering::SeqCst) {
                println!("got SIGTERM at step {k}/{steps}, exiting");
                release();
                if let Some(path) = &args.record {
                    record(path, "end", mem_mib)?;
                }
                return Ok(143);
            }
            if let (Some((at, more)), Some(dir)) = (grow_at, &dir)
                && !grown
                && Instant::now() >= at
            {
                grown = true;
                let total = mem_mib.saturating_add(more.mib);
                if let Err(e) = hold(dir, gpu, total, args.util.unwrap_or(0)) {
                    release();
                    return Err(recorded_oom(args, e, total));
                }
                println!("grew to {total} MiB on GPU {gpu}");
                shrink_at = args
                    .grow_for
                    .map(|f| Instant::now() + Duration::from_secs_f64(f.clamp(0.0, 3.0e7)));
            }
            if let (Some(at), Some(dir)) = (shrink_at, &dir)
                && Instant::now() >= at
            {
                shrink_at = None;
                // Less than it held: this always fits.
                if let Err(e) = hold(dir, gpu, mem_mib, args.util.unwrap_or(0)) {
                    release();
                    return Err(e);
                }
                println!("back to {mem_mib} MiB on GPU {gpu}");
            }
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(20)));
        }
        println!("step {k}/{steps} loss {:.4}", 2.0 / (k as f64).sqrt());
    }

    release();
    if let Some(path) = &args.record {
        record(path, "end", mem_mib)?;
    }
    Ok(args.exit)
}
