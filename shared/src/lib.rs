//! Domain types shared by the coordinator, the agent and the CLI: ids, sizes, plans,
//! experiment specs and their expansion, job states and the REST API's DTOs.
#![forbid(unsafe_code)]

pub mod api;
#[cfg(feature = "client")]
pub mod client;
pub mod colocate;
pub mod expand;
pub mod field;
pub mod ids;
pub mod pending;
pub mod plan;
pub mod prestart;
pub mod profile;
pub mod routes;
#[cfg(feature = "settings")]
pub mod settings;
#[cfg(feature = "signals")]
pub mod signals;
pub mod size;
pub mod spec;
pub mod state;
pub mod template;

pub use ids::{AgentId, AttemptId, ExperimentId, JobId};
pub use plan::Plan;
pub use size::MemSize;
pub use state::{FailureClass, JobEvent, JobState};
