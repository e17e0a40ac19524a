//! The Bedrock text protocol on its own port, over raw sockets: every command
//! with its answer, every error line of the spec (§3) exactly, the framing of
//! §1 (escapes, bodies, pipelining, `Connection: close|forget|wait`), requests
//! cut at every byte, the seed's sample session, and hostile clients.
//!
//! Every response is read by [`Conn`], which parses the status line, the
//! headers and `Content-Length` and panics if `Content-Length` is missing, so
//! each test also checks that it is always there.

mod fuzz;
mod rules;

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::bedrock_conn::{Conn, Response};
use crate::common::*;

/// A request: the method line, the fixtures' `Token`, `Name: value`
/// headers and a blank line, with `\r\n` line ends.
fn req(method: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{method}\r\nToken: {}\r\n", token());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// A request with a `Content-Length` body (and the fixtures' `Token`).
fn req_with_body(method: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut out = format!("{method}\r\nToken: {}\r\n", token());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}

/// CreateJob over the port; returns the new id.
#[track_caller]
fn create(conn: &mut Conn, headers: &[(&str, &str)]) -> i64 {
    let answer = conn.call(&req("CreateJob", headers)).json();
    answer["jobID"]
        .as_i64()
        .unwrap_or_else(|| panic!("jobID is a number: {answer}"))
}

/// GetJob over the port; returns the job handed out.
#[track_caller]
fn get_job(conn: &mut Conn, name: &str) -> Value {
    conn.call(&req("GetJob", &[("name", name)])).json()
}

/// QueryJob over the port.
#[track_caller]
fn query(conn: &mut Conn, id: i64) -> Value {
    conn.call(&req("QueryJob", &[("jobID", &id.to_string())]))
        .json()
}

/// The server's resident memory in KiB, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// How much the server's memory may grow across one hostile case: a
/// correctness bound (memory stays bounded), far above what it should use.
const RSS_GROWTH_BOUND_KIB: u64 = 200 * 1024;

/// The server still answers: `/healthz` over HTTP, and a CreateJob and a
/// QueryJob on a fresh Bedrock connection. Nothing panicked.
#[track_caller]
fn assert_serving(server: &Server) {
    let (status, health) = server.api().get("/healthz");
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let mut conn = Conn::open(&server.bedrock);
    let id = create(&mut conn, &[("name", "still-serving")]);
    assert_eq!(query(&mut conn, id)["jobID"], json!(id));
    assert!(
        !server.stderr().contains("panicked"),
        "the server panicked:\n{}",
        server.stderr()
    );
}

/// The number of held GetJob requests, from `/healthz`.
fn waiting(api: &Api) -> i64 {
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 200);
    health["waiting"].as_i64().expect("waiting")
}

/// Seconds since the epoch of a `YYYY-MM-DD HH:MM:SS[.mmm]` UTC time.
fn epoch_secs(time: &str) -> i64 {
    let (date, clock) = time.split_once(' ').expect("date and time");
    let d: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
    let t: Vec<i64> = clock
        .split('.')
        .next()
        .unwrap()
        .split(':')
        .map(|p| p.parse().unwrap())
        .collect();
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]
}

// ----- Every command, with its success answer ---------------------------------

#[test]
fn create_get_update_query_finish_answer_json_with_numbers_and_inline_data() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);

    let created = conn.call(&req(
        "CreateJob",
        &[("name", "cmd-a"), ("data", r#"{"n":1,"s":"x"}"#)],
    ));
    let id = created.json()["jobID"].as_i64().expect("jobID is a number");
    assert_eq!(created.body, format!(r#"{{"jobID":{id}}}"#));
    assert_eq!(created.content_length(), created.body.len());

    let got = conn.call(&req("GetJob", &[("name", "cmd-a")]));
    let job = got.json();
    assert_eq!(got.content_length(), got.body.len());
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["name"], "cmd-a");
    assert_eq!(job["data"], json!({"n": 1, "s": "x"}), "data is inline");
    assert_eq!(job["priority"], json!(500), "priority is a number");
    assert!(
        got.body.contains(&format!(r#""jobID":{id}"#)),
        "{}",
        got.body
    );
    assert!(got.body.contains(r#""data":{"#), "{}", got.body);
    assert!(got.body.contains(r#""priority":500"#), "{}", got.body);
    for key in ["repeat", "nextRun", "lastRun", "created", "retryAfter"] {
        assert!(job.get(key).is_some(), "GetJob answer has {key}: {job}");
    }
    assert_eq!(
        job["lastRun"], "",
        "lastRun is the value before the hand-out"
    );

    conn.call(&req(
        "UpdateJob",
        &[("jobID", &id.to_string()), ("data", r#"{"n":2}"#)],
    ))
    .assert_empty_ok();

    let queried = conn.call(&req("QueryJob", &[("jobID", &id.to_string())]));
    let job = queried.json();
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["data"], json!({"n": 2}));
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["priority"], json!(500));
    assert_ne!(job["lastRun"], "", "lastRun is set by the hand-out");
    assert!(
        queried.body.contains(r#""data":{"n":2}"#),
        "{}",
        queried.body
    );

    conn.call(&req("FinishJob", &[("jobID", &id.to_string())]))
        .assert_empty_ok();
    // A finished job that does not repeat is deleted.
    conn.call(&req("QueryJob", &[("jobID", &id.to_string())]))
        .assert_error("404 No job with this jobID");
    assert_eq!(server.api().state(id), None);
}

#[test]
fn create_jobs_and_get_jobs_answer_lists() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);

    let answer = conn.call(&req(
        "CreateJobs",
        &[(
            "jobs",
            r#"[{"name":"batch-a","data":{"k":1}},{"name":"batch-b","jobPriority":1000}]"#,
        )],
    ));
    let ids: Vec<i64> = answer.json()["jobIDs"]
        .as_array()
        .expect("jobIDs is an array")
        .iter()
        .map(|id| id.as_i64().expect("ids are numbers"))
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(
        answer.body,
        format!(r#"{{"jobIDs":[{},{}]}}"#, ids[0], ids[1])
    );

    let answer = conn.call(&req("GetJobs", &[("name", "batch-*"), ("numResults", "5")]));
    let jobs = answer.json()["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    // Priority 1000 first.
    assert_eq!(jobs[0]["jobID"], json!(ids[1]));
    assert_eq!(jobs[0]["priority"], json!(1000));
    assert_eq!(jobs[1]["jobID"], json!(ids[0]));
    assert_eq!(jobs[1]["data"], json!({"k": 1}));
    for id in &ids {
        assert_eq!(server.api().state(*id).as_deref(), Some("RUNNING"));
    }
    // Nothing left to hand out.
    conn.call(&req("GetJobs", &[("name", "batch-*"), ("numResults", "5")]))
        .assert_error("404 No job found");
}

#[test]
fn retry_fail_and_delete_change_state() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let retried = create(&mut conn, &[("name", "rfd-retry")]);
    let failed = create(&mut conn, &[("name", "rfd-fail")]);
    get_job(&mut conn, "rfd-retry");
    get_job(&mut conn, "rfd-fail");

    conn.call(&req(
        "RetryJob",
        &[
            ("jobID", &retried.to_string()),
            ("delay", "0"),
            ("data", r#"{"tries":1}"#),
        ],
    ))
    .assert_empty_ok();
    let job = api.job(retried);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["data"], json!({"tries": 1}));
    // Queued again, it is handed out again.
    assert_eq!(get_job(&mut conn, "rfd-retry")["jobID"], json!(retried));

    conn.call(&req(
        "FailJob",
        &[("jobID", &failed.to_string()), ("data", r#"{"why":"x"}"#)],
    ))
    .assert_empty_ok();
    let job = query(&mut conn, failed);
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["data"], json!({"why": "x"}));

    conn.call(&req("DeleteJob", &[("jobID", &failed.to_string())]))
        .assert_empty_ok();
    assert_eq!(api.state(failed), None);
}

#[test]
fn cancel_job_and_requeue_jobs_change_state() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);

    // A running parent makes two children, then finishes: it pauses and the
    // children are queued.
    let parent = create(&mut conn, &[("name", "cr-parent")]);
    get_job(&mut conn, "cr-parent");
    let pid = parent.to_string();
    let first = create(&mut conn, &[("name", "cr-child"), ("parentJobID", &pid)]);
    let second = create(&mut conn, &[("name", "cr-child"), ("parentJobID", &pid)]);
    assert_eq!(api.state(first).as_deref(), Some("PAUSED"));
    conn.call(&req("FinishJob", &[("jobID", &pid)]))
        .assert_empty_ok();
    assert_eq!(api.state(parent).as_deref(), Some("PAUSED"));
    assert_eq!(api.state(first).as_deref(), Some("QUEUED"));

    conn.call(&req("CancelJob", &[("jobID", &first.to_string())]))
        .assert_empty_ok();
    assert_eq!(api.state(first).as_deref(), Some("CANCELLED"));
    assert_eq!(
        api.state(parent).as_deref(),
        Some("PAUSED"),
        "one child left"
    );
    conn.call(&req("CancelJob", &[("jobID", &second.to_string())]))
        .assert_empty_ok();
    assert_eq!(
        api.state(parent).as_deref(),
        Some("QUEUED"),
        "no child left"
    );

    // The parent runs again, told which children were cancelled.
    let resumed = get_job(&mut conn, "cr-parent");
    assert_eq!(resumed["jobID"], json!(parent));
    let cancelled: Vec<i64> = resumed["cancelledChildJobs"]
        .as_array()
        .expect("cancelledChildJobs")
        .iter()
        .map(|c| c["jobID"].as_i64().unwrap())
        .collect();
    assert_eq!(cancelled, vec![first, second]);

    // RequeueJobs does not put back running jobs, which would run twice at
    // once; once they are ended (FailJob), it does, due at once.
    let other = create(&mut conn, &[("name", "cr-other")]);
    get_job(&mut conn, "cr-other");
    let ids = format!("{parent},{other}");
    let refused = conn.call(&req("RequeueJobs", &[("jobIDs", &ids)]));
    assert!(
        refused.status.starts_with(&format!(
            "405 Cannot requeue jobs {parent}, {other}: a worker holds it"
        )),
        "{refused:?}"
    );
    assert_eq!(api.state(parent).as_deref(), Some("RUNNING"));
    assert_eq!(api.state(other).as_deref(), Some("RUNNING"));
    for id in [parent, other] {
        conn.call(&req("FailJob", &[("jobID", &id.to_string())]))
            .assert_empty_ok();
    }
    conn.call(&req("RequeueJobs", &[("jobIDs", &ids)]))
        .assert_empty_ok();
    assert_eq!(api.state(parent).as_deref(), Some("QUEUED"));
    assert_eq!(api.state(other).as_deref(), Some("QUEUED"));
    assert_eq!(get_job(&mut conn, "cr-other")["jobID"], json!(other));
}

// ----- Every error line, exactly -----------------------------------------------

#[test]
fn create_job_errors_are_exact_lines_with_empty_bodies() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let queued = create(&mut conn, &[("name", "e-queued")]);
    let parent = create(&mut conn, &[("name", "e-parent")]);
    get_job(&mut conn, "e-parent");
    let child = create(
        &mut conn,
        &[("name", "e-child"), ("parentJobID", &parent.to_string())],
    );
    let other_parent = create(&mut conn, &[("name", "e-parent-2")]);
    get_job(&mut conn, "e-parent-2");
    create(
        &mut conn,
        &[
            ("name", "e-unique-child"),
            ("unique", "true"),
            ("parentJobID", &parent.to_string()),
        ],
    );
    let before = api.get("/jobs?limit=1000").1;

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (req("CreateJob", &[]), "402 Missing name"),
        (req("CreateJob", &[("name", "")]), "402 Missing name"),
        (
            req("CreateJob", &[("name", "x"), ("jobPriority", "7")]),
            "402 Invalid priority value",
        ),
        (
            req("CreateJob", &[("name", "x"), ("priority", "high")]),
            "402 Invalid priority value",
        ),
        (
            req("CreateJob", &[("name", "x"), ("data", "[1,2]")]),
            "402 Data is not a valid JSON Object",
        ),
        (
            req("CreateJob", &[("name", "x"), ("data", "not json")]),
            "402 Data is not a valid JSON Object",
        ),
        (
            req("CreateJob", &[("name", "x"), ("repeat", "SOMETIMES")]),
            "402 Malformed repeat",
        ),
        (
            req("CreateJob", &[("name", "x"), ("repeat", "FINISHED")]),
            "402 Malformed repeat",
        ),
        (
            req("CreateJob", &[("name", "x"), ("retryAfter", "soon")]),
            "402 Malformed retryAfter",
        ),
        (
            req("CreateJob", &[("name", "x"), ("parentJobID", "999999")]),
            "404 parentJobID does not exist",
        ),
        (
            req("CreateJob", &[("name", "x"), ("parentJobID", "abc")]),
            "402 Malformed parentJobID",
        ),
        (
            req(
                "CreateJob",
                &[("name", "x"), ("parentJobID", &queued.to_string())],
            ),
            "405 Can only create child job when parent is RUNNING, RUNQUEUED or PAUSED",
        ),
        (
            req(
                "CreateJob",
                &[("name", "x"), ("parentJobID", &child.to_string())],
            ),
            "405 Cannot create grandchildren",
        ),
        (
            req(
                "CreateJob",
                &[
                    ("name", "e-unique-child"),
                    ("unique", "true"),
                    ("parentJobID", &other_parent.to_string()),
                ],
            ),
            "404 Trying to create a child that already exists, but it is tied to a different parent",
        ),
        (
            req("CreateJob", &[("name", "x"), ("firstRun", "tomorrow")]),
            "402 Malformed firstRun",
        ),
        (
            req("CreateJob", &[("name", &"n".repeat(256))]),
            "402 Malformed name",
        ),
        (
            req(
                "CreateJob",
                &[
                    ("name", "x"),
                    ("data", &format!(r#"{{"big":"{}"}}"#, "a".repeat(1 << 20))),
                ],
            ),
            "402 Data is larger than 1 MiB",
        ),
        (req("CreateJobs", &[]), "401 Invalid JSON"),
        (
            req("CreateJobs", &[("jobs", "not json")]),
            "401 Invalid JSON",
        ),
        (req("CreateJobs", &[("jobs", "[]")]), "401 Invalid JSON"),
        (req("CreateJobs", &[("jobs", "[1,2]")]), "401 Invalid JSON"),
        (
            req("CreateJobs", &[("jobs", r#"{"name":"x"}"#)]),
            "401 Invalid JSON",
        ),
        // All or nothing: one bad job refuses the batch.
        (
            req(
                "CreateJobs",
                &[("jobs", r#"[{"name":"ok-1"},{"name":"x","jobPriority":3}]"#)],
            ),
            "402 Invalid priority value",
        ),
        (
            req("CreateJobs", &[("jobs", r#"[{"name":"ok-2"},{}]"#)]),
            "401 Invalid JSON",
        ),
        (
            req(
                "CreateJobs",
                &[("jobs", r#"[{"name":"ok-3"},{"data":{}}]"#)],
            ),
            "402 Missing name",
        ),
    ];
    for (request, line) in &cases {
        let answer = conn.call(request);
        answer.assert_error(line);
    }
    assert_eq!(
        api.get("/jobs?limit=1000").1,
        before,
        "a refused CreateJob(s) changes nothing"
    );
}

#[test]
fn get_job_errors_are_exact_lines_with_empty_bodies() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (req("GetJob", &[]), "402 Missing name"),
        (req("GetJob", &[("name", "")]), "402 Missing name"),
        (
            req("GetJob", &[("name", "x"), ("numResults", "2")]),
            "402 Cannot use numResults with GetJob; try GetJobs",
        ),
        (
            req("GetJob", &[("name", "nothing-here")]),
            "404 No job found",
        ),
        (req("GetJob", &[("name", "*")]), "404 No job found"),
        (
            req("GetJob", &[("name", "x"), ("jobPriority", "3")]),
            "402 Invalid priority value",
        ),
        (req("GetJobs", &[("name", "x")]), "402 Missing numResults"),
        (req("GetJobs", &[("numResults", "2")]), "402 Missing name"),
        (
            req("GetJobs", &[("name", "x"), ("numResults", "many")]),
            "402 Malformed numResults",
        ),
        (
            req("GetJobs", &[("name", "x"), ("numResults", "3")]),
            "404 No job found",
        ),
        (
            req(
                "GetJobs",
                &[("name", "x"), ("numResults", "3"), ("jobPriority", "501")],
            ),
            "402 Invalid priority value",
        ),
    ];
    for (request, line) in &cases {
        conn.call(request).assert_error(line);
    }
}

#[test]
fn job_id_errors_are_exact_lines_for_every_command() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let commands = [
        "QueryJob",
        "UpdateJob",
        "FinishJob",
        "RetryJob",
        "FailJob",
        "DeleteJob",
        "CancelJob",
    ];
    for method in commands {
        let data: &[(&str, &str)] = &[("data", "{}")];
        let with = |id: &str| {
            let mut headers = vec![("jobID", id)];
            headers.extend_from_slice(data);
            req(method, &headers)
        };
        conn.call(&req(method, data))
            .assert_error("402 Missing jobID");
        for bad in [
            "abc",
            "042",
            "+42",
            "-1",
            "0",
            "4.2",
            "99999999999999999999",
        ] {
            conn.call(&with(bad)).assert_error("402 Malformed jobID");
        }
        conn.call(&with("987654321"))
            .assert_error("404 No job with this jobID");
    }
    conn.call(&req("UpdateJob", &[("jobID", "1")]))
        .assert_error("402 Missing data");
    conn.call(&req("RequeueJobs", &[]))
        .assert_error("402 Missing jobIDs");
    conn.call(&req("RequeueJobs", &[("jobIDs", "1,x")]))
        .assert_error("402 Malformed jobIDs");
}

#[test]
fn state_errors_are_exact_lines_and_change_nothing() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let queued = create(&mut conn, &[("name", "s-queued")]);
    let running = create(&mut conn, &[("name", "s-running")]);
    get_job(&mut conn, "s-running");
    let parent = create(&mut conn, &[("name", "s-parent")]);
    get_job(&mut conn, "s-parent");
    let child = create(
        &mut conn,
        &[("name", "s-child"), ("parentJobID", &parent.to_string())],
    );
    conn.call(&req("FinishJob", &[("jobID", &parent.to_string())]))
        .assert_empty_ok();
    // A child running while its parent is no longer paused.
    let lone_parent = create(&mut conn, &[("name", "s-lone-parent")]);
    get_job(&mut conn, "s-lone-parent");
    let lone_child = create(
        &mut conn,
        &[
            ("name", "s-lone-child"),
            ("parentJobID", &lone_parent.to_string()),
        ],
    );
    conn.call(&req("FinishJob", &[("jobID", &lone_parent.to_string())]))
        .assert_empty_ok();
    get_job(&mut conn, "s-lone-child");
    conn.call(&req("RequeueJobs", &[("jobIDs", &lone_parent.to_string())]))
        .assert_empty_ok();
    let before = api.get("/jobs?limit=1000").1;

    let q = queued.to_string();
    let r = running.to_string();
    let p = parent.to_string();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            req("FinishJob", &[("jobID", &q)]),
            "405 Can only retry/finish RUNNING and RUNQUEUED jobs",
        ),
        (
            req("RetryJob", &[("jobID", &q)]),
            "405 Can only retry/finish RUNNING and RUNQUEUED jobs",
        ),
        (
            req("RetryJob", &[("jobID", &r), ("delay", "-5")]),
            "402 Must specify a non-negative delay when retrying",
        ),
        (
            req("RetryJob", &[("jobID", &r), ("delay", "soon")]),
            "402 Must specify a non-negative delay when retrying",
        ),
        (
            req("FailJob", &[("jobID", &q)]),
            "405 Can only fail RUNNING or RUNQUEUED jobs",
        ),
        (
            req("FailJob", &[("jobID", &p)]),
            "405 Can only fail RUNNING or RUNQUEUED jobs",
        ),
        (
            req("DeleteJob", &[("jobID", &r)]),
            "405 Can't delete a RUNNING job",
        ),
        (
            req("DeleteJob", &[("jobID", &p)]),
            "405 Can't delete a parent jobs with children running",
        ),
        (
            req("CancelJob", &[("jobID", &p)]),
            "404 Invalid jobID - Cannot cancel a job with children",
        ),
        (
            req("CancelJob", &[("jobID", &q)]),
            "404 Invalid jobID - Cannot cancel a job without a parent",
        ),
        (
            req("FinishJob", &[("jobID", &lone_child.to_string())]),
            "405 Can only retry/finish child job when parent is PAUSED",
        ),
        (
            req("UpdateJob", &[("jobID", &r), ("data", "[]")]),
            "402 Data is not a valid JSON Object",
        ),
        (
            req(
                "UpdateJob",
                &[("jobID", &r), ("data", "{}"), ("repeat", "EVERY DAY")],
            ),
            "402 Malformed repeat",
        ),
        (
            req(
                "UpdateJob",
                &[("jobID", &r), ("data", "{}"), ("jobPriority", "1")],
            ),
            "402 Invalid priority value",
        ),
    ];
    for (request, line) in &cases {
        conn.call(request).assert_error(line);
    }
    assert_eq!(
        api.get("/jobs?limit=1000").1,
        before,
        "a refused command changes nothing"
    );
    assert_eq!(api.state(child).as_deref(), Some("QUEUED"));
}

#[test]
fn unknown_methods_answer_430_and_keep_the_connection() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    for method in [
        "Frobnicate",
        "Query: SELECT * FROM jobs;",
        // (An HTTP method line is refused and closed instead: see
        // bedrock_limits.rs.)
        "Status",
        "\u{7f}\u{1}",
    ] {
        conn.call(&req(method, &[]))
            .assert_error("430 Unrecognized command");
    }
    // Still open and serving.
    conn.call(&req("GetJob", &[("name", "x")]))
        .assert_error("404 No job found");
}

/// A request without the fixtures' token: the method line, headers, and a
/// blank line.
fn req_without_token(method: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{method}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

#[test]
fn token_is_required_on_every_address_loopback_included() {
    // Listening on all interfaces, the port asks for the server's token.
    // (Started by hand: the shared harness always binds 127.0.0.1.)
    let dir = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(bin())
        .args(["server", "--db"])
        .arg(dir.path().join("jobs.db"))
        .args(["--http", "127.0.0.1:0", "--bedrock", "0.0.0.0:0"])
        .args(["--token", "s3cret"])
        .env_remove("JOBMGR_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn jobmgr server");
    let mut server = ChildGuard::new(child, "the server on 0.0.0.0");
    let ready = ready_line(server.child())
        .unwrap_or_else(|e| panic!("no ready line from the server on 0.0.0.0: {e}"));
    let field = |key: &str| {
        ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {ready:?}"))
            .to_string()
    };
    let port = field("bedrock=").rsplit(':').next().unwrap().to_string();
    let addr = format!("127.0.0.1:{port}");
    let api = Api::new(&field("http=")).with_token("s3cret");
    // Without it, or with a wrong one: refused and closed, nothing runs.
    for token in [None, Some("wrong"), Some("")] {
        let mut conn = Conn::open(&addr);
        let mut headers = vec![("name", "needs-token")];
        if let Some(token) = token {
            headers.push(("Token", token));
        }
        conn.call(&req_without_token("CreateJob", &headers))
            .assert_error("401 Unauthorized: send the server's token in a Token header");
        conn.assert_closed();
    }
    let (_, list) = api.get("/jobs?name=needs-token");
    assert_eq!(list["jobs"], json!([]), "a refused request ran");
    // With it, served as usual.
    let mut conn = Conn::open(&addr);
    let id = create(&mut conn, &[("name", "needs-token"), ("token", "s3cret")]);
    assert_eq!(api.job(id)["name"], "needs-token");

    // On loopback too: a worker is a local user, so loopback is no
    // credential.
    let local = Server::start();
    let mut conn = Conn::open(&local.bedrock);
    conn.call(&req_without_token("CreateJob", &[("name", "no-token")]))
        .assert_error("401 Unauthorized: send the server's token in a Token header");
    conn.assert_closed();
    // `Connection: forget` is no way around it: refused, and not run.
    let mut conn = Conn::open(&local.bedrock);
    conn.call(&req_without_token(
        "CreateJob",
        &[("name", "no-token"), ("Connection", "forget")],
    ))
    .assert_error("401 Unauthorized: send the server's token in a Token header");
    conn.assert_closed();
    let (_, list) = local.api().get("/jobs?name=no-token");
    assert_eq!(list["jobs"], json!([]), "a refused request ran");
    let mut conn = Conn::open(&local.bedrock);
    let id = create(&mut conn, &[("name", "with-token")]);
    assert_eq!(query(&mut conn, id)["name"], "with-token");
}

// ----- Framing ------------------------------------------------------------------

#[test]
fn method_line_tail_and_case_are_ignored() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let id = conn
        .call(&with_token_header(
            b"cReAtEjOb / HTTP/1.1\r\nNAME: tail-case\r\nDaTa: {\"a\":1}\r\n\r\n",
        ))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let job = conn
        .call(&with_token_header(
            format!("QUERYJOB anything at all\r\nJOBID: {id}\r\n\r\n").as_bytes(),
        ))
        .json();
    assert_eq!(job["name"], "tail-case");
    assert_eq!(job["data"], json!({"a": 1}));
    let job = conn
        .call(&with_token_header(
            b"getjob / HTTP/1.1\r\nnAmE: tail-case\r\n\r\n",
        ))
        .json();
    assert_eq!(job["jobID"], json!(id));
}

#[test]
fn bare_newlines_and_crlf_are_both_accepted() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let a = conn
        .call(&with_token_header(
            b"CreateJob\nname: lf-only\ndata: {\"x\":1}\n\n",
        ))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    // Mixed in one request.
    let b = conn
        .call(&with_token_header(
            b"CreateJob\r\nname: mixed\ndata: {\"x\":2}\r\n\n",
        ))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let job = conn
        .call(&with_token_header(
            format!("QueryJob\njobID: {a}\n\n").as_bytes(),
        ))
        .json();
    assert_eq!(
        (&job["name"], &job["data"]),
        (&json!("lf-only"), &json!({"x": 1}))
    );
    let job = conn
        .call(&with_token_header(
            format!("QueryJob\r\njobID: {b}\r\n\r\n").as_bytes(),
        ))
        .json();
    assert_eq!(
        (&job["name"], &job["data"]),
        (&json!("mixed"), &json!({"x": 2}))
    );
    // A line of spaces ends the headers too (as in the seed's session).
    let c = conn
        .call(&with_token_header(
            b"CreateJob\nname: spaces-end\n       \n",
        ))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    assert_eq!(query(&mut conn, c)["name"], "spaces-end");
}

#[test]
fn later_duplicate_header_wins_and_values_are_trimmed() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let id = create(
        &mut conn,
        &[
            ("name", "first"),
            ("data", r#"{"v":1}"#),
            ("NAME", "  second  "),
            ("Data", r#"{"v":2}"#),
        ],
    );
    let job = query(&mut conn, id);
    assert_eq!(job["name"], "second");
    assert_eq!(job["data"], json!({"v": 2}));
}

#[test]
fn header_escapes_are_undone_in_name_and_repeat() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let id = create(
        &mut conn,
        &[
            ("name", r"space\u0020here\\back\u00e9\u263a"),
            ("repeat", r"finished,\u0020+1\u0020hour"),
        ],
    );
    let job = server.api().job(id);
    assert_eq!(job["name"], "space here\\backé☺");
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR");
    // The name matches when asked for with the same escapes, and the answer
    // carries it as a JSON string.
    let got = get_job(&mut conn, r"space\u0020here\\back\u00e9\u263a");
    assert_eq!(got["jobID"], json!(id));
    assert_eq!(got["name"], "space here\\backé☺");
    // `\t` and `\n` are undone too, into control characters a name may not
    // hold (log_hygiene.rs has the rest).
    conn.call(&req("CreateJob", &[("name", r"tab\there\nline")]))
        .assert_error(
            "402 Malformed name: control characters (newline, tab, escape, ...) are not allowed",
        );
    // An escaped character stands for itself, as in Bedrock; an incomplete
    // \u escape is kept as written.
    let kept = create(&mut conn, &[("name", r"\q\uZZ\u12")]);
    assert_eq!(server.api().job(kept)["name"], r"q\uZZ\u12");
}

#[test]
fn json_data_keeps_its_own_escapes_and_round_trips() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let data = r#"{"m":"a\nb","q":"say \"hi\"","t":"x\ty","b":"back\\slash","u":"\u00e9"}"#;
    let expected: Value = serde_json::from_str(data).unwrap();
    assert_eq!(expected["m"], "a\nb");
    let id = create(&mut conn, &[("name", "json-escapes"), ("data", data)]);
    assert_eq!(query(&mut conn, id)["data"], expected);
    assert_eq!(server.api().job(id)["data"], expected);
    let got = conn.call(&req("GetJob", &[("name", "json-escapes")]));
    assert_eq!(got.json()["data"], expected, "body: {}", got.body);
    // UpdateJob and FinishJob data keep theirs too.
    let update = r#"{"m":"c\nd\\"}"#;
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &id.to_string()), ("data", update)],
    ))
    .assert_empty_ok();
    assert_eq!(query(&mut conn, id)["data"], json!({"m": "c\nd\\"}));
    // Data written with header escapes only (not JSON as sent) is unescaped
    // first, then read as JSON.
    let escaped = create(
        &mut conn,
        &[("name", "json-unescaped"), ("data", r#"{\t"k":1}"#)],
    );
    assert_eq!(query(&mut conn, escaped)["data"], json!({"k": 1}));
}

#[test]
fn json_body_supplies_parameters_missing_from_headers() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let body = r#"{"name":"from-body","data":{"x":1,"m":"a\nb"},"jobPriority":750}"#;
    let id = conn.call(&req_with_body("CreateJob", &[], body)).json()["jobID"]
        .as_i64()
        .unwrap();
    let job = query(&mut conn, id);
    assert_eq!(job["name"], "from-body");
    assert_eq!(job["data"], json!({"x": 1, "m": "a\nb"}));
    assert_eq!(job["priority"], json!(750));
    // A header wins over the body.
    let id2 = conn
        .call(&req_with_body(
            "CreateJob",
            &[("name", "from-header")],
            r#"{"name":"from-body-2","data":{"y":2}}"#,
        ))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let job = query(&mut conn, id2);
    assert_eq!(job["name"], "from-header");
    assert_eq!(job["data"], json!({"y": 2}));
    // Numbers in the body work for ids; a body that is not a JSON object
    // supplies nothing.
    let job = conn
        .call(&req_with_body(
            "QueryJob",
            &[],
            &format!(r#"{{"jobID":{id}}}"#),
        ))
        .json();
    assert_eq!(job["jobID"], json!(id));
    conn.call(&req_with_body("QueryJob", &[], &format!("[{id}]")))
        .assert_error("402 Missing jobID");
    conn.call(&req_with_body("CreateJob", &[], "name: x"))
        .assert_error("402 Missing name");
}

#[test]
fn pipelined_requests_in_one_write_are_answered_in_order() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let mut bytes = Vec::new();
    bytes.extend(req(
        "CreateJob",
        &[("name", "pipe-a"), ("data", r#"{"i":1}"#)],
    ));
    bytes.extend(req_with_body(
        "CreateJob",
        &[],
        r#"{"name":"pipe-b","data":{"i":2}}"#,
    ));
    bytes.extend(b"\r\n\r\n"); // blank lines between requests are skipped
    bytes.extend(req("GetJob", &[("name", "pipe-b")]));
    bytes.extend(with_token_header(b"GetJob\nname: pipe-a\n\n"));
    bytes.extend(req("GetJob", &[("name", "pipe-*")]));
    bytes.extend(req("Frobnicate", &[]));
    bytes.extend(req("QueryJob", &[("jobID", "987654321")]));
    bytes.extend(req("GetJobs", &[("name", "pipe-*"), ("numResults", "2")]));
    conn.send(&bytes);
    let answers = conn.responses(8);
    let a = answers[0].json()["jobID"].as_i64().unwrap();
    let b = answers[1].json()["jobID"].as_i64().unwrap();
    assert_eq!(answers[2].json()["jobID"], json!(b));
    assert_eq!(answers[2].json()["data"], json!({"i": 2}));
    assert_eq!(answers[3].json()["jobID"], json!(a));
    answers[4].assert_error("404 No job found");
    answers[5].assert_error("430 Unrecognized command");
    answers[6].assert_error("404 No job with this jobID");
    answers[7].assert_error("404 No job found");
}

#[test]
fn persistent_connection_serves_many_requests() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(create(
            &mut conn,
            &[("name", "persist"), ("data", &format!(r#"{{"i":{i}}}"#))],
        ));
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(query(&mut conn, *id)["data"], json!({"i": i}));
    }
}

#[test]
fn connection_close_is_answered_then_closed() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let id = create(&mut conn, &[("name", "close-me")]);
    // A request after the closing one, in the same write, is not answered.
    let mut bytes = req(
        "QueryJob",
        &[("jobID", &id.to_string()), ("Connection", "close")],
    );
    bytes.extend(req("CreateJob", &[("name", "after-close")]));
    conn.send(&bytes);
    assert_eq!(conn.read_response().json()["jobID"], json!(id));
    conn.assert_closed();
    let (_, list) = server.api().get("/jobs?name=after-close");
    assert_eq!(list["jobs"], json!([]), "nothing after the close ran");
    // Case-insensitive value; errors close too.
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&req(
        "QueryJob",
        &[("jobID", "987654321"), ("connection", "CLOSE")],
    ))
    .assert_error("404 No job with this jobID");
    conn.assert_closed();
}

#[test]
fn connection_forget_answers_202_closes_and_still_runs_the_command() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let answer = conn.call(&req(
        "CreateJob",
        &[
            ("name", "forgotten"),
            ("data", r#"{"f":1}"#),
            ("Connection", "forget"),
        ],
    ));
    answer.assert_queued_202();
    conn.assert_closed();
    let job = poll("the forgotten CreateJob to create its job", || {
        let (_, list) = api.get("/jobs?name=forgotten");
        list["jobs"].as_array().and_then(|j| j.first().cloned())
    });
    assert_eq!(job["data"], json!({"f": 1}));
    assert_eq!(job["state"], "QUEUED");

    // A forgotten UpdateJob updates.
    let id = job["jobID"].as_i64().unwrap();
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&req(
        "UpdateJob",
        &[
            ("jobID", &id.to_string()),
            ("data", r#"{"f":2}"#),
            ("connection", "Forget"),
        ],
    ))
    .assert_queued_202();
    conn.assert_closed();
    poll("the forgotten UpdateJob to update", || {
        (api.job(id)["data"] == json!({"f": 2})).then_some(())
    });
}

#[test]
fn forgotten_get_job_hands_nothing_out() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let id = create(&mut conn, &[("name", "forget-get")]);
    for method in ["GetJob", "GetJobs"] {
        let mut conn = Conn::open(&server.bedrock);
        let mut headers = vec![("name", "forget-get"), ("Connection", "forget")];
        if method == "GetJobs" {
            headers.push(("numResults", "5"));
        }
        conn.call(&req(method, &headers)).assert_queued_202();
        conn.assert_closed();
    }
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["attempts"], json!(0));
    assert_eq!(job["lastRun"], "");
    // It is still there for a worker that can take it.
    let got = get_job(&mut conn, "forget-get");
    assert_eq!(got["jobID"], json!(id));
    assert_eq!(api.job(id)["attempts"], json!(1));
}

#[test]
fn request_split_at_every_byte_gets_the_same_answer() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let id = create(
        &mut conn,
        &[("name", "split"), ("data", r#"{"m":"a\nb","n":[1,2]}"#)],
    );
    get_job(&mut conn, "split");
    let body = format!(r#"{{"jobID":{id}}}"#);
    let requests = [
        // Headers with escapes, a body that supplies the id, CRLF.
        format!(
            "QueryJob / HTTP/1.1\r\nX-Note: tab\\there\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        // Bare newlines, leading blank lines, header only.
        format!("\n\r\nqueryjob\nJOBID:  {id} \n\n"),
        // An error answer.
        "GetJob\r\nname: nothing-here\r\n\r\n".to_string(),
    ];
    for request in &requests {
        let bytes = &with_token_header(request.as_bytes());
        let whole = Conn::open(&server.bedrock).call(bytes);
        assert!(whole.code() == 200 || whole.code() == 404, "{whole:?}");
        for k in 1..bytes.len() {
            let mut conn = Conn::open(&server.bedrock);
            conn.send(&bytes[..k]);
            conn.assert_quiet(Duration::from_millis(5));
            conn.send(&bytes[k..]);
            let answer = conn.read_response();
            assert_eq!(answer, whole, "split after {k} bytes of {request:?}");
        }
    }
}

// ----- Connection: wait ---------------------------------------------------------

#[test]
fn waiting_get_job_returns_a_job_created_later() {
    let server = Server::start();
    let api = server.api();
    // As in the seed: lower-case header names, then a CreateJob from another
    // connection ended by a line of spaces.
    let mut worker = Conn::open(&server.bedrock);
    worker.send(&with_token_header(
        b"GetJob\nname: SendEmail\nconnection: wait\ntimeout: 60000\n\n",
    ));
    poll("the GetJob to wait", || (waiting(&api) == 1).then_some(()));
    let mut other = Conn::open(&server.bedrock);
    let id = other
        .call(&with_token_header(b"CreateJob\nname: SendEmail\n       \n"))
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let job = worker.read_response().json();
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["name"], "SendEmail");
    assert_eq!(job["data"], json!({}));
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    assert_eq!(waiting(&api), 0);

    // GetJobs waits too, and the connection stays usable after a wait.
    worker.send(&req(
        "GetJobs",
        &[
            ("name", "SendEmail"),
            ("numResults", "3"),
            ("Connection", "wait"),
            ("Timeout", "60000"),
        ],
    ));
    poll("the GetJobs to wait", || (waiting(&api) == 1).then_some(()));
    let id2 = create(&mut other, &[("name", "SendEmail")]);
    let jobs = worker.read_response().json()["jobs"].clone();
    assert_eq!(jobs[0]["jobID"], json!(id2));
    assert_eq!(query(&mut worker, id2)["state"], "RUNNING");
}

#[test]
fn waiting_get_job_times_out_with_no_job_found() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    let started = Instant::now();
    let answer = conn.call(&req(
        "GetJob",
        &[
            ("name", "never"),
            ("Connection", "wait"),
            ("Timeout", "300"),
        ],
    ));
    answer.assert_error("404 No job found");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "held until the timeout, not answered at once"
    );
    // A job that is not due does not end the wait early.
    create(
        &mut conn,
        &[("name", "never"), ("firstRun", "2099-01-01 00:00:00")],
    );
    conn.call(&req(
        "GetJob",
        &[
            ("name", "never"),
            ("Connection", "wait"),
            ("Timeout", "200"),
        ],
    ))
    .assert_error("404 No job found");
}

#[test]
fn waiting_client_that_hangs_up_is_never_handed_the_job() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    conn.send(&req(
        "GetJob",
        &[
            ("name", "hangup"),
            ("Connection", "wait"),
            ("Timeout", "60000"),
        ],
    ));
    poll("the GetJob to wait", || (waiting(&api) == 1).then_some(()));
    drop(conn);
    poll("the waiter to go away", || {
        (waiting(&api) == 0).then_some(())
    });

    let mut other = Conn::open(&server.bedrock);
    let id = create(&mut other, &[("name", "hangup")]);
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["attempts"], json!(0));
    // It is there for the next worker.
    assert_eq!(get_job(&mut other, "hangup")["jobID"], json!(id));
}

// ----- The seed's sample session ------------------------------------------------

/// The session of seed 000, typed as into `nc` (bare newlines), step by step.
/// Takes a minute of wall time: the job repeats one minute after it finished.
#[test]
fn seed_sample_session_runs_as_written() {
    let server = Server::start();
    let api = server.api();
    let mut nc = Conn::open(&server.bedrock);

    let created = nc.call(&with_token_header(
        b"CreateJob\nname: CheckLiveness\ndata: {\"url\":\"http://bedrockdb.com\"}\nrepeat: finished, +1 minute\n\n",
    ));
    let id = created.json()["jobID"].as_i64().expect("jobID");
    assert_eq!(created.body, format!(r#"{{"jobID":{id}}}"#));

    let job = nc
        .call(&with_token_header(b"GetJob\nname: CheckLiveness\n\n"))
        .json();
    assert_eq!(job["data"], json!({"url": "http://bedrockdb.com"}));
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["name"], "CheckLiveness");

    nc.call(&with_token_header(
        format!(
            "UpdateJob\njobID: {id}\ndata: {{\"url\":\"http://bedrockdb.com\",\"status\":\"CHECKING\"}}\n\n"
        )
        .as_bytes(),
    ))
    .assert_empty_ok();

    let job = nc
        .call(&with_token_header(
            format!("QueryJob\njobID: {id}\n\n").as_bytes(),
        ))
        .json();
    assert_eq!(
        job["data"],
        json!({"url": "http://bedrockdb.com", "status": "CHECKING"})
    );
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["name"], "CheckLiveness");
    assert_eq!(job["repeat"], "FINISHED, +1 MINUTE");
    assert_eq!(job["state"], "RUNNING");
    let last_run = job["lastRun"].as_str().expect("lastRun").to_string();
    assert!(!last_run.is_empty());
    assert!(job["created"].as_str().is_some_and(|c| c.len() == 19));

    nc.call(&with_token_header(
        format!(
            "FinishJob\njobID: {id}\ndata: {{\"url\":\"http://bedrockdb.com\",\"failCount\":1}}\n\n"
        )
        .as_bytes(),
    ))
    .assert_empty_ok();

    nc.call(&with_token_header(b"GetJob\nname: *\n\n"))
        .assert_error("404 No job found");

    // The seed's `Query: SELECT * FROM jobs;` is a Bedrock core command this
    // server does not have; the job is checked over HTTP instead.
    nc.call(&with_token_header(b"Query: SELECT * FROM jobs;\n\n"))
        .assert_error("430 Unrecognized command");
    let stored = api.job(id);
    assert_eq!(stored["state"], "QUEUED");
    assert_eq!(
        stored["data"],
        json!({"url": "http://bedrockdb.com", "failCount": 1})
    );
    assert_eq!(stored["repeat"], "FINISHED, +1 MINUTE");
    let next_run = stored["nextRun"].as_str().unwrap().to_string();
    let gap = epoch_secs(&next_run) - epoch_secs(&last_run);
    assert!(
        (60..120).contains(&gap),
        "nextRun {next_run} is a minute after the finish (lastRun {last_run})"
    );

    // Once the minute has passed, a waiting GetJob gets the job with the
    // data from the finish.
    nc.stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let job = nc
        .call(&with_token_header(
            b"GetJob\nname: *\nConnection: wait\nTimeout: 90000\n\n",
        ))
        .json();
    assert_eq!(
        job["data"],
        json!({"url": "http://bedrockdb.com", "failCount": 1})
    );
    assert_eq!(job["jobID"], json!(id));
    assert_eq!(job["name"], "CheckLiveness");
    assert_eq!(job["nextRun"], json!(next_run), "handed out at its nextRun");
    let now = api.job(id);
    assert_eq!(now["state"], "RUNNING");
    assert!(
        epoch_secs(now["lastRun"].as_str().unwrap()) >= epoch_secs(&next_run),
        "not handed out before its minute passed: {now}"
    );
}

// ----- Hostile clients ----------------------------------------------------------

/// A server whose time limits end hostile connections in seconds.
fn hostile_server() -> Server {
    Server::builder()
        .arg("--bedrock-request-timeout")
        .arg("2s")
        .arg("--bedrock-idle-timeout")
        .arg("2s")
        .start()
}

/// Reads every response until the server closes the connection.
fn responses_until_closed(conn: &mut Conn) -> Vec<Response> {
    let mut out = Vec::new();
    while let Some(response) = conn.next_response() {
        out.push(response);
    }
    out
}

/// Pseudo-random bytes from a fixed seed (xorshift), so failures repeat.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// The start of a TLS 1.2 ClientHello, as a TLS client sends it first.
fn tls_client_hello() -> Vec<u8> {
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ];
    hello.extend(random_bytes(7, 32)); // random
    hello.extend([0x00, 0x00, 0x20, 0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e]);
    hello.extend([0x01, 0x00, 0x00, 0x58, 0x00, 0x00, 0x00, 0x0e]);
    hello.extend(b"\x00\x0c\x00\x00\x09localhost");
    hello
}

#[test]
fn garbage_bytes_get_an_error_status_or_a_close() {
    let server = hostile_server();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("TLS ClientHello", tls_client_hello()),
        ("NUL bytes", vec![0u8; 4096]),
        (
            "HTTP request",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        (
            "invalid UTF-8",
            b"\xc3\x28CreateJob\r\nname: \xa0\xa1\r\n\r\n".to_vec(),
        ),
    ];
    for seed in 1..=8u64 {
        let mut bytes = random_bytes(seed, 4096);
        if seed % 2 == 0 {
            bytes.extend(b"\r\n\r\n");
        }
        cases.push(("random bytes", bytes));
    }
    // Each case ends when the server closes the connection (at the latest
    // after its 2 s limits); they run side by side.
    std::thread::scope(|scope| {
        for (what, bytes) in &cases {
            let server = &server;
            scope.spawn(move || {
                let mut conn = Conn::open(&server.bedrock);
                // The server may close while we still write; that is a fine
                // answer too.
                let _ = conn.stream.write_all(bytes);
                let answers = responses_until_closed(&mut conn);
                // 401: bytes that parse as a request, without the token.
                for answer in &answers {
                    assert!(
                        [400, 401, 408, 413, 430].contains(&answer.code()),
                        "{what}: unexpected answer {answer:?}"
                    );
                    assert_eq!(answer.body, "", "{what}");
                }
                assert_serving(server);
            });
        }
    });
    // An HTTP request, and text that is not UTF-8, are refused and the
    // connection closed (tests/integration/bedrock_limits.rs has more).
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&with_token_header(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
        .assert_error("400 HTTP request on the Bedrock port: send HTTP to the HTTP port");
    conn.assert_closed();
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&with_token_header(
        b"\xc3\x28CreateJob\r\nname: \xa0\xa1\r\n\r\n",
    ))
    .assert_error("400 Request is not valid UTF-8");
    conn.assert_closed();
    let (_, list) = server.api().get("/jobs?limit=1000");
    let names: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| *n == "still-serving"),
        "garbage created jobs: {names:?}"
    );
}

#[test]
fn endless_header_line_gets_413_and_close_with_bounded_memory() {
    let server = Server::start();
    assert_serving(&server);
    let before = rss_kib(server.pid());
    let mut conn = Conn::open(&server.bedrock);
    let mut writer = conn.stream.try_clone().unwrap();
    // Write from a thread: the server stops reading once it has refused.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(b"CreateJob\r\nname: ");
        let chunk = vec![b'a'; 64 * 1024];
        let mut sent = 0usize;
        while sent < 3 * 1024 * 1024 + 1 {
            if writer.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
    });
    conn.read_response().assert_error("413 Request too large");
    conn.assert_closed();
    sender.join().unwrap();
    let after = rss_kib(server.pid());
    assert!(
        after < before + RSS_GROWTH_BOUND_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert_serving(&server);
}

/// Blank lines between requests are skipped; 3 MiB of them (more than any
/// request may be) must not crash the server or grow its memory, and what
/// follows is either refused like any oversize request or answered. (That
/// the parser holds them all, against its size limit, is caught by
/// `fuzz::blank_lines_*`; at the socket it shows only as time spent.)
#[test]
fn endless_blank_lines_leave_the_server_serving_with_bounded_memory() {
    let server = Server::start();
    assert_serving(&server);
    let before = rss_kib(server.pid());
    let mut conn = Conn::open(&server.bedrock);
    let mut writer = conn.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let chunk = b"\r\n".repeat(32 * 1024);
        let mut sent = 0usize;
        while sent < 3 * 1024 * 1024 + 1 {
            if writer.write_all(&chunk).is_err() {
                return false;
            }
            sent += chunk.len();
        }
        writer
            .write_all(&req("GetJob", &[("name", "after-blank-lines")]))
            .is_ok()
    });
    // Either refused like any oversize request, or the blank lines are
    // skipped and the request after them is answered.
    let answer = conn.read_response();
    match answer.code() {
        413 => {
            answer.assert_error("413 Request too large");
            conn.assert_closed();
        }
        _ => answer.assert_error("404 No job found"),
    }
    sender.join().unwrap();
    let after = rss_kib(server.pid());
    assert!(
        after < before + RSS_GROWTH_BOUND_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert_serving(&server);
}

#[test]
fn huge_content_length_gets_413_and_close() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&with_token_header(
        b"CreateJob\r\nname: x\r\nContent-Length: 99999999999\r\n\r\n",
    ))
    .assert_error("413 Request too large");
    conn.assert_closed();
    // Beyond u64 too.
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&with_token_header(
        b"CreateJob\r\nContent-Length: 184467440737095516160\r\n\r\n",
    ))
    .assert_error_one_of(&["413 Request too large", "400 Malformed Content-Length"]);
    conn.assert_closed();
    // A large body within the limit is read and used.
    let mut conn = Conn::open(&server.bedrock);
    let big = format!(
        r#"{{"name":"big-body","data":{{"pad":"{}"}}}}"#,
        "p".repeat(900 * 1024)
    );
    let id = conn.call(&req_with_body("CreateJob", &[], &big)).json()["jobID"]
        .as_i64()
        .unwrap();
    assert_eq!(server.api().job(id)["name"], "big-body");
    assert_serving(&server);
}

#[test]
fn malformed_content_length_and_header_lines_get_400_and_close() {
    let server = Server::start();
    for (bytes, line) in [
        (
            &b"CreateJob\r\nname: x\r\nContent-Length: abc\r\n\r\n"[..],
            "400 Malformed Content-Length",
        ),
        (
            &b"CreateJob\r\nContent-Length: -1\r\n\r\n"[..],
            "400 Malformed Content-Length",
        ),
        (
            &b"CreateJob\r\nthis line has no colon\r\n\r\n"[..],
            "400 Malformed header line",
        ),
    ] {
        let mut conn = Conn::open(&server.bedrock);
        conn.call(bytes).assert_error(line);
        conn.assert_closed();
    }
    let (_, list) = server.api().get("/jobs");
    assert_eq!(list["jobs"], json!([]), "nothing was created");
    assert_serving(&server);
}

#[test]
fn silent_client_gets_408_and_close() {
    let server = Server::builder()
        .arg("--bedrock-request-timeout")
        .arg("2s")
        .start();
    // One byte, then nothing.
    let mut conn = Conn::open(&server.bedrock);
    conn.send(b"G");
    conn.read_response().assert_error("408 Request timeout");
    conn.assert_closed();
    // Half a request, then nothing.
    let mut conn = Conn::open(&server.bedrock);
    conn.send(b"CreateJob\r\nname: slow\r\n");
    conn.read_response().assert_error("408 Request timeout");
    conn.assert_closed();
    let (_, list) = server.api().get("/jobs?name=slow");
    assert_eq!(list["jobs"], json!([]), "the partial request did not run");
    // A body that never comes.
    let mut conn = Conn::open(&server.bedrock);
    conn.send(b"CreateJob\r\nContent-Length: 10\r\n\r\n{\"na");
    conn.read_response().assert_error("408 Request timeout");
    conn.assert_closed();
    assert_serving(&server);
}

#[test]
fn idle_connection_is_closed() {
    let server = Server::builder()
        .arg("--bedrock-idle-timeout")
        .arg("2s")
        .start();
    // Never says anything.
    let mut silent = Conn::open(&server.bedrock);
    // Makes one request, then says nothing more.
    let mut done = Conn::open(&server.bedrock);
    create(&mut done, &[("name", "idle")]);
    silent.assert_closed();
    done.assert_closed();
    assert_serving(&server);
}

/// A Bedrock connection that the server accepted (not refused with 503),
/// once one is free.
fn served_conn(server: &Server) -> Conn {
    poll("a Bedrock connection to be served", || {
        let mut conn = Conn::open(&server.bedrock);
        conn.stream
            .write_all(&req("GetJob", &[("name", "flood")]))
            .ok()?;
        let answer = conn.next_response()?;
        if answer.code() == 503 {
            return None;
        }
        answer.assert_error("404 No job found");
        Some(conn)
    })
}

#[test]
fn connection_flood_gets_503_and_the_port_serves_again() {
    let server = Server::builder()
        .arg("--bedrock-max-connections")
        .arg("20")
        .start();
    let before = rss_kib(server.pid());

    // Twenty connections, each known to be served.
    let mut held: Vec<Conn> = (0..20).map(|_| served_conn(&server)).collect();
    // Twenty more are refused at once.
    for _ in 0..20 {
        let mut conn = Conn::open(&server.bedrock);
        conn.read_response()
            .assert_error("503 Too many connections");
        conn.assert_closed();
    }
    // The held ones still work.
    for conn in &mut held {
        conn.call(&req("GetJob", &[("name", "flood")]))
            .assert_error("404 No job found");
    }
    let during = rss_kib(server.pid());
    drop(held);

    // Once they are gone, the port serves again: twenty at once, and then
    // the ordinary checks.
    poll("twenty connections to be served again", || {
        let mut again = Vec::new();
        for _ in 0..20 {
            let mut conn = Conn::open(&server.bedrock);
            conn.stream
                .write_all(&req("GetJob", &[("name", "flood")]))
                .ok()?;
            let answer = conn.next_response()?;
            if answer.code() == 503 {
                return None;
            }
            answer.assert_error("404 No job found");
            again.push(conn);
        }
        Some(())
    });
    let mut conn = served_conn(&server);
    let id = create(&mut conn, &[("name", "after-flood")]);
    assert_eq!(query(&mut conn, id)["name"], "after-flood");
    let (status, _) = server.api().get("/healthz");
    assert_eq!(status, 200);
    let after = rss_kib(server.pid());
    assert!(
        during.max(after) < before + RSS_GROWTH_BOUND_KIB,
        "RSS grew from {before} KiB to {during} / {after} KiB"
    );
    assert!(!server.stderr().contains("panicked"));
}

#[test]
fn json_headers_escaped_as_bedrock_php_sends_them_read_as_bedrock_reads_them() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    // Bedrock-PHP sends `addcslashes(json_encode($data), '\\')`, and Bedrock
    // unescapes every header: a slash, non-ASCII text, a line break, a
    // backslash and a quote come back as they were.
    let want = json!({"name": "env/Renamed", "text": "café", "lines": "a\nb",
        "path": "C:\\dir", "quote": "say \"hi\""});
    let php_json = r#"{"name":"env\/Renamed","text":"caf\u00e9","lines":"a\nb","path":"C:\\dir","quote":"say \"hi\""}"#;
    let escaped = php_json.replace('\\', "\\\\");
    let id = create(&mut conn, &[("name", "esc/php"), ("data", &escaped)]);
    assert_eq!(query(&mut conn, id)["data"], want);
    // FinishJob's data is read the same way: nothing doubles up run to run.
    let job = get_job(&mut conn, "esc/php");
    assert_eq!(job["data"], want);
    let answer = conn.call(&req(
        "RetryJob",
        &[
            ("jobID", &id.to_string()),
            ("data", &escaped),
            ("delay", "0"),
        ],
    ));
    assert!(answer.status.starts_with("200"), "{answer:?}");
    assert_eq!(query(&mut conn, id)["data"], want);
    // A client that sends its JSON unescaped is read as sent where only
    // that reads (a JSON escape such as \" would not survive unescaping).
    let id = create(
        &mut conn,
        &[
            ("name", "esc/raw"),
            ("data", r#"{"q":"say \"hi\"","n":"a\nb"}"#),
        ],
    );
    assert_eq!(
        query(&mut conn, id)["data"],
        json!({"q": "say \"hi\"", "n": "a\nb"})
    );
}
