//! The usage files jobs write in the fake GPUs' folder: `$DIR/<pid>` holds the memory (and
//! utilization) a live process declares on each GPU; reading them is what a driver's
//! process list is to the fake backend.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::time::Duration;

use super::LOCK_FILE;
use super::controls::{Controls, read_regular};
use crate::procscan;

/// Fake memory one process holds on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakeUse {
    pub pid: u32,
    pub gpu: u32,
    pub mib: u64,
    /// Utilization the process declares on this GPU, percent (0 when it declares none).
    pub util_pct: u32,
}

/// A GPU index from a `CUDA_VISIBLE_DEVICES` entry: a physical index or a fake uuid.
fn visible_index(entry: &str) -> Option<u32> {
    let entry = entry.trim();
    entry.parse().ok().or_else(|| {
        entry
            .strip_prefix("GPU-fake-")?
            .rsplit('-')
            .next()?
            .parse()
            .ok()
    })
}

/// The first GPU of a `CUDA_VISIBLE_DEVICES` value, if it names one.
pub fn first_visible_gpu(cuda_visible_devices: &str) -> Option<u32> {
    cuda_visible_devices
        .split(',')
        .next()
        .and_then(visible_index)
}

/// The GPU a usage file without one is on: the process's first visible GPU, or 0. Its
/// environment (`read`) reads empty for the instant the process is caught in an exec (a
/// shell's `exec`, after it wrote its file): read again a few times (`pause` between), or the
/// usage would show on GPU 0 for that reading.
fn visible_gpu_of(read: impl FnMut() -> Option<Option<String>>, pause: impl FnMut()) -> u32 {
    procscan::settled(read, pause)
        .flatten()
        .as_deref()
        .and_then(first_visible_gpu)
        .unwrap_or(0)
}

/// Parses a usage file: `MiB` (on `default_gpu`) or `INDEX:MiB[:PCT][,INDEX:MiB[:PCT]…]`
/// into (GPU, MiB, utilization %).
fn parse_usage(text: &str, default_gpu: impl FnOnce() -> u32) -> Option<Vec<(u32, u64, u32)>> {
    let text = text.trim();
    if !text.contains(':') {
        return Some(vec![(default_gpu(), text.parse().ok()?, 0)]);
    }
    text.split(',')
        .map(|entry| {
            let mut parts = entry.split(':');
            let gpu = parts.next()?.trim().parse().ok()?;
            let mib = parts.next()?.trim().parse().ok()?;
            let util = match parts.next() {
                Some(u) => u.trim().parse::<u32>().ok().filter(|&u| u <= 100)?,
                None => 0,
            };
            parts.next().is_none().then_some((gpu, mib, util))
        })
        .collect()
}

/// A usage file older than its pid's process belongs to an earlier process with that pid.
/// Start times have second precision (boot time), hence the slack.
const STALE_SLACK: Duration = Duration::from_secs(2);

/// Reads the fake memory held by live processes on GPUs `0..gpu_count`, sorted by GPU and pid.
///
/// Files of dead pids are deleted; zombies, files of an earlier process with a reused pid,
/// unreadable or malformed files and GPUs outside the list are ignored. A missing directory
/// means nothing is used. Blocking.
pub fn read_usage(dir: &Path, gpu_count: u32) -> io::Result<Vec<FakeUse>> {
    scan(dir, gpu_count).map(|(uses, _)| uses)
}

/// [`read_usage`], and the control files present, from the same directory listing.
pub(super) fn scan(dir: &Path, gpu_count: u32) -> io::Result<(Vec<FakeUse>, Controls)> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok((Vec::new(), Controls::default()));
        }
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    let mut controls = Controls::default();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            // The lock file, temporary files, control files.
            controls.present.insert(name);
            continue;
        };
        let path = entry.path();
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // Dead: nothing can write this file again, so it is only clutter.
            let _ = fs::remove_file(&path);
            continue;
        }
        if !procscan::is_alive(pid) {
            continue;
        }
        let modified = entry.metadata().and_then(|m| m.modified()).ok();
        if let (Some(modified), Some(started)) = (modified, procscan::start_time(pid))
            && modified + STALE_SLACK < started
        {
            continue;
        }
        let Some((text, _)) = read_regular(&path) else {
            continue;
        };
        let default_gpu = || {
            visible_gpu_of(
                || procscan::read_env_var(pid, "CUDA_VISIBLE_DEVICES"),
                || std::thread::sleep(Duration::from_micros(100)),
            )
        };
        let Some(uses) = parse_usage(&text, default_gpu) else {
            tracing::debug!(pid, text = %text.trim(), "ignoring malformed fake GPU usage file");
            continue;
        };
        let mut per_gpu: HashMap<u32, (u64, u32)> = HashMap::new();
        for (gpu, mib, util) in uses.into_iter().filter(|&(gpu, _, _)| gpu < gpu_count) {
            let slot = per_gpu.entry(gpu).or_default();
            *slot = (slot.0.saturating_add(mib), (slot.1 + util).min(100));
        }
        out.extend(per_gpu.into_iter().map(|(gpu, (mib, util_pct))| FakeUse {
            pid,
            gpu,
            mib,
            util_pct,
        }));
    }
    out.sort_unstable_by_key(|u| (u.gpu, u.pid));
    Ok((out, controls))
}

/// Fake memory in use on `gpu`, summed over processes.
pub fn used_on(uses: &[FakeUse], gpu: u32) -> u64 {
    uses.iter()
        .filter(|u| u.gpu == gpu)
        .fold(0u64, |acc, u| acc.saturating_add(u.mib))
}

/// Records that `pid` holds `uses` (GPU index, MiB). Written to a temporary file and renamed,
/// so a reader never sees half a file.
pub fn write_usage(dir: &Path, pid: u32, uses: &[(u32, u64)]) -> io::Result<()> {
    let with_util: Vec<(u32, u64, u32)> = uses.iter().map(|&(g, m)| (g, m, 0)).collect();
    write_usage_util(dir, pid, &with_util)
}

/// [`write_usage`] with a declared utilization (percent) per GPU: (GPU, MiB, PCT).
pub fn write_usage_util(dir: &Path, pid: u32, uses: &[(u32, u64, u32)]) -> io::Result<()> {
    let text = uses
        .iter()
        .map(|(gpu, mib, util)| match util {
            0 => format!("{gpu}:{mib}"),
            u => format!("{gpu}:{mib}:{u}"),
        })
        .collect::<Vec<_>>()
        .join(",");
    let tmp = dir.join(format!(".{pid}.tmp"));
    fs::write(&tmp, format!("{text}\n"))?;
    fs::rename(&tmp, dir.join(pid.to_string()))
}

/// Releases the fake memory of `pid`.
pub fn remove_usage(dir: &Path, pid: u32) -> io::Result<()> {
    match fs::remove_file(dir.join(pid.to_string())) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Takes the directory's exclusive lock (released when the file is dropped), so that checking
/// free memory and claiming it is one step among cooperating processes.
pub fn lock_dir(dir: &Path) -> io::Result<File> {
    let path = dir.join(LOCK_FILE);
    // Made by whoever came first (the agent, as root); a job of another user locks it
    // through a read-only handle (flock needs no write access).
    let file = match File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => File::open(&path)?,
        other => other?,
    };
    file.lock()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_without_a_gpu_is_on_the_first_visible_one_read_again_after_an_exec() {
        let mut reads = vec![None, None, Some(Some("2,3".to_string()))].into_iter();
        let mut pauses = 0;
        let gpu = visible_gpu_of(|| reads.next().flatten(), || pauses += 1);
        assert_eq!((gpu, pauses), (2, 2));
        // Without the variable, or never readable: GPU 0.
        assert_eq!(visible_gpu_of(|| Some(None), || {}), 0);
        let mut tries = 0;
        let gpu = visible_gpu_of(
            || {
                tries += 1;
                None
            },
            || {},
        );
        assert_eq!(gpu, 0);
        assert!(tries > 2 && tries <= 20, "{tries} reads");
    }

    #[test]
    fn usage_files_parse() {
        assert_eq!(parse_usage("1024\n", || 3), Some(vec![(3, 1024, 0)]));
        assert_eq!(
            parse_usage("0:100, 2:5", || 9),
            Some(vec![(0, 100, 0), (2, 5, 0)])
        );
        assert_eq!(
            parse_usage("0:100:80,1:0:30", || 9),
            Some(vec![(0, 100, 80), (1, 0, 30)])
        );
        assert_eq!(parse_usage("0:100:101", || 0), None);
        assert_eq!(parse_usage("0:100:5:5", || 0), None);
        assert_eq!(parse_usage("", || 0), None);
        assert_eq!(parse_usage("0:x", || 0), None);
        assert_eq!(parse_usage("-5", || 0), None);
        assert_eq!(first_visible_gpu("2,3"), Some(2));
        assert_eq!(
            first_visible_gpu("GPU-fake-0000-0000-0000-000000000005"),
            Some(5)
        );
        assert_eq!(first_visible_gpu(""), None);
    }

    #[test]
    fn write_and_read_back_through_the_helpers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        let _lock = lock_dir(tmp.path()).expect("lock");
        write_usage(tmp.path(), me, &[(0, 10), (1, 20)]).expect("write");
        let uses = read_usage(tmp.path(), 2).expect("read");
        assert_eq!(
            uses,
            vec![
                FakeUse {
                    pid: me,
                    gpu: 0,
                    mib: 10,
                    util_pct: 0,
                },
                FakeUse {
                    pid: me,
                    gpu: 1,
                    mib: 20,
                    util_pct: 0,
                }
            ]
        );
        assert_eq!(used_on(&uses, 1), 20);
        remove_usage(tmp.path(), me).expect("remove");
        remove_usage(tmp.path(), me).expect("removing twice is fine");
        assert!(read_usage(tmp.path(), 2).expect("read").is_empty());
        assert!(
            read_usage(&tmp.path().join("missing"), 2)
                .expect("missing dir")
                .is_empty()
        );
    }
}
