//! `GET /events`: a server-sent event stream of the job state changes this
//! server commits, filtered by name GLOB, job id or tracked jobs; resumable
//! from the server's ring with `Last-Event-ID`; capped in number, in all
//! and per client address. A stream whose client does not keep up is
//! dropped with a note rather than buffered (see [`pump`]).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::error::ApiError;
use super::listen::{Hangup, Limits};
use crate::protocol::{JobError, NamePattern, parse_job_id};
use crate::server::admission::bucket;
use crate::server::events::{Bus, EventId, Filter, RING_EVENTS, Read};
use crate::server::queue::Queue;

/// A comment line sent after this long without anything else, so that
/// proxies do not cut an idle stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How long a dropped stream's client has to read up to its note before
/// its connection is closed.
pub const DROP_GRACE: Duration = Duration::from_secs(10);

/// The most bytes of events sent in one chunk.
const CHUNK_BYTES: usize = 32 * 1024;

/// The most job ids one stream may filter on.
const MAX_JOB_IDS: usize = 1000;

/// The longest `durationMs`: a day.
const MAX_DURATION_MS: u64 = 86_400_000;

/// How often a stream whose client is not reading looks whether it fell
/// behind the ring.
const BEHIND_CHECK: Duration = Duration::from_millis(500);

/// The event streams open on the server, counted against the caps.
pub struct EventStreams {
    max: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    all: usize,
    by_peer: HashMap<IpAddr, usize>,
}

impl EventStreams {
    /// Counts streams against the port's `limits`.
    pub fn new(limits: &Limits) -> Arc<Self> {
        Arc::new(EventStreams {
            max: limits.max_event_streams,
            max_per_peer: limits.max_event_streams_per_peer,
            open: Mutex::default(),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a stream from `peer`, or why there is none.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, ApiError> {
        let peer = bucket(peer);
        let mut open = self.open();
        let from_peer = open.by_peer.get(&peer).copied().unwrap_or(0);
        let why = if open.all >= self.max {
            format!(
                "this server has {} event streams open, its most (--http-max-event-streams); \
                 retry later, or raise the cap",
                self.max
            )
        } else if from_peer >= self.max_per_peer {
            format!(
                "your address has {} event streams open, its most \
                 (--http-max-event-streams-per-peer); close one, or filter one stream \
                 instead of opening several",
                self.max_per_peer
            )
        } else {
            open.all += 1;
            *open.by_peer.entry(peer).or_default() += 1;
            return Ok(Slot {
                streams: Arc::clone(self),
                peer,
            });
        };
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_event_streams",
            why,
        ))
    }
}

/// A stream's place under the caps, given back when dropped.
struct Slot {
    streams: Arc<EventStreams>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.streams.open();
        open.all -= 1;
        if let Some(count) = open.by_peer.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.by_peer.remove(&self.peer);
            }
        }
    }
}

/// What a request asks of its stream.
struct Ask {
    filter: Filter,
    /// End the stream after this long.
    duration: Option<Duration>,
    /// Resume after this event.
    after: Option<String>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// Reads the query: `name`, `job` (repeatable, or a comma list),
/// `tracked`, `durationMs`, `lastEventId`.
fn ask(uri: &Uri, bus: &Bus) -> Result<Ask, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(uri.query().unwrap_or(""))
        .map_err(|error| bad(format!("query string is not valid: {error}")))?;
    let mut ask = Ask {
        filter: Filter::default(),
        duration: None,
        after: None,
    };
    for (key, value) in pairs {
        match key.as_str() {
            "name" => {
                if ask.filter.name.is_some() {
                    return Err(bad("give `name` once (one GLOB, such as `Send*`)"));
                }
                if value.is_empty() {
                    return Err(bad(
                        "`name` is empty: give a GLOB such as `Send*`, or leave it out",
                    ));
                }
                ask.filter.name = Some(NamePattern::parse(&value).map_err(ApiError::from)?);
            }
            "job" => {
                let jobs = ask.filter.jobs.get_or_insert_with(HashSet::new);
                for id in value.split(',') {
                    let id = parse_job_id("job", id.trim()).map_err(ApiError::from)?;
                    if id <= 0 {
                        return Err(ApiError::from(JobError::Malformed("job")));
                    }
                    jobs.insert(id);
                }
                if jobs.len() > MAX_JOB_IDS {
                    return Err(bad(format!(
                        "at most {MAX_JOB_IDS} job ids in one stream: filter by `name`, or open \
                         a stream without a filter"
                    )));
                }
            }
            "tracked" => match value.as_str() {
                "true" => {
                    ask.filter.tracked = Some(bus.tracked().ok_or_else(|| {
                        ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "tracked_unavailable",
                            "this server does not know tracked jobs yet: filter by `job` or \
                             `name` instead",
                        )
                    })?);
                }
                "false" => ask.filter.tracked = None,
                _ => return Err(bad("`tracked` is `true` or `false`")),
            },
            "durationMs" => {
                let ms: u64 = value
                    .parse()
                    .ok()
                    .filter(|ms| (1..=MAX_DURATION_MS).contains(ms))
                    .ok_or_else(|| {
                        bad(format!(
                            "`durationMs` is a whole number of milliseconds from 1 to \
                             {MAX_DURATION_MS}; leave it out for a stream without end"
                        ))
                    })?;
                ask.duration = Some(Duration::from_millis(ms));
            }
            "lastEventId" => ask.after = Some(value),
            other => {
                return Err(bad(format!(
                    "unknown parameter `{other}`: /events takes name, job, tracked, durationMs \
                     and lastEventId"
                )));
            }
        }
    }
    Ok(ask)
}

/// Where a stream resuming after `after` starts, and the note it starts
/// with when it cannot resume there.
fn start(bus: &Bus, after: Option<&str>) -> Result<(u64, Option<String>), ApiError> {
    let now = bus.latest() + 1;
    let Some(after) = after.filter(|a| !a.is_empty()) else {
        return Ok((now, None));
    };
    let id = EventId::parse(after).ok_or_else(|| {
        bad(format!(
            "Last-Event-ID `{after}` is not an event id of this server (BOOT-SEQ, as in `id:` \
             lines)"
        ))
    })?;
    let gap = |missed: Option<u64>, message: &str| {
        let data = json!({"missed": missed, "message": message});
        format!("event: gap\ndata: {data}\n\n")
    };
    if id.boot != bus.boot() || id.seq >= now {
        let note = gap(
            None,
            "that event is from before this server restarted (or another server): events \
             between it and now are not available; this stream starts now",
        );
        return Ok((now, Some(note)));
    }
    let oldest = bus.oldest();
    if id.seq + 1 < oldest {
        let missed = oldest - id.seq - 1;
        let note = gap(
            Some(missed),
            &format!(
                "{missed} events after that one are no longer kept (the server keeps the last \
                 {RING_EVENTS}); this stream starts at the oldest kept"
            ),
        );
        return Ok((oldest, Some(note)));
    }
    Ok((id.seq + 1, None))
}

/// `GET /events`.
pub async fn stream(
    State(queue): State<Queue>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    streams: Option<Extension<Arc<EventStreams>>>,
    hangup: Option<Extension<Hangup>>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let bus = Arc::clone(queue.events());
    let ask = ask(&uri, &bus)?;
    let header_id = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .map(str::to_string)
                .map_err(|_| bad("Last-Event-ID is not text"))
        })
        .transpose()?;
    let after = header_id.or(ask.after.clone());
    let (cursor, note) = start(&bus, after.as_deref())?;
    let streams = streams.map_or_else(|| EventStreams::new(&Limits::default()), |s| s.0);
    let slot = streams.admit(peer.ip())?;
    let (sender, receiver) = mpsc::channel(1);
    let (alive, gone) = oneshot::channel();
    let mut first = format!(
        "retry: 2000\n: jobmgr events; the next is {}\n\n",
        bus.id(cursor)
    );
    if let Some(note) = note {
        first.push_str(&note);
    }
    let pump = Pump {
        bus,
        filter: ask.filter,
        cursor,
        sent_through: cursor - 1,
        deadline: ask.duration.map(|d| Instant::now() + d),
        hangup: hangup.map(|h| h.0.0),
        sender,
        body_gone: gone,
        _slot: slot,
    };
    tokio::spawn(pump.run(first));
    let mut response = axum::body::Body::new(Chunks {
        chunks: receiver,
        _alive: alive,
    })
    .into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Why a stream stopped sending.
enum Stop {
    /// Its client went away, it ran its time, or the server is stopping.
    Ended,
    /// It fell behind the ring while its client was not reading.
    Behind,
}

/// One stream's task: reads the ring from its place, sends what passes its
/// filter in chunks, a comment when idle, and ends when told to or when
/// it fell behind (with a note saying so).
struct Pump {
    bus: Arc<Bus>,
    filter: Filter,
    /// The next event to look at.
    cursor: u64,
    /// The last event looked at whose chunk was handed to the connection.
    sent_through: u64,
    deadline: Option<Instant>,
    hangup: Option<tokio_util::sync::CancellationToken>,
    sender: mpsc::Sender<Bytes>,
    /// Resolves (with an error) once the body is dropped: sent to the end,
    /// or its connection gone.
    body_gone: oneshot::Receiver<()>,
    _slot: Slot,
}

impl Pump {
    async fn run(mut self, first: String) {
        let mut latest = self.bus.watch();
        let stop = match self.send(first).await {
            Ok(()) => self.follow(&mut latest).await,
            Err(stop) => stop,
        };
        if let Stop::Behind = stop {
            self.drop_behind().await;
        }
    }

    async fn follow(&mut self, latest: &mut tokio::sync::watch::Receiver<u64>) -> Stop {
        let mut last_sent = Instant::now();
        loop {
            latest.borrow_and_update();
            match self.bus.read(self.cursor, 512) {
                Read::Behind { .. } => return Stop::Behind,
                Read::Events(events) if !events.is_empty() => {
                    let mut chunk = String::new();
                    for published in events {
                        self.cursor = published.seq + 1;
                        if self.filter.admits(&published.event) {
                            let bus = &self.bus;
                            chunk.push_str(published.text(|| bus.id(published.seq).to_string()));
                            if chunk.len() >= CHUNK_BYTES {
                                break;
                            }
                        }
                    }
                    if !chunk.is_empty() {
                        if let Err(stop) = self.send(chunk).await {
                            return stop;
                        }
                        last_sent = Instant::now();
                    }
                    self.sent_through = self.cursor - 1;
                    continue;
                }
                Read::Events(_) => {}
            }
            let far = Instant::now() + Duration::from_secs(86_400 * 365);
            tokio::select! {
                changed = latest.changed() => if changed.is_err() { return Stop::Ended },
                () = tokio::time::sleep_until(last_sent + KEEP_ALIVE) => {
                    if let Err(stop) = self.send(": keep-alive\n\n".into()).await {
                        return stop;
                    }
                    last_sent = Instant::now();
                }
                () = tokio::time::sleep_until(self.deadline.unwrap_or(far)) => return Stop::Ended,
                () = self.bus.closed() => return Stop::Ended,
                () = self.sender.closed() => return Stop::Ended,
            }
        }
    }

    /// Hands `text` to the connection, waiting while its client reads
    /// what it has; stops when the events it still has to send leave the
    /// ring meanwhile.
    async fn send(&self, text: String) -> Result<(), Stop> {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        let reserve = self.sender.reserve();
        tokio::pin!(reserve);
        loop {
            tokio::select! {
                permit = &mut reserve => {
                    return match permit {
                        Ok(permit) => {
                            permit.send(Bytes::from(text));
                            Ok(())
                        }
                        Err(_) => Err(Stop::Ended),
                    };
                }
                () = tokio::time::sleep(BEHIND_CHECK) => {
                    if self.bus.oldest() > self.cursor {
                        return Err(Stop::Behind);
                    }
                }
                () = tokio::time::sleep_until(self.deadline.unwrap_or(far)) => return Err(Stop::Ended),
                () = self.bus.closed() => return Err(Stop::Ended),
            }
        }
    }

    /// Ends a stream that fell behind with a note (`event: dropped`); if
    /// its client does not read up to the note within [`DROP_GRACE`], its
    /// connection is closed.
    async fn drop_behind(self) {
        let missed = self.bus.oldest().saturating_sub(self.sent_through + 1);
        let last = (self.sent_through > 0).then(|| self.bus.id(self.sent_through).to_string());
        tracing::info!(
            missed,
            "an event stream's client did not keep up; dropping the stream"
        );
        let data = json!({
            "missed": missed,
            "lastEventId": last,
            "message": format!(
                "this stream was not read fast enough and fell more than {RING_EVENTS} events \
                 behind the server; it ends here: reconnect (with Last-Event-ID to resume from \
                 what the server still keeps)"
            ),
        });
        let note = format!("event: dropped\ndata: {data}\n\n");
        let Pump {
            sender,
            body_gone,
            hangup,
            ..
        } = self;
        let delivered = tokio::time::timeout(DROP_GRACE, async move {
            let _ = sender.send(Bytes::from(note)).await;
            // The body ends once it has handed over the note.
            drop(sender);
            let _ = body_gone.await;
        })
        .await;
        if delivered.is_err()
            && let Some(hangup) = hangup
        {
            hangup.cancel();
        }
    }
}

/// The body of an event stream: the chunks its pump hands over, until the
/// pump ends.
struct Chunks {
    chunks: mpsc::Receiver<Bytes>,
    /// Dropped with the body, telling the pump.
    _alive: oneshot::Sender<()>,
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}
