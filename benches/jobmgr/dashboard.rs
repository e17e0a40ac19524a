//! The dashboard's server time: `GET /ui` (the overview) and pages of the
//! jobs list, with many jobs stored, timed from a client on the same
//! machine (so each figure is the server's time plus a loopback round
//! trip).

use std::time::Instant;

use serde_json::{Value, json};

use crate::Scale;
use crate::common::{ServerProcess, TOKEN, percentile};
use crate::server::post;

/// Job names the jobs are spread over.
const NAMES: usize = 20;
/// Jobs handed out (so RUNNING) before the measures.
const RUNNING: usize = 100;

/// Fills the server with `count` jobs over [`NAMES`] names, in batches of
/// 10,000, then hands out [`RUNNING`] of them.
async fn fill(client: &reqwest::Client, base: &str, count: usize) {
    let mut made = 0;
    while made < count {
        let n = (count - made).min(10_000);
        let jobs: Vec<Value> = (made..made + n)
            .map(|i| json!({"name": format!("bench/name-{:02}", i % NAMES), "data": {"i": i}}))
            .collect();
        post(
            client,
            &format!("{base}/jobs/batch"),
            &json!({"jobs": jobs}),
        )
        .await;
        made += n;
    }
    post(
        client,
        &format!("{base}/dequeue"),
        &json!({"name": "bench/name-07", "numResults": RUNNING, "leaseMs": 3_600_000}),
    )
    .await;
}

/// A session cookie from the login form.
async fn session(base: &str) -> String {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let answer = client
        .post(format!("{base}/ui/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("login");
    let cookie = answer
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .expect("a session cookie")
        .to_str()
        .expect("text");
    cookie.split(';').next().expect("name=value").to_string()
}

/// Times `samples` GETs of `path` (after one unmeasured); p50 and p95 in ms.
async fn time(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    cookie: &str,
    samples: usize,
) -> (f64, f64) {
    let mut times = Vec::with_capacity(samples);
    for i in 0..=samples {
        let start = Instant::now();
        let response = client
            .get(format!("{base}{path}"))
            .header(reqwest::header::COOKIE, cookie)
            .send()
            .await
            .expect("GET");
        let status = response.status();
        let body = response.text().await.expect("body");
        let elapsed = start.elapsed().as_secs_f64() * 1000.0;
        assert!(status.is_success(), "{path}: {status} {body}");
        if i > 0 {
            times.push(elapsed);
        }
    }
    times.sort_by(f64::total_cmp);
    (percentile(&times, 0.5), percentile(&times, 0.95))
}

/// The section.
pub async fn report(scale: Scale) -> String {
    let jobs = scale.dashboard_jobs;
    let samples = scale.latency_samples.min(50);
    let server = ServerProcess::start();
    let base = server.url.clone();
    let client = crate::common::async_client();
    let filling = Instant::now();
    fill(&client, &base, jobs).await;
    let fill_secs = filling.elapsed().as_secs_f64();
    let cookie = session(&base).await;
    let plain = reqwest::Client::new();
    let middle = format!("/ui/jobs?after={}", jobs / 2);
    let pages = [
        ("/ui", "overview"),
        (
            "/ui?live=1",
            "overview, live part (what the page polls every 2 s)",
        ),
        ("/ui/jobs", "jobs, first page"),
        (middle.as_str(), "jobs, a page in the middle"),
        ("/ui/jobs?name=bench/name-07", "jobs named by a GLOB"),
        (
            "/ui/jobs?name=bench/name-0*&state=RUNNING",
            "jobs by GLOB and state (RUNNING)",
        ),
        (
            "/ui/jobs?name=bench/name-0*&state=QUEUED",
            "jobs by GLOB and state (QUEUED)",
        ),
        (
            "/ui/jobs?name=nobody*&state=QUEUED",
            "jobs by a GLOB none matches and a state",
        ),
        (
            "/ui/jobs?state=FAILED",
            "jobs in a state none is in (FAILED)",
        ),
        ("/ui/running", "running now"),
        ("/ui/stats", "statistics"),
    ];
    let mut rows = String::new();
    for (path, what) in pages {
        let (p50, p95) = time(&plain, &base, path, &cookie, samples).await;
        rows.push_str(&format!("| {what} | `{path}` | {p50:.1} | {p95:.1} |\n"));
    }
    let mut out = String::from("## Dashboard pages with many jobs stored\n\n");
    out.push_str(&format!(
        "A fresh server on a fresh SQLite file holds {jobs} jobs over {NAMES} names (created by CreateJobs in batches of 10,000, {fill_secs:.0} s), {RUNNING} of them handed out (RUNNING). Each page is then requested {samples} times one after another (after one unmeasured request) with a session cookie, from a client on the same machine: the figures are the server's time to read and render the page plus a loopback round trip. The goal is under 100 ms each.\n\n"
    ));
    out.push_str("| page | URL | p50 ms | p95 ms |\n| --- | --- | --- | --- |\n");
    out.push_str(&rows);
    out.push_str("\nThe overview's counts per name and state are a count made in the background (README, \"Dashboard\"): these figures are the page's time, not the count's (about 0.6 s of one core with 10^6 jobs, made again at most once per ten times that). The jobs list is the API's listing query (`GET /jobs` takes the same time): an exact name reads its part of the name index; a state reads its part of the state index (state, id) in id order until the page is full, checking the name on each job. A GLOB with a wildcard after a literal prefix: alone, it reads the prefix's range of the name index and sorts it by id, so it costs in proportion to the jobs the prefix matches; with a state, the jobs in the prefix's range are counted first on the name index up to 10,000: a prefix that many share (here 500,000) reads the state's index in id order instead, one fewer (or none) keeps the sorted range. What a state with many jobs costs when few of them match a wide prefix is the state's jobs read before the page fills.\n");
    out
}
