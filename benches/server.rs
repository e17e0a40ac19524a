//! Job server benchmark: create → dequeue → finish cycles per second over
//! HTTP with durable commits (1 and 16 clients), dequeue latency with 10^3
//! and 10^6 jobs queued, and the CPU cost of 1,000 idle waiting requests.
//!
//! `cargo bench --bench server` runs the full set and writes the report to
//! `BENCHMARKS.md` (or the file named by `JOBMGR_BENCH_REPORT`).
//! `JOBMGR_BENCH_SMOKE=1` runs a seconds-long version that only checks that
//! everything still works; its figures mean nothing.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How big a run is.
#[derive(Clone, Copy)]
struct Scale {
    /// Length of one throughput run.
    cycle_run: Duration,
    /// Throughput runs per client count.
    repeats: usize,
    /// Queue sizes for the dequeue-latency measure.
    queued: [usize; 2],
    /// Dequeues sampled per queue size.
    latency_samples: usize,
    /// Idle waiting requests.
    waiters: usize,
    /// How long the idle waiters are watched.
    idle_watch: Duration,
}

const FULL: Scale = Scale {
    cycle_run: Duration::from_secs(5),
    repeats: 3,
    queued: [1_000, 1_000_000],
    latency_samples: 1_000,
    waiters: 1_000,
    idle_watch: Duration::from_secs(10),
};

const SMOKE: Scale = Scale {
    cycle_run: Duration::from_millis(500),
    repeats: 1,
    queued: [100, 2_000],
    latency_samples: 50,
    waiters: 50,
    idle_watch: Duration::from_millis(500),
};

/// A `jobmgr server` on a fresh file, killed when dropped.
struct ServerProcess {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobmgr"))
            .args(["server", "--http", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("jobs.db"))
            .env("JOBMGR_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn jobmgr server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("ready line");
        let url = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .expect("http= in the ready line")
            .to_string();
        ServerProcess {
            child,
            url,
            _dir: dir,
        }
    }

    /// CPU seconds (user + system) the server has used so far.
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("stat");
        let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        ticks / hz
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Value {
    let response = client.post(url).json(body).send().await.expect("request");
    let status = response.status();
    let value: Value = response.json().await.expect("json");
    assert!(status.is_success(), "{url}: {status} {value}");
    value
}

/// One client's loop: create a job, dequeue it, finish it, until `stop`.
async fn cycle_client(
    client: reqwest::Client,
    base: String,
    name: String,
    stop: Instant,
    done: Arc<AtomicU64>,
) {
    let dequeue = json!({"name": name, "leaseMs": 60_000});
    while Instant::now() < stop {
        post(
            &client,
            &format!("{base}/jobs"),
            &json!({"name": name, "data": {"n": 1}}),
        )
        .await;
        let got = post(&client, &format!("{base}/dequeue"), &dequeue).await;
        let job = &got["jobs"][0];
        let id = job["jobID"].as_i64().expect("a job was due");
        let lease = job["lease"].as_str().expect("lease");
        post(
            &client,
            &format!("{base}/jobs/{id}/finish"),
            &json!({"lease": lease}),
        )
        .await;
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Cycles per second with `clients` concurrent clients.
async fn cycles_per_second(base: &str, clients: usize, run: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop = start + run;
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let client = reqwest::Client::new();
            tokio::spawn(cycle_client(
                client,
                base.to_string(),
                format!("bench/c{i}"),
                stop,
                done.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Fills the queue with `count` due jobs, in batches.
async fn fill(client: &reqwest::Client, base: &str, count: usize) {
    let mut left = count;
    while left > 0 {
        let n = left.min(10_000);
        let jobs: Vec<Value> = (0..n)
            .map(|i| json!({"name": "bench/queued", "data": {"i": i}}))
            .collect();
        post(
            client,
            &format!("{base}/jobs/batch"),
            &json!({"jobs": jobs}),
        )
        .await;
        left -= n;
    }
}

/// Latencies in milliseconds of `samples` non-waiting dequeues, sorted.
async fn dequeue_latencies(client: &reqwest::Client, base: &str, samples: usize) -> Vec<f64> {
    let body = json!({"name": "bench/*", "leaseMs": 3_600_000});
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let got = post(client, &format!("{base}/dequeue"), &body).await;
        out.push(start.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(
            got["jobs"].as_array().map(Vec::len),
            Some(1),
            "a job was due"
        );
    }
    out.sort_by(f64::total_cmp);
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn median_and_spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        percentile(&values, 0.5),
        values[0],
        values[values.len() - 1],
    )
}

fn machine() -> String {
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

fn main() {
    // `cargo bench` passes `--bench`; anything else (like `cargo test`) does not.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let smoke = std::env::var_os("JOBMGR_BENCH_SMOKE").is_some();
    let scale = if smoke { SMOKE } else { FULL };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = runtime.block_on(run(scale));
    if smoke {
        println!("{report}\n(smoke run: figures not recorded)");
        return;
    }
    let path = std::env::var("JOBMGR_BENCH_REPORT").unwrap_or_else(|_| "BENCHMARKS.md".into());
    std::fs::write(&path, &report).expect("write report");
    println!("{report}\nwritten to {path}");
}

async fn run(scale: Scale) -> String {
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(&format!("- Machine: {}\n", machine()));
    out.push_str("- Command: `cargo bench --bench server`\n");
    out.push_str("- Server: the release `jobmgr server` binary on a fresh SQLite file in a temporary directory (WAL, synchronous=FULL: every answered write is on disk).\n");
    out.push_str("- Clients: reqwest on the same machine, over 127.0.0.1; client and server share the 2 cores.\n\n");

    // 1. Throughput.
    out.push_str("## Server throughput: create → dequeue → finish over HTTP\n\n");
    out.push_str(&format!(
        "Each client loops: CreateJob, dequeue it (with a lease), FinishJob with the lease token. Three durable commits per cycle. {} runs of {:?} each; median (min–max).\n\n",
        scale.repeats, scale.cycle_run
    ));
    out.push_str("| clients | cycles/s | commits/s |\n| --- | --- | --- |\n");
    for clients in [1, 16] {
        let mut runs = Vec::new();
        for _ in 0..scale.repeats {
            let server = ServerProcess::start();
            runs.push(cycles_per_second(&server.url, clients, scale.cycle_run).await);
        }
        let (median, min, max) = median_and_spread(runs);
        out.push_str(&format!(
            "| {clients} | {median:.0} ({min:.0}–{max:.0}) | {:.0} |\n",
            median * 3.0
        ));
    }

    // 2. Dequeue latency against queue size.
    out.push_str("\n## Dequeue latency against queue size\n\n");
    out.push_str(&format!(
        "The queue is filled with due jobs (CreateJobs in batches of 10,000), then {} non-waiting dequeues are timed one after another from the client: HTTP round trip plus a durable commit.\n\n",
        scale.latency_samples
    ));
    out.push_str("| jobs queued | p50 ms | p95 ms | p99 ms |\n| --- | --- | --- | --- |\n");
    let client = reqwest::Client::new();
    let mut p50s = Vec::new();
    for queued in scale.queued {
        let server = ServerProcess::start();
        fill(&client, &server.url, queued).await;
        let latencies = dequeue_latencies(&client, &server.url, scale.latency_samples).await;
        let (p50, p95, p99) = (
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.95),
            percentile(&latencies, 0.99),
        );
        p50s.push(p50);
        out.push_str(&format!("| {queued} | {p50:.2} | {p95:.2} | {p99:.2} |\n"));
    }
    out.push_str(&format!(
        "\nRatio of p50 at {} jobs to p50 at {} jobs: {:.2}.\n",
        scale.queued[1],
        scale.queued[0],
        p50s[1] / p50s[0]
    ));

    // 3. Idle waiters.
    out.push_str("\n## Idle waiting requests\n\n");
    let server = ServerProcess::start();
    let waiters: Vec<_> = (0..scale.waiters)
        .map(|_| {
            let client = reqwest::Client::new();
            let url = format!("{}/dequeue", server.url);
            tokio::spawn(async move {
                let _ = client
                    .post(url)
                    .json(&json!({"name": "nothing/*", "waitMs": 600_000}))
                    .send()
                    .await;
            })
        })
        .collect();
    let health = format!("{}/healthz", server.url);
    loop {
        let value: Value = client
            .get(&health)
            .send()
            .await
            .expect("health")
            .json()
            .await
            .expect("json");
        if value["waiting"].as_u64() == Some(scale.waiters as u64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = server.cpu_seconds();
    tokio::time::sleep(scale.idle_watch).await;
    let used = server.cpu_seconds() - before;
    out.push_str(&format!(
        "{} dequeue requests held open (waitMs 600000, nothing due) for {:?}: the server used {:.3} CPU seconds ({:.3}% of one core).\n",
        scale.waiters,
        scale.idle_watch,
        used,
        used / scale.idle_watch.as_secs_f64() * 100.0
    ));
    for waiter in waiters {
        waiter.abort();
    }
    out
}
