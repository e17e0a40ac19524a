//! The Bedrock front-end: Bedrock's text protocol on its own port (8888 by
//! default), answering every Jobs command over the same queue as the HTTP
//! API. Persistent connections, pipelining, `Connection: close`, `forget` and
//! `wait`. Hostile clients are bounded: requests have a size limit and a time
//! limit, idle connections are closed, the number of connections is capped
//! (in all and per peer address), and the bytes buffered across all
//! connections share one budget. A connection without a request that passed
//! the token check yet is second-class (see [`crate::server::admission`]):
//! it must send one within [`Limits::unproven_timeout`] of its accept, and
//! the oldest such connection is closed to admit a newcomer. Connections
//! proven by a job token have places of their own
//! ([`Limits::max_connections_per_job`], and half of the port in all), so
//! workers never take the places of clients with the API token.
//!
//! What a flood would repeat in the log (refused connections, refused job
//! tokens and their refused requests) is said at most once per
//! [`Tally::EVERY`], with its count.
//!
//! Idle time is counted from the last answer: bytes that make no request
//! (blank lines) do not restart it, and bytes of an unfinished request run
//! under the request's own time limit from its first byte.
//!
//! Every request's `Token` header carries the API token or a job token
//! (see [`job_scope`]: a worker's credential to create child jobs while its
//! job runs, and nothing more).

pub mod commands;
pub mod frame;
pub mod job_scope;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;

use crate::server::ByteBudget;
use crate::server::budget::{AnswerShare, Holding};
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::auth::ApiToken;
use crate::server::admission::{Admission, Lapse, Refusal, Ticket, Unproven};
use crate::server::queue::Queue;
use crate::server::tally::Tally;
use frame::{FrameError, Request};
use job_scope::Caller;

/// The Bedrock port's default address.
pub const DEFAULT_BEDROCK_ADDR: &str = "127.0.0.1:8888";

/// Bounds on what clients of the Bedrock port may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more are told `503` and closed.
    pub max_connections: usize,
    /// Connections served at once from one peer address (an IPv6 /64);
    /// a newcomer from it closes its oldest connection that has not
    /// authenticated, or is told `503` and closed if all have.
    pub max_connections_per_peer: usize,
    /// Connections served at once that a job token proved, per job (and
    /// at most half of `max_connections` of all jobs); they do not count
    /// against `max_connections_per_peer`. One more is told `503` and
    /// closed.
    pub max_connections_per_job: usize,
    /// A connection must send a request that passes the token check
    /// within this of its accept; until then it has no idle time.
    pub unproven_timeout: Duration,
    /// A connection is closed when this passes after its last answer (or
    /// its start) without a request beginning; blank lines do not count.
    pub idle_timeout: Duration,
    /// A request must arrive whole within this of its first byte.
    pub request_timeout: Duration,
    /// An answer must be taken by the client within this.
    pub write_timeout: Duration,
}

/// Connections one peer address may hold open by default.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Connections one job's token may hold open by default: its worker
/// needs one at a time (a few if it forks).
pub const DEFAULT_MAX_CONNECTIONS_PER_JOB: usize = 8;

/// Bytes each connection may buffer without drawing on the shared budget.
pub const FREE_BUFFER: usize = 64 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_connections_per_job: DEFAULT_MAX_CONNECTIONS_PER_JOB,
            unproven_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// The port's log lines that a flood would repeat.
#[derive(Debug, Default)]
struct Tallies {
    /// Connections refused for want of places.
    connections: Tally,
    /// Job tokens refused: forged, another server's, or of a job that no
    /// longer runs.
    job_tokens: Tally,
    /// Requests of a valid job token refused as not the token's to send.
    job_requests: Tally,
}

/// Who may use the Bedrock port.
#[derive(Debug, Clone)]
pub struct Auth {
    /// Every request must carry it in a `Token` header.
    pub token: ApiToken,
    /// Requests from loopback peers need no token (`--bedrock-trust-loopback`,
    /// for old Bedrock clients).
    pub trust_loopback: bool,
}

/// Serves the Bedrock protocol on `listener` until `shutdown` is cancelled.
/// Every request must carry the server's token (or a job token, see
/// [`job_scope`]) in a `Token` header, on every address (the protocol has
/// no other authentication, and loopback is no credential: workers are
/// local users), unless `auth` trusts loopback peers.
pub async fn serve(
    listener: TcpListener,
    queue: Queue,
    limits: Limits,
    auth: Auth,
    budget: ByteBudget,
    shutdown: CancellationToken,
) {
    let admission = Admission::with_job_tokens(
        limits.max_connections,
        limits.max_connections_per_peer,
        limits.max_connections_per_job,
    );
    let tallies = Arc::new(Tallies::default());
    let open = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "Bedrock port: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ticket = match admission.admit(peer.ip()) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                let (status_line, why) = match refusal {
                    Refusal::PeerFull => (
                        "503 Too many connections from your address",
                        "too many authenticated connections from one address \
                         (see --bedrock-max-connections-per-peer)",
                    ),
                    Refusal::Full => (
                        "503 Too many connections",
                        "too many connections (see --bedrock-max-connections)",
                    ),
                };
                if let Some(refused) = tallies.connections.note() {
                    tracing::warn!(%peer, refused, "Bedrock port: {why}; refusing connections");
                }
                refuse_connection(stream, status_line);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let trusted = auth.trust_loopback && peer.ip().to_canonical().is_loopback();
        let connection = Connection {
            stream,
            queue: queue.clone(),
            limits,
            budget: Arc::clone(&budget),
            borrowed: Vec::new(),
            buf: Vec::new(),
            pos: 0,
            reader: frame::FrameReader::default(),
            shutdown: shutdown.clone(),
            token: (!trusted).then(|| auth.token.clone()),
            ticket,
            tallies: Arc::clone(&tallies),
        };
        open.spawn(connection.run());
    }
    // Connections end once their current request is answered; their
    // undelivered jobs must be put back before the store closes.
    open.close();
    open.wait().await;
    tracing::debug!("Bedrock port closed");
}

/// Tells a connection over a cap why it is closed (within a second, so a
/// client that reads nothing costs nothing for long), then closes it.
fn refuse_connection(mut stream: TcpStream, status_line: &'static str) {
    tokio::spawn(async move {
        let refusal = frame::closing_response(status_line, "");
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&refusal)).await;
    });
}

/// What to do after an answer.
enum After {
    KeepOpen,
    Close,
}

struct Connection {
    stream: TcpStream,
    queue: Queue,
    limits: Limits,
    budget: ByteBudget,
    borrowed: Vec<OwnedSemaphorePermit>,
    /// Bytes received; those before `pos` are already answered.
    buf: Vec<u8>,
    pos: usize,
    reader: frame::FrameReader,
    shutdown: CancellationToken,
    /// The token each request must carry; `None` for a trusted peer.
    token: Option<ApiToken>,
    /// Its place; proven by the first request that passes the token check.
    ticket: Ticket,
    tallies: Arc<Tallies>,
}

/// Why reading stopped.
enum ReadEnd {
    Closed,
    TimedOut,
    OverBudget,
    Lapsed(Lapse),
}

impl Connection {
    async fn run(mut self) {
        let mut request_started: Option<Instant> = None;
        // Restarted only by an answer: blank lines are idle time too.
        let mut idle_since = Instant::now();
        loop {
            match self.reader.next(&self.buf[self.pos..]) {
                Err(error) => {
                    self.refuse(error).await;
                    return;
                }
                Ok(Some((request, used))) => {
                    self.consume(used);
                    request_started = None;
                    match self.answer(request).await {
                        After::KeepOpen => idle_since = Instant::now(),
                        After::Close => return,
                    }
                }
                Ok(None) => {
                    let partial = self.reader.in_request();
                    let deadline = if partial {
                        *request_started.get_or_insert_with(Instant::now)
                            + self.limits.request_timeout
                    } else {
                        idle_since + self.limits.idle_timeout
                    };
                    if !partial && self.shutdown.is_cancelled() {
                        return;
                    }
                    let shutdown = self.shutdown.clone();
                    let read = self.read_more(deadline, &shutdown, partial).await;
                    match read {
                        Ok(()) => {}
                        Err(ReadEnd::Closed) => return,
                        Err(ReadEnd::Lapsed(Lapse::Evicted)) => {
                            tracing::debug!(
                                "Bedrock port: unauthenticated connection evicted for a newcomer"
                            );
                            let status = "503 Closed for a newer connection: send a request with the token at once";
                            let _ = tokio::time::timeout(
                                Duration::from_secs(1),
                                self.stream.write_all(&frame::closing_response(status, "")),
                            )
                            .await;
                            return;
                        }
                        Err(ReadEnd::Lapsed(Lapse::Late)) => {
                            tracing::debug!(
                                "Bedrock port: no authenticated request in time; closing"
                            );
                            let status =
                                "408 Request timeout: send a request with the token at once";
                            let _ = tokio::time::timeout(
                                Duration::from_secs(1),
                                self.stream.write_all(&frame::closing_response(status, "")),
                            )
                            .await;
                            return;
                        }
                        Err(ReadEnd::TimedOut) => {
                            if partial {
                                let _ = self
                                    .write(&frame::closing_response("408 Request timeout", ""))
                                    .await;
                            }
                            return;
                        }
                        Err(ReadEnd::OverBudget) => {
                            let _ = self
                                .write(&frame::closing_response("503 Server busy", ""))
                                .await;
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Reads what has arrived, up to `deadline`, while the connection keeps
    /// its place (and the server runs, unless a request is `partial`).
    async fn read_more(
        &mut self,
        deadline: Instant,
        shutdown: &CancellationToken,
        partial: bool,
    ) -> Result<(), ReadEnd> {
        let mut chunk = [0u8; 16 * 1024];
        let read = tokio::select! {
            read = timeout_at(deadline, self.stream.read(&mut chunk)) => read,
            lapse = self.ticket.lapsed(self.limits.unproven_timeout) => {
                return Err(ReadEnd::Lapsed(lapse));
            }
            _ = shutdown.cancelled(), if !partial => return Err(ReadEnd::Closed),
        };
        match read {
            Err(_) => Err(ReadEnd::TimedOut),
            Ok(Err(_)) | Ok(Ok(0)) => Err(ReadEnd::Closed),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                self.borrow_budget()
            }
        }
    }

    /// Drops `used` answered bytes from the front; the buffer is compacted
    /// only once they are the larger part, so pipelined requests cost
    /// linear time.
    fn consume(&mut self, used: usize) {
        self.pos += used;
        if self.pos >= self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.release_budget();
    }

    /// Draws on the shared budget for bytes buffered beyond the free share.
    fn borrow_budget(&mut self) -> Result<(), ReadEnd> {
        let held_kib: usize = self.borrowed.iter().map(|p| p.num_permits()).sum();
        let need_kib = self.buf.len().saturating_sub(FREE_BUFFER).div_ceil(1024);
        if need_kib > held_kib {
            let more = u32::try_from(need_kib - held_kib).map_err(|_| ReadEnd::OverBudget)?;
            let permit = Arc::clone(&self.budget)
                .try_acquire_many_owned(more)
                .map_err(|_| ReadEnd::OverBudget)?;
            self.borrowed.push(permit);
        }
        Ok(())
    }

    fn release_budget(&mut self) {
        if self.buf.len() <= FREE_BUFFER {
            self.borrowed.clear();
            if self.buf.capacity() > 4 * FREE_BUFFER {
                self.buf.shrink_to(FREE_BUFFER);
            }
        }
    }

    /// A share of the budget for one answer.
    fn answer_share(&self) -> AnswerShare {
        AnswerShare::new(Arc::clone(&self.budget), Holding::default())
    }

    /// Whether the client has closed the connection, without waiting:
    /// bytes already sent (pipelined requests) are kept.
    fn peer_gone(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.stream.try_read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > 2 * frame::MAX_REQUEST {
                        return true;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    async fn put_back(&self, handouts: Vec<crate::protocol::view::HandOut>) {
        if handouts.is_empty() {
            return;
        }
        tracing::info!("Bedrock client could not take its jobs; putting them back");
        if let Err(error) = self.queue.return_undelivered(handouts).await {
            tracing::error!(%error, "could not put back undelivered jobs");
        }
    }

    async fn refuse(&mut self, error: FrameError) {
        if error == FrameError::LooksLikeHttp {
            // As Redis says of the same: a web page may be trying to use
            // this port through the browser that shows it.
            tracing::warn!(
                "Bedrock port: an HTTP request (a browser's cross-protocol request?) refused; closing the connection"
            );
        } else {
            tracing::info!(
                status = error.status_line(),
                "Bedrock port: unreadable request; closing the connection"
            );
        }
        let _ = self
            .write(&frame::closing_response(error.status_line(), ""))
            .await;
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ()> {
        let deadline = Instant::now() + self.limits.write_timeout;
        match timeout_at(deadline, self.stream.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(()),
        }
    }

    /// Who sent `request`: the API token's holder (or a trusted peer), or
    /// a job token's, checked against its job; else the status line to
    /// close the connection with.
    async fn caller(&self, request: &Request) -> Result<Caller, String> {
        let Some(token) = &self.token else {
            return Ok(Caller::Full);
        };
        let given = request.header("token").unwrap_or_default();
        if token.matches(&given) {
            return Ok(Caller::Full);
        }
        let tally = &self.tallies.job_tokens;
        job_scope::admit(&self.queue, token, &given, &request.method, tally).await
    }

    /// The status line to close a connection with that `caller`'s request
    /// could not prove (see [`Unproven`]); refusals for want of places are
    /// logged as the port's refused connections are.
    fn unproven(&self, unproven: Unproven, caller: &Caller) -> String {
        let per_job = self.limits.max_connections_per_job;
        let (status_line, why) = match unproven {
            Unproven::Evicted => {
                return "503 Closed for a newer connection: send a request with the token at once"
                    .into();
            }
            Unproven::JobFull => (
                format!(
                    "503 Too many connections for this job token: a job may hold {per_job} at \
                     once; send its requests on one connection, or close one first"
                ),
                "a job token's job holds all its connections \
                 (see --bedrock-max-connections-per-job)",
            ),
            Unproven::JobsFull => (
                "503 Too many job-token connections: running jobs hold their share of the \
                 port's connections; retry later"
                    .to_string(),
                "running jobs hold half of the port's connections \
                 (see --bedrock-max-connections)",
            ),
        };
        if let Some(refused) = self.tallies.connections.note() {
            let job_id = caller.job_id().unwrap_or_default();
            tracing::warn!(
                job_id,
                refused,
                "Bedrock port: {why}; refusing job-token connections"
            );
        }
        status_line
    }

    async fn answer(&mut self, request: Request) -> After {
        let caller = match self.caller(&request).await {
            Ok(caller) => caller,
            Err(status_line) => {
                let _ = self.write(&frame::closing_response(&status_line, "")).await;
                return After::Close;
            }
        };
        if let Err(unproven) = self.ticket.prove_with(caller.credential()) {
            let status_line = self.unproven(unproven, &caller);
            let _ = self.write(&frame::closing_response(&status_line, "")).await;
            return After::Close;
        }
        let connection = request
            .header("connection")
            .unwrap_or_default()
            .to_ascii_lowercase();
        if connection == "forget" {
            let _ = self
                .write(&frame::closing_response("202 Successfully queued", ""))
                .await;
            let _ = self.stream.shutdown().await;
            let method = request.method.to_ascii_lowercase();
            if method == "getjob" || method == "getjobs" {
                tracing::info!("GetJob with Connection: forget can deliver nothing; not run");
            } else {
                let share = self.answer_share();
                let outcome = run(
                    &self.queue,
                    &request,
                    &caller,
                    &share,
                    &self.tallies.job_requests,
                )
                .await;
                tracing::debug!(method = %request.method, status = %outcome.status_line, "forgotten command ran");
            }
            return After::Close;
        }

        let method = request.method.to_ascii_lowercase();
        let takes_jobs = method == "getjob" || method == "getjobs";
        let mut hung_up = false;
        // What the answer draws on the budget, held until it has been sent.
        let share = self.answer_share();
        let answer = {
            let queue = self.queue.clone();
            let tallies = Arc::clone(&self.tallies);
            let run = run(&queue, &request, &caller, &share, &tallies.job_requests);
            tokio::pin!(run);
            // While the command runs (a held GetJob may take minutes), watch
            // the socket: a client that hangs up before its GetJob is
            // answered must not be handed a job (dropping the command puts
            // back anything it took). Other commands run to the end; their
            // answer is still sent to a client that only closed its sending
            // side.
            loop {
                let mut chunk = [0u8; 16 * 1024];
                tokio::select! {
                    biased;
                    read = self.stream.read(&mut chunk), if !hung_up => match read {
                        Ok(0) | Err(_) => {
                            if takes_jobs {
                                tracing::debug!("Bedrock client went away before its GetJob was answered");
                                return After::Close;
                            }
                            hung_up = true;
                        }
                        Ok(n) => {
                            self.buf.extend_from_slice(&chunk[..n]);
                            if self.borrow_budget().is_err() {
                                let _ = self
                                    .write(&frame::closing_response("503 Server busy", ""))
                                    .await;
                                return After::Close;
                            }
                        }
                    },
                    answer = &mut run => break answer,
                }
            }
        };
        // A hang-up that arrived as the jobs were taken: the answer would
        // land in a socket nobody reads. Put them back.
        if !answer.handouts.is_empty() && self.peer_gone() {
            tracing::debug!("Bedrock client went away as its jobs were taken; putting them back");
            self.put_back(answer.handouts).await;
            return After::Close;
        }

        // `Connection: close` is echoed, then the connection closes.
        let bytes = if connection == "close" {
            frame::closing_response(&answer.status_line, &answer.body)
        } else {
            frame::response(&answer.status_line, &answer.body)
        };
        if self.write(&bytes).await.is_err() {
            self.put_back(answer.handouts).await;
            return After::Close;
        }
        let another = || frame::parse(&self.buf[self.pos..]).ok().flatten().is_some();
        if connection == "close" || (hung_up && !another()) {
            After::Close
        } else {
            After::KeepOpen
        }
    }
}

/// Runs one request with what its caller may do, drawing on `share` for
/// the jobs it hands out; a job token's refused requests are counted in
/// `refused`.
async fn run(
    queue: &Queue,
    request: &Request,
    caller: &Caller,
    share: &AnswerShare,
    refused: &Tally,
) -> commands::Answer {
    match caller {
        Caller::Full => commands::run(queue, request, share).await,
        Caller::Job(holder) => job_scope::run(queue, request, holder, refused).await,
    }
}
