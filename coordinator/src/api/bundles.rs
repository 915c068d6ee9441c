//! Code bundles (`code: snapshot`): kept under the SHA-256 of their bytes as a submitter
//! uploads them, read by the agents that run their jobs.

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use headroom_shared::api::bounds;
use headroom_shared::api::source::BundleStored;
use headroom_shared::api::{ErrorCode, Principal, Role};
use sha2::{Digest, Sha256};

use super::{ApiError, ApiJson, ApiPath, ApiResult, AppState};

/// Bundle uploads held at once by this coordinator.
const UPLOADS_AT_ONCE: usize = 4;
static UPLOADS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(UPLOADS_AT_ONCE);

/// A bundle's name in the path: a malformed one is a malformed request, as a bad id is.
fn checked(hash: &str) -> Result<(), ApiError> {
    bounds::SHA256
        .check(hash)
        .map_err(|m| ApiError::new(ErrorCode::BadRequest, format!("bundle {m}")))
}

pub async fn put(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(hash): ApiPath<String>,
    body: Body,
) -> ApiResult<BundleStored> {
    checked(&hash)?;
    // A bundle is held whole in memory to be hashed and stored: a few at a time.
    let _permit = UPLOADS.try_acquire().map_err(|_| {
        ApiError::new(
            ErrorCode::Busy,
            format!("{UPLOADS_AT_ONCE} bundles are being uploaded: try again shortly"),
        )
    })?;
    let max = s.config.max_bundle_bytes;
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let data = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::too_large(
            "snapshot",
            format!(
                "the bundle is over this coordinator's --max-bundle-size ({}): leave large \
                 files out of it (.gitignore, .headroomignore)",
                bytesize::ByteSize::b(max).display().iec()
            ),
        )
    })?;
    let got = hex::encode(Sha256::digest(&data));
    if got != hash {
        return Err(ApiError::invalid(
            "hash",
            format!("the body's SHA-256 is {got}, not the {hash} of the path"),
        ));
    }
    let bytes = data.len() as u64;
    let stored = s
        .store
        .put_bundle(hash.clone(), data.into(), who.name)
        .await?;
    Ok(ApiJson(BundleStored {
        hash,
        bytes,
        stored,
    }))
}

/// A bundle's bytes, to an agent whose node runs an attempt from it (or an admin): a node
/// fetches only the code of the jobs leased to it.
pub async fn get(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(hash): ApiPath<String>,
) -> Result<Response, ApiError> {
    checked(&hash)?;
    if who.role != Role::Admin
        && !s
            .store
            .bundle_leased_to(hash.clone(), who.name.clone())
            .await?
    {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "node `{}` runs no attempt from bundle {hash}: a node fetches only the code of \
                 the jobs leased to it",
                who.name
            ),
        ));
    }
    match s.store.bundle(hash.clone()).await? {
        Some(data) => {
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
        }
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no bundle {hash} is kept here"),
        )),
    }
}
