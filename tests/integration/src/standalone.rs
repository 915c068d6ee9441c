//! `headroom-coordinator` and `headroom-agent` started as separate processes, as operators
//! run them: the pair most end-to-end fault tests build, and the HTTP look-ups they share.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use headroom_shared::ExperimentId;
use headroom_shared::JobState;
use headroom_shared::api::{JobDetail, JobSummary, NodeView, SubmitResponse};

use crate::{Proc, free_port, http_get, http_post, wait_until};

/// Waits up to 30 s for `GET {url}/v1/health` to answer.
pub fn wait_healthy(url: &str) {
    wait_until("the coordinator", Duration::from_secs(30), || {
        http_get::<serde_json::Value>(&format!("{url}/v1/health"))
            .ok()
            .map(|_| ())
    });
}

/// A `headroom-coordinator` on SQLite in `dir/coord`, its output in `dir/coord.log`.
pub struct Coordinator {
    proc: Proc,
    pub url: String,
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
}

impl Coordinator {
    /// Starts on a free port with `extra` flags (`--lease-ttl 3s`) and returns once it answers.
    pub fn start(dir: &Path, extra: &[&str]) -> Result<Self> {
        let port = free_port()?;
        let mut args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.join("coord").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let proc = Proc::start("headroom-coordinator", &args, dir.join("coord.log"))?;
        let url = format!("http://127.0.0.1:{port}");
        wait_healthy(&url);
        Ok(Self {
            proc,
            url,
            port,
            args,
            dir: dir.to_path_buf(),
        })
    }

    /// Sends `sig` to the coordinator process (`SIGSTOP` freezes it: nobody reaches it).
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        self.proc.signal(sig)
    }

    /// What it logged so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Starts it again with the same flags (same port, same data), its output in `dir/log`;
    /// does not wait for it to answer. The previous process must be gone.
    pub fn start_again(&mut self, log: &str) -> Result<()> {
        self.proc = Proc::start("headroom-coordinator", &self.args, self.dir.join(log))?;
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<NodeView>> {
        nodes_of(&self.url)
    }
}

impl Deref for Coordinator {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.proc
    }
}

impl DerefMut for Coordinator {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.proc
    }
}

/// Flags of a `headroom-agent` with fake GPUs; a setting left `None` takes the agent's
/// default.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub node: String,
    pub fake_gpus: String,
    pub kill_grace: Option<String>,
    pub verify_timeout: Option<String>,
    /// The log file's name in the test's directory; `{node}.log` when `None`.
    pub log: Option<String>,
    pub extra: Vec<String>,
    /// Variables added to the agent's environment.
    pub env: Vec<(String, String)>,
    /// The agent binary to run (a copy elsewhere); the workspace's when `None`.
    pub program: Option<PathBuf>,
}

impl AgentOptions {
    /// Node `node` with one fake GPU of 24 GiB.
    pub fn node(node: &str) -> Self {
        Self {
            node: node.into(),
            fake_gpus: "1x24GiB".into(),
            kill_grace: None,
            verify_timeout: None,
            log: None,
            extra: vec![],
            env: vec![],
            program: None,
        }
    }

    /// Runs the agent binary at `path` instead of the workspace's.
    pub fn program(mut self, path: &Path) -> Self {
        self.program = Some(path.to_path_buf());
        self
    }

    /// More flags.
    pub fn flags(mut self, flags: &[&str]) -> Self {
        self.extra.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn kill_grace(mut self, grace: &str) -> Self {
        self.kill_grace = Some(grace.into());
        self
    }

    pub fn verify_timeout(mut self, timeout: &str) -> Self {
        self.verify_timeout = Some(timeout.into());
        self
    }

    pub fn log(mut self, name: &str) -> Self {
        self.log = Some(name.into());
        self
    }
}

/// A `headroom-agent` with fake GPUs and its data in `dir/{node}`.
pub struct Agent {
    proc: Proc,
    pub node: String,
    pub data_dir: PathBuf,
}

impl Agent {
    /// Starts an agent of the coordinator at `coordinator` (a URL: the coordinator's, or a
    /// link's in front of it); does not wait for it to register.
    pub fn start(coordinator: &str, dir: &Path, opts: AgentOptions) -> Result<Self> {
        crate::open_to_jobs(dir)?;
        let data_dir = dir.join(&opts.node);
        let mut args: Vec<String> = [
            "--coordinator",
            coordinator,
            "--node",
            &opts.node,
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            &opts.fake_gpus,
        ]
        .map(String::from)
        .to_vec();
        if let Some(grace) = &opts.kill_grace {
            args.extend(["--kill-grace".into(), grace.clone()]);
        }
        if let Some(timeout) = &opts.verify_timeout {
            args.extend(["--verify-timeout".into(), timeout.clone()]);
        }
        args.extend(["--data-dir".into(), data_dir.display().to_string()]);
        args.extend(opts.extra);
        let log = dir.join(opts.log.unwrap_or_else(|| format!("{}.log", opts.node)));
        let env: Vec<(&str, &str)> = opts
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let proc = match &opts.program {
            Some(p) => Proc::start_program(p, &args, &env, log)?,
            None => Proc::start_with_env("headroom-agent", &args, &env, log)?,
        };
        Ok(Self {
            proc,
            node: opts.node,
            data_dir,
        })
    }

    /// Waits up to 30 s for this agent's node to be alive at `coordinator`.
    pub fn wait_registered(&self, coordinator: &str) {
        wait_registered(coordinator, &self.node, &self.proc);
    }

    /// The fake GPU folder the agent and its jobs share.
    pub fn fake_gpu_dir(&self) -> PathBuf {
        self.data_dir.join("fake-gpus")
    }
}

impl Agent {
    /// Processes of this agent's scope (its jobs and their supervisors, which outlive it)
    /// alive now.
    pub fn scope_pids(&self) -> Vec<u32> {
        crate::scope_pids(&self.data_dir)
    }
}

/// A finished test leaves no job behind: attempts outlive a stopped agent (on-exit =
/// detach), so their supervisors and jobs are killed with it.
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.proc.kill9();
        crate::kill_scope(&self.data_dir);
    }
}

impl Deref for Agent {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.proc
    }
}

impl DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.proc
    }
}

/// Waits up to 30 s for node `node` to be alive at `coordinator`; fails with `agent`'s output.
pub fn wait_registered(coordinator: &str, node: &str, agent: &Proc) {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(nodes) = http_get::<Vec<NodeView>>(&format!("{coordinator}/v1/nodes"))
            && nodes.iter().any(|n| n.name == node && n.alive)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "node {node} did not register:\n{}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Submits a JSON spec (the `spec` of a submit request) to the coordinator at `url`,
/// retrying for up to 20 s while it is refused (no agent registered yet).
pub fn submit_json(url: &str, spec: &serde_json::Value) -> ExperimentId {
    let body = serde_json::json!({ "spec": spec });
    wait_until("a submission", Duration::from_secs(20), || {
        let (status, answer) = http_post(&format!("{url}/v1/experiments"), &body).ok()?;
        (status == 200).then_some(())?;
        serde_json::from_value::<SubmitResponse>(answer)
            .ok()?
            .experiment
    })
}

/// The nodes the coordinator at `url` knows.
pub fn nodes_of(url: &str) -> Result<Vec<NodeView>> {
    http_get(&format!("{url}/v1/nodes"))
}

/// The jobs of an experiment.
pub fn jobs_of(url: &str, exp: ExperimentId) -> Option<Vec<JobSummary>> {
    http_get(&format!("{url}/v1/jobs?experiment={exp}")).ok()
}

/// The first job of an experiment, in detail (attempts included).
pub fn job_of(url: &str, exp: ExperimentId) -> Option<JobDetail> {
    let jobs = jobs_of(url, exp)?;
    http_get(&format!("{url}/v1/jobs/{}", jobs.first()?.id)).ok()
}

/// Waits up to 30 s for the first job of the experiment to run; the pid of its last attempt.
pub fn running_pid(url: &str, exp: ExperimentId) -> u32 {
    wait_until("the job to run", Duration::from_secs(30), || {
        let d = job_of(url, exp)?;
        (d.summary.state == JobState::Running).then_some(())?;
        d.attempts_detail.last()?.pid
    })
}
