//! Domain types shared by the coordinator, the agent and the CLI: ids, sizes, plans,
//! experiment specs and their expansion, job states and the REST API's DTOs.
//!
//! # Layout
//! From the bottom up (each imports only those above it in this list):
//! - `ids`, `size`, `state` (job states, events, failure classes), `plan`, `pending`,
//!   `profile`, `field` (a refused spec field), `template` (command placeholders), `oom`
//!   (what an OOM's text says it asked for).
//! - `secret` (secrets from files, systemd credentials or values), `datadir` (state
//!   directories taken only when this user's and private).
//! - `results` (metrics, early stopping, tracking: what a run achieved).
//! - `phases` (a run's GPU memory over time as declared), `memory_series` (as measured, and
//!   the phases fitted to it).
//! - `prestart`, `colocate`, `checkpoint` (the signal before a requeueing stop), `spec`
//!   (what a user submits, validated), `expand` (the matrix of jobs a spec makes), `study`
//!   (variants over shared defaults, and their `after`).
//! - `api` (the REST API's types; `api::agent`: the agent protocol; `api::source`: where an
//!   experiment's jobs run from), `routes` (every route
//!   once, with who may call it).
//! - Behind features: `client` (the typed HTTP client), `settings` (defaults, file, env,
//!   flags), `signals`, `bundle` (code bundles of `code: snapshot`).
#![forbid(unsafe_code)]

pub mod api;
#[cfg(feature = "bundle")]
pub mod bundle;
pub mod checkpoint;
#[cfg(feature = "client")]
pub mod client;
pub mod colocate;
pub mod datadir;
pub mod expand;
pub mod field;
pub mod ids;
#[cfg(feature = "logging")]
pub mod logging;
pub mod memory_series;
pub mod oom;
pub mod pending;
pub mod phases;
pub mod plan;
pub mod prestart;
pub mod profile;
pub mod results;
pub mod routes;
pub mod secret;
#[cfg(feature = "settings")]
pub mod settings;
#[cfg(feature = "signals")]
pub mod signals;
pub mod size;
pub mod spec;
pub mod state;
pub mod study;
pub mod template;

pub use ids::{AgentId, AttemptId, ExperimentId, JobId, StudyId};
pub use plan::Plan;
pub use size::MemSize;
pub use state::{FailureClass, JobEvent, JobState};
