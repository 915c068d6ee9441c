//! The benchmark suite of the real system against task-spooler, each bench a module that
//! returns its [`Report`]; [`run`] runs one at its full or tiny size (`headroom-bench-suite`
//! and the smoke test), `headroom-bench-suite` writes them to `bench/results/`.

pub mod agent_cpu;
pub mod dispatch;
pub mod latency;
pub mod makespan;
pub mod metric_lines;
pub mod scale;
pub mod slot_free;
pub mod useful;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// Every bench, in the order a whole run takes them.
pub const ALL: [&str; 10] = [
    "useful",
    "dispatch",
    "latency",
    "makespan",
    "slot_free",
    "scale",
    "scale_ceiling",
    "scale_load",
    "agent_cpu",
    "metric_lines",
];

/// Runs bench `name` at the size, or (`tiny`) at one that only checks it still works.
pub fn run(name: &str, tiny: bool) -> Result<Report> {
    match (name, tiny) {
        ("dispatch", false) => dispatch::run(&dispatch::Size { jobs: 990, gpus: 8 }),
        ("dispatch", true) => dispatch::run(&dispatch::Size { jobs: 12, gpus: 2 }),
        ("latency", false) => latency::run(200),
        ("latency", true) => latency::run(3),
        ("makespan", false) => makespan::run(&makespan::Size {
            jobs: 64,
            slots: 16,
            seconds: 1.0,
        }),
        ("makespan", true) => makespan::run(&makespan::Size {
            jobs: 4,
            slots: 2,
            seconds: 0.2,
        }),
        ("slot_free", false) => slot_free::run(100),
        ("slot_free", true) => slot_free::run(3),
        ("scale" | "scale_ceiling", false) => scale::run(&scale::Size {
            replicas: 2,
            agents: bench_count("HEADROOM_BENCH_AGENTS", 1000)?,
            gpus_per_agent: 8,
            queued: bench_count("HEADROOM_BENCH_QUEUED", 1_000_000)?,
            window: Duration::from_secs(60),
            // `scale_ceiling`: each job ends at once, the coordinator's ceiling.
            job: if name == "scale" {
                Duration::from_secs(5)
            } else {
                Duration::ZERO
            },
            agent_tokens: bench_flag("HEADROOM_BENCH_AGENT_TOKENS")?,
            restart: bench_flag("HEADROOM_BENCH_RESTART")?,
        }),
        // The tiny ceiling's agents hold agent tokens, and its replicas are restarted before
        // the window, so that the suite's smoke test runs the fleet both ways.
        ("scale" | "scale_ceiling", true) => scale::run(&scale::Size {
            replicas: 2,
            agents: 2,
            gpus_per_agent: 2,
            queued: 20,
            window: Duration::from_secs(60),
            job: Duration::from_millis(50),
            agent_tokens: name == "scale_ceiling",
            restart: name == "scale_ceiling",
        }),
        // Claims while the coordinators keep up: jobs of 80, 40 and 20 s on the same 8,000
        // GPUs, the fleet ending 100, 200 and 400 jobs/s; each window runs a minute past the
        // first jobs' length (claims are counted from there). `HEADROOM_BENCH_JOB_S=80` runs
        // the sizes listed only (a change's before and after, in a third of the time).
        ("scale_load", false) => {
            let sizes: Vec<scale::Size> = load_job_seconds()?
                .into_iter()
                .map(|job_s| scale::Size {
                    replicas: 2,
                    agents: 1000,
                    gpus_per_agent: 8,
                    queued: 1_000_000,
                    window: Duration::from_secs(job_s + 60),
                    job: Duration::from_secs(job_s),
                    agent_tokens: false,
                    restart: false,
                })
                .collect();
            scale::load(&sizes)
        }
        ("scale_load", true) => scale::load(&[200, 50].map(|job_ms| scale::Size {
            replicas: 2,
            agents: 2,
            gpus_per_agent: 2,
            queued: 20,
            window: Duration::from_secs(60),
            job: Duration::from_millis(job_ms),
            agent_tokens: false,
            restart: false,
        })),
        ("agent_cpu", false) => agent_cpu::run(Duration::from_secs(30)),
        ("agent_cpu", true) => agent_cpu::run(Duration::from_secs(1)),
        ("metric_lines", false) => metric_lines::run(1_000_000),
        ("metric_lines", true) => metric_lines::run(20_000),
        ("useful", tiny) => useful::run(tiny),
        _ => bail!("unknown bench `{name}`: one of {}", ALL.join(" ")),
    }
}

/// What one bench measured: its figures (JSON) and the same as a Markdown table.
#[derive(Debug, Serialize)]
pub struct Report {
    pub bench: &'static str,
    /// The command that produced it.
    pub command: String,
    pub at: String,
    pub machine: Machine,
    pub figures: serde_json::Value,
    /// Each target of the issue: what it asks, what was measured, whether it holds.
    pub targets: Vec<Target>,
    #[serde(skip)]
    pub markdown: String,
}

#[derive(Debug, Serialize)]
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

impl Target {
    pub fn new(what: &str, measured: String, met: bool) -> Self {
        Self {
            what: what.to_string(),
            measured,
            met,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub load_1m: f64,
    /// Whether the cgroup v2 mount favours dynamic changes (a job's start waits for an RCU
    /// grace period without it); `None` where the kernel has no such option.
    pub cgroup_favordynmods: Option<bool>,
}

impl Machine {
    pub fn now() -> Self {
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_1m: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(f64::NAN),
            cgroup_favordynmods: headroom_agent::cgroup::dynmods().map(|(_, on)| on),
        }
    }
}

impl Report {
    pub fn new(
        bench: &'static str,
        figures: serde_json::Value,
        targets: Vec<Target>,
        table: String,
    ) -> Self {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
        let machine = Machine::now();
        let mut markdown = format!(
            "### {bench}\n\n`{command}`, {at}, {} CPUs, load {:.1}, cgroup favordynmods {}\n\n{table}\n",
            machine.cpus,
            machine.load_1m,
            match machine.cgroup_favordynmods {
                Some(true) => "on",
                Some(false) => "off",
                None => "not available",
            }
        );
        for t in &targets {
            markdown.push_str(&format!(
                "- {} {}: {}\n",
                if t.met { "met" } else { "MISSED" },
                t.what,
                t.measured
            ));
        }
        Self {
            bench,
            command,
            at,
            machine,
            figures,
            targets,
            markdown,
        }
    }

    /// Writes `<dir>/<bench>.json` and `<dir>/<bench>.md`.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = dir.join(format!("{}.json", self.bench));
        let md = dir.join(format!("{}.md", self.bench));
        std::fs::write(&json, serde_json::to_string_pretty(self)? + "\n")?;
        std::fs::write(&md, &self.markdown)?;
        Ok(vec![json, md])
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

/// A stamp the bench job wrote (`headroom-bench-stamp`), in ns since the epoch.
pub fn read_stamp(path: &Path) -> Option<i128> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A directory every job can write to, whichever user it runs as.
pub fn shared_dir(prefix: &str) -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new().prefix(prefix).tempdir()?;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777))?;
    Ok(d)
}

/// The bench job's path (`headroom-bench-stamp`, beside the other binaries).
pub fn stamp() -> String {
    headroom_integration_tests::binary("headroom-bench-stamp")
        .display()
        .to_string()
}

/// A fleet or queue smaller than the issue's, for a machine that cannot hold the issue's
/// without its leases expiring (`HEADROOM_BENCH_AGENTS`, `HEADROOM_BENCH_QUEUED`).
/// `var` set to `1` (or `0`, or unset: off): the scale fleet's agents each hold an agent
/// token of their own node, as a lab's do (`HEADROOM_BENCH_AGENT_TOKENS`).
fn bench_flag(var: &str) -> Result<bool> {
    match std::env::var(var).as_deref().map(str::trim) {
        Err(_) | Ok("" | "0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(v) => bail!("{var}: `{v}` is neither 1 nor 0"),
    }
}

fn bench_count(var: &str, default: usize) -> Result<usize> {
    let Ok(v) = std::env::var(var) else {
        return Ok(default);
    };
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .with_context(|| format!("{var}: `{v}` is not a whole number above 0"))
}

/// The job lengths `scale_load` runs: `HEADROOM_BENCH_JOB_S` (seconds, comma-separated), else
/// 80, 40 and 20.
fn load_job_seconds() -> Result<Vec<u64>> {
    let Ok(list) = std::env::var("HEADROOM_BENCH_JOB_S") else {
        return Ok(vec![80, 40, 20]);
    };
    list.split(',')
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| {
                    format!("HEADROOM_BENCH_JOB_S: `{s}` is not a whole number of seconds")
                })
        })
        .collect()
}
