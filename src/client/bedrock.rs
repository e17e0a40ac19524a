//! [`JobSource`] over Bedrock's text protocol, for driving a real Bedrock
//! cluster (or this project's own Bedrock port) from the supervisor.
//!
//! - **Framing.** A request is a method line, `Name: value` headers and a
//!   blank line; parameters travel as header values, so no value may carry a
//!   line break (text is backslash-escaped, JSON is sent compact). An answer is
//!   a status line `NNN message`, headers, and exactly `Content-Length` bytes
//!   of body, read by a bounded reader of its own (no answer over 64 MiB).
//! - **Connections.** Plain TCP, kept open in a small pool of idle
//!   connections: a waiting GetJobs holds its connection for the whole wait
//!   while reports go out on others. A pooled connection the server has
//!   closed is replaced transparently. Every connect (10 s), write (60 s) and
//!   read (60 s, or a waiting GetJobs' wait + 30 s) has a time limit.
//! - **Waiting.** GetJobs is sent with `Connection: wait` and `Timeout`.
//!   Today's Bedrock ignores that and answers `404` at once; when a `404`
//!   comes back well before the timeout asked for, the source switches to
//!   polling with jittered exponential backoff (1 s doubling to 10 s, ±20 %)
//!   within the caller's wait, and keeps asking to wait so that a server that
//!   starts holding requests again is noticed. [`JobSource::fetch_mode`] says
//!   which mode it is in; every change is logged once.
//! - **Commands.** GetJobs, UpdateJob, FinishJob, RetryJob and FailJob for
//!   the supervisor's loop; CreateJob, QueryJob and DeleteJob for jobs it
//!   declares itself.
//! - **Leases where the server gives them.** GetJobs asks for a lease
//!   (`leaseMs`, the supervisor's lease term). jobmgr's own Bedrock port
//!   answers with the lease (`lease`, `leaseExpires`, `leaseMs`), renewed by
//!   `Heartbeat` and shown with every report, as over HTTP: a supervisor that
//!   dies loses its jobs when the lease lapses, and a late report from it is
//!   refused (`409`, [`SourceError::LeaseLost`]). A real Bedrock ignores the
//!   field and has no leases: it holds a job without `retryAfter` until it is
//!   reported and re-issues one with `retryAfter` after it. The source learns
//!   which from a probe (`Heartbeat` is unknown to Bedrock: `430`) or the
//!   first hand-out, and warns once when the server gives no leases.
//!
//! Dropping a `get_jobs` future mid-wait closes its connection, so the server
//! sees the client gone and hands the job to nobody.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::Rng;
use serde_json::{Map, Value};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use super::source::{
    FetchMode, JobSource, LeasedJob, Report, SourceError, Unreadable, hand_back_by_retry,
    read_handouts, refuse_unreadable,
};
use crate::auth::ApiToken;
use crate::future::BoxFuture;
use crate::protocol::repeat::Unit;
use crate::protocol::{
    CreateJob, Data, JobId, Modifier, Repeat, RepeatBase, RetryAfter, Timestamp,
};
use crate::server::http::{MAX_LEASE_MS, MIN_LEASE_MS};

/// The largest answer body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// The largest status line plus headers accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The most headers one answer may carry.
const MAX_HEADERS: usize = 256;
/// Idle connections kept for reuse; more are closed.
const MAX_IDLE: usize = 4;
/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sending a request may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the answer to a command that does not wait may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// What a waiting GetJobs' answer may take beyond the wait asked for.
const WAIT_MARGIN: Duration = Duration::from_secs(30);
/// Longer waits are cut to this (which also keeps the clock arithmetic sane).
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The first pause between polls, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A pooled connection that breaks within this of a request, before any
/// answer, was stale: the request is sent again on another connection.
const STALE_WINDOW: Duration = Duration::from_secs(2);
/// Waits shorter than this tell nothing about whether the server waits.
const MIN_JUDGED_WAIT: Duration = Duration::from_secs(1);
/// A `404` faster than half of `min(wait, this)` means the server did not wait.
const JUDGE_CAP: Duration = Duration::from_secs(2);

/// A job server reached over Bedrock's text protocol (`bedrock://HOST:PORT`).
/// Cheap to clone; clones share the connection pool and the fetch mode.
#[derive(Clone)]
pub struct BedrockSource {
    inner: Arc<Inner>,
}

struct Inner {
    /// `HOST:PORT`.
    addr: String,
    /// Idle connections, most recently used last.
    idle: Mutex<Vec<Connection>>,
    /// Whether the server waits, and the current polling pause.
    fetch: Mutex<FetchState>,
    /// Whether the server gives leases, once known.
    leases: Mutex<Option<bool>>,
    /// Sent in a `Token` header with every request, when set.
    token: std::sync::OnceLock<ApiToken>,
}

struct FetchState {
    mode: FetchMode,
    backoff: Duration,
}

impl fmt::Debug for BedrockSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BedrockSource")
            .field("addr", &self.inner.addr)
            .field("mode", &self.fetch_mode())
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, also after a panic elsewhere (the guarded state stays
/// consistent: every update is a single assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BedrockSource {
    /// A source for the Bedrock server at `addr` (`HOST:PORT`; a leading
    /// `bedrock://` is also accepted). Nothing is connected until the first
    /// call. A malformed address is [`SourceError::Refused`].
    pub fn new(addr: &str) -> Result<Self, SourceError> {
        let trimmed = addr.trim();
        let addr = trimmed.strip_prefix("bedrock://").unwrap_or(trimmed);
        let valid = addr.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && !host.contains(|c: char| c.is_whitespace() || c == '/')
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
        if !valid {
            return Err(SourceError::Refused(format!(
                "bad Bedrock address {addr:?}: give HOST:PORT, e.g. 127.0.0.1:8888"
            )));
        }
        Ok(BedrockSource {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                idle: Mutex::new(Vec::new()),
                fetch: Mutex::new(FetchState {
                    mode: FetchMode::Blocking,
                    backoff: FIRST_BACKOFF,
                }),
                leases: Mutex::new(None),
                token: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Sends `token` with every request (jobmgr's Bedrock port needs it; a
    /// real Bedrock ignores the header).
    pub fn with_token(self, token: Option<ApiToken>) -> Self {
        if let Some(token) = token {
            let _ = self.inner.token.set(token);
        }
        self
    }

    /// Asks the server whether it gives leases: jobmgr's Bedrock port knows
    /// `Heartbeat` (and answers this empty one `402 Missing jobID`), a real
    /// Bedrock answers `430 Unrecognized command`. Logs a warning once when
    /// it gives none. `None` when the server could not be asked.
    pub async fn probe_leases(&self) -> Option<bool> {
        let response = self
            .call(&Request::new("Heartbeat"), COMMAND_TIMEOUT)
            .await
            .ok()?;
        let leases = response.code != 430;
        self.learn_leases(leases);
        Some(leases)
    }

    /// Whether the server gives leases, as far as known.
    pub fn gives_leases(&self) -> Option<bool> {
        *lock(&self.inner.leases)
    }

    /// Records whether the server gives leases; the first time it is found
    /// to give none, says what that costs.
    fn learn_leases(&self, leases: bool) {
        let before = lock(&self.inner.leases).replace(leases);
        if leases || before == Some(false) {
            return;
        }
        tracing::warn!(
            source = %self.describe(),
            "this Bedrock server gives no leases: a job without retryAfter is held until it is \
             reported, so if this supervisor dies mid-job the job stays RUNNING (Bedrock \
             re-issues only jobs with retryAfter, once it has passed). Give jobs a retryAfter \
             longer than their run, or use jobmgr's server (its Bedrock port gives leases, \
             and `jobmgr server --requeue-unleased-after` puts back jobs of clients without)"
        );
    }

    /// An idle connection that still looks open, if the pool has one.
    fn take_idle(&self) -> Option<Connection> {
        let mut idle = lock(&self.inner.idle);
        while let Some(connection) = idle.pop() {
            if connection.looks_open() {
                return Some(connection);
            }
        }
        None
    }

    /// Keeps `connection` for reuse, unless the pool is full.
    fn put_idle(&self, connection: Connection) {
        let mut idle = lock(&self.inner.idle);
        if idle.len() < MAX_IDLE {
            idle.push(connection);
        }
    }

    /// Sends `request` and reads its answer within `read_timeout`. A pooled
    /// connection that breaks at once, before any answer arrives, was closed
    /// by the server while idle: it is dropped and the request sent again on
    /// another one.
    async fn call(
        &self,
        request: &Request,
        read_timeout: Duration,
    ) -> Result<Response, SourceError> {
        let bytes = request.encode(self.inner.token.get());
        loop {
            let mut connection = match self.take_idle() {
                Some(connection) => connection,
                None => Connection::open(&self.inner.addr).await?,
            };
            let sent = Instant::now();
            match connection.exchange(&bytes, read_timeout).await {
                Ok(response) => {
                    if response.keeps_alive() && connection.buf.is_empty() {
                        connection.reused = true;
                        self.put_idle(connection);
                    }
                    return Ok(response);
                }
                Err(error)
                    if connection.reused
                        && error.nothing_received()
                        && sent.elapsed() < STALE_WINDOW =>
                {
                    tracing::debug!(
                        source = %self.describe(),
                        method = request.method,
                        %error,
                        "pooled Bedrock connection was closed; sending again on a new one"
                    );
                }
                Err(ExchangeError::Protocol(message)) => {
                    return Err(SourceError::Protocol(format!(
                        "{} answering {}: {message}",
                        self.describe(),
                        request.method
                    )));
                }
                Err(error) => {
                    return Err(SourceError::Unavailable(format!(
                        "{} during {}: {error}",
                        self.describe(),
                        request.method
                    )));
                }
            }
        }
    }

    /// One GetJobs asking the server to wait up to `wait`. `None` for
    /// `404 No job found`.
    async fn get_jobs_once(
        &self,
        pattern: &str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<Vec<LeasedJob>>, SourceError> {
        let lease_ms = (lease.as_millis() as u64).clamp(MIN_LEASE_MS, MAX_LEASE_MS);
        let request = Request::new("GetJobs")
            .text("name", pattern)
            .value("numResults", count.max(1))
            .value("leaseMs", lease_ms)
            .value("Connection", "wait")
            .value("Timeout", wait.as_millis());
        let response = self.call(&request, wait + WAIT_MARGIN).await?;
        match response.code {
            200..=299 => {
                let (mut jobs, unreadable) = parse_jobs(&response.body)?;
                refuse_unreadable(self, unreadable).await;
                if let Some(job) = jobs.first() {
                    self.learn_leases(job.lease.is_some());
                }
                for job in &mut jobs {
                    if job.lease.is_none() && job.lease_term.is_none() {
                        job.lease_term = retry_after_term(&job.handout);
                    }
                }
                Ok(Some(jobs))
            }
            404 => Ok(None),
            _ => Err(self.failure(&format!("GetJobs {pattern:?}"), &response)),
        }
    }

    /// The error for an answer that is not a success.
    fn failure(&self, what: &str, response: &Response) -> SourceError {
        let message = format!("{what} at {}: {}", self.describe(), response.status_line);
        match response.code {
            404 => SourceError::NotFound(message),
            400..=499 => SourceError::Refused(message),
            500..=599 => SourceError::Unavailable(message),
            _ => SourceError::Protocol(format!("unexpected answer to {message}")),
        }
    }

    /// A command that changes one job: `Ok` on any `2xx`.
    async fn job_command(&self, request: Request, id: JobId) -> Result<(), SourceError> {
        let response = self.call(&request, COMMAND_TIMEOUT).await?;
        match response.code {
            200..=299 => Ok(()),
            409 => Err(SourceError::LeaseLost(id)),
            _ => Err(self.failure(&format!("{} of job {id}", request.method), &response)),
        }
    }

    /// Learns from a `404` that took `took` for a wait of `asked` whether the
    /// server holds waiting requests, and logs a change of mind.
    fn judge(&self, asked: Duration, took: Duration) {
        if asked < MIN_JUDGED_WAIT {
            return;
        }
        let mode = if took < asked.min(JUDGE_CAP) / 2 {
            FetchMode::Polling
        } else {
            FetchMode::Blocking
        };
        let mut state = lock(&self.inner.fetch);
        if state.mode == mode {
            return;
        }
        state.mode = mode;
        state.backoff = FIRST_BACKOFF;
        drop(state);
        match mode {
            FetchMode::Polling => tracing::info!(
                source = %self.describe(),
                mode = "polling",
                asked_ms = asked.as_millis() as u64,
                answered_ms = took.as_millis() as u64,
                "Bedrock server answered a waiting GetJobs with 404 at once: it does not \
                 hold requests, so polling it with backoff (1 s doubling to 10 s)"
            ),
            FetchMode::Blocking => tracing::info!(
                source = %self.describe(),
                mode = "blocking",
                asked_ms = asked.as_millis() as u64,
                answered_ms = took.as_millis() as u64,
                "Bedrock server held a waiting GetJobs until its timeout: waiting on it \
                 instead of polling"
            ),
        }
    }

    /// The next pause between polls, jittered by ±20 %.
    fn pause(&self) -> Duration {
        let backoff = lock(&self.inner.fetch).backoff;
        backoff.mul_f64(rand::rng().random_range(0.8..=1.2))
    }

    /// Doubles the pause between polls, up to its cap.
    fn back_off(&self) {
        let mut state = lock(&self.inner.fetch);
        state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
    }

    /// A job arrived: the next poll starts from the shortest pause.
    fn job_arrived(&self) {
        lock(&self.inner.fetch).backoff = FIRST_BACKOFF;
    }
}

impl JobSource for BedrockSource {
    /// GetJobs with `Connection: wait` and `leaseMs` (from `lease`, within
    /// 100 ms and a day); against a server that answers at once, polls with
    /// backoff until `wait` is used up.
    fn get_jobs<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(async move {
            let deadline = Instant::now() + wait.min(LONGEST_WAIT);
            loop {
                let asked = deadline.saturating_duration_since(Instant::now());
                let sent = Instant::now();
                if let Some(jobs) = self.get_jobs_once(pattern, count, asked, lease).await? {
                    if !jobs.is_empty() {
                        self.job_arrived();
                    }
                    return Ok(jobs);
                }
                self.judge(asked, sent.elapsed());
                if self.fetch_mode() == FetchMode::Blocking {
                    return Ok(Vec::new());
                }
                let pause = self.pause();
                let left = deadline.saturating_duration_since(Instant::now());
                if pause >= left {
                    tokio::time::sleep_until(deadline).await;
                    return Ok(Vec::new());
                }
                tokio::time::sleep(pause).await;
                self.back_off();
            }
        })
    }

    /// `Heartbeat` with the job's lease; nothing to renew for a job handed
    /// out without one (by a real Bedrock). `409` is
    /// [`SourceError::LeaseLost`].
    fn heartbeat<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return Ok(());
            };
            let request = Request::new("Heartbeat")
                .value("jobID", job.id)
                .text("lease", lease);
            self.job_command(request, job.id).await
        })
    }

    /// UpdateJob with the new `data`, under the job's lease when it has one.
    fn update<'a>(
        &'a self,
        job: &'a LeasedJob,
        data: &'a Data,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let request = Request::new("UpdateJob")
                .value("jobID", job.id)
                .json("data", data)?
                .lease(job.lease.as_deref());
            self.job_command(request, job.id).await
        })
    }

    /// FinishJob, RetryJob (with `delay`, negative taken as 0) or FailJob,
    /// with `data` when the report has some and `lease` when the hand-out
    /// had one. `409` (the lease lapsed) is [`SourceError::LeaseLost`];
    /// `404`/`405` (the job is gone or not held) and other `4xx` are
    /// [`SourceError::Refused`].
    fn report<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let (request, data) = match report {
                Report::Finish { data } => (Request::new("FinishJob"), data),
                Report::Fail { data } => (Request::new("FailJob"), data),
                Report::Retry {
                    delay_secs,
                    ignore_repeat,
                    data,
                    name,
                    next_run,
                } => {
                    let mut request = Request::new("RetryJob").value("delay", (*delay_secs).max(0));
                    if *ignore_repeat {
                        request = request.value("ignoreRepeat", "true");
                    }
                    if let Some(name) = name {
                        request = request.value("name", name);
                    }
                    if let Some(next_run) = next_run {
                        request = request.value("nextRun", next_run);
                    }
                    (request, data)
                }
            };
            let mut request = request.value("jobID", id).lease(lease);
            if let Some(data) = data {
                request = request.json("data", data)?;
            }
            self.job_command(request, id).await
        })
    }

    /// `HandBackJob` under the job's lease (jobmgr's port). A job handed
    /// out without a lease (a real Bedrock), or a refusal (an older jobmgr
    /// that does not know the command, or kept no copy of the job from
    /// before the hand-out), is handed back with RetryJob instead.
    fn hand_back<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return hand_back_by_retry(self, job).await;
            };
            let request = Request::new("HandBackJob")
                .value("jobID", job.id)
                .text("lease", lease);
            match self.job_command(request, job.id).await {
                Err(SourceError::Refused(_)) => hand_back_by_retry(self, job).await,
                other => other,
            }
        })
    }

    /// CreateJob with every option the job sets.
    fn create<'a>(&'a self, job: &'a CreateJob) -> BoxFuture<'a, Result<JobId, SourceError>> {
        Box::pin(async move {
            let mut request = Request::new("CreateJob")
                .text("name", &job.name)
                .json("data", &job.data)?;
            if let Some(repeat) = &job.repeat {
                request = request.text("repeat", &repeat.text);
            }
            if let Some(priority) = job.priority {
                request = request.value("jobPriority", priority.value());
            }
            if let Some(first_run) = job.first_run {
                request = request.value("firstRun", first_run);
            }
            if let Some(retry_after) = &job.retry_after {
                request = request.text("retryAfter", &retry_after.text);
            }
            if let Some(parent) = job.parent_id {
                request = request.value("parentJobID", parent);
            }
            let request = request
                .value("unique", job.unique)
                .value("overwrite", job.overwrite);
            let response = self.call(&request, COMMAND_TIMEOUT).await?;
            if !(200..=299).contains(&response.code) {
                return Err(self.failure(&format!("CreateJob {:?}", job.name), &response));
            }
            let answer: Value = serde_json::from_slice(&response.body).unwrap_or_default();
            answer
                .get("jobID")
                .and_then(|id| {
                    id.as_i64()
                        .or_else(|| id.as_str().and_then(|s| s.parse().ok()))
                })
                .ok_or_else(|| {
                    SourceError::Protocol(format!(
                        "CreateJob answer without a jobID: {}",
                        String::from_utf8_lossy(&response.body[..response.body.len().min(200)])
                    ))
                })
        })
    }

    /// QueryJob: `404` means no.
    fn exists<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let request = Request::new("QueryJob").value("jobID", id);
            let response = self.call(&request, COMMAND_TIMEOUT).await?;
            match response.code {
                200..=299 => Ok(true),
                404 => Ok(false),
                _ => Err(self.failure(&format!("QueryJob of job {id}"), &response)),
            }
        })
    }

    /// DeleteJob.
    fn delete<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.job_command(Request::new("DeleteJob").value("jobID", id), id)
                .await
        })
    }

    fn fetch_mode(&self) -> FetchMode {
        lock(&self.inner.fetch).mode
    }

    fn describe(&self) -> String {
        format!("bedrock://{}", self.inner.addr)
    }
}

/// Reads the jobs of a GetJobs answer, each on its own: the readable ones,
/// and those this client cannot read (see [`refuse_unreadable`]).
fn parse_jobs(body: &[u8]) -> Result<(Vec<LeasedJob>, Vec<Unreadable>), SourceError> {
    let answer: Value = serde_json::from_slice(body).map_err(|error| {
        SourceError::Protocol(format!(
            "GetJobs answer is not JSON ({error}): {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ))
    })?;
    let Some(jobs) = answer.get("jobs").and_then(Value::as_array) else {
        return Err(SourceError::Protocol(format!(
            "GetJobs answer without jobs: {answer}"
        )));
    };
    Ok(read_handouts(jobs.iter().cloned()))
}

/// How long Bedrock lets a job handed out without a lease run before it
/// hands it out again: its `retryAfter`, or its repeat's next time when
/// that comes first (Bedrock sets a `retryAfter` job's nextRun to the
/// earlier of the two). Only fixed offsets (`+N SECONDS|MINUTES|HOURS|DAYS`)
/// can be counted; a repeat that cannot be is left out. The supervisor
/// cannot renew this term, so it stops the worker before it passes rather
/// than run the job twice.
fn retry_after_term(handout: &Map<String, Value>) -> Option<Duration> {
    let text = handout.get("retryAfter")?.as_str()?;
    if text.trim().is_empty() {
        return None;
    }
    let retry = fixed_seconds(&RetryAfter::parse(text).ok()?.modifiers)?;
    let repeat = handout
        .get("repeat")
        .and_then(Value::as_str)
        .filter(|r| !r.trim().is_empty())
        .and_then(|r| Repeat::parse(r).ok())
        .and_then(|repeat| {
            let interval = fixed_seconds(&repeat.modifiers)?;
            if repeat.base != RepeatBase::Scheduled {
                return Some(interval);
            }
            // From the nextRun it was due at; one already past is moved to
            // its first slot after now, at most an interval away.
            let due = handout
                .get("nextRun")
                .and_then(Value::as_str)
                .and_then(Timestamp::parse)?;
            let left = (due.0 + interval * 1000 - Timestamp::now().0) / 1000;
            Some(if left > 0 { left } else { interval })
        });
    let seconds = repeat.map_or(retry, |r| r.min(retry));
    u64::try_from(seconds)
        .ok()
        .filter(|&s| s > 0)
        .map(Duration::from_secs)
}

/// The length of a list of fixed-offset modifiers, in seconds; `None` when
/// one of them is calendar arithmetic (months, years, `START OF`, `WEEKDAY`).
fn fixed_seconds(modifiers: &[Modifier]) -> Option<i64> {
    let mut seconds: i64 = 0;
    for modifier in modifiers {
        let Modifier::Shift { amount, unit } = modifier else {
            return None;
        };
        let per = match unit {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Month | Unit::Year => return None,
        };
        seconds = seconds.checked_add(amount.checked_mul(per)?)?;
    }
    Some(seconds)
}

/// A request being built: the method and its header lines.
#[derive(Debug, Clone)]
struct Request {
    method: &'static str,
    lines: String,
}

impl Request {
    fn new(method: &'static str) -> Self {
        Request {
            method,
            lines: String::new(),
        }
    }

    /// A header whose value cannot hold a line break (numbers, fixed words).
    fn value(mut self, name: &str, value: impl fmt::Display) -> Self {
        self.lines.push_str(&format!("{name}: {value}\r\n"));
        self
    }

    /// A text header, backslash-escaped so that line breaks survive.
    fn text(self, name: &str, value: &str) -> Self {
        let escaped = escape(value);
        self.value(name, escaped)
    }

    /// A JSON header, sent compact and backslash-escaped as Bedrock-PHP
    /// sends it (Bedrock unescapes every header before it reads the JSON).
    /// Compact JSON escapes every control character, so a line break in it
    /// would be a bug; it is refused.
    fn json(self, name: &str, data: &Data) -> Result<Self, SourceError> {
        let text = serde_json::to_string(data).map_err(|error| {
            SourceError::Refused(format!("{name} cannot be written as JSON: {error}"))
        })?;
        if text.contains(['\r', '\n']) {
            return Err(SourceError::Refused(format!(
                "{name} would carry a line break in its header"
            )));
        }
        Ok(self.value(name, escape(&text)))
    }

    /// The `lease` header, when there is a lease token.
    fn lease(self, token: Option<&str>) -> Self {
        match token {
            Some(token) => self.text("lease", token),
            None => self,
        }
    }

    /// The request's bytes, with a `Token` header when given one (a
    /// token holds only printable characters, see [`crate::auth`]).
    fn encode(&self, token: Option<&ApiToken>) -> Vec<u8> {
        let token = token.map_or(String::new(), |t| format!("Token: {}\r\n", t.expose()));
        format!("{}\r\n{token}{}\r\n", self.method, self.lines).into_bytes()
    }
}

/// Bedrock's header escapes for a text value: `\\`, `\r`, `\n`.
fn escape(value: &str) -> Cow<'_, str> {
    if !value.contains(['\\', '\r', '\n']) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Response {
    /// The status code, 100..=599.
    code: u16,
    /// The whole status line, e.g. `404 No job found`.
    status_line: String,
    /// Headers by lower-cased name; a later duplicate replaces an earlier one.
    headers: HashMap<String, String>,
    /// Exactly `Content-Length` bytes.
    body: Vec<u8>,
}

impl Response {
    /// Whether the connection may carry another request.
    fn keeps_alive(&self) -> bool {
        !self
            .headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// The status line and headers of an answer, and its body's length.
#[derive(Debug)]
struct Head {
    code: u16,
    status_line: String,
    headers: HashMap<String, String>,
    content_length: usize,
}

/// Why an exchange on a connection failed.
#[derive(Debug, Error)]
enum ExchangeError {
    /// The server closed the connection.
    #[error("connection closed by the server{}", if *.partial { " in the middle of an answer" } else { "" })]
    Closed {
        /// Whether part of an answer had arrived.
        partial: bool,
    },
    /// Sending or receiving failed.
    #[error("{what} failed: {error}")]
    Io {
        /// `sending` or `receiving`.
        what: &'static str,
        /// The error.
        error: std::io::Error,
        /// Whether part of an answer had arrived.
        partial: bool,
    },
    /// Nothing happened in time.
    #[error("{what} timed out after {after:?}")]
    TimedOut {
        /// `sending` or `the answer`.
        what: &'static str,
        /// The time limit.
        after: Duration,
    },
    /// The answer cannot be read.
    #[error("{0}")]
    Protocol(String),
}

impl ExchangeError {
    /// Whether the server sent nothing back before the connection broke: on a
    /// pooled connection, the mark of one the server had already closed.
    fn nothing_received(&self) -> bool {
        match self {
            ExchangeError::Closed { partial } | ExchangeError::Io { partial, .. } => !partial,
            ExchangeError::TimedOut { .. } | ExchangeError::Protocol(_) => false,
        }
    }
}

/// One TCP connection to the server, with what it has read beyond the last
/// answer.
struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Whether it came from the pool (and so may have been closed meanwhile).
    reused: bool,
}

impl Connection {
    async fn open(addr: &str) -> Result<Self, SourceError> {
        let stream = match timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(SourceError::Unavailable(format!(
                    "connecting to bedrock://{addr} timed out after {CONNECT_TIMEOUT:?}"
                )));
            }
            Ok(Err(error)) => {
                return Err(SourceError::Unavailable(format!(
                    "cannot connect to bedrock://{addr}: {error}"
                )));
            }
            Ok(Ok(stream)) => stream,
        };
        let _ = stream.set_nodelay(true);
        Ok(Connection {
            stream,
            buf: Vec::new(),
            reused: false,
        })
    }

    /// Whether the server has not closed it (nor sent anything unasked).
    fn looks_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Sends `request` and reads one answer.
    async fn exchange(
        &mut self,
        request: &[u8],
        read_timeout: Duration,
    ) -> Result<Response, ExchangeError> {
        match timeout(WRITE_TIMEOUT, self.stream.write_all(request)).await {
            Err(_) => {
                return Err(ExchangeError::TimedOut {
                    what: "sending",
                    after: WRITE_TIMEOUT,
                });
            }
            Ok(Err(error)) => {
                return Err(ExchangeError::Io {
                    what: "sending",
                    error,
                    partial: false,
                });
            }
            Ok(Ok(())) => {}
        }
        read_response(&mut self.stream, &mut self.buf, read_timeout).await
    }
}

/// Reads one answer from `stream` within `limit`, starting with whatever is
/// already in `buf`; bytes after the answer stay in `buf`.
async fn read_response<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
    limit: Duration,
) -> Result<Response, ExchangeError> {
    let deadline = Instant::now() + limit;
    let (head, head_len) = loop {
        if let Some(found) = parse_head(buf).map_err(ExchangeError::Protocol)? {
            break found;
        }
        read_more(stream, buf, deadline, limit).await?;
    };
    let end = head_len + head.content_length;
    while buf.len() < end {
        read_more(stream, buf, deadline, limit).await?;
    }
    let body = buf[head_len..end].to_vec();
    buf.drain(..end);
    Ok(Response {
        code: head.code,
        status_line: head.status_line,
        headers: head.headers,
        body,
    })
}

/// Appends what arrives next to `buf`, by `deadline`.
async fn read_more<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
    deadline: Instant,
    limit: Duration,
) -> Result<(), ExchangeError> {
    buf.reserve(16 * 1024);
    let partial = !buf.is_empty();
    match timeout_at(deadline, stream.read_buf(buf)).await {
        Err(_) => Err(ExchangeError::TimedOut {
            what: "the answer",
            after: limit,
        }),
        Ok(Err(error)) => Err(ExchangeError::Io {
            what: "receiving",
            error,
            partial,
        }),
        Ok(Ok(0)) => Err(ExchangeError::Closed { partial }),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Reads a status line and headers from the front of `buf`: `Ok(None)` until
/// they are complete. Blank lines before the status line are skipped; `\r\n`
/// and bare `\n` both end a line. Without `Content-Length` there is no body.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, String> {
    let mut pos = 0;
    let mut status: Option<(u16, String)> = None;
    let mut headers = HashMap::new();
    loop {
        let Some(end) = buf[pos..].iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_HEAD {
                return Err(format!("status line and headers exceed {MAX_HEAD} bytes"));
            }
            return Ok(None);
        };
        let line = &buf[pos..pos + end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        pos += end + 1;
        if pos > MAX_HEAD {
            return Err(format!("status line and headers exceed {MAX_HEAD} bytes"));
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if status.is_none() {
            if !text.is_empty() {
                status = Some(parse_status(text)?);
            }
            continue;
        }
        if text.is_empty() {
            break;
        }
        let Some((name, value)) = text.split_once(':') else {
            return Err(format!("header line without a colon: {:?}", clip(text)));
        };
        if headers.len() >= MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} headers"));
        }
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let content_length = match headers.get("content-length") {
        None => 0,
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| format!("Content-Length is not a number: {:?}", clip(text)))?,
    };
    if content_length > MAX_BODY {
        return Err(format!(
            "answer of {content_length} bytes is over the {MAX_BODY}-byte limit"
        ));
    }
    let (code, status_line) = status.unwrap_or_default();
    Ok(Some((
        Head {
            code,
            status_line,
            headers,
            content_length,
        },
        pos,
    )))
}

/// `NNN message`: three digits from 100 to 599, then nothing or a space.
fn parse_status(line: &str) -> Result<(u16, String), String> {
    let bytes = line.as_bytes();
    let well_formed = bytes.len() >= 3
        && bytes[..3].iter().all(u8::is_ascii_digit)
        && bytes.get(3).is_none_or(|&b| b == b' ' || b == b'\t');
    let code = well_formed.then(|| line[..3].parse::<u16>().ok()).flatten();
    match code {
        Some(code) if (100..=599).contains(&code) => Ok((code, line.to_string())),
        _ => Err(format!("not a status line: {:?}", clip(line))),
    }
}

/// The start of `text`, for error messages.
fn clip(text: &str) -> &str {
    match text.char_indices().nth(80) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

#[cfg(test)]
mod tests;
