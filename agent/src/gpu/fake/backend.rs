//! The fake backend itself: GPUs of the sizes it was given, read from the usage files
//! jobs write, with the faults the control files inject and the power the model gives.

use std::fs;
use std::path::{Path, PathBuf};

use headroom_shared::api::{GpuInfo, GpuSample, TelemetrySample};

use super::controls::{
    Controls, Fault, PID_NAMESPACE_FILE, fault_file, parse_driver_pids, read_control,
};
use super::power::SharedPower;
use super::spec::FakeGpuSpec;
use super::usage::{FakeUse, scan, used_on};
use super::{DIR_VAR, OPEN_DELAY_FILE, SPEC_VAR};
use crate::gpu::fakepower::{GpuState, PowerModel};
use crate::gpu::pidns::{self, PidView};
use crate::gpu::{GpuBackend, GpuError, Reported, attribute};

/// Simulated GPUs whose memory use is read from files in a directory.
#[derive(Debug)]
pub struct FakeBackend {
    spec: FakeGpuSpec,
    dir: PathBuf,
    inventory: Vec<GpuInfo>,
    /// Why `auto` chose fake GPUs (no NVIDIA driver), for the start line.
    fallback: Option<String>,
    /// Its GPUs' power, temperature and energy.
    power: SharedPower,
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
        let power = SharedPower::new(&dir, inventory.len());
        Ok(Self {
            spec,
            dir,
            inventory,
            fallback: None,
            power,
        })
    }

    /// Marks this backend as `auto`'s choice for `reason` (no NVIDIA driver).
    pub fn as_fallback(mut self, reason: String) -> Self {
        self.fallback = Some(reason);
        self
    }

    /// The power model's constants.
    pub fn power_model(&self) -> PowerModel {
        self.power.model()
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

    fn memory_caps(&self) -> Result<String, String> {
        let on = super::controls::read_control(&self.dir.join(super::MEMORY_CAPS_FILE));
        match on {
            Some(_) => Ok(
                "fake GPUs with memory caps (an allocation past an attempt's cap \
                           fails with CUDA's OOM text)"
                    .to_string(),
            ),
            None => Err(format!(
                "fake GPUs without memory caps (`{}` in {} turns them on)",
                super::MEMORY_CAPS_FILE,
                self.dir.display()
            )),
        }
    }

    fn set_memory_cap(
        &self,
        attempt: headroom_shared::AttemptId,
        mib: Option<u64>,
    ) -> Result<(), String> {
        let path = super::cap_file(&self.dir, &attempt.to_string());
        let done = match mib {
            Some(mib) => {
                self.memory_caps()?;
                // Readable by the attempt's jobs, whatever their user and this umask; made
                // anew, never through a link a job left in the shared folder.
                use std::io::Write;
                use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
                let tmp = self.dir.join(format!(".memcap.{attempt}.tmp"));
                let _ = std::fs::remove_file(&tmp);
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .mode(0o644)
                    .open(&tmp)
                    .and_then(|mut f| {
                        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
                        f.write_all(format!("{mib}\n").as_bytes())
                    })
                    .and_then(|()| std::fs::rename(&tmp, &path))
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        done.map_err(|e| format!("{}: {e}", path.display()))
    }

    fn inventory(&self) -> Vec<GpuInfo> {
        self.inventory.clone()
    }

    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        if let Some(text) = read_control(&self.dir.join(super::READ_DELAY_FILE))
            && let Ok(delay) = humantime::parse_duration(text.trim())
        {
            std::thread::sleep(delay);
        }
        let (uses, controls) =
            scan(&self.dir, self.spec.gpu_count()).map_err(|source| GpuError::FakeDir {
                dir: self.dir.clone(),
                source,
            })?;
        let view = self.pid_view(&controls);
        let power = self.power.observe(&self.inventory, &uses, &controls);
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
        let power = self.power.observe(&self.inventory, &uses, &controls);
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
                    crate::gpu::size_words(first.mib)
                )
            }
            _ => format!("{} fake GPUs ({})", sizes.len(), self.spec),
        };
        match &self.fallback {
            Some(reason) => format!("{reason}: {gpus}"),
            None => format!("--gpu-backend fake: {gpus} in {}", self.dir.display()),
        }
    }

    fn facts(&self) -> crate::gpu::BackendFacts {
        let controls = scan(&self.dir, self.spec.gpu_count())
            .map(|(_, c)| c)
            .unwrap_or_default();
        // A backend that opens slowly is what a driver without persistence mode is.
        let persistent = !self.dir.join(OPEN_DELAY_FILE).exists();
        crate::gpu::BackendFacts {
            driver_version: Ok("fake".to_string()),
            nvml_version: Ok("fake".to_string()),
            process_api: Some(format!("usage files in {}", self.dir.display())),
            pid_namespace: self.pid_view(&controls).fact(),
            gpus: self
                .inventory
                .iter()
                .map(|g| crate::gpu::GpuFacts {
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
    use std::collections::HashMap;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::procscan::{self, ATTEMPT_VAR};
    use headroom_shared::AttemptId;
    use headroom_shared::api::GpuProcess;

    /// Writes a usage file directly, as a shell job would.
    fn write_raw(dir: &Path, pid: u32, text: &str) {
        fs::write(dir.join(pid.to_string()), text).expect("write usage file");
    }

    fn spec(s: &str) -> FakeGpuSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
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
}
