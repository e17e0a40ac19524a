//! jobmgr's benchmarks, measured against the machine's own limits: the job
//! server (throughput over HTTP and the Bedrock port, dequeue latency
//! against queue size, idle waiters) and the supervisor (dispatch latency,
//! end-to-end throughput next to the raw spawn rate, footprint).
//!
//! `cargo bench --bench jobmgr` runs the full set (about 15 minutes on 2
//! cores) and writes the report to `BENCHMARKS.md` (or the file named by
//! `JOBMGR_BENCH_REPORT`). `JOBMGR_BENCH_SMOKE=1` runs a seconds-long
//! version that only checks that everything still works; its figures mean
//! nothing and are not written. `JOBMGR_BENCH_ONLY=http-limits` runs only
//! the HTTP port's limits section and prints it.

mod common;
mod limits;
mod server;
mod supervisor;

use std::time::Duration;

/// How big a run is.
#[derive(Clone, Copy)]
pub struct Scale {
    /// Runs of each measure, for median and spread.
    pub repeats: usize,
    /// Length of one server throughput run.
    pub cycle_run: Duration,
    /// Queue sizes for the dequeue-latency measure.
    pub queued: [usize; 2],
    /// Dequeues sampled per queue size.
    pub latency_samples: usize,
    /// Idle waiting requests on the server.
    pub waiters: usize,
    /// How long idle things are watched.
    pub idle_watch: Duration,
    /// Dispatch-latency samples per run.
    pub dispatch_samples: usize,
    /// Jobs per end-to-end throughput run.
    pub throughput_jobs: usize,
    /// Jobs run while the supervisor's RSS is followed.
    pub rss_jobs: usize,
    /// RSS readings over those jobs.
    pub rss_rounds: usize,
}

const FULL: Scale = Scale {
    repeats: 3,
    cycle_run: Duration::from_secs(5),
    queued: [1_000, 1_000_000],
    latency_samples: 1_000,
    waiters: 1_000,
    idle_watch: Duration::from_secs(60),
    dispatch_samples: 1_000,
    throughput_jobs: 2_000,
    rss_jobs: 100_000,
    rss_rounds: 10,
};

const SMOKE: Scale = Scale {
    repeats: 1,
    cycle_run: Duration::from_millis(500),
    queued: [100, 2_000],
    latency_samples: 50,
    waiters: 50,
    idle_watch: Duration::from_millis(500),
    dispatch_samples: 20,
    throughput_jobs: 40,
    rss_jobs: 200,
    rss_rounds: 2,
};

fn main() {
    // `cargo bench` passes `--bench`; anything else (like `cargo test`) does not.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let smoke = std::env::var_os("JOBMGR_BENCH_SMOKE").is_some();
    let scale = if smoke { SMOKE } else { FULL };
    let started = std::time::Instant::now();
    if std::env::var("JOBMGR_BENCH_ONLY").as_deref() == Ok("http-limits") {
        println!("{}", limits::report(scale));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = String::new();
    report.push_str("# Benchmarks\n\n");
    report.push_str(&format!("- Machine: {}\n", common::machine()));
    report.push_str("- Command: `cargo bench --bench jobmgr` (regenerates this file)\n");
    report.push_str("- Everything runs on this machine: the release `jobmgr` binaries on fresh SQLite files in temporary directories (WAL, synchronous=FULL: every answered write is on disk), and the clients, over 127.0.0.1. Clients, servers, supervisors and workers share the cores.\n");
    report.push_str("- Spread: median (min–max) over repeated runs, each on fresh processes.\n\n");
    report.push_str(&runtime.block_on(server::report(scale)));
    report.push_str(&limits::report(scale));
    report.push_str(&supervisor::report(scale));
    report.push_str(&format!(
        "\nThe whole run took {:.0} s.\n",
        started.elapsed().as_secs_f64()
    ));
    if smoke {
        println!("{report}\n(smoke run: figures not recorded)");
        return;
    }
    let path = std::env::var("JOBMGR_BENCH_REPORT").unwrap_or_else(|_| "BENCHMARKS.md".into());
    std::fs::write(&path, &report).expect("write report");
    println!("{report}\nwritten to {path}");
}
