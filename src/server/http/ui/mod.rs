//! The web dashboard at `/ui`: server-rendered pages (minijinja, escaping
//! everything by default) over the queue and the ledger, a little script
//! that refreshes each page's live part every 2 s, and charts drawn with
//! the vendored Chart.js.
//!
//! - **Login.** The API token, typed into a form once, gives an HttpOnly,
//!   SameSite=Strict session cookie ([`session`]); every page but the login
//!   form and the static files needs it, and a request without it is
//!   answered 401 with the login form.
//! - **Actions** are POST forms carrying the session's CSRF token and go
//!   through the same queue calls as the API; a GET never changes anything.
//!   Form bodies are accepted under `/ui` only (see
//!   [`super::browser`]), whose `Host` and `Origin` checks still apply.
//! - **Pages:** overview, jobs (filter and paging), a job, running now,
//!   failures, supervisors, statistics; each answers its live part alone
//!   when asked with `?live=1`.

mod actions;
mod assets;
mod depth;
mod pages;
mod render;
pub mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth::ApiToken;
use crate::server::queue::Queue;

pub use assets::CHART_JS_VERSION;
use render::Templates;
use session::Session;

/// What every dashboard handler has.
#[derive(Clone)]
pub struct Ui {
    queue: Queue,
    token: ApiToken,
    templates: Arc<Templates>,
    depth: depth::Depth,
}

/// The dashboard's routes, all under `/ui`.
pub fn router<S>(queue: Queue, token: ApiToken) -> Router<S> {
    let ui = Ui {
        queue,
        token,
        templates: Arc::new(Templates::new()),
        depth: depth::Depth::default(),
    };
    let pages = Router::new()
        .route("/ui", get(pages::overview))
        .route("/ui/", get(pages::overview))
        .route("/ui/jobs", get(pages::jobs))
        .route("/ui/jobs/{id}", get(pages::job))
        .route("/ui/running", get(pages::running))
        .route("/ui/failures", get(pages::failures))
        .route("/ui/supervisors", get(pages::supervisors))
        .route("/ui/stats", get(pages::stats))
        .route("/ui/logout", post(actions::logout))
        .route("/ui/jobs/{id}/{action}", post(actions::job_action))
        .route("/ui/failures/{group}/{action}", post(actions::group_action))
        .route_layer(middleware::from_fn_with_state(ui.clone(), require_session));
    Router::new()
        .route("/ui/login", get(pages::login).post(actions::login))
        .route("/ui/assets/{name}", get(assets::serve))
        .merge(pages)
        .layer(middleware::from_fn(page_headers))
        .with_state(ui)
}

/// Seconds since the epoch, by the wall clock (sessions expire by it).
fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Lets through requests with a valid session cookie (the session goes to
/// the handler as an extension); answers others 401 with the login form.
async fn require_session(State(ui): State<Ui>, mut request: Request, next: Next) -> Response {
    let Some(session) = Session::from_headers(&ui.token, request.headers(), now_secs()) else {
        let mut response = ui.templates.login(None);
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    };
    // A connection that showed a valid session has proved itself, as one
    // that showed the token (see crate::server::admission).
    let proof = request.extensions().get::<super::listen::Proof>().cloned();
    if proof.is_some_and(|proof| !proof.prove()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONNECTION, "close")],
            "this connection was closed for a newer one; reload the page",
        )
            .into_response();
    }
    request.extensions_mut().insert(session);
    next.run(request).await
}

/// Headers on every dashboard answer: a Content Security Policy that
/// allows only the dashboard's own files (no inline script), no framing,
/// no sniffing, and no caching of pages.
async fn page_headers(request: Request, next: Next) -> Response {
    let asset = request.uri().path().starts_with("/ui/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
