//! Errors of the HTTP API as JSON: `{"code": "...", "message": "..."}` with
//! an HTTP status, the code stable for programs, the message for people.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::protocol::JobError;

/// An error answer of the HTTP API.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable snake_case code.
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// An error with its parts.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// A request the server could not read.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

impl From<JobError> for ApiError {
    fn from(error: JobError) -> Self {
        let status = match error.status() {
            401 | 402 | 430 => StatusCode::BAD_REQUEST,
            404 => StatusCode::NOT_FOUND,
            405 | 409 => StatusCode::CONFLICT,
            503 => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            code: error.code(),
            message: error.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A busy server is worth asking again shortly.
        let busy = self.code == "server_busy";
        let mut response = (
            self.status,
            Json(json!({"code": self.code, "message": self.message})),
        )
            .into_response();
        if busy {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}
