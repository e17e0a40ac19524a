//! `jobmgr job …` as a user runs it: each subcommand does what it says to the
//! server, prints what scripts read, and exits with the documented codes.

use std::net::TcpListener;
use std::process::Command;

use jobmgr::protocol::Timestamp;
use serde_json::{Value, json};

use crate::common::*;

/// Runs `jobmgr job --server URL …` against any URL.
fn cli_at(url: &str, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(bin())
        .arg("job")
        .arg("--server")
        .arg(url)
        .args(args)
        .env_remove("JOBMGR_TOKEN")
        .run_bounded(&format!("jobmgr job --server {url} {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs a subcommand that must succeed; returns its stdout as JSON.
#[track_caller]
fn ok_json(server: &Server, args: &[&str]) -> Value {
    let (code, stdout, stderr) = cli(server, args);
    assert_eq!(code, 0, "{args:?}: stdout {stdout:?} stderr {stderr:?}");
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{args:?} printed {stdout:?}, not JSON: {e}"))
}

/// Runs a subcommand that must succeed.
#[track_caller]
fn ok(server: &Server, args: &[&str]) -> String {
    let (code, stdout, stderr) = cli(server, args);
    assert_eq!(code, 0, "{args:?}: stdout {stdout:?} stderr {stderr:?}");
    stdout
}

fn job_count(api: &Api) -> usize {
    let (status, answer) = api.get("/jobs?limit=1000");
    assert_eq!(status, 200, "{answer}");
    answer["jobs"].as_array().expect("jobs").len()
}

#[test]
fn create_prints_the_job_id() {
    let server = Server::start();
    let api = server.api();
    let answer = ok_json(
        &server,
        &[
            "create",
            "cli-create",
            "--data",
            r#"{"to":"a@example.com","n":[1,2]}"#,
            "--repeat",
            "finished, +1 hour",
            "--priority",
            "750",
        ],
    );
    let id = answer["jobID"].as_i64().expect("jobID");
    assert_eq!(answer, json!({"jobID": id}));
    let job = api.job(id);
    assert_eq!(job["name"], "cli-create");
    assert_eq!(job["data"], json!({"to": "a@example.com", "n": [1, 2]}));
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR");
    assert_eq!(job["priority"], 750);
    assert_eq!(job["state"], "QUEUED");

    // As text: the bare number.
    let stdout = ok(&server, &["create", "cli-text", "--format", "text"]);
    let id: i64 = stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a bare number: {stdout:?}"));
    assert_eq!(stdout, format!("{id}\n"));
    assert_eq!(api.job(id)["name"], "cli-text");
}

#[test]
fn take_waits_for_a_job_created_while_it_waits() {
    let server = Server::start();
    let api = server.api();
    let (result, id) = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| cli(&server, &["take", "cli-wait/*", "--wait", "30s"]));
        poll("the CLI's dequeue to be held", || {
            let (_, health) = api.get("/healthz");
            (health["waiting"].as_u64() == Some(1)).then_some(())
        });
        let id = api.create(json!({"name": "cli-wait/job", "data": {"k": 1}}));
        (waiter.join().expect("waiter thread"), id)
    });
    let (code, stdout, stderr) = result;
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr:?}");
    let job: Value = serde_json::from_str(stdout.trim()).expect("JSON job");
    assert_eq!(job["jobID"], id);
    assert_eq!(job["name"], "cli-wait/job");
    assert_eq!(job["data"], json!({"k": 1}));
    assert!(
        job["lease"].as_str().is_some_and(|l| !l.is_empty()),
        "{job}"
    );
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
}

#[test]
fn take_with_nothing_due_exits_3() {
    let server = Server::start();
    let api = server.api();
    api.create(json!({"name": "other"}));
    api.create(json!({"name": "cli-later", "firstRun": "2999-01-01 00:00:00"}));
    let (code, stdout, stderr) = cli(&server, &["take", "cli-*"]);
    assert_eq!(code, 3, "stdout {stdout:?} stderr {stderr:?}");
    assert!(stderr.contains("No job found"), "stderr: {stderr:?}");
    assert_eq!(stdout, "");
}

#[test]
fn take_says_it_leases_the_job_and_how_to_end_it() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-take"}));
    let (code, stdout, stderr) = cli(
        &server,
        &["take", "cli-take", "--lease", "2m", "--format", "text"],
    );
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr:?}");
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    assert!(
        stdout.contains(&format!("job {id} is leased to you for 2m")),
        "{stdout:?}"
    );
    let lease = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("lease: "))
        .expect("the job's lease line");
    assert!(!lease.is_empty(), "{stdout:?}");
    for how in ["finish", "fail", "retry"] {
        let command = format!("jobmgr job {how} {id} --lease {lease}");
        assert!(stdout.contains(&command), "{command}: {stdout:?}");
    }

    // As JSON, stdout stays one JSON job; the note goes to stderr.
    let id = api.create(json!({"name": "cli-take-json"}));
    let (code, stdout, stderr) = cli(&server, &["take", "cli-take-json"]);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr:?}");
    let job: Value = serde_json::from_str(stdout.trim()).expect("JSON job");
    assert_eq!(job["jobID"], id);
    assert!(stderr.contains("leased to you for 5m"), "{stderr:?}");

    // Its help says so too.
    let (code, help, _) = cli(&server, &["take", "--help"]);
    assert_eq!(code, 0);
    assert!(
        help.contains("leased to you") && help.contains("job query ID"),
        "{help}"
    );
}

#[test]
fn get_is_a_deprecated_hidden_alias_of_take() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-get-old"}));
    let (code, stdout, stderr) = cli(&server, &["get", "cli-get-old"]);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr:?}");
    let job: Value = serde_json::from_str(stdout.trim()).expect("JSON job");
    assert_eq!(job["jobID"], id);
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("deprecated"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr:?}");
    assert!(warnings[0].contains("jobmgr job take"), "{stderr:?}");

    // Hidden from the list of subcommands, which shows `take`.
    let (_, help, _) = cli(&server, &["--help"]);
    assert!(help.contains("  take "), "{help}");
    assert!(!help.contains("  get "), "{help}");
}

#[test]
fn query_shows_the_job() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-query", "data": {"a": 1}, "priority": 250}));
    let shown = ok_json(&server, &["query", &id.to_string()]);
    assert_eq!(shown, api.job(id));
    assert_eq!(shown["data"], json!({"a": 1}));
    assert_eq!(shown["priority"], 250);

    // No such job: exit 3.
    let (code, _, stderr) = cli(&server, &["query", "999999"]);
    assert_eq!(code, 3, "stderr {stderr:?}");
    assert!(stderr.contains("No job with this jobID"), "{stderr:?}");
}

#[test]
fn update_replaces_data_and_priority() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-update", "data": {"a": 1}}));
    ok(
        &server,
        &[
            "update",
            &id.to_string(),
            "--data",
            r#"{"b":2}"#,
            "--priority",
            "1000",
            "--next-run",
            "2031-02-03 04:05:06",
            "--repeat",
            "daily",
        ],
    );
    let job = api.job(id);
    assert_eq!(job["data"], json!({"b": 2}));
    assert_eq!(job["priority"], 1000);
    assert_eq!(job["nextRun"], "2031-02-03 04:05:06");
    assert_eq!(job["repeat"], "DAILY");
}

/// Creates a job and takes it through the CLI; returns its id and lease.
fn take_with_cli(server: &Server, name: &str, extra: &[&str]) -> (i64, String) {
    let id = server.api().create(json!({"name": name}));
    let mut args = vec!["take", name];
    args.extend_from_slice(extra);
    let job = ok_json(server, &args);
    assert_eq!(job["jobID"], id);
    (id, job["lease"].as_str().expect("lease").to_string())
}

#[test]
fn finish_with_the_lease_ends_the_job() {
    let server = Server::start();
    let api = server.api();
    let (id, lease) = take_with_cli(&server, "cli-finish", &[]);
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));

    // A wrong lease is refused with the server's message.
    let (code, _, stderr) = cli(&server, &["finish", &id.to_string(), "--lease", "bogus"]);
    assert_eq!(code, 1, "stderr {stderr:?}");
    assert!(stderr.contains("lease_lost"), "{stderr:?}");
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));

    ok(&server, &["finish", &id.to_string(), "--lease", &lease]);
    assert_eq!(api.state(id), None, "a finished one-off job is deleted");
}

#[test]
fn retry_puts_the_job_back_after_the_delay() {
    let server = Server::start();
    let api = server.api();
    let (id, lease) = take_with_cli(&server, "cli-retry", &[]);
    let before = Timestamp::now().whole_second();
    ok(
        &server,
        &[
            "retry",
            &id.to_string(),
            "--delay",
            "10s",
            "--lease",
            &lease,
        ],
    );
    let after = Timestamp::now().whole_second();
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    let next_run = Timestamp::parse(job["nextRun"].as_str().expect("nextRun")).expect("time");
    assert!(
        before.plus_millis(10_000) <= next_run && next_run <= after.plus_millis(10_000),
        "nextRun {next_run} is not 10s after the retry ({before}..{after})"
    );
    // Not due yet.
    assert!(api.dequeue(json!({"name": "cli-retry"})).is_empty());
}

#[test]
fn fail_marks_the_job_failed() {
    let server = Server::start();
    let api = server.api();
    let (id, lease) = take_with_cli(&server, "cli-fail", &[]);
    ok(
        &server,
        &[
            "fail",
            &id.to_string(),
            "--lease",
            &lease,
            "--data",
            r#"{"error":"boom"}"#,
        ],
    );
    let job = api.job(id);
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["data"], json!({"error": "boom"}));
}

#[test]
fn delete_removes_the_job() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-delete"}));
    ok(&server, &["delete", &id.to_string()]);
    assert_eq!(api.state(id), None);

    // A running job cannot be deleted: the server's refusal, exit 1.
    let (running, _) = take_with_cli(&server, "cli-delete-running", &[]);
    let (code, _, stderr) = cli(&server, &["delete", &running.to_string()]);
    assert_eq!(code, 1, "stderr {stderr:?}");
    assert!(stderr.contains("Can't delete a RUNNING job"), "{stderr:?}");
    assert_eq!(api.state(running).as_deref(), Some("RUNNING"));
}

#[test]
fn requeue_puts_jobs_back_due_at_creation() {
    let server = Server::start();
    let api = server.api();
    let (a, lease) = take_with_cli(&server, "cli-requeue-a", &[]);
    let b = api.create(json!({"name": "cli-requeue-b", "firstRun": "2099-01-01 00:00:00"}));

    // A running job is not requeued (it would run twice at once): the
    // server's refusal, exit 1, and nothing changes.
    let (code, _, stderr) = cli(&server, &["requeue", &a.to_string(), &b.to_string()]);
    assert_eq!(code, 1, "stderr {stderr:?}");
    assert!(
        stderr.contains(&format!("Cannot requeue job {a}")),
        "{stderr:?}"
    );
    assert_eq!(api.state(a).as_deref(), Some("RUNNING"));
    assert_eq!(api.job(b)["nextRun"], "2099-01-01 00:00:00");
    ok(&server, &["fail", &a.to_string(), "--lease", &lease]);

    let answer = ok_json(
        &server,
        &[
            "requeue",
            &a.to_string(),
            &b.to_string(),
            "--name",
            "cli-requeued",
        ],
    );
    assert_eq!(answer, json!({"requeued": 2}));
    for id in [a, b] {
        let job = api.job(id);
        assert_eq!(job["state"], "QUEUED");
        assert_eq!(job["name"], "cli-requeued");
        assert_eq!(job["nextRun"], job["created"]);
    }
}

#[test]
fn list_filters_by_state_and_name() {
    let server = Server::start();
    let api = server.api();
    let x1 = api.create(json!({"name": "x1"}));
    let x2 = api.create(json!({"name": "x2"}));
    api.create(json!({"name": "x3"}));
    api.take("x3");
    api.create(json!({"name": "y1"}));
    let answer = ok_json(&server, &["list", "--state", "QUEUED", "--name", "x*"]);
    let ids: Vec<i64> = answer["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["jobID"].as_i64().expect("jobID"))
        .collect();
    assert_eq!(ids, vec![x1, x2]);
}

#[test]
fn heartbeat_renews_the_lease() {
    let server = Server::start();
    let api = server.api();
    let (id, lease) = take_with_cli(&server, "cli-heartbeat", &["--lease", "1h"]);
    let first = api.job(id)["leaseExpires"]
        .as_str()
        .expect("leaseExpires")
        .to_string();
    let answer = ok_json(&server, &["heartbeat", &id.to_string(), "--lease", &lease]);
    let renewed = answer["leaseExpires"].as_str().expect("leaseExpires");
    assert_eq!(api.job(id)["leaseExpires"], renewed);
    let first = Timestamp::parse(&first).expect("time");
    let renewed = Timestamp::parse(renewed).expect("time");
    assert!(renewed > first, "{renewed} is not later than {first}");
    assert!(
        renewed.millis() - Timestamp::now().millis() > 3_000_000,
        "about an hour from now: {renewed}"
    );

    // A wrong token is refused.
    let (code, _, stderr) = cli(&server, &["heartbeat", &id.to_string(), "--lease", "bogus"]);
    assert_eq!(code, 1, "stderr {stderr:?}");
    assert!(stderr.contains("lease_lost"), "{stderr:?}");
}

#[test]
fn data_that_is_not_json_is_a_usage_error() {
    let server = Server::start();
    let api = server.api();
    let (code, stdout, stderr) = cli(&server, &["create", "cli-bad", "--data", "{not json"]);
    assert_eq!(code, 2, "stdout {stdout:?} stderr {stderr:?}");
    assert!(stderr.contains("--data is not valid JSON"), "{stderr:?}");
    assert_eq!(job_count(&api), 0);
}

#[test]
fn a_bad_priority_shows_the_servers_message() {
    let server = Server::start();
    let api = server.api();
    let (code, stdout, stderr) = cli(&server, &["create", "cli-bad", "--priority", "3"]);
    assert_eq!(code, 1, "stdout {stdout:?} stderr {stderr:?}");
    assert!(stderr.contains("Invalid priority value"), "{stderr:?}");
    assert!(stderr.contains("invalid_priority"), "{stderr:?}");
    assert_eq!(job_count(&api), 0);
}

#[test]
fn a_non_numeric_id_is_a_usage_error() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "cli-keep"}));
    for args in [
        vec!["query", "abc"],
        vec!["delete", "1.5"],
        vec!["finish", "x"],
        vec!["update", "-1", "--data", "{}"],
    ] {
        let (code, stdout, stderr) = cli(&server, &args);
        assert_eq!(code, 2, "{args:?}: stdout {stdout:?} stderr {stderr:?}");
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
    }
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
}

#[test]
fn a_server_that_is_not_running_exits_1() {
    // A port nobody listens on: bound by us, then released.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [vec!["create", "x"], vec!["take", "*"], vec!["query", "1"]] {
        let (code, stdout, stderr) = cli_at(&url, &args);
        assert_eq!(code, 1, "{args:?}: stdout {stdout:?} stderr {stderr:?}");
        assert!(
            stderr.contains("cannot reach the job server"),
            "{args:?}: {stderr:?}"
        );
        // Why, from the error's causes, not only "error sending request".
        assert!(
            stderr.contains("Connection refused"),
            "{args:?}: {stderr:?}"
        );
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr:?}");
    }
}
