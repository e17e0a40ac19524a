//! The web dashboard at `/ui`: server-rendered pages (minijinja, escaping
//! everything by default) over the queue and the ledger, a little script
//! that refreshes each page's live part every 2 s, and charts drawn with
//! the vendored Chart.js.
//!
//! - **Login.** The API token, typed into a form once, gives an HttpOnly,
//!   SameSite=Strict session cookie ([`session`]); every page but the login
//!   form and the static files needs it, and a request without it is
//!   answered 401 with the login form. A wrong token closes its connection
//!   and pauses logins from its address ([`login_backoff`]). A logout ends
//!   the session on every server of the store, for good.
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
pub mod login_backoff;
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
use login_backoff::LoginBackoff;
use render::Templates;
use session::Session;

/// What every dashboard handler has.
#[derive(Clone)]
pub struct Ui {
    queue: Queue,
    token: ApiToken,
    templates: Arc<Templates>,
    depth: depth::Depth,
    backoff: Arc<LoginBackoff>,
}

/// The dashboard's routes, all under `/ui`.
pub fn router<S>(queue: Queue, token: ApiToken) -> Router<S> {
    let ui = Ui {
        queue,
        token,
        templates: Arc::new(Templates::new()),
        depth: depth::Depth::default(),
        backoff: Arc::new(LoginBackoff::default()),
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
/// the handler as an extension) whose session was not logged out; answers
/// others 401 with the login form.
async fn require_session(State(ui): State<Ui>, mut request: Request, next: Next) -> Response {
    let Some(session) = Session::from_headers(&ui.token, request.headers(), now_secs()) else {
        let mut response = ui.templates.login(None);
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    };
    match ui.queue.session_ended(session.id().to_string()).await {
        Ok(false) => {}
        Ok(true) => {
            let mut response = ui.templates.login(Some(
                "You logged out of the dashboard with this cookie. Log in again.",
            ));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            return response;
        }
        Err(error) => {
            tracing::warn!(%error, "dashboard: cannot check the session against the store");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "5")],
                "the job store cannot be read, so the session cannot be checked; \
                 reload the page in a few seconds (the server's log says why)",
            )
                .into_response();
        }
    }
    // A connection that showed a valid session has proved itself, as one
    // that showed the token (see crate::server::admission).
    let proof = request.extensions().get::<super::listen::Proof>().cloned();
    if proof.is_some_and(|proof| !proof.prove()) {
        return super::listen::evicted();
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
