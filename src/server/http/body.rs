//! Request bodies and query strings read strictly: bounded in size, unknown
//! fields refused, and every failure answered as a JSON [`ApiError`].

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::listen::BodyError;

/// The largest body of a request about one job.
pub const MAX_BODY: usize = 2 * 1024 * 1024;

/// The largest body of a batch create.
pub const MAX_BATCH_BODY: usize = 64 * 1024 * 1024;

/// A JSON body of at most [`MAX_BODY`] bytes. An empty body reads as `{}`.
pub struct Body<T>(pub T);

/// A JSON body of at most [`MAX_BATCH_BODY`] bytes.
pub struct BatchBody<T>(pub T);

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("request body is larger than {limit} bytes; job data is limited to 1 MiB"),
    )
}

/// Whether an error from reading a body is the size limit (rather than,
/// say, a body that ended early).
fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = current.source();
    }
    false
}

/// The answer to a body the HTTP port's bounds stopped (see
/// [`super::listen`]), if that is why it could not be read.
fn bound_error(error: &axum::Error) -> Option<ApiError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(bound) = current.downcast_ref::<BodyError>() {
            return match bound {
                BodyError::TooLarge { limit } => Some(too_large(*limit)),
                BodyError::OverBudget => Some(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_busy",
                    bound.to_string(),
                )),
                BodyError::TimedOut(_) => Some(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    bound.to_string(),
                )),
                BodyError::Read(_) => None,
            };
        }
        source = current.source();
    }
    None
}

async fn read_json<T: DeserializeOwned>(req: Request, limit: usize) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|error| {
            if let Some(answer) = bound_error(&error) {
                answer
            } else if is_length_limit(&error) {
                too_large(limit)
            } else {
                ApiError::bad_request(format!("request body could not be read: {error}"))
            }
        })?;
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    // Only an object: serde would otherwise read `[a, b]` as fields in order.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    serde_json::from_slice(text)
        .map_err(|error| ApiError::bad_request(format!("request body is not valid: {error}")))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        read_json(req, MAX_BODY).await.map(Body)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for BatchBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        read_json(req, MAX_BATCH_BODY).await.map(BatchBody)
    }
}

/// A query string read with unknown parameters refused.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(query)
            .map(Params)
            .map_err(|error| ApiError::bad_request(format!("query string is not valid: {error}")))
    }
}
