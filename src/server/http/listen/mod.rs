//! The HTTP port's accept loop (hyper, HTTP/1.1, optionally under TLS) with
//! its limits: connections in all and per peer address (connections that
//! have not passed the token check are second-class, see
//! [`crate::server::admission`]), a deadline for each
//! request's head and body, an idle timeout, per-request body limits and one
//! byte budget for request bodies, listing pages and hand-outs across the
//! server.
//!
//! A connection is never closed without a word while it has a request to
//! answer: one over the caps is answered `503` before it is closed, and one
//! evicted for a newcomer (see [`crate::server::admission`]) stays open to
//! answer its request `503` (both with `Retry-After`), each closed with a
//! lingering close so that a request already sent does not reset the
//! answer away.
//!
//! Shutdown: the loop stops accepting when told to, every connection is
//! asked to finish its in-flight requests and close, and [`serve`] returns
//! once they have (held long-polls are answered by the queue's shutdown).

mod activity;
mod budget;
mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::server::ByteBudget;
use crate::server::budget::{ANSWER_COPIES, AnswerShare};
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

pub use activity::{Busy, Expiry};
pub use budget::{BodyError, FREE_BODY};
pub use tls::{TlsError, TlsFiles};

use super::ApiError;
use super::body::{MAX_BATCH_BODY, MAX_BODY};
use crate::server::admission::{Admission, Lapse, Refusal, Ticket};
use crate::server::tally::Tally;
use activity::{Activity, Kept, Watched};
use budget::{Bounded, Holding, kib_beyond_free};

/// The most bytes of job data one listing page holds; a page that would
/// hold more stops early and says where to continue.
pub use crate::protocol::MAX_PAGE_BYTES;

/// What a listing request holds of the budget while its page is built and
/// sent: the rows, their JSON values and the encoded page.
pub const PAGE_RESERVE: usize = ANSWER_COPIES * MAX_PAGE_BYTES;

/// The bytes hyper buffers per connection for reading (and, separately,
/// for writing).
pub const CONNECTION_BUFFER: usize = 64 * 1024;

/// Limits of the HTTP port.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Connections served at once from one IP address (an IPv6 /64); a
    /// newcomer from it closes its oldest unauthenticated connection.
    pub max_connections_per_peer: usize,
    /// A request's head must arrive whole within this of its first byte
    /// (of the connection's accept, for the first request); a connection
    /// must also pass the token check within this of its accept.
    pub header_timeout: Duration,
    /// A request's body must arrive whole within this of its head.
    pub body_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// Bytes of request bodies (beyond [`FREE_BODY`] each) and listing
    /// pages held at once across the server.
    pub body_budget: usize,
    /// Event streams (`GET /events`) open at once; more are answered 503.
    pub max_event_streams: usize,
    /// Event streams open at once from one IP address (an IPv6 /64).
    pub max_event_streams_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_connections_per_peer: 128,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            body_budget: 256 * 1024 * 1024,
            max_event_streams: 64,
            max_event_streams_per_peer: 8,
        }
    }
}

impl Limits {
    /// The most memory the port holds for clients by these limits: the
    /// shared budget, plus per connection its buffers and free body bytes.
    pub fn memory_bound(&self) -> usize {
        self.body_budget + self.max_connections * (2 * CONNECTION_BUFFER + FREE_BODY)
    }

    /// Refuses a body budget that could never hold one listing page (every
    /// listing would be answered 503 forever); returns a warning when it
    /// cannot hold one whole batch body.
    pub fn check_budget(&self) -> Result<Option<String>, String> {
        let mib = |bytes: usize| bytes >> 20;
        if self.body_budget < PAGE_RESERVE {
            return Err(format!(
                "--http-body-budget {} MiB is below the {} MiB one listing page holds, so every \
                 listing would be refused; give at least {}MiB",
                mib(self.body_budget),
                mib(PAGE_RESERVE),
                mib(PAGE_RESERVE)
            ));
        }
        if self.body_budget < MAX_BATCH_BODY {
            return Ok(Some(format!(
                "--http-body-budget {} MiB is below the {} MiB batch body limit: a /jobs/batch \
                 upload larger than the budget is always answered 503; give at least {}MiB to \
                 allow the largest",
                mib(self.body_budget),
                mib(MAX_BATCH_BODY),
                mib(MAX_BATCH_BODY)
            )));
        }
        Ok(None)
    }
}

/// A request's connection's place, in the request's extensions: the token
/// check proves it ([`Proof::prove`]).
#[derive(Clone)]
pub struct Proof(Arc<Ticket>);

impl Proof {
    /// Marks the request's connection as authenticated; false if it was
    /// already closed for a newcomer.
    pub fn prove(&self) -> bool {
        self.0.prove()
    }
}

/// A request's connection's hang-up, in the request's extensions: a
/// long answer (an event stream) whose client stopped reading cancels it to
/// close the connection, which nothing else would while the answer is sent.
#[derive(Clone)]
pub struct Hangup(pub CancellationToken);

/// What an event stream holds of the byte budget while it is open (its
/// chunks in flight), in bytes.
pub const EVENT_STREAM_RESERVE: usize = 128 * 1024;

/// Refused connections whose answer is being read by their client: each
/// is closed once its client has read the answer and closed its side, or
/// after [`LINGER`]. Beyond this many at once, the request already sent is
/// read and the connection closed at once.
const MAX_LINGERING: usize = 256;

/// How long a refused connection is kept for its client to read the answer.
const LINGER: Duration = Duration::from_secs(2);

/// What every request of the port shares.
struct Shared {
    router: Router,
    limits: Limits,
    budget: ByteBudget,
}

/// Serves `router` on `listener` (under TLS with `tls`) within `limits`
/// until `stop` is cancelled, then finishes in-flight requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    budget: ByteBudget,
    stop: CancellationToken,
) {
    let admission = Admission::new(limits.max_connections, limits.max_connections_per_peer);
    let shared = Arc::new(Shared {
        router,
        limits,
        budget,
    });
    let open = TaskTracker::new();
    let refusals = Tally::default();
    let lingering = Arc::new(tokio::sync::Semaphore::new(MAX_LINGERING));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "HTTP port: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ticket = match admission.admit(peer.ip()) {
            Ok(ticket) => Arc::new(ticket),
            Err(refusal) => {
                let why = match refusal {
                    Refusal::PeerFull => "too many connections from this address",
                    Refusal::Full => "too many connections",
                };
                if let Some(refused) = refusals.note() {
                    tracing::warn!(
                        %peer,
                        refused,
                        "HTTP port: {why}; refusing connections (see --http-max-connections, \
                         --http-max-connections-per-peer)"
                    );
                }
                refuse(stream, why, &lingering);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let tls = tls.clone();
        let stop = stop.clone();
        open.spawn(async move {
            let activity = Activity::new();
            let watched = Watched::new(stream, Arc::clone(&activity));
            let header = shared.limits.header_timeout;
            let serve = async {
                match tls {
                    None => connection(watched, peer, activity, &ticket, shared, stop).await,
                    Some(acceptor) => {
                        match tokio::time::timeout(header, acceptor.accept(watched)).await {
                            Ok(Ok(stream)) => {
                                connection(stream, peer, activity, &ticket, shared, stop).await;
                            }
                            Ok(Err(error)) => {
                                tracing::debug!(%peer, %error, "HTTP port: TLS handshake failed");
                            }
                            Err(_) => tracing::debug!(%peer, "HTTP port: TLS handshake too slow"),
                        }
                    }
                }
            };
            // Until a request passes the token check, the connection may be
            // evicted for a newcomer and must prove itself within the
            // header timeout of its accept. Evicted, it stays to answer its
            // request 503 until then, or until the port needs its place.
            tokio::select! {
                () = serve => {}
                lapse = ticket.must_close(header) => match lapse {
                    Lapse::Evicted => tracing::debug!(%peer,
                        "HTTP port: unauthenticated connection closed for a newcomer"),
                    Lapse::Late => tracing::debug!(%peer,
                        "HTTP port: no authenticated request in time; closing"),
                },
            }
        });
    }
    open.close();
    open.wait().await;
}

/// Answers a connection over the caps with 503, without waiting for the
/// peer, and closes it: a lingering close (see [`linger`]) when fewer than
/// [`MAX_LINGERING`] are, else at once after reading what it sent already.
fn refuse(stream: TcpStream, why: &str, lingering: &Arc<tokio::sync::Semaphore>) {
    let body = serde_json::json!({
        "code": "too_many_connections",
        "message": format!("{why}; retry later, or open fewer connections"),
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
    match Arc::clone(lingering).try_acquire_owned() {
        Ok(permit) => {
            tokio::spawn(async move {
                linger(stream).await;
                drop(permit);
            });
        }
        Err(_) => {
            // A request already received would make the close a reset,
            // which can drop the answer before its client reads it.
            let mut sink = [0u8; 16 * 1024];
            while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
        }
    }
}

/// Closes a connection that was sent its last answer so that its client
/// reads that answer: ends the sending side, then reads and drops what the
/// client sends until it closes (at most 64 KiB and [`LINGER`]). Closing
/// with unread bytes would reset the connection, and a reset can discard
/// the answer on the client's side before it is read.
async fn linger(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 2048];
        let mut read = 0;
        while read < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Serves one connection until it closes, its clock expires, or the server
/// stops (then gracefully).
async fn connection<S>(
    io: S,
    peer: SocketAddr,
    activity: Arc<Activity>,
    ticket: &Arc<Ticket>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let hangup = CancellationToken::new();
    let service = {
        let activity = Arc::clone(&activity);
        let shared = Arc::clone(&shared);
        let ticket = Arc::clone(ticket);
        let hangup = hangup.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let busy = activity.begin();
            let shared = Arc::clone(&shared);
            let ticket = Arc::clone(&ticket);
            let hangup = Hangup(hangup.clone());
            async move {
                let streams = is_event_stream(request.uri().path());
                let response = handle(&shared, request, peer, ticket, hangup).await;
                // An event stream is in flight while it is sent: it is not
                // idle (its own rules end a stream whose client stalls).
                let response = if streams {
                    response.map(|body| axum::body::Body::new(Kept::new(body, busy)))
                } else {
                    drop(busy);
                    response
                };
                Ok::<_, Infallible>(response)
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .max_buf_size(CONNECTION_BUFFER)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let limits = shared.limits;
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "HTTP connection ended");
                }
                return;
            }
            _ = stop.cancelled(), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
            _ = hangup.cancelled() => {
                tracing::debug!(%peer, "HTTP port: an event stream's client stopped reading; closing");
                return;
            }
            why = activity.expired(limits.header_timeout, limits.idle_timeout) => {
                match why {
                    Expiry::HeadLate => {
                        tracing::debug!(%peer, "HTTP port: request head too slow; closing");
                    }
                    Expiry::Idle => tracing::debug!(%peer, "HTTP port: idle; closing"),
                }
                return;
            }
        }
    }
}

/// The body limit of a request to `path`.
fn body_limit(path: &str) -> usize {
    if path == "/jobs/batch" {
        MAX_BATCH_BODY
    } else {
        MAX_BODY
    }
}

/// Whether a request to `path` is an event stream (`GET /events`).
fn is_event_stream(path: &str) -> bool {
    path == "/events"
}

/// Whether a request builds a listing page of up to [`MAX_PAGE_BYTES`]:
/// a GET, or a HEAD (which axum answers with the GET handler), of one of
/// the listing routes.
fn builds_page(method: &Method, path: &str) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    matches!(
        segments.as_slice(),
        ["jobs"]
            | ["tracked"]
            | ["archive"]
            | ["jobs", _, "history"]
            | ["failures"]
            | ["failures", _]
            | ["workers"]
            | ["stats"]
            | ["stats", "workers"]
    )
}

/// `503 server_busy`, with `Retry-After` (see [`ApiError`]'s answer).
fn busy() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_busy",
        BodyError::OverBudget.to_string(),
    )
    .into_response()
}

/// Marks an answer as the connection's last (its request's body was not
/// read to the end, or its request was refused), so that the client does
/// not send another on it and the server closes it once it is sent.
pub fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// The answer to a request on a connection that was evicted for a
/// newcomer (it can no longer prove itself): 503 with `Retry-After`, its
/// connection's last.
pub fn evicted() -> Response {
    let mut response = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "connection_evicted",
        "this connection was closed for a newer one before its request was authenticated \
         (too many connections from your address, or to the server, had not sent the \
         token yet); retry on a new connection",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    closing(response)
}

/// The answer to a request of an evicted connection ([`evicted`]), after
/// reading what fits in its free body bytes (briefly), so that closing the
/// connection does not reset the answer away.
async fn refuse_evicted(request: Request<Incoming>) -> Response {
    let body = axum::body::Body::new(request.into_body());
    let _ = tokio::time::timeout(LINGER, axum::body::to_bytes(body, FREE_BODY)).await;
    evicted()
}

/// One request: refused at once when its connection was evicted, or its
/// declared body is over its limit or the budget, else passed to the
/// router with its body bounded.
async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
    peer: SocketAddr,
    ticket: Arc<Ticket>,
    hangup: Hangup,
) -> Response {
    if ticket.is_evicted() {
        return refuse_evicted(request).await;
    }
    let limit = body_limit(request.uri().path());
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|declared| declared > limit as u64) {
        return closing(
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                BodyError::TooLarge { limit }.to_string(),
            )
            .into_response(),
        );
    }
    let holding = Holding::default();
    let mut reserve = kib_beyond_free(declared.unwrap_or(0) as usize);
    if builds_page(request.method(), request.uri().path()) {
        reserve += PAGE_RESERVE / 1024;
    }
    if is_event_stream(request.uri().path()) {
        reserve += EVENT_STREAM_RESERVE / 1024;
    }
    if !holding.take(&shared.budget, reserve) {
        return closing(busy());
    }
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(ConnectInfo(peer));
    parts.extensions.insert(Proof(ticket));
    parts.extensions.insert(hangup);
    // What the answer holds beyond the reserve (the jobs a dequeue hands
    // out) is drawn into the request's share too.
    parts.extensions.insert(AnswerShare::new(
        Arc::clone(&shared.budget),
        holding.clone(),
    ));
    let body = Bounded::new(
        body,
        limit,
        shared.limits.body_timeout,
        Arc::clone(&shared.budget),
        holding.clone(),
    );
    let complete = body.complete();
    let request = Request::from_parts(parts, axum::body::Body::new(body));
    let response = match shared.router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    // A body left unread cannot be skipped to reach the next request.
    let response = if complete.load(std::sync::atomic::Ordering::Acquire) {
        response
    } else {
        closing(response)
    };
    // The budget is given back once the answer has been sent.
    response.map(|body| axum::body::Body::new(budget::Held::new(body, holding)))
}

/// Raises the soft limit on open files to the hard limit, so that the
/// connection caps, not the descriptor table, bound the server. Returns the
/// limit in force.
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::info!(from = soft, to = hard, "raised the open-file limit");
            Some(hard)
        }
        Err(error) => {
            tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
            Some(soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_take_the_page_reserve_for_get_and_head_alike() {
        for path in [
            "/jobs",
            "/archive",
            "/jobs/7/history",
            "/failures",
            "/failures/timeout",
            "/workers",
            "/stats",
            "/stats/workers",
        ] {
            assert!(builds_page(&Method::GET, path), "GET {path}");
            assert!(builds_page(&Method::HEAD, path), "HEAD {path}");
        }
        for (method, path) in [
            (Method::POST, "/jobs"),
            (Method::POST, "/failures/timeout/retry"),
            (Method::GET, "/jobs/7"),
            (Method::GET, "/healthz"),
            (Method::POST, "/workers"),
        ] {
            assert!(!builds_page(&method, path), "{method} {path}");
        }
    }

    #[test]
    fn a_budget_below_one_page_is_refused_and_one_below_a_batch_is_warned_of() {
        let with = |body_budget| Limits {
            body_budget,
            ..Limits::default()
        };
        let error = with(PAGE_RESERVE - 1024).check_budget().unwrap_err();
        assert!(error.contains("at least 24MiB"), "{error}");
        let warning = with(PAGE_RESERVE).check_budget().unwrap();
        assert!(warning.is_some_and(|w| w.contains("batch")));
        assert_eq!(with(MAX_BATCH_BODY).check_budget(), Ok(None));
    }
}
