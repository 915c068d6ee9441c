//! End-to-end tests over the real binaries (built first: `cargo build --workspace --bins`),
//! real HTTP, real stores and fake GPUs: one test binary, a module per topic, so the
//! workspace is linked once.

mod alerts;
mod auth;
mod binaries;
mod chaos;
mod cleanup;
mod cluster;
mod coordinator_restart;
mod drain;
mod failclosed;
mod failures;
mod fair_share;
mod fencing;
mod foreign;
mod host_memory;
mod late_outcomes;
mod measurements;
mod memory;
mod memory_cap;
mod packing;
mod pending;
mod plan;
mod preemption;
mod prestart;
mod project;
mod quickstart;
mod reattach;
mod restart;
mod results;
mod stale_reports;
mod studies;
mod submit;
mod supervision;
mod sweep;
mod telemetry;
mod trust;
