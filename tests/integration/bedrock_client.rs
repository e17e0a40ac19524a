//! `BedrockSource` end to end: every `JobSource` call against the real
//! binary's Bedrock port, checked through the HTTP API; and against a fake
//! "today's Bedrock" that answers GetJobs at once, the polling fallback, its
//! backoff, and the return to waiting when the server starts holding requests.

use crate::common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobmgr::client::{BedrockSource, FetchMode, JobSource, LeasedJob, Report, SourceError};
use jobmgr::protocol::{CreateJob, Priority, Repeat};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The lease asked for: long enough not to lapse during a test.
const LEASE: Duration = Duration::from_secs(60);

/// A long wait that a test ends early by making a job due.
const LONG_WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Helpers

/// A source on the server's Bedrock port.
fn bedrock(server: &Server) -> BedrockSource {
    BedrockSource::new(&server.bedrock)
        .expect("Bedrock address")
        .with_token(Some(api_token()))
}

/// The HTTP helper, made and dropped on a thread of its own: its blocking
/// client may not be dropped inside the runtime.
struct Http(Option<Api>);

impl std::ops::Deref for Http {
    type Target = Api;

    fn deref(&self) -> &Api {
        self.0.as_ref().expect("dropped only once")
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        if let Some(api) = self.0.take() {
            let _ = std::thread::spawn(move || drop(api)).join();
        }
    }
}

fn http(server: &Server) -> Http {
    let url = server.url.clone();
    Http(Some(
        std::thread::spawn(move || Api::new(&url))
            .join()
            .expect("HTTP client"),
    ))
}

/// Runs blocking code (the HTTP helper, polling) off the runtime's threads,
/// passing its panics on.
async fn off_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

async fn create(api: &Api, body: Value) -> i64 {
    let api = api.clone();
    off_thread(move || api.create(body)).await
}

async fn query(api: &Api, id: i64) -> Value {
    let api = api.clone();
    off_thread(move || api.job(id)).await
}

async fn state(api: &Api, id: i64) -> Option<String> {
    let api = api.clone();
    off_thread(move || api.state(id)).await
}

/// How many dequeue requests the server holds.
fn waiting(api: &Api) -> i64 {
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 200, "{health}");
    health["waiting"].as_i64().expect("waiting")
}

/// Polls until the server holds exactly `n` waiting requests.
async fn wait_for_waiters(api: &Api, n: i64) {
    let api = api.clone();
    off_thread(move || {
        poll(&format!("{n} held GetJobs"), || {
            (waiting(&api) == n).then_some(())
        })
    })
    .await
}

/// Takes the one due job called `name` through `source`.
async fn take(source: &BedrockSource, name: &str) -> LeasedJob {
    let mut jobs = source
        .get_jobs(name, 1, Duration::ZERO, LEASE)
        .await
        .expect("get_jobs");
    assert_eq!(jobs.len(), 1, "expected one job called {name}: {jobs:?}");
    jobs.remove(0)
}

/// A JSON object as job data.
fn data(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Milliseconds since the epoch of a server timestamp.
fn ms(text: &Value) -> i64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {text}"));
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .unwrap_or_else(|e| panic!("bad timestamp {text:?}: {e}"))
        .and_utc()
        .timestamp_millis()
}

// ---------------------------------------------------------------------------
// Against the real server

#[tokio::test]
async fn get_jobs_hands_out_due_jobs_and_marks_them_running() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    assert_eq!(source.describe(), format!("bedrock://{}", server.bedrock));
    let a = create(&api, json!({"name": "bc/get-a", "data": {"n": 1}})).await;
    let b = create(&api, json!({"name": "bc/get-b", "data": {"n": 2}})).await;
    create(&api, json!({"name": "other", "data": {}})).await;

    let mut jobs = source
        .get_jobs("bc/get-*", 5, Duration::ZERO, LEASE)
        .await
        .expect("get_jobs");
    jobs.sort_by_key(|job| job.id);
    let seen: Vec<_> = jobs
        .iter()
        .map(|j| (j.id, j.name.as_str(), Value::Object(j.data.clone())))
        .collect();
    assert_eq!(
        seen,
        [
            (a, "bc/get-a", json!({"n": 1})),
            (b, "bc/get-b", json!({"n": 2}))
        ]
    );
    for job in &jobs {
        assert!(job.lease.is_some(), "the Bedrock port leases to who asks");
        assert_eq!(job.attempt, 1);
        assert_eq!(job.handout["jobID"], job.id);
        assert!(
            job.handout.contains_key("nextRun"),
            "the whole hand-out is kept: {:?}",
            job.handout
        );
        assert_eq!(state(&api, job.id).await.as_deref(), Some("RUNNING"));
    }
    let again = source
        .get_jobs("bc/get-*", 5, Duration::ZERO, LEASE)
        .await
        .expect("get_jobs");
    assert!(
        again.is_empty(),
        "running jobs are not handed out twice: {again:?}"
    );
}

#[tokio::test]
async fn get_jobs_waits_for_a_job_created_while_it_waits() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let (jobs, id) = tokio::join!(source.get_jobs("bc/later", 1, LONG_WAIT, LEASE), async {
        wait_for_waiters(&api, 1).await;
        create(&api, json!({"name": "bc/later", "data": {"k": "v"}})).await
    });
    let jobs = jobs.expect("get_jobs");
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    assert_eq!(jobs[0].data, data(json!({"k": "v"})));
    assert_eq!(source.fetch_mode(), FetchMode::Blocking);
    assert_eq!(state(&api, id).await.as_deref(), Some("RUNNING"));
}

#[tokio::test]
async fn get_jobs_with_nothing_due_waits_its_time_out_and_stays_blocking() {
    let server = Server::start();
    let source = bedrock(&server);
    let started = Instant::now();
    let jobs = source
        .get_jobs("bc/nothing", 1, Duration::from_millis(1500), LEASE)
        .await
        .expect("get_jobs");
    assert!(jobs.is_empty(), "{jobs:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "the server held the request: {:?}",
        started.elapsed()
    );
    assert_eq!(
        source.fetch_mode(),
        FetchMode::Blocking,
        "a server that waits is not polled"
    );
}

#[tokio::test]
async fn finish_deletes_a_one_off_job() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/finish"})).await;
    let job = take(&source, "bc/finish").await;
    source
        .report(job.id, None, &Report::Finish { data: None })
        .await
        .expect("finish");
    assert_eq!(
        state(&api, id).await,
        None,
        "a finished one-off job is deleted"
    );
}

#[tokio::test]
async fn finish_with_data_requeues_a_repeating_job_with_that_data() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(
        &api,
        json!({"name": "bc/repeat", "repeat": "FINISHED, +1 HOUR", "data": {"cursor": 1}}),
    )
    .await;
    let job = take(&source, "bc/repeat").await;
    let report = Report::Finish {
        data: Some(data(json!({"cursor": 2}))),
    };
    source
        .report(job.id, job.lease.as_deref(), &report)
        .await
        .expect("finish");
    let after = query(&api, id).await;
    assert_eq!(after["state"], "QUEUED", "{after}");
    assert_eq!(after["data"], json!({"cursor": 2}));
}

#[tokio::test]
async fn retry_requeues_the_job_after_its_delay_with_new_data() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/retry", "data": {"try": 1}})).await;
    let job = take(&source, "bc/retry").await;
    let before = chrono::Utc::now().timestamp_millis();
    let report = Report::Retry {
        delay_secs: 600,
        ignore_repeat: false,
        data: Some(data(json!({"try": 2}))),
        name: None,
        next_run: None,
    };
    source.report(job.id, None, &report).await.expect("retry");
    let after = query(&api, id).await;
    assert_eq!(after["state"], "QUEUED", "{after}");
    assert_eq!(after["data"], json!({"try": 2}));
    let delay = ms(&after["nextRun"]) - before;
    assert!(
        delay >= 590_000,
        "nextRun {} is {delay} ms away, not 600 s",
        after["nextRun"]
    );
    let due = source
        .get_jobs("bc/retry", 1, Duration::ZERO, LEASE)
        .await
        .expect("get_jobs");
    assert!(due.is_empty(), "a delayed job is not due: {due:?}");
}

#[tokio::test]
async fn a_retry_carries_a_new_name_and_an_explicit_time() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/rename"})).await;
    let job = take(&source, "bc/rename").await;
    let report = Report::Retry {
        delay_secs: 5,
        ignore_repeat: true,
        data: None,
        name: Some("bc/renamed".into()),
        next_run: Some("2031-02-03 04:05:06".into()),
    };
    source
        .report(job.id, job.lease.as_deref(), &report)
        .await
        .expect("retry");
    let after = query(&api, id).await;
    assert_eq!(after["name"], "bc/renamed", "{after}");
    assert_eq!(
        after["nextRun"], "2031-02-03 04:05:06",
        "the time wins over the delay: {after}"
    );
}

#[tokio::test]
async fn fail_marks_the_job_failed_with_its_data() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/fail"})).await;
    let job = take(&source, "bc/fail").await;
    let report = Report::Fail {
        data: Some(data(json!({"error": "boom"}))),
    };
    source.report(job.id, None, &report).await.expect("fail");
    let after = query(&api, id).await;
    assert_eq!(after["state"], "FAILED", "{after}");
    assert_eq!(after["data"], json!({"error": "boom"}));
}

#[tokio::test]
async fn update_replaces_the_data_of_a_running_job() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/update", "data": {"a": 1}})).await;
    let job = take(&source, "bc/update").await;
    // Line breaks, quotes, backslashes and non-ASCII must survive the header.
    let progress =
        json!({"progress": 50, "note": "line 1\nline 2\r\n\t\"quoted\" back\\slash é ✓"});
    source
        .update(&job, &data(progress.clone()))
        .await
        .expect("update");
    let after = query(&api, id).await;
    assert_eq!(after["data"], progress, "data is replaced, not merged");
    assert_eq!(after["state"], "RUNNING");
}

#[tokio::test]
async fn heartbeat_renews_the_lease_and_changes_nothing_else() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/beat"})).await;
    let job = take(&source, "bc/beat").await;
    let mut before = query(&api, id).await;
    source.heartbeat(&job).await.expect("heartbeat");
    let mut after = query(&api, id).await;
    let lease = |job: &mut Value| ms(&job["leaseExpires"].take());
    assert!(lease(&mut after) >= lease(&mut before), "{after} {before}");
    assert_eq!(after, before);
}

#[tokio::test]
async fn reports_on_jobs_that_are_not_held_are_refused() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let queued = create(&api, json!({"name": "bc/queued"})).await;
    for report in [
        Report::Finish { data: None },
        Report::Retry {
            delay_secs: 0,
            ignore_repeat: false,
            data: None,
            name: None,
            next_run: None,
        },
        Report::Fail { data: None },
    ] {
        let result = source.report(queued, None, &report).await;
        assert!(
            matches!(result, Err(SourceError::Refused(_))),
            "{} of a queued job: {result:?}",
            report.kind()
        );
    }
    assert_eq!(
        state(&api, queued).await.as_deref(),
        Some("QUEUED"),
        "refused reports change nothing"
    );

    let gone = source
        .report(987_654_321, None, &Report::Finish { data: None })
        .await;
    assert!(
        matches!(gone, Err(SourceError::NotFound(_))),
        "finish of a missing job: {gone:?}"
    );
    let ghost =
        LeasedJob::from_handout(data(json!({"jobID": 987_654_321, "name": "ghost"}))).expect("job");
    let update = source.update(&ghost, &data(json!({}))).await;
    assert!(
        matches!(update, Err(SourceError::NotFound(_))),
        "update of a missing job: {update:?}"
    );
    let bad = source.get_jobs("", 1, Duration::ZERO, LEASE).await;
    assert!(
        matches!(bad, Err(SourceError::Refused(_))),
        "GetJobs without a name: {bad:?}"
    );
}

#[tokio::test]
async fn reports_go_out_while_a_get_jobs_waits() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let done = create(&api, json!({"name": "bc/done"})).await;
    let job = take(&source, "bc/done").await;
    let (waited, later) = tokio::join!(source.get_jobs("bc/wanted", 1, LONG_WAIT, LEASE), async {
        wait_for_waiters(&api, 1).await;
        source
            .report(job.id, None, &Report::Finish { data: None })
            .await
            .expect("finish while waiting");
        assert_eq!(state(&api, done).await, None);
        let api2 = api.clone();
        assert_eq!(
            off_thread(move || waiting(&api2)).await,
            1,
            "the GetJobs is still held"
        );
        create(&api, json!({"name": "bc/wanted"})).await
    });
    let waited = waited.expect("get_jobs");
    assert_eq!(waited.iter().map(|j| j.id).collect::<Vec<_>>(), [later]);
}

#[tokio::test]
async fn create_exists_and_delete_reach_the_server() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let mut job = CreateJob::named("bc/declared");
    job.data = data(json!({"line": "a\nb", "n": 1}));
    job.repeat = Some(Repeat::parse("finished, +1 hour").expect("repeat"));
    job.priority = Some(Priority::parse("750").expect("priority"));
    job.unique = true;
    let id = source.create(&job).await.expect("create");
    let stored = query(&api, id).await;
    assert_eq!(
        (
            &stored["name"],
            &stored["data"],
            &stored["repeat"],
            &stored["priority"]
        ),
        (
            &json!("bc/declared"),
            &json!({"line": "a\nb", "n": 1}),
            &json!("FINISHED, +1 HOUR"),
            &json!(750)
        ),
        "{stored}"
    );
    assert_eq!(
        source.create(&job).await.expect("unique create"),
        id,
        "unique returns the same job"
    );

    assert!(source.exists(id).await.expect("exists"));
    source.delete(id).await.expect("delete");
    assert_eq!(state(&api, id).await, None);
    assert!(!source.exists(id).await.expect("exists after delete"));
    let again = source.delete(id).await;
    assert!(matches!(again, Err(SourceError::NotFound(_))), "{again:?}");
    let nameless = source.create(&CreateJob::named("")).await;
    assert!(
        matches!(nameless, Err(SourceError::Refused(_))),
        "{nameless:?}"
    );
}

#[tokio::test]
async fn a_dropped_waiting_get_jobs_leaves_the_job_queued() {
    let server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    tokio::select! {
        result = source.get_jobs("bc/dropped", 1, LONG_WAIT, LEASE) => panic!("nothing was due: {result:?}"),
        () = wait_for_waiters(&api, 1) => {}
    }
    // The future is gone; its connection must be closed, not pooled, so the
    // server stops holding the request.
    wait_for_waiters(&api, 0).await;
    let id = create(&api, json!({"name": "bc/dropped"})).await;
    let job = query(&api, id).await;
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_i64()),
        (Some("QUEUED"), Some(0)),
        "{job}"
    );
    let taken = take(&source, "bc/dropped").await;
    assert_eq!(taken.id, id, "the source still works after the drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_get_jobs_fails_unavailable_when_the_server_dies() {
    let mut server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let (result, ()) = tokio::join!(source.get_jobs("bc/never", 1, LONG_WAIT, LEASE), async {
        wait_for_waiters(&api, 1).await;
        server.kill9();
    });
    assert!(
        matches!(result, Err(SourceError::Unavailable(_))),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_unavailable_while_the_server_is_down_and_work_after_a_restart() {
    let mut server = Server::start();
    let api = http(&server);
    let source = bedrock(&server);
    let id = create(&api, json!({"name": "bc/survivor", "data": {"n": 1}})).await;
    let job = take(&source, "bc/survivor").await;

    server.kill9();
    let finish = Report::Finish { data: None };
    let report = source.report(job.id, None, &finish).await;
    assert!(
        matches!(report, Err(SourceError::Unavailable(_))),
        "report: {report:?}"
    );
    assert!(report.as_ref().is_err_and(SourceError::is_transient));
    let update = source.update(&job, &data(json!({"n": 2}))).await;
    assert!(
        matches!(update, Err(SourceError::Unavailable(_))),
        "update: {update:?}"
    );
    let get = source.get_jobs("bc/*", 1, Duration::ZERO, LEASE).await;
    assert!(
        matches!(get, Err(SourceError::Unavailable(_))),
        "get_jobs: {get:?}"
    );

    server.restart();
    let api = http(&server);
    let source = bedrock(&server);
    assert_eq!(
        state(&api, id).await.as_deref(),
        Some("RUNNING"),
        "the hand-out survived the crash"
    );
    source
        .report(job.id, None, &finish)
        .await
        .expect("the held report goes through after the restart");
    assert_eq!(state(&api, id).await, None);
    let next = create(&api, json!({"name": "bc/after"})).await;
    assert_eq!(take(&source, "bc/after").await.id, next);
}

// ---------------------------------------------------------------------------
// Against a fake server

/// A request the fake server received.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    method: String,
    /// Which request on its connection it was, from 1.
    on_connection: usize,
    /// By lower-cased name.
    headers: HashMap<String, String>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The `Timeout` header in milliseconds.
    fn timeout(&self) -> Duration {
        let ms = self.header("timeout").and_then(|t| t.parse().ok());
        Duration::from_millis(ms.unwrap_or_else(|| panic!("no Timeout in {self:?}")))
    }
}

/// How the fake server answers one request.
enum Reply {
    /// At once.
    Now(String),
    /// After holding the request for a while.
    After(Duration, String),
    /// Never: close the connection instead.
    Hangup,
}

/// A response in Bedrock's framing.
fn answer(status: &str, body: &str) -> String {
    format!("{status}\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

fn no_job() -> Reply {
    Reply::Now(answer("404 No job found", ""))
}

/// A Bedrock server on 127.0.0.1:0 that answers each request with what
/// `reply(n, request)` says (`n` counts from 1), and records what it got.
struct Fake {
    addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// `one_per_connection`: close each connection after one answer (with no
    /// `Connection: close`), like a server whose idle timeout is zero.
    async fn start<F>(one_per_connection: bool, reply: F) -> Fake
    where
        F: Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let reply = Arc::new(reply);
        let task = {
            let seen = Arc::clone(&seen);
            let connections = Arc::clone(&connections);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let seen = Arc::clone(&seen);
                    let reply = Arc::clone(&reply);
                    tokio::spawn(serve(stream, seen, one_per_connection, move |n, s| {
                        reply(n, s)
                    }));
                }
            })
        };
        Fake {
            addr,
            seen,
            connections,
            task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    one_per_connection: bool,
    reply: impl Fn(usize, &Seen) -> Reply,
) {
    let mut buf = Vec::new();
    let mut on_connection = 0;
    loop {
        on_connection += 1;
        // The source sends no bodies: a request ends at its blank line.
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let text = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let mut lines = text.split("\r\n");
        let method = lines.next().unwrap_or_default().to_string();
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        let request = Seen {
            at: Instant::now(),
            method,
            on_connection,
            headers,
        };
        let n = {
            let mut seen = seen.lock().expect("seen");
            seen.push(request.clone());
            seen.len()
        };
        let bytes = match reply(n, &request) {
            Reply::Now(bytes) => bytes,
            Reply::After(pause, bytes) => {
                tokio::time::sleep(pause).await;
                bytes
            }
            Reply::Hangup => return,
        };
        if stream.write_all(bytes.as_bytes()).await.is_err() || one_per_connection {
            return;
        }
    }
}

/// Log lines captured from the current thread (use a current-thread runtime).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures `info` and above on this thread until the guard is dropped.
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs.clone(), tracing::subscriber::set_default(subscriber))
    }

    /// How many lines contain `needle`.
    fn count(&self, needle: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned();
        text.lines().filter(|line| line.contains(needle)).count()
    }
}

#[tokio::test]
async fn against_a_server_that_answers_at_once_it_polls_with_bounded_backoff() {
    let (logs, _guard) = Logs::capture();
    let fake = Fake::start(false, |_, _| no_job()).await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let wait = Duration::from_secs(5);
    let started = Instant::now();
    let jobs = source
        .get_jobs("anything", 1, wait, LEASE)
        .await
        .expect("get_jobs");
    assert!(jobs.is_empty(), "{jobs:?}");
    assert!(
        started.elapsed() >= wait,
        "the whole wait is used: {:?}",
        started.elapsed()
    );
    assert_eq!(source.fetch_mode(), FetchMode::Polling);
    assert_eq!(
        logs.count("mode=\"polling\""),
        1,
        "the change of mode is logged once"
    );

    let seen = fake.seen();
    // 1 s doubling with ±20 % jitter fits 3 requests into 5 s; a busy loop
    // would send thousands.
    assert!(
        (2..=10).contains(&seen.len()),
        "{} requests in {wait:?}",
        seen.len()
    );
    for (i, pair) in seen.windows(2).enumerate() {
        let least = Duration::from_millis(800 << i).min(Duration::from_secs(8));
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= least,
            "pause {i} was {gap:?}, less than {least:?}: no backoff"
        );
    }
    for request in &seen {
        assert_eq!(request.method, "GetJobs");
        assert_eq!(
            request.header("connection"),
            Some("wait"),
            "still asks to wait: {request:?}"
        );
        assert!(request.timeout() <= wait, "{request:?}");
    }
    assert_eq!(
        fake.connections(),
        1,
        "one persistent connection for all polls"
    );
}

#[tokio::test]
async fn polling_gets_the_job_when_it_appears() {
    let fake = Fake::start(false, |n, _| {
        if n < 3 {
            no_job()
        } else {
            Reply::Now(answer(
                "200 OK",
                r#"{"jobs":[{"jobID":42,"name":"fake/job","data":{"x":1}}]}"#,
            ))
        }
    })
    .await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let jobs = source
        .get_jobs("fake/*", 2, LONG_WAIT, LEASE)
        .await
        .expect("get_jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        (jobs[0].id, jobs[0].name.as_str(), jobs[0].attempt),
        (42, "fake/job", 1)
    );
    assert_eq!(jobs[0].data, data(json!({"x": 1})));
    assert_eq!(source.fetch_mode(), FetchMode::Polling);

    let seen = fake.seen();
    assert_eq!(seen.len(), 3, "two empty polls, then the job: {seen:?}");
    for pair in seen.windows(2) {
        assert!(
            pair[1].timeout() < pair[0].timeout(),
            "each poll asks for what is left of the wait: {seen:?}"
        );
    }
    for request in &seen {
        assert_eq!(request.header("name"), Some("fake/*"));
        assert_eq!(request.header("numresults"), Some("2"));
        assert_eq!(request.header("connection"), Some("wait"));
        assert!(request.timeout() <= LONG_WAIT);
    }
}

#[tokio::test]
async fn fetch_mode_returns_to_blocking_when_the_server_starts_waiting() {
    let (logs, _guard) = Logs::capture();
    // The first GetJobs is answered at once; later ones are held for their
    // Timeout, as a server that honours `Connection: wait` does.
    let fake = Fake::start(false, |n, request| {
        if n == 1 {
            no_job()
        } else {
            Reply::After(request.timeout(), answer("404 No job found", ""))
        }
    })
    .await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let first = source
        .get_jobs("x", 1, Duration::from_millis(1500), LEASE)
        .await
        .expect("first");
    assert!(first.is_empty());
    assert_eq!(source.fetch_mode(), FetchMode::Polling);

    let second = source
        .get_jobs("x", 1, Duration::from_secs(2), LEASE)
        .await
        .expect("second");
    assert!(second.is_empty());
    assert_eq!(
        source.fetch_mode(),
        FetchMode::Blocking,
        "a held 404 shows the server waits again"
    );
    let third = source
        .get_jobs("x", 1, Duration::from_secs(1), LEASE)
        .await
        .expect("third");
    assert!(third.is_empty());
    assert_eq!(source.fetch_mode(), FetchMode::Blocking);

    assert_eq!(
        logs.count("mode=\"polling\""),
        1,
        "one line per change of mode"
    );
    assert_eq!(
        logs.count("mode=\"blocking\""),
        1,
        "one line per change of mode"
    );
}

#[tokio::test]
async fn reconnects_transparently_when_the_server_closes_idle_connections() {
    let fake = Fake::start(true, |_, _| Reply::Now(answer("200 OK", ""))).await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let job = LeasedJob::from_handout(data(json!({"jobID": 5, "name": "x"}))).expect("job");
    for n in 0..3 {
        source
            .update(&job, &data(json!({"n": n})))
            .await
            .expect("update on a fresh connection");
    }
    source
        .report(5, None, &Report::Finish { data: None })
        .await
        .expect("finish");
    let methods: Vec<_> = fake.seen().into_iter().map(|s| s.method).collect();
    assert_eq!(
        methods,
        ["UpdateJob", "UpdateJob", "UpdateJob", "FinishJob"],
        "each request arrived once"
    );
    assert_eq!(fake.connections(), 4, "a new connection for each request");
}

#[tokio::test]
async fn a_pooled_connection_that_breaks_on_use_is_replaced_but_a_fresh_one_is_not() {
    // Answers the first request on each connection and hangs up on the
    // next, as a server that closed the idle connection just as it was used.
    let fake = Fake::start(false, |_, request| {
        if request.on_connection == 1 {
            Reply::Now(answer("200 OK", ""))
        } else {
            Reply::Hangup
        }
    })
    .await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let job = LeasedJob::from_handout(data(json!({"jobID": 5, "name": "x"}))).expect("job");
    source
        .update(&job, &data(json!({"n": 1})))
        .await
        .expect("first update");
    source
        .update(&job, &data(json!({"n": 2})))
        .await
        .expect("second update, sent again on a new connection");
    let seen: Vec<_> = fake
        .seen()
        .into_iter()
        .map(|s| (s.on_connection, s.header("data").map(str::to_string)))
        .collect();
    let n = |n: i64| Some(json!({"n": n}).to_string());
    assert_eq!(seen, [(1, n(1)), (2, n(2)), (1, n(2))]);
    assert_eq!(fake.connections(), 2);

    // On a connection just opened, a hang-up is the server's doing: the
    // request is not sent twice.
    let rude = Fake::start(false, |_, _| Reply::Hangup).await;
    let source = BedrockSource::new(&rude.addr).expect("source");
    let result = source.report(5, None, &Report::Finish { data: None }).await;
    assert!(
        matches!(result, Err(SourceError::Unavailable(_))),
        "{result:?}"
    );
    assert_eq!(rude.seen().len(), 1, "sent once");
}

#[tokio::test]
async fn answers_map_to_errors_by_status_class() {
    let fake = Fake::start(false, |_, request| match request.method.as_str() {
        "GetJobs" => Reply::Now(answer("503 Server busy", "")),
        "UpdateJob" => Reply::Now(answer("402 Malformed data", "")),
        "FinishJob" => Reply::Now(answer("500 Internal error", "")),
        "FailJob" => Reply::Now("200 OK\r\nContent-Length: 100000000\r\n\r\n".into()),
        _ => Reply::Now("200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".into()),
    })
    .await;
    let source = BedrockSource::new(&fake.addr).expect("source");
    let job = LeasedJob::from_handout(data(json!({"jobID": 9, "name": "x"}))).expect("job");

    let get = source.get_jobs("x", 1, Duration::ZERO, LEASE).await;
    assert!(
        matches!(get, Err(SourceError::Unavailable(_))),
        "5xx on GetJobs: {get:?}"
    );
    let update = source.update(&job, &data(json!({}))).await;
    assert!(
        matches!(update, Err(SourceError::Refused(_))),
        "4xx on UpdateJob: {update:?}"
    );
    let finish = source.report(9, None, &Report::Finish { data: None }).await;
    assert!(
        matches!(finish, Err(SourceError::Unavailable(_))),
        "5xx on FinishJob: {finish:?}"
    );
    let fail = source.report(9, None, &Report::Fail { data: None }).await;
    assert!(
        matches!(fail, Err(SourceError::Protocol(_))),
        "a 100 MB answer: {fail:?}"
    );
    let retry = Report::Retry {
        delay_secs: -5,
        ignore_repeat: false,
        data: Some(data(json!({"a": [1, 2]}))),
        name: None,
        next_run: None,
    };
    source.report(9, None, &retry).await.expect("retry");

    let seen = fake.seen();
    let sent = seen
        .iter()
        .find(|s| s.method == "RetryJob")
        .expect("RetryJob sent");
    assert_eq!(sent.header("jobid"), Some("9"));
    assert_eq!(
        sent.header("delay"),
        Some("0"),
        "a negative delay is sent as 0"
    );
    assert_eq!(sent.header("data"), Some(r#"{"a":[1,2]}"#));
}
