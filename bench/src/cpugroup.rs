//! A CPU-accounting cgroup around everything one side of a comparison starts (servers,
//! clients, daemons, supervisors and jobs alike), so CPU per job counts processes that
//! detach from the bench (task-spooler's) as well as those that stay its children.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

/// A cgroup of its own in the v1 `cpuacct` hierarchy (hierarchical: it counts every
/// descendant); removed when dropped.
pub struct CpuGroup {
    dir: PathBuf,
}

const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

impl CpuGroup {
    /// `None` where the host has no v1 `cpuacct` hierarchy or this user may not make one:
    /// the figure is then reported as not measured, never as zero.
    pub fn create(name: &str) -> Option<Self> {
        let root = PathBuf::from(CPUACCT);
        if !root.join("cpuacct.usage").exists() {
            return None;
        }
        remove_stale(&root);
        // Numbered: groups of one process (tests on threads of one binary) never share.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("headroom-bench-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Self { dir })
    }

    /// `program args...` started inside this group: a shell joins it, then execs.
    pub fn command(&self, program: &str, args: &[String]) -> Command {
        let (sh, argv) = self.wrap(program, args);
        let mut c = Command::new(sh);
        c.args(argv);
        c
    }

    /// The shell line of [`CpuGroup::command`], for a `Proc` that takes a program and argv.
    pub fn wrap(&self, program: &str, args: &[String]) -> (String, Vec<String>) {
        let mut argv = vec![
            "-c".to_string(),
            r#"echo $$ > "$0/cgroup.procs" && exec "$@""#.to_string(),
            self.dir.display().to_string(),
            program.to_string(),
        ];
        argv.extend(args.iter().cloned());
        ("/bin/sh".to_string(), argv)
    }

    /// CPU time of every process that ran in the group so far, in ms.
    pub fn usage_ms(&self) -> Result<f64> {
        let p = self.dir.join("cpuacct.usage");
        let ns: f64 = std::fs::read_to_string(&p)
            .with_context(|| format!("reading {}", p.display()))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {}", p.display()))?;
        Ok(ns / 1e6)
    }

    /// Pids still in the group.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills what is left (SIGKILL), then waits up to 5 s for the group to empty.
    pub fn kill_all(&self) -> Result<()> {
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        bail!(
            "processes left in {}: {:?}",
            self.dir.display(),
            self.pids()
        )
    }
}

/// Groups of benches that were killed (no `Drop` ran): their processes killed, their
/// directories removed.
fn remove_stale(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("headroom-bench-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let stale = CpuGroup { dir: e.path() };
        drop(stale);
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        let _ = self.kill_all();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
