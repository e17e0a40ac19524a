//! The HTTP/JSON front-end: a resource API over the queue (`/jobs`, their
//! actions, and `/dequeue` with a wait), its OpenAPI document at
//! `/openapi.json`, the bearer-token check on every route but `/healthz`
//! and the dashboard at `/ui` (see [`ui`], which has its own login), and
//! browser safety (see [`browser`]) on every request.

mod archive;
mod body;
pub mod browser;
mod error;
pub mod events;
pub mod listen;
mod report_batch;
pub(crate) mod reports;
mod requests;
mod routes;
mod throttles;
pub mod ui;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

pub use browser::BrowserPolicy;
pub use error::ApiError;
pub use events::EventStreams;
pub use listen::{Limits, TlsFiles};
pub use requests::{MAX_LEASE_MS, MIN_LEASE_MS};

use crate::auth::ApiToken;
use crate::server::queue::Queue;

/// The API's routes over `queue`. Every route but `/healthz` requires
/// `Authorization: Bearer <token>`. Requests a browser page could have sent
/// are refused by `browser` (give it the bound address with
/// [`BrowserPolicy::bound_to`]).
pub fn router(queue: Queue, token: ApiToken, browser: BrowserPolicy) -> Router {
    let token_for_ui = token.clone();
    let api = Router::new()
        .route("/openapi.json", get(routes::openapi))
        .route("/jobs", post(routes::create).get(routes::list))
        .route("/jobs/batch", post(routes::create_many))
        .route("/jobs/requeue", post(routes::requeue))
        .route(
            "/jobs/{id}",
            get(routes::query)
                .patch(routes::update)
                .delete(routes::delete),
        )
        .route("/jobs/{id}/finish", post(routes::finish))
        .route("/jobs/{id}/retry", post(routes::retry))
        .route("/jobs/{id}/fail", post(routes::fail))
        .route("/jobs/{id}/cancel", post(routes::cancel))
        .route("/jobs/{id}/depends", post(routes::change_depends))
        .route("/jobs/{id}/heartbeat", post(routes::heartbeat))
        .route("/jobs/{id}/handback", post(routes::hand_back))
        .route("/jobs/{id}/tags", post(routes::tags))
        .route(
            "/jobs/{id}/track",
            post(routes::track).delete(routes::untrack),
        )
        .route("/tags", get(routes::top_tags))
        .route("/tracked", get(routes::tracked))
        .route("/dequeue", post(routes::dequeue))
        .route("/reports", post(report_batch::reports))
        .route("/jobs/{id}/history", get(reports::history))
        .route("/archive", get(archive::list))
        .route("/stats", get(reports::stats))
        .route("/stats/workers", get(reports::worker_stats))
        .route("/workers", get(reports::workers).post(reports::announce))
        .route("/failures", get(reports::failures))
        .route("/failures/{group}", get(reports::failure_group))
        .route("/failures/{group}/retry", post(reports::retry_group))
        .route("/failures/{group}/delete", post(reports::delete_group))
        .route("/purge", post(reports::purge))
        .route("/throttles", get(throttles::list))
        .route(
            "/throttles/{glob}",
            put(throttles::set).delete(throttles::delete),
        )
        .route("/events", get(events::stream))
        .route_layer(middleware::from_fn_with_state(token, require_token))
        .route_layer(middleware::from_fn(count_request));
    Router::new()
        .route("/healthz", get(routes::health))
        .merge(api)
        .merge(ui::router(queue.clone(), token_for_ui))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(browser, browser::guard))
        .with_state(queue)
}

/// Counts each request by method and route (`jobmgr_server_requests_total`).
async fn count_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    crate::metrics::server_request("http", request.method().as_str(), &route);
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "no such route; see /openapi.json",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; see /openapi.json",
    )
}

/// The token check. A request that passes it proves its connection
/// (see [`crate::server::admission`]); one that fails it closes it.
async fn require_token(State(token): State<ApiToken>, request: Request, next: Next) -> Response {
    let proof = request.extensions().get::<listen::Proof>().cloned();
    if !bearer_matches(request.headers(), &token) {
        let response = unauthorized().into_response();
        return if proof.is_some() {
            listen::closing(response)
        } else {
            response
        };
    }
    if proof.is_some_and(|proof| !proof.prove()) {
        // Evicted for a newcomer while its request was read.
        return listen::evicted();
    }
    next.run(request).await
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
pub fn bearer_matches(headers: &axum::http::HeaderMap, token: &ApiToken) -> bool {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, credentials)| credentials);
    token.matches(given)
}

/// The answer to a request without the right token.
pub fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or wrong bearer token: send `Authorization: Bearer <token>` with the server's \
         token, which is in the file `token` beside its database (readable by the server's user)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        let token = ApiToken::new("s3cret").unwrap();
        let with = |value: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(
                axum::http::header::AUTHORIZATION,
                value.parse().expect("a header value"),
            );
            bearer_matches(&headers, &token)
        };
        assert!(with("Bearer s3cret"));
        assert!(with("bearer s3cret"));
        assert!(with("BEARER s3cret"));
        for wrong in [
            "Bearer S3cret",
            "Basic s3cret",
            "Bearers3cret",
            "s3cret",
            "Bearer ",
        ] {
            assert!(!with(wrong), "{wrong}");
        }
        assert!(!bearer_matches(&axum::http::HeaderMap::new(), &token));
    }
}
