//! Per-attempt cgroups (v2): every process of an attempt lives in a cgroup of its own, so
//! membership (not an environment marker a job may clear or forge) says what belongs to it,
//! `cgroup.kill` ends it whole, `cgroup.events` says when it is empty, and `memory.peak`
//! (or, on hosts whose memory controller is still v1, `memory.max_usage_in_bytes`) gives its
//! host RAM peak.
//!
//! The agent sets up `headroom-<scope hash>` under its own cgroup at start (root, or a
//! delegated subtree under systemd or in a container) and says so; where it cannot, it says
//! why and attempts are tracked by marker and process tree instead ([`Cgroups::setup`]).
//! Each supervisor creates its attempt's cgroup, and the job is born in it ([`Join`]), or
//! joins it between fork and exec, before it can start anything. Blocking (file I/O): async callers use
//! `spawn_blocking`.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use headroom_shared::AttemptId;
use serde::{Deserialize, Serialize};

/// Where this agent's attempt cgroups live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroups {
    /// The v2 directory holding one directory per attempt.
    pub parent: PathBuf,
    /// `parent` as `/proc/<pid>/cgroup` names it (from the hierarchy's root).
    pub relative: String,
    /// Attempt cgroups have `memory.peak` (the memory controller is enabled for them).
    pub memory_peak: bool,
    /// Where memory is still a v1 controller: the directory holding one memory cgroup per
    /// attempt, for `memory.max_usage_in_bytes`.
    pub memory_v1: Option<PathBuf>,
}

/// The prefix of the directory of one agent's attempts: `headroom-<hash of its scope>`.
fn dir_name(scope: &str) -> String {
    format!("headroom-{}", crate::scope_hash(scope))
}

/// A mount of `fstype` (with `option` among its super options, for v1) from mountinfo.
fn mount_of(mountinfo: &str, fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (ty, _source, supers) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        if ty != fstype || option.is_some_and(|o| !supers.split(',').any(|s| s == o)) {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Whether the v2 hierarchy is mounted with `favordynmods` (`None`: no v2 hierarchy). Without
/// it, moving a process into a cgroup waits for an RCU grace period once the host has been
/// quiet for a moment: 5-15 ms at each job start on an idle node, where a job that cannot be
/// born in its attempt's cgroup ([`Join`]) is moved into it. Set at boot
/// (`cgroup_favordynmods=true`) or by remounting.
pub fn favors_dynmods(mountinfo: &str) -> Option<bool> {
    mountinfo.lines().find_map(|line| {
        let (_, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (ty, _source, supers) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        (ty == "cgroup2").then(|| supers.split(',').any(|o| o == "favordynmods"))
    })
}

/// What a host without `favordynmods` should be told (the mount is named).
pub fn dynmods_advice(mount: &Path) -> String {
    format!(
        "cgroup v2 at {} is not mounted with favordynmods: a job start may wait for an RCU \
         grace period (5-15 ms on an idle node) to join its attempt's cgroup; \
         `mount -o remount,favordynmods {}` (or the kernel parameter \
         `cgroup_favordynmods=true`) cuts that to well under a millisecond",
        mount.display(),
        mount.display()
    )
}

/// Whether a kernel release (`6.1.0-13-amd64`) is at least `(major, minor)`.
pub(crate) fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut v = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= want
}

/// Whether a kernel release has `favordynmods` (Linux 6.0 and later).
fn has_favordynmods(release: &str) -> bool {
    kernel_at_least(release, (6, 0))
}

/// The v2 mount and whether it favors dynamic modifications, from this process's mountinfo;
/// `None` also where the kernel has no such option (before 6.0).
pub fn dynmods() -> Option<(PathBuf, bool)> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    if !has_favordynmods(release.trim()) {
        return None;
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some((
        mount_of(&mountinfo, "cgroup2", None)?,
        favors_dynmods(&mountinfo)?,
    ))
}

/// This process's cgroup in the v2 hierarchy (`0::<path>`), or in the v1 hierarchy of
/// `controller`.
fn own_path(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            None => id == "0" && controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        matches.then(|| path.to_string())
    })
}

fn join(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

impl Cgroups {
    /// Sets up the directory of `scope`'s attempts under this process's own cgroup, or says
    /// why cgroups cannot be used here.
    pub fn setup(scope: &str) -> Result<Self, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let proc_cgroup = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let mount = mount_of(&mountinfo, "cgroup2", None)
            .ok_or_else(|| "no cgroup v2 hierarchy is mounted".to_string())?;
        let own = own_path(&proc_cgroup, None)
            .ok_or_else(|| "this process is in no cgroup v2".to_string())?;
        let name = dir_name(scope);
        let base = join(&mount, &own);
        let parent = base.join(&name);
        match fs::create_dir(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(format!(
                    "cannot create {} ({e}): run the agent as root, or give it a delegated \
                     cgroup (systemd `Delegate=yes`)",
                    parent.display()
                ));
            }
        }
        let relative = format!("{}/{name}", own.trim_end_matches('/'));
        // memory.peak needs the memory controller enabled down to the attempts; that fails
        // where this process's own cgroup holds processes (not the root), which is fine.
        let memory_peak = controllers(&base).contains(&"memory".to_string())
            && enable_memory(&base).is_ok()
            && enable_memory(&parent).is_ok();
        let memory_v1 = if memory_peak {
            None
        } else {
            memory_v1_parent(&mountinfo, &proc_cgroup, &name)
        };
        Ok(Self {
            parent,
            relative,
            memory_peak,
            memory_v1,
        })
    }

    /// What the agent says at start.
    pub fn describe(&self) -> String {
        let peak = if self.memory_peak {
            "host RAM peak from memory.peak".to_string()
        } else if let Some(v1) = &self.memory_v1 {
            format!(
                "host RAM peak from the v1 memory controller ({})",
                v1.display()
            )
        } else {
            "no host RAM peak (no memory controller available)".to_string()
        };
        format!(
            "each attempt in its own cgroup under {} ({peak})",
            self.parent.display()
        )
    }

    pub fn attempt(&self, attempt: AttemptId) -> AttemptCgroup {
        AttemptCgroup {
            dir: self.parent.join(attempt.to_string()),
            memory_peak: self.memory_peak,
            memory_v1: self.memory_v1.as_ref().map(|p| p.join(attempt.to_string())),
        }
    }

    /// SIGKILLs the processes of every attempt cgroup here whose attempt is not in `keep`
    /// (left by an earlier run of the agent), and removes those already empty; returns what
    /// it killed, by attempt.
    pub fn kill_strays(
        &self,
        keep: &std::collections::HashSet<AttemptId>,
    ) -> std::collections::HashMap<AttemptId, Vec<u32>> {
        let mut killed = std::collections::HashMap::new();
        let Ok(entries) = fs::read_dir(&self.parent) else {
            return killed;
        };
        for entry in entries.flatten() {
            let Some(attempt) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<AttemptId>().ok())
            else {
                continue;
            };
            if keep.contains(&attempt) {
                continue;
            }
            let cg = self.attempt(attempt);
            let pids = cg.pids().unwrap_or_default();
            if !pids.is_empty() {
                if let Err(e) = cg.kill() {
                    tracing::warn!(%attempt, "cannot kill the cgroup {}: {e}", cg.dir().display());
                }
                sigkill_each(&pids);
                killed.insert(attempt, pids);
            } else {
                let _ = cg.remove();
            }
        }
        killed
    }

    /// The attempt `pid` belongs to by its cgroup; `None` for a process in no attempt's
    /// cgroup (whatever its environment says), or gone.
    pub fn attempt_of(&self, pid: u32) -> Option<AttemptId> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let path = own_path(&text, None)?;
        let rest = path.strip_prefix(&self.relative)?.strip_prefix('/')?;
        // Its own cgroup or one it made below it (a job may nest its own).
        rest.split('/').next()?.parse().ok()
    }
}

fn controllers(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|t| t.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

fn enable_memory(dir: &Path) -> io::Result<()> {
    if fs::read_to_string(dir.join("cgroup.subtree_control"))?.contains("memory") {
        return Ok(());
    }
    fs::write(dir.join("cgroup.subtree_control"), "+memory")
}

/// `name` under this process's v1 memory cgroup, created, where memory is a v1 controller.
fn memory_v1_parent(mountinfo: &str, proc_cgroup: &str, name: &str) -> Option<PathBuf> {
    let mount = mount_of(mountinfo, "cgroup", Some("memory"))?;
    let own = own_path(proc_cgroup, Some("memory"))?;
    let dir = join(&mount, &own).join(name);
    match fs::create_dir(&dir) {
        Ok(()) => Some(dir),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Some(dir),
        Err(_) => None,
    }
}

/// One attempt's cgroup (and its v1 memory cgroup, where there is one).
#[derive(Clone, Debug)]
pub struct AttemptCgroup {
    dir: PathBuf,
    memory_peak: bool,
    memory_v1: Option<PathBuf>,
}

/// How a child joins its attempt's cgroups, with no move that waits on the kernel. A
/// process moved into a cgroup (written to `cgroup.procs`) waits for an RCU grace period once
/// the host has been quiet for a moment unless the mount has `favordynmods`: 5-15 ms of every
/// job's start on an idle node. A child cloned into its cgroup (`CLONE_INTO_CGROUP`, Linux
/// 5.7) is never moved; one thread moving itself (v1 `tasks`) takes no global lock on recent
/// kernels (measured on 6.18: 1.9 ms a start where a process's move took 12.8 ms).
pub struct Join {
    /// The v2 directory the child is cloned into.
    pub dir: std::os::fd::OwnedFd,
    /// Its `cgroup.procs`, which the child writes `0` to where the kernel cannot clone into a
    /// cgroup (before 5.7, or a seccomp profile that refuses `clone3`).
    pub procs: fs::File,
    /// The v1 memory cgroup's `tasks`, where memory is still a v1 controller: the child,
    /// one thread until its exec, writes `0` to it.
    pub tasks_v1: Option<fs::File>,
}

impl AttemptCgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates it, empty (one left by an earlier run of this attempt is reused), and its
    /// agent's directory again if someone removed it meanwhile.
    pub fn create(&self) -> io::Result<()> {
        for dir in std::iter::once(&self.dir).chain(self.memory_v1.as_ref()) {
            fs::create_dir_all(dir)?;
        }
        Ok(())
    }

    /// What a child needs to join it, opened here, before the fork, so that the child only
    /// writes (or is cloned into it and writes nothing).
    pub fn join(&self) -> io::Result<Join> {
        let write = |path: PathBuf| fs::OpenOptions::new().write(true).open(path);
        Ok(Join {
            dir: fs::File::open(&self.dir)?.into(),
            procs: write(self.dir.join("cgroup.procs"))?,
            tasks_v1: self
                .memory_v1
                .as_ref()
                .map(|d| write(d.join("tasks")))
                .transpose()?,
        })
    }

    /// Its live processes (a zombie has left it), those of cgroups a job made below it
    /// included.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        let mut out = Vec::new();
        members(&self.dir, &mut out)?;
        Ok(out)
    }

    /// SIGKILLs every process in it at once (`cgroup.kill`), and, where the kernel is older
    /// than 5.14 (no such file: opening it to create it is refused), one by one.
    pub fn kill(&self) -> io::Result<()> {
        let at_once = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"));
        match at_once {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
                ) =>
            {
                sigkill_each(&self.pids()?);
                Ok(())
            }
            other => other,
        }
    }

    /// Whether it exists: an attempt started before its agent used cgroups has none.
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// The highest host memory its processes used together, in MiB, where a memory
    /// controller counts it.
    pub fn peak_mib(&self) -> Option<u64> {
        let (dir, file) = if self.memory_peak {
            (&self.dir, "memory.peak")
        } else {
            (self.memory_v1.as_ref()?, "memory.max_usage_in_bytes")
        };
        let bytes: u64 = fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(bytes.div_ceil(1024 * 1024))
    }

    /// Limits its processes' memory together to `mib` (`memory.max`, or the v1
    /// controller's `memory.limit_in_bytes`), swap left out so the limit holds; where no
    /// memory controller counts it, nothing is limited.
    pub fn limit_memory(&self, mib: u64) -> io::Result<()> {
        let bytes = mib.saturating_mul(1024 * 1024).to_string();
        if self.memory_peak {
            fs::write(self.dir.join("memory.max"), &bytes)?;
            // Absent without swap accounting: nothing to hold then.
            let _ = fs::write(self.dir.join("memory.swap.max"), "0");
        } else if let Some(v1) = &self.memory_v1 {
            fs::write(v1.join("memory.limit_in_bytes"), &bytes)?;
            let _ = fs::write(v1.join("memory.swappiness"), "0");
        }
        Ok(())
    }

    /// Whether the kernel killed one of its processes at its memory limit (`oom_kill` of
    /// `memory.events`, or of the v1 controller's `memory.oom_control`).
    pub fn oom_killed(&self) -> bool {
        let (dir, file) = if self.memory_peak {
            (&self.dir, "memory.events")
        } else {
            match self.memory_v1.as_ref() {
                Some(d) => (d, "memory.oom_control"),
                None => return false,
            }
        };
        fs::read_to_string(dir.join(file)).is_ok_and(|t| oom_kills(&t) > 0)
    }

    /// Removes it once empty (and whatever a job nested below it).
    pub fn remove(&self) -> io::Result<()> {
        for dir in std::iter::once(&self.dir).chain(self.memory_v1.as_ref()) {
            remove_tree(dir)?;
        }
        Ok(())
    }
}

/// The `oom_kill` count of a `memory.events` or `memory.oom_control` text.
fn oom_kills(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

fn sigkill_each(pids: &[u32]) {
    for &pid in pids {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(raw),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn members(dir: &Path, out: &mut Vec<u32>) -> io::Result<()> {
    out.extend(
        fs::read_to_string(dir.join("cgroup.procs"))?
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    for e in fs::read_dir(dir)?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            // One removed meanwhile holds nobody.
            match members(&e.path(), out) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

fn remove_tree(dir: &Path) -> io::Result<()> {
    // Most attempts nest nothing: one `rmdir`, without listing the cgroup's many files.
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        // A cgroup with cgroups below it is busy (a plain directory is not empty).
        Err(e)
            if e.raw_os_error().is_some_and(|n| {
                n == nix::errno::Errno::EBUSY as i32 || n == nix::errno::Errno::ENOTEMPTY as i32
            }) => {}
        other => return other,
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path())?;
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The agent's cgroups at start (`wanted`: not `--no-cgroups`), said in its log either way;
/// processes are attributed by them from then on.
pub fn for_agent(wanted: bool, scope: &str) -> Option<Cgroups> {
    let setup = if wanted {
        Cgroups::setup(scope)
    } else {
        Err("--no-cgroups".to_string())
    };
    match setup {
        Ok(c) => {
            tracing::info!("{}", c.describe());
            attribute_by(&c);
            Some(c)
        }
        Err(why) => {
            tracing::warn!(
                "per-attempt cgroups unavailable ({why}): attempts are tracked by their \
                 environment marker and process tree, and a job that clears its environment \
                 reads as foreign on its GPUs"
            );
            None
        }
    }
}

/// Removes the agent's directories of attempt cgroups when dropped (the agent exits), where
/// nothing is left in them: attempts left running keep theirs, and the next agent on the
/// data directory finds them.
pub struct Tidy(pub Option<Cgroups>);

impl Drop for Tidy {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            for dir in std::iter::once(&c.parent).chain(c.memory_v1.as_ref()) {
                // Refused while an attempt's cgroup is in it: that is the point.
                let _ = fs::remove_dir(dir);
            }
        }
    }
}

/// How this process tells which attempt a process belongs to: by cgroup once
/// [`attribute_by`] was called, else by the environment marker.
static ATTRIBUTION: OnceLock<Cgroups> = OnceLock::new();

/// Attributes processes by these cgroups from now on (set once, at start).
pub fn attribute_by(cgroups: &Cgroups) {
    let _ = ATTRIBUTION.set(cgroups.clone());
}

/// The cgroups processes are attributed by, when they are.
pub fn attribution() -> Option<&'static Cgroups> {
    ATTRIBUTION.get()
}

/// The attempt `pid` belongs to: by its cgroup where attempts have cgroups (a marker in its
/// environment then counts for nothing, cleared or forged), else by the marker. A process in
/// no attempt's cgroup whose marker names an attempt that has no cgroup (started before its
/// agent used cgroups, and re-attached since) is that attempt's.
pub fn attempt_of(pid: u32) -> Option<AttemptId> {
    let Some(c) = ATTRIBUTION.get() else {
        return crate::procscan::attempt_of(pid);
    };
    c.attempt_of(pid)
        .or_else(|| crate::procscan::attempt_of(pid).filter(|a| !c.attempt(*a).exists()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_either_controller_s_file() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!((oom_kills(v2), oom_kills(v1)), (1, 2));
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), 0);
    }

    const HYBRID: &str = "\
36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
41 25 0:36 / /sys/fs/cgroup/unified rw,relatime shared:19 - cgroup2 cgroup2 rw
35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime shared:13 - cgroup cgroup rw,cpu";

    #[test]
    fn mounts_and_own_cgroups_are_read_as_the_kernel_writes_them() {
        assert_eq!(
            mount_of(HYBRID, "cgroup2", None),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            mount_of(HYBRID, "cgroup", Some("memory")),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(mount_of(HYBRID, "cgroup", Some("pids")), None);
        let own = "4:memory:/lab/batch-7\n1:cpu:/\n0::/system.slice/headroom.service\n";
        assert_eq!(
            own_path(own, None).as_deref(),
            Some("/system.slice/headroom.service")
        );
        assert_eq!(
            own_path(own, Some("memory")).as_deref(),
            Some("/lab/batch-7")
        );
        assert_eq!(own_path("4:memory:/x\n", None), None);
    }

    #[test]
    fn a_tree_is_removed_with_what_was_nested_below_it_and_an_absent_one_is_no_error() {
        let root = tempfile::tempdir().expect("tempdir");
        let flat = root.path().join("flat");
        fs::create_dir(&flat).expect("mkdir");
        remove_tree(&flat).expect("flat");
        assert!(!flat.exists());
        let nested = root.path().join("attempt");
        fs::create_dir_all(nested.join("job/inner")).expect("mkdir");
        fs::create_dir(nested.join("other")).expect("mkdir");
        remove_tree(&nested).expect("nested");
        assert!(!nested.exists());
        remove_tree(&nested).expect("absent");
        // A file in the way (a cgroup's files vanish with it; a plain one does not): an
        // error, not a half-told success.
        fs::create_dir(&nested).expect("mkdir");
        fs::write(nested.join("x"), "").expect("file");
        assert!(remove_tree(&nested).is_err());
    }

    #[test]
    fn favordynmods_is_read_from_the_v2_mount_options() {
        assert_eq!(favors_dynmods(HYBRID), Some(false));
        let favored = HYBRID.replace(
            "cgroup2 cgroup2 rw",
            "cgroup2 cgroup2 rw,nsdelegate,favordynmods",
        );
        assert_eq!(favors_dynmods(&favored), Some(true));
        // A v1 hierarchy with the option (CONFIG_CGROUP_FAVOR_DYNMODS) says nothing of v2.
        let v1_only =
            "36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,favordynmods";
        assert_eq!(favors_dynmods(v1_only), None);
        // The option (and the advice) exist from Linux 6.0 on.
        assert!(has_favordynmods("6.1.0-13-amd64"));
        assert!(has_favordynmods("6.18.44-fc-v595"));
        assert!(!has_favordynmods("5.15.0-91-generic"));
        assert!(!has_favordynmods("4.18.0-513.el8.x86_64"));
        assert!(kernel_at_least("5.7.0", (5, 7)));
        assert!(kernel_at_least("6.1.0-13-amd64", (5, 7)));
        assert!(!kernel_at_least("5.4.0-150-generic", (5, 7)));
    }

    #[test]
    fn a_scope_names_its_directory_the_same_way_every_time() {
        assert_eq!(dir_name("/var/lib/a"), dir_name("/var/lib/a"));
        assert_ne!(dir_name("/var/lib/a"), dir_name("/var/lib/b"));
        assert!(dir_name("/x").starts_with("headroom-"));
    }
}
