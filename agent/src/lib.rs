//! The agent of a GPU node: finds its GPUs, pulls leases from the coordinator, admits and
//! runs jobs under a supervisor that cleans up every process they leave behind.
// `unsafe` is denied except where a child must call setsid/prctl between fork and exec.
#![deny(unsafe_code)]

pub mod agent;
pub mod attempts;
pub mod backoff;
pub mod classify;
pub mod client;
pub mod colocate;
pub mod fence;
pub mod gpu;
mod heartbeat;
mod lease;
pub mod measure;
pub mod metrics;
pub mod outcomes;
pub mod prestart;
pub mod procscan;
pub mod settings;
pub mod shim;
pub mod supervisor;
pub mod sweep;
pub mod telemetry;
