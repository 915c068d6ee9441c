//! The fake backend: simulated GPUs for tests and demos. A process "uses" fake GPU memory by
//! writing `MiB` or `INDEX:MiB[,INDEX:MiB…]` to `$HEADROOM_FAKE_GPU_DIR/<pid>`; only live
//! processes count, as with NVML.
//!
//! Driver faults are injected with control files in the same directory, so that every
//! fail-closed path can be tested without a GPU ([`fault_file`] names them):
//! `gpu<N>.fail-memory` and `gpu<N>.fail-processes` make GPU N's memory query or process
//! list fail (the file's text is the error), `gpu<N>.no-process-memory` makes its per-process
//! memory unavailable (as NVML's `UsedGpuMemory::Unavailable`), `gpu<N>.driver-pids` lists
//! extra `PID:MiB` processes as a driver reports them, and `pid-namespace` containing
//! `isolated` makes the backend read pids as an agent in a pid namespace of its own would,
//! and `gpu<N>.no-power` makes its power and energy readings unsupported. For telemetry:
//! `gpu<N>.no-energy` removes only the total-energy counter (power still reads),
//! `gpu<N>.fail-telemetry` makes every telemetry reading of the GPU fail (the text is the
//! error), and `gpu<N>.throttle` lists clock event reasons the GPU reports while the file
//! is there (NVML's names, e.g. `sw_thermal_slowdown sw_power_cap`).
//!
//! `gpu<N>.ghost` holds a number of MiB used on GPU N that no process accounts for (as a
//! process the driver does not list, or memory a dead one left behind, would).
//!
//! `open-delay` (a duration such as `3s`) makes opening the backend take that long, as
//! NVML's initialisation does on a node without persistence mode.
//!
//! A usage entry may also declare utilization, `INDEX:MiB:PCT`; the GPUs' power,
//! temperature and energy follow what their processes declare ([`super::fakepower`]).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use headroom_shared::MemSize;
use headroom_shared::api::{GpuInfo, GpuSample, TelemetrySample};
use headroom_shared::size::SizeError;

use super::fakepower::{GpuState, PowerModel};
use super::pidns::{self, PidView};
use super::{GpuBackend, GpuError, Reported, attribute};
use crate::procscan;

/// Where jobs write their fake memory use.
pub const DIR_VAR: &str = "HEADROOM_FAKE_GPU_DIR";
/// The fake GPUs' sizes, as a [`FakeGpuSpec`], so a job can tell when it would not fit.
pub const SPEC_VAR: &str = "HEADROOM_FAKE_GPUS";
/// Lock file in the directory: held by a process while it checks capacity and claims memory.
pub const LOCK_FILE: &str = ".lock";

/// Every fake GPU's power model state (one line each: time, power, temperature, energy),
/// shared by every process that reads the directory (the agent, each attempt supervisor), so
/// that they all see one GPU: one temperature, one energy counter.
pub const POWER_STATE_FILE: &str = ".power-state";
/// Its lock, held while a reading advances the state.
pub const POWER_LOCK_FILE: &str = ".power-lock";
/// Control file overriding the power model's constants: `tau_s=1 idle_w=50` (names of
/// [`PowerModel`]'s fields), e.g. a short time constant so that tests heat and cool a fake
/// GPU in seconds.
pub const POWER_MODEL_FILE: &str = "power-model";

/// Control file: opening the backend takes this long (`3s`, `500ms`), as NVML's
/// initialisation may (seconds without persistence mode), so that what waits for it, and
/// what must not, can be tested.
pub const OPEN_DELAY_FILE: &str = "open-delay";

/// More fake GPUs than any node has is a typo (`1000x24GiB`), not a wish.
const MAX_GPUS: usize = 256;

/// The simulated GPUs' sizes, as users write them: `4x24GiB`, `24GiB`, `24GiB,24GiB,12GiB`,
/// `2x24GiB,1x12GiB`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeGpuSpec {
    sizes: Vec<MemSize>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FakeSpecError {
    #[error("fake GPU list is empty: write e.g. `4x24GiB` or `24GiB,12GiB`")]
    Empty,
    #[error("fake GPU list `{spec}` has an empty entry (write e.g. `24GiB,12GiB`)")]
    EmptyPart { spec: String },
    #[error("`{part}`: `{count}` is not a GPU count (write e.g. `4x24GiB`)")]
    BadCount { part: String, count: String },
    #[error("`{part}`: {source}")]
    BadSize {
        part: String,
        #[source]
        source: SizeError,
    },
    #[error("`{part}`: a GPU needs some memory")]
    ZeroSize { part: String },
    #[error("fake GPU list `{spec}` has {count} GPUs; at most {MAX_GPUS}")]
    TooMany { spec: String, count: usize },
}

impl FakeGpuSpec {
    pub fn new(sizes: Vec<MemSize>) -> Result<Self, FakeSpecError> {
        if sizes.is_empty() {
            return Err(FakeSpecError::Empty);
        }
        if let Some(zero) = sizes.iter().find(|s| s.mib == 0) {
            return Err(FakeSpecError::ZeroSize {
                part: zero.to_string(),
            });
        }
        if sizes.len() > MAX_GPUS {
            return Err(FakeSpecError::TooMany {
                spec: format!("{} GPUs", sizes.len()),
                count: sizes.len(),
            });
        }
        Ok(Self { sizes })
    }

    /// Memory of each GPU, by index.
    pub fn sizes(&self) -> &[MemSize] {
        &self.sizes
    }

    pub fn gpu_count(&self) -> u32 {
        self.sizes.len() as u32
    }

    /// Total memory of GPU `index`, if there is one.
    pub fn total_mib(&self, index: u32) -> Option<u64> {
        self.sizes.get(index as usize).map(|s| s.mib)
    }
}

impl FromStr for FakeGpuSpec {
    type Err = FakeSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err(FakeSpecError::Empty);
        }
        let mut sizes = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(FakeSpecError::EmptyPart {
                    spec: s.to_string(),
                });
            }
            let (count, size) = match part.split_once(['x', 'X']) {
                Some((count, size)) => {
                    let n = count
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| FakeSpecError::BadCount {
                            part: part.to_string(),
                            count: count.trim().to_string(),
                        })?;
                    (n, size)
                }
                None => (1, part),
            };
            let size = size
                .trim()
                .parse::<MemSize>()
                .map_err(|source| FakeSpecError::BadSize {
                    part: part.to_string(),
                    source,
                })?;
            if size.mib == 0 {
                return Err(FakeSpecError::ZeroSize {
                    part: part.to_string(),
                });
            }
            if sizes.len() + count > MAX_GPUS {
                return Err(FakeSpecError::TooMany {
                    spec: s.to_string(),
                    count: sizes.len().saturating_add(count),
                });
            }
            sizes.extend(std::iter::repeat_n(size, count));
        }
        Self::new(sizes)
    }
}

/// An exact size: `MemSize`'s own display rounds to a tenth of a GiB.
fn exact(size: MemSize) -> String {
    if size.mib.is_multiple_of(1024) {
        format!("{}GiB", size.mib / 1024)
    } else {
        format!("{}MiB", size.mib)
    }
}

// On the wire (the attempt supervisor's launch) as users write it.
impl serde::Serialize for FakeGpuSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FakeGpuSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("fake GPUs `{text}`: {e}")))
    }
}

impl fmt::Display for FakeGpuSpec {
    /// Runs of equal sizes as `NxSIZE`, joined by commas; parses back to the same list.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for run in self.sizes.chunk_by(|a, b| a == b) {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match run.len() {
                1 => write!(f, "{}", exact(run[0]))?,
                n => write!(f, "{n}x{}", exact(run[0]))?,
            }
        }
        Ok(())
    }
}

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
fn scan(dir: &Path, gpu_count: u32) -> io::Result<(Vec<FakeUse>, Controls)> {
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

/// A control file's text, when it is a regular file (no link, no FIFO a reader would block
/// on) of the user the fake GPUs run as (the agent's, a test's): the folder is every job's
/// to write its memory in, and a job must not fake faults, throttling or delays for the
/// others.
fn read_control(path: &Path) -> Option<String> {
    let (text, owner) = read_regular(path)?;
    if owner != nix::unistd::geteuid().as_raw() {
        tracing::debug!(path = %path.display(), owner, "a fake GPU control file of another user: ignored");
        return None;
    }
    Some(text)
}

/// A regular file's text and owner, opened without following a link or blocking on a FIFO
/// (a job may leave either in the shared folder).
fn read_regular(path: &Path) -> Option<(String, u32)> {
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
struct Controls {
    present: HashSet<OsString>,
}

impl Controls {
    /// The text of a control file, `None` when there is none. Only a file of the user the
    /// fake GPUs run as (the agent's, a test's) controls them: the folder is every job's to
    /// write its memory in, and a job must not fake faults, throttling or delays for the
    /// others. Never through a link.
    fn read(&self, path: &Path) -> Option<String> {
        if !path.file_name().is_some_and(|n| self.present.contains(n)) {
            return None;
        }
        read_control(path)
    }

    /// The error a fault file stands for: its text, or a default like NVML's.
    fn fault_error(&self, path: &Path, what: &str) -> Option<String> {
        self.read(path).map(|text| match text.trim() {
            "" => format!("{what}: Unknown Error (simulated)"),
            t => format!("{what}: {t}"),
        })
    }
}

/// `PID:MiB` lines; malformed lines are ignored.
fn parse_driver_pids(text: &str) -> Vec<Reported> {
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

/// Simulated GPUs whose memory use is read from files in a directory.
#[derive(Debug)]
pub struct FakeBackend {
    spec: FakeGpuSpec,
    dir: PathBuf,
    inventory: Vec<GpuInfo>,
    /// Why `auto` chose fake GPUs (no NVIDIA driver), for the start line.
    fallback: Option<String>,
    model: PowerModel,
    /// Each GPU's power model state at its last reading.
    power: Mutex<Vec<GpuState>>,
}

impl FakeBackend {
    /// Creates the directory (and its parents) if needed.
    pub fn open(spec: FakeGpuSpec, dir: &Path) -> Result<Self, GpuError> {
        let dir_err = |source| GpuError::FakeDir {
            dir: dir.to_path_buf(),
            source,
        };
        // Never through a link, nor another user's: it is made world-writable below.
        headroom_shared::datadir::own_subdir(dir, true)
            .map_err(|e| dir_err(std::io::Error::other(e)))?;
        // Jobs of any user write their memory there, as they would allocate on a real GPU
        // (sticky: none removes another's file).
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).map_err(dir_err)?;
        }
        // Jobs get the path in their environment and may change directory: make it absolute.
        let dir = fs::canonicalize(dir).map_err(dir_err)?;
        if let Some(text) = read_control(&dir.join(OPEN_DELAY_FILE))
            && let Ok(delay) = humantime::parse_duration(text.trim())
        {
            std::thread::sleep(delay);
        }
        let inventory: Vec<GpuInfo> = spec
            .sizes()
            .iter()
            .enumerate()
            .map(|(i, size)| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-fake-0000-0000-0000-{i:012}"),
                name: "Fake GPU".to_string(),
                total_mib: size.mib,
            })
            .collect();
        let model = PowerModel::default();
        let power = Mutex::new(vec![GpuState::idle(&model, 0.0); inventory.len()]);
        Ok(Self {
            spec,
            dir,
            inventory,
            fallback: None,
            model,
            power,
        })
    }

    /// Marks this backend as `auto`'s choice for `reason` (no NVIDIA driver).
    pub fn as_fallback(mut self, reason: String) -> Self {
        self.fallback = Some(reason);
        self
    }

    /// The model's constants, with the directory's overrides ([`POWER_MODEL_FILE`]).
    fn model_of(&self, controls: &Controls) -> PowerModel {
        let mut m = self.model;
        let Some(text) = controls.read(&self.dir.join(POWER_MODEL_FILE)) else {
            return m;
        };
        for (key, value) in text
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse::<f64>().ok().filter(|v| v.is_finite())?)))
        {
            match key {
                "idle_w" => m.idle_w = value,
                "max_w" => m.max_w = value,
                "memory_share" => m.memory_share = value,
                "ambient_c" => m.ambient_c = value,
                "c_per_w" => m.c_per_w = value,
                "tau_s" if value > 0.0 => m.tau_s = value,
                _ => tracing::debug!(key, "ignoring an unknown fake power model constant"),
            }
        }
        m
    }

    /// The shared state of every GPU ([`POWER_STATE_FILE`]), `None` when there is none
    /// (yet) or it does not fit this inventory.
    fn read_power_state(&self) -> Option<Vec<GpuState>> {
        let text = fs::read_to_string(self.dir.join(POWER_STATE_FILE)).ok()?;
        let states: Vec<GpuState> = text
            .lines()
            .map(|l| {
                let f: Vec<f64> = l
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                match f[..] {
                    [at_s, power_w, temperature_c, energy_j] => Some(GpuState {
                        at_s,
                        power_w,
                        temperature_c,
                        energy_j,
                    }),
                    _ => None,
                }
            })
            .collect::<Option<_>>()?;
        (states.len() == self.inventory.len()).then_some(states)
    }

    fn write_power_state(&self, states: &[GpuState]) -> io::Result<()> {
        let text: String = states
            .iter()
            .map(|g| {
                format!(
                    "{} {} {} {}\n",
                    g.at_s, g.power_w, g.temperature_c, g.energy_j
                )
            })
            .collect();
        // In place, under the directory's power lock (readers take it too): a temporary
        // file and a rename per reading would create an inode each time, which costs more
        // than the reading on a busy directory (ext4 walks recently deleted inodes).
        let mut f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(POWER_STATE_FILE))?;
        f.write_all(text.as_bytes())?;
        f.set_len(text.len() as u64)
    }

    /// Advances every GPU's power model to now under the load `uses` declare, and returns
    /// the states with each GPU's declared utilization. The state lives in the directory,
    /// shared by every process reading these GPUs (this process's copy when it cannot be
    /// read or written).
    fn observe(&self, uses: &[FakeUse], controls: &Controls) -> Vec<(GpuState, u32)> {
        let model = self.model_of(controls);
        let mut power = self
            .power
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Across processes: readers advance the shared state one at a time, in time order.
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(POWER_LOCK_FILE))
            .and_then(|f| f.lock().map(|()| f));
        // Wall-clock seconds: every process reading the directory agrees on them.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        if lock.is_ok() {
            match self.read_power_state() {
                Some(shared) => *power = shared,
                // None yet: idle GPUs from now on.
                None if power.iter().all(|g| g.at_s == 0.0) => {
                    *power = vec![GpuState::idle(&model, t); self.inventory.len()];
                }
                None => {}
            }
        }
        let out = self
            .inventory
            .iter()
            .zip(power.iter_mut())
            .map(|(gpu, state)| {
                let used = used_on(uses, gpu.index).min(gpu.total_mib);
                let util = uses
                    .iter()
                    .filter(|u| u.gpu == gpu.index)
                    .fold(0u32, |acc, u| (acc + u.util_pct).min(100));
                let memory_frac = used as f64 / gpu.total_mib.max(1) as f64;
                state.observe(&model, t, memory_frac, f64::from(util) / 100.0);
                (*state, util)
            })
            .collect();
        if lock.is_ok()
            && let Err(e) = self.write_power_state(&power)
        {
            tracing::debug!("fake GPU power state not shared: {e}");
        }
        out
    }

    /// The power model's constants.
    pub fn power_model(&self) -> PowerModel {
        self.model
    }

    /// How this backend reads driver pids: as the host, unless told otherwise.
    fn pid_view(&self, controls: &Controls) -> PidView {
        match controls.read(&self.dir.join(PID_NAMESPACE_FILE)) {
            Some(t) if t.trim() == "isolated" => PidView::Isolated {
                reason: pidns::NEEDS_HOST_PID.to_string(),
            },
            _ => PidView::Host,
        }
    }

    /// One GPU's reading from the usage files, with the faults injected for it.
    fn sample_one(
        &self,
        gpu: &GpuInfo,
        uses: &[FakeUse],
        view: &PidView,
        controls: &Controls,
        (power, util): (GpuState, u32),
    ) -> GpuSample {
        let mut errors = Vec::new();
        let no_process_memory = controls
            .read(&fault_file(&self.dir, gpu.index, Fault::NoProcessMemory))
            .is_some();
        let mut reported: Vec<Reported> = uses
            .iter()
            .filter(|u| u.gpu == gpu.index)
            .map(|u| Reported {
                pid: u.pid,
                used_mib: Some(u.mib),
                // As a driver gives it: what the process declared.
                sm_util_pct: Some(u.util_pct),
            })
            .collect();
        if let Some(text) = controls.read(&fault_file(&self.dir, gpu.index, Fault::DriverPids)) {
            reported.extend(parse_driver_pids(&text));
        }
        let used = reported
            .iter()
            .fold(self.ghost_mib(gpu.index, controls), |acc, r| {
                acc.saturating_add(r.used_mib.unwrap_or(0))
            })
            .min(gpu.total_mib);
        if no_process_memory {
            for r in &mut reported {
                r.used_mib = None;
            }
        }
        let (used_mib, free_mib) = match controls.fault_error(
            &fault_file(&self.dir, gpu.index, Fault::Memory),
            "memory info",
        ) {
            Some(e) => {
                errors.push(e);
                (0, 0)
            }
            None => (used, gpu.total_mib.saturating_sub(used)),
        };
        let processes = match controls.fault_error(
            &fault_file(&self.dir, gpu.index, Fault::Processes),
            "process list",
        ) {
            Some(e) => {
                errors.push(e);
                Vec::new()
            }
            None => {
                let (processes, error) = attribute(view, &reported);
                errors.extend(error);
                processes
            }
        };
        let no_power = controls
            .read(&fault_file(&self.dir, gpu.index, Fault::NoPower))
            .is_some();
        GpuSample {
            index: gpu.index,
            used_mib,
            free_mib,
            utilization_pct: Some(util),
            power_mw: (!no_power).then(|| (power.power_w * 1000.0).round() as u64),
            temperature_c: Some(power.temperature_c.round() as u32),
            processes,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }

    /// GPU `gpu`'s memory that no process accounts for ([`Fault::Ghost`]).
    fn ghost_mib(&self, gpu: u32, controls: &Controls) -> u64 {
        controls
            .read(&fault_file(&self.dir, gpu, Fault::Ghost))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn spec(&self) -> &FakeGpuSpec {
        &self.spec
    }
}

impl GpuBackend for FakeBackend {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn inventory(&self) -> Vec<GpuInfo> {
        self.inventory.clone()
    }

    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        let (uses, controls) =
            scan(&self.dir, self.spec.gpu_count()).map_err(|source| GpuError::FakeDir {
                dir: self.dir.clone(),
                source,
            })?;
        let view = self.pid_view(&controls);
        let power = self.observe(&uses, &controls);
        Ok(self
            .inventory
            .iter()
            .zip(power)
            .map(|(gpu, p)| self.sample_one(gpu, &uses, &view, &controls, p))
            .collect())
    }

    fn telemetry(&self) -> Result<Vec<TelemetrySample>, GpuError> {
        let (uses, controls) =
            scan(&self.dir, self.spec.gpu_count()).map_err(|source| GpuError::FakeDir {
                dir: self.dir.clone(),
                source,
            })?;
        let at = chrono::Utc::now();
        let power = self.observe(&uses, &controls);
        Ok(self
            .inventory
            .iter()
            .zip(power)
            .map(|(gpu, (state, util))| {
                if let Some(error) = controls.fault_error(
                    &fault_file(&self.dir, gpu.index, Fault::Telemetry),
                    "telemetry",
                ) {
                    return TelemetrySample {
                        gpu: gpu.index,
                        at,
                        error: Some(error),
                        ..TelemetrySample::default()
                    };
                }
                let memory_error = controls.fault_error(
                    &fault_file(&self.dir, gpu.index, Fault::Memory),
                    "memory info",
                );
                let no_power = controls
                    .read(&fault_file(&self.dir, gpu.index, Fault::NoPower))
                    .is_some();
                let no_energy = controls
                    .read(&fault_file(&self.dir, gpu.index, Fault::NoEnergy))
                    .is_some();
                let throttle = controls
                    .read(&fault_file(&self.dir, gpu.index, Fault::Throttle))
                    .map(|text| {
                        text.split(|c: char| c == ',' || c.is_whitespace())
                            .filter(|r| !r.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                let used = used_on(&uses, gpu.index)
                    .saturating_add(self.ghost_mib(gpu.index, &controls))
                    .min(gpu.total_mib);
                let memory_ok = memory_error.is_none();
                TelemetrySample {
                    gpu: gpu.index,
                    at,
                    used_mib: memory_ok.then_some(used),
                    free_mib: memory_ok.then(|| gpu.total_mib - used),
                    total_mib: memory_ok.then_some(gpu.total_mib),
                    utilization_pct: Some(util),
                    power_w: (!no_power).then_some(state.power_w),
                    energy_j: (!no_power && !no_energy).then_some(state.energy_j),
                    temperature_c: Some(state.temperature_c),
                    sm_clock_mhz: Some(if util > 0 { 1980 } else { 345 }),
                    throttle: Some(throttle),
                    error: memory_error,
                }
            })
            .collect())
    }

    fn describe(&self) -> String {
        let sizes = self.spec.sizes();
        let gpus = match sizes {
            [first, rest @ ..] if rest.iter().all(|s| s == first) => {
                format!(
                    "{} fake GPUs of {}",
                    sizes.len(),
                    super::size_words(first.mib)
                )
            }
            _ => format!("{} fake GPUs ({})", sizes.len(), self.spec),
        };
        match &self.fallback {
            Some(reason) => format!("{reason}: {gpus}"),
            None => format!("--gpu-backend fake: {gpus} in {}", self.dir.display()),
        }
    }

    fn facts(&self) -> super::BackendFacts {
        let controls = scan(&self.dir, self.spec.gpu_count())
            .map(|(_, c)| c)
            .unwrap_or_default();
        // A backend that opens slowly is what a driver without persistence mode is.
        let persistent = !self.dir.join(OPEN_DELAY_FILE).exists();
        super::BackendFacts {
            driver_version: Ok("fake".to_string()),
            nvml_version: Ok("fake".to_string()),
            process_api: Some(format!("usage files in {}", self.dir.display())),
            pid_namespace: self.pid_view(&controls).fact(),
            gpus: self
                .inventory
                .iter()
                .map(|g| super::GpuFacts {
                    index: g.index,
                    persistence: Ok(persistent),
                    mig: Ok(false),
                })
                .collect(),
        }
    }

    fn job_env(&self) -> Vec<(String, String)> {
        vec![
            (DIR_VAR.to_string(), self.dir.display().to_string()),
            (SPEC_VAR.to_string(), self.spec.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procscan::{self, ATTEMPT_VAR};
    use headroom_shared::AttemptId;
    use headroom_shared::api::GpuProcess;
    use proptest::prelude::*;
    use std::process::{Child, Command};
    use std::time::Instant;

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

    /// Writes a usage file directly, as a shell job would.
    fn write_raw(dir: &Path, pid: u32, text: &str) {
        fs::write(dir.join(pid.to_string()), text).expect("write usage file");
    }

    fn spec(s: &str) -> FakeGpuSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn mibs(s: &FakeGpuSpec) -> Vec<u64> {
        s.sizes().iter().map(|m| m.mib).collect()
    }

    #[test]
    fn parses_what_users_write() {
        assert_eq!(mibs(&spec("4x24GiB")), vec![24576; 4]);
        assert_eq!(mibs(&spec("24GiB")), vec![24576]);
        assert_eq!(mibs(&spec("24GiB,24GiB,12GiB")), vec![24576, 24576, 12288]);
        assert_eq!(mibs(&spec("2x24GiB,1x12GiB")), vec![24576, 24576, 12288]);
        assert_eq!(mibs(&spec(" 2 X 80GiB , 512MiB ")), vec![81920, 81920, 512]);
        assert_eq!(spec("2x24GiB,1x12GiB").to_string(), "2x24GiB,12GiB");
        assert_eq!(spec("24GiB,1536MiB,1536MiB").to_string(), "24GiB,2x1536MiB");
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |s: &str| match s.parse::<FakeGpuSpec>() {
            Ok(v) => panic!("{s} parsed as {v}"),
            Err(e) => e,
        };
        assert_eq!(err(""), FakeSpecError::Empty);
        assert!(matches!(
            err("24GiB,,12GiB"),
            FakeSpecError::EmptyPart { .. }
        ));
        let e = err("24GiB,fourx24GiB");
        assert!(matches!(&e, FakeSpecError::BadCount { part, .. } if part == "fourx24GiB"));
        assert!(e.to_string().contains("`four`"), "{e}");
        assert!(matches!(err("0x24GiB"), FakeSpecError::BadCount { .. }));
        let e = err("4x24 gigs");
        assert!(e.to_string().starts_with("`4x24 gigs`"), "{e}");
        assert!(matches!(err("24"), FakeSpecError::BadSize { .. }));
        assert!(matches!(err("0MiB"), FakeSpecError::ZeroSize { .. }));
        assert!(matches!(
            err("1000x24GiB"),
            FakeSpecError::TooMany { count: 1000, .. }
        ));
    }

    proptest! {
        #[test]
        fn display_parses_back(sizes in proptest::collection::vec(
            prop_oneof![Just(512u64), Just(1536), Just(24576), Just(81920), 1u64..200_000],
            1..12,
        )) {
            let s = FakeGpuSpec::new(sizes.into_iter().map(MemSize::from_mib).collect())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = s.to_string();
            let back: FakeGpuSpec = text.parse().map_err(|e: FakeSpecError| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(back, s);
        }
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

    fn sleeper(env: &[(&str, String)]) -> Child {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        for (k, v) in env {
            cmd.env(k, v);
        }
        procscan::tests::spawn(&mut cmd)
    }

    fn stop(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
        procscan::disown(child.id());
    }

    #[test]
    fn samples_live_processes_per_gpu_with_their_attempt() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let backend =
            FakeBackend::open(spec("2x1GiB,512MiB"), &tmp.path().join("gpus")).expect("open");
        let dir = backend.dir().to_path_buf();
        let attempt = AttemptId::new();
        // MiB only: lands on the first GPU of its CUDA_VISIBLE_DEVICES.
        let a = sleeper(&[
            (ATTEMPT_VAR, attempt.to_string()),
            ("CUDA_VISIBLE_DEVICES", "1,2".to_string()),
        ]);
        // Explicit indices; 7 is not a GPU here and is ignored.
        let b = sleeper(&[]);
        write_raw(&dir, a.id(), "300\n");
        write_raw(&dir, b.id(), "0:100,2:50,7:999,0:1");
        // A dead pid: reaped child, its file must not count and is deleted.
        let mut dead = procscan::tests::spawn(&mut Command::new("true"));
        dead.wait().expect("wait");
        procscan::disown(dead.id());
        write_raw(&dir, dead.id(), "0:700");
        // Garbage is ignored, even for a live pid.
        write_raw(&dir, std::process::id(), "oops");
        fs::write(dir.join("not-a-pid"), "0:5").expect("write");

        let s = backend.sample().expect("sample");
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].used_mib, s[0].free_mib), (101, 1024 - 101));
        assert_eq!(
            s[0].processes,
            vec![GpuProcess {
                pid: b.id(),
                used_mib: 101,
                attempt: None,
                user: None,
                command: None,
                used_mib_unknown: false,
                outside_pid_namespace: false,
                sm_util_pct: Some(0),
            }]
        );
        assert_eq!((s[1].used_mib, s[1].free_mib), (300, 724));
        assert_eq!(
            s[1].processes,
            vec![GpuProcess {
                pid: a.id(),
                used_mib: 300,
                attempt: Some(attempt),
                user: None,
                command: None,
                used_mib_unknown: false,
                outside_pid_namespace: false,
                sm_util_pct: Some(0),
            }]
        );
        assert_eq!((s[2].used_mib, s[2].free_mib), (50, 462));
        assert!(!dir.join(dead.id().to_string()).exists());

        // Zombies hold no memory: kill without reaping.
        let (a_pid, mut a) = (a.id(), a);
        a.kill().expect("kill");
        let deadline = Instant::now() + Duration::from_secs(5);
        while procscan::is_alive(a_pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = backend.sample().expect("sample");
        assert_eq!(s[1].used_mib, 0);
        assert!(s[1].processes.is_empty());
        stop(a);
        stop(b);
        let s = backend.sample().expect("sample");
        assert!(s.iter().all(|g| g.used_mib == 0 && g.processes.is_empty()));
    }

    #[test]
    fn injected_faults_touch_only_their_gpu() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let backend = FakeBackend::open(spec("3x1GiB"), tmp.path()).expect("open");
        let dir = backend.dir().to_path_buf();
        let holder = sleeper(&[]);
        write_raw(&dir, holder.id(), "0:100,1:200,2:300");
        fs::write(fault_file(&dir, 0, Fault::Processes), "Unknown Error").expect("fault");
        fs::write(fault_file(&dir, 1, Fault::NoProcessMemory), "").expect("fault");
        fs::write(
            fault_file(&dir, 2, Fault::DriverPids),
            "99999999:50\nbad line\n",
        )
        .expect("fault");
        let s = backend.sample().expect("sample");
        // GPU 0: memory known, processes unknown.
        assert_eq!(s[0].used_mib, 100);
        assert!(s[0].processes.is_empty());
        assert_eq!(s[0].error.as_deref(), Some("process list: Unknown Error"));
        // GPU 1: the process is there, its memory is not; the device still counts it.
        assert_eq!(s[1].error, None);
        assert_eq!(s[1].used_mib, 200);
        assert_eq!(s[1].processes.len(), 1);
        assert!(s[1].processes[0].used_mib_unknown && s[1].processes[0].used_mib == 0);
        // GPU 2: a pid with no process here makes the reading unknown; ours still listed.
        assert_eq!(s[2].used_mib, 350);
        assert_eq!(s[2].processes.len(), 1);
        assert!(
            s[2].error
                .as_deref()
                .is_some_and(|e| e.contains("pid 99999999")),
            "{:?}",
            s[2].error
        );
        // Healed: everything reads again.
        for (gpu, fault) in [
            (0, Fault::Processes),
            (1, Fault::NoProcessMemory),
            (2, Fault::DriverPids),
        ] {
            fs::remove_file(fault_file(&dir, gpu, fault)).expect("heal");
        }
        fs::write(fault_file(&dir, 1, Fault::Memory), "").expect("fault");
        let s = backend.sample().expect("sample");
        assert!(s[0].error.is_none() && s[2].error.is_none());
        assert_eq!((s[1].used_mib, s[1].free_mib), (0, 0));
        assert!(
            s[1].error
                .as_deref()
                .is_some_and(|e| e.starts_with("memory info"))
        );
        stop(holder);
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

    #[test]
    fn job_env_and_inventory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let backend = FakeBackend::open(spec("2x24GiB"), tmp.path()).expect("open");
        let env: HashMap<String, String> = backend.job_env().into_iter().collect();
        assert_eq!(env[SPEC_VAR], "2x24GiB");
        assert_eq!(Path::new(&env[DIR_VAR]), backend.dir());
        let inv = backend.inventory();
        assert_eq!(inv[1].uuid, "GPU-fake-0000-0000-0000-000000000001");
        assert_eq!(inv[1].name, "Fake GPU");
        assert_eq!(inv[1].total_mib, 24576);
        assert_eq!(backend.kind(), "fake");
    }

    /// Two processes reading one directory (the agent and an attempt's supervisor) see one
    /// GPU: the temperature one saw rise, the other sees fall, and one energy counter.
    #[test]
    fn every_reader_of_a_directory_shares_one_power_state() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = FakeBackend::open(spec("1x1GiB"), tmp.path()).expect("open");
        let b = FakeBackend::open(spec("1x1GiB"), tmp.path()).expect("open");
        fs::write(
            tmp.path().join(POWER_MODEL_FILE),
            "tau_s=0.2 bogus=1 idle_w=x",
        )
        .expect("model");
        let idle = a.telemetry().expect("read")[0].temperature_c.expect("temp");
        assert!((idle - 39.0).abs() < 0.5, "{idle}");
        write_usage_util(tmp.path(), std::process::id(), &[(0, 1024, 100)]).expect("usage");
        a.telemetry().expect("load seen");
        std::thread::sleep(Duration::from_millis(1500));
        // B never saw the load start, yet reads the GPU hot (7.5 time constants at 300 W).
        let hot = b.telemetry().expect("read")[0].clone();
        assert!(hot.temperature_c.expect("temp") > 74.0, "{hot:?}");
        assert!(hot.energy_j.expect("energy") > 300.0 * 1.4, "{hot:?}");
        remove_usage(tmp.path(), std::process::id()).expect("rm");
        b.telemetry().expect("idle seen");
        std::thread::sleep(Duration::from_millis(1500));
        let cool = a.telemetry().expect("read")[0].clone();
        assert!(cool.temperature_c.expect("temp") < 40.0, "{cool:?}");
        assert!(cool.energy_j > hot.energy_j, "the counter only grows");
    }
}
