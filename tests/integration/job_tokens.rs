//! Job tokens on the Bedrock port: a credential minted from the API token
//! for one hand-out of one job, that lets a worker create jobs (children
//! of its own job only) and query its own job and its children, while that
//! hand-out lasts. Each allowed request has its hostile twin beside it, and
//! every refusal is checked to change nothing (with the API token after).

use std::io::Write;

use jobmgr::auth::job_token::mint;
use serde_json::{Value, json};

use crate::common::bedrock_conn::{Conn, Response};
use crate::common::*;

const FORBIDDEN: &str =
    "403 Forbidden: a job token may only create jobs and query its own job and its children";
const OTHER_PARENT: &str = "403 Forbidden: a job token may only create children of its own job";
const NO_DEPENDS: &str = "403 Forbidden: a job token may not create jobs with depends; the job's own client (with the API token) can";
const NOT_RUNNING: &str = "401 Unauthorized: this job token's job is no longer running";
const UNAUTHORIZED: &str = "401 Unauthorized: send the server's token in a Token header";

// ----- A Bedrock connection that sends a given token ---------------------------

/// A connection to the Bedrock port whose requests carry `token`.
struct TokenConn {
    conn: Conn,
    token: String,
}

impl TokenConn {
    fn open(server: &Server, token: &str) -> TokenConn {
        TokenConn {
            conn: Conn::open(&server.bedrock),
            token: token.to_string(),
        }
    }

    /// The request's bytes: the method line, `Token`, the headers, and a
    /// `Content-Length` body when `body` is not empty.
    fn request(&self, method: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
        let mut out = format!("{method}\r\nToken: {}\r\n", self.token);
        for (name, value) in headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        out.into_bytes()
    }

    /// Sends a request and reads its response; `None` if the server closed
    /// the connection without one.
    fn try_call(&mut self, method: &str, headers: &[(&str, &str)], body: &str) -> Option<Response> {
        let bytes = self.request(method, headers, body);
        if self.conn.stream.write_all(&bytes).is_err() {
            return None;
        }
        self.conn.next_response()
    }

    #[track_caller]
    fn call(&mut self, method: &str, headers: &[(&str, &str)]) -> Response {
        self.call_with_body(method, headers, "")
    }

    #[track_caller]
    fn call_with_body(&mut self, method: &str, headers: &[(&str, &str)], body: &str) -> Response {
        self.try_call(method, headers, body)
            .unwrap_or_else(|| panic!("{method}: the connection closed without an answer"))
    }

    /// Asserts the server closed the connection after what it said.
    #[track_caller]
    fn assert_closed(&mut self) {
        self.conn.assert_closed();
    }

    /// Asserts the connection is still served: a QueryJob of `own` answers.
    #[track_caller]
    fn assert_open(&mut self, own: i64) {
        let answer = self.call("QueryJob", &[("jobID", &own.to_string())]).json();
        assert_eq!(answer["jobID"], own);
    }
}

/// Sends one request with `token` on a fresh connection; asserts it is
/// refused with `status` and the connection closed.
#[track_caller]
fn assert_rejected(server: &Server, token: &str, status: &str) {
    let mut conn = TokenConn::open(server, token);
    conn.call("CreateJob", &[("name", "jt-never")])
        .assert_error(status);
    conn.assert_closed();
}

// ----- Fixtures ------------------------------------------------------------------

/// A job handed out over HTTP under a lease, and its job token.
struct Running {
    id: i64,
    lease: String,
    token: String,
}

/// Creates a job named `name` and hands it out over HTTP under a lease of
/// `lease_ms`; mints its token with the fixtures' API token.
fn hand_out(api: &Api, name: &str, lease_ms: u64) -> Running {
    let id = api.create(json!({"name": name, "data": {"mine": true}}));
    let handed = api.dequeue(json!({"name": name, "leaseMs": lease_ms}));
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert_eq!(handed[0]["jobID"], id);
    let lease = handed[0]["lease"].as_str().expect("a lease").to_string();
    Running {
        id,
        token: mint(&api_token(), id, &lease),
        lease,
    }
}

/// Every job id in the store.
fn all_ids(server: &Server) -> Vec<i64> {
    server.store_query_i64("SELECT job_id FROM jobs ORDER BY job_id")
}

// ----- Tests ---------------------------------------------------------------------

#[test]
fn a_job_token_creates_jobs_and_children_of_its_own_job_only() {
    let server = Server::start();
    let api = server.api();
    let mine = hand_out(&api, "jt-parent", 60_000);
    let other = hand_out(&api, "jt-other", 60_000);
    let mut conn = TokenConn::open(&server, &mine.token);

    // A job of its own: created as by the API token.
    let plain = conn
        .call("CreateJob", &[("name", "jt-plain"), ("data", r#"{"x":1}"#)])
        .json()["jobID"]
        .as_i64()
        .expect("jobID");
    let job = api.job(plain);
    assert_eq!(
        (&job["state"], &job["parentJobID"], &job["data"]),
        (&json!("QUEUED"), &json!(0), &json!({"x": 1}))
    );
    // parentJobID 0 is no parent.
    conn.call("CreateJob", &[("name", "jt-zero"), ("parentJobID", "0")])
        .json();

    // A child of its own job, in a header or in the body.
    let own = mine.id.to_string();
    let child = conn
        .call("CreateJob", &[("name", "jt-child"), ("parentJobID", &own)])
        .json()["jobID"]
        .as_i64()
        .expect("jobID");
    assert_eq!(api.job(child)["parentJobID"], mine.id);
    assert_eq!(api.job(child)["state"], "PAUSED", "waits for its parent");
    let body = json!({"name": "jt-child-body", "parentJobID": mine.id}).to_string();
    let child_in_body = conn.call_with_body("CreateJob", &[], &body).json()["jobID"]
        .as_i64()
        .expect("jobID");
    assert_eq!(api.job(child_in_body)["parentJobID"], mine.id);

    // A child of another job: refused, in a header or in the body, and
    // nothing is created; the connection stays open.
    let before = all_ids(&server);
    let theirs = other.id.to_string();
    conn.call(
        "CreateJob",
        &[("name", "jt-stolen"), ("parentJobID", &theirs)],
    )
    .assert_error(OTHER_PARENT);
    let body = json!({"name": "jt-stolen", "parentJobID": other.id}).to_string();
    conn.call_with_body("CreateJob", &[], &body)
        .assert_error(OTHER_PARENT);
    conn.call(
        "CreateJob",
        &[("name", "jt-stolen"), ("parentJobID", "999999")],
    )
    .assert_error(OTHER_PARENT);
    assert_eq!(all_ids(&server), before, "a refused create created nothing");
    conn.assert_open(mine.id);

    // CreateJobs: every job a child of its own, or none at all.
    let jobs = json!([
        {"name": "jt-many-1", "parentJobID": mine.id},
        {"name": "jt-many-2"},
    ])
    .to_string();
    let ids = conn.call("CreateJobs", &[("jobs", &jobs)]).json()["jobIDs"]
        .as_array()
        .expect("jobIDs")
        .clone();
    assert_eq!(ids.len(), 2);
    assert_eq!(api.job(ids[0].as_i64().unwrap())["parentJobID"], mine.id);
    let before = all_ids(&server);
    let jobs = json!([
        {"name": "jt-many-3", "parentJobID": mine.id},
        {"name": "jt-many-4", "parentJobID": other.id},
    ])
    .to_string();
    conn.call("CreateJobs", &[("jobs", &jobs)])
        .assert_error(OTHER_PARENT);
    assert_eq!(all_ids(&server), before, "all or nothing");

    // depends: refused, whatever it names (the answer would tell whether
    // other jobs exist and how they ended).
    let before = all_ids(&server);
    for depends in [format!("[{}]", other.id), "[999999]".to_string()] {
        conn.call(
            "CreateJob",
            &[("name", "jt-depends"), ("depends", &depends)],
        )
        .assert_error(NO_DEPENDS);
    }
    assert_eq!(all_ids(&server), before, "a refused create created nothing");

    // A command's own errors are answered as usual.
    conn.call("CreateJob", &[("name", "")])
        .assert_error("402 Missing name");
    conn.assert_open(mine.id);
}

#[test]
fn a_unique_create_by_a_job_token_never_overwrites_a_job() {
    let server = Server::start();
    let api = server.api();
    let mine = hand_out(&api, "jt-unique-holder", 60_000);
    let victim = api.create(json!({
        "name": "jt-shared", "data": {"to": "alice"}, "priority": 500,
    }));
    let mut conn = TokenConn::open(&server, &mine.token);

    // A unique job that does not exist yet is created.
    let fresh = conn
        .call(
            "CreateJob",
            &[
                ("name", "jt-unique-new"),
                ("unique", "true"),
                ("data", r#"{"a":1}"#),
            ],
        )
        .json()["jobID"]
        .as_i64()
        .expect("jobID");
    assert_eq!(api.job(fresh)["data"], json!({"a": 1}));

    // One that exists is answered with its id and left as it is, even when
    // overwriting is asked for.
    for overwrite in ["true", "false"] {
        let answer = conn
            .call(
                "CreateJob",
                &[
                    ("name", "jt-shared"),
                    ("unique", "true"),
                    ("overwrite", overwrite),
                    ("data", r#"{"to":"mallory"}"#),
                    ("repeat", "FINISHED, +1 HOUR"),
                    ("priority", "1000"),
                ],
            )
            .json();
        assert_eq!(answer["jobID"], victim);
    }
    let job = api.job(victim);
    assert_eq!(
        (&job["data"], &job["repeat"], &job["priority"]),
        (&json!({"to": "alice"}), &json!(""), &json!(500)),
        "{job}"
    );

    // The API token still overwrites, as Bedrock does.
    let mut api_conn = TokenConn::open(&server, token());
    api_conn
        .call(
            "CreateJob",
            &[
                ("name", "jt-shared"),
                ("unique", "true"),
                ("data", r#"{"to":"bob"}"#),
            ],
        )
        .json();
    assert_eq!(api.job(victim)["data"], json!({"to": "bob"}));
}

#[test]
fn a_job_token_queries_its_own_job_and_its_children_only() {
    let server = Server::start();
    let api = server.api();
    let mine = hand_out(&api, "jt-query", 60_000);
    let other = hand_out(&api, "jt-query-other", 60_000);
    let queued = api.create(json!({"name": "jt-query-queued"}));
    let their_child = api.create(json!({"name": "jt-query-their-child", "parentJobID": other.id}));
    let mut conn = TokenConn::open(&server, &mine.token);

    let own = conn
        .call("QueryJob", &[("jobID", &mine.id.to_string())])
        .json();
    assert_eq!(
        (&own["jobID"], &own["state"], &own["data"]),
        (&json!(mine.id), &json!("RUNNING"), &json!({"mine": true}))
    );
    let child = conn
        .call(
            "CreateJob",
            &[
                ("name", "jt-query-child"),
                ("parentJobID", &mine.id.to_string()),
            ],
        )
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let answer = conn
        .call("QueryJob", &[("jobID", &child.to_string())])
        .json();
    assert_eq!(
        (&answer["jobID"], &answer["state"]),
        (&json!(child), &json!("PAUSED"))
    );

    // Any other job, and one that does not exist, look the same: refused.
    for id in [other.id, queued, their_child, 999_999] {
        conn.call("QueryJob", &[("jobID", &id.to_string())])
            .assert_error(FORBIDDEN);
    }
    // A malformed id gets the command's own error.
    conn.call("QueryJob", &[("jobID", "abc")])
        .assert_error("402 Malformed jobID");
    conn.assert_open(mine.id);
}

#[test]
fn every_other_command_is_refused_and_changes_nothing() {
    let server = Server::builder()
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let api = server.api();
    let mine = hand_out(&api, "jt-deny", 60_000);
    let queued = api.create(json!({"name": "jt-deny-queued", "data": {"q": 1}}));
    let mut conn = TokenConn::open(&server, &mine.token);
    let child = conn
        .call(
            "CreateJob",
            &[
                ("name", "jt-deny-child"),
                ("parentJobID", &mine.id.to_string()),
            ],
        )
        .json()["jobID"]
        .as_i64()
        .unwrap();
    let snapshot = |id: i64| {
        let mut job = api.job(id);
        job.as_object_mut().unwrap().remove("leaseExpires");
        job
    };
    let before: Vec<Value> = [mine.id, queued, child].map(snapshot).to_vec();
    let ids_before = all_ids(&server);

    let own = mine.id.to_string();
    let lease = mine.lease.as_str();
    let data = r#"{"pwned":true}"#;
    // Requests run (and refused) by command, as the metrics count them.
    let ran = |method: &str| {
        let label = format!("method=\"{}\"", method.to_ascii_lowercase());
        let text = scrape(&server.metrics);
        sample(
            &text,
            "jobmgr_server_requests_total",
            &["api=\"bedrock\"", &label],
        )
        .unwrap_or(0.0) as u64
    };

    // `Connection: forget` answers before it runs; it runs nothing either
    // (it is counted as it runs, and refused at once).
    for method in ["DeleteJob", "FinishJob"] {
        let mut forget = TokenConn::open(&server, &mine.token);
        forget
            .call(
                method,
                &[("jobID", &own), ("lease", lease), ("Connection", "forget")],
            )
            .assert_error("202 Successfully queued");
        poll(&format!("the forgotten {method} to be run"), || {
            (ran(method) == 1).then_some(())
        });
    }

    let requests: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("GetJob", vec![("name", "jt-deny*")]),
        ("GetJobs", vec![("name", "*"), ("numResults", "10")]),
        ("UpdateJob", vec![("jobID", &own), ("data", data)]),
        ("FinishJob", vec![("jobID", &own), ("lease", lease)]),
        ("RetryJob", vec![("jobID", &own), ("lease", lease)]),
        ("FailJob", vec![("jobID", &own), ("lease", lease)]),
        ("DeleteJob", vec![("jobID", &own)]),
        ("CancelJob", vec![("jobID", &own)]),
        ("RequeueJobs", vec![("jobIDs", &own)]),
        ("Heartbeat", vec![("jobID", &own), ("lease", lease)]),
        ("HandBackJob", vec![("jobID", &own), ("lease", lease)]),
        ("Query", vec![("query", "SELECT 1")]),
        ("Status", vec![]),
        ("Ping", vec![]),
    ];
    for (method, headers) in &requests {
        conn.call(method, headers).assert_error(FORBIDDEN);
    }
    let child_id = child.to_string();
    for (method, headers) in [
        ("DeleteJob", vec![("jobID", child_id.as_str())]),
        ("CancelJob", vec![("jobID", child_id.as_str())]),
        (
            "UpdateJob",
            vec![("jobID", child_id.as_str()), ("data", data)],
        ),
    ] {
        conn.call(method, &headers).assert_error(FORBIDDEN);
    }
    conn.assert_open(mine.id);

    let after: Vec<Value> = [mine.id, queued, child].map(snapshot).to_vec();
    assert_eq!(after, before, "a refused command changed a job");
    assert_eq!(all_ids(&server), ids_before);
    // The API token's holder can still do all of it.
    let (status, answer) = api.post(
        &format!("/jobs/{}/finish", mine.id),
        json!({"lease": lease}),
    );
    assert_eq!(status, 200, "{answer}");

    // Logged with the job id and the command (the first refusal at once,
    // the next ones tallied), never the token.
    let log = server.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("job tokens' requests refused") && l.contains("DeleteJob"))
        .unwrap_or_else(|| panic!("no refusal of DeleteJob logged:\n{log}"));
    assert!(line.contains(&format!("job_id={own}")), "{line}");
    let mac = mine.token.rsplit('.').next().unwrap();
    assert!(!log.contains(mac), "the token was logged");
}

#[test]
fn a_job_token_dies_with_its_hand_out() {
    let server = Server::start();
    let api = server.api();

    // Reported (finished) over HTTP: refused, and the connection closed.
    let finished = hand_out(&api, "jt-finish", 60_000);
    let mut conn = TokenConn::open(&server, &finished.token);
    conn.assert_open(finished.id);
    let (status, answer) = api.post(
        &format!("/jobs/{}/finish", finished.id),
        json!({"lease": finished.lease}),
    );
    assert_eq!(status, 200, "{answer}");
    let before = all_ids(&server);
    conn.call("CreateJob", &[("name", "jt-late")])
        .assert_error(NOT_RUNNING);
    conn.assert_closed();
    assert_rejected(&server, &finished.token, NOT_RUNNING);
    assert_eq!(all_ids(&server), before);

    // Retried and handed out again: the earlier hand-out's token is
    // refused, the new one's works.
    let retried = hand_out(&api, "jt-retry", 60_000);
    let (status, answer) = api.post(
        &format!("/jobs/{}/retry", retried.id),
        json!({"lease": retried.lease}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_rejected(&server, &retried.token, NOT_RUNNING);
    let again = api.dequeue(json!({"name": "jt-retry", "leaseMs": 60_000}));
    assert_eq!(again[0]["jobID"], retried.id);
    assert_rejected(&server, &retried.token, NOT_RUNNING);
    let fresh = mint(
        &api_token(),
        retried.id,
        again[0]["lease"].as_str().unwrap(),
    );
    TokenConn::open(&server, &fresh).assert_open(retried.id);

    // A lease that lapsed, the job handed out again.
    let lapsed = hand_out(&api, "jt-lapse", 300);
    poll("the lease to lapse", || {
        (api.job(lapsed.id)["state"] == "QUEUED").then_some(())
    });
    assert_rejected(&server, &lapsed.token, NOT_RUNNING);
    let again = api.dequeue(json!({"name": "jt-lapse", "leaseMs": 60_000}));
    assert_eq!(again[0]["jobID"], lapsed.id);
    assert_ne!(again[0]["lease"], json!(lapsed.lease));
    assert_rejected(&server, &lapsed.token, NOT_RUNNING);

    // Failed, and deleted.
    let failed = hand_out(&api, "jt-fail", 60_000);
    let (status, answer) = api.post(
        &format!("/jobs/{}/fail", failed.id),
        json!({"lease": failed.lease}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_rejected(&server, &failed.token, NOT_RUNNING);
    let (status, answer) = api.delete(&format!("/jobs/{}", failed.id));
    assert_eq!(status, 200, "{answer}");
    assert_rejected(&server, &failed.token, NOT_RUNNING);
}

#[test]
fn a_retry_after_job_keeps_its_token_while_runqueued() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "jt-runqueued", "retryAfter": "+1 HOUR"}));
    let handed = api.dequeue(json!({"name": "jt-runqueued"}));
    let lease = handed[0]["lease"].as_str().expect("a lease");
    assert_eq!(api.job(id)["state"], "RUNQUEUED");
    let mut conn = TokenConn::open(&server, &mint(&api_token(), id, lease));
    conn.call(
        "CreateJob",
        &[("name", "jt-rq-child"), ("parentJobID", &id.to_string())],
    )
    .json();
    conn.assert_open(id);
}

#[test]
fn forged_and_foreign_tokens_are_refused() {
    let server = Server::start();
    let api = server.api();
    let running = hand_out(&api, "jt-forge", 60_000);
    let before = all_ids(&server);

    // Minted with another server's API token.
    let foreign = jobmgr::auth::ApiToken::generate();
    assert_rejected(
        &server,
        &mint(&foreign, running.id, &running.lease),
        NOT_RUNNING,
    );
    // Random hex for a running job; a real token's MAC moved to another
    // running job; a token for a job that does not exist; for the right
    // job with a guessed lease.
    let random = jobmgr::auth::ApiToken::generate();
    assert_rejected(
        &server,
        &format!("job.{}.{}", running.id, random.expose()),
        NOT_RUNNING,
    );
    let other = hand_out(&api, "jt-forge-other", 60_000);
    let mac = running.token.rsplit('.').next().unwrap();
    assert_rejected(&server, &format!("job.{}.{mac}", other.id), NOT_RUNNING);
    assert_rejected(
        &server,
        &mint(&api_token(), 999_999, &running.lease),
        NOT_RUNNING,
    );
    assert_rejected(
        &server,
        &mint(&api_token(), running.id, "guess"),
        NOT_RUNNING,
    );
    // Not job tokens at all: the usual refusal.
    for malformed in [
        "job.".to_string(),
        "job.x.y".to_string(),
        running.token.to_uppercase(),
        format!("job.0{}", &running.token[4..]),
        format!("{}0", running.token),
        format!("job.{}.{mac}", "9".repeat(40)),
    ] {
        assert_rejected(&server, &malformed, UNAUTHORIZED);
    }
    // A job token on a connection that began with the API token is checked
    // as any other request.
    let mut conn = TokenConn::open(&server, token());
    conn.call("QueryJob", &[("jobID", &running.id.to_string())])
        .json();
    conn.token = format!("job.{}.{}", running.id, random.expose());
    conn.call("CreateJob", &[("name", "jt-never")])
        .assert_error(NOT_RUNNING);
    conn.assert_closed();

    assert_eq!(all_ids(&server), {
        let mut ids = before.clone();
        ids.push(other.id);
        ids
    });
    // The real one still works.
    TokenConn::open(&server, &running.token).assert_open(running.id);
}

#[test]
fn the_http_port_does_not_take_job_tokens() {
    let server = Server::start();
    let api = server.api();
    let running = hand_out(&api, "jt-http", 60_000);
    let as_job = server.api().with_token(&running.token);
    for (method, path, body) in [
        ("GET", format!("/jobs/{}", running.id), None),
        (
            "POST",
            "/jobs".to_string(),
            Some(json!({"name": "jt-http-new"}).to_string()),
        ),
        (
            "POST",
            format!("/jobs/{}/finish", running.id),
            Some(json!({"lease": running.lease}).to_string()),
        ),
    ] {
        let (status, answer) = as_job.send(method, &path, body);
        assert_eq!(status, 401, "{method} {path}: {answer}");
    }
    assert_eq!(api.job(running.id)["state"], "RUNNING");
}

#[test]
fn a_trusted_loopback_peer_is_not_limited_by_a_job_token() {
    let server = Server::builder().arg("--bedrock-trust-loopback").start();
    let api = server.api();
    let running = hand_out(&api, "jt-trusted", 60_000);
    let queued = api.create(json!({"name": "jt-trusted-queued"}));
    // Whatever token a trusted peer sends, it is not checked: a job token
    // (even a stale or forged one) limits nothing.
    let forged = format!("job.{}.{}", running.id, "0".repeat(64));
    for token in [running.token.as_str(), forged.as_str()] {
        let mut conn = TokenConn::open(&server, token);
        conn.call("QueryJob", &[("jobID", &queued.to_string())])
            .json();
    }
    let mut conn = TokenConn::open(&server, &running.token);
    conn.call("DeleteJob", &[("jobID", &queued.to_string())])
        .assert_ok();
    assert_eq!(api.state(queued), None);
}

#[test]
fn a_job_tokens_idempotency_keys_are_its_own() {
    let server = Server::start();
    let api = server.api();
    let mine = hand_out(&api, "jt-keys", 60_000);
    let mut conn = TokenConn::open(&server, &mine.token);
    let create = |conn: &mut TokenConn| {
        conn.call(
            "CreateJob",
            &[("name", "jt-invoice"), ("idempotencyKey", "invoice-42")],
        )
        .json()["jobID"]
            .as_i64()
            .expect("jobID")
    };
    // A repeat of the worker's own create is answered with the same job.
    let first = create(&mut conn);
    assert_eq!(create(&mut conn), first);
    // The server's clients use the same key for a job of their own: the
    // worker's use of it neither blocks them nor hands them its job.
    let (status, answer) = api.send_with_headers(
        "POST",
        "/jobs",
        &[
            ("Idempotency-Key", "invoice-42"),
            ("Content-Type", "application/json"),
        ],
        Some(r#"{"name": "jt-invoice"}"#),
    );
    assert_eq!(status, 200, "{answer}");
    assert_ne!(answer["jobID"], first, "{answer}");
}
