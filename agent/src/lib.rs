//! The agent of a GPU node: finds its GPUs, pulls leases from the coordinator, admits and
//! runs jobs under a supervisor that cleans up every process they leave behind.
//!
//! # Layout
//! One binary, two programs, and what both use:
//! - `agent`: the agent process, a state machine run in its `mod.rs`. Re-attaches to what
//!   an earlier run left running (`recover`), registers (`register`), claims leases and
//!   admits each against live GPU memory (`claim`), hands it to a supervisor (`lease`),
//!   renews leases and fences itself when cut off (`heartbeat`, `self_fence`; `readings`, the
//!   GPU reading a heartbeat carries, never waited for past its bound), sweeps strays,
//!   samples telemetry, serves metrics.
//! - `supervisor`: the per-attempt supervisor process (the same binary, started with
//!   `supervisor::SUPERVISOR_ARG`): runs one attempt (`attempt`: spawn, run, watch and measure,
//!   stop and verify; `process` starts its processes), its wait (`prestart`) and colocated
//!   background (`colocate`), decides its end's failure class in one place from the facts
//!   recorded (`classify`; `oom` finds OOM text in its log), journals it, and stops its job
//!   itself when its lease is not renewed in time (`lease`, `self_fence`, `direct`).
//!   `supervisor::proto` is what the agent says to it. It never imports `agent`.
//! - `doctor`: `headroom doctor`, what headroom relies on of a node, checked.
//! - `cgroup` (each attempt's cgroup: membership, kill, host RAM peak), `gpu` (NVML and
//!   fake backends; `gpu::fake`: its spec, usage and control files, shared power state),
//!   `jobenv` (what of the agent's environment jobs get), `runas` (the Unix user a job runs
//!   as), `pyenv` (conda environments by name), `codetree` (a code bundle unpacked for an
//!   attempt, by its user), `procscan` (processes by their markers), `outcomes` (the journal of end reports):
//!   used by both.
// `unsafe` is denied except where an attempt's process is started (`supervisor::process`:
// the `clone3` into its cgroup or the fork, the child's signals, `close_range` and exec) and
// its exit is awaited (a pid file descriptor registered with the runtime).
#![deny(unsafe_code)]

/// A fixed-length name for an agent's scope (its data directory, a path of any length): what
/// its supervisors' socket names and its cgroup directory are made from. FNV-1a.
pub fn scope_hash(scope: &str) -> String {
    let hash = scope.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

pub mod agent;
pub mod cgroup;
pub mod codetree;
pub mod doctor;
pub mod gpu;
pub mod jobenv;
pub mod outcomes;
pub mod procscan;
pub mod pyenv;
pub mod runas;
pub mod supervisor;
