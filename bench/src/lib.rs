//! headroom's benchmarks and its packing simulator.
//!
//! # Layout
//! - `main.rs` (`headroom-bench`): dispatch latency and throughput of the real binaries.
//! - `bin/`: the other benches (`headroom-bench-telemetry`) and `headroom-bench-simulate`,
//!   the policy comparison.
//! - `sim`: the coordinator's packing simulator (`headroom_coordinator::simulate`, which
//!   `headroom simulate` runs too).
//! - `workloads`: the seeds' figures and synthetic matrices for it.
#![forbid(unsafe_code)]

pub use headroom_coordinator::simulate as sim;
pub mod workloads;
