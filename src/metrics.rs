//! Prometheus metrics, served on an opt-in address (`--metrics ADDR`). The
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
/// series; returns the address it listens on. Beyond loopback it is readable
/// by anyone who can connect.
pub async fn install(addr: SocketAddr) -> Result<SocketAddr, MetricsError> {
    let error = |message: String| MetricsError {
        addr: addr.to_string(),
        message,
    };
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
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
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
        "jobmgr_dispatch_latency_seconds",
        "From a job being due to its worker starting"
    );
    describe_gauge!("jobmgr_workers_running", "Workers running now");
    describe_gauge!(
        "jobmgr_gate_state",
        "1 for the gate's current state (open, load, memory, full, ramp, unreadable)"
    );
    describe_gauge!(
        "jobmgr_load1",
        "The 1-minute load average the gate last read"
    );
    describe_gauge!(
        "jobmgr_memory_available_bytes",
        "Available memory the gate last read"
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
    describe_gauge!(
        "jobmgr_server_waiters",
        "Job server: GetJob requests waiting"
    );
    describe_gauge!("jobmgr_server_jobs", "Job server: jobs by state");
    describe_histogram!(
        "jobmgr_server_commit_seconds",
        "Job server: duration of a durable commit of a group of writes"
    );
}

/// The gate states, for `jobmgr_gate_state`.
const GATE_STATES: [&str; 6] = ["open", "load", "memory", "full", "ramp", "unreadable"];

/// Records the gate's state and the machine's last reading.
pub fn gate(state: &'static str, load1: Option<f64>, available: Option<u64>) {
    for candidate in GATE_STATES {
        gauge!("jobmgr_gate_state", "state" => candidate).set(if candidate == state {
            1.0
        } else {
            0.0
        });
    }
    if let Some(load1) = load1 {
        gauge!("jobmgr_load1").set(load1);
    }
    if let Some(available) = available {
        gauge!("jobmgr_memory_available_bytes").set(available as f64);
    }
}

/// Records how many workers run.
pub fn workers_running(count: usize) {
    gauge!("jobmgr_workers_running").set(count as f64);
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

/// Records a truncated output stream.
pub fn output_truncated() {
    counter!("jobmgr_output_truncations_total").increment(1);
}

/// Records a SIGKILL after SIGTERM.
pub fn kill_escalated() {
    counter!("jobmgr_kill_escalations_total").increment(1);
}

/// Records a lease renewal: `ok`, `lost` or `failed`.
pub fn lease_renewal(result: &'static str) {
    counter!("jobmgr_lease_renewals_total", "result" => result).increment(1);
}

/// Records the job server's waiters and jobs by state.
pub fn server_queue(waiters: usize, by_state: &[(&'static str, u64)]) {
    gauge!("jobmgr_server_waiters").set(waiters as f64);
    for (state, count) in by_state {
        gauge!("jobmgr_server_jobs", "state" => *state).set(*count as f64);
    }
}

/// Records a commit's duration.
pub fn commit(seconds: f64) {
    histogram!("jobmgr_server_commit_seconds").record(seconds);
}
