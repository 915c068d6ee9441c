//! A started attempt: its job's process, its background, what is watched, and what kills
//! them all if the supervisor drops the attempt before its cleanup ran.

use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::supervisor::process::Child;
use chrono::{DateTime, Utc};
use headroom_shared::AttemptId;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::watch::Watch;
use crate::procscan;
use crate::supervisor::colocate;

/// An attempt whose job runs.
pub(super) struct Running {
    /// The job's log, and where this attempt's part of it starts.
    pub(super) log: File,
    pub(super) log_start: u64,
    /// The start reading, when it was not taken before the job's exec (still on its way).
    pub(super) start_reading: Option<tokio::task::JoinHandle<()>>,
    pub(super) watch: Arc<Mutex<Watch>>,
    pub(super) sample_every: Duration,
    pub(super) child: Child,
    pub(super) pid: u32,
    pub(super) started_at: DateTime<Utc>,
    pub(super) guard: KillOnDrop,
    /// The colocated background, running since before the job started.
    pub(super) background: Option<colocate::Running>,
    pub(super) background_guard: Option<KillOnDrop>,
    /// The hard GPU memory limit set on its GPUs (MiB), if one was.
    pub(super) memory_cap_mib: Option<u64>,
}

/// SIGKILLs every live process carrying `attempt`'s marker (e.g. leftovers of an earlier
/// incarnation of the agent); returns their pids. Blocking.
pub fn kill_marked(attempt: AttemptId) -> Vec<u32> {
    // Where attempts have cgroups, the cgroup says what is the attempt's: a marker may be
    // forged on another's process, or cleared by the attempt's own.
    if let Some(c) = crate::cgroup::attribution() {
        let cg = c.attempt(attempt);
        if cg.exists() {
            let pids = cg.pids().unwrap_or_default();
            if let Err(e) = cg.kill() {
                tracing::warn!(%attempt, "cannot kill the attempt's cgroup: {e}");
            }
            signal_each(&pids, Signal::SIGKILL);
            return pids;
        }
    }
    let pids = procscan::pids_with_marker(attempt);
    signal_each(&pids, Signal::SIGKILL);
    pids
}

/// Sends `sig` to a process group; a group that is gone (ESRCH) is what we want anyway.
pub(super) fn signal_group(pgid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pgid)
        && raw > 1
    {
        let _ = killpg(Pid::from_raw(raw), sig);
    }
}

pub(super) fn signal_each(pids: &[u32], sig: Signal) {
    let me = std::process::id();
    for &pid in pids {
        if let Ok(raw) = i32::try_from(pid)
            && raw > 1
            && pid != me
        {
            let _ = kill(Pid::from_raw(raw), sig);
        }
    }
}

/// Kills the attempt's processes if `run_attempt` is dropped before its cleanup ran.
pub(super) struct KillOnDrop {
    pub(super) pgid: u32,
    pub(super) attempt: AttemptId,
    pub(super) armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            signal_group(self.pgid, Signal::SIGKILL);
            kill_marked(self.attempt);
            procscan::disown(self.pgid);
        }
    }
}
