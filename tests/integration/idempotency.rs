//! Idempotent creates: a client that lost the answer to a committed create
//! retries it with the same key and gets the first answer, not duplicates.

use serde_json::{Value, json};

use crate::common::*;

/// `POST path` with an `Idempotency-Key` header.
fn post_with_key(server: &Server, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::blocking::Client::new()
        .post(format!("{}{path}", server.url))
        .bearer_auth(token())
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().expect("JSON answer"))
}

fn count(api: &Api, name: &str) -> usize {
    let (status, answer) = api.get(&format!("/jobs?name={name}&limit=1000"));
    assert_eq!(status, 200, "{answer}");
    answer["jobs"].as_array().expect("jobs").len()
}

#[test]
fn creates_have_no_idempotency_key_a_retried_batch_is_duplicated() {
    let server = Server::start();
    let api = server.api();
    let jobs: Vec<Value> = (0..1000)
        .map(|i| json!({"name": "idem/batch", "data": {"i": i}}))
        .collect();
    let batch = json!({"jobs": jobs});
    let (status, first) = post_with_key(&server, "/jobs/batch", "batch-1", &batch);
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["jobIDs"].as_array().map(Vec::len), Some(1000));
    // The client lost that answer and retries: same key, same batch.
    let (status, again) = post_with_key(&server, "/jobs/batch", "batch-1", &batch);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, first, "a repeat gets the first answer");
    assert_eq!(count(&api, "idem/batch"), 1000, "nothing was created twice");

    // A single create, with the key in the body.
    let one = json!({"name": "idem/one", "idempotencyKey": "one-1"});
    let (status, first) = api.post("/jobs", one.clone());
    assert_eq!(status, 200, "{first}");
    let (status, again) = api.post("/jobs", one);
    assert_eq!((status, &again), (200, &first));
    assert_eq!(count(&api, "idem/one"), 1);
}

#[test]
fn the_same_idempotency_key_with_a_different_request_is_refused() {
    let server = Server::start();
    let api = server.api();
    let (status, _) = post_with_key(&server, "/jobs", "k", &json!({"name": "idem/a"}));
    assert_eq!(status, 200);
    let answer = post_with_key(&server, "/jobs", "k", &json!({"name": "idem/b"}));
    assert_error(answer, 409, "idempotency_key_reused");
    assert_eq!(
        count(&api, "idem/b"),
        0,
        "the refused request created nothing"
    );
    // A key in a batch's element is refused, and so is a header that
    // disagrees with the body.
    let (status, _) = api.post(
        "/jobs/batch",
        json!({"jobs": [{"name": "idem/c", "idempotencyKey": "x"}]}),
    );
    assert_eq!(status, 400);
    let (status, _) = post_with_key(
        &server,
        "/jobs",
        "k1",
        &json!({"name": "idem/d", "idempotencyKey": "k2"}),
    );
    assert_eq!(status, 400);
    assert_eq!(count(&api, "idem/d"), 0);
}

/// One Bedrock request with `Connection: close`; the answer as text.
fn bedrock(server: &Server, method: &str, headers: &str) -> String {
    let request = format!("{method}\r\n{headers}Connection: close\r\n\r\n");
    bedrock_exchange(&server.bedrock, request.as_bytes())
}

#[test]
fn a_bedrock_create_retried_with_its_idempotency_key_is_not_duplicated() {
    let server = Server::start();
    let api = server.api();
    let first = bedrock(
        &server,
        "CreateJob",
        "name: idem/bedrock\r\nidempotencyKey: b-1\r\n",
    );
    assert!(first.starts_with("200"), "{first}");
    let again = bedrock(
        &server,
        "CreateJob",
        "name: idem/bedrock\r\nidempotencyKey: b-1\r\n",
    );
    let body = |answer: &str| {
        answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(body(&again), body(&first), "a repeat gets the first answer");
    assert_eq!(count(&api, "idem/bedrock"), 1);
    let jobs = r#"[{"name":"idem/bedrock-batch"},{"name":"idem/bedrock-batch"}]"#;
    let headers = format!("jobs: {jobs}\r\nidempotencyKey: b-2\r\n");
    let first = bedrock(&server, "CreateJobs", &headers);
    let again = bedrock(&server, "CreateJobs", &headers);
    assert!(first.starts_with("200"), "{first}");
    assert_eq!(body(&again), body(&first));
    assert_eq!(count(&api, "idem/bedrock-batch"), 2);
    let reused = bedrock(
        &server,
        "CreateJob",
        "name: idem/other\r\nidempotencyKey: b-1\r\n",
    );
    assert!(reused.starts_with("409 Idempotency key b-1"), "{reused}");
}

#[test]
fn an_idempotency_key_that_is_not_a_string_is_refused_and_creates_nothing() {
    let server = Server::start();
    let api = server.api();
    for key in [json!(null), json!(""), json!(7), json!("x".repeat(256))] {
        for (path, body) in [
            ("/jobs", json!({"name": "Keyed", "idempotencyKey": key})),
            (
                "/jobs/batch",
                json!({"jobs": [{"name": "Keyed"}], "idempotencyKey": key}),
            ),
        ] {
            let (status, answer) = api.post(path, body);
            assert_eq!(status, 400, "{path} with key {key}: {answer}");
        }
    }
    assert_eq!(count(&api, "Keyed"), 0);
}

#[test]
fn a_bad_bedrock_idempotency_key_is_refused_and_creates_nothing() {
    let server = Server::start();
    let api = server.api();
    let long = "k".repeat(256);
    let answer = bedrock(
        &server,
        "CreateJob",
        &format!("name: idem/bad\r\nidempotencyKey: {long}\r\n"),
    );
    assert!(answer.starts_with("402"), "{answer}");
    assert_eq!(count(&api, "idem/bad"), 0);
    // An empty value is no key, as for every Bedrock parameter: each
    // create creates.
    for _ in 0..2 {
        let answer = bedrock(
            &server,
            "CreateJob",
            "name: idem/empty\r\nidempotencyKey: \r\n",
        );
        assert!(answer.starts_with("200"), "{answer}");
    }
    assert_eq!(count(&api, "idem/empty"), 2);
}

#[test]
fn a_server_refuses_a_requeue_age_below_a_second_or_unreadable() {
    let dir = tempfile::tempdir().expect("temp dir");
    for age in ["0s", "500ms", "soon"] {
        let output = jobmgr_in(dir.path())
            .args(["server", "--requeue-unleased-after", age])
            .arg("--db")
            .arg(dir.path().join("jobs.db"))
            .args(["--http", "127.0.0.1:0", "--bedrock", "none"])
            .run_bounded(&format!("a server refusing --requeue-unleased-after {age}"));
        assert_eq!(output.status.code(), Some(2), "{age}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--requeue-unleased-after"),
            "{age}: {stderr}"
        );
    }
}
