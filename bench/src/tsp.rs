//! task-spooler (`tsp`), the baseline: a server of its own (own socket, own temporary
//! directory for its outputs), driven the way its users drive it, one `tsp` client per job.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cpugroup::CpuGroup;

/// `tsp`'s path; installs Debian's `task-spooler` when it is missing and this is root.
pub fn ensure_installed() -> Result<PathBuf> {
    let found = || {
        ["/usr/bin/tsp", "/usr/local/bin/tsp"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
    };
    if let Some(p) = found() {
        return Ok(p);
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("task-spooler (`tsp`) is missing: install Debian's `task-spooler`, or run as root");
    }
    eprintln!("installing task-spooler (apt-get)...");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-qq", "task-spooler"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .status()
        .context("running apt-get")?
        .success();
    match found() {
        Some(p) if ok => Ok(p),
        _ => bail!("could not install task-spooler (apt-get install task-spooler)"),
    }
}

/// One task-spooler server with `slots` slots; killed (`tsp -K`) with its jobs when dropped.
pub struct TaskSpooler {
    tsp: PathBuf,
    dir: tempfile::TempDir,
    pub group: Option<CpuGroup>,
}

impl TaskSpooler {
    pub fn start(slots: usize) -> Result<Self> {
        let tsp = ensure_installed()?;
        let dir = tempfile::Builder::new().prefix("hr-tsp").tempdir()?;
        let t = Self {
            tsp,
            dir,
            group: CpuGroup::create("tsp"),
        };
        t.run(&["-S", &slots.to_string()])?;
        Ok(t)
    }

    fn command(&self, args: &[&str]) -> Command {
        let program = self.tsp.display().to_string();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut c = match &self.group {
            Some(g) => g.command(&program, &args),
            None => {
                let mut c = Command::new(&program);
                c.args(&args);
                c
            }
        };
        c.env("TS_SOCKET", self.dir.path().join("socket"))
            .env("TMPDIR", self.dir.path())
            // Every job of a run stays listed, so the end is seen from the list.
            .env("TS_MAXFINISHED", "1000000")
            .env_remove("TS_SAVELIST")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command(args)
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("tsp {args:?}"))?;
        if !out.status.success() {
            bail!("tsp {args:?} failed: {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Queues `argv` (the client returns once queued; a background client of its own runs
    /// the job).
    pub fn submit(&self, argv: &[&str]) -> Result<()> {
        // The background client keeps the client's stdout: a file, not a pipe to wait on.
        let out = std::fs::File::create(self.dir.path().join("last-id"))?;
        let st = self
            .command(argv)
            .stdout(out)
            .stderr(Stdio::null())
            .status()
            .context("tsp")?;
        if !st.success() {
            bail!("tsp {argv:?} failed: {st}");
        }
        Ok(())
    }

    /// Fills every slot with a job that waits, without spinning, until the gate is opened
    /// (each takes a shared lock on a file the bench holds exclusively).
    pub fn block(&self, slots: usize) -> Result<Gate> {
        let path = self.dir.path().join("gate");
        let file = std::fs::File::create(&path)?;
        file.lock()?;
        let p = path.display().to_string();
        for _ in 0..slots {
            self.submit(&["flock", "-s", &p, "true"])?;
        }
        Ok(Gate(file))
    }

    /// (queued, running, finished) from `tsp -l`.
    pub fn counts(&self) -> Result<(usize, usize, usize)> {
        let list = self.run(&["-l"])?;
        let mut c = (0, 0, 0);
        for l in list.lines().skip(1) {
            match l.split_whitespace().nth(1) {
                Some("queued") => c.0 += 1,
                Some("running") => c.1 += 1,
                Some("finished") => c.2 += 1,
                _ => {}
            }
        }
        Ok(c)
    }

    /// Waits until `total` jobs have finished and none is queued or running.
    pub fn wait_finished(&self, total: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (q, r, f) = self.counts()?;
            if q == 0 && r == 0 && f >= total {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "task-spooler: {q} queued, {r} running, {f} of {total} finished after {timeout:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn cpu_ms(&self) -> Option<f64> {
        self.group.as_ref().and_then(|g| g.usage_ms().ok())
    }
}

impl Drop for TaskSpooler {
    fn drop(&mut self) {
        let _ = self.run(&["-K"]);
        if let Some(g) = &self.group {
            let _ = g.kill_all();
        }
    }
}

/// Slots held by [`TaskSpooler::block`]; dropping it opens them.
pub struct Gate(std::fs::File);

impl Gate {
    pub fn open(self) -> Result<()> {
        self.0.unlock()?;
        Ok(())
    }
}
