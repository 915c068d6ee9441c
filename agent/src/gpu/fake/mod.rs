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
//! NVML's initialisation does on a node without persistence mode; `read-delay` makes each
//! reading of the GPUs take that long, as NVML's calls do on a node whose driver is busy or
//! wedged.
//!
//! `memory-caps` makes the GPUs able to hold each attempt to a hard memory limit, which the
//! agent then sets in `memcap.<attempt>` (MiB on each GPU): an allocation that would take
//! the attempt's processes past it fails with CUDA's OOM text, as a driver's limit would.
//!
//! A usage entry may also declare utilization, `INDEX:MiB:PCT`; the GPUs' power,
//! temperature and energy follow what their processes declare ([`super::fakepower`]).
//!
//! Its parts: `spec` (the GPUs' sizes as users write them), `usage` (the usage files jobs
//! write), `controls` (the fault and control files), `power` (the power model's state as the
//! folder keeps it, shared by every reader), `backend` (the GPUs read from all of them).

mod backend;
mod controls;
mod power;
mod spec;
mod usage;

pub use backend::FakeBackend;
pub use controls::{Fault, MEMORY_CAPS_FILE, PID_NAMESPACE_FILE, cap_file, fault_file, read_cap};
pub use spec::{FakeGpuSpec, FakeSpecError};
pub use usage::{
    FakeUse, first_visible_gpu, lock_dir, read_usage, remove_usage, used_on, write_usage,
    write_usage_util,
};

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
/// [`super::fakepower::PowerModel`]'s fields), e.g. a short time constant so that tests
/// heat and cool a fake GPU in seconds.
pub const POWER_MODEL_FILE: &str = "power-model";

/// Control file: opening the backend takes this long (`3s`, `500ms`), as NVML's
/// initialisation may (seconds without persistence mode), so that what waits for it, and
/// what must not, can be tested.
pub const OPEN_DELAY_FILE: &str = "open-delay";
/// Control file: each reading of the GPUs takes this long (`2s`), as NVML's calls may on a
/// node whose driver is busy, so that what must not wait for a reading can be tested.
pub const READ_DELAY_FILE: &str = "read-delay";
