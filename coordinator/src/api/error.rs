//! The API's one error type, mapped once to `{"error": {"code", "message", "field"?}}`; the
//! status comes from the code (`ErrorCode::status`), so the two never disagree.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use headroom_shared::AttemptId;
use headroom_shared::api::{ErrorBody, ErrorCode, ErrorDetail};
use headroom_shared::spec::SpecError;

use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    /// The attempt the error is about, as a field of the answer.
    pub attempt: Option<AttemptId>,
    /// Only for axum's own rejections (413, 415, ...), whose status says more than a code.
    status: Option<StatusCode>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            attempt: None,
            status: None,
        }
    }

    /// A wrong field of the request (422), named.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(ErrorCode::Invalid, message)
        }
    }

    /// A body over a bound of the route's own (413), naming the field it carries.
    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: Some(StatusCode::PAYLOAD_TOO_LARGE),
            ..Self::invalid(field, message)
        }
    }

    /// A known path asked with a method it does not take (405, in the error shape).
    pub fn method_not_allowed() -> Self {
        Self {
            status: Some(StatusCode::METHOD_NOT_ALLOWED),
            ..Self::new(
                ErrorCode::BadRequest,
                "this path does not take that method (see /openapi.json)",
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(code = %self.code, "{}", self.message);
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                field: self.field,
                attempt: self.attempt,
            },
        };
        let busy = self.code == ErrorCode::Busy;
        let mut response = (status, Json(body)).into_response();
        if busy {
            // A client that reads it waits this long; the agent's own backoff is jittered.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(BUSY_RETRY_AFTER),
            );
        }
        response
    }
}

/// Seconds a busy answer asks its client to wait (`Retry-After`).
pub const BUSY_RETRY_AFTER: &str = "1";

impl From<crate::admission::Busy> for ApiError {
    fn from(e: crate::admission::Busy) -> Self {
        Self::new(ErrorCode::Busy, e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::NotFound { .. } => Self::new(ErrorCode::NotFound, message),
            StoreError::StaleFence { attempt } => Self {
                attempt: Some(attempt),
                ..Self::new(ErrorCode::StaleFence, message)
            },
            StoreError::UnknownAgent { .. } => Self::new(ErrorCode::UnknownAgent, message),
            StoreError::Transition(_)
            | StoreError::Conflict { .. }
            | StoreError::TokenExists { .. }
            | StoreError::NodeHeld { .. }
            | StoreError::NodeJoined { .. }
            | StoreError::UserRole { .. } => Self::new(ErrorCode::Conflict, message),
            // A well-formed plan of another length than the node has GPUs: the node's state
            // refuses it, not its form (which the document describes).
            StoreError::InvalidPlan(p @ headroom_shared::plan::PlanError::WrongLength { .. }) => {
                Self::new(ErrorCode::Conflict, format!("plan: {p}"))
            }
            StoreError::InvalidPlan(p) => Self::invalid("plan", p.to_string()),
            StoreError::Database(_) => Self::new(ErrorCode::StoreUnavailable, message),
            StoreError::Corrupt(_) => Self::internal(message),
            StoreError::Invalid { field, message } => Self::invalid(field, message),
        }
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        Self::invalid(e.field, e.message)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        Self {
            status: Some(r.status()),
            ..Self::new(ErrorCode::BadRequest, r.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::new(ErrorCode::BadRequest, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::new(ErrorCode::BadRequest, r.body_text())
    }
}

/// `Path` whose rejections (a GPU index that is not a number, bytes that are not UTF-8)
/// come out in the API's error shape, not as axum's plain text.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `Json` whose rejections come out in the API's error shape.
#[derive(axum::extract::FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `Query` whose rejections come out in the API's error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

pub type ApiResult<T> = Result<ApiJson<T>, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_race_is_a_conflict_not_an_outage() {
        for e in [
            StoreError::Conflict {
                job: Some("j".into()),
            },
            StoreError::Conflict { job: None },
        ] {
            assert_eq!(ApiError::from(e).status(), StatusCode::CONFLICT);
        }
        let down = ApiError::from(StoreError::Database("connection refused".into()));
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn a_stale_fence_names_its_attempt_in_a_field() {
        let attempt = AttemptId::new();
        let e = ApiError::from(StoreError::StaleFence { attempt });
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert_eq!(e.attempt, Some(attempt));
    }
}
