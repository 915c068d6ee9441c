//! headroom's benchmarks and its packing simulator.
//!
//! # Layout
//! - `main.rs` (`headroom-bench`): dispatch latency and throughput of the real binaries,
//!   build against build.
//! - `suite/`: the real system against task-spooler, one module per bench (`system` starts a
//!   node, `tsp` drives task-spooler, `cpugroup` counts each side's CPU);
//!   `bin/headroom-bench-suite` runs them and writes `bench/results/`.
//! - `bin/`: the other benches (`headroom-bench-telemetry`), `headroom-bench-simulate` (the
//!   policy comparison) and `headroom-bench-stamp` (the benches' job: it reads the clock).
//! - `sim`: the coordinator's packing simulator (`headroom_coordinator::simulate`, which
//!   `headroom simulate` runs too).
//! - `workloads`: the seeds' figures and synthetic matrices for it.
#![forbid(unsafe_code)]

pub use headroom_coordinator::simulate as sim;
pub mod cpugroup;
pub mod offline;
pub mod suite;
pub mod system;
pub mod tsp;
pub mod workloads;
