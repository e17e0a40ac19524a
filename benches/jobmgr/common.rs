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

/// The `jobmgr` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_jobmgr")
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

/// A `jobmgr server` on a fresh file, killed when dropped.
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
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = Command::new(bin());
        command
            .args([
                "server",
                "--http",
                "127.0.0.1:0",
                "--bedrock",
                "127.0.0.1:0",
            ])
            .args(["--metrics", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("jobs.db"))
            .args(extra)
            .env("JOBMGR_LOG", "warn");
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
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
            .args(["--user", "self", "--min-memory", "0", "--max-load", "1000"])
            .args(["--ramp", "100000", "--max-workers"])
            .arg(spec.max_workers.to_string())
            .args(&spec.args)
            .env("JOBMGR_LOG", "warn")
            .stdin(Stdio::null());
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

    /// CPU seconds (user + system) used so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    /// Resident set size in bytes.
    pub fn rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }
}

impl Drop for SupervisorProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks / hz
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

/// The value of `series` with all of `labels` in a Prometheus text.
pub fn sample(text: &str, series: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with(series) && line[series.len()..].starts_with(['{', ' ']))
        .find(|line| labels.iter().all(|l| line.contains(l)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
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
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jobmgr/noop_worker.c");
    let out = dir.join(name);
    for extra in [&["-static"][..], &[][..]] {
        let built = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .args(extra)
            .status();
        if built.is_ok_and(|s| s.success()) {
            return Some(out);
        }
    }
    None
}
