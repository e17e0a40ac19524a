//! Shared fixtures: a server process that cleans up after itself, an HTTP
//! helper that returns status and JSON, and polling helpers with generous
//! deadlines instead of sleeps.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub mod bedrock_conn;
pub mod browser;
mod cgroups;
mod fault_proxy;
mod pg;
mod process;
mod waits;
pub use cgroups::{TestCgroup, pids_below};
pub use fault_proxy::FaultProxy;
pub use pg::{StoreKind, TestDatabase, skip_on_postgres, store_is_postgres, store_kind};
pub use process::*;
pub use waits::*;

/// The `jobmgr` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_jobmgr")
}

/// How long any wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The API token of the fixtures' servers: one random token per run of the
/// test binary, written into each fixture server's token file before it
/// starts (so raw requests can carry it without knowing their server).
/// Tests of the token itself (tests/integration/local_auth.rs) let servers
/// make their own.
pub fn token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| jobmgr::auth::ApiToken::generate().expose().to_string())
}

/// [`token`] as the library's type, for in-process clients.
pub fn api_token() -> jobmgr::auth::ApiToken {
    jobmgr::auth::ApiToken::new(token()).expect("a token")
}

/// Writes [`token`] into `dir/token` (mode 0600) unless a token file is
/// already there; returns the file.
pub fn write_token_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).expect("token file's directory");
    let path = dir.join("token");
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut file) => file.write_all(token().as_bytes()).expect("token file"),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("token file {}: {e}", path.display()),
    }
    path
}

/// `bytes`, one Bedrock request, with a `Token` header carrying [`token`]
/// after its method line.
pub fn with_token_header(bytes: &[u8]) -> Vec<u8> {
    // Blank lines before a request are skipped by the server; the method
    // line is the first that is not blank.
    let mut start = 0;
    while bytes[start..].starts_with(b"\r\n") || bytes[start..].starts_with(b"\n") {
        start += if bytes[start] == b'\r' { 2 } else { 1 };
    }
    let at = bytes[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |i| start + i + 1);
    let mut out = bytes[..at].to_vec();
    // The same line end as the method line's.
    let end = if out.ends_with(b"\r\n") || !out.ends_with(b"\n") {
        "\r\n"
    } else {
        "\n"
    };
    if !out.ends_with(b"\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Token: {}{end}", token()).as_bytes());
    out.extend_from_slice(&bytes[at..]);
    out
}

/// [`raw_exchange`] of one Bedrock request with the fixtures' token added
/// ([`with_token_header`]).
pub fn bedrock_exchange(addr: &str, request: &[u8]) -> String {
    raw_exchange(addr, &with_token_header(request))
}

/// Where a fixture server keeps its jobs.
#[derive(Clone)]
enum StoreAt {
    /// This SQLite file.
    Sqlite(PathBuf),
    /// This PostgreSQL database, shared by the servers started
    /// [`ServerBuilder::same_store_as`] each other; the last of them to be
    /// dropped drops it.
    Postgres(Arc<TestDatabase>),
}

/// A `jobmgr server` process on 127.0.0.1, with a store of its own: an
/// SQLite file in a temporary directory, or with `JOBMGR_TEST_STORE=postgres`
/// a PostgreSQL database made for it ([`store_kind`]). Killed (by pid) when
/// dropped; its database is dropped after it.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The Bedrock port's `127.0.0.1:PORT`.
    pub bedrock: String,
    /// The metrics endpoint's `127.0.0.1:PORT`, with `--metrics`.
    pub metrics: String,
    store: StoreAt,
    /// The URL to reach a PostgreSQL store at, if not its own.
    db_url: Option<String>,
    /// The directory of its token file (the SQLite file's).
    home: PathBuf,
    dir: Option<tempfile::TempDir>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Where the server's stderr goes.
    pub stderr_path: PathBuf,
}

/// Options for starting a server.
#[derive(Default, Clone)]
pub struct ServerBuilder {
    db: Option<PathBuf>,
    same_store: Option<StoreAt>,
    /// The URL to reach a PostgreSQL store at, if not its own.
    db_url: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl ServerBuilder {
    /// Use this SQLite file. Not with PostgreSQL: a test that names a
    /// file skips there ([`skip_on_postgres`]).
    pub fn db(mut self, db: &Path) -> Self {
        assert!(
            !store_is_postgres(),
            "ServerBuilder::db names an SQLite file, but JOBMGR_TEST_STORE=postgres: the test \
             should skip on PostgreSQL (common::skip_on_postgres), or use same_store_as"
        );
        self.db = Some(db.to_path_buf());
        self
    }

    /// Serve the same store as `other` (another server beside it, for tests
    /// of several servers on one store). PostgreSQL only: one SQLite file
    /// is served by one server at a time (one_server_per_file.rs), so this
    /// panics on SQLite; such a test skips unless [`store_is_postgres`].
    pub fn same_store_as(mut self, other: &Server) -> Self {
        match &other.store {
            StoreAt::Sqlite(db) => panic!(
                "same_store_as: the other server's store is the SQLite file {}, which only one \
                 server may serve at a time; a test of several servers on one store runs only \
                 with JOBMGR_TEST_STORE=postgres (check common::store_is_postgres())",
                db.display()
            ),
            StoreAt::Postgres(database) => {
                self.same_store = Some(StoreAt::Postgres(Arc::clone(database)));
            }
        }
        self
    }

    /// Serve this PostgreSQL database, whatever `JOBMGR_TEST_STORE` says:
    /// for tests of what only PostgreSQL offers (several servers on one
    /// store), which always run.
    pub fn on_database(mut self, database: &Arc<TestDatabase>) -> Self {
        self.same_store = Some(StoreAt::Postgres(Arc::clone(database)));
        self
    }

    /// As [`on_database`](Self::on_database), reaching it at `url` (through
    /// a fault proxy, say).
    pub fn on_database_at(mut self, database: &Arc<TestDatabase>, url: &str) -> Self {
        self.db_url = Some(url.to_string());
        self.on_database(database)
    }

    /// An extra command-line argument for `jobmgr server`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// An environment variable for the server.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts it and waits for its ready line.
    pub fn start(self) -> Server {
        let (store, dir) = match (self.db, self.same_store) {
            (Some(db), _) => (StoreAt::Sqlite(db), None),
            (None, Some(store)) => (store, Some(tempfile::tempdir().expect("temp dir"))),
            (None, None) => {
                let dir = tempfile::tempdir().expect("temp dir");
                let store = match store_kind() {
                    StoreKind::Sqlite => StoreAt::Sqlite(dir.path().join("jobs.db")),
                    StoreKind::Postgres => StoreAt::Postgres(Arc::new(TestDatabase::create())),
                };
                (store, Some(dir))
            }
        };
        let (home, stderr_path) = match &store {
            StoreAt::Sqlite(db) => (
                db.parent().expect("the db's directory").to_path_buf(),
                db.with_extension(format!("stderr.{}", std::process::id())),
            ),
            StoreAt::Postgres(_) => {
                let home = dir.as_ref().expect("a temp dir").path().to_path_buf();
                let stderr_path = home.join("stderr");
                (home, stderr_path)
            }
        };
        let mut server = Server {
            child: None,
            url: String::new(),
            bedrock: String::new(),
            metrics: String::new(),
            store,
            db_url: self.db_url,
            home,
            dir,
            args: self.args,
            env: self.env,
            stderr_path,
        };
        server.spawn();
        server
    }
}

impl Server {
    /// A server with default options.
    pub fn start() -> Server {
        ServerBuilder::default().start()
    }

    /// Options for a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    fn spawn(&mut self) {
        let token_file = write_token_file(&self.home);
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("stderr file");
        let mut command = Command::new(bin());
        command.arg("server").arg("--db");
        match &self.store {
            // The token file is found beside it.
            StoreAt::Sqlite(db) => {
                command.arg(db);
            }
            // A URL has no "beside".
            StoreAt::Postgres(database) => {
                command.arg(self.db_url.as_deref().unwrap_or(database.url()));
                if !self.args.iter().any(|a| a == "--token-file") {
                    command.arg("--token-file").arg(&token_file);
                }
            }
        }
        command
            .arg("--http")
            .arg(self.http_addr())
            .arg("--bedrock")
            .arg("127.0.0.1:0")
            .args(&self.args)
            .env("JOBMGR_LOG", "info,jobmgr=debug")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn jobmgr server");
        let line = match ready_line(&mut child) {
            Ok(line) => line,
            Err(_) => {
                kill_and_reap(&mut child, "a server that did not become ready");
                panic!("server did not become ready; stderr:\n{}", self.stderr());
            }
        };
        let url = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .unwrap_or_else(|| panic!("no http= in ready line {line:?}"))
            .to_string();
        self.url = url;
        self.bedrock = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("bedrock="))
            .unwrap_or_default()
            .to_string();
        self.metrics = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("metrics="))
            .unwrap_or_default()
            .to_string();
        self.child = Some(child);
    }

    /// The SQLite file. Panics with `JOBMGR_TEST_STORE=postgres`: a test
    /// that opens the file skips there ([`skip_on_postgres`]), or uses
    /// [`Server::store_execute`] and [`Server::store_query_i64`].
    #[track_caller]
    pub fn db(&self) -> &Path {
        match &self.store {
            StoreAt::Sqlite(db) => db,
            StoreAt::Postgres(database) => panic!(
                "this test uses the server's SQLite file, but the server's store is the \
                 PostgreSQL database {}: skip the test on PostgreSQL (common::skip_on_postgres) \
                 or go through Server::store_execute / store_query_i64",
                database.url()
            ),
        }
    }

    /// The `--db` the server was started with: its SQLite file, or its
    /// database's URL.
    pub fn db_arg(&self) -> String {
        match &self.store {
            StoreAt::Sqlite(db) => db.display().to_string(),
            StoreAt::Postgres(database) => self
                .db_url
                .clone()
                .unwrap_or_else(|| database.url().to_string()),
        }
    }

    /// Whether this server's store is a PostgreSQL database.
    pub fn on_postgres(&self) -> bool {
        matches!(self.store, StoreAt::Postgres(_))
    }

    /// Runs `sql` (one statement, no parameters, in the SQL both stores
    /// read) on the server's store behind its back; returns the rows it
    /// changed. For a store the server is not writing: kill it first.
    pub fn store_execute(&self, sql: &str) -> u64 {
        match &self.store {
            StoreAt::Sqlite(db) => rusqlite::Connection::open(db)
                .expect("open the store")
                .execute(sql, [])
                .unwrap_or_else(|e| panic!("{sql}: {e}")) as u64,
            StoreAt::Postgres(database) => database
                .connect()
                .execute(sql, &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// The first column of every row `sql` (one query, no parameters)
    /// selects from the server's store, as integers.
    pub fn store_query_i64(&self, sql: &str) -> Vec<i64> {
        match &self.store {
            StoreAt::Sqlite(db) => {
                let db = rusqlite::Connection::open(db).expect("open the store");
                let mut query = db.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                query
                    .query_map([], |row| row.get(0))
                    .and_then(|rows| rows.collect::<Result<_, _>>())
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            StoreAt::Postgres(database) => database
                .connect()
                .query(sql, &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(|row| row.get(0))
                .collect(),
        }
    }

    /// The server's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `kill -9` the server and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, "the server");
        }
    }

    /// SIGTERM the server and wait for it to exit; returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::SIGTERM,
        )
        .expect("SIGTERM");
        wait_child(&mut child, DEADLINE).unwrap_or_else(|| {
            kill_and_reap(&mut child, "a server that ignored SIGTERM");
            panic!(
                "timed out after {DEADLINE:?} waiting for the server to exit after SIGTERM; \
                 stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// Kills the server and starts it again on the same store (SQLite file
    /// or PostgreSQL database). The port changes; `url` is updated.
    pub fn restart(&mut self) {
        self.kill9();
        self.url.clear();
        self.spawn();
    }

    /// Starts a killed server again on the same store and the same HTTP
    /// port, so that clients holding its URL reach it again.
    pub fn start_again_on_the_same_port(&mut self) {
        assert!(self.child.is_none(), "kill the server first");
        self.spawn();
    }

    /// `--http` for the next start: the last port, or one from the OS.
    fn http_addr(&self) -> String {
        match self.url.strip_prefix("http://") {
            Some(addr) if !addr.is_empty() => addr.to_string(),
            _ => "127.0.0.1:0".to_string(),
        }
    }

    /// An HTTP helper for this server.
    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }

    /// The `host:port` the server listens on.
    pub fn addr(&self) -> String {
        let url = self.url.as_str();
        url.strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .unwrap_or(url)
            .to_string()
    }

    /// The server's token file (beside its SQLite file; with PostgreSQL, in
    /// its temporary directory).
    pub fn token_file(&self) -> PathBuf {
        self.home.join("token")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            // The test failed: what the server said last, before it goes.
            let stderr = self.stderr();
            let lines: Vec<&str> = stderr.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- the last {} lines of the stderr of the server on {} (--db {}):\n{}\n---",
                tail.len(),
                self.url,
                self.db_arg(),
                tail.join("\n")
            );
        }
        let _ = std::fs::remove_file(&self.stderr_path);
        // Then `store`: the last server on a PostgreSQL database drops it.
    }
}

/// The first line a `jobmgr` process prints on its piped stdout (its ready
/// line), waiting up to [`DEADLINE`]; the rest of stdout is drained so that
/// the process never blocks on a full pipe.
pub fn ready_line(child: &mut Child) -> Result<String, mpsc::RecvTimeoutError> {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    rx.recv_timeout(DEADLINE)
}

/// Polls `check` every 10 ms until it returns `Some`, or panics after
/// [`DEADLINE`] naming `what`.
pub fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        if start.elapsed() > DEADLINE {
            panic!("timed out after {DEADLINE:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An HTTP/JSON caller that returns `(status, body)`.
#[derive(Clone)]
pub struct Api {
    base: String,
    client: reqwest::blocking::Client,
    token: Option<String>,
}

impl Api {
    /// A caller of `base`, sending the fixtures' [`token`].
    pub fn new(base: &str) -> Api {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        Api {
            base: base.to_string(),
            client,
            token: Some(token().to_string()),
        }
    }

    /// A caller of an `https://` `base` that trusts the CA certificate
    /// `ca_pem`.
    pub fn trusting(base: &str, ca_pem: &[u8]) -> Api {
        let ca = reqwest::Certificate::from_pem(ca_pem).expect("CA certificate");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .add_root_certificate(ca)
            .build()
            .expect("client");
        Api {
            base: base.to_string(),
            client,
            token: Some(token().to_string()),
        }
    }

    /// Sends this bearer token instead.
    pub fn with_token(mut self, token: &str) -> Api {
        self.token = Some(token.to_string());
        self
    }

    /// Sends no token.
    pub fn without_token(mut self) -> Api {
        self.token = None;
        self
    }

    /// Any request, with a raw body.
    pub fn send(&self, method: &str, path: &str, body: Option<String>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .client
            .request(method, format!("{}{}", self.base, path));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().expect("request");
        let status = response.status().as_u16();
        let text = response.text().expect("body");
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("answer is not JSON: HTTP {status} {text:?}"));
        (status, value)
    }

    /// Any request with these headers (`Host`, `Origin`, `Content-Type`, …)
    /// and a body sent as given, with no `Content-Type` unless listed: what
    /// a browser page could send.
    pub fn send_with_headers(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .client
            .request(method, format!("{}{}", self.base, path));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().expect("request");
        let status = response.status().as_u16();
        let text = response.text().expect("body");
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("answer is not JSON: HTTP {status} {text:?}"));
        (status, value)
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None)
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body.to_string()))
    }

    /// `PATCH path` with a JSON body.
    pub fn patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("PATCH", path, Some(body.to_string()))
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> (u16, Value) {
        self.send("DELETE", path, None)
    }

    /// Creates a job; panics unless it succeeds. Returns its id.
    pub fn create(&self, body: Value) -> i64 {
        let (status, answer) = self.post("/jobs", body);
        assert_eq!(status, 200, "create failed: {answer}");
        answer["jobID"].as_i64().expect("jobID")
    }

    /// CreateJobs (`POST /jobs/batch`); returns the new ids, in order.
    pub fn create_batch(&self, jobs: Vec<Value>) -> Vec<i64> {
        let (status, answer) = self.post("/jobs/batch", json!({ "jobs": jobs }));
        assert_eq!(status, 200, "batch create failed: {answer}");
        answer["jobIDs"]
            .as_array()
            .expect("jobIDs")
            .iter()
            .map(|id| id.as_i64().expect("id"))
            .collect()
    }

    /// Dequeues without waiting; returns the jobs handed out.
    pub fn dequeue(&self, body: Value) -> Vec<Value> {
        let (status, answer) = self.post("/dequeue", body);
        assert_eq!(status, 200, "dequeue failed: {answer}");
        answer["jobs"].as_array().expect("jobs").clone()
    }

    /// Dequeues one job by name pattern; panics unless exactly one is due.
    pub fn take(&self, name: &str) -> Value {
        let jobs = self.dequeue(json!({"name": name}));
        assert_eq!(jobs.len(), 1, "expected one job for {name}, got {jobs:?}");
        jobs[0].clone()
    }

    /// QueryJob; panics unless the job exists.
    pub fn job(&self, id: i64) -> Value {
        let (status, answer) = self.get(&format!("/jobs/{id}"));
        assert_eq!(status, 200, "query {id} failed: {answer}");
        answer
    }

    /// The outcomes of a job's recorded attempts, oldest first; panics
    /// unless its history is found.
    pub fn outcomes(&self, id: i64) -> Vec<String> {
        let (status, history) = self.get(&format!("/jobs/{id}/history"));
        assert_eq!(status, 200, "history of {id}: {history}");
        history["attempts"]
            .as_array()
            .expect("attempts")
            .iter()
            .map(|a| a["outcome"].as_str().expect("outcome").to_string())
            .collect()
    }

    /// The state of a job, or `None` if it is gone.
    pub fn state(&self, id: i64) -> Option<String> {
        let (status, answer) = self.get(&format!("/jobs/{id}"));
        match status {
            200 => Some(answer["state"].as_str().expect("state").to_string()),
            404 => None,
            other => panic!("query {id}: HTTP {other} {answer}"),
        }
    }
}

/// Asserts an API error's HTTP status and code.
#[track_caller]
pub fn assert_error(answer: (u16, Value), status: u16, code: &str) {
    assert_eq!(
        (answer.0, answer.1["code"].as_str().unwrap_or("")),
        (status, code),
        "answer: {}",
        answer.1
    );
}

/// Sends raw bytes to `addr` and returns everything the server answers
/// until it closes or goes quiet for a second.
pub fn raw_exchange(addr: &str, bytes: &[u8]) -> String {
    exchange_on(TcpStream::connect(addr).expect("connect"), bytes)
}

/// Writes `bytes` on `stream` and returns everything the server answers
/// until it closes, or goes quiet for a second once it has answered
/// something (its first answer may take up to [`DEADLINE`] on a loaded
/// machine: a client that gave up sooner would be taken for one that went
/// away).
fn exchange_on(mut stream: TcpStream, bytes: &[u8]) -> String {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    stream.write_all(bytes).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                stream
                    .set_read_timeout(Some(Duration::from_secs(1)))
                    .expect("timeout");
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads until the server closes `stream` (a reset counts as closing);
/// panics if it is still open after [`DEADLINE`]. Returns what it said.
pub fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    stream.set_nonblocking(false).expect("blocking");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&out).into_owned();
            }
            Err(e) => panic!("{what}: {e}"),
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: still open after {DEADLINE:?}; it said {:?}",
            String::from_utf8_lossy(&out)
        );
    }
}

/// A TCP connection to `addr` from the local address `from` (such as
/// 127.0.0.2, to be another peer than 127.0.0.1).
pub fn connect_from(from: std::net::IpAddr, addr: &str) -> TcpStream {
    let target: std::net::SocketAddr = addr.parse().expect("ip:port");
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(target),
        socket2::Type::STREAM,
        None,
    )
    .expect("socket");
    socket
        .bind(&std::net::SocketAddr::new(from, 0).into())
        .unwrap_or_else(|e| panic!("bind to {from}: {e}"));
    socket
        .connect(&target.into())
        .unwrap_or_else(|e| panic!("connect from {from} to {addr}: {e}"));
    socket.into()
}

/// As [`raw_exchange`], from the local address `from`.
pub fn raw_exchange_from(from: std::net::IpAddr, addr: &str, bytes: &[u8]) -> String {
    exchange_on(connect_from(from, addr), bytes)
}

/// Fetches `/metrics` from `addr` as text, with the fixtures' [`token`].
pub fn scrape(addr: &str) -> String {
    let response = reqwest::blocking::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(token())
        .send()
        .expect("scrape");
    assert_eq!(response.status().as_u16(), 200, "scrape of {addr}");
    response.text().expect("metrics text")
}

/// Scrapes `/metrics` at `addr` until `ready` holds for its text, within
/// [`DEADLINE`]; fails naming `what`, with the last text seen. Every gauge
/// and counter is updated on its own, so a test waits for one scrape that
/// shows all it asserts.
pub fn scrape_until(addr: &str, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = scrape(addr);
        if ready(&text) {
            return text;
        }
        if Instant::now() > deadline {
            panic!("timed out after {DEADLINE:?} waiting for {what}; last scrape:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the first sample of `series` whose labels include every one
/// of `labels` (each written `key="value"`).
pub fn sample(text: &str, series: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with(series) && line[series.len()..].starts_with(['{', ' ']))
        .find(|line| labels.iter().all(|l| line.contains(l)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The sum of every sample of `series`, whatever its labels.
pub fn total(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with(series) && line[series.len()..].starts_with(['{', ' ']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`, …), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Asserts that the peak resident set size of `pid` (its `VmHWM`, which
/// the kernel keeps, so no sampling misses a spike) stayed within
/// `allowance_mib` of `baseline_kib`, its peak before the test's load.
#[track_caller]
pub fn assert_peak_rss_within(pid: u32, baseline_kib: u64, allowance_mib: u64, what: &str) {
    let peak = status_kib(pid, "VmHWM");
    assert!(
        peak <= baseline_kib + allowance_mib * 1024,
        "{what}: the supervisor's peak RSS was {peak} KiB, more than {allowance_mib} MiB over \
         its peak of {baseline_kib} KiB before"
    );
}

/// A `jobmgr` command that takes no `JOBMGR_*` setting from the
/// environment the tests run in, and whose default paths (the SQLite file,
/// the spool, the status file, the scratch directory) lie in `dir`, the
/// test's own directory, not in a state directory shared with other tests.
/// For starts that should be refused: if one is not, it touches nothing
/// outside `dir`.
pub fn jobmgr_in(dir: &Path) -> Command {
    let mut command = Command::new(bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    command.env("STATE_DIRECTORY", dir);
    command
}

/// Runs `jobmgr ARGS` with only `vars` of the `JOBMGR_*` variables set;
/// returns (exit code, stdout, stderr).
pub fn jobmgr_with(vars: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(bin());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    command.envs(vars.iter().copied()).args(args);
    let output = command.run_bounded(&format!("{vars:?} jobmgr {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `jobmgr job …` against a server; returns (exit code, stdout, stderr).
pub fn cli(server: &Server, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["job"];
    all.extend_from_slice(args);
    client_command(server, &all)
}

/// Runs a client command (`jobmgr stats …`, `jobmgr job …`) against a
/// server, with `--token-file` naming the server's; returns (exit code,
/// stdout, stderr).
pub fn client_command(server: &Server, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(bin())
        .args(args)
        .arg("--server")
        .arg(&server.url)
        .arg("--token-file")
        .arg(server.token_file())
        .env_remove("JOBMGR_TOKEN")
        .env_remove("JOBMGR_TOKEN_FILE")
        .run_bounded(&format!("jobmgr {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Writes a file in PSI format (`/proc/pressure/*`, `*.pressure`) with
/// these `some` and `full` avg10 readings, atomically.
pub fn write_psi(path: &Path, some: f64, full: f64) {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!(
            "some avg10={some:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10={full:.2} avg60=0.00 avg300=0.00 total=1\n"
        ),
    )
    .expect("pressure file");
    std::fs::rename(&tmp, path).expect("pressure file");
}

/// A `jobmgr` supervisor process with its own worker directory, scratch
/// directory, spool, and load/memory/pressure files (load 0, plenty of
/// memory, no pressure, so the machine's real load never gates a test). Killed (by pid) when dropped.
pub struct Supervisor {
    child: Option<Child>,
    /// Its directory: `workers/`, `scratch/`, `spool/`, `loadavg`, `meminfo`.
    pub dir: tempfile::TempDir,
    /// Where its stderr goes.
    pub stderr_path: PathBuf,
    /// Its ready line.
    pub ready: String,
}

/// Options for starting a supervisor.
pub struct SupervisorBuilder {
    args: Vec<String>,
    envs: Vec<(String, String)>,
    user: Option<String>,
    workers: Vec<(String, String)>,
    dir: tempfile::TempDir,
    without_cgroups: bool,
    /// A command it runs under (`unshare …`, `sh -c …`), if any.
    wrapper: Vec<String>,
    /// The `cgroup.procs` files it joins before its exec.
    cgroup_procs: Vec<std::ffi::CString>,
    /// Whether its scratch directory and spool are left to their defaults.
    default_state: bool,
    /// Whether its jobs yield the CPU and disks (the product's default).
    yielding: bool,
}

impl Supervisor {
    /// A supervisor of the server at `server_url` (`http://…` or
    /// `bedrock://…`).
    pub fn builder(server_url: &str) -> SupervisorBuilder {
        Self::builder_in(server_url, &std::env::temp_dir())
    }

    /// As [`Supervisor::builder`], with its directory made in `parent`.
    pub fn builder_in(server_url: &str, parent: &Path) -> SupervisorBuilder {
        let dir = tempfile::tempdir_in(parent).expect("temp dir");
        std::fs::write(dir.path().join("loadavg"), "0.00 0.00 0.00 1/100 1\n").expect("loadavg");
        std::fs::write(
            dir.path().join("meminfo"),
            "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n",
        )
        .expect("meminfo");
        // A calm site: no pressure, so that the machine's own never pauses
        // or freezes a test's jobs.
        let pressure = dir.path().join("pressure");
        std::fs::create_dir(&pressure).expect("pressure dir");
        for resource in ["cpu", "memory", "io"] {
            write_psi(&pressure.join(resource), 0.0, 0.0);
        }
        std::fs::create_dir(dir.path().join("workers")).expect("workers dir");
        SupervisorBuilder {
            args: vec!["--server".into(), server_url.into()],
            // The fixtures' servers all have the fixtures' token.
            envs: vec![("JOBMGR_TOKEN".into(), token().into())],
            // As root, workers would run as an unprivileged user who cannot
            // reach this test's private directories; tests about users say so.
            user: nix::unistd::geteuid().is_root().then(|| "root".to_string()),
            workers: Vec::new(),
            dir,
            without_cgroups: false,
            wrapper: Vec::new(),
            cgroup_procs: Vec::new(),
            default_state: false,
            yielding: false,
        }
    }

    /// A supervisor running its own embedded server (store in its
    /// directory, HTTP and Bedrock ports from the OS).
    pub fn embedded() -> SupervisorBuilder {
        let mut builder = Self::builder("");
        builder.envs.clear();
        write_token_file(builder.dir.path());
        let db = builder.dir.path().join("jobs.db");
        builder.args = vec![
            "--db".into(),
            db.display().to_string(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--bedrock".into(),
            "127.0.0.1:0".into(),
        ];
        builder
    }

    /// A `key=value` field of the ready line (`http`, `bedrock`, `metrics`).
    pub fn ready_field(&self, key: &str) -> String {
        let prefix = format!("{key}=");
        self.ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {key}= in the ready line {:?}", self.ready))
            .to_string()
    }

    /// An HTTP helper for an embedded supervisor's server.
    pub fn api(&self) -> Api {
        Api::new(&self.ready_field("http"))
    }

    /// The worker directory.
    pub fn workers(&self) -> PathBuf {
        self.dir.path().join("workers")
    }

    /// The scratch directory.
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    /// The report spool.
    pub fn spool(&self) -> PathBuf {
        self.dir.path().join("spool")
    }

    /// Sets the load average the supervisor reads.
    pub fn set_load(&self, load: f64) {
        std::fs::write(
            self.dir.path().join("loadavg"),
            format!("{load:.2} {load:.2} {load:.2} 1/100 1\n"),
        )
        .expect("loadavg");
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), signal)
            .expect("signal");
    }

    /// Waits for it to exit (up to a minute: a drain lets jobs finish).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Duration::from_secs(60);
        wait_child(&mut child, deadline).unwrap_or_else(|| {
            kill_and_reap(&mut child, "a supervisor that did not exit");
            panic!(
                "timed out after {deadline:?} waiting for the supervisor to exit; stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// Panics, with its exit status and stderr, unless it is still running
    /// (not exited). `what` says why the test needs it running.
    #[track_caller]
    pub fn assert_running(&mut self, what: &str) {
        let child = self
            .child
            .as_mut()
            .expect("started and not stopped by the test");
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                // Reaped now: forget the pid, which is no longer ours.
                self.child = None;
                panic!(
                    "{what}: the supervisor exited early ({status}); stderr:\n{}",
                    self.stderr()
                );
            }
            Err(e) => panic!("{what}: cannot check the supervisor: {e}"),
        }
    }

    /// Whether it has exited, as a wait sees it (a killed process closes
    /// its files, and so drops its locks, before that), asked without
    /// reaping it: [`Supervisor::assert_running`] or `kill9` still does.
    pub fn has_exited(&self) -> bool {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
        let status = waitid(Id::Pid(pid), flags).expect("wait on our own child");
        !matches!(status, WaitStatus::StillAlive)
    }

    /// `kill -9` it and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, "the supervisor");
        }
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl SupervisorBuilder {
    /// An extra command-line argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// An environment variable for the supervisor (`JOBMGR_*` settings).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// The user workers run as (when the tests run as root); `None` for
    /// the supervisor's default.
    pub fn user(mut self, user: Option<&str>) -> Self {
        self.user = user.map(str::to_string);
        self
    }

    /// Runs it where it finds no cgroups: in a mount namespace of its own
    /// with an empty tmpfs over `/sys/fs/cgroup` (needs root).
    pub fn without_cgroups(mut self) -> Self {
        self.without_cgroups = true;
        self
    }

    /// Runs it under `command` (its words; the supervisor's command line
    /// follows them): `unshare --pid …` to give it a PID namespace, `sh -c
    /// 'umask 077 && exec "$@"' sh` to give it a umask.
    pub fn wrapped(mut self, command: &[&str]) -> Self {
        self.wrapper = command.iter().map(|w| w.to_string()).collect();
        self
    }

    /// Starts it in `cgroup` (it joins it before its exec).
    pub fn in_cgroup(mut self, cgroup: &TestCgroup) -> Self {
        self.cgroup_procs = cgroup.procs_files();
        self
    }

    /// Leaves its scratch directory and spool to their defaults (in the
    /// state directory: that of `--db`, or `/var/lib/jobmgr`).
    pub fn default_state(mut self) -> Self {
        self.default_state = true;
        self
    }

    /// Lets its jobs yield the CPU and the disks, as the product does by
    /// default. Other tests turn it off: on a machine busy with other tests
    /// and builds, an idle-priority worker waits for as long as they keep
    /// the cores busy, and the time a test waits would measure the machine.
    /// The yielding itself is tested with this on.
    pub fn yielding(mut self) -> Self {
        self.yielding = true;
        self
    }

    /// A worker script (made executable) in the worker directory.
    pub fn worker(mut self, name: &str, script: &str) -> Self {
        self.workers.push((name.to_string(), script.to_string()));
        self
    }

    /// The supervisor's directory (to place files before it starts).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts it and waits for its ready line.
    pub fn start(self) -> Supervisor {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir;
        let workers = dir.path().join("workers");
        for (name, script) in &self.workers {
            let path = workers.join(name);
            std::fs::write(&path, script).expect("worker script");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let stderr_path = dir.path().join("stderr");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let d = dir.path();
        let mut command = match self.wrapper.split_first() {
            Some((program, words)) => {
                let mut command = Command::new(program);
                command.args(words).arg(bin());
                command
            }
            None => Command::new(bin()),
        };
        // Only what the test says: no /etc/jobmgr files, no JOBMGR_*
        // variables from the environment the tests run in.
        if !self.args.iter().any(|a| a == "--config") {
            let empty = d.join("empty.toml");
            std::fs::write(&empty, "").expect("empty config");
            command.arg("--config").arg(empty);
        }
        for (key, _) in std::env::vars() {
            if key.starts_with("JOBMGR_") {
                command.env_remove(key);
            }
        }
        command.envs(self.envs.iter().map(|(k, v)| (k, v)));
        command.arg("--worker-path").arg(&workers);
        if !self.default_state {
            command
                .arg("--scratch-dir")
                .arg(d.join("scratch"))
                .arg("--spool-dir")
                .arg(d.join("spool"));
        }
        if !self.args.iter().any(|a| a == "--pressure-dir") {
            command.arg("--pressure-dir").arg(d.join("pressure"));
        }
        command
            .arg("--loadavg-path")
            .arg(d.join("loadavg"))
            .arg("--meminfo-path")
            .arg(d.join("meminfo"))
            .args([
                "--kill-grace",
                "2s",
                "--backoff",
                "1s",
                "--max-backoff",
                "2s",
                "--poll-wait",
                "5s",
            ])
            .args(&self.args)
            .env("JOBMGR_LOG", "info,jobmgr=debug")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        if let Some(user) = &self.user {
            command.arg("--user").arg(user);
        }
        if !self.yielding {
            command.args(["--yield-cpu=false", "--yield-io=false"]);
        }
        if !self.cgroup_procs.is_empty() {
            use std::os::unix::process::CommandExt;
            let files = self.cgroup_procs.clone();
            // SAFETY: only system calls on strings made before the fork.
            unsafe {
                command.pre_exec(move || {
                    use nix::libc;
                    for file in &files {
                        let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        if fd < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                        if wrote != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        if self.without_cgroups {
            use std::os::unix::process::CommandExt;
            // SAFETY: only system calls on static strings, between fork and
            // exec.
            unsafe {
                command.pre_exec(|| {
                    use nix::libc;
                    let check = |r: libc::c_int| {
                        if r < 0 {
                            Err(std::io::Error::last_os_error())
                        } else {
                            Ok(())
                        }
                    };
                    check(libc::unshare(libc::CLONE_NEWNS))?;
                    check(libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ))?;
                    check(libc::mount(
                        c"none".as_ptr(),
                        c"/sys/fs/cgroup".as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    ))
                });
            }
        }
        let mut child = command.spawn().expect("spawn jobmgr supervisor");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let ready = match rx.recv_timeout(DEADLINE) {
            Ok(line) => line,
            Err(_) => {
                kill_and_reap(&mut child, "a supervisor that did not become ready");
                panic!(
                    "supervisor did not become ready; stderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        };
        Supervisor {
            child: Some(child),
            dir,
            stderr_path,
            ready,
        }
    }
}

/// The time a server started with `--clock-file` reads, written by the test
/// (a scripted clock: tests of timings are exact without waiting).
pub struct Clock {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Clock {
    /// A clock file reading `time` (`YYYY-MM-DD HH:MM:SS[.mmm]`, UTC; or
    /// an offset from the system time in ms with its sign, `+3600000`).
    pub fn at(time: &str) -> Clock {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Clock {
            path: dir.path().join("clock"),
            _dir: dir,
        };
        clock.set(time);
        clock
    }

    /// Sets the time. The file is replaced whole (written beside it, then
    /// renamed), so that the server never reads it half written: a torn read
    /// would fall back to the system time and lapse every lease at once.
    pub fn set(&self, time: &str) {
        let next = self.path.with_extension("next");
        std::fs::write(&next, time).expect("clock file");
        std::fs::rename(&next, &self.path).expect("clock file");
    }

    /// Options for a server that reads this clock.
    pub fn server(&self) -> ServerBuilder {
        Server::builder()
            .arg("--clock-file")
            .arg(self.path.to_str().expect("utf-8 path"))
    }
}
