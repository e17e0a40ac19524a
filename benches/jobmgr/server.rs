//! The job server's measures: create → dequeue → finish cycles per second
//! with durable commits (1 and 16 clients, over HTTP and over the Bedrock
//! port), dequeue latency with 10^3 and 10^6 jobs queued, and the CPU cost
//! of idle waiting requests. The HTTP throughput and the dequeue latency
//! take the store (and the number of servers sharing it): the PostgreSQL
//! sections (`postgres.rs`) run them on PostgreSQL, beside these SQLite
//! figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Scale;
use crate::common::{ServerProcess, Servers, Store, percentile, spread};

pub(crate) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Value {
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

/// Cycles per second with `clients` concurrent clients, client `i` on
/// server `bases[i % bases.len()]`, each with a job name of its own.
pub(crate) async fn cycles_per_second(bases: &[String], clients: usize, run: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop = start + run;
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let client = crate::common::async_client();
            tokio::spawn(cycle_client(
                client,
                bases[i % bases.len()].clone(),
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

/// One HTTP throughput run's figures.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    pub cycles_per_second: f64,
    /// CPU of the `jobmgr server`s (all of them) per cycle, in ms.
    pub server_cpu_ms: f64,
    /// CPU of the PostgreSQL backends serving them per cycle, in ms (0 on
    /// SQLite).
    pub database_cpu_ms: f64,
}

/// HTTP create → dequeue → finish cycles per second on `servers` fresh
/// servers sharing one fresh `store`, with `clients_per_server` clients on
/// each (client `i` on server `i % servers`).
pub async fn throughput(
    store: Store,
    servers: usize,
    clients_per_server: usize,
    run: Duration,
) -> Throughput {
    let up = Servers::start(store, servers);
    let (server_cpu, database_cpu) = (up.servers_cpu_seconds(), up.database_cpu_seconds());
    let started = Instant::now();
    let rate = cycles_per_second(&up.urls(), clients_per_server * servers, run).await;
    let cycles = rate * started.elapsed().as_secs_f64();
    Throughput {
        cycles_per_second: rate,
        server_cpu_ms: (up.servers_cpu_seconds() - server_cpu) * 1e3 / cycles,
        database_cpu_ms: (up.database_cpu_seconds() - database_cpu) * 1e3 / cycles,
    }
}

/// One Bedrock exchange on a persistent connection: sends `request`, reads
/// the status line, headers and `Content-Length` body; returns (status
/// line, body).
async fn bedrock_exchange(
    stream: &mut tokio::io::BufStream<tokio::net::TcpStream>,
    request: &str,
) -> (String, String) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let token = format!("\r\nToken: {}\r\n", crate::common::TOKEN);
    let request = request.replacen("\r\n", &token, 1);
    stream.write_all(request.as_bytes()).await.expect("send");
    stream.flush().await.expect("flush");
    let mut status = String::new();
    stream.read_line(&mut status).await.expect("status line");
    let mut length = 0;
    loop {
        let mut header = String::new();
        stream.read_line(&mut header).await.expect("header");
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.expect("body");
    (
        status.trim_end().to_string(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// One Bedrock client's loop: CreateJob, GetJob, FinishJob, until `stop`.
async fn bedrock_cycle_client(addr: String, name: String, stop: Instant, done: Arc<AtomicU64>) {
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut stream = tokio::io::BufStream::new(stream);
    let create = format!("CreateJob\r\nname: {name}\r\ndata: {{\"n\":1}}\r\n\r\n");
    let get = format!("GetJob\r\nname: {name}\r\n\r\n");
    while Instant::now() < stop {
        let (status, _) = bedrock_exchange(&mut stream, &create).await;
        assert!(status.starts_with("200"), "CreateJob: {status}");
        let (status, body) = bedrock_exchange(&mut stream, &get).await;
        assert!(status.starts_with("200"), "GetJob: {status}");
        let job: Value = serde_json::from_str(&body).expect("job json");
        let id = job["jobID"].as_i64().expect("jobID");
        let (status, _) =
            bedrock_exchange(&mut stream, &format!("FinishJob\r\njobID: {id}\r\n\r\n")).await;
        assert!(status.starts_with("200"), "FinishJob: {status}");
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bedrock cycles per second with `clients` concurrent connections.
async fn bedrock_cycles_per_second(addr: &str, clients: usize, run: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop = start + run;
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            tokio::spawn(bedrock_cycle_client(
                addr.to_string(),
                format!("bench/b{i}"),
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

/// Dequeue latency at one queue size.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    pub queued: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    /// Jobs created per second while the queue was filled.
    pub fill_rate: f64,
    /// PostgreSQL only: entries of the `jobs` table and its indexes read
    /// per dequeue (the planner's choices show here).
    pub rows_read: Option<f64>,
    /// PostgreSQL only: the first dequeues, before `ANALYZE`.
    pub before_analyze: Option<BeforeAnalyze>,
}

/// Dequeues timed on a PostgreSQL queue just filled, before `ANALYZE`.
#[derive(Clone, Copy, Debug)]
pub struct BeforeAnalyze {
    pub samples: usize,
    pub p50: f64,
    pub max: f64,
    pub rows_read: f64,
}

/// `jobs` rows and index entries read so far on `database` (sequential
/// scans' rows, index scans' entries), once the server's writer has
/// reported them: PostgreSQL sends a backend's counts at the end of a
/// transaction at most once a second, so this waits a second and has the
/// server commit one more dequeue (on `base`, untimed) first.
pub(crate) async fn jobs_rows_read(
    client: &reqwest::Client,
    base: &str,
    database: &crate::common::PgDatabase,
) -> f64 {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    post(
        client,
        &format!("{base}/dequeue"),
        &json!({"name": "bench/*", "leaseMs": 3_600_000}),
    )
    .await;
    let read = database.query_text(
        "SELECT (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relname = 'jobs') \
         + (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables WHERE relname = 'jobs')",
    );
    read.parse().unwrap_or(f64::NAN)
}

/// Dequeue latency with `queued` jobs queued on a fresh server on a fresh
/// `store`. On PostgreSQL, `before_analyze` dequeues are timed first on
/// the table as filled (never analyzed), then it is analyzed and the
/// `samples` are timed with `queued` jobs left; the queue is filled with
/// the extra jobs these need.
pub async fn latency(
    store: Store,
    queued: usize,
    samples: usize,
    before_analyze: usize,
) -> Latency {
    let client = crate::common::async_client();
    let up = Servers::start(store, 1);
    let base = &up.servers[0].url;
    let database = up.database.as_ref();
    // On PostgreSQL: the dequeues before ANALYZE, and two that flush counts.
    let extra = if database.is_some() {
        before_analyze + 2
    } else {
        0
    };
    let filling = Instant::now();
    fill(&client, base, queued + extra).await;
    let fill_rate = (queued + extra) as f64 / filling.elapsed().as_secs_f64();
    let mut rows_read = None;
    let mut first = None;
    if let Some(database) = database {
        let start = jobs_rows_read(&client, base, database).await;
        let latencies = dequeue_latencies(&client, base, before_analyze).await;
        let analyzed_at = jobs_rows_read(&client, base, database).await;
        first = Some(BeforeAnalyze {
            samples: latencies.len(),
            p50: percentile(&latencies, 0.5),
            max: latencies[latencies.len() - 1],
            rows_read: (analyzed_at - start) / (before_analyze + 1) as f64,
        });
        database.execute("ANALYZE");
        rows_read = Some(analyzed_at);
    }
    let latencies = dequeue_latencies(&client, base, samples).await;
    if let (Some(database), Some(analyzed_at)) = (database, rows_read) {
        let end = jobs_rows_read(&client, base, database).await;
        rows_read = Some((end - analyzed_at) / (samples + 1) as f64);
    }
    Latency {
        queued,
        p50: percentile(&latencies, 0.5),
        p95: percentile(&latencies, 0.95),
        p99: percentile(&latencies, 0.99),
        fill_rate,
        rows_read,
        before_analyze: first,
    }
}

/// The SQLite figures the PostgreSQL sections compare against: HTTP
/// throughput runs with 1 and 16 clients, and dequeue latency at each
/// queue size.
#[derive(Clone, Debug, Default)]
pub struct SqliteFigures {
    /// `(clients, runs)`.
    pub throughput: Vec<(usize, Vec<Throughput>)>,
    pub latency: Vec<Latency>,
}

/// The server sections' clients counts.
pub const CLIENTS: [usize; 2] = [1, 16];

/// Measures [`SqliteFigures`] alone (for `JOBMGR_BENCH_ONLY=postgres`; the
/// full run takes them from [`report`]).
pub async fn sqlite_figures(scale: Scale) -> SqliteFigures {
    let mut figures = SqliteFigures::default();
    for clients in CLIENTS {
        let mut runs = Vec::new();
        for _ in 0..scale.repeats {
            runs.push(throughput(Store::Sqlite, 1, clients, scale.cycle_run).await);
        }
        figures.throughput.push((clients, runs));
    }
    for queued in scale.queued {
        figures
            .latency
            .push(latency(Store::Sqlite, queued, scale.latency_samples, 0).await);
    }
    figures
}

/// The report's server sections, and the SQLite figures measured for them.
pub async fn report(scale: Scale) -> (String, SqliteFigures) {
    let mut out = String::new();
    let mut figures = SqliteFigures::default();

    // 1. Throughput.
    out.push_str("## Server throughput: create → dequeue → finish\n\n");
    out.push_str(&format!(
        "Each client loops on its own job name: CreateJob, take it (HTTP: `/dequeue` with a lease; Bedrock: GetJob), FinishJob (HTTP: with the lease token). Three durable commits per cycle, which also write the ledger (the attempt opened and closed, hourly statistics and histograms, the archive). Each client has one persistent connection. {} runs of {:?} each on a fresh server; median (min–max).\n\n",
        scale.repeats, scale.cycle_run
    ));
    out.push_str("| clients | HTTP cycles/s | Bedrock cycles/s |\n| --- | --- | --- |\n");
    for clients in CLIENTS {
        let (mut http, mut bedrock) = (Vec::new(), Vec::new());
        for _ in 0..scale.repeats {
            http.push(throughput(Store::Sqlite, 1, clients, scale.cycle_run).await);
            let server = ServerProcess::start();
            bedrock
                .push(bedrock_cycles_per_second(&server.bedrock, clients, scale.cycle_run).await);
        }
        out.push_str(&format!(
            "| {clients} | {} | {} |\n",
            spread(http.iter().map(|t| t.cycles_per_second).collect(), 0),
            spread(bedrock, 0)
        ));
        figures.throughput.push((clients, http));
    }

    // 2. Dequeue latency against queue size.
    out.push_str("\n## Dequeue latency against queue size\n\n");
    out.push_str(&format!(
        "The queue is filled with due jobs (CreateJobs in batches of 10,000), then {} non-waiting dequeues are timed one after another from the client: HTTP round trip plus a durable commit.\n\n",
        scale.latency_samples
    ));
    out.push_str("| jobs queued | p50 ms | p95 ms | p99 ms |\n| --- | --- | --- | --- |\n");
    let client = crate::common::async_client();
    for queued in scale.queued {
        let row = latency(Store::Sqlite, queued, scale.latency_samples, 0).await;
        out.push_str(&format!(
            "| {queued} | {:.2} | {:.2} | {:.2} |\n",
            row.p50, row.p95, row.p99
        ));
        figures.latency.push(row);
    }
    out.push_str(&format!(
        "\nRatio of p50 at {} jobs to p50 at {} jobs: {:.2}.\n",
        scale.queued[1],
        scale.queued[0],
        figures.latency[1].p50 / figures.latency[0].p50
    ));

    // 3. Idle waiters.
    out.push_str("\n## Idle waiting requests\n\n");
    // All waiters come from 127.0.0.1: lift the per-address cap (128).
    let server = ServerProcess::start_with(&[
        "--http-max-connections",
        "4096",
        "--http-max-connections-per-peer",
        "4096",
    ]);
    let waiters: Vec<_> = (0..scale.waiters)
        .map(|_| {
            let client = crate::common::async_client();
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
    (out, figures)
}
