//! A supervisor of several workers sending its reports with its fetches
//! (`src/client/riders.rs`): behind a fetch on its way when jobs are
//! waiting, and while its gate is closed at its ramp's ceiling. Also a
//! job's end told to the spawner with the next spawn request
//! (`src/supervisor/spawner/mod.rs`).
//!
//! Not in the PostgreSQL pass of `.ci/run`: what is shown here is the
//! supervisor's, whatever the store, and it needs a fetch answered within
//! 50 ms (`RIDE_WAIT`). A store that answers slower (PostgreSQL beside
//! the rest of CI: 77 of 200 reports went by themselves there) only makes
//! the reports go by themselves, as they did before; nothing is lost.

use crate::common::*;
use crate::report_batch::{quick_jobs_with, run_quick_jobs};

#[test]
fn a_supervisor_of_several_workers_sends_its_reports_with_its_fetches_under_a_backlog() {
    // A fetch is usually on its way when a job ends here; with jobs
    // waiting, its answer comes at once and the fetch after it, for the
    // slot that freed, takes the report. (`--ramp 4`: no start-up ramp.)
    let count = 200;
    let (route, text) = quick_jobs_with(4, count, 0, &["--ramp", "4"]);
    let alone = route("/jobs/{id}/finish") + route("/reports");
    let fetches = route("/dequeue");
    assert!(
        alone < count as f64 / 4.0,
        "most reports went with a fetch ({alone} of {count} by themselves): {text}"
    );
    assert!(
        fetches + alone < 1.5 * count as f64,
        "{fetches} fetches and {alone} other reports for {count} jobs: {text}"
    );
}

#[test]
fn a_supervisor_at_its_ramps_ceiling_sends_its_reports_with_its_fetches() {
    // One worker more a second, up to 100: the gate stays closed at the
    // ramp's ceiling, and a slot that frees brings a fetch, as in a full
    // pool, so the reports wait for it.
    let count = 100;
    let (route, text) = quick_jobs_with(100, count, 0, &["--ramp", "1"]);
    let alone = route("/jobs/{id}/finish") + route("/reports");
    assert!(
        alone < count as f64 / 4.0,
        "most reports went with a fetch ({alone} of {count} by themselves): {text}"
    );
}

/// The supervisor's spawner: its child named `jobmgr-spawner`.
fn spawner_of(sup: &Supervisor) -> u32 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", sup.pid())).expect("its tasks");
    tasks
        .flatten()
        .flat_map(|task| {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "jobmgr-spawner")
        })
        .expect("a spawner process")
}

/// How many times `pid` has gone to sleep (its voluntary context switches).
fn sleeps(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

#[test]
fn a_jobs_end_is_told_to_the_spawner_with_the_next_spawn_request() {
    // The spawner sleeps until a request comes, while its clone waits for
    // the worker's exec, and until a worker ends: three times a job. A
    // job's end told by itself woke it a fourth time.
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker("Quick", &sh("cat > /dev/null; echo '{\"ran\": true}'"))
        .arg("--max-workers")
        .arg("1")
        .start();
    let spawner = spawner_of(&sup);
    let before = sleeps(spawner);
    let count = 100;
    run_quick_jobs(&api, &sup, count);
    let per_job = (sleeps(spawner) - before) as f64 / count as f64;
    assert!(
        per_job < 3.5,
        "the spawner slept {per_job} times a job (3 when a job's end rides with the next request, 4 when it goes alone)"
    );
}
