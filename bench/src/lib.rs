//! headroom's benchmarks and its packing simulator.
//!
//! # Layout
//! - `main.rs` (`headroom-bench`): dispatch latency and throughput of the real binaries.
//! - `bin/`: the other benches (`headroom-bench-telemetry`) and `headroom-bench-simulate`,
//!   the policy comparison.
//! - `sim`: a discrete-event simulator over the coordinator's own placement.
//! - `workloads`: the seeds' figures and synthetic matrices for it.
#![forbid(unsafe_code)]

pub mod sim;
pub mod workloads;
