//! The coordinator: REST API over a store, placement and leases.
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod auth;
pub mod changes;
pub mod config;
pub mod export;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod placement;
pub mod rules;
pub mod store;

pub use app::Application;
pub use config::{CoordinatorConfig, CoordinatorSettings};
