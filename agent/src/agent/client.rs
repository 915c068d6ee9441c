//! The coordinator client: the shared typed client (`headroom_shared::client`), which holds
//! the routes, the error codes and the transient/permanent split for every caller.

pub use headroom_shared::client::{BearerToken, Client, ClientError};
