//! What the measures share: the processes under test (a `jobmgr server`, a
//! supervisor), readings from /proc, the monotonic clock, and statistics.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The API token of every server and supervisor the measures start.
pub const TOKEN: &str = "jobmgr-bench-token";

/// A blocking HTTP client that sends [`TOKEN`].
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .default_headers(auth_headers())
        .build()
        .expect("HTTP client")
}

/// An async HTTP client that sends [`TOKEN`].
pub fn async_client() -> reqwest::Client {
    reqwest::Client::builder()
        .default_headers(auth_headers())
        .build()
        .expect("HTTP client")
}

/// The `Authorization` header with [`TOKEN`].
pub fn auth_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {TOKEN}").parse().expect("header value"),
    );
    headers
}

/// The `jobmgr` binary under test: this build's, or the one named by
/// `JOBMGR_BENCH_BIN` (to measure another build in the same conditions).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("JOBMGR_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_jobmgr").into())
    })
}

/// Starts `command`, reads its ready line (its first line on stdout), and
/// keeps draining stdout so the process never blocks on it.
fn start_ready(mut command: Command) -> (Child, String) {
    let mut child = command
        .env("JOBMGR_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn jobmgr");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = lines.next().expect("a ready line").expect("ready line");
    std::thread::spawn(move || for _ in lines {});
    (child, ready)
}

/// The `key=value` field of a ready line.
pub fn field(ready: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in {ready:?}"))
        .to_string()
}

/// A `jobmgr server` on a fresh SQLite file (or on a PostgreSQL database it
/// is given), killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The Bedrock port's `127.0.0.1:PORT`.
    pub bedrock: String,
    /// The metrics endpoint's `127.0.0.1:PORT`.
    pub metrics: String,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra `jobmgr server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_on(None, extra)
    }

    /// A server on the PostgreSQL database at `db` (a `postgres://` URL),
    /// or on a fresh SQLite file for `None`, with extra arguments.
    pub fn start_on(db: Option<&str>, extra: &[&str]) -> Self {
        Self::start_binary(bin(), db, extra)
    }

    /// As [`ServerProcess::start_on`], with the `jobmgr` binary at `binary`.
    pub fn start_binary(binary: &str, db: Option<&str>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = Command::new(binary);
        command
            .args([
                "server",
                "--http",
                "127.0.0.1:0",
                "--bedrock",
                "127.0.0.1:0",
            ])
            .args(["--metrics", "127.0.0.1:0", "--db"]);
        match db {
            Some(url) => command.arg(url),
            None => command.arg(dir.path().join("jobs.db")),
        };
        command.args(extra).env("JOBMGR_LOG", "warn");
        let (child, ready) = start_ready(command);
        ServerProcess {
            child,
            url: field(&ready, "http"),
            bedrock: field(&ready, "bedrock"),
            metrics: field(&ready, "metrics"),
            _dir: dir,
        }
    }

    /// CPU seconds (user + system) the server has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    /// The requests the server has answered so far, over every API and
    /// route (`jobmgr_server_requests_total`), its metrics scrapes not
    /// counted.
    pub fn requests(&self) -> f64 {
        let text = client()
            .get(format!("http://{}/metrics", self.metrics))
            .send()
            .expect("scrape")
            .text()
            .expect("text");
        total(&text, "jobmgr_server_requests_total")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The PostgreSQL server the benchmarks use (trust authentication, user
/// `postgres`): `JOBMGR_BENCH_PG`, by default
/// `postgres://postgres@127.0.0.1:5432`, as CI and the tests have it.
pub fn pg_server() -> String {
    std::env::var("JOBMGR_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
        .trim_end_matches('/')
        .to_string()
}

/// Runs `f` on a thread of its own: the `postgres` crate's client blocks on
/// a runtime of its own, which panics inside another's (the server
/// measures run in one).
pub fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| match scope.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// A connection to `url`; panics saying what the benchmark needs.
fn pg_connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap_or_else(|e| {
        panic!(
            "cannot connect to {url} ({e}); the PostgreSQL measures need PostgreSQL on \
             127.0.0.1:5432 with trust authentication for the user postgres (or its URL in \
             JOBMGR_BENCH_PG)"
        )
    })
}

/// A database of its own on [`pg_server`], `jobmgr_bench_<pid>_<n>`,
/// dropped (`WITH (FORCE)`) when this is dropped: drop the servers on it
/// first.
pub struct PgDatabase {
    name: String,
    url: String,
}

impl PgDatabase {
    pub fn create() -> PgDatabase {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "jobmgr_bench_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let server = pg_server();
        off_runtime(|| {
            let mut client = pg_connect(&format!("{server}/postgres"));
            // One statement per query: neither may run in a transaction.
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .unwrap_or_else(|e| panic!("drop a stale database {name}: {e}"));
            client
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("create the database {name}: {e}"));
        });
        PgDatabase {
            url: format!("{server}/{name}"),
            name,
        }
    }

    /// Its URL, for `jobmgr server --db`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `sql` (one or more statements) on it.
    pub fn execute(&self, sql: &str) {
        off_runtime(|| {
            pg_connect(&self.url)
                .batch_execute(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
    }

    /// The first column of the first row of `sql`, as text.
    pub fn query_text(&self, sql: &str) -> String {
        off_runtime(|| {
            pg_connect(&self.url)
                .simple_query(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .into_iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap_or_default()
        })
    }

    /// CPU seconds (user + system) used so far by the PostgreSQL backends
    /// connected to this database (the servers' connections; the
    /// cluster's WAL writer, checkpointer and other background processes
    /// are not counted). A backend that has exited is no longer counted.
    pub fn backends_cpu_seconds(&self) -> f64 {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return 0.0;
        };
        let tag = format!(" {} ", self.name);
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                // A backend's title: "postgres: 15/main: USER DATABASE HOST(PORT) STATE".
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains(&tag))
                    .unwrap_or(false)
            })
            .filter_map(try_cpu_seconds)
            .sum()
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = &self.name;
        let server = pg_server();
        let dropped = off_runtime(|| {
            postgres::Client::connect(&format!("{server}/postgres"), postgres::NoTls).and_then(
                |mut client| {
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                },
            )
        });
        if let Err(e) = dropped {
            eprintln!("could not drop the benchmark database {name}: {e}");
        }
    }
}

/// The store under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// An SQLite file per server (so only one server).
    Sqlite,
    /// One PostgreSQL database shared by every server.
    Postgres,
}

/// `servers` fresh `jobmgr server`s on one fresh store; the servers are
/// killed, then the database dropped, when this is dropped.
pub struct Servers {
    pub servers: Vec<ServerProcess>,
    pub database: Option<PgDatabase>,
}

impl Servers {
    pub fn start(store: Store, servers: usize) -> Servers {
        Self::start_with(store, servers, &[])
    }

    /// With extra `jobmgr server` arguments.
    pub fn start_with(store: Store, servers: usize, extra: &[&str]) -> Servers {
        assert!(
            store == Store::Postgres || servers == 1,
            "servers cannot share an SQLite file"
        );
        let database = (store == Store::Postgres).then(PgDatabase::create);
        let url = database.as_ref().map(|d| d.url().to_string());
        Servers {
            servers: (0..servers)
                .map(|_| ServerProcess::start_on(url.as_deref(), extra))
                .collect(),
            database,
        }
    }

    /// The servers' HTTP base URLs.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.clone()).collect()
    }

    /// CPU seconds used so far by the servers.
    pub fn servers_cpu_seconds(&self) -> f64 {
        self.servers.iter().map(ServerProcess::cpu_seconds).sum()
    }

    /// CPU seconds used so far by the database's backends (0 on SQLite,
    /// whose work is in the server).
    pub fn database_cpu_seconds(&self) -> f64 {
        self.database
            .as_ref()
            .map_or(0.0, PgDatabase::backends_cpu_seconds)
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        // The servers first: the database is dropped after them.
        self.servers.clear();
    }
}

/// A supervisor with its own directory (workers, scratch, spool, a load
/// file reading 0 so that the machine's load never gates a measure).
pub struct SupervisorProcess {
    pub child: Child,
    /// Its ready line.
    pub ready: String,
    _dir: tempfile::TempDir,
}

/// How to start a supervisor.
pub struct SupervisorSpec<'a> {
    /// `--server`, or `None` for the embedded server.
    pub server: Option<&'a str>,
    /// The worker directory.
    pub workers: &'a Path,
    /// `--max-workers`.
    pub max_workers: usize,
    /// Extra flags.
    pub args: Vec<String>,
}

impl SupervisorProcess {
    pub fn start(spec: SupervisorSpec<'_>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        std::fs::write(d.join("loadavg"), "0.00 0.00 0.00 1/100 1\n").expect("loadavg");
        std::fs::write(d.join("empty.toml"), "").expect("config");
        let mut command = Command::new(bin());
        command
            .arg("--config")
            .arg(d.join("empty.toml"))
            .arg("--worker-path")
            .arg(spec.workers)
            .arg("--scratch-dir")
            .arg(d.join("scratch"))
            .arg("--spool-dir")
            .arg(d.join("spool"))
            .arg("--loadavg-path")
            .arg(d.join("loadavg"))
            .args(["--min-memory", "0", "--max-load", "1000"])
            .arg("--max-workers")
            .arg(spec.max_workers.to_string())
            .args(&spec.args)
            .env("JOBMGR_LOG", "warn")
            .stdin(Stdio::null());
        // No start-up ramp unless the measure asks for one.
        if !spec.args.iter().any(|a| a == "--ramp") {
            command.args(["--ramp", "100000"]);
        }
        // Workers run as the supervisor's own user unless the measure asks
        // for the full sandbox (as root: a uid of each job's own).
        if !spec.args.iter().any(|a| a == "--user") {
            command.args(["--user", "self"]);
        }
        match spec.server {
            Some(url) => {
                command.args(["--server", url]);
            }
            None => {
                command.arg("--db").arg(d.join("jobs.db")).args([
                    "--http",
                    "127.0.0.1:0",
                    "--bedrock",
                    "none",
                ]);
            }
        }
        let (child, ready) = start_ready(command);
        SupervisorProcess {
            child,
            ready,
            _dir: dir,
        }
    }

    /// A supervisor as a webserver runs it: the embedded server (on a
    /// fresh SQLite file), the machine's own load and memory gating it,
    /// the default start-up ramp and sandbox, and `args` on top.
    pub fn start_embedded(workers: &Path, args: &[String]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        std::fs::write(d.join("empty.toml"), "").expect("config");
        let mut command = Command::new(bin());
        command
            .arg("--config")
            .arg(d.join("empty.toml"))
            .arg("--worker-path")
            .arg(workers)
            .arg("--scratch-dir")
            .arg(d.join("scratch"))
            .arg("--spool-dir")
            .arg(d.join("spool"))
            .arg("--db")
            .arg(d.join("jobs.db"))
            .args(["--http", "127.0.0.1:0", "--bedrock", "none"])
            .args(args)
            // Its warnings are of jobs stopped when it is: expected.
            .env("JOBMGR_LOG", "error")
            .stdin(Stdio::null());
        let (child, ready) = start_ready(command);
        SupervisorProcess {
            child,
            ready,
            _dir: dir,
        }
    }

    /// CPU seconds (user + system) used so far: the supervisor's, and its
    /// helper processes' (its spawner or job guard), which do its work.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
            + self
                .helpers()
                .into_iter()
                .filter_map(try_cpu_seconds)
                .sum::<f64>()
    }

    /// The supervisor's helper processes: its children named `jobmgr-…`
    /// (the spawner, or the job guard), not its workers.
    pub fn helpers(&self) -> Vec<u32> {
        let mut found = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id()));
        for task in tasks.into_iter().flatten().flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for pid in children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.starts_with("jobmgr-") {
                    found.push(pid);
                }
            }
        }
        found
    }

    /// Resident set size in bytes of its helper processes together.
    pub fn helpers_rss(&self) -> u64 {
        self.helpers().into_iter().map(rss_of).sum()
    }

    /// Resident set size in bytes.
    pub fn rss(&self) -> u64 {
        rss_of(self.child.id())
    }
}

impl Drop for SupervisorProcess {
    /// SIGTERM, and a second one if it has not exited after a second: a
    /// drained supervisor waits up to 5 s for the answer of its long poll
    /// in flight (to hand back any job it brings), and the measures are
    /// over; asked again, it stops without waiting.
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let term = || {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        };
        term();
        let started = std::time::Instant::now();
        let mut asked_again = false;
        while started.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            if !asked_again && started.elapsed() >= Duration::from_secs(1) {
                term();
                asked_again = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    try_cpu_seconds(pid).expect("/proc/PID/stat")
}

/// Resident set size in bytes of process `pid` (0 if it is gone).
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// CPU seconds (user + system) process `pid` has used, if it still runs.
fn try_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some(ticks / hz)
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock the worker reads).
pub fn monotonic_ns() -> i64 {
    let mut t = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let done = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut t) };
    assert_eq!(done, 0, "clock_gettime");
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// A blocking HTTP POST answering JSON; panics on failure (a benchmark has
/// nothing to recover).
pub fn post(client: &reqwest::blocking::Client, url: &str, body: &Value) -> Value {
    let response = client.post(url).json(body).send().expect("request");
    let status = response.status();
    let value: Value = response.json().expect("json");
    assert!(status.is_success(), "{url}: {status} {value}");
    value
}

/// The sample lines of `series` in a Prometheus text.
fn series_lines<'a>(text: &'a str, series: &'a str) -> impl Iterator<Item = &'a str> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(move |line| {
            line.starts_with(series) && line[series.len()..].starts_with(['{', ' '])
        })
}

/// The value of a sample line.
fn value_of(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse().ok()
}

/// The value of `series` with all of `labels` in a Prometheus text.
pub fn sample(text: &str, series: &str, labels: &[&str]) -> Option<f64> {
    series_lines(text, series)
        .find(|line| labels.iter().all(|l| line.contains(l)))
        .and_then(value_of)
}

/// The sum of every sample of `series` in a Prometheus text.
pub fn total(text: &str, series: &str) -> f64 {
    series_lines(text, series).filter_map(value_of).sum()
}

/// The `p` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Median, min and max.
pub fn median_and_spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        percentile(&values, 0.5),
        values[0],
        values[values.len() - 1],
    )
}

/// `median (min–max)` with `decimals`.
pub fn spread(values: Vec<f64>, decimals: usize) -> String {
    let (median, min, max) = median_and_spread(values);
    format!("{median:.decimals$} ({min:.decimals$}–{max:.decimals$})")
}

/// Cores, kernel and CPU model.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("{cores} cores, Linux {}, {cpu}", kernel.trim())
}

/// Compiles the no-op C worker into `dir` as `name`; `None` when there is no
/// C compiler.
pub fn compile_noop_worker(dir: &Path, name: &str) -> Option<PathBuf> {
    compile_worker(dir, name, "noop_worker.c", &[&["-static"], &[]])
}

/// Compiles the no-op worker without a C library (`noop_worker_nolibc.c`)
/// into `dir` as `name`; `None` where it cannot be built (no C compiler, or
/// not x86_64 Linux).
pub fn compile_noop_worker_nolibc(dir: &Path, name: &str) -> Option<PathBuf> {
    let flags = [
        "-static",
        "-nostdlib",
        "-ffreestanding",
        "-fno-stack-protector",
    ];
    compile_worker(dir, name, "noop_worker_nolibc.c", &[&flags])
}

/// Compiles `benches/jobmgr/<source>` into `dir` as `name` with `cc -O2`
/// and the first of `tries` (extra flags) that builds.
pub fn compile_worker(dir: &Path, name: &str, source: &str, tries: &[&[&str]]) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/jobmgr")
        .join(source);
    let out = dir.join(name);
    for extra in tries {
        let built = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .args(*extra)
            .stderr(Stdio::null())
            .status();
        if built.is_ok_and(|s| s.success()) {
            return Some(out);
        }
    }
    None
}
