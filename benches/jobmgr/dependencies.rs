//! Dequeue latency with many jobs waiting on dependencies (DEPENDS),
//! against the same queue without them, on each store: waiting jobs must
//! cost a claim nothing (claims read only QUEUED and RUNQUEUED jobs, through
//! an index that holds no other).

use std::time::Instant;

use serde_json::{Value, json};

use crate::Scale;
use crate::common::{Servers, Store, percentile};
use crate::server::{jobs_rows_read, post};

/// Due jobs each measure dequeues from (beside the waiting ones).
const DUE: usize = 1_000;

/// One measure: a queue of due jobs, with or without waiting ones.
struct Row {
    store: Store,
    waiting: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    rows_read: Option<f64>,
}

/// Creates `count` jobs named `name`, each depending on `depends`, in
/// batches of 10,000.
async fn fill(client: &reqwest::Client, base: &str, name: &str, count: usize, depends: &[i64]) {
    let mut left = count;
    while left > 0 {
        let n = left.min(10_000);
        let jobs: Vec<Value> = (0..n)
            .map(|i| json!({"name": name, "data": {"i": i}, "depends": depends}))
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

/// Dequeue latency on a fresh server on a fresh `store`, with `waiting`
/// jobs waiting for one job that never runs (its name is outside the
/// dequeue's GLOB) beside [`DUE`] due ones; on PostgreSQL, analyzed first.
async fn measure(store: Store, waiting: usize, samples: usize) -> Row {
    let client = crate::common::async_client();
    let up = Servers::start(store, 1);
    let base = &up.servers[0].url;
    if waiting > 0 {
        let blocker = post(
            &client,
            &format!("{base}/jobs"),
            &json!({"name": "blocker/never"}),
        )
        .await["jobID"]
            .as_i64()
            .expect("jobID");
        fill(&client, base, "bench/waiting", waiting, &[blocker]).await;
    }
    fill(&client, base, "bench/due", DUE.max(samples + 4), &[]).await;
    let mut rows_read = None;
    if let Some(database) = up.database.as_ref() {
        database.execute("ANALYZE");
        rows_read = Some(jobs_rows_read(&client, base, database).await);
    }
    let body = json!({"name": "bench/*", "leaseMs": 3_600_000});
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let got = post(&client, &format!("{base}/dequeue"), &body).await;
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
        let jobs = got["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), 1, "a job was due");
        assert_eq!(jobs[0]["name"], "bench/due", "a waiting job was handed out");
    }
    latencies.sort_by(f64::total_cmp);
    if let (Some(database), Some(before)) = (up.database.as_ref(), rows_read) {
        let after = jobs_rows_read(&client, base, database).await;
        rows_read = Some((after - before) / (samples + 1) as f64);
    }
    Row {
        store,
        waiting,
        p50: percentile(&latencies, 0.5),
        p95: percentile(&latencies, 0.95),
        p99: percentile(&latencies, 0.99),
        rows_read,
    }
}

/// The section: each store, without and with `scale.dependency_waiting`
/// waiting jobs.
pub async fn report(scale: Scale) -> String {
    let mut rows = Vec::new();
    for store in [Store::Sqlite, Store::Postgres] {
        for waiting in [0, scale.dependency_waiting] {
            rows.push(measure(store, waiting, scale.latency_samples).await);
        }
    }
    let mut out = String::from("## Dequeue latency with jobs waiting on dependencies\n\n");
    out.push_str(&format!(
        "A fresh server on a fresh store holds {DUE} due jobs (`bench/due`) and either nothing else or {} jobs (`bench/waiting`, created by CreateJobs in batches of 10,000) that each depend on one job that is never handed out (its name is outside the dequeue's GLOB), so they stay DEPENDS throughout. Then {} non-waiting dequeues of `bench/*` (a lease each) are timed one after another from the client: HTTP round trip plus a durable commit; each must hand out a due job. PostgreSQL tables are analyzed before the dequeues; rows read is what PostgreSQL's statistics count per dequeue on the `jobs` table (index entries returned plus sequential-scan rows): a claim that stepped over waiting jobs would show here.\n\n",
        scale.dependency_waiting, scale.latency_samples
    ));
    out.push_str("| store | jobs waiting on dependencies | p50 ms | p95 ms | p99 ms | rows read per dequeue |\n| --- | --- | --- | --- | --- | --- |\n");
    for row in &rows {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {} |\n",
            match row.store {
                Store::Sqlite => "SQLite",
                Store::Postgres => "PostgreSQL",
            },
            row.waiting,
            row.p50,
            row.p95,
            row.p99,
            row.rows_read.map_or("–".into(), |r| format!("{r:.1}"))
        ));
    }
    out.push('\n');
    for pair in rows.chunks(2) {
        let [none, some] = pair else { continue };
        out.push_str(&format!(
            "{}: p50 with {} jobs waiting over p50 with none: {:.2}.\n",
            match none.store {
                Store::Sqlite => "SQLite",
                Store::Postgres => "PostgreSQL",
            },
            some.waiting,
            some.p50 / none.p50
        ));
    }
    out.push_str("\nOn PostgreSQL, the 1000 due jobs alone make a table small enough for the planner to read whole (as at 1000 jobs in \"Dequeue latency against queue size\"), which is why the row without waiting jobs is the slower one; with the waiting jobs the table is big enough for the claim to use the partial index of ready jobs, which holds no DEPENDS job: 5 rows read per dequeue, however many wait.\n");
    out
}
