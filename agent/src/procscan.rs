//! Scans `/proc` to find an attempt's processes by their `HEADROOM_ATTEMPT_ID` marker and
//! reaps orphans re-parented to the agent (blocking: async callers use `spawn_blocking`).
//!
//! Processes can exit at any moment during a scan, so every per-process read error is
//! treated as "that process is gone" rather than reported.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use headroom_shared::AttemptId;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use procfs::process::{ProcState, Process};

/// The variable every process of an attempt inherits; the agent sets it at spawn.
pub const ATTEMPT_VAR: &str = "HEADROOM_ATTEMPT_ID";
/// Set to `background` in the background's environment: tells its processes from the
/// foreground's (its memory is not the foreground's peak).
pub const ROLE_VAR: &str = "HEADROOM_ROLE";
pub const ROLE_BACKGROUND: &str = "background";

/// The value of `name` in the environment `pid` was started with (`/proc/<pid>/environ`).
///
/// `None` when the process is gone, unreadable (another user's), a zombie (its environment
/// reads empty) or lacks the variable.
pub fn env_var(pid: u32, name: &str) -> Option<String> {
    read_env_var(pid, name).flatten()
}

/// [`env_var`], telling a variable the environment lacks (`Some(None)`) from an environment
/// that cannot be told (`None`): the process is gone or another user's, or its environment
/// reads empty, as a zombie's does and as a process's does while it is caught in its exec.
pub fn read_env_var(pid: u32, name: &str) -> Option<Option<String>> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    if environ.is_empty() {
        return None;
    }
    Some(find_var(&environ, name.as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// Finds `name=value` in a NUL-separated environment block without building a map.
fn find_var<'a>(environ: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    environ.split(|&b| b == 0).find_map(|entry| {
        entry
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(b"="))
    })
}

/// The attempt a process belongs to, from the marker in its environment. An environment
/// that reads empty (the process caught in an exec) is read again before the process is
/// taken for one of no attempt: once taken so, an attempt's own process made it
/// contaminated for good.
pub fn attempt_of(pid: u32) -> Option<AttemptId> {
    let pause = || std::thread::sleep(Duration::from_micros(100));
    settled(|| read_env_var(pid, ATTEMPT_VAR), pause)
        .flatten()?
        .trim()
        .parse()
        .ok()
}

/// A read of a process's environment (`read`), asked again a few times (`pause` between)
/// while it reads empty, as it does for the instant the process is caught in an exec;
/// `None` still after that (a zombie's reads empty for good).
pub fn settled<T>(mut read: impl FnMut() -> Option<T>, mut pause: impl FnMut()) -> Option<T> {
    const TRIES: u32 = 20;
    for tries in 1..=TRIES {
        if let Some(v) = read() {
            return Some(v);
        }
        if tries < TRIES {
            pause();
        }
    }
    None
}

/// The numeric entries of `/proc`: every pid visible to us, our own included.
fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

fn state_of(pid: u32) -> Option<ProcState> {
    let stat = Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
    stat.state().ok()
}

/// Whether `pid` exists and is not a zombie (a zombie holds no memory and runs no code).
pub fn is_alive(pid: u32) -> bool {
    matches!(state_of(pid), Some(s) if !matches!(s, ProcState::Zombie | ProcState::Dead))
}

/// When `pid` started, from its start tick and the boot time (second precision).
pub fn start_time(pid: u32) -> Option<SystemTime> {
    let stat = Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
    let boot = procfs::boot_time_secs().ok()?;
    let ticks = procfs::ticks_per_second().max(1);
    let since_boot = Duration::from_millis(stat.starttime.saturating_mul(1000) / ticks);
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}

/// Every live (non-zombie) process whose environment carries `HEADROOM_ATTEMPT_ID=<attempt>`,
/// grandchildren and double-forked orphans included, since they inherit the environment.
///
/// A process in the middle of `execve` reads with an empty environment for an instant: a
/// caller that must not miss anything confirms an empty answer with a second scan.
pub fn pids_with_marker(attempt: AttemptId) -> Vec<u32> {
    marked_processes().remove(&attempt).unwrap_or_default()
}

/// Every live process carrying a marker, by attempt: one pass over `/proc` serves every
/// attempt, so concurrent cleanups can share it.
pub fn marked_processes() -> HashMap<AttemptId, Vec<u32>> {
    marked_processes_scoped(None)
}

/// As [`marked_processes`]; with `scope` (`NAME`, `value`), only processes whose environment
/// also has `NAME=value` (one agent's jobs among several agents' on a host).
pub fn marked_processes_scoped(scope: Option<(&str, &str)>) -> HashMap<AttemptId, Vec<u32>> {
    let me = std::process::id();
    let mut out: HashMap<AttemptId, Vec<u32>> = HashMap::new();
    for pid in all_pids().into_iter().filter(|&pid| pid != me) {
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if let Some((name, value)) = scope
            && find_var(&env, name.as_bytes()) != Some(value.as_bytes())
        {
            continue;
        }
        let Some(attempt) = find_var(&env, ATTEMPT_VAR.as_bytes())
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<AttemptId>().ok())
        else {
            continue;
        };
        // A zombie's environment reads empty, but a process can be mid-exit: check.
        if is_alive(pid) {
            out.entry(attempt).or_default().push(pid);
        }
    }
    out
}

/// Live (non-zombie) descendants of this process, from the kernel's `children` lists of
/// each task, walked down the tree. A child list read while a sibling exits may miss an
/// entry: callers confirm an empty answer with a second walk, as with the marker scan.
///
/// `Err` where the kernel shows no `children` lists (built without `CONFIG_PROC_CHILDREN`),
/// or this process's own cannot be read: the tree cannot be told, which is never "empty".
pub fn descendants() -> Result<Vec<u32>, String> {
    let me = std::process::id();
    let mut out = Vec::new();
    let mut todo = vec![me];
    let mut seen = HashSet::new();
    while let Some(pid) = todo.pop() {
        let tasks = match fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(t) => t,
            Err(e) if pid == me => return Err(format!("cannot read /proc/{me}/task: {e}")),
            // A descendant gone meanwhile.
            Err(_) => continue,
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let list = match fs::read_to_string(&path) {
                Ok(l) => l,
                // Our main thread's is always there where the kernel shows trees at all;
                // another thread's, or a descendant's, may vanish as it exits.
                Err(e) if pid == me && task.file_name().to_str() == Some(&me.to_string()) => {
                    return Err(format!(
                        "cannot read {} ({e}): this kernel does not show process trees, so \
                         leftovers cannot be told",
                        path.display()
                    ));
                }
                Err(_) => continue,
            };
            for child in list
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if seen.insert(child) {
                    todo.push(child);
                    if is_alive(child) {
                        out.push(child);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Who runs `pid` and what: the user name (or uid) and the command line, for reports of
/// processes that belong to no attempt.
pub fn describe(pid: u32) -> (Option<String>, Option<String>) {
    let Some(proc) = i32::try_from(pid).ok().and_then(|p| Process::new(p).ok()) else {
        return (None, None);
    };
    let user = proc.uid().ok().map(|uid| {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| uid.to_string())
    });
    let command = proc.cmdline().ok().filter(|c| !c.is_empty()).map(|c| {
        let mut line = c.join(" ");
        if line.len() > 200 {
            let mut cut = 200;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str("...");
        }
        line
    });
    (user, command)
}

/// Zombie processes whose parent is this process: from the kernel's lists of this process's
/// children (a zombie stays on its parent's list until reaped), one short read per thread,
/// not a pass over every process on the host (a supervisor runs this at every child's exit).
pub fn zombie_children() -> Vec<u32> {
    let me = std::process::id();
    if let Ok(tasks) = fs::read_dir("/proc/self/task")
        && Path::new(&format!("/proc/self/task/{me}/children")).exists()
    {
        let mut out: Vec<u32> = tasks
            .flatten()
            .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|list| {
                list.split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .filter(|&pid| matches!(state_of(pid), Some(ProcState::Zombie)))
            .collect();
        out.sort_unstable();
        out.dedup();
        return out;
    }
    // A kernel that shows no children lists: every process's parent, read one by one.
    let me = i32::try_from(me).unwrap_or(i32::MAX);
    all_pids()
        .into_iter()
        .filter(|&pid| {
            let Some(stat) = i32::try_from(pid)
                .ok()
                .and_then(|p| Process::new(p).ok())
                .and_then(|p| p.stat().ok())
            else {
                return false;
            };
            stat.ppid == me && matches!(stat.state(), Ok(ProcState::Zombie))
        })
        .collect()
}

/// Reaps zombie children of this process whose pid is not in `keep`; returns the reaped pids.
///
/// The agent is a child subreaper, so double-forked orphans re-parent to it and stay zombies
/// when they die. Each is reaped by pid with `WNOHANG`: `waitpid(-1)` would steal the exit
/// status of children tokio is waiting for (those are in `keep`).
pub fn reap_orphan_zombies(keep: &HashSet<u32>) -> Vec<u32> {
    reap_pids(
        zombie_children()
            .into_iter()
            .filter(|pid| !keep.contains(pid)),
    )
}

/// Children of this process whose exit status someone waits for (tokio, `std::process`).
static OWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn owned() -> MutexGuard<'static, Vec<u32>> {
    // The list stays consistent whatever panicked while holding it.
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Spawns a child through `spawn` and records its pid so that [`reap_orphans`] leaves it to
/// its owner. The pid is recorded under the same lock the reaper takes, so a child that dies
/// at once cannot be reaped before it is recorded. Every child the agent process waits for
/// itself must be spawned through this (the supervisor does); call [`disown`] once it is reaped.
pub fn spawn_owned<T>(
    spawn: impl FnOnce() -> io::Result<T>,
    pid_of: impl FnOnce(&T) -> Option<u32>,
) -> io::Result<T> {
    let mut owned = owned();
    let child = spawn()?;
    if let Some(pid) = pid_of(&child) {
        owned.push(pid);
    }
    Ok(child)
}

/// Forgets a child recorded by [`spawn_owned`] (after its owner reaped it).
pub fn disown(pid: u32) {
    owned().retain(|&p| p != pid);
}

/// Reaps every zombie child of this process that no owner waits for: the orphans that
/// re-parented to the agent (a child subreaper) and died.
pub fn reap_orphans() -> Vec<u32> {
    if !may_have_zombies() {
        return Vec::new();
    }
    let zombies = zombie_children();
    if zombies.is_empty() {
        return zombies;
    }
    let owned = owned();
    let keep: HashSet<u32> = owned.iter().copied().collect();
    reap_pids(zombies.into_iter().filter(|pid| !keep.contains(pid)))
}

/// Whether a child of this process may have exited unreaped: `waitid` asked without reaping
/// (one call, where the lists of children take a read per thread). `false` only when it
/// says no child has exited, or that there is no child.
fn may_have_zombies() -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(
        nix::sys::wait::waitid(nix::sys::wait::Id::All, flags),
        Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD)
    )
}

/// `waitpid(pid, WNOHANG)` for each pid; errors (already reaped, not our child) are ignored.
pub(crate) fn reap_pids(pids: impl IntoIterator<Item = u32>) -> Vec<u32> {
    pids.into_iter()
        .filter(|&pid| {
            let Ok(raw) = i32::try_from(pid) else {
                return false;
            };
            matches!(
                waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG)),
                Ok(status) if status.pid().is_some()
            )
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::time::Instant;

    /// Children of tests are recorded so the reapers of tests running beside them skip them.
    pub(crate) fn spawn(cmd: &mut Command) -> Child {
        spawn_owned(|| cmd.spawn(), |c| Some(c.id())).expect("spawn test child")
    }

    #[test]
    fn finds_a_variable_in_an_environment_block() {
        let env = b"A=1\0HEADROOM_ATTEMPT_ID=x\0HEADROOM_ATTEMPT_ID_2=y\0B=\0";
        assert_eq!(find_var(env, b"HEADROOM_ATTEMPT_ID"), Some(&b"x"[..]));
        assert_eq!(find_var(env, b"B"), Some(&b""[..]));
        assert_eq!(find_var(env, b"HEADROOM"), None);
        assert_eq!(find_var(b"", b"A"), None);
    }

    #[test]
    fn finds_processes_by_marker_and_not_after_they_die() {
        let attempt = AttemptId::new();
        let mut child = spawn(
            Command::new("sleep")
                .arg("30")
                .env(ATTEMPT_VAR, attempt.to_string()),
        );
        let pid = child.id();
        // Spawning returns while exec is still setting up the new image, whose environment
        // reads empty for that moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while attempt_of(pid).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(attempt_of(pid), Some(attempt));
        assert_eq!(pids_with_marker(attempt), vec![pid]);
        assert!(pids_with_marker(AttemptId::new()).is_empty());
        assert!(is_alive(pid));
        let started = start_time(pid).expect("start time");
        let drift = SystemTime::now()
            .duration_since(started)
            .unwrap_or_else(|e| e.duration());
        assert!(
            drift < Duration::from_secs(5),
            "start time off by {drift:?}"
        );

        child.kill().expect("kill");
        // Not reaped yet: a zombie, which the scan must not report.
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_alive(pid));
        assert!(pids_with_marker(attempt).is_empty());
        child.wait().expect("wait");
        disown(pid);
        assert_eq!(attempt_of(pid), None);
    }

    /// A read that comes back empty (a process caught in its exec) is asked again, a bounded
    /// number of times: the marker read a moment later wins, one that never comes is `None`.
    #[test]
    fn an_empty_read_is_asked_again_a_few_times() {
        let mut reads = [None, None, Some(7)].into_iter();
        let mut pauses = 0;
        assert_eq!(settled(|| reads.next().flatten(), || pauses += 1), Some(7));
        assert_eq!(pauses, 2);
        let mut tries = 0;
        assert_eq!(
            settled(
                || {
                    tries += 1;
                    None::<u32>
                },
                || {}
            ),
            None
        );
        assert_eq!(tries, 20);
    }

    #[test]
    fn an_environment_that_reads_empty_is_unknown_not_one_without_the_variable() {
        let mut child = spawn(
            Command::new("sleep")
                .arg("30")
                .env(ROLE_VAR, ROLE_BACKGROUND),
        );
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while read_env_var(pid, ROLE_VAR).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            read_env_var(pid, ROLE_VAR),
            Some(Some(ROLE_BACKGROUND.to_string()))
        );
        assert_eq!(read_env_var(pid, "HEADROOM_NO_SUCH_VARIABLE"), Some(None));

        child.kill().expect("kill");
        // A zombie's environment reads empty, as an exec's does for a moment: not "without it".
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(read_env_var(pid, ROLE_VAR), None);
        assert_eq!(env_var(pid, ROLE_VAR), None);
        child.wait().expect("wait");
        disown(pid);
        assert_eq!(read_env_var(pid, ROLE_VAR), None, "gone");
    }

    #[test]
    fn reaps_orphaned_zombies_but_not_owned_children() {
        let mut kept = spawn(&mut Command::new("true"));
        // Not recorded: stands for an orphan that re-parented to us.
        let mut orphan = Command::new("true").spawn().expect("spawn true");
        let (kept_pid, orphan_pid) = (kept.id(), orphan.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let z = zombie_children();
            if z.contains(&kept_pid) && z.contains(&orphan_pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // A reaper of a test beside this one may take the orphan first: both are fine.
        let reaped = reap_orphans();
        assert!(!reaped.contains(&kept_pid));
        assert!(!zombie_children().contains(&orphan_pid));
        assert!(zombie_children().contains(&kept_pid));
        assert!(kept.wait().expect("kept child keeps its status").success());
        disown(kept_pid);
        // std's wait on a child reaped by someone else reports an error, not a status.
        assert!(orphan.try_wait().is_err());

        // The explicit form leaves alone what it is told to keep.
        let mut kept = spawn(&mut Command::new("true"));
        let kept_pid = kept.id();
        while !zombie_children().contains(&kept_pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let keep: HashSet<u32> = owned().iter().copied().collect();
        assert!(!reap_orphan_zombies(&keep).contains(&kept_pid));
        assert!(kept.wait().expect("status").success());
        disown(kept_pid);
    }
}
