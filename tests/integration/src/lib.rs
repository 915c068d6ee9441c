//! Test support for end-to-end tests: start the real `headroom` binary on a temporary data
//! directory with fake GPUs, talk to it over HTTP and through the CLI. The one place tests
//! share their setup: `standalone` starts a coordinator and agents as separate binaries,
//! `records` reads what fake jobs recorded, `prom` parses Prometheus pages with a real parser,
//! `postgres` starts a throwaway cluster, `link` is a connection a test can cut, `tls` a TLS
//! front as a lab's proxy puts one before a coordinator.

mod link;
mod postgres;
pub mod prom;
pub mod records;
pub mod standalone;
mod tables;
pub mod tls;

pub use link::Link;
pub use postgres::Postgres;
pub use tables::csv_table;

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

/// The runtime every synchronous helper drives the typed client on: one for the process,
/// so the client's pooled connections outlive a single call.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("test-http")
        .enable_all()
        .build()?;
    Ok(RT.get_or_init(|| rt))
}

/// Runs a future of the typed client to completion from synchronous test code.
pub fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T> {
    Ok(runtime()?.block_on(fut))
}

/// The typed client of the coordinator serving `url` (one per coordinator, shared).
pub fn client_for(url: &str) -> Result<Client> {
    static CLIENTS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, Client>>,
    > = std::sync::OnceLock::new();
    let base = base_of(url).to_string();
    let mut map = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("client cache poisoned"))?;
    if let Some(c) = map.get(&base) {
        return Ok(c.clone());
    }
    let c = Client::new(&base)?;
    map.insert(base, c.clone());
    Ok(c)
}

/// `http://host:port` of a URL.
fn base_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

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

/// Runs a binary of this workspace to its end with stdin closed: its exit status and stderr.
pub fn run_binary(name: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = Command::new(binary(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    /// Variables added to its environment.
    pub env: Vec<(String, String)>,
    /// A file `up` inherits open on descriptor 3 (not close-on-exec), as a service manager
    /// or a careless wrapper leaves one.
    pub fd3: Option<PathBuf>,
    /// The account `up` runs as (uid, gid), where the test may choose (root).
    pub account: Option<(u32, u32)>,
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
        let dir = tempfile::tempdir()?;
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
        let mut cmd = Command::new(binary("headroom"));
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

/// Live processes carrying the scope marker of the agent whose data directory is
/// `data_dir` (`HEADROOM_AGENT_DIR`): its jobs and their supervisor processes.
pub fn scope_pids(data_dir: &Path) -> Vec<u32> {
    let scope = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let marker = format!("HEADROOM_AGENT_DIR={}", scope.display());
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == marker.as_bytes()))
                && alive(pid)
        })
        .collect()
}

/// SIGKILLs the attempt supervisor processes of the agent whose data directory is
/// `data_dir` (as a crash of the whole node's service would), leaving their jobs' orphans;
/// returns how many of them were running a job (the one waiting for the next lease is
/// killed too, and not counted).
pub fn kill_supervisors(data_dir: &Path) -> usize {
    let scope = scope_pids(data_dir);
    let supervisors = supervisor_pids(data_dir);
    let parents: Vec<u32> = scope.iter().filter_map(|&pid| parent_of(pid)).collect();
    for &pid in &supervisors {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    supervisors.iter().filter(|p| parents.contains(p)).count()
}

/// The attempt supervisor processes of the agent whose data directory is `data_dir`, the one
/// waiting for the next lease included.
pub fn supervisor_pids(data_dir: &Path) -> Vec<u32> {
    scope_pids(data_dir)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"__headroom-attempt"))
        })
        .collect()
}

/// Whether `pid` is an attempt supervisor waiting for a lease (named `hr-standby`): it runs
/// nothing and leaves with its agent.
pub fn is_waiting_supervisor(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "hr-standby")
}

/// The live processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(pid) && alive(p))
        .collect()
}

/// The fields of `/proc/PID/stat` after the command (which may hold spaces and
/// parentheses): state is 0, ppid 1, utime 11, stime 12, cutime 13, cstime 14.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    )
}

/// The parent pid of a live process.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// SIGKILLs every process of that agent's scope (see [`scope_pids`]), scanning again until
/// none is left (bounded).
pub fn kill_scope(data_dir: &Path) {
    for _ in 0..20 {
        let pids = scope_pids(data_dir);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kill -9` a child we hold, if any, and reap it.
fn kill_and_reap(child: &mut Option<Child>) -> Result<()> {
    if let Some(mut c) = child.take() {
        c.kill()?;
        c.wait()?;
    }
    Ok(())
}

/// Whether a process is alive (zombies count as dead).
pub fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|state| state != "Z"))
}

/// One line of a `headroom-fake-job --record` file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Record {
    pub event: String,
    pub job: String,
    #[serde(default)]
    pub attempt: String,
    #[serde(default)]
    pub pid: u32,
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
        Self::start_with_env(name, args, &[], log)
    }

    /// `start` with extra environment variables (`HEADROOM_*` settings).
    pub fn start_with_env(
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        Self::start_program(&binary(name), args, env, log)
    }

    /// [`Proc::start_with_env`] of the program at `program` (a copy of a binary elsewhere).
    pub fn start_program(
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        let name = program.display();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
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
        kill_and_reap(&mut self.child)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow!("not running"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` and waits up to `timeout` for the exit, failing with the output if it
    /// is still running.
    pub fn stop_with(
        &mut self,
        sig: nix::sys::signal::Signal,
        timeout: Duration,
    ) -> std::process::ExitStatus {
        if let Err(e) = self.signal(sig) {
            panic!("sending {sig}: {e:#}\n{}", self.output());
        }
        match self.wait_exit(timeout) {
            Ok(Some(status)) => status,
            Ok(None) => panic!(
                "{sig} did not stop it within {timeout:?}:\n{}",
                self.output()
            ),
            Err(e) => panic!("waiting for the exit: {e:#}\n{}", self.output()),
        }
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let c = self.child.as_mut().ok_or_else(|| anyhow!("not running"))?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait()? {
                self.child = None;
                return Ok(Some(st));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// GET a JSON document by full URL, failing on a non-2xx answer.
pub fn http_get<T: DeserializeOwned>(url: &str) -> Result<T> {
    let c = client_for(url)?;
    let path = &url[base_of(url).len()..];
    let (status, body) = block_on(c.raw(Method::Get, path, None))??;
    if !(200..300).contains(&status) {
        bail!("GET {url}: {status}: {body}");
    }
    Ok(serde_json::from_value(body)?)
}

/// POST JSON; the status and body whatever the status.
pub fn http_post(url: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value)> {
    let c = client_for(url)?;
    let path = &url[base_of(url).len()..];
    Ok(block_on(c.raw(Method::Post, path, Some(body)))??)
}

/// POST a text body by full URL; the status and the answer's text whatever the status.
pub fn http_post_text(url: &str, body: &str) -> Result<(u16, String)> {
    text_request(reqwest::Method::POST, url, Some(body.to_string()))
}

/// GET by full URL; the status and the answer's text whatever the status (for answers that
/// are not JSON, such as a log).
pub fn http_get_text(url: &str) -> Result<(u16, String)> {
    text_request(reqwest::Method::GET, url, None)
}

fn text_request(method: reqwest::Method, url: &str, body: Option<String>) -> Result<(u16, String)> {
    static HTTP: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let http = HTTP
        .get_or_init(|| {
            headroom_shared::client::http_builder()
                .build()
                .expect("an HTTP client")
        })
        .clone();
    let mut req = http
        .request(method.clone(), url)
        .timeout(Duration::from_secs(30));
    if let Some(body) = body {
        req = req.body(body);
    }
    block_on(async move {
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    })?
}

/// Polls `f` until it returns `Some`, panicking after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process of another owner (a `sleep`), alive until dropped: something a job can leave
/// memory booked for, which cleanup cannot kill and so cannot verify gone.
pub fn bystander() -> KillOnDrop {
    KillOnDrop(Command::new("sleep").arg("600").spawn().expect("sleep"))
}

/// The command of a job that books 3 GiB on its GPU 0 for process `pid` as it exits (a
/// leftover in the fake GPU folder the agent gives its jobs).
pub fn books_for(pid: u32) -> serde_json::Value {
    serde_json::json!([
        "sh",
        "-c",
        format!("echo 0:3072 > \"$HEADROOM_FAKE_GPU_DIR/{pid}\"")
    ])
}

/// A child process killed when the test lets go of it, passing or failing.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP relay that can black-hole the link: sockets stay open and new connections are
/// accepted, but no byte is forwarded either way (a partition that drops packets, where
/// nothing fails fast; unlike [`Link::cut`], which closes sockets).
pub struct DroppingLink {
    pub port: u16,
    dropping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl DroppingLink {
    pub fn new(target: u16) -> Result<Self> {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let dropping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = dropping.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let d = d.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if !d.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err()
                                    {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self { port, dropping })
    }

    /// From now on every byte either way is dropped; sockets stay open.
    pub fn drop_packets(&self) {
        self.dropping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.dropping
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether the suite runs as CI (`CI=true`): there, what a test needs of the machine (root,
/// cgroup v2) is a premise, and its absence fails the test rather than skipping its cases.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Under CI, fails the test: the machine lacks `what` the suite's cases need. Elsewhere,
/// says which cases are skipped.
pub fn premise_missing(what: &str) {
    premise_missing_under(ci(), what);
}

fn premise_missing_under(ci: bool, what: &str) {
    assert!(
        !ci,
        "CI=true, but this machine lacks {what}: its cases would pass without running"
    );
    eprintln!("{what} missing: its cases are skipped");
}

/// A second local Unix user for tests of what another account can do, made when missing;
/// `None` when this process cannot make one (not root): the caller skips those cases (under
/// CI, the test fails instead).
pub fn other_user() -> Option<nix::unistd::User> {
    const NAME: &str = "headroom-test-other";
    if !nix::unistd::geteuid().is_root() {
        premise_missing("root (to make a second Unix user)");
        return None;
    }
    if nix::unistd::User::from_name(NAME).ok().flatten().is_none() {
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                NAME,
            ])
            .status();
    }
    let user = nix::unistd::User::from_name(NAME).ok().flatten();
    assert!(user.is_some(), "cannot make the test user {NAME}");
    user
}

/// Lets jobs write into a test's directory: an agent running as root (CI) runs them as
/// another user (`--run-as-default`, `nobody`), and tests give them paths in it.
pub fn open_to_jobs(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::premise_missing_under;

    #[test]
    #[should_panic(expected = "CI=true, but this machine lacks root")]
    fn under_ci_a_missing_premise_fails_the_test() {
        premise_missing_under(true, "root");
    }

    #[test]
    fn elsewhere_a_missing_premise_skips_its_cases() {
        premise_missing_under(false, "root");
    }
}
