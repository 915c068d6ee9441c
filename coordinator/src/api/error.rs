//! The API's one error type, mapped once to `{"error": {"code", "message", "field"?}}`.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use headroom_shared::api::{ErrorBody, ErrorDetail};
use headroom_shared::spec::SpecError;

use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid",
            message: message.into(),
            field: Some(field.into()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                field: self.field,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            StoreError::StaleFence { .. } => {
                Self::new(StatusCode::CONFLICT, "stale_fence", message)
            }
            StoreError::UnknownAgent { .. } => {
                Self::new(StatusCode::CONFLICT, "unknown_agent", message)
            }
            StoreError::Transition(_) => Self::new(StatusCode::CONFLICT, "conflict", message),
            StoreError::InvalidPlan(p) => Self::invalid("plan", p.to_string()),
            StoreError::Database(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                message,
            ),
            StoreError::Corrupt(_) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
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
        Self::new(r.status(), "bad_request", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
    }
}

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
