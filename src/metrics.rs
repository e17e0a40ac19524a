//! Prometheus metrics, served on an opt-in address (`--metrics ADDR`) behind
//! the same bearer token as the API (job names are in the series). The
//! names are defined here, in one place, with their help texts; the rest of
//! the code records through the small functions below.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use thiserror::Error;

/// Why the metrics endpoint could not start.
#[derive(Debug, Error)]
#[error("cannot serve metrics on {addr}: {message}; pick another --metrics address")]
pub struct MetricsError {
    addr: String,
    message: String,
}

/// Serves `GET /metrics` on `addr` (port 0 picks one) and describes every
/// series; returns the address it listens on. With a `token`, a scrape must
/// carry `Authorization: Bearer <token>` (else `401`). Without one (a
/// supervisor of a server that has no token, such as a real Bedrock), only
/// a loopback address is accepted.
pub async fn install(
    addr: SocketAddr,
    token: Option<crate::auth::ApiToken>,
) -> Result<SocketAddr, MetricsError> {
    let error = |message: String| MetricsError {
        addr: addr.to_string(),
        message,
    };
    if token.is_none() {
        if !addr.ip().is_loopback() {
            return Err(error(
                "there is no token to protect it beyond loopback; give this process a token \
                 (--token-file PATH or JOBMGR_TOKEN), or listen on 127.0.0.1"
                    .into(),
            ));
        }
        tracing::warn!(
            %addr,
            "serving metrics without a token: any local user can read them, job names included"
        );
    }
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0, 300.0, 1800.0,
        ])
        .map_err(|e| error(e.to_string()))?
        .install_recorder()
        .map_err(|e| error(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| error(e.to_string()))?;
    let local = listener.local_addr().map_err(|e| error(e.to_string()))?;
    describe();
    INSTALLED.store(true, Ordering::SeqCst);
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let handle = handle.clone();
            let token = token.clone();
            async move {
                use axum::response::IntoResponse;
                if let Some(token) = &token
                    && !crate::server::http::bearer_matches(&headers, token)
                {
                    return crate::server::http::unauthorized().into_response();
                }
                collect().await;
                handle.render().into_response()
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics endpoint stopped");
        }
    });
    tracing::info!(addr = %local, "serving metrics at /metrics");
    Ok(local)
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Brings gauges up to date just before a scrape renders them.
pub type Collector = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
>;

static COLLECTORS: std::sync::Mutex<Vec<Collector>> = std::sync::Mutex::new(Vec::new());

/// How long a scrape waits for a collector before rendering what it has.
const COLLECT_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `collector` before every scrape (the job server counts its queue
/// this way, so that gauges are never staler than the scrape).
pub fn collect_on_scrape(collector: Collector) {
    COLLECTORS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(collector);
}

async fn collect() {
    let collectors: Vec<Collector> = COLLECTORS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for collector in collectors {
        if tokio::time::timeout(COLLECT_LIMIT, collector())
            .await
            .is_err()
        {
            tracing::warn!("a metrics collector took over 2 s; serving its last values");
        }
    }
}

/// Whether a metrics endpoint is being served.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::SeqCst)
}

fn describe() {
    describe_counter!("jobmgr_jobs_started_total", "Workers started, by worker");
    describe_counter!(
        "jobmgr_jobs_finished_total",
        "Jobs reported finished, by worker"
    );
    describe_counter!(
        "jobmgr_jobs_retried_total",
        "Jobs reported for a retry, by worker"
    );
    describe_counter!(
        "jobmgr_jobs_failed_total",
        "Jobs reported failed, by worker"
    );
    describe_counter!(
        "jobmgr_jobs_timed_out_total",
        "Workers stopped by their timeout, by worker"
    );
    describe_histogram!("jobmgr_job_run_seconds", "Worker run time, by worker");
    describe_histogram!(
        "jobmgr_job_starved_seconds",
        "Time each job had a process ready to run but waiting for a CPU (the site or other jobs had it), by worker; its _sum is the capacity the site kept"
    );
    describe_histogram!(
        "jobmgr_dispatch_latency_seconds",
        "From a job being due to its worker starting"
    );
    describe_gauge!("jobmgr_workers_running", "Workers running now");
    describe_gauge!(
        "jobmgr_jobs_held",
        "Jobs fetched ahead (--fetch-ahead) and held for the next free worker slot"
    );
    describe_counter!(
        "jobmgr_jobs_handed_back_total",
        "Jobs held ahead that went back to the queue unstarted, by reason (hold_expired, gate_closed, draining)"
    );
    describe_gauge!(
        "jobmgr_gate_state",
        "1 for the gate's current state (open, load, pressure, site_pressure, memory, full, ramp, unreadable)"
    );
    describe_gauge!(
        "jobmgr_load1",
        "The 1-minute load average the gate last read"
    );
    describe_gauge!(
        "jobmgr_memory_available_bytes",
        "Available memory the gate last read"
    );
    describe_gauge!(
        "jobmgr_site_pressure",
        "The pressure the back-off follows (PSI avg10 of the site's cgroups, or the system's full avg10 of memory and I/O), percent"
    );
    describe_gauge!("jobmgr_jobs_frozen", "Jobs frozen by the back-off now");
    describe_counter!(
        "jobmgr_job_frozen_seconds_total",
        "Time jobs spent frozen by the back-off, summed over jobs, in seconds"
    );
    describe_counter!(
        "jobmgr_jobs_thawed_overdue_total",
        "Jobs thawed because they were frozen for max-freeze while the site stayed pressed"
    );
    describe_counter!(
        "jobmgr_output_truncations_total",
        "Worker output streams cut to the output cap"
    );
    describe_counter!(
        "jobmgr_kill_escalations_total",
        "Workers that ignored SIGTERM and got SIGKILL"
    );
    describe_counter!(
        "jobmgr_lease_renewals_total",
        "Lease renewals, by result (ok, lost, failed)"
    );
    describe_counter!(
        "jobmgr_reports_sent_total",
        "Reports of ended jobs answered by the server, by the way they went (fetch: with a fetch; batch: with other reports; alone)"
    );
    describe_gauge!(
        "jobmgr_server_waiters",
        "Job server: GetJob requests waiting"
    );
    describe_gauge!("jobmgr_server_jobs", "Job server: jobs by state");
    describe_counter!(
        "jobmgr_server_requests_total",
        "Job server: requests, by API, method (or Bedrock command) and route"
    );
    describe_gauge!(
        "jobmgr_server_jobs_by_name",
        "Job server: jobs by name and state (the 200 most numerous names; the rest as _other)"
    );
    describe_histogram!(
        "jobmgr_server_commit_seconds",
        "Job server: duration of a durable commit of a group of writes"
    );
    describe_counter!(
        "jobmgr_server_store_statements_total",
        "Job server on PostgreSQL: statements sent to the database, each a round trip (a transaction's or savepoint's statements sent together count once)"
    );
}

/// The gate states, for `jobmgr_gate_state`.
const GATE_STATES: [&str; 8] = [
    "open",
    "load",
    "pressure",
    "site_pressure",
    "memory",
    "full",
    "ramp",
    "unreadable",
];

/// Records a pool's gate state and the machine's last reading.
///
/// The readings are set before the state they explain, so that a scrape
/// that sees the new state mostly sees its reading too (a scrape is not
/// atomic across gauges).
pub fn gate(pool: &str, state: &'static str, load1: Option<f64>, available: Option<u64>) {
    if let Some(load1) = load1 {
        gauge!("jobmgr_load1").set(load1);
    }
    if let Some(available) = available {
        gauge!("jobmgr_memory_available_bytes").set(available as f64);
    }
    for candidate in GATE_STATES {
        gauge!("jobmgr_gate_state", "pool" => pool.to_string(), "state" => candidate)
            .set(if candidate == state { 1.0 } else { 0.0 });
    }
}

/// Records the back-off's last reading (percent; none while off or
/// unreadable), the jobs it holds frozen now, and the time jobs spent
/// frozen in all (milliseconds, shown in whole seconds).
pub fn backoff(pressure: Option<f64>, frozen: usize, frozen_ms: u64) {
    if let Some(pressure) = pressure {
        gauge!("jobmgr_site_pressure").set(pressure);
    }
    gauge!("jobmgr_jobs_frozen").set(frozen as f64);
    counter!("jobmgr_job_frozen_seconds_total").absolute(frozen_ms / 1000);
}

/// Counts a job thawed because it was frozen for max-freeze.
pub fn thawed_overdue() {
    counter!("jobmgr_jobs_thawed_overdue_total").increment(1);
}

/// A count of a pool's jobs in one state, as a gauge: the workers it runs
/// (`jobmgr_workers_running`) or the jobs it holds ahead
/// (`jobmgr_jobs_held`); each job holds a [`Counted`] while in the state.
#[derive(Debug, Clone)]
pub struct PoolGauge {
    name: &'static str,
    pool: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// One job counted in a [`PoolGauge`]; dropping it counts the job out.
#[derive(Debug)]
pub struct Counted(PoolGauge);

impl PoolGauge {
    /// The running workers' gauge of `pool`, at 0.
    pub fn workers_running(pool: &str) -> Self {
        Self::new("jobmgr_workers_running", pool)
    }

    /// The held jobs' gauge of `pool`, at 0.
    pub fn jobs_held(pool: &str) -> Self {
        Self::new("jobmgr_jobs_held", pool)
    }

    fn new(name: &'static str, pool: &str) -> Self {
        let gauge = PoolGauge {
            name,
            pool: pool.to_string(),
            count: Default::default(),
        };
        gauge.publish();
        gauge
    }

    /// Counts a job in until the returned guard is dropped.
    pub fn enter(&self) -> Counted {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.publish();
        Counted(self.clone())
    }

    fn publish(&self) {
        gauge!(self.name, "pool" => self.pool.clone())
            .set(self.count.load(Ordering::SeqCst) as f64);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.publish();
    }
}

/// Records a job held ahead that went back to the queue unstarted, and
/// why: `hold_expired`, `gate_closed` or `draining`.
pub fn held_job_handed_back(pool: &str, reason: &'static str) {
    counter!("jobmgr_jobs_handed_back_total", "pool" => pool.to_string(), "reason" => reason)
        .increment(1);
}

/// Records a worker start and how long after its due time it came.
pub fn job_started(worker: &str, dispatch_latency: Option<f64>) {
    counter!("jobmgr_jobs_started_total", "worker" => worker.to_string()).increment(1);
    if let Some(latency) = dispatch_latency {
        histogram!("jobmgr_dispatch_latency_seconds").record(latency);
    }
}

/// Records a job's outcome (`finish`, `retry`, `fail`, or `lease_lost`)
/// and whether it timed out.
pub fn job_ended(worker: &str, outcome: &str, run_seconds: f64, timed_out: bool) {
    let name = match outcome {
        "finish" => "jobmgr_jobs_finished_total",
        "retry" => "jobmgr_jobs_retried_total",
        "fail" => "jobmgr_jobs_failed_total",
        _ => "jobmgr_jobs_lease_lost_total",
    };
    counter!(name, "worker" => worker.to_string()).increment(1);
    histogram!("jobmgr_job_run_seconds", "worker" => worker.to_string()).record(run_seconds);
    if timed_out {
        counter!("jobmgr_jobs_timed_out_total", "worker" => worker.to_string()).increment(1);
    }
}

/// Records the time a job waited for a CPU (the site, or other jobs, had
/// it).
pub fn job_starved(worker: &str, seconds: f64) {
    histogram!("jobmgr_job_starved_seconds", "worker" => worker.to_string()).record(seconds);
}

/// Records a truncated output stream.
pub fn output_truncated() {
    counter!("jobmgr_output_truncations_total").increment(1);
}

/// Records a SIGKILL after SIGTERM.
pub fn kill_escalated() {
    counter!("jobmgr_kill_escalations_total").increment(1);
}

/// Records a report the server answered, and the way it went: `fetch`
/// (riding on a fetch), `batch` (with other reports) or `alone`.
pub fn report_sent(way: &'static str) {
    counter!("jobmgr_reports_sent_total", "way" => way).increment(1);
}

/// Records a lease renewal: `ok`, `lost` or `failed`.
pub fn lease_renewal(result: &'static str) {
    counter!("jobmgr_lease_renewals_total", "result" => result).increment(1);
}

/// The most job names `jobmgr_server_jobs_by_name` carries; the rest are
/// summed under the name [`OTHER_NAMES`], so that a server with millions of
/// distinct names does not flood its scrapers.
pub const MAX_NAME_SERIES: usize = 200;

/// The name label of the names beyond [`MAX_NAME_SERIES`].
pub const OTHER_NAMES: &str = "_other";

/// The job server's queue gauges, remembering which (name, state) series it
/// set so that a name that empties goes to 0 instead of keeping its last
/// value.
#[derive(Debug, Default)]
pub struct QueueGauges {
    reported: std::collections::HashSet<(String, &'static str)>,
}

impl QueueGauges {
    /// Records the waiters, and the jobs by state and by (name, state),
    /// from `counts` (name, state, jobs).
    pub fn report(&mut self, waiters: usize, counts: &[(String, crate::protocol::JobState, u64)]) {
        use std::collections::HashMap;
        gauge!("jobmgr_server_waiters").set(waiters as f64);
        for state in crate::protocol::JobState::ALL {
            let total: u64 = counts
                .iter()
                .filter(|(_, s, _)| *s == state)
                .map(|(_, _, n)| n)
                .sum();
            gauge!("jobmgr_server_jobs", "state" => state.as_str()).set(total as f64);
        }
        let mut by_name: HashMap<&str, u64> = HashMap::new();
        for (name, _, n) in counts {
            *by_name.entry(name.as_str()).or_default() += n;
        }
        let mut names: Vec<(&str, u64)> = by_name.into_iter().collect();
        names.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let kept: std::collections::HashSet<&str> = names
            .iter()
            .take(MAX_NAME_SERIES)
            .map(|(name, _)| *name)
            .collect();
        let mut series: HashMap<(String, &'static str), u64> = HashMap::new();
        for (name, state, n) in counts {
            let label = if kept.contains(name.as_str()) {
                name.as_str()
            } else {
                OTHER_NAMES
            };
            *series
                .entry((label.to_string(), state.as_str()))
                .or_default() += n;
        }
        for gone in self
            .reported
            .iter()
            .filter(|key| !series.contains_key(*key))
        {
            gauge!("jobmgr_server_jobs_by_name", "name" => gone.0.clone(), "state" => gone.1)
                .set(0.0);
        }
        for ((name, state), n) in &series {
            gauge!("jobmgr_server_jobs_by_name", "name" => name.clone(), "state" => *state)
                .set(*n as f64);
        }
        self.reported = series.into_keys().collect();
    }
}

/// Records a request to the job server: `api` is `http` or `bedrock`,
/// `method` the HTTP method or the Bedrock command, `route` the matched
/// route (empty for Bedrock).
pub fn server_request(api: &'static str, method: &str, route: &str) {
    counter!(
        "jobmgr_server_requests_total",
        "api" => api,
        "method" => method.to_string(),
        "route" => route.to_string()
    )
    .increment(1);
}

/// Records a commit's duration.
pub fn commit(seconds: f64) {
    histogram!("jobmgr_server_commit_seconds").record(seconds);
}

/// Counts a round trip to the PostgreSQL store.
pub fn store_statement() {
    counter!("jobmgr_server_store_statements_total").increment(1);
}
