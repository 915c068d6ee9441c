//! The NVML backend: real GPUs through libnvidia-ml, loaded at run time by nvml-wrapper.

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use std::ffi::OsStr;

use headroom_shared::api::{GpuInfo, GpuSample, TelemetrySample};

use super::{GpuBackend, GpuError, PidView, Reported, attribute, inventory_words};

const MIB: u64 = 1024 * 1024;

pub struct NvmlBackend {
    nvml: Nvml,
    inventory: Vec<GpuInfo>,
    /// How NVML's (host) pids map to the agent's.
    pids: PidView,
    /// The process-list call the last reading used (older drivers lack `_v3`).
    process_api: std::sync::Mutex<Option<&'static str>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

/// Turns a failed `Nvml::init` into what a user can act on. Only a library that is not there
/// at all is [`GpuError::NoDriver`] (the one case `auto` runs fake GPUs); a library that is
/// there but fails is a broken GPU node.
pub(crate) fn init_error(e: NvmlError) -> GpuError {
    match e {
        // dlopen found no file: no NVIDIA driver on this machine.
        NvmlError::LibloadingError(e) if is_missing_file(&e.to_string()) => GpuError::NoDriver {
            reason: "no NVIDIA driver (libnvidia-ml.so.1 not found)".to_string(),
        },
        // Found, but not loadable (wrong architecture, missing dependency, corrupt).
        NvmlError::LibloadingError(e) => GpuError::NvmlUnavailable {
            reason: format!("the NVIDIA driver library cannot be loaded: {e}"),
        },
        NvmlError::LibraryNotFound => GpuError::NoDriver {
            reason: "no NVIDIA driver (NVML found no driver library)".to_string(),
        },
        NvmlError::FailedToLoadSymbol(sym) => GpuError::NvmlUnavailable {
            reason: format!("the NVIDIA driver library lacks {sym} (a driver older than NVML 11?)"),
        },
        NvmlError::DriverNotLoaded => GpuError::NvmlUnavailable {
            reason: "the NVIDIA driver is not loaded (libnvidia-ml.so.1 found, no kernel \
                     module: check `nvidia-smi`, `lsmod | grep nvidia`)"
                .to_string(),
        },
        NvmlError::NoPermission => GpuError::NvmlUnavailable {
            reason: "no permission to talk to the NVIDIA driver (/dev/nvidia*)".to_string(),
        },
        other => GpuError::NvmlUnavailable {
            reason: format!("NVML could not start: {other}"),
        },
    }
}

/// Whether a dlopen message says the file does not exist (glibc: "cannot open shared object
/// file: No such file or directory").
fn is_missing_file(msg: &str) -> bool {
    msg.contains("No such file or directory")
}

fn nvml_err(what: &'static str) -> impl FnOnce(NvmlError) -> GpuError {
    move |source| match source {
        NvmlError::FailedToLoadSymbol(sym) => GpuError::NvmlUnavailable {
            reason: format!("NVML {what}: the NVIDIA driver lacks {sym} (too old for headroom)"),
        },
        source => GpuError::Nvml { what, source },
    }
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

/// Each process's SM utilization over the driver's last couple of seconds, by (host) pid;
/// `None` where the driver does not give it.
fn process_utilization(
    dev: &nvml_wrapper::Device<'_>,
) -> Option<std::collections::HashMap<u32, u32>> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_micros()
        .saturating_sub(2_000_000);
    let samples = match dev.process_utilization_stats(u64::try_from(since).ok()) {
        Ok(s) => s,
        // No sample in the window: nothing used the SMs.
        Err(NvmlError::NotFound) => Vec::new(),
        Err(e) => {
            tracing::debug!(error = %e, "NVML per-process utilization unavailable");
            return None;
        }
    };
    let mut latest: std::collections::HashMap<u32, (u64, u32)> = std::collections::HashMap::new();
    for s in samples {
        let e = latest.entry(s.pid).or_insert((s.timestamp, s.sm_util));
        if s.timestamp >= e.0 {
            *e = (s.timestamp, s.sm_util);
        }
    }
    Some(latest.into_iter().map(|(pid, (_, u))| (pid, u)).collect())
}

/// NVML's clock event (throttle) reasons as names, idle left out (not a slowdown).
pub(crate) fn throttle_names(reasons: ThrottleReasons) -> Vec<String> {
    const NAMES: &[(ThrottleReasons, &str)] = &[
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    NAMES
        .iter()
        .filter(|(bit, _)| reasons.contains(*bit))
        .map(|(_, name)| (*name).to_string())
        .collect()
}

impl NvmlBackend {
    /// One GPU's telemetry: each reading on its own, a failed one absent.
    fn telemetry_one(&self, gpu: &GpuInfo, at: chrono::DateTime<chrono::Utc>) -> TelemetrySample {
        let dev = match self.nvml.device_by_index(gpu.index) {
            Ok(dev) => dev,
            Err(e) => {
                return TelemetrySample {
                    gpu: gpu.index,
                    at,
                    error: Some(format!("NVML device lookup: {e}")),
                    ..TelemetrySample::default()
                };
            }
        };
        let (memory, error) = match dev.memory_info() {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(format!("NVML memory info: {e}"))),
        };
        TelemetrySample {
            gpu: gpu.index,
            at,
            used_mib: memory.as_ref().map(|m| m.used / MIB),
            free_mib: memory.as_ref().map(|m| m.free / MIB),
            total_mib: memory.as_ref().map(|m| m.total / MIB),
            utilization_pct: optional(dev.utilization_rates()).map(|u| u.gpu),
            power_w: optional(dev.power_usage()).map(|mw| f64::from(mw) / 1000.0),
            energy_j: optional(dev.total_energy_consumption()).map(|mj| mj as f64 / 1000.0),
            temperature_c: optional(dev.temperature(TemperatureSensor::Gpu)).map(f64::from),
            sm_clock_mhz: optional(dev.clock_info(Clock::SM)),
            throttle: optional(dev.current_throttle_reasons()).map(throttle_names),
            error,
        }
    }

    /// Loads libnvidia-ml and lists the GPUs; an error when there is no usable GPU.
    pub fn open() -> Result<Self, GpuError> {
        Self::open_at(None)
    }

    /// [`open`](Self::open) with the library at `lib` (default: the system's).
    pub fn open_at(lib: Option<&OsStr>) -> Result<Self, GpuError> {
        let nvml = match lib {
            None => Nvml::init(),
            Some(path) => Nvml::builder().lib_path(path).init(),
        }
        .map_err(init_error)?;
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
            // A driver without GPUs (all hidden from this container?) is not a machine
            // without a driver: say so rather than run fake GPUs.
            return Err(GpuError::NvmlUnavailable {
                reason: "the NVIDIA driver reports no GPU (NVIDIA_VISIBLE_DEVICES?)".to_string(),
            });
        }
        Ok(Self {
            nvml,
            inventory,
            pids: PidView::detect(),
            process_api: std::sync::Mutex::new(None),
        })
    }

    /// One GPU's reading; what fails is carried in its `error`, other GPUs are unaffected.
    fn sample_one(&self, gpu: &GpuInfo) -> GpuSample {
        let dev = match self.nvml.device_by_index(gpu.index) {
            Ok(dev) => dev,
            Err(e) => return super::unknown(gpu.index, format!("NVML device lookup: {e}")),
        };
        let mut errors = Vec::new();
        let (used_mib, free_mib) = match dev.memory_info() {
            Ok(mem) => (mem.used / MIB, mem.free / MIB),
            Err(e) => {
                errors.push(format!("NVML memory info: {e}"));
                (0, 0)
            }
        };
        // NotSupported included: a GPU whose processes cannot be listed cannot be verified.
        // Older drivers lack the `_v3` call: ask them with `_v2`.
        let (listed, api) = match dev.running_compute_processes() {
            Err(NvmlError::FailedToLoadSymbol(_)) => (
                dev.running_compute_processes_v2(),
                "nvmlDeviceGetComputeRunningProcesses_v2",
            ),
            listed => (listed, "nvmlDeviceGetComputeRunningProcesses_v3"),
        };
        if listed.is_ok() {
            *self
                .process_api
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(api);
        }
        let processes = match listed {
            Ok(list) => {
                let util = process_utilization(&dev);
                let reported: Vec<Reported> = list
                    .iter()
                    .map(|p| Reported {
                        pid: p.pid,
                        used_mib: match p.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => Some(bytes.div_ceil(MIB)),
                            UsedGpuMemory::Unavailable => None,
                        },
                        // A listed process without a sample used no SM time meanwhile.
                        sm_util_pct: util.as_ref().map(|u| u.get(&p.pid).copied().unwrap_or(0)),
                    })
                    .collect();
                let (processes, error) = attribute(&self.pids, &reported);
                errors.extend(error);
                processes
            }
            Err(e) => {
                errors.push(format!("NVML process list: {e}"));
                Vec::new()
            }
        };
        GpuSample {
            index: gpu.index,
            used_mib,
            free_mib,
            utilization_pct: optional(dev.utilization_rates()).map(|u| u.gpu),
            power_mw: optional(dev.power_usage()).map(u64::from),
            temperature_c: optional(dev.temperature(TemperatureSensor::Gpu)),
            processes,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
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
        Ok(self.inventory.iter().map(|g| self.sample_one(g)).collect())
    }

    fn telemetry(&self) -> Result<Vec<TelemetrySample>, GpuError> {
        let at = chrono::Utc::now();
        Ok(self
            .inventory
            .iter()
            .map(|g| self.telemetry_one(g, at))
            .collect())
    }

    fn job_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    fn memory_caps(&self) -> Result<String, String> {
        let dmem = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|n| n == "dmem"));
        Err(format!(
            "NVML: headroom sets no per-process GPU memory limit through the driver yet; the \
             kernel's dmem cgroup controller is {}",
            if dmem {
                "present, but headroom does not set its limits yet"
            } else {
                "absent (Linux 6.14 and later)"
            }
        ))
    }

    fn facts(&self) -> super::BackendFacts {
        let gpus = self
            .inventory
            .iter()
            .map(|g| {
                let dev = self.nvml.device_by_index(g.index);
                let fact = |r: Result<bool, NvmlError>| r.map_err(|e| e.to_string());
                super::GpuFacts {
                    index: g.index,
                    persistence: match &dev {
                        Ok(d) => fact(d.is_in_persistent_mode()),
                        Err(e) => Err(e.to_string()),
                    },
                    mig: match &dev {
                        Ok(d) => fact(d.mig_mode().map(|m| m.current != 0)),
                        Err(e) => Err(e.to_string()),
                    },
                }
            })
            .collect();
        super::BackendFacts {
            driver_version: self.nvml.sys_driver_version().map_err(|e| e.to_string()),
            nvml_version: self.nvml.sys_nvml_version().map_err(|e| e.to_string()),
            process_api: self
                .process_api
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .map(str::to_string),
            pid_namespace: self.pids.fact(),
            gpus,
        }
    }

    fn describe(&self) -> String {
        let mut line = format!("NVML: {}", inventory_words(&self.inventory));
        let pids = self.pids.describe();
        if !pids.is_empty() {
            line.push_str("; ");
            line.push_str(&pids);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reasons_are_named_and_idle_is_not_one() {
        let r = ThrottleReasons::SW_THERMAL_SLOWDOWN
            | ThrottleReasons::SW_POWER_CAP
            | ThrottleReasons::GPU_IDLE;
        assert_eq!(
            throttle_names(r),
            vec!["sw_power_cap", "sw_thermal_slowdown"]
        );
        assert!(throttle_names(ThrottleReasons::GPU_IDLE).is_empty());
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
    }
}
