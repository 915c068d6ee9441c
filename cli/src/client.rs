//! The CLI's client of the REST API: the shared typed client (`headroom_shared::client`).

pub use headroom_shared::client::{Client as Api, ClientError, LogChunk};

/// Adds the hint people need when the coordinator cannot be reached at all.
pub fn with_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::Unreachable { .. }) => {
            e.context("is `headroom up` running? (see --server / HEADROOM_SERVER)")
        }
        _ => e,
    }
}
