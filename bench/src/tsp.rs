//! task-spooler (`tsp`), the baseline: a server of its own (own socket, own temporary
//! directory for its outputs), driven the way its users drive it, one `tsp` client per job.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cpugroup::CpuGroup;
use crate::system::run_ok;

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
    /// Where its server, and the clients [`TaskSpooler::submit_many`] starts (each runs its
    /// job), are counted.
    pub group: Option<CpuGroup>,
}

impl TaskSpooler {
    pub fn start(slots: usize) -> Result<Self> {
        Self::start_with(slots, None)
    }

    /// [`TaskSpooler::start`] with its CPU counted (where a `cpuacct` group can be made).
    pub fn start_counted(slots: usize) -> Result<Self> {
        Self::start_with(slots, CpuGroup::create("tsp"))
    }

    fn start_with(slots: usize, group: Option<CpuGroup>) -> Result<Self> {
        let tsp = ensure_installed()?;
        let dir = tempfile::Builder::new().prefix("hr-tsp").tempdir()?;
        let t = Self { tsp, dir, group };
        // The first call starts the server: inside the group, where there is one.
        let slots = slots.to_string();
        let mut first = t.in_group(&["-S", &slots]);
        run_ok(
            first.stdout(Stdio::null()).stderr(Stdio::null()),
            &format!("tsp -S {slots}"),
        )?;
        Ok(t)
    }

    /// `sh -c SCRIPT tsp ARGS...` inside the group (plain `sh` without one).
    fn in_group_script(&self, script: &str, args: &[&str]) -> Command {
        let mut argv = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let mut c = match &self.group {
            Some(g) => g.command("/bin/sh", &argv),
            None => {
                let mut c = Command::new("/bin/sh");
                c.args(&argv);
                c
            }
        };
        self.env(&mut c);
        c
    }

    fn in_group(&self, args: &[&str]) -> Command {
        let tsp = self.tsp.display().to_string();
        let mut all = vec![tsp.as_str()];
        all.extend_from_slice(args);
        self.in_group_script(r#"exec "$@""#, &all)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.tsp);
        c.args(args);
        self.env(&mut c);
        c
    }

    fn env(&self, c: &mut Command) {
        c.env("TS_SOCKET", self.dir.path().join("socket"))
            .env("TMPDIR", self.dir.path())
            // Every job of a run stays listed, so the end is seen from the list.
            .env("TS_MAXFINISHED", "1000000")
            .env_remove("TS_SAVELIST")
            .stdin(Stdio::null());
    }

    /// Queues `argv` `n` times the way its users do, a shell loop of `tsp` calls: in the
    /// group, so the clients (each runs its job) are counted.
    pub fn submit_many(&self, argv: &[&str], n: usize) -> Result<()> {
        let out = std::fs::File::create(self.dir.path().join("ids"))?;
        let tsp = self.tsp.display().to_string();
        let n = n.to_string();
        let mut args = vec![n.as_str(), tsp.as_str()];
        args.extend_from_slice(argv);
        let mut looped = self.in_group_script(
            r#"n=$1; shift; i=0; while [ $i -lt $n ]; do "$@" || exit 1; i=$((i+1)); done"#,
            &args,
        );
        run_ok(
            looped.stdout(out).stderr(Stdio::null()),
            &format!("a loop of tsp {argv:?}"),
        )
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
        run_ok(
            self.command(argv).stdout(out).stderr(Stdio::null()),
            &format!("tsp {argv:?}"),
        )
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
