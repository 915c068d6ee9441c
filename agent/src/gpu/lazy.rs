//! A GPU backend opened once per attempt supervisor, ahead of its jobs. Opening NVML costs
//! far more than starting a job (seconds on a node without persistence mode), so a
//! supervisor starts opening it as soon as its agent says which backend to use, while it
//! waits for a lease ([`Opening`]), and every attempt it runs reads through that one handle
//! ([`LazyBackend`]). A backend that cannot be opened reads as unknown for every GPU of the
//! attempt, never as free.

use std::sync::{Arc, OnceLock};

use headroom_shared::api::{GpuInfo, GpuSample, TelemetrySample};

use super::{GpuBackend, GpuError};

type Opener = Box<dyn Fn() -> Result<Arc<dyn GpuBackend>, String> + Send + Sync>;

/// A backend being opened, or opened (or failed to), once for the supervisor's life.
pub struct Opening {
    open: Opener,
    opened: OnceLock<Result<Arc<dyn GpuBackend>, String>>,
}

impl Opening {
    pub fn new(
        open: impl Fn() -> Result<Arc<dyn GpuBackend>, String> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            open: Box::new(open),
            opened: OnceLock::new(),
        })
    }

    /// Opens the backend now, off the runtime, so that it is open when the first job comes;
    /// a reading meanwhile waits for this open rather than starting another.
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _ = this.get();
        });
    }

    /// Whether the backend has been opened (or tried).
    pub fn is_opened(&self) -> bool {
        self.opened.get().is_some()
    }

    /// The backend, opened on first use. Blocking.
    fn get(&self) -> &Result<Arc<dyn GpuBackend>, String> {
        self.opened.get_or_init(|| (self.open)())
    }
}

/// One attempt's view of its supervisor's backend.
pub struct LazyBackend {
    opening: Arc<Opening>,
    /// What jobs need from the backend, as the agent's own opened backend said.
    job_env: Vec<(String, String)>,
    /// Stand in for the inventory while the backend cannot be opened, so that every reading
    /// of them says why (fail closed).
    gpus: Vec<u32>,
}

impl LazyBackend {
    pub fn new(opening: Arc<Opening>, job_env: Vec<(String, String)>, gpus: Vec<u32>) -> Self {
        Self {
            opening,
            job_env,
            gpus,
        }
    }

    /// Whether the backend has been opened (or tried).
    pub fn is_opened(&self) -> bool {
        self.opening.is_opened()
    }

    /// Blocking on first use.
    fn backend(&self) -> Result<&Arc<dyn GpuBackend>, GpuError> {
        self.opening
            .get()
            .as_ref()
            .map_err(|reason| GpuError::NvmlUnavailable {
                reason: format!("the attempt supervisor cannot open the GPUs: {reason}"),
            })
    }
}

impl GpuBackend for LazyBackend {
    fn kind(&self) -> &'static str {
        match self.opening.opened.get() {
            Some(Ok(b)) => b.kind(),
            _ => "unopened",
        }
    }

    fn inventory(&self) -> Vec<GpuInfo> {
        match self.backend() {
            Ok(b) => b.inventory(),
            Err(_) => self
                .gpus
                .iter()
                .map(|&index| GpuInfo {
                    index,
                    uuid: String::new(),
                    name: "unknown".to_string(),
                    total_mib: 0,
                })
                .collect(),
        }
    }

    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        self.backend()?.sample()
    }

    fn telemetry(&self) -> Result<Vec<TelemetrySample>, GpuError> {
        self.backend()?.telemetry()
    }

    fn job_env(&self) -> Vec<(String, String)> {
        self.job_env.clone()
    }

    fn memory_caps(&self) -> Result<String, String> {
        self.backend().map_err(|e| e.to_string())?.memory_caps()
    }

    fn set_memory_cap(
        &self,
        attempt: headroom_shared::AttemptId,
        mib: Option<u64>,
    ) -> Result<(), String> {
        self.backend()
            .map_err(|e| e.to_string())?
            .set_memory_cap(attempt, mib)
    }

    fn facts(&self) -> super::BackendFacts {
        match self.backend() {
            Ok(b) => b.facts(),
            Err(e) => super::BackendFacts {
                driver_version: Err(e.to_string()),
                nvml_version: Err(e.to_string()),
                process_api: None,
                pid_namespace: Err(e.to_string()),
                gpus: vec![],
            },
        }
    }

    fn describe(&self) -> String {
        match self.opening.opened.get() {
            Some(Ok(b)) => b.describe(),
            Some(Err(e)) => format!("GPUs cannot be opened: {e}"),
            None => "GPUs not opened yet".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;

    #[test]
    fn opens_on_first_reading_not_for_the_job_env() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let lazy = LazyBackend::new(
            Opening::new(move || {
                FakeBackend::open("2x24GiB".parse().expect("spec"), &dir)
                    .map(|b| Arc::new(b) as Arc<dyn GpuBackend>)
                    .map_err(|e| e.to_string())
            }),
            vec![("X".into(), "1".into())],
            vec![1],
        );
        assert_eq!(lazy.job_env(), vec![("X".to_string(), "1".to_string())]);
        assert!(!lazy.is_opened(), "the job env must not open the GPUs");
        let samples = crate::gpu::read(&lazy);
        assert!(lazy.is_opened());
        assert_eq!(samples.len(), 2);
        assert!(samples.iter().all(|s| s.error.is_none()), "{samples:?}");
    }

    #[test]
    fn a_backend_that_cannot_open_reads_unknown_for_the_attempts_gpus() {
        let lazy = LazyBackend::new(
            Opening::new(|| Err("no driver".to_string())),
            vec![],
            vec![0, 3],
        );
        let samples = crate::gpu::read(&lazy);
        let why = crate::gpu::unreadable(&samples, &[3]).expect("unknown, not free");
        assert!(why.contains("no driver"), "{why}");
        assert!(lazy.sample().is_err());
    }
}
