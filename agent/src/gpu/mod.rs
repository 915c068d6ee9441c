//! GPU backends behind one trait: NVML on real GPUs, and the fake backend (simulated GPUs
//! whose memory processes claim through files) for tests and demos.
//!
//! Readings fail closed: a GPU whose memory or process list cannot be read carries the error
//! in its sample (see [`read`]), never an empty process list or free memory it does not have.

pub mod fake;
pub mod fakepower;
pub mod lazy;
pub mod nvml;
pub mod pidns;

use std::path::PathBuf;
use std::sync::Arc;

use headroom_shared::api::{GpuInfo, GpuProcess, GpuSample, TelemetrySample};

pub use fake::{FakeBackend, FakeGpuSpec, FakeSpecError};
pub use nvml::NvmlBackend;
pub use pidns::{PidView, Resolved};

/// What the agent needs from the GPUs of its node.
pub trait GpuBackend: Send + Sync + 'static {
    /// `"nvml"` or `"fake"`.
    fn kind(&self) -> &'static str;
    /// The GPUs found when the backend was opened, by index.
    fn inventory(&self) -> Vec<GpuInfo>;
    /// Live memory per GPU with the processes on it, in inventory order. A GPU whose reading
    /// failed in part has `error` set; `Err` means nothing could be read. Blocking: async
    /// callers use `spawn_blocking`.
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError>;
    /// One telemetry reading per GPU (memory, utilization, power, energy counter,
    /// temperature, SM clock, throttle reasons), without the process list, so it is cheap
    /// enough to take every second. A reading that fails or is not supported is `None`.
    /// Blocking.
    fn telemetry(&self) -> Result<Vec<TelemetrySample>, GpuError>;
    /// Variables every job must get so that its GPU use is visible to this backend.
    fn job_env(&self) -> Vec<(String, String)>;
    /// One line saying which backend and GPUs this is, printed at every start:
    /// `NVML: 8 GPUs (NVIDIA H100 80GB HBM3, 80 GiB)`, `no NVIDIA driver: 4 fake GPUs of 24 GiB`.
    fn describe(&self) -> String;
    /// What `headroom doctor` reports of the driver beyond readings. Blocking.
    fn facts(&self) -> BackendFacts;
    /// Whether a hard GPU memory limit can be set on each attempt here (what enforces it),
    /// or why not. Blocking.
    fn memory_caps(&self) -> Result<String, String> {
        Err(format!(
            "the {} backend sets no per-attempt GPU memory limit",
            self.kind()
        ))
    }
    /// Holds `attempt`'s processes to `mib` of GPU memory on each of its GPUs; `None` lifts
    /// the limit. Blocking.
    fn set_memory_cap(
        &self,
        attempt: headroom_shared::AttemptId,
        mib: Option<u64>,
    ) -> Result<(), String> {
        let _ = (attempt, mib);
        // Never "set" where nothing enforces it.
        Err(format!(
            "the {} backend sets no GPU memory limit",
            self.kind()
        ))
    }
}

/// The driver as `headroom doctor` reports it; `Err` says why a fact is not available.
#[derive(Clone, Debug)]
pub struct BackendFacts {
    pub driver_version: Result<String, String>,
    pub nvml_version: Result<String, String>,
    /// The call the process lists were last read with (`nvmlDeviceGetComputeRunningProcesses_v3`).
    pub process_api: Option<String>,
    /// How the driver's pids map to this process's (`Err`: they cannot be).
    pub pid_namespace: Result<String, String>,
    pub gpus: Vec<GpuFacts>,
}

#[derive(Clone, Debug)]
pub struct GpuFacts {
    pub index: u32,
    /// The driver stays loaded with no client (else NVML's start takes seconds).
    pub persistence: Result<bool, String>,
    /// The GPU is split into MIG instances.
    pub mig: Result<bool, String>,
}

impl PidView {
    /// This view as a fact: how pids map, or why they cannot.
    pub fn fact(&self) -> Result<String, String> {
        match self {
            PidView::Host => Ok("the host's pid namespace: the driver's pids are this \
                 process's"
                .to_string()),
            PidView::Mapped { .. } => Ok(self.describe()),
            PidView::Isolated { reason } => Err(reason.clone()),
        }
    }
}

/// Which backend to open (sent to each attempt supervisor, which opens its own).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BackendChoice {
    Nvml,
    Fake {
        spec: FakeGpuSpec,
        dir: PathBuf,
    },
    /// NVML when an NVIDIA driver library exists; the fake backend only when none does.
    Auto {
        fake_fallback: FakeGpuSpec,
        dir: PathBuf,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No NVIDIA driver library on this machine: the only case `auto` runs fake GPUs.
    #[error("{reason}; use --gpu-backend fake to run fake GPUs")]
    NoDriver { reason: String },
    /// The library is there but NVML does not work: a broken GPU node, never fake GPUs.
    #[error("{reason}; fix the driver, or use --gpu-backend fake to run fake GPUs")]
    NvmlUnavailable { reason: String },
    #[error("NVML {what} failed: {source}")]
    Nvml {
        what: &'static str,
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    #[error("fake GPU directory {}: {source}", dir.display())]
    FakeDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Opens the chosen backend. Never panics on a machine without GPUs or driver.
pub fn open(choice: &BackendChoice) -> Result<Arc<dyn GpuBackend>, GpuError> {
    open_with(choice, None)
}

/// [`open`] with the NVIDIA library at `nvml_lib` instead of the system's `libnvidia-ml.so.1`.
pub fn open_with(
    choice: &BackendChoice,
    nvml_lib: Option<&std::ffi::OsStr>,
) -> Result<Arc<dyn GpuBackend>, GpuError> {
    let backend: Arc<dyn GpuBackend> = match choice {
        BackendChoice::Nvml => Arc::new(NvmlBackend::open_at(nvml_lib)?),
        BackendChoice::Fake { spec, dir } => Arc::new(FakeBackend::open(spec.clone(), dir)?),
        BackendChoice::Auto { fake_fallback, dir } => match NvmlBackend::open_at(nvml_lib) {
            Ok(nvml) => Arc::new(nvml),
            Err(GpuError::NoDriver { reason }) => {
                tracing::debug!(%reason, "no NVIDIA driver library: fake GPUs");
                Arc::new(
                    FakeBackend::open(fake_fallback.clone(), dir)?
                        .as_fallback("no NVIDIA driver".to_string()),
                )
            }
            Err(e) => return Err(e),
        },
    };
    // The caller prints `describe()` at a level nothing hides (see the binaries' start).
    tracing::debug!(backend = backend.kind(), "{}", backend.describe());
    Ok(backend)
}

/// Every GPU of the inventory, read once: a failure of the whole backend marks every GPU
/// unknown (free memory 0, the error as its reason) instead of leaving GPUs out, and a GPU
/// missing from the reading is unknown too. Blocking.
pub fn read(backend: &dyn GpuBackend) -> Vec<GpuSample> {
    let samples = read_all(backend);
    log_changes(&samples);
    samples
}

fn read_all(backend: &dyn GpuBackend) -> Vec<GpuSample> {
    let inventory = backend.inventory();
    match backend.sample() {
        Ok(mut samples) => {
            for gpu in &inventory {
                if !samples.iter().any(|s| s.index == gpu.index) {
                    samples.push(unknown(gpu.index, "no reading for this GPU".to_string()));
                }
            }
            samples
        }
        Err(e) => all_unknown(&inventory, &e.to_string()),
    }
}

/// Logs a GPU's reading error when it appears or changes, and when it clears: once, not at
/// every sample.
fn log_changes(samples: &[GpuSample]) {
    static LAST: std::sync::Mutex<Vec<(u32, String)>> = std::sync::Mutex::new(Vec::new());
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for s in samples {
        let before = last.iter().position(|(i, _)| *i == s.index);
        match (&s.error, before) {
            (Some(e), Some(at)) if last[at].1 == *e => {}
            (Some(e), at) => {
                tracing::warn!(
                    gpu = s.index,
                    "GPU {} cannot be read, so it gets no work and nothing on it is verified \
                     or killed: {e}",
                    s.index
                );
                match at {
                    Some(at) => last[at].1 = e.clone(),
                    None => last.push((s.index, e.clone())),
                }
            }
            (None, Some(at)) => {
                tracing::info!(gpu = s.index, "GPU {} reads again", s.index);
                last.swap_remove(at);
            }
            (None, None) => {}
        }
    }
}

/// A GPU whose memory and processes are unknown: nothing free, nothing to trust.
pub fn unknown(index: u32, error: String) -> GpuSample {
    GpuSample {
        index,
        error: Some(error),
        ..GpuSample::default()
    }
}

/// Every GPU of `inventory` unknown, for the one reason `why`.
pub fn all_unknown(inventory: &[GpuInfo], why: &str) -> Vec<GpuSample> {
    inventory
        .iter()
        .map(|g| unknown(g.index, why.to_string()))
        .collect()
}

/// The errors of `gpus` in `samples` (from [`read`], which has every GPU of the node), as
/// one line: `None` when all of them read fine.
pub fn unreadable(samples: &[GpuSample], gpus: &[u32]) -> Option<String> {
    let errors: Vec<String> = samples
        .iter()
        .filter(|s| gpus.contains(&s.index))
        .filter_map(|s| {
            s.error
                .as_ref()
                .map(|e| format!("GPU {} could not be read: {e}", s.index))
        })
        .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// A process as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported {
    pub pid: u32,
    /// `None`: the driver cannot tell this process's memory.
    pub used_mib: Option<u64>,
    /// Its SM utilization, percent, where the driver gives it.
    pub sm_util_pct: Option<u32>,
}

/// The driver's process list of one GPU as the agent sees it: pids mapped to the agent's
/// namespace and tagged with their attempt. `Err` carries the reason when some process
/// cannot be attributed (the GPU's reading is then unknown); the processes that could be
/// are returned either way. Blocking (reads /proc).
pub fn attribute(view: &PidView, reported: &[Reported]) -> (Vec<GpuProcess>, Option<String>) {
    // A zombie counts as gone: it released its memory (the GPU's too) when it exited, and
    // its environment reads empty, so its attempt cannot be told.
    attribute_with(
        view,
        reported,
        crate::cgroup::attempt_of,
        crate::procscan::is_alive,
    )
}

/// [`attribute`] with the lookups of a local process's attempt and of whether it still
/// exists.
fn attribute_with(
    view: &PidView,
    reported: &[Reported],
    attempt_of: impl Fn(u32) -> Option<headroom_shared::AttemptId>,
    exists: impl Fn(u32) -> bool,
) -> (Vec<GpuProcess>, Option<String>) {
    let mut out = Vec::with_capacity(reported.len());
    let mut unknown = Vec::new();
    for r in reported {
        let (pid, outside) = match view.resolve(r.pid) {
            Resolved::Local(pid) => (pid, false),
            Resolved::Elsewhere => (r.pid, true),
            Resolved::Unknown(reason) => {
                unknown.push(reason);
                continue;
            }
        };
        let attempt = if outside { None } else { attempt_of(pid) };
        // Found in this namespace a moment ago and gone now: it ended during the look, and
        // its cgroup went with it. It is no process of no attempt (an attempt's own job,
        // exiting, was taken for a foreign one); the next look shows what it left behind.
        if !outside && attempt.is_none() && !exists(pid) {
            continue;
        }
        out.push(GpuProcess {
            pid,
            used_mib: r.used_mib.unwrap_or(0),
            attempt,
            user: None,
            command: None,
            used_mib_unknown: r.used_mib.is_none(),
            outside_pid_namespace: outside,
            sm_util_pct: r.sm_util_pct,
        });
    }
    unknown.dedup();
    let error = (!unknown.is_empty()).then(|| unknown.join("; "));
    (out, error)
}

/// `24 GiB`, `1.5 GiB`, `512 MiB`.
pub(crate) fn size_words(mib: u64) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else if mib >= 1024 {
        format!("{:.1} GiB", mib as f64 / 1024.0)
    } else {
        format!("{mib} MiB")
    }
}

/// `8 GPUs (NVIDIA H100 80GB HBM3, 80 GiB)`; mixed models are listed by run:
/// `3 GPUs (2x NVIDIA A100, 40 GiB; 1x NVIDIA T4, 15 GiB)`.
pub(crate) fn inventory_words(inventory: &[GpuInfo]) -> String {
    let n = inventory.len();
    let plural = if n == 1 { "GPU" } else { "GPUs" };
    let runs: Vec<&[GpuInfo]> = inventory
        .chunk_by(|a, b| a.name == b.name && a.total_mib == b.total_mib)
        .collect();
    let kinds = match runs.as_slice() {
        [one] => format!("{}, {}", one[0].name, size_words(one[0].total_mib)),
        many => many
            .iter()
            .map(|r| format!("{}x {}, {}", r.len(), r[0].name, size_words(r[0].total_mib)))
            .collect::<Vec<_>>()
            .join("; "),
    };
    format!("{n} {plural} ({kinds})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    fn driver_present() -> bool {
        ["/dev/nvidiactl", "/proc/driver/nvidia/version"]
            .iter()
            .any(|p| std::path::Path::new(p).exists())
    }

    fn auto(dir: &std::path::Path) -> BackendChoice {
        BackendChoice::Auto {
            fake_fallback: "2x24GiB".parse().expect("spec"),
            dir: dir.join("gpus"),
        }
    }

    /// A process gone between the driver's list and the look at its cgroup ended during the
    /// look: left out, where it was taken for a process of no attempt (and an attempt's own
    /// job, exiting at a sample, marked its run contaminated). One still there and in no
    /// attempt is foreign.
    #[test]
    fn a_process_that_ends_during_a_look_is_no_foreign_process() {
        let me = std::process::id();
        let reported = [Reported {
            pid: me,
            used_mib: Some(4096),
            sm_util_pct: None,
        }];
        let ours = headroom_shared::AttemptId::new();
        let (found, error) = attribute_with(&PidView::Host, &reported, |_| None, |_| false);
        assert_eq!((found.len(), error), (0, None));
        let (found, error) = attribute_with(&PidView::Host, &reported, |_| None, |_| true);
        assert_eq!(error, None);
        assert_eq!((found[0].pid, found[0].attempt), (me, None));
        let (found, _) = attribute_with(&PidView::Host, &reported, |_| Some(ours), |_| false);
        assert_eq!(found[0].attempt, Some(ours));
    }

    /// A job that exited at a sample but is not reaped yet (a zombie: its environment, and so
    /// its marker, reads empty) is no process of no attempt: an attempt's own job, ending,
    /// marked its run contaminated ("a process of no attempt held 4096 MiB").
    #[test]
    fn a_job_exited_but_not_yet_reaped_is_no_foreign_process() {
        let mut child = Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while crate::procscan::is_alive(pid) {
            assert!(std::time::Instant::now() < deadline, "{pid} never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "reaped too soon"
        );
        let reported = [Reported {
            pid,
            used_mib: Some(4096),
            sm_util_pct: None,
        }];
        let (found, error) = attribute(&PidView::Host, &reported);
        assert_eq!(error, None);
        assert!(found.is_empty(), "{found:?}");
        child.wait().expect("reap");
    }

    #[test]
    fn auto_runs_fake_gpus_only_when_no_nvidia_library_exists() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("libnvidia-ml.so.1");
        let backend = open_with(&auto(tmp.path()), Some(missing.as_os_str())).expect("auto");
        assert_eq!(backend.kind(), "fake");
        assert_eq!(backend.inventory().len(), 2);
        assert_eq!(
            backend.describe(),
            "no NVIDIA driver: 2 fake GPUs of 24 GiB"
        );
        assert!(tmp.path().join("gpus").is_dir());

        // A library that is there but does not load is a broken GPU node, not a laptop.
        std::fs::write(&missing, b"not a shared object").expect("write");
        let err = match open_with(&auto(tmp.path()), Some(missing.as_os_str())) {
            Ok(b) => panic!("a broken NVIDIA library gave {}", b.describe()),
            Err(e) => e,
        };
        assert!(matches!(err, GpuError::NvmlUnavailable { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("cannot be loaded"), "{msg}");
        assert!(msg.contains("--gpu-backend fake"), "{msg}");
    }

    #[test]
    fn init_errors_say_whether_a_driver_exists() {
        use ::nvml_wrapper::error::NvmlError;
        for (e, no_driver) in [
            (NvmlError::LibraryNotFound, true),
            (NvmlError::DriverNotLoaded, false),
            (NvmlError::NoPermission, false),
            (NvmlError::FailedToLoadSymbol("nvmlInit_v2".into()), false),
            (NvmlError::Unknown, false),
        ] {
            let name = format!("{e:?}");
            let err = nvml::init_error(e);
            assert_eq!(
                matches!(err, GpuError::NoDriver { .. }),
                no_driver,
                "{name}: {err}"
            );
        }
        let msg = nvml::init_error(NvmlError::DriverNotLoaded).to_string();
        assert!(msg.contains("not loaded"), "{msg}");
    }

    #[test]
    fn the_start_line_names_the_backend_and_gpus() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fake = FakeBackend::open("4x24GiB".parse().expect("spec"), tmp.path()).expect("open");
        assert!(
            fake.describe()
                .starts_with("--gpu-backend fake: 4 fake GPUs of 24 GiB in "),
            "{}",
            fake.describe()
        );
        let mixed = FakeBackend::open("2x24GiB,12GiB".parse().expect("spec"), tmp.path())
            .expect("open")
            .as_fallback("no NVIDIA driver".into());
        assert_eq!(
            mixed.describe(),
            "no NVIDIA driver: 3 fake GPUs (2x24GiB,12GiB)"
        );
        let h100 = |i| GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            total_mib: 81559,
        };
        assert_eq!(
            inventory_words(&(0..8).map(h100).collect::<Vec<_>>()),
            "8 GPUs (NVIDIA H100 80GB HBM3, 79.6 GiB)"
        );
        let mut two = vec![h100(0), h100(1)];
        two.push(GpuInfo {
            index: 2,
            uuid: "GPU-2".into(),
            name: "Tesla T4".into(),
            total_mib: 15360,
        });
        assert_eq!(
            inventory_words(&two),
            "3 GPUs (2x NVIDIA H100 80GB HBM3, 79.6 GiB; 1x Tesla T4, 15 GiB)"
        );
    }

    #[test]
    fn a_failed_backend_reads_as_every_gpu_unknown() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("gpus");
        let backend = FakeBackend::open("2x1GiB".parse().expect("spec"), &dir).expect("open");
        // The usage directory replaced by a file: nothing can be listed.
        std::fs::remove_dir_all(&dir).expect("rm");
        std::fs::write(&dir, "").expect("write");
        let samples = read(&backend);
        assert_eq!(samples.len(), 2);
        assert!(
            samples.iter().all(|s| s.error.is_some() && s.free_mib == 0),
            "{samples:?}"
        );
        assert!(unreadable(&samples, &[1]).is_some_and(|e| e.contains("GPU 1")));
        assert_eq!(unreadable(&samples, &[]), None);
    }

    #[test]
    fn nvml_without_a_driver_is_a_clear_error() {
        if driver_present() {
            eprintln!("NVIDIA driver present: checked by nvml_reads_the_driver instead");
            return;
        }
        let err = match open(&BackendChoice::Nvml) {
            Ok(b) => panic!(
                "NVML opened without a driver ({} GPUs)",
                b.inventory().len()
            ),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("libnvidia-ml.so.1"), "{err}");
        assert!(err.contains("--gpu-backend fake"), "{err}");
    }

    /// On a GPU machine: inventory, memory and the process list of a process that
    /// allocates (python3 with CUDA PyTorch), read through the real driver. Ignored (shown
    /// as skipped) elsewhere; on a GPU node: `cargo nextest run -p headroom-agent
    /// --run-ignored all -E 'test(nvml_reads_the_driver)'`.
    #[test]
    #[ignore = "needs an NVIDIA GPU and python3 with CUDA PyTorch"]
    fn nvml_reads_the_driver() {
        assert!(
            driver_present(),
            "no NVIDIA driver on this machine: this test reads a real GPU"
        );
        let backend = open(&BackendChoice::Nvml)
            .unwrap_or_else(|e| panic!("an NVIDIA driver is present but NVML does not open: {e}"));
        assert_eq!(backend.kind(), "nvml");
        let inventory = backend.inventory();
        assert!(!inventory.is_empty());
        for g in &inventory {
            assert!(!g.name.is_empty() && g.uuid.starts_with("GPU-"), "{g:?}");
            assert!(g.total_mib > 1024, "{g:?}");
        }
        eprintln!("{}", backend.describe());
        let samples = backend.sample().expect("sample");
        assert_eq!(samples.len(), inventory.len());
        for (s, g) in samples.iter().zip(&inventory) {
            assert_eq!(s.error, None, "GPU {} reading failed", s.index);
            // Reserved memory makes used + free a little less than total.
            assert!(
                s.used_mib + s.free_mib <= g.total_mib && s.free_mib > 0,
                "{s:?} of {g:?}"
            );
        }

        let python = "import os, sys, time, torch\n\
             x = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda')\n\
             torch.cuda.synchronize()\n\
             print('allocated', flush=True)\n\
             time.sleep(60)\n";
        let torch = Command::new("python3")
            .args([
                "-c",
                "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            torch,
            "python3 with CUDA PyTorch is needed to allocate on the GPU"
        );
        let attempt = headroom_shared::AttemptId::new();
        let mut child = Command::new("python3")
            .args(["-c", python])
            .env(crate::procscan::ATTEMPT_VAR, attempt.to_string())
            .env("CUDA_VISIBLE_DEVICES", "0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "allocated");
        let samples = backend.sample().expect("sample");
        let _ = child.kill();
        let _ = child.wait();
        let gpu0 = samples.iter().find(|s| s.index == 0).expect("GPU 0");
        assert_eq!(gpu0.error, None);
        let p = gpu0
            .processes
            .iter()
            .find(|p| p.pid == child.id())
            .unwrap_or_else(|| panic!("pid {} not on GPU 0: {gpu0:?}", child.id()));
        assert_eq!(p.attempt, Some(attempt));
        assert!(
            p.used_mib_unknown || p.used_mib >= 512,
            "the process holds at least 512 MiB: {p:?}"
        );
        assert!(gpu0.used_mib >= 512, "{gpu0:?}");
    }
}
