//! Code bundles (`code: snapshot`): kept under the SHA-256 of their bytes as a submitter
//! uploads them, read by the agents that run their jobs.

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use headroom_shared::api::bounds;
use headroom_shared::api::source::BundleStored;
use headroom_shared::api::{ErrorCode, Principal};
use sha2::{Digest, Sha256};

use super::{ApiError, ApiJson, ApiPath, ApiResult, AppState};

fn checked(hash: &str) -> Result<(), ApiError> {
    bounds::SHA256
        .check(hash)
        .map_err(|m| ApiError::invalid("hash", m))
}

pub async fn put(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(hash): ApiPath<String>,
    body: Body,
) -> ApiResult<BundleStored> {
    checked(&hash)?;
    let max = s.config.max_bundle_bytes;
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let data = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::invalid(
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
        .put_bundle(hash.clone(), data.to_vec(), who.name)
        .await?;
    Ok(ApiJson(BundleStored {
        hash,
        bytes,
        stored,
    }))
}

pub async fn get(
    State(s): State<AppState>,
    ApiPath(hash): ApiPath<String>,
) -> Result<Response, ApiError> {
    checked(&hash)?;
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
