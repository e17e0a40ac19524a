//! A supervisor of several workers sending its reports with its fetches
//! (`src/client/riders.rs`): behind a fetch on its way when jobs are
//! waiting, and while its gate is closed at its ramp's ceiling.
//!
//! Not in the PostgreSQL pass of `.ci/run`: what is shown here is the
//! supervisor's, whatever the store, and it needs a fetch answered within
//! 50 ms (`RIDE_WAIT`). A store that answers slower (PostgreSQL beside
//! the rest of CI: 77 of 200 reports went by themselves there) only makes
//! the reports go by themselves, as they did before; nothing is lost.

use crate::report_batch::quick_jobs_with;

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
