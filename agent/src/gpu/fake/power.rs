//! The fake GPUs' power model ([`crate::gpu::fakepower`]) as their folder keeps it: its
//! constants with the folder's overrides ([`POWER_MODEL_FILE`]), and every GPU's state
//! ([`POWER_STATE_FILE`]), advanced by each reading of any process (the agent, each attempt
//! supervisor), so that all see one GPU: one temperature, one energy counter.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use headroom_shared::api::GpuInfo;

use super::controls::Controls;
use super::usage::{FakeUse, used_on};
use super::{POWER_LOCK_FILE, POWER_MODEL_FILE, POWER_STATE_FILE};
use crate::gpu::fakepower::{GpuState, PowerModel};

/// The power state of one folder's GPUs, as this process last saw it; its one owner.
#[derive(Debug)]
pub(super) struct SharedPower {
    dir: PathBuf,
    model: PowerModel,
    /// Each GPU's state at its last reading (this process's copy when the folder's cannot be
    /// read or written).
    states: Mutex<Vec<GpuState>>,
}

impl SharedPower {
    /// Idle `gpus`, until a reading finds the folder's state.
    pub(super) fn new(dir: &Path, gpus: usize) -> Self {
        let model = PowerModel::default();
        Self {
            dir: dir.to_path_buf(),
            model,
            states: Mutex::new(vec![GpuState::idle(&model, 0.0); gpus]),
        }
    }

    /// The model's constants, without the folder's overrides.
    pub(super) fn model(&self) -> PowerModel {
        self.model
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
    /// (yet) or it does not fit these `gpus`.
    fn read_state(&self, gpus: usize) -> Option<Vec<GpuState>> {
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
        (states.len() == gpus).then_some(states)
    }

    fn write_state(&self, states: &[GpuState]) -> io::Result<()> {
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
    pub(super) fn observe(
        &self,
        inventory: &[GpuInfo],
        uses: &[FakeUse],
        controls: &Controls,
    ) -> Vec<(GpuState, u32)> {
        let model = self.model_of(controls);
        let mut power = self
            .states
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
            match self.read_state(inventory.len()) {
                Some(shared) => *power = shared,
                // None yet: idle GPUs from now on.
                None if power.iter().all(|g| g.at_s == 0.0) => {
                    *power = vec![GpuState::idle(&model, t); inventory.len()];
                }
                None => {}
            }
        }
        let out = inventory
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
            && let Err(e) = self.write_state(&power)
        {
            tracing::debug!("fake GPU power state not shared: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{FakeBackend, FakeGpuSpec, remove_usage, write_usage_util};
    use super::*;
    use crate::gpu::GpuBackend;

    fn spec(s: &str) -> FakeGpuSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
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
