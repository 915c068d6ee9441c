//! A headroom node for the benches: `headroom-coordinator` and one `headroom-agent` on fake
//! GPUs, both (and so every supervisor and job) inside one CPU-accounting group.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use headroom_integration_tests::{Proc, binary, block_on, free_port};
use headroom_shared::ExperimentId;
use headroom_shared::api::SubmitRequest;
use headroom_shared::client::Client;

use crate::cpugroup::CpuGroup;

pub struct NodeOptions<'a> {
    /// `None`: the embedded SQLite store.
    pub database_url: Option<&'a str>,
    /// The fake GPUs (`8x80GiB`).
    pub gpus: &'a str,
    /// The concurrency plan (`1,1,1,1`).
    pub plan: &'a str,
}

/// A running coordinator and agent; killed when dropped.
pub struct Node {
    pub api: Client,
    pub url: String,
    pub coordinator: Proc,
    /// The coordinator's arguments, to start it again ([`Node::restart_coordinator`]).
    coordinator_args: Vec<String>,
    /// `None` for a coordinator alone.
    pub agent: Option<Proc>,
    pub group: Option<CpuGroup>,
    pub dir: tempfile::TempDir,
}

/// `headroom-coordinator`'s arguments: listening on `port`, its data in `data_dir`, on
/// `database_url` (the embedded SQLite store when `None`).
pub fn coordinator_args(port: u16, data_dir: &Path, database_url: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        data_dir.display().to_string(),
    ];
    if let Some(db) = database_url {
        args.extend(["--database-url".to_string(), db.to_string()]);
    }
    args
}

/// `headroom-agent`'s arguments: node `bench` on fake `gpus` with `plan`, a 1 s kill grace.
pub fn agent_args(url: &str, gpus: &str, plan: &str, data_dir: &Path) -> Vec<String> {
    [
        "--coordinator",
        url,
        "--node",
        "bench",
        "--gpu-backend",
        "fake",
        "--fake-gpus",
        gpus,
        "--plan",
        plan,
        "--kill-grace",
        "1s",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([data_dir.display().to_string()])
    .collect()
}

fn start_in(group: Option<&CpuGroup>, name: &str, args: &[String], log: &Path) -> Result<Proc> {
    let program = binary(name).display().to_string();
    match group {
        Some(g) => {
            let (sh, argv) = g.wrap(&program, args);
            Proc::start_program(Path::new(&sh), &argv, &[], log.to_path_buf())
        }
        None => Proc::start(name, args, log.to_path_buf()),
    }
}

/// One experiment of `runs` copies of `argv` (100 MiB estimate each).
pub fn submit(api: &Client, name: &str, argv: &[&str], runs: usize) -> Result<ExperimentId> {
    let req = SubmitRequest {
        spec: serde_json::json!({"name": name, "command": argv,
            "runs_per_config": runs, "resources": {"memory": "100MiB"}}),
        seed: None,
        dry_run: false,
        ..Default::default()
    };
    let r = block_on(api.submit(&req))?.context("submit refused")?;
    r.experiment.context("stored")
}

/// How long a coordinator has to answer, and an agent to register, once started.
const STARTUP: Duration = Duration::from_secs(60);

/// Waits for the coordinator behind `api` to answer; fails with its output.
pub fn wait_healthy(api: &Client, coordinator: &Proc) -> Result<()> {
    poll(
        || Ok(block_on(api.health())?.is_ok()),
        || format!("coordinator did not start: {}", coordinator.output()),
    )
}

/// Waits for a node to register with the coordinator behind `api`; fails with the agent's
/// output.
pub fn wait_registered(api: &Client, agent: &Proc) -> Result<()> {
    poll(
        || Ok(!block_on(api.nodes())??.is_empty()),
        || format!("agent did not register: {}", agent.output()),
    )
}

fn poll(mut ready: impl FnMut() -> Result<bool>, failed: impl Fn() -> String) -> Result<()> {
    let deadline = Instant::now() + STARTUP;
    while !ready()? {
        if Instant::now() > deadline {
            bail!("{}", failed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits for every job of `exp` to end; fails if any did not succeed (a figure of jobs that
/// failed at launch would flatter the build), or after `timeout`.
pub fn wait_done(api: &Client, exp: ExperimentId, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut after = None;
    loop {
        let p = block_on(api.progress_within(Some(exp), after, Duration::from_secs(2)))??;
        let (finished, total) = (p.counts.finished(), p.counts.total());
        if finished == total {
            if p.counts.succeeded != total {
                bail!(
                    "{} of {total} jobs did not succeed",
                    total - p.counts.succeeded
                );
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{finished} of {total} jobs ended after {timeout:?}");
        }
        after = Some(p.version);
    }
}

/// Runs `cmd` to its end; an error naming `what` unless it succeeded.
pub fn run_ok(cmd: &mut std::process::Command, what: &str) -> Result<()> {
    let st = cmd.status().with_context(|| format!("starting {what}"))?;
    if !st.success() {
        bail!("{what} failed: {st}");
    }
    Ok(())
}

impl Node {
    /// A coordinator alone (the scale bench's simulated agents talk to it).
    pub fn coordinator(database_url: Option<&str>) -> Result<Self> {
        Self::coordinator_as(database_url, None)
    }

    /// A coordinator alone; with `admin`, its admin token (every request then needs a
    /// token), which `api` holds.
    pub fn coordinator_as(database_url: Option<&str>, admin: Option<&str>) -> Result<Self> {
        Self::start_parts(database_url, None, admin)
    }

    pub fn start(o: &NodeOptions) -> Result<Self> {
        Self::start_parts(o.database_url, Some((o.gpus, o.plan)), None)
    }

    fn start_parts(
        database_url: Option<&str>,
        agent: Option<(&str, &str)>,
        admin: Option<&str>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("hr-bench").tempdir()?;
        let group = CpuGroup::create("headroom");
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let mut args = coordinator_args(port, &dir.path().join("coord"), database_url);
        if let Some(token) = admin {
            let file = dir.path().join("admin-token");
            std::fs::write(&file, token)?;
            args.extend(["--admin-token-file".into(), file.display().to_string()]);
        }
        let coordinator = start_in(
            group.as_ref(),
            "headroom-coordinator",
            &args,
            &dir.path().join("coord.log"),
        )?;
        let api = Client::new(&url)?.with_token(admin)?;
        wait_healthy(&api, &coordinator)?;
        let agent = match agent {
            None => None,
            Some((gpus, plan)) => {
                let a = agent_args(&url, gpus, plan, &dir.path().join("agent"));
                let agent = start_in(
                    group.as_ref(),
                    "headroom-agent",
                    &a,
                    &dir.path().join("agent.log"),
                )?;
                wait_registered(&api, &agent)?;
                Some(agent)
            }
        };
        Ok(Self {
            api,
            url,
            coordinator,
            coordinator_args: args,
            agent,
            group,
            dir,
        })
    }

    /// One experiment of `runs` copies of `argv` (100 MiB estimate each).
    pub fn submit(&self, name: &str, argv: &[&str], runs: usize) -> Result<ExperimentId> {
        submit(&self.api, name, argv, runs)
    }

    /// [`wait_done`], with the agent's log in the error.
    pub fn wait_done(&self, exp: ExperimentId, timeout: Duration) -> Result<()> {
        wait_done(&self.api, exp, timeout).map_err(|e| {
            match self.agent.as_ref().map(Proc::output) {
                Some(log) => e.context(format!("agent log:\n{}", tail(&log, 3000))),
                None => e,
            }
        })
    }

    /// Stops the coordinator (SIGTERM, as a rolling update does) and starts it again on the
    /// same address and store, with all it remembers in memory gone.
    pub fn restart_coordinator(&mut self) -> Result<()> {
        self.coordinator.signal(nix::sys::signal::Signal::SIGTERM)?;
        if self
            .coordinator
            .wait_exit(Duration::from_secs(30))?
            .is_none()
        {
            self.coordinator.kill9()?;
        }
        self.coordinator = start_in(
            self.group.as_ref(),
            "headroom-coordinator",
            &self.coordinator_args,
            &self.dir.path().join("coord.log"),
        )?;
        wait_healthy(&self.api, &self.coordinator)
    }

    /// CPU of everything the node ran so far (coordinator, agent, supervisors, jobs), in ms.
    pub fn cpu_ms(&self) -> Option<f64> {
        self.group.as_ref().and_then(|g| g.usage_ms().ok())
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM first: the agent stops its supervisors and jobs on the way out.
        if let Some(a) = &mut self.agent {
            let _ = a.signal(nix::sys::signal::Signal::SIGTERM);
            let _ = a.wait_exit(Duration::from_secs(10));
        }
        if let Some(g) = &self.group {
            let _ = g.kill_all();
        }
    }
}
