//! The API's throttles: `PUT /throttles/{glob}` sets one, `GET /throttles`
//! lists them with how many matching jobs are held now, and `DELETE
//! /throttles/{glob}` removes one. The GLOB is one path segment,
//! percent-encoded (`api%2F*` for `api/*`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::Body;
use super::error::ApiError;
use crate::server::queue::Queue;
use crate::server::queue::throttles::check;

type Answer = Result<Json<Value>, ApiError>;

/// `PUT /throttles/{glob}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetThrottleRequest {
    #[serde(default, deserialize_with = "super::requests::given")]
    max: Option<i64>,
}

/// `PUT /throttles/{glob}`: caps how many jobs matching the GLOB are held
/// at once, across every supervisor and server.
pub async fn set(
    State(queue): State<Queue>,
    Path(glob): Path<String>,
    Body(req): Body<SetThrottleRequest>,
) -> Answer {
    let max = req.max.ok_or_else(|| {
        ApiError::bad_request(
            "max is required: how many matching jobs may run at once (0 pauses them)",
        )
    })?;
    check(&glob, Some(max)).map_err(ApiError::bad_request)?;
    queue.set_throttle(glob.clone(), max).await?;
    Ok(Json(json!({"glob": glob, "max": max})))
}

/// `GET /throttles`: every throttle, with the jobs matching it held now.
pub async fn list(State(queue): State<Queue>) -> Answer {
    Ok(Json(json!({"throttles": queue.throttles().await?})))
}

/// `DELETE /throttles/{glob}`: removes a throttle; the jobs it held back
/// are handed out as usual.
pub async fn delete(State(queue): State<Queue>, Path(glob): Path<String>) -> Answer {
    check(&glob, None).map_err(ApiError::bad_request)?;
    if queue.delete_throttle(glob.clone()).await? {
        Ok(Json(json!({})))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_throttle",
            format!("there is no throttle for {glob:?}; see GET /throttles for those there are"),
        ))
    }
}
