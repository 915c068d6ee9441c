//! Processes looked at through `/proc`: an agent's scope (its jobs and their attempt
//! supervisors), parents and children, liveness, and killing what a test leaves behind.

use std::path::Path;
use std::time::Duration;

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

/// Whether a process is alive (zombies count as dead).
pub fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|state| state != "Z"))
}
