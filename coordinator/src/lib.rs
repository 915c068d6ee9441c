//! The coordinator: REST API over a store, placement and leases.
//!
//! # Layout
//! Dependencies point one way, top to bottom:
//! - `app`, `config`, `serve`: the process (settings, listener and the bounds a slow client
//!   cannot outlast, background sweeps); `main.rs` is thin. `admission`: claims' turns at the
//!   store, so that however many claim, heartbeats and reports find a connection. `owners`:
//!   which node each agent and attempt belongs to, once read (agent tokens' checks).
//! - `api` (handlers, one gate `authorize`, one error mapping), `auth` (who a token is),
//!   `metrics`, `openapi`, `export`, `logs`, `tracking` (MLflow), `settle` (a study's waits
//!   counted again after the changes that move them), `charging` (ended runs charged to their
//!   users' fair-share ledgers), `preempting` (running preemptible jobs stopped and requeued
//!   for those under their share), `alerting` (alerts sent to webhooks and mail from the
//!   store's outbox; `alert_settings`: what they may be sent to): the HTTP edge and its tasks (`api/ui.rs` serves the
//!   dashboard, its page and assets in `ui/`).
//! - `matrix`: a submitted spec turned into the jobs to store; `source`: where they run
//!   from (working directory, code, environment).
//! - `store`: every durable change, one transaction per operation, written once over the
//!   transaction interface both backends (SQLite, PostgreSQL) implement.
//! - `rules` (job decisions), `fair` (fair share and users' caps, below `rules`),
//!   `placement` (which GPUs; `timeline`: a GPU's memory over time, for runs that declared
//!   their phases), `preempt` (which running jobs make room, over `placement`), `sharing` (attempts that shared a
//!   GPU, and their energy shares), `attempt_keys` (the credential issued with a lease),
//!   `joins` (which nodes a join token may make), `early_stop` (successive halving's rule) and
//!   `simulate` (placement over simulated GPUs and time): pure, no I/O; `changes`: the
//!   counter long-polls wait on.
//! - `preview` (a spec's schedule before it runs, for `submit --dry-run`): over `placement`
//!   and `simulate`, pure.
#![forbid(unsafe_code)]

pub mod admission;
pub mod alert_settings;
pub mod alerting;
pub mod api;
pub mod app;
pub mod attempt_keys;
pub mod auth;
pub mod changes;
pub mod charging;
pub mod config;
pub mod early_stop;
pub mod export;
pub mod fair;
pub mod joins;
pub mod logs;
pub mod matrix;
pub mod metrics;
pub mod openapi;
pub mod owners;
pub mod placement;
pub mod preempt;
pub mod preempting;
pub mod preview;
pub mod rules;
pub mod serve;
pub mod settle;
pub mod sharing;
pub mod simulate;
pub mod source;
pub mod store;
pub mod timeline;
pub mod tracking;

pub use app::Application;
pub use config::{CoordinatorConfig, CoordinatorSettings};
