//! GPU backends behind one trait: NVML on real GPUs, and the fake backend (simulated GPUs
//! whose memory processes claim through files) for tests and demos.

pub mod fake;
pub mod nvml;

use std::path::PathBuf;
use std::sync::Arc;

use headroom_shared::api::{GpuInfo, GpuSample};

pub use fake::{FakeBackend, FakeGpuSpec, FakeSpecError};
pub use nvml::NvmlBackend;

/// What the agent needs from the GPUs of its node.
pub trait GpuBackend: Send + Sync + 'static {
    /// `"nvml"` or `"fake"`.
    fn kind(&self) -> &'static str;
    /// The GPUs found when the backend was opened, by index.
    fn inventory(&self) -> Vec<GpuInfo>;
    /// Live memory per GPU with the processes on it, in inventory order.
    /// Blocking: async callers use `spawn_blocking`.
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError>;
    /// Variables every job must get so that its GPU use is visible to this backend.
    fn job_env(&self) -> Vec<(String, String)>;
}

/// Which backend to open.
#[derive(Clone, Debug)]
pub enum BackendChoice {
    Nvml,
    Fake {
        spec: FakeGpuSpec,
        dir: PathBuf,
    },
    /// NVML when the driver loads and reports at least one GPU, else the fake backend.
    Auto {
        fake_fallback: FakeGpuSpec,
        dir: PathBuf,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{reason}; use --fake-gpus to run without GPUs")]
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
    match choice {
        BackendChoice::Nvml => Ok(Arc::new(NvmlBackend::open()?)),
        BackendChoice::Fake { spec, dir } => Ok(Arc::new(FakeBackend::open(spec.clone(), dir)?)),
        BackendChoice::Auto { fake_fallback, dir } => match NvmlBackend::open() {
            Ok(nvml) => {
                tracing::info!(gpus = nvml.inventory().len(), "GPU backend: nvml");
                Ok(Arc::new(nvml))
            }
            Err(e) => {
                tracing::info!(
                    reason = %e,
                    fake_gpus = %fake_fallback,
                    dir = %dir.display(),
                    "GPU backend: fake, NVML is not usable"
                );
                Ok(Arc::new(FakeBackend::open(fake_fallback.clone(), dir)?))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver_present() -> bool {
        ["/dev/nvidiactl", "/proc/driver/nvidia/version"]
            .iter()
            .any(|p| std::path::Path::new(p).exists())
    }

    #[test]
    fn nvml_without_a_driver_is_a_clear_error() {
        if driver_present() {
            eprintln!("NVIDIA driver present: nothing to check here");
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
        assert!(err.contains("--fake-gpus"), "{err}");
    }

    #[test]
    fn auto_falls_back_to_the_fake_backend() {
        if driver_present() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let fake_dir = dir.path().join("gpus");
        let spec: FakeGpuSpec = "2x24GiB".parse().expect("spec");
        let backend = open(&BackendChoice::Auto {
            fake_fallback: spec,
            dir: fake_dir.clone(),
        })
        .expect("auto opens");
        assert_eq!(backend.kind(), "fake");
        assert_eq!(backend.inventory().len(), 2);
        assert!(
            fake_dir.is_dir(),
            "opening the fake backend creates its directory"
        );
    }
}
