//! A supervisor of several workers sending its reports with its fetches
//! (`src/client/riders.rs`): behind a fetch on its way when jobs are
//! waiting, and while its gate is closed at its ramp's ceiling. How many
//! ride depends on the machine's speed (a fetch must take a report within
//! 50 ms): that share is the bench's figure ("How reports reach the
//! server"), and the unit tests of `riders` show when a report rides. What
//! holds on any machine is asserted here: every job runs once, and every
//! report is answered once, by one way. The spawner's sleeps a job, which
//! a job's end told with the next spawn request lowers, are the bench's
//! figure too.
//!
//! Not in the PostgreSQL pass of `.ci/run`: what is shown here is the
//! supervisor's, whatever the store.

use crate::report_batch::quick_jobs_with;

#[test]
fn a_supervisor_of_several_workers_sends_its_reports_with_its_fetches_under_a_backlog() {
    // A fetch is usually on its way when a job ends here; with jobs
    // waiting, its answer comes at once and the fetch after it, for the
    // slot that freed, takes the report. (`--ramp 4`: no start-up ramp.)
    let count = 200;
    quick_jobs_with(4, count, 0, &["--ramp", "4"]).assert_each_report_answered_once(count);
}

#[test]
fn a_supervisor_at_its_ramps_ceiling_sends_its_reports_with_its_fetches() {
    // One worker more a second, up to 100: the gate stays closed at the
    // ramp's ceiling, and a slot that frees brings a fetch, as in a full
    // pool, so the reports wait for it.
    let count = 100;
    quick_jobs_with(100, count, 0, &["--ramp", "1"]).assert_each_report_answered_once(count);
}
