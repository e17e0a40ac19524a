//! jobmgr's benchmarks, measured against the machine's own limits: the job
//! server (throughput over HTTP and the Bedrock port, dequeue latency
//! against queue size, idle waiters) and the supervisor (dispatch latency,
//! end-to-end throughput next to the raw spawn rate, footprint).
//!
//! `cargo bench --bench jobmgr` runs the full set (about 25 minutes on 2
//! cores) and writes the report to `BENCHMARKS.md` (or the file named by
//! `JOBMGR_BENCH_REPORT`). `JOBMGR_BENCH_SMOKE=1` runs a seconds-long
//! version that only checks that everything still works; its figures mean
//! nothing and are not written. `JOBMGR_BENCH_ONLY=http-limits` runs only
//! the HTTP port's limits section and prints it; `JOBMGR_BENCH_ONLY=events`
//! the event streams' section. `JOBMGR_BENCH_ONLY=supervisor` runs only the
//! supervisor's sections and prints them; `JOBMGR_BENCH_ONLY=spawn` only its
//! dispatch latency and end-to-end throughput (a few minutes).
//!
//! The PostgreSQL sections need PostgreSQL on 127.0.0.1:5432 with trust
//! authentication for the user `postgres` (or its URL in `JOBMGR_BENCH_PG`),
//! in the full run and in the smoke run alike.
//! `JOBMGR_BENCH_ONLY=postgres` runs only them (about 6 minutes), with the
//! SQLite figures they compare against measured again in that run, and
//! replaces only their part of the report, leaving every other section as
//! the last full run wrote it.
//!
//! `JOBMGR_BENCH_ONLY=peers` runs only jobmgr on PostgreSQL beside
//! PgQueuer and procrastinate (`peers.rs`: a venv of them under `target/`,
//! from PyPI; about 40 minutes) and replaces only its section of the
//! report; its smoke run (a minute) runs in CI.
//!
//! `JOBMGR_BENCH_ONLY=dependencies` runs only the dequeue latency with 10^5
//! jobs waiting on dependencies (both stores, a few minutes) and replaces
//! only its section of the report; `JOBMGR_BENCH_ONLY=dashboard` likewise
//! the dashboard's pages with 10^6 jobs stored.
//!
//! `JOBMGR_BENCH_ONLY=site` runs only the site under job storms (a real
//! nginx and php-fpm site beside the supervisor's jobs, about 10 minutes;
//! it needs root, cgroup v2 and `nginx` and `php-fpm` installed, and is
//! skipped without them), replaces only its section of the report and
//! writes its plot to `docs/site-under-storm.svg`; the full run runs it
//! too. Its smoke run needs no nginx: without one it runs the storms alone.

mod common;
mod dashboard;
mod dependencies;
mod events;
mod limits;
mod open_loop;
mod peers;
mod postgres;
mod server;
mod site;
mod site_plot;
mod site_server;
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
    /// Wake-ups of a held dequeue sampled per case.
    pub wake_samples: usize,
    /// Dequeues timed on a PostgreSQL queue before it is analyzed.
    pub before_analyze_samples: usize,
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
    /// Jobs waiting on dependencies in the dequeue-latency measure beside
    /// them.
    pub dependency_waiting: usize,
    /// Jobs stored while the dashboard's pages are timed.
    pub dashboard_jobs: usize,
}

const FULL: Scale = Scale {
    repeats: 3,
    cycle_run: Duration::from_secs(5),
    queued: [1_000, 1_000_000],
    latency_samples: 1_000,
    wake_samples: 300,
    before_analyze_samples: 30,
    waiters: 1_000,
    idle_watch: Duration::from_secs(60),
    dispatch_samples: 1_000,
    throughput_jobs: 2_000,
    rss_jobs: 100_000,
    rss_rounds: 10,
    dependency_waiting: 100_000,
    dashboard_jobs: 1_000_000,
};

const SMOKE: Scale = Scale {
    repeats: 1,
    cycle_run: Duration::from_millis(500),
    queued: [100, 2_000],
    latency_samples: 50,
    wake_samples: 10,
    before_analyze_samples: 5,
    waiters: 50,
    idle_watch: Duration::from_millis(500),
    dispatch_samples: 20,
    throughput_jobs: 40,
    rss_jobs: 200,
    rss_rounds: 2,
    dependency_waiting: 2_000,
    dashboard_jobs: 2_000,
};

fn main() {
    // `cargo bench` passes `--bench`; anything else (like `cargo test`) does not.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let smoke = std::env::var_os("JOBMGR_BENCH_SMOKE").is_some();
    let scale = if smoke { SMOKE } else { FULL };
    let started = std::time::Instant::now();
    let only = std::env::var("JOBMGR_BENCH_ONLY").ok();
    match only.as_deref() {
        None | Some("") => {}
        Some("http-limits") => {
            println!("{}", limits::report(scale));
            return;
        }
        Some("postgres") => return only_postgres(scale, smoke, started),
        Some("dependencies") => return only_dependencies(scale, smoke, started),
        Some("peers") => return only_peers(smoke, started),
        Some("dashboard") => return only_dashboard(scale, smoke, started),
        Some("site") => return only_site(smoke, started),
        Some("events") => {
            println!("{}", runtime().block_on(events::report(scale)));
            return;
        }
        Some("supervisor") => {
            println!("{}", supervisor::report(scale, true));
            return;
        }
        Some("spawn") => {
            println!("{}", supervisor::report(scale, false));
            return;
        }
        Some(other) => panic!(
            "JOBMGR_BENCH_ONLY={other:?}: expected \"http-limits\", \"postgres\", \"peers\", \"dependencies\", \"dashboard\", \"site\", \"events\", \"supervisor\" or \"spawn\" (or unset for the full run)"
        ),
    }
    let runtime = runtime();
    let mut report = String::new();
    report.push_str("# Benchmarks\n\n");
    report.push_str(&format!("- Machine: {}\n", common::machine()));
    report.push_str("- Command: `cargo bench --bench jobmgr` (regenerates this file)\n");
    report.push_str("- Everything runs on this machine: the release `jobmgr` binaries on fresh SQLite files in temporary directories (WAL, synchronous=FULL: every answered write is on disk), and the clients, over 127.0.0.1. Clients, servers, supervisors and workers share the cores.\n");
    report.push_str("- Spread: median (min–max) over repeated runs, each on fresh processes.\n\n");
    let (server_sections, sqlite) = runtime.block_on(server::report(scale));
    report.push_str(&server_sections);
    report.push('\n');
    report.push_str(&runtime.block_on(events::report(scale)));
    report.push('\n');
    report.push_str(&postgres_part(
        runtime.block_on(postgres::report(scale, &sqlite, FULL_RUN)),
    ));
    report.push('\n');
    report.push_str(&dependencies_part(
        runtime.block_on(dependencies::report(scale)),
    ));
    report.push('\n');
    report.push_str(&dashboard_part(runtime.block_on(dashboard::report(scale))));
    report.push('\n');
    report.push_str(&limits::report(scale));
    report.push_str(&supervisor::report(scale, true));
    report.push('\n');
    let site = site::report(smoke);
    report.push_str(&site_part(&site.markdown));
    report.push_str(&format!(
        "\nThe whole run took {:.0} s.\n",
        started.elapsed().as_secs_f64()
    ));
    if smoke {
        println!("{report}\n(smoke run: figures not recorded)");
        return;
    }
    let path = report_path();
    std::fs::write(&path, &report).expect("write report");
    write_site_plot(&site);
    println!("{report}\nwritten to {path}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn report_path() -> String {
    std::env::var("JOBMGR_BENCH_REPORT").unwrap_or_else(|_| "BENCHMARKS.md".into())
}

/// Where the PostgreSQL part of the report begins and ends, so that
/// `JOBMGR_BENCH_ONLY=postgres` can replace it alone.
const PG_BEGIN: &str = "<!-- PostgreSQL sections: begin (JOBMGR_BENCH_ONLY=postgres replaces what lies between these marks) -->";
const PG_END: &str = "<!-- PostgreSQL sections: end -->";

/// What the PostgreSQL part says of its run, in the full run.
const FULL_RUN: &str =
    "*Measured in the full run (`cargo bench --bench jobmgr`), like the rest of this file.*";

/// The PostgreSQL sections between their marks.
fn postgres_part(sections: String) -> String {
    format!("{PG_BEGIN}\n\n{}\n\n{PG_END}\n", sections.trim_end())
}

/// `JOBMGR_BENCH_ONLY=postgres`: the PostgreSQL sections and the SQLite
/// figures they compare against, written into the report in place of the
/// last PostgreSQL part (or, if it has none, after the server sections),
/// the rest left as it is.
fn only_postgres(scale: Scale, smoke: bool, started: std::time::Instant) {
    let runtime = runtime();
    let sqlite = runtime.block_on(server::sqlite_figures(scale));
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let provenance = format!(
        "*Measured on {date} by `JOBMGR_BENCH_ONLY=postgres cargo bench --bench jobmgr`, a run of its own that measured only these sections and, in the same run, the SQLite figures they compare against (so they may differ from the SQLite sections above). This run replaced only what lies between this part's marks: every other section of this file is as the run that wrote it left it (the last full run, `cargo bench --bench jobmgr`, whose header and total time are at the top and bottom, unless the section says otherwise).*"
    );
    let sections = runtime.block_on(postgres::report(scale, &sqlite, &provenance));
    let part = postgres_part(sections);
    if smoke {
        println!("{part}\n(smoke run: figures not recorded)");
        return;
    }
    let path = report_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = splice(&old, &part);
    std::fs::write(&path, &new).expect("write report");
    println!(
        "{part}\nwritten into {path} (its other sections unchanged); the run took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// `report` with its PostgreSQL part replaced by `part`; without one,
/// `part` goes before the first section that follows the server's (the
/// HTTP port's limits), else before the closing line, else at the end.
fn splice(report: &str, part: &str) -> String {
    if let (Some(begin), Some(end)) = (report.find(PG_BEGIN), report.find(PG_END))
        && begin < end
    {
        let mut end = end + PG_END.len();
        if report[end..].starts_with('\n') {
            end += 1;
        }
        return format!("{}{part}{}", &report[..begin], &report[end..]);
    }
    for anchor in ["\n## The HTTP port under attack", "\nThe whole run took"] {
        if let Some(at) = report.find(anchor) {
            return format!("{}{part}{}", &report[..at + 1], &report[at..]);
        }
    }
    if report.is_empty() {
        return format!("# Benchmarks\n\n{part}");
    }
    format!("{}\n\n{part}", report.trim_end())
}

/// Where the dependencies section begins and ends, so that
/// `JOBMGR_BENCH_ONLY=dependencies` can replace it alone.
const DEPS_BEGIN: &str = "<!-- Dependencies section: begin (JOBMGR_BENCH_ONLY=dependencies replaces what lies between these marks) -->";
const DEPS_END: &str = "<!-- Dependencies section: end -->";

/// The dependencies section between its marks.
fn dependencies_part(section: String) -> String {
    format!("{DEPS_BEGIN}\n\n{}\n\n{DEPS_END}\n", section.trim_end())
}

/// `JOBMGR_BENCH_ONLY=dependencies`: the dependencies section (on both
/// stores), written into the report in place of the last one (or, if it
/// has none, before the HTTP port's limits), the rest left as it is.
fn only_dependencies(scale: Scale, smoke: bool, started: std::time::Instant) {
    let runtime = runtime();
    let section = runtime.block_on(dependencies::report(scale));
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let part = dependencies_part(format!(
        "{}\n*Measured on {date} by `JOBMGR_BENCH_ONLY=dependencies cargo bench --bench jobmgr`, a run of its own ({:.0} s); the rest of this file is as the run that wrote it left it.*",
        section.trim_end(),
        started.elapsed().as_secs_f64()
    ));
    if smoke {
        println!("{part}\n(smoke run: figures not recorded)");
        return;
    }
    write_marked(&part, DEPS_BEGIN, DEPS_END);
}

/// Writes `part` into the report in place of what lies between `begin` and
/// `end` (or, if it has no such part, before the HTTP port's limits), the
/// rest left as it is.
fn write_marked(part: &str, begin_mark: &str, end_mark: &str) {
    let path = report_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = match (old.find(begin_mark), old.find(end_mark)) {
        (Some(begin), Some(end)) if begin < end => {
            let mut end = end + end_mark.len();
            if old[end..].starts_with('\n') {
                end += 1;
            }
            format!("{}{part}{}", &old[..begin], &old[end..])
        }
        _ => match old.find("\n## The HTTP port under attack") {
            Some(at) => format!("{}{part}\n{}", &old[..at + 1], &old[at + 1..]),
            None => format!("{}\n\n{part}", old.trim_end()),
        },
    };
    std::fs::write(&path, &new).expect("write report");
    println!("{part}\nwritten into {path} (its other sections unchanged)");
}

/// Where the peers section begins and ends, so that
/// `JOBMGR_BENCH_ONLY=peers` can replace it alone.
const PEERS_BEGIN: &str = "<!-- Peers section: begin (JOBMGR_BENCH_ONLY=peers replaces what lies between these marks) -->";
const PEERS_END: &str = "<!-- Peers section: end -->";

/// `JOBMGR_BENCH_ONLY=peers`: jobmgr on PostgreSQL beside PgQueuer and
/// procrastinate (3 rounds of 20,000 jobs; smoke: 1 round of 500), written
/// into the report in place of the last such section.
fn only_peers(smoke: bool, started: std::time::Instant) {
    let (rounds, jobs) = if smoke { (1, 500) } else { (3, 20_000) };
    let section = runtime().block_on(peers::report(rounds, jobs));
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let part = format!(
        "{PEERS_BEGIN}\n\n{}\n\n*Measured on {date} by `JOBMGR_BENCH_ONLY=peers cargo bench --bench jobmgr`, a run of its own ({:.0} s); the rest of this file is as the run that wrote it left it.*\n\n{PEERS_END}\n",
        section.trim_end(),
        started.elapsed().as_secs_f64()
    );
    if smoke {
        println!("{part}\n(smoke run: figures not recorded)");
        return;
    }
    write_marked(&part, PEERS_BEGIN, PEERS_END);
}

/// Where the dashboard section begins and ends, so that
/// `JOBMGR_BENCH_ONLY=dashboard` can replace it alone.
const UI_BEGIN: &str = "<!-- Dashboard section: begin (JOBMGR_BENCH_ONLY=dashboard replaces what lies between these marks) -->";
const UI_END: &str = "<!-- Dashboard section: end -->";

/// The dashboard section between its marks.
fn dashboard_part(section: String) -> String {
    format!("{UI_BEGIN}\n\n{}\n\n{UI_END}\n", section.trim_end())
}

/// `JOBMGR_BENCH_ONLY=dashboard`: the dashboard section, written into the
/// report in place of the last one (or, if it has none, before the HTTP
/// port's limits), the rest left as it is.
fn only_dashboard(scale: Scale, smoke: bool, started: std::time::Instant) {
    let runtime = runtime();
    let section = runtime.block_on(dashboard::report(scale));
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let part = dashboard_part(format!(
        "{}\n\n*Measured on {date} by `JOBMGR_BENCH_ONLY=dashboard cargo bench --bench jobmgr`, a run of its own ({:.0} s) on {}; the rest of this file is as the run that wrote it left it.*",
        section.trim_end(),
        started.elapsed().as_secs_f64(),
        common::machine(),
    ));
    if smoke {
        println!("{part}\n(smoke run: figures not recorded)");
        return;
    }
    let path = report_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = match (old.find(UI_BEGIN), old.find(UI_END)) {
        (Some(begin), Some(end)) if begin < end => {
            let mut end = end + UI_END.len();
            if old[end..].starts_with('\n') {
                end += 1;
            }
            format!("{}{part}{}", &old[..begin], &old[end..])
        }
        _ => match old.find("\n## The HTTP port under attack") {
            Some(at) => format!("{}{part}\n{}", &old[..at + 1], &old[at + 1..]),
            None => format!("{}\n\n{part}", old.trim_end()),
        },
    };
    std::fs::write(&path, &new).expect("write report");
    println!("{part}\nwritten into {path} (its other sections unchanged)");
}

/// Where the site section begins and ends, so that
/// `JOBMGR_BENCH_ONLY=site` can replace it alone.
const SITE_BEGIN: &str =
    "<!-- Site section: begin (JOBMGR_BENCH_ONLY=site replaces what lies between these marks) -->";
const SITE_END: &str = "<!-- Site section: end -->";

/// The site section between its marks.
fn site_part(section: &str) -> String {
    format!("{SITE_BEGIN}\n\n{}\n\n{SITE_END}\n", section.trim_end())
}

/// Writes the site section's plot, when it was measured.
fn write_site_plot(section: &site::Section) {
    if let Some(svg) = &section.svg {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(site::PLOT);
        std::fs::write(&path, svg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// `JOBMGR_BENCH_ONLY=site`: the site under job storms, written into the
/// report in place of the last one (or, if it has none, before the
/// closing line), the rest left as it is, and its plot; nothing is written
/// when the site could not be measured here.
fn only_site(smoke: bool, started: std::time::Instant) {
    let section = site::report(smoke);
    let date = chrono::Utc::now().format("%Y-%m-%d");
    let part = site_part(&format!(
        "{}\n*Measured on {date} by `JOBMGR_BENCH_ONLY=site cargo bench --bench jobmgr`, a run of its own ({:.0} s) on {}; the rest of this file is as the run that wrote it left it.*",
        section.markdown.trim_end(),
        started.elapsed().as_secs_f64(),
        common::machine(),
    ));
    if smoke || section.svg.is_none() {
        println!("{part}\n(not recorded)");
        return;
    }
    let path = report_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = match (old.find(SITE_BEGIN), old.find(SITE_END)) {
        (Some(begin), Some(end)) if begin < end => {
            let mut end = end + SITE_END.len();
            if old[end..].starts_with('\n') {
                end += 1;
            }
            format!("{}{part}{}", &old[..begin], &old[end..])
        }
        _ => match old.find("\nThe whole run took") {
            Some(at) => format!("{}{part}{}", &old[..at + 1], &old[at..]),
            None => format!("{}\n\n{part}", old.trim_end()),
        },
    };
    std::fs::write(&path, &new).expect("write report");
    write_site_plot(&section);
    println!(
        "{part}\nwritten into {path} and {} (the report's other sections unchanged)",
        site::PLOT
    );
}
