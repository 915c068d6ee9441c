//! The NVML backend: real GPUs through libnvidia-ml, loaded at run time by nvml-wrapper.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use headroom_shared::api::{GpuInfo, GpuProcess, GpuSample};

use super::{GpuBackend, GpuError};
use crate::procscan;

const MIB: u64 = 1024 * 1024;

pub struct NvmlBackend {
    nvml: Nvml,
    inventory: Vec<GpuInfo>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

/// Turns a failed `Nvml::init` into what a user can act on.
fn init_error(e: NvmlError) -> GpuError {
    let reason = match e {
        NvmlError::LibloadingError(e) => {
            format!("NVIDIA driver library not found (libnvidia-ml.so.1: {e})")
        }
        NvmlError::LibraryNotFound => {
            "NVIDIA driver library not found (libnvidia-ml.so.1)".to_string()
        }
        NvmlError::DriverNotLoaded => {
            "the NVIDIA driver is not loaded (libnvidia-ml.so.1 found, no kernel module)"
                .to_string()
        }
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => format!("NVML could not start: {other}"),
    };
    GpuError::NvmlUnavailable { reason }
}

fn nvml_err(what: &'static str) -> impl FnOnce(NvmlError) -> GpuError {
    move |source| GpuError::Nvml { what, source }
}

/// Optional readings: a GPU that does not support one reports nothing, not an error.
fn optional<T>(r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(error = %e, "NVML reading unavailable");
            None
        }
    }
}

impl NvmlBackend {
    /// Loads libnvidia-ml and lists the GPUs; an error when there is no usable GPU.
    pub fn open() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(init_error)?;
        let count = nvml.device_count().map_err(nvml_err("device count"))?;
        let mut inventory = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = nvml
                .device_by_index(index)
                .map_err(nvml_err("device lookup"))?;
            inventory.push(GpuInfo {
                index,
                uuid: dev.uuid().map_err(nvml_err("uuid"))?,
                name: dev.name().map_err(nvml_err("name"))?,
                total_mib: dev.memory_info().map_err(nvml_err("memory info"))?.total / MIB,
            });
        }
        if inventory.is_empty() {
            return Err(GpuError::NvmlUnavailable {
                reason: "NVML loaded but reports no GPU".to_string(),
            });
        }
        Ok(Self { nvml, inventory })
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Vec<GpuInfo> {
        self.inventory.clone()
    }

    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        let mut out = Vec::with_capacity(self.inventory.len());
        for gpu in &self.inventory {
            let dev = self
                .nvml
                .device_by_index(gpu.index)
                .map_err(nvml_err("device lookup"))?;
            let mem = dev.memory_info().map_err(nvml_err("memory info"))?;
            let processes = optional(dev.running_compute_processes())
                .unwrap_or_default()
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => bytes.div_ceil(MIB),
                        UsedGpuMemory::Unavailable => 0,
                    },
                    attempt: procscan::attempt_of(p.pid),
                    user: None,
                    command: None,
                })
                .collect();
            out.push(GpuSample {
                index: gpu.index,
                used_mib: mem.used / MIB,
                free_mib: mem.free / MIB,
                utilization_pct: optional(dev.utilization_rates()).map(|u| u.gpu),
                power_mw: optional(dev.power_usage()).map(u64::from),
                temperature_c: optional(dev.temperature(TemperatureSensor::Gpu)),
                processes,
            });
        }
        Ok(out)
    }

    fn job_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
