//! The control files of the fake GPUs' folder: faults injected on one GPU ([`Fault`],
//! [`fault_file`]) and the folder's settings, read only when they are regular files of the
//! user the fake GPUs run as.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::gpu::Reported;

/// A driver fault to simulate on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The memory query fails.
    Memory,
    /// The process list fails.
    Processes,
    /// Per-process memory is unavailable; device memory still counts it.
    NoProcessMemory,
    /// Extra `PID:MiB` lines: processes as a driver reports them, resolved like NVML's.
    DriverPids,
    /// Power and energy readings are not supported (as on GPUs older than Volta).
    NoPower,
    /// Only the total-energy counter is not supported; power reads.
    NoEnergy,
    /// Every telemetry reading of the GPU fails.
    Telemetry,
    /// Clock event (throttle) reasons reported, as the file lists them.
    Throttle,
    /// MiB used that no process accounts for ("ghost" memory).
    Ghost,
}

/// The control file that injects `fault` on GPU `gpu`.
pub fn fault_file(dir: &Path, gpu: u32, fault: Fault) -> PathBuf {
    let what = match fault {
        Fault::Memory => "fail-memory",
        Fault::Processes => "fail-processes",
        Fault::NoProcessMemory => "no-process-memory",
        Fault::DriverPids => "driver-pids",
        Fault::NoPower => "no-power",
        Fault::NoEnergy => "no-energy",
        Fault::Telemetry => "fail-telemetry",
        Fault::Throttle => "throttle",
        Fault::Ghost => "ghost",
    };
    dir.join(format!("gpu{gpu}.{what}"))
}

/// Control file: `isolated` simulates an agent in a pid namespace of its own.
pub const PID_NAMESPACE_FILE: &str = "pid-namespace";

/// Control file: its presence makes the fake GPUs able to hold each attempt to a hard GPU
/// memory limit (a driver or kernel that enforces one), which the agent then sets.
pub const MEMORY_CAPS_FILE: &str = "memory-caps";

/// Where the agent writes an attempt's GPU memory limit (MiB on each of its GPUs), which a
/// fake job's allocation past it fails on with CUDA's OOM text.
pub fn cap_file(dir: &Path, attempt: &str) -> PathBuf {
    dir.join(format!("memcap.{attempt}"))
}

/// An attempt's GPU memory limit, MiB: from a regular file of the folder's owner (who
/// set the fake GPUs up, the agent), since a job may write in the folder too.
pub fn read_cap(dir: &Path, attempt: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let owner = fs::symlink_metadata(dir).ok()?.uid();
    let (text, uid) = read_regular(&cap_file(dir, attempt))?;
    (uid == owner).then(|| text.trim().parse().ok()).flatten()
}

/// A control file's text, when it is a regular file (no link, no FIFO a reader would block
/// on) of the user the fake GPUs run as (the agent's, a test's): the folder is every job's
/// to write its memory in, and a job must not fake faults, throttling or delays for the
/// others.
pub(super) fn read_control(path: &Path) -> Option<String> {
    let (text, owner) = read_regular(path)?;
    if owner != nix::unistd::geteuid().as_raw() {
        tracing::debug!(path = %path.display(), owner, "a fake GPU control file of another user: ignored");
        return None;
    }
    Some(text)
}

/// A regular file's text and owner, opened without following a link or blocking on a FIFO
/// (a job may leave either in the shared folder).
pub(super) fn read_regular(path: &Path) -> Option<(String, u32)> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    Some((text, meta.uid()))
}

/// The names in the directory that are not usage files, as one sample listed them: only
/// those are opened, rather than probing every control file of every GPU at every sample
/// (17 failed opens a sample on four GPUs).
#[derive(Debug, Default)]
pub(super) struct Controls {
    pub(super) present: HashSet<OsString>,
}

impl Controls {
    /// The text of a control file, `None` when there is none. Only a file of the user the
    /// fake GPUs run as (the agent's, a test's) controls them: the folder is every job's to
    /// write its memory in, and a job must not fake faults, throttling or delays for the
    /// others. Never through a link.
    pub(super) fn read(&self, path: &Path) -> Option<String> {
        if !path.file_name().is_some_and(|n| self.present.contains(n)) {
            return None;
        }
        read_control(path)
    }

    /// The error a fault file stands for: its text, or a default like NVML's.
    pub(super) fn fault_error(&self, path: &Path, what: &str) -> Option<String> {
        self.read(path).map(|text| match text.trim() {
            "" => format!("{what}: Unknown Error (simulated)"),
            t => format!("{what}: {t}"),
        })
    }
}

/// `PID:MiB` lines; malformed lines are ignored.
pub(super) fn parse_driver_pids(text: &str) -> Vec<Reported> {
    text.lines()
        .filter_map(|l| {
            let (pid, mib) = l.trim().split_once(':')?;
            Some(Reported {
                pid: pid.trim().parse().ok()?,
                used_mib: Some(mib.trim().parse().ok()?),
                sm_util_pct: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::gpu::fake::OPEN_DELAY_FILE;

    /// A usage file naming no GPU is on the process's first visible one, also when its
    /// environment is first read while it is caught in an exec (it reads empty then).
    /// A job may leave a FIFO or a link where a control or usage file goes: neither blocks
    /// nor steers the reader; a regular file of this user is read.
    #[test]
    fn control_files_are_regular_files_of_this_user_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join(OPEN_DELAY_FILE);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666))
            .expect("mkfifo");
        let started = std::time::Instant::now();
        assert_eq!(read_control(&fifo), None);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "blocked on a FIFO"
        );
        let target = dir.path().join("elsewhere");
        fs::write(&target, "3s").expect("target");
        let link = dir.path().join("gpu0.throttle");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        assert_eq!(read_control(&link), None);
        assert_eq!(read_control(&target).as_deref(), Some("3s"));
    }
}
