//! `headroom up` on a temporary data directory with fake GPUs (`Headroom`, started with
//! `UpOptions`): its CLI, its typed client and the waits tests build on it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::api::{
    AttemptView, JobDetail, JobSummary, NodeView, SubmitRequest, SubmitResponse,
};
use headroom_shared::client::Client;
use headroom_shared::pending::PendingReason;
use headroom_shared::routes::Method;
use headroom_shared::{ExperimentId, JobId, JobState};
use serde::de::DeserializeOwned;

use crate::process::kill_and_reap;
use crate::{KillOnDrop, binary, block_on, client_for, fake_job, kill_scope, open_to_jobs};

/// Options for `headroom up`.
#[derive(Clone, Debug)]
pub struct UpOptions {
    pub fake_gpus: String,
    pub plan: Option<String>,
    pub kill_grace: String,
    pub lease_ttl: String,
    pub node: String,
    /// More flags for `headroom up`.
    pub extra: Vec<String>,
    /// Variables added to its environment.
    pub env: Vec<(String, String)>,
    /// A file `up` inherits open on descriptor 3 (not close-on-exec), as a service manager
    /// or a careless wrapper leaves one.
    pub fd3: Option<PathBuf>,
    /// The account `up` runs as (uid, gid), where the test may choose (root).
    pub account: Option<(u32, u32)>,
    /// Its data directory (the store, the agent's files) on a memory file system.
    pub in_memory: bool,
}

impl Default for UpOptions {
    fn default() -> Self {
        Self {
            fake_gpus: "2x24GiB".into(),
            plan: None,
            kill_grace: "1s".into(),
            lease_ttl: "30s".into(),
            node: "test-node".into(),
            extra: vec![],
            env: vec![],
            fd3: None,
            account: None,
            in_memory: false,
        }
    }
}

impl UpOptions {
    /// The defaults with fake GPUs `gpus` (`2x24GiB`).
    pub fn gpus(gpus: &str) -> Self {
        Self {
            fake_gpus: gpus.into(),
            ..Default::default()
        }
    }

    pub fn plan(mut self, plan: &str) -> Self {
        self.plan = Some(plan.into());
        self
    }

    pub fn kill_grace(mut self, grace: &str) -> Self {
        self.kill_grace = grace.into();
        self
    }

    pub fn lease_ttl(mut self, ttl: &str) -> Self {
        self.lease_ttl = ttl.into();
        self
    }

    /// More flags (`--verify-timeout 1s`).
    pub fn flags(mut self, flags: &[&str]) -> Self {
        self.extra.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// A variable in its environment.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// `up` inherits `file` open on descriptor 3.
    pub fn fd3(mut self, file: &Path) -> Self {
        self.fd3 = Some(file.to_path_buf());
        self
    }

    /// The data directory on a memory file system (`/dev/shm`): for a test of timing that a
    /// loaded disk beside it must not decide (a commit that waits 400 ms on `fsync`).
    pub fn in_memory(mut self) -> Self {
        self.in_memory = true;
        self
    }

    /// `up` runs as this account rather than the test's.
    pub fn account(mut self, user: &nix::unistd::User) -> Self {
        self.account = Some((user.uid.as_raw(), user.gid.as_raw()));
        self
    }
}

/// A running `headroom up` on its own data directory.
pub struct Headroom {
    child: Option<Child>,
    pub url: String,
    pub dir: tempfile::TempDir,
    pub opts: UpOptions,
}

impl Headroom {
    pub fn start(opts: UpOptions) -> Result<Self> {
        let shm = Path::new("/dev/shm");
        let dir = if opts.in_memory && shm.is_dir() {
            tempfile::tempdir_in(shm)?
        } else {
            if opts.in_memory {
                assert!(
                    !crate::premises::ci(),
                    "CI=true, but this machine has no /dev/shm for a test that keeps its data \
                     in memory"
                );
                eprintln!("no /dev/shm: this test's data directory is on the disk");
            }
            tempfile::tempdir()?
        };
        open_to_jobs(dir.path())?;
        let mut h = Self {
            child: None,
            url: String::new(),
            dir,
            opts,
        };
        h.spawn()?;
        Ok(h)
    }

    /// `start`, failing the test if it does not come up.
    pub fn up(opts: UpOptions) -> Self {
        Self::start(opts).unwrap_or_else(|e| panic!("headroom up: {e:#}"))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A scratch path inside the test's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&mut self) -> Result<()> {
        let mut cmd = match &self.opts.fd3 {
            // The shell opens it on descriptor 3, then becomes `headroom` (the same pid).
            Some(file) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", r#"exec "$0" "$@" 3<"$HR_TEST_FD3""#])
                    .arg(binary("headroom"))
                    .env("HR_TEST_FD3", file);
                sh
            }
            None => Command::new(binary("headroom")),
        };
        cmd.arg("up")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--gpu-backend", "fake"])
            .args(["--fake-gpus", &self.opts.fake_gpus])
            .args(["--kill-grace", &self.opts.kill_grace])
            .args(["--lease-ttl", &self.opts.lease_ttl])
            .args(["--node", &self.opts.node]);
        if let Some(p) = &self.opts.plan {
            cmd.args(["--plan", p]);
        }
        cmd.args(&self.opts.extra);
        // The token `up` leaves for this account's CLI goes under the test's own directory,
        // not the home of whoever runs the suite (a test that kills `up` leaves it there).
        cmd.env("HOME", self.dir.path().join("home"));
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        if let Some((uid, gid)) = self.opts.account {
            use std::os::unix::process::CommandExt;
            // std drops root's supplementary groups with the change of user.
            cmd.uid(uid).gid(gid);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("headroom-up.log"))?;
        cmd.stdout(Stdio::piped()).stderr(log).stdin(Stdio::null());
        let mut child = cmd.spawn().context("starting headroom up")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let url = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let _ = tx.send(url);
                }
            }
        });
        self.child = Some(child);
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => {
                self.url = url;
                Ok(())
            }
            Err(_) => bail!("headroom up did not start:\n{}", self.server_log()),
        }
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("headroom-up.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` the whole `headroom up` process.
    pub fn kill9(&mut self) -> Result<()> {
        kill_and_reap(&mut self.child)
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let mut c = self.child.take().ok_or_else(|| anyhow!("not running"))?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                c.kill()?;
                bail!("headroom up did not stop within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts again on the same data directory.
    pub fn restart(&mut self) -> Result<()> {
        self.spawn()
    }

    /// The admin token of this server: the one given in its environment, else the one
    /// `headroom up` made in its data directory.
    pub fn admin_token(&self) -> Option<String> {
        self.opts
            .env
            .iter()
            .find(|(k, _)| k == "HEADROOM_ADMIN_TOKEN")
            .map(|(_, v)| v.clone())
            .or_else(|| {
                std::fs::read_to_string(self.data_dir().join("admin-token"))
                    .ok()
                    .map(|t| t.trim().to_string())
            })
    }

    /// Runs the CLI against this server, as its admin.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_in(None, &[], args)
    }

    /// Runs the CLI against this server as its admin, from `dir` (the test's own directory
    /// when `None`) with `env` added, as a person in their project would.
    pub fn cli_in(&self, dir: Option<&Path>, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut cmd = Command::new(binary("headroom"));
        cmd.current_dir(dir.unwrap_or(self.dir.path()))
            .envs(env.iter().copied());
        if let Some(t) = self.admin_token() {
            cmd.env("HEADROOM_TOKEN", t);
        }
        cmd.args(["--server", &self.url])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running headroom {args:?}: {e}"))
    }

    /// Runs the CLI and returns stdout, failing on a non-zero exit.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "headroom {args:?} failed ({}):\nstdout: {}\nstderr: {}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.server_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The typed client of this server, as its admin.
    pub fn client(&self) -> Result<Client> {
        match self.admin_token() {
            Some(t) => Ok(client_for(&self.url)?.with_token(Some(&t))?),
            None => client_for(&self.url),
        }
    }

    /// Runs a call of the typed client, e.g. `h.api(|c| async move { c.nodes().await })`.
    pub fn api<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, headroom_shared::client::ClientError>>,
    {
        let c = self.client()?;
        Ok(block_on(call(c))??)
    }

    /// GETs a JSON document by path, failing on a non-2xx answer.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let c = self.client()?;
        let (status, body) = block_on(c.raw(Method::Get, path, None))??;
        if !(200..300).contains(&status) {
            bail!("GET {path}: {status}: {body}");
        }
        Ok(serde_json::from_value(body)?)
    }

    /// POSTs JSON; returns the status and the JSON body, whatever the status.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value)> {
        let c = self.client()?;
        Ok(block_on(c.raw(Method::Post, path, Some(body)))??)
    }

    /// Writes a spec file and submits it through the CLI.
    pub fn submit(&self, name: &str, yaml: &str) -> Result<ExperimentId> {
        let path = self.path(name);
        std::fs::write(&path, yaml)?;
        let out = self.cli_ok(&["submit", path.to_str().unwrap_or_default()]);
        let id = out
            .split('(')
            .nth(1)
            .and_then(|s| s.split(')').next())
            .ok_or_else(|| anyhow!("no experiment id in `{out}`"))?;
        Ok(id.parse()?)
    }

    pub fn submit_api(&self, spec: serde_json::Value) -> Result<SubmitResponse> {
        let req = SubmitRequest {
            spec,
            seed: None,
            dry_run: false,
            ..Default::default()
        };
        self.api(|c| async move { c.submit(&req).await })
            .context("submit refused")
    }

    /// Submits a JSON spec through the API, failing the test if it is refused or not stored.
    pub fn submit_spec(&self, spec: serde_json::Value) -> ExperimentId {
        self.submit_api(spec)
            .expect("submit")
            .experiment
            .expect("stored")
    }

    /// The folder of the fake GPUs the local agent and its jobs share.
    pub fn fake_gpu_dir(&self) -> PathBuf {
        self.data_dir().join("fake-gpus")
    }

    /// A fake job started outside headroom on GPU 0 of a node of `gpus` (`1x24GiB`), with
    /// `args` (`--mem 20GiB --seconds 600`): someone's notebook.
    pub fn foreign_job(&self, gpus: &str, args: &[&str]) -> KillOnDrop {
        KillOnDrop(
            Command::new(fake_job())
                .args(args)
                .env("HEADROOM_FAKE_GPU_DIR", self.fake_gpu_dir())
                .env("HEADROOM_FAKE_GPUS", gpus)
                .env("CUDA_VISIBLE_DEVICES", "0")
                .stdout(Stdio::null())
                .spawn()
                .expect("foreign process"),
        )
    }

    /// Waits up to 30 s for the local agent's node to be alive.
    pub fn wait_agent(&self) {
        self.wait_for("the agent", Duration::from_secs(30), || {
            Ok(self.nodes()?.iter().any(|n| n.alive).then_some(()))
        });
    }

    /// The first attempt of a job.
    pub fn first_attempt(&self, id: JobId) -> AttemptView {
        let mut d = self.job(id).expect("job");
        assert!(!d.attempts_detail.is_empty(), "{id} has no attempt");
        d.attempts_detail.swap_remove(0)
    }

    pub fn jobs(&self, exp: ExperimentId) -> Result<Vec<JobSummary>> {
        self.api(|c| async move { c.jobs(Some(exp), None).await })
    }

    pub fn job(&self, id: JobId) -> Result<JobDetail> {
        self.api(|c| async move { c.job(id).await })
    }

    pub fn nodes(&self) -> Result<Vec<NodeView>> {
        self.api(|c| async move { c.nodes().await })
    }

    /// Polls `check` until it returns `Some`, failing with the server log after `timeout`.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<Option<T>>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            match check() {
                Ok(Some(v)) => return v,
                Ok(None) => {}
                Err(e) => eprintln!("while waiting for {what}: {e:#}"),
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}\nserver log:\n{}",
                    self.server_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until a claim has looked at the experiment's first job and left it queued, and
    /// returns why (its pending reason): the event a "nothing was placed" check waits for,
    /// instead of a guess at how long placement takes. A job placed and run never comes
    /// back to this, and the wait times out.
    pub fn wait_refused(&self, exp: ExperimentId, timeout: Duration) -> PendingReason {
        self.wait_for("a claim to look at the job and leave it", timeout, || {
            let job = self.jobs(exp)?.into_iter().next();
            Ok(job
                .filter(|j| j.state == JobState::Queued)
                .and_then(|j| j.pending_reason)
                .filter(|r| *r != PendingReason::NotConsidered))
        })
    }

    /// Waits until every job of the experiment has ended (long-polls the progress counter,
    /// so waiting costs the server next to nothing).
    pub fn wait_done(&self, exp: ExperimentId, timeout: Duration) -> Vec<JobSummary> {
        let deadline = Instant::now() + timeout;
        let mut after: Option<u64> = None;
        loop {
            let wait = Duration::from_secs(1);
            match self.api(|c| async move { c.progress_within(Some(exp), after, wait).await }) {
                Ok(p) if p.counts.finished() == p.counts.total() => break,
                Ok(p) => after = Some(p.version),
                Err(e) => eprintln!("while waiting for {exp}: {e:#}"),
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for experiment {exp}\nserver log:\n{}",
                    self.server_log()
                );
            }
        }
        self.jobs(exp)
            .unwrap_or_else(|e| panic!("listing jobs: {e:#}"))
    }
}

impl Drop for Headroom {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
        // Attempts of a `headroom up` killed with `kill -9` outlive it under their
        // supervisors: a finished test leaves none behind.
        kill_scope(&self.data_dir().join("agent"));
    }
}
