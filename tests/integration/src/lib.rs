//! Test support for end-to-end tests: start the real `headroom` binary on a temporary data
//! directory with fake GPUs, talk to it over HTTP and through the CLI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::api::{JobDetail, JobSummary, NodeView, Progress, SubmitResponse};
use headroom_shared::{ExperimentId, JobId};
use serde::de::DeserializeOwned;

/// A binary of this workspace, built next to the executable running this code (a test in
/// `target/<profile>/deps/`, or a bench in `target/<profile>/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(name))
        .collect();
    match candidates.iter().find(|p| p.exists()) {
        Some(p) => p.clone(),
        None => panic!(
            "{name} is missing next to {}: build the binaries first (`cargo build --workspace --bins`, done by scripts/test)",
            exe.display()
        ),
    }
}

pub fn fake_job() -> PathBuf {
    binary("headroom-fake-job")
}

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
        }
    }
}

/// A running `headroom up` on its own data directory.
pub struct Headroom {
    child: Option<Child>,
    pub url: String,
    pub dir: tempfile::TempDir,
    pub opts: UpOptions,
    /// Async client driven by a small runtime per call, so tests stay synchronous.
    http: reqwest::Client,
}

impl Headroom {
    pub fn start(opts: UpOptions) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut h = Self {
            child: None,
            url: String::new(),
            dir,
            opts,
            http: reqwest::Client::new(),
        };
        h.spawn()?;
        Ok(h)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A scratch path inside the test's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&mut self) -> Result<()> {
        let mut cmd = Command::new(binary("headroom"));
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
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
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

    /// Runs the CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(binary("headroom"))
            .args(["--server", &self.url])
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

    fn block<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(fut)
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("{}{path}", self.url);
        let http = self.http.clone();
        self.block(async move {
            let resp = http.get(&url).send().await?;
            let status = resp.status();
            let text = resp.text().await?;
            if !status.is_success() {
                bail!("GET {url}: {status}: {text}");
            }
            Ok(serde_json::from_str(&text)?)
        })
    }

    /// POSTs JSON; returns the status and the JSON body, whatever the status.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value)> {
        let url = format!("{}{path}", self.url);
        let http = self.http.clone();
        let body = body.clone();
        self.block(async move {
            let resp = http.post(&url).json(&body).send().await?;
            let status = resp.status().as_u16();
            let text = resp.text().await?;
            Ok((
                status,
                serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
            ))
        })
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
        let (status, body) = self.post("/v1/experiments", &serde_json::json!({"spec": spec}))?;
        if status != 200 {
            bail!("submit refused ({status}): {body}");
        }
        Ok(serde_json::from_value(body)?)
    }

    pub fn jobs(&self, exp: ExperimentId) -> Result<Vec<JobSummary>> {
        self.get(&format!("/v1/jobs?experiment={exp}"))
    }

    pub fn job(&self, id: JobId) -> Result<JobDetail> {
        self.get(&format!("/v1/jobs/{id}"))
    }

    pub fn nodes(&self) -> Result<Vec<NodeView>> {
        self.get("/v1/nodes")
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

    /// Waits until every job of the experiment has ended (long-polls the progress counter,
    /// so waiting costs the server next to nothing).
    pub fn wait_done(&self, exp: ExperimentId, timeout: Duration) -> Vec<JobSummary> {
        let deadline = Instant::now() + timeout;
        let mut after: Option<u64> = None;
        loop {
            let path = match after {
                Some(v) => format!("/v1/progress?experiment={exp}&after={v}&timeout_ms=1000"),
                None => format!("/v1/progress?experiment={exp}"),
            };
            match self.get::<Progress>(&path) {
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
    }
}

/// Whether a process is alive (zombies count as dead).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// One line of a `headroom-fake-job --record` file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Record {
    pub event: String,
    pub job: String,
    pub gpus: String,
    pub mem_mib: u64,
    pub t_ms: i64,
}

pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad record line `{l}`")))
        .collect()
}

/// A free TCP port on the loopback, for a server that must come back on the same address.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A background process of this workspace (a coordinator or an agent on its own), its
/// stderr in a log file, killed when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn start(name: &str, args: &[String], log: PathBuf) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(binary(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self {
            child: Some(child),
            log,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow!("not running"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
