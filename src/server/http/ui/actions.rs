//! The dashboard's actions: POST forms only, each carrying the session's
//! CSRF token, each a queue call the JSON API also makes. After an action
//! the browser is sent back (303) to the page it came from, with a notice.
//! Logging in and out are here too.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::login_backoff::Attempt;
use super::session::{self, Session};
use super::{Ui, now_secs};
use crate::protocol::{Priority, RequeueJobs, UpdateJob, parse_job_id};
use crate::server::http::listen::closing;
use crate::server::ledger::failure::valid_group;

/// The largest form body read (a form holds a token and a field or two).
const MAX_FORM_BYTES: usize = 16 * 1024;

/// A form's fields, or why it could not be read.
async fn form(request: Request) -> Result<HashMap<String, String>, Response> {
    let bytes = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES)
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the form is larger than 16 KiB",
            )
                .into_response()
        })?;
    serde_urlencoded::from_bytes(&bytes).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            "the form is not application/x-www-form-urlencoded; send it from the dashboard's pages",
        )
            .into_response()
    })
}

/// A 303 to `to`, with a notice to show there.
fn back_to(to: &str, notice: &str) -> Response {
    let separator = if to.contains('?') { '&' } else { '?' };
    let query = serde_urlencoded::to_string([("notice", notice)]).unwrap_or_default();
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, format!("{to}{separator}{query}"))],
    )
        .into_response()
}

/// Refuses a form without this session's CSRF token.
fn check_csrf(
    ui: &Ui,
    session: &Session,
    fields: &HashMap<String, String>,
) -> Result<(), Box<Response>> {
    let given = fields.get("csrf").map_or("", String::as_str);
    if session.csrf_matches(&ui.token, given) {
        Ok(())
    } else {
        Err(Box::new(ui.templates.error(
            StatusCode::FORBIDDEN,
            "this form's CSRF token is missing or stale (the page is older than your session); \
             reload the page and try again",
            "/ui",
            &session.csrf(&ui.token),
        )))
    }
}

/// A session's form, read and its CSRF token checked.
async fn checked_form(
    ui: &Ui,
    session: &Session,
    request: Request,
) -> Result<HashMap<String, String>, Box<Response>> {
    let fields = form(request).await.map_err(Box::new)?;
    check_csrf(ui, session, &fields)?;
    Ok(fields)
}

/// `POST /ui/login` with `token`: a session cookie for the right token.
/// A wrong token is answered 401 and closes its connection, and pauses
/// logins from its address (see [`super::login_backoff`]); a login during
/// the pause is answered 429 with `Retry-After`, its token unread.
pub async fn login(State(ui): State<Ui>, request: Request) -> Response {
    let proof = request
        .extensions()
        .get::<crate::server::http::listen::Proof>()
        .cloned();
    let peer: Option<IpAddr> = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    // Read first: a connection closed with its request unread may lose
    // its answer.
    let fields = match form(request).await {
        Ok(fields) => fields,
        Err(response) => return closing(response),
    };
    let given = fields.get("token").map_or("", |t| t.trim());
    let attempt = match peer {
        Some(ip) => ui
            .backoff
            .attempt(ip, Instant::now(), || ui.token.matches(given)),
        None if ui.token.matches(given) => Attempt::Right,
        None => Attempt::Wrong(Duration::ZERO),
    };
    if let Attempt::Paused(wait) = attempt {
        return too_soon(&ui, wait);
    }
    if let Attempt::Wrong(pause) = attempt {
        let pause = peer.map(|_| pause);
        let mut message = "That is not this server's token. It is the text in the file `token` \
                           beside the server's database (or its --token)."
            .to_string();
        if let Some(pause) = pause {
            message.push_str(&format!(
                " Logins from your address are paused for {}.",
                seconds(pause)
            ));
        }
        let mut response = ui.templates.login(Some(&message));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return closing(response);
    }
    if let Some(proof) = proof {
        proof.prove();
    }
    let session = Session::mint(&ui.token, now_secs());
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, session.set_cookie()),
            (header::LOCATION, "/ui".to_string()),
        ],
    )
        .into_response()
}

/// The answer to a login during its address's pause: 429, with when to
/// try again, the connection's last.
fn too_soon(ui: &Ui, wait: Duration) -> Response {
    let message = format!(
        "Too many wrong tokens from your address: logins from it are paused. Try again in {}.",
        seconds(wait)
    );
    let mut response = ui.templates.login(Some(&message));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let retry_after = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    if let Ok(value) = header::HeaderValue::from_str(&retry_after.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    closing(response)
}

/// A pause for people, in whole seconds rounded up: `1 s`, `32 s`.
fn seconds(pause: Duration) -> String {
    let whole = pause.as_secs() + u64::from(pause.subsec_nanos() > 0);
    format!("{whole} s")
}

/// `POST /ui/logout`: ends the session, on every server of the store and
/// for good (a copy of its cookie is refused from now on), and drops the
/// cookie. Other sessions go on.
pub async fn logout(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    request: Request,
) -> Response {
    if let Err(response) = checked_form(&ui, &session, request).await {
        return *response;
    }
    let expires_ms = session.expires_secs().saturating_mul(1000);
    if let Err(error) = ui
        .queue
        .end_session(session.id().to_string(), expires_ms)
        .await
    {
        tracing::warn!(%error, "dashboard: cannot record a logout in the store");
        return ui.templates.error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the job store cannot be written, so your dashboard login could not be ended and is still \
             open; log out again in a few seconds (the server's log says why)",
            "/ui",
            &session.csrf(&ui.token),
        );
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, session::clear_cookie()),
            (header::LOCATION, "/ui/login".to_string()),
        ],
    )
        .into_response()
}

/// `POST /ui/jobs/{id}/{action}`: `retry` (queue it again now), `cancel`,
/// `delete`, `priority` (field `priority`), `next-run` (field `next_run`).
pub async fn job_action(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    Path((id, action)): Path<(String, String)>,
    request: Request,
) -> Response {
    let fields = match checked_form(&ui, &session, request).await {
        Ok(fields) => fields,
        Err(response) => return *response,
    };
    let id = match parse_job_id("jobID", &id) {
        Ok(id) => id,
        Err(e) => return ui.fail(&session, e, "/ui/jobs"),
    };
    let page = format!("/ui/jobs/{id}");
    let back = match fields.get("back").map(String::as_str) {
        Some("failures") => "/ui/failures".to_string(),
        _ => page.clone(),
    };
    let queue = &ui.queue;
    let done = match action.as_str() {
        "retry" => queue
            .requeue(RequeueJobs {
                ids: vec![id],
                name: None,
            })
            .await
            .and_then(|count| {
                if count == 0 {
                    Err(crate::protocol::JobError::NoSuchJob)
                } else {
                    Ok(format!("Job {id} is queued to run again."))
                }
            }),
        "cancel" => queue
            .cancel(id)
            .await
            .map(|()| format!("Job {id} is cancelled.")),
        "delete" => match queue.delete(id).await {
            Ok(()) => {
                let to = if back == page { "/ui/jobs" } else { &back };
                return back_to(to, &format!("Job {id} is deleted."));
            }
            Err(e) => Err(e),
        },
        "priority" => {
            let priority = fields
                .get("priority")
                .and_then(|p| p.trim().parse::<i64>().ok())
                .ok_or(crate::protocol::JobError::InvalidPriority)
                .and_then(Priority::new);
            match priority {
                Ok(priority) => change(&ui, id, Some(priority), None)
                    .await
                    .map(|()| format!("Job {id} now has priority {}.", priority.value())),
                Err(e) => Err(e),
            }
        }
        "next-run" => {
            match super::pages::form_time(fields.get("next_run").map_or("", String::as_str)) {
                Ok(at) => change(&ui, id, None, Some(at))
                    .await
                    .map(|()| format!("Job {id} runs next at {at}.")),
                Err(e) => Err(e),
            }
        }
        other => {
            return ui.refuse(
                &session,
                format!("no action {other:?}: the dashboard's job actions are retry, cancel, delete, priority and next-run"),
                &page,
            );
        }
    };
    match done {
        Ok(notice) => back_to(&back, &notice),
        Err(e) => ui.fail(&session, e, &back),
    }
}

/// Changes a job's priority or next run, keeping its data.
async fn change(
    ui: &Ui,
    id: i64,
    priority: Option<Priority>,
    next_run: Option<crate::protocol::Timestamp>,
) -> Result<(), crate::protocol::JobError> {
    let job = ui.queue.query(id).await?;
    ui.queue
        .update(UpdateJob {
            id,
            data: job.data,
            repeat: None,
            clear_repeat: false,
            priority,
            next_run,
            lease: None,
        })
        .await
}

/// `POST /ui/failures/{group}/{action}`: `retry` or `delete` every job of
/// a failure group (up to 10,000 at a time).
pub async fn group_action(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    Path((group, action)): Path<(String, String)>,
    request: Request,
) -> Response {
    if let Err(response) = checked_form(&ui, &session, request).await {
        return *response;
    }
    if !valid_group(&group) {
        return ui.refuse(
            &session,
            "a failure group is 1 to 64 letters, digits, '_', ':', '-' or '+'; pick one on the failures page".into(),
            "/ui/failures",
        );
    }
    let max = crate::server::http::reports::MAX_BULK;
    let done = match action.as_str() {
        "retry" => ui
            .queue
            .retry_failed(group.clone(), max)
            .await
            .map(|ids| format!("{} jobs of {group} are queued to run again.", ids.len())),
        "delete" => ui
            .queue
            .delete_failed(group.clone(), max)
            .await
            .map(|ids| format!("{} jobs of {group} are deleted.", ids.len())),
        other => {
            return ui.refuse(
                &session,
                format!("no action {other:?}: a failure group can be retried or deleted"),
                "/ui/failures",
            );
        }
    };
    match done {
        Ok(notice) => back_to("/ui/failures", &notice),
        Err(e) => ui.fail(&session, e, "/ui/failures"),
    }
}
