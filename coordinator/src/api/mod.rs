//! The REST API under `/v1`: routing and shared state. Handlers translate HTTP to store
//! calls and hold no SQL.

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post, put};
use headroom_shared::api::GpuSample;

use crate::changes::Changes;
use crate::config::CoordinatorConfig;
use crate::logs::LogStore;
use crate::store::Store;

mod agents;
pub mod error;
mod experiments;
mod jobs;
mod nodes;

pub use error::{ApiError, ApiJson, ApiQuery, ApiResult};

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    /// The store's change counter: long-polls wait on it, the store bumps it.
    pub changes: Changes,
    pub logs: LogStore,
    pub config: Arc<CoordinatorConfig>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/health", get(experiments::health))
        .route(
            "/v1/experiments",
            post(experiments::submit).get(experiments::list),
        )
        .route("/v1/experiments/{id}", get(experiments::get_one))
        .route("/v1/experiments/{id}/cancel", post(experiments::cancel))
        .route("/v1/progress", get(experiments::progress))
        .route("/v1/export", get(experiments::export))
        .route("/v1/jobs", get(jobs::list))
        .route("/v1/jobs/{id}", get(jobs::get_one))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/retry", post(jobs::retry))
        .route("/v1/attempts/{id}", get(jobs::attempt))
        .route(
            "/v1/attempts/{id}/log",
            get(jobs::read_log).post(agents::append_log),
        )
        .route("/v1/attempts/{id}/start", post(agents::start))
        .route("/v1/attempts/{id}/finish", post(agents::finish))
        .route("/v1/attempts/{id}/handback", post(agents::hand_back))
        .route("/v1/nodes", get(nodes::list))
        .route("/v1/nodes/{name}/plan", put(nodes::set_plan))
        .route(
            "/v1/nodes/{name}/gpus/{gpu}/release",
            post(nodes::release_gpu),
        )
        .route("/v1/agents/register", post(agents::register))
        .route("/v1/agents/{id}/claim", post(agents::claim))
        .route("/v1/agents/{id}/heartbeat", post(agents::heartbeat))
        .with_state(state)
}

/// Parses an id from the path, naming it in the error.
fn parse_id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "bad_request",
            format!("`{raw}` is not a valid {what} id"),
        )
    })
}

/// Samples must name GPUs the node has; a typo'd index would be silently ignored.
fn check_samples(samples: &[GpuSample]) -> Result<(), ApiError> {
    for (i, s) in samples.iter().enumerate() {
        if samples[..i].iter().any(|o| o.index == s.index) {
            return Err(ApiError::invalid(
                format!("gpus[{i}].index"),
                format!("GPU {} is reported twice", s.index),
            ));
        }
    }
    Ok(())
}
