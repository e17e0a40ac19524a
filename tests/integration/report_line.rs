//! The worker's report line on fd 3 (`{"jobmgr.report":{…}}`), for any
//! worker: a retry on the worker's own terms with exit 75, a failure
//! without the retry policy with another exit code, and lines that are not
//! followed (a disagreeing ending, a line that does not read) leaving the
//! exit code to decide.

use serde_json::json;

use crate::common::*;

#[test]
fn a_report_line_retries_on_the_workers_terms_or_fails_the_job_at_once() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .arg("--max-attempts")
        .arg("5")
        .worker(
            "Later",
            &sh(r#"echo '{"progress": 1}' >&3
echo '{"jobmgr.report":{"outcome":"retry","delay":30}}' >&3
echo '{"jobmgr.report":{"outcome":"retry","nextRun":"2031-05-06 07:08:09","name":"rl/Moved","ignoreRepeat":true}}' >&3
echo '{"kept": "from stdout"}'
exit 75"#),
        )
        .worker(
            "GiveUp",
            &sh(r#"echo '{"jobmgr.report":{"outcome":"fail","reason":"the partner API said no"}}' >&3
exit 4"#),
        )
        .start();
    let later = api.create(json!({"name": "rl/Later", "repeat": "FINISHED, +1 HOUR"}));
    let give_up = api.create(json!({"name": "rl/GiveUp"}));
    let job = wait_for("the retry on the worker's terms", &sup, || {
        let job = api.job(later);
        (job["name"] == "rl/Moved").then_some(job)
    });
    // The last report line counts; the data is stdout's last line (with the
    // progress, which is never undone), and the time wins over the repeat.
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert_eq!(job["nextRun"], "2031-05-06 07:08:09", "{job}");
    assert_eq!(job["data"]["kept"], "from stdout", "{job}");
    assert!(
        job["data"].get("jobmgr.report").is_none(),
        "a report line is not progress: {job}"
    );
    let job = wait_for("the failure", &sup, || {
        let job = api.job(give_up);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(
        job["data"]["_jobmgr"]["reason"], "the partner API said no",
        "{job}"
    );
    assert_eq!(api.outcomes(give_up), ["failed"], "one run, no retries");
}

#[test]
fn report_lines_that_do_not_read_or_disagree_with_the_ending_leave_the_exit_code_to_decide() {
    let server = Server::start();
    let api = server.api();
    let long = "x".repeat(70 * 1024);
    let sup = Supervisor::builder(&server.url)
        .arg("--max-attempts")
        .arg("1")
        .worker(
            // A retry line, then exit 0: finished.
            "Finishes",
            &sh(
                r#"echo '{"jobmgr.report":{"outcome":"retry","name":"rl/Never"}}' >&3
exit 0"#,
            ),
        )
        .worker(
            // A fail line, then killed by a signal: the policy (FAILED with
            // one attempt), as a crash, not the worker's verdict.
            "Crashes",
            &sh(
                r#"echo '{"jobmgr.report":{"outcome":"fail","reason":"said before dying"}}' >&3
kill -9 $$"#,
            ),
        )
        .worker(
            // Lines that do not read, then exit 75: retried on the policy's
            // terms, under its own name.
            "Garbles",
            &sh(&format!(
                r#"echo '{{"jobmgr.report":{{"outcome":"retry","nextRun":"soon"}}}}' >&3
echo '{{"jobmgr.report":{{"outcome":"retry","name":"bad\nname"}}}}' >&3
echo '{{"jobmgr.report":"retry"}}' >&3
echo '{{"jobmgr.report":{{"outcome":"retry","name":"rl/{long}"}}}}' >&3
exit 75"#
            )),
        )
        .start();
    let finishes = api.create(json!({"name": "rl/Finishes"}));
    let crashes = api.create(json!({"name": "rl/Crashes"}));
    let garbles = api.create(json!({"name": "rl/Garbles"}));
    wait_for("the finish", &sup, || {
        (api.outcomes(finishes).first()? == "finished").then_some(())
    });
    let job = wait_for("the crash failed", &sup, || {
        let job = api.job(crashes);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(job["data"]["_jobmgr"]["signal"], "SIGKILL", "{job}");
    assert!(
        job["data"]["_jobmgr"].get("reason").is_none(),
        "the line was not followed: {job}"
    );
    wait_for("the garbled retry", &sup, || {
        (api.outcomes(garbles).first()? == "retried").then_some(())
    });
    let job = api.job(garbles);
    assert_eq!(job["name"], "rl/Garbles", "{job}");
    // Back in the queue, due at once, so the supervisor may have taken it
    // again already: retried, not failed or finished.
    assert!(
        matches!(job["state"].as_str(), Some("QUEUED" | "RUNNING")),
        "{job}"
    );
    assert!(
        sup.stderr().contains("its report line was not followed"),
        "the log says why: {}",
        sup.stderr()
    );
}
