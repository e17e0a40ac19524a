//! A job whose worker is missing on a supervisor's host: handed back with a
//! delay (no attempt counted) for a supervisor that has the worker, and
//! failed as `no_worker` only when none has run it for `--no-worker-timeout`
//! since the first hand-back.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::common::*;

/// The job's details under `_jobmgr`.
fn details(job: &Value) -> &Value {
    &job["data"]["_jobmgr"]
}

/// Puts an executable worker in place at once (written aside, renamed in),
/// as a deploy would.
fn deploy(workers: &Path, name: &str, script: &str) {
    let aside = workers.join(format!(".{name}.new"));
    std::fs::write(&aside, script).expect("worker script");
    std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&aside, workers.join(name)).expect("rename the worker in");
}

/// A worker that finishes with the attempt number it was given as data.
const SAYS_ATTEMPT: &str = "#!/bin/sh\necho \"{\\\"ranAttempt\\\": $JOBMGR_ATTEMPT}\"\n";

/// Waits until the job's data records at least `n` no-worker hand-backs.
fn wait_hand_backs(api: &Api, logs: &dyn Logs, id: i64, n: i64) -> Value {
    wait_for(
        &format!("{n} no-worker hand-backs of job {id}"),
        logs,
        || {
            let job = api.job(id);
            (details(&job)["noWorkerHandBacks"].as_i64()? >= n).then_some(job)
        },
    )
}

/// The archived end of a finished job.
fn wait_archived(api: &Api, logs: &dyn Logs, id: i64) -> Value {
    wait_for(&format!("job {id} in the archive"), logs, || {
        let (status, history) = api.get(&format!("/jobs/{id}/history"));
        (status == 200 && !history["archived"].is_null()).then_some(history)
    })
}

#[test]
fn a_job_without_its_worker_is_handed_back_and_runs_once_the_worker_is_deployed() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .arg("--no-worker-timeout")
        .arg("1h")
        .arg("--max-attempts")
        .arg("2")
        .start();
    let id = api.create(json!({"name": "Late", "data": {"n": 1}}));
    let first = wait_hand_backs(&api, &sup, id, 1);
    let since = details(&first)["noWorkerSince"].clone();
    assert!(since.is_string(), "{first}");
    assert_eq!(details(&first)["outcome"], "no_worker", "{first}");
    assert_eq!(first["data"]["n"], 1, "the job's own data is kept: {first}");
    // Handed back again and again (more than --max-attempts), never failed;
    // the clock keeps the first hand-back's time.
    let third = wait_hand_backs(&api, &sup, id, 3);
    assert_ne!(third["state"], "FAILED", "{third}");
    assert_eq!(details(&third)["noWorkerSince"], since, "{third}");
    // Warned once a minute per name, not at every hand-back (the others
    // are debug lines).
    assert_eq!(
        sup.stderr()
            .lines()
            .filter(|l| l.contains(" WARN ")
                && l.contains("handed back for a supervisor that has the worker"))
            .count(),
        1,
        "{}",
        sup.stderr()
    );

    deploy(&sup.workers(), "Late", SAYS_ATTEMPT);
    let history = wait_archived(&api, &sup, id);
    assert_eq!(history["archived"]["state"], "FINISHED", "{history}");
    // The hand-backs counted no attempt: the worker ran as attempt 1.
    assert_eq!(
        history["archived"]["data"],
        json!({"ranAttempt": 1}),
        "{history}"
    );
    // The history shows the streak of hand-backs as one row, then the run.
    let rows = history["attempts"].as_array().expect("attempts");
    let outcomes: Vec<&str> = rows
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["handed_back", "finished"], "{history}");
    assert!(rows[0]["handBacks"].as_i64().unwrap_or(0) >= 3, "{history}");
}

/// A job's history: its attempts, oldest first.
fn history_rows(api: &Api, id: i64) -> Vec<Value> {
    let (status, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(status, 200, "{history}");
    history["attempts"].as_array().expect("attempts").clone()
}

#[test]
fn no_worker_hand_backs_count_no_attempt_and_are_one_history_row_per_streak() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .arg("--no-worker-timeout")
        .arg("1h")
        .start();
    let id = api.create(json!({"name": "Missing"}));
    wait_hand_backs(&api, &sup, id, 4);

    // No attempt counted: 0 between hand-outs, 1 while handed out.
    let job = api.job(id);
    let attempts = job["attempts"].as_i64().expect("attempts");
    assert!(
        attempts <= 1,
        "the hand-backs were counted as attempts: {job}"
    );
    // One row for the streak (besides the hand-out open now, if any),
    // counting its hand-backs.
    let rows = history_rows(&api, id);
    let ended: Vec<&Value> = rows.iter().filter(|r| r["outcome"] != "running").collect();
    assert_eq!(ended.len(), 1, "a row per hand-back: {rows:?}");
    let streak = ended[0];
    assert_eq!(streak["outcome"], "handed_back", "{streak}");
    assert_eq!(streak["failure"], "no_worker", "{streak}");
    assert_eq!(streak["attempt"], 1, "{streak}");
    assert!(streak["handBacks"].as_i64().unwrap_or(0) >= 4, "{streak}");
    // The dashboard's job page says how many.
    let base = server.url.as_str();
    let cookie = crate::ui::cookie_of(&crate::ui::log_in(base, token()));
    let (status, page) = crate::ui::get(base, &format!("/ui/jobs/{id}"), Some(&cookie));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("handed_back (no_worker) ×"), "{page}");

    // The worker arrives: its run is attempt 1, a row of its own after the
    // streak's.
    deploy(&sup.workers(), "Missing", SAYS_ATTEMPT);
    let history = wait_archived(&api, &sup, id);
    assert_eq!(
        history["archived"]["data"],
        json!({"ranAttempt": 1}),
        "{history}"
    );
    assert_eq!(history["archived"]["attempts"], 1, "{history}");
    let rows = history_rows(&api, id);
    let outcomes: Vec<&str> = rows
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["handed_back", "finished"], "{rows:?}");
    assert_eq!(rows[1]["attempt"], 1, "{rows:?}");
}

#[test]
fn a_supervisor_with_the_worker_runs_what_one_without_it_handed_back() {
    let server = Server::start();
    let api = server.api();
    let without = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("fleet/*")
        .start();
    let id = api.create(json!({"name": "fleet/Deployed"}));
    wait_hand_backs(&api, &without, id, 1);
    let with = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("fleet/*")
        .worker("Deployed", SAYS_ATTEMPT)
        .start();
    let history = wait_archived(&api, &with, id);
    assert_eq!(history["archived"]["state"], "FINISHED", "{history}");
    assert_eq!(history["archived"]["data"], json!({"ranAttempt": 1}));
    assert!(
        with.stderr().contains("starting worker"),
        "the second supervisor ran it:\n{}",
        with.stderr()
    );
}

#[test]
fn a_job_no_supervisor_can_run_fails_as_no_worker_after_the_timeout() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .arg("--no-worker-timeout")
        .arg("3s")
        .start();
    let id = api.create(json!({"name": "Nowhere"}));
    let job = wait_state(&api, &sup, id, "FAILED");
    let d = details(&job);
    assert_eq!(d["outcome"], "no_worker", "{job}");
    assert!(d["noWorkerHandBacks"].as_i64().unwrap_or(0) >= 1, "{job}");
    assert!(
        d["reason"].as_str().unwrap_or("").contains("Nowhere"),
        "{job}"
    );
    assert!(
        sup.stderr()
            .contains("no supervisor ran it within the no-worker timeout (3s)"),
        "{}",
        sup.stderr()
    );
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    let attempts = history["attempts"].as_array().expect("attempts");
    let outcomes: Vec<&Value> = attempts.iter().map(|a| &a["outcome"]).collect();
    assert_eq!(
        outcomes,
        ["handed_back", "failed"],
        "the hand-backs, then the failure: {history}"
    );
    assert_eq!(
        attempts.last().unwrap()["failure"],
        "no_worker",
        "{history}"
    );

    // Hostile: a name that names no worker on any host fails at once, with
    // no hand-back.
    let bad = api.create(json!({"name": "bad/-rf"}));
    let job = wait_state(&api, &sup, bad, "FAILED");
    assert_eq!(details(&job)["outcome"], "no_worker", "{job}");
    assert!(details(&job).get("noWorkerHandBacks").is_none(), "{job}");
}

#[test]
fn a_repeating_job_without_its_worker_moves_on_to_its_next_time_and_is_not_failed() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .arg("--no-worker-timeout")
        .arg("2s")
        .start();
    let id = api.create(json!({"name": "Hourly", "repeat": "SCHEDULED, +1 HOUR"}));
    // Handed back first, then moved on past the timeout.
    wait_hand_backs(&api, &sup, id, 1);
    let job = wait_for("the occurrence to be given up", &sup, || {
        let job = api.job(id);
        (job["state"] == "QUEUED" && details(&job).get("noWorkerSince").is_none()).then_some(job)
    });
    assert_eq!(details(&job)["outcome"], "no_worker", "{job}");
    // The hand-backs' row, then the run given up.
    let outcomes: Vec<Value> = history_rows(&api, id)
        .iter()
        .map(|a| a["outcome"].clone())
        .collect();
    assert_eq!(outcomes, ["handed_back", "retried"], "{outcomes:?}");
    assert!(
        sup.stderr().contains("the job repeats at its next time"),
        "{}",
        sup.stderr()
    );
}

#[test]
fn over_bedrock_the_hand_backs_and_their_clock_travel_in_the_jobs_data() {
    let server = Server::start();
    let api = server.api();
    let url = format!("bedrock://{}", server.bedrock);
    let sup = Supervisor::builder(&url)
        .arg("--no-worker-timeout")
        .arg("1h")
        .start();
    let id = api.create(json!({"name": "ViaBedrock"}));
    let job = wait_hand_backs(&api, &sup, id, 2);
    assert_ne!(job["state"], "FAILED", "{job}");
    assert!(details(&job)["noWorkerSince"].is_string(), "{job}");
    deploy(&sup.workers(), "ViaBedrock", SAYS_ATTEMPT);
    let history = wait_archived(&api, &sup, id);
    assert_eq!(history["archived"]["state"], "FINISHED", "{history}");
    assert_eq!(
        history["archived"]["data"],
        json!({"ranAttempt": 1}),
        "no attempt counted for the hand-backs: {history}"
    );
    // Past the timeout over bedrock:// too: FAILED as no_worker.
    let short = Supervisor::builder(&url)
        .arg("--job-name")
        .arg("short/*")
        .arg("--no-worker-timeout")
        .arg("2s")
        .start();
    let gone = api.create(json!({"name": "short/Gone"}));
    let job = wait_state(&api, &short, gone, "FAILED");
    assert_eq!(details(&job)["outcome"], "no_worker", "{job}");
    assert!(
        details(&job)["noWorkerHandBacks"].as_i64().unwrap_or(0) >= 1,
        "{job}"
    );
}

/// A hand-back count forged in a job's data (its creator wrote it) counts
/// for nothing: the server counts the attempts, and the job fails after
/// --max-attempts as any other.
#[test]
fn a_forged_hand_back_count_does_not_let_a_failing_job_retry_for_ever() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker("Fails", &sh("echo \"attempt $JOBMGR_ATTEMPT\" >&2; exit 1"))
        .arg("--max-attempts")
        .arg("2")
        .start();
    let id = api.create(json!({
        "name": "Fails",
        "data": {"_jobmgr": {"noWorkerHandBacks": 1_000_000_000_i64}}
    }));
    let history = wait_archived(&api, &sup, id);
    assert_eq!(history["archived"]["state"], "FAILED", "{history}");
    let attempts = history["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "two runs, then failed: {history}");
    assert!(
        attempts[1]["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("attempt 2"),
        "the second run was told it is attempt 2: {history}"
    );
}
