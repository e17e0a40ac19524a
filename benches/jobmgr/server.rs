//! The job server's measures: create → dequeue → finish cycles per second
//! with durable commits (1 and 16 clients, over HTTP and over the Bedrock
//! port), dequeue latency with 10^3 and 10^6 jobs queued, and the CPU cost
//! of idle waiting requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Scale;
use crate::common::{ServerProcess, percentile, spread};

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
            let client = crate::common::async_client();
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

/// The report's server sections.
pub async fn report(scale: Scale) -> String {
    let mut out = String::new();

    // 1. Throughput.
    out.push_str("## Server throughput: create → dequeue → finish\n\n");
    out.push_str(&format!(
        "Each client loops on its own job name: CreateJob, take it (HTTP: `/dequeue` with a lease; Bedrock: GetJob), FinishJob (HTTP: with the lease token). Three durable commits per cycle, which also write the ledger (the attempt opened and closed, hourly statistics and histograms, the archive). Each client has one persistent connection. {} runs of {:?} each on a fresh server; median (min–max).\n\n",
        scale.repeats, scale.cycle_run
    ));
    out.push_str("| clients | HTTP cycles/s | Bedrock cycles/s |\n| --- | --- | --- |\n");
    for clients in [1, 16] {
        let (mut http, mut bedrock) = (Vec::new(), Vec::new());
        for _ in 0..scale.repeats {
            let server = ServerProcess::start();
            http.push(cycles_per_second(&server.url, clients, scale.cycle_run).await);
            let server = ServerProcess::start();
            bedrock
                .push(bedrock_cycles_per_second(&server.bedrock, clients, scale.cycle_run).await);
        }
        out.push_str(&format!(
            "| {clients} | {} | {} |\n",
            spread(http, 0),
            spread(bedrock, 0)
        ));
    }

    // 2. Dequeue latency against queue size.
    out.push_str("\n## Dequeue latency against queue size\n\n");
    out.push_str(&format!(
        "The queue is filled with due jobs (CreateJobs in batches of 10,000), then {} non-waiting dequeues are timed one after another from the client: HTTP round trip plus a durable commit.\n\n",
        scale.latency_samples
    ));
    out.push_str("| jobs queued | p50 ms | p95 ms | p99 ms |\n| --- | --- | --- | --- |\n");
    let client = crate::common::async_client();
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
    out
}
