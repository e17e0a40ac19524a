//! Hostile and broken input: every bad request gets a clear JSON error and
//! leaves the store exactly as it was.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use serde_json::{Value, json};

use crate::common::*;

/// Every job as GET /jobs lists it, for before/after comparisons.
fn snapshot(api: &Api) -> Value {
    let (status, answer) = api.get("/jobs?limit=1000");
    assert_eq!(status, 200, "list: {answer}");
    answer["jobs"].clone()
}

/// Jobs in every interesting state, so that an accepted request would show.
struct Fixture {
    /// What the job names start with.
    prefix: String,
    /// A QUEUED job with data `{"v":1}`, due in 2099 (a RequeueJobs makes
    /// it due at its creation).
    queued: i64,
    /// A RUNNING job, and its lease token.
    running: i64,
    lease: String,
    /// A QUEUED child of a PAUSED parent: a CancelJob would cancel it.
    child: i64,
}

fn fixture(api: &Api) -> Fixture {
    fixture_named(api, "h")
}

/// The fixture with job names starting `prefix-`.
fn fixture_named(api: &Api, prefix: &str) -> Fixture {
    let name = |what: &str| format!("{prefix}-{what}");
    let parent = api.create(json!({"name": name("parent")}));
    api.take(&name("parent"));
    let child = api.create(json!({"name": name("child"), "parentJobID": parent}));
    let (status, answer) = api.post(&format!("/jobs/{parent}/finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.state(parent).as_deref(), Some("PAUSED"));
    assert_eq!(api.state(child).as_deref(), Some("QUEUED"));
    let queued = api.create(json!({
        "name": name("queued"),
        "data": {"v": 1},
        "firstRun": "2099-01-01 00:00:00",
    }));
    let running = api.create(json!({"name": name("run"), "data": {"v": 1}}));
    let handed = api.take(&name("run"));
    let lease = handed["lease"].as_str().expect("lease").to_string();
    // A job due for /dequeue to take.
    api.create(json!({"name": name("due")}));
    Fixture {
        prefix: prefix.to_string(),
        queued,
        running,
        lease,
        child,
    }
}

/// Every route that takes a body, with a body it would accept.
fn body_routes(f: &Fixture) -> Vec<(&'static str, String, Value)> {
    vec![
        ("POST", "/jobs".into(), json!({"name": "new"})),
        (
            "POST",
            "/jobs/batch".into(),
            json!({"jobs": [{"name": "new"}]}),
        ),
        (
            "PATCH",
            format!("/jobs/{}", f.queued),
            json!({"data": {"v": 2}}),
        ),
        (
            "POST",
            format!("/jobs/{}/finish", f.running),
            json!({"lease": f.lease}),
        ),
        (
            "POST",
            format!("/jobs/{}/retry", f.running),
            json!({"delay": 0}),
        ),
        ("POST", format!("/jobs/{}/fail", f.running), json!({})),
        (
            "POST",
            format!("/jobs/{}/heartbeat", f.running),
            json!({"lease": f.lease}),
        ),
        ("POST", format!("/jobs/{}/cancel", f.child), json!({})),
        (
            "POST",
            "/jobs/requeue".into(),
            json!({"jobIDs": [f.queued]}),
        ),
        (
            "POST",
            "/dequeue".into(),
            json!({"name": format!("{}-due", f.prefix)}),
        ),
    ]
}

/// Asserts a 400 `code` with a message, and that nothing changed.
#[track_caller]
fn assert_refused(api: &Api, before: &Value, answer: (u16, Value), code: &str, what: &str) {
    let message = answer.1["message"].as_str().unwrap_or("").to_string();
    assert_eq!(
        (answer.0, answer.1["code"].as_str().unwrap_or("")),
        (400, code),
        "{what}: {}",
        answer.1
    );
    assert!(!message.is_empty(), "{what}: no message in {}", answer.1);
    assert_eq!(&snapshot(api), before, "{what} changed the store");
}

/// Sends each request to its own fresh fixture and asserts it is refused
/// with 400 `code` and changes nothing; lists every one that is not.
fn assert_each_refused(
    api: &Api,
    tag: &str,
    code: &str,
    request: impl Fn(&Fixture) -> Vec<(&'static str, String, String)>,
) {
    let count = request(&fixture_named(api, &format!("{tag}-probe"))).len();
    let mut wrong = Vec::new();
    for i in 0..count {
        let f = fixture_named(api, &format!("{tag}{i}"));
        let (method, path, body) = request(&f).swap_remove(i);
        let before = snapshot(api);
        let (status, answer) = api.send(method, &path, Some(body.clone()));
        let changed = snapshot(api) != before;
        let has_message = answer["message"].as_str().is_some_and(|m| !m.is_empty());
        if (status, answer["code"].as_str()) != (400, Some(code)) || changed || !has_message {
            wrong.push(format!(
                "{method} {path} {body} -> {status} {answer}{}",
                if changed {
                    " (and changed the store)"
                } else {
                    ""
                }
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "not refused with 400 {code}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn malformed_json_bodies_are_refused_on_every_route() {
    let server = Server::start();
    let api = server.api();
    assert_each_refused(&api, "mal", "invalid_request", |f| {
        let mut requests = Vec::new();
        for (method, path, _) in body_routes(f) {
            for body in [r#"{"name":"#, "not json", "[1]", "[]", "42"] {
                requests.push((method, path.clone(), body.to_string()));
            }
        }
        requests
    });
}

#[test]
fn the_fixture_bodies_are_accepted() {
    // With a good body, each route the other tests send broken bodies to
    // does change the store, so "nothing changed" there means something.
    let server = Server::start();
    let api = server.api();
    for i in 0..body_routes(&fixture_named(&api, "probe")).len() {
        let f = fixture_named(&api, &format!("ok{i}"));
        let (method, path, body) = body_routes(&f).swap_remove(i);
        let before = snapshot(&api);
        let (status, answer) = api.send(method, &path, Some(body.to_string()));
        assert_eq!(status, 200, "{method} {path} {body}: {answer}");
        if path.ends_with("/heartbeat") {
            assert_ne!(answer["leaseExpires"], "", "{answer}");
        } else {
            assert_ne!(snapshot(&api), before, "{method} {path} changed nothing");
        }
    }
}

#[test]
fn data_that_is_not_an_object_is_refused() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    for data in [json!([1]), json!("x"), json!(5)] {
        let attempts = [
            (
                "POST",
                "/jobs".to_string(),
                json!({"name": "d", "data": data}),
            ),
            (
                "POST",
                "/jobs/batch".to_string(),
                json!({"jobs": [{"name": "d", "data": data}]}),
            ),
            (
                "PATCH",
                format!("/jobs/{}", f.queued),
                json!({"data": data}),
            ),
            (
                "POST",
                format!("/jobs/{}/finish", f.running),
                json!({"data": data}),
            ),
            (
                "POST",
                format!("/jobs/{}/retry", f.running),
                json!({"data": data}),
            ),
            (
                "POST",
                format!("/jobs/{}/fail", f.running),
                json!({"data": data}),
            ),
        ];
        for (method, path, body) in attempts {
            let answer = api.send(method, &path, Some(body.to_string()));
            assert_refused(
                &api,
                &before,
                answer,
                "data_not_object",
                &format!("{method} {path} {body}"),
            );
        }
    }
}

#[test]
fn null_data_is_refused_as_not_an_object() {
    let server = Server::start();
    let api = server.api();
    assert_each_refused(&api, "null", "data_not_object", |f| {
        vec![
            ("POST", "/jobs".into(), r#"{"name":"d","data":null}"#.into()),
            (
                "POST",
                "/jobs/batch".into(),
                r#"{"jobs":[{"name":"d","data":null}]}"#.into(),
            ),
            (
                "PATCH",
                format!("/jobs/{}", f.queued),
                r#"{"data":null}"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/finish", f.running),
                r#"{"data":null}"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/retry", f.running),
                r#"{"data":null}"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/fail", f.running),
                r#"{"data":null}"#.into(),
            ),
        ]
    });
}

#[test]
fn json_arrays_are_not_read_as_positional_fields() {
    let server = Server::start();
    let api = server.api();
    assert_each_refused(&api, "arr", "invalid_request", |f| {
        vec![
            (
                "POST",
                "/jobs".into(),
                r#"["arr-job",{"v":1},null,null,null,null,null,null,null]"#.into(),
            ),
            (
                "PATCH",
                format!("/jobs/{}", f.queued),
                r#"[{"v":9},null,null,null,null]"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/finish", f.running),
                r#"[{"v":9},null]"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/fail", f.running),
                r#"[{"v":9},null]"#.into(),
            ),
            (
                "POST",
                format!("/jobs/{}/heartbeat", f.running),
                format!(r#"["{}"]"#, f.lease),
            ),
            ("POST", format!("/jobs/{}/cancel", f.child), "[]".into()),
            (
                "POST",
                "/jobs/requeue".into(),
                format!("[[{}],null]", f.queued),
            ),
            (
                "POST",
                "/dequeue".into(),
                format!(r#"["{}-due",1,null,null,null]"#, f.prefix),
            ),
        ]
    });
}

/// `{"x":"yyy…"}` whose JSON text is exactly `len` bytes.
fn data_of_len(len: usize) -> Value {
    json!({"x": "y".repeat(len - 8)})
}

#[test]
fn data_over_one_mib_is_refused() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    const MIB: usize = 1024 * 1024;
    let big = data_of_len(MIB + 1);
    assert_eq!(big.to_string().len(), MIB + 1);
    for (method, path, body) in [
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "big", "data": big}),
        ),
        (
            "POST",
            "/jobs/batch".to_string(),
            json!({"jobs": [{"name": "big", "data": big}]}),
        ),
        ("PATCH", format!("/jobs/{}", f.queued), json!({"data": big})),
        (
            "POST",
            format!("/jobs/{}/finish", f.running),
            json!({"data": big}),
        ),
    ] {
        let answer = api.send(method, &path, Some(body.to_string()));
        assert_refused(
            &api,
            &before,
            answer,
            "data_too_large",
            &format!("{method} {path}"),
        );
    }

    // A body over 2 MiB is refused before it is read: on its length, with
    // none of it sent (a client still sending it when the answer comes
    // would find the connection closed under it, at random).
    let huge = json!({"name": "huge", "data": {"x": "y".repeat(2 * MIB)}}).to_string();
    let answer = raw_exchange(
        &server.addr(),
        format!(
            "POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            token(),
            huge.len()
        )
        .as_bytes(),
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(head.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert_eq!(
        serde_json::from_str::<Value>(body)
            .ok()
            .map(|v| v["code"].clone()),
        Some(json!("body_too_large")),
        "{answer:?}"
    );
    assert_eq!(snapshot(&api), before);

    // Exactly 1 MiB is fine.
    let id = api.create(json!({"name": "just-fits", "data": data_of_len(MIB)}));
    assert_eq!(api.job(id)["data"], data_of_len(MIB));
}

#[test]
fn names_are_checked() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    let cases = [
        (json!({}), "missing_name"),
        (json!({"name": ""}), "missing_name"),
        (json!({"name": "n".repeat(256)}), "malformed_name"),
        // Bytes, not characters: 128 two-byte characters.
        (json!({"name": "é".repeat(128)}), "malformed_name"),
        (json!({"name": "a\u{0}b"}), "malformed_name"),
    ];
    for (body, code) in &cases {
        let answer = api.post("/jobs", body.clone());
        assert_refused(&api, &before, answer, code, &format!("create {body}"));
        let answer = api.post("/jobs/batch", json!({"jobs": [{"name": "ok"}, body]}));
        assert_refused(&api, &before, answer, code, &format!("batch {body}"));
    }
    // Renaming to a bad name is refused too.
    for name in ["n".repeat(256), "a\u{0}b".to_string()] {
        let answer = api.post(&format!("/jobs/{}/retry", f.running), json!({"name": name}));
        assert_refused(&api, &before, answer, "malformed_name", "retry rename");
        let answer = api.post(
            "/jobs/requeue",
            json!({"jobIDs": [f.running], "name": name}),
        );
        assert_refused(&api, &before, answer, "malformed_name", "requeue rename");
    }

    // 255 bytes is the limit, and is kept as given.
    let name = format!("{}é", "n".repeat(253));
    assert_eq!(name.len(), 255);
    let id = api.create(json!({"name": name}));
    assert_eq!(api.job(id)["name"], name);
}

#[test]
fn invalid_priorities_are_refused() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    let routes = |p: &Value| {
        vec![
            (
                "POST",
                "/jobs".to_string(),
                json!({"name": "p", "priority": p}),
            ),
            (
                "POST",
                "/jobs".to_string(),
                json!({"name": "p", "jobPriority": p}),
            ),
            (
                "POST",
                "/jobs/batch".to_string(),
                json!({"jobs": [{"name": "p", "priority": p}]}),
            ),
            (
                "PATCH",
                format!("/jobs/{}", f.queued),
                json!({"data": {}, "priority": p}),
            ),
            (
                "POST",
                format!("/jobs/{}/retry", f.running),
                json!({"priority": p}),
            ),
            (
                "POST",
                "/dequeue".to_string(),
                json!({"name": "*", "priority": p}),
            ),
        ]
    };
    for p in [json!(3), json!(-1), json!(1001)] {
        for (method, path, body) in routes(&p) {
            let answer = api.send(method, &path, Some(body.to_string()));
            assert_refused(
                &api,
                &before,
                answer,
                "invalid_priority",
                &format!("{method} {path} {body}"),
            );
        }
    }
    // A string where a number belongs fails to read at all.
    for (method, path, body) in routes(&json!("high")) {
        let answer = api.send(method, &path, Some(body.to_string()));
        assert_refused(
            &api,
            &before,
            answer,
            "invalid_request",
            &format!("{method} {path} {body}"),
        );
    }
}

#[test]
fn bad_repeat_retry_after_and_times_are_refused() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    let cases = [
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "t", "repeat": "SOMETIME, +1 HOUR"}),
            "malformed_repeat",
        ),
        (
            "PATCH",
            format!("/jobs/{}", f.queued),
            json!({"data": {}, "repeat": "FINISHED, +1 FORTNIGHT"}),
            "malformed_repeat",
        ),
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "t", "retryAfter": "+5 FORTNIGHTS"}),
            "malformed_retry_after",
        ),
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "t", "retryAfter": "soon"}),
            "malformed_retry_after",
        ),
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "t", "firstRun": "tomorrow"}),
            "malformed_first_run",
        ),
        (
            "POST",
            "/jobs".to_string(),
            json!({"name": "t", "firstRun": "2024-13-01"}),
            "malformed_first_run",
        ),
        (
            "PATCH",
            format!("/jobs/{}", f.queued),
            json!({"data": {}, "nextRun": "tomorrow"}),
            "malformed_next_run",
        ),
        (
            "POST",
            format!("/jobs/{}/retry", f.running),
            json!({"nextRun": "2024-13-01"}),
            "malformed_next_run",
        ),
    ];
    for (method, path, body, code) in cases {
        let answer = api.send(method, &path, Some(body.to_string()));
        assert_refused(
            &api,
            &before,
            answer,
            code,
            &format!("{method} {path} {body}"),
        );
    }
}

const BAD_IDS: [&str; 5] = ["abc", "1.5", "-1", "0", "99999999999999999999"];

#[test]
fn ids_in_paths_must_be_int64() {
    let server = Server::start();
    let api = server.api();
    fixture(&api);
    let before = snapshot(&api);
    for id in BAD_IDS {
        for (method, path, body) in [
            ("GET", format!("/jobs/{id}"), None),
            ("PATCH", format!("/jobs/{id}"), Some(json!({"data": {}}))),
            ("DELETE", format!("/jobs/{id}"), None),
            ("POST", format!("/jobs/{id}/finish"), Some(json!({}))),
            ("POST", format!("/jobs/{id}/retry"), Some(json!({}))),
            ("POST", format!("/jobs/{id}/fail"), Some(json!({}))),
            ("POST", format!("/jobs/{id}/cancel"), Some(json!({}))),
            (
                "POST",
                format!("/jobs/{id}/heartbeat"),
                Some(json!({"lease": "x"})),
            ),
        ] {
            let answer = api.send(method, &path, body.map(|b| b.to_string()));
            assert_refused(
                &api,
                &before,
                answer,
                "malformed_job_id",
                &format!("{method} {path}"),
            );
        }
    }
}

#[test]
fn ids_in_bodies_must_be_int64() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    for (path, body) in [
        ("/jobs", json!({"name": "c", "parentJobID": "x"})),
        ("/jobs", json!({"name": "c", "parentJobID": 1.5})),
        (
            "/jobs/batch",
            json!({"jobs": [{"name": "c", "parentJobID": "x"}]}),
        ),
        ("/jobs/requeue", json!({"jobIDs": ["x"]})),
        ("/jobs/requeue", json!({"jobIDs": [f.running, "x"]})),
        ("/jobs/requeue", json!({"jobIDs": "1,2"})),
        ("/jobs/requeue", json!({"jobIDs": [1.5]})),
    ] {
        let answer = api.post(path, body.clone());
        assert_refused(&api, &before, answer, "invalid_request", &format!("{body}"));
    }
    let answer = api.send(
        "POST",
        "/jobs",
        Some(r#"{"name":"c","parentJobID":99999999999999999999}"#.to_string()),
    );
    assert_refused(&api, &before, answer, "invalid_request", "parent too big");
    let answer = api.post("/jobs", json!({"name": "c", "parentJobID": -1}));
    assert_refused(
        &api,
        &before,
        answer,
        "malformed_parent_job_id",
        "parent -1",
    );
}

#[test]
fn requeue_ids_must_be_positive() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    for ids in [json!([0]), json!([f.running, -1])] {
        let answer = api.post("/jobs/requeue", json!({"jobIDs": ids}));
        assert_refused(
            &api,
            &before,
            answer,
            "malformed_job_ids",
            &format!("{ids}"),
        );
    }
    let answer = api.post("/jobs/requeue", json!({"jobIDs": []}));
    assert_refused(&api, &before, answer, "missing_job_ids", "empty jobIDs");
}

#[test]
fn unknown_fields_are_refused_by_name() {
    let server = Server::start();
    let api = server.api();
    let f = fixture(&api);
    let before = snapshot(&api);
    let mut attempts: Vec<(&str, String, Value)> = body_routes(&f)
        .into_iter()
        .map(|(method, path, mut body)| {
            body["nmae"] = json!("b");
            (method, path, body)
        })
        .collect();
    attempts.push((
        "POST",
        "/jobs/batch".into(),
        json!({"jobs": [{"name": "a", "nmae": "b"}]}),
    ));
    attempts.push(("POST", "/jobs".into(), json!({"name": "a", "jobid": 5})));
    for (method, path, body) in attempts {
        let answer = api.send(method, &path, Some(body.to_string()));
        let message = answer.1["message"].as_str().unwrap_or("").to_string();
        let field = if body.get("jobid").is_some() {
            "jobid"
        } else {
            "nmae"
        };
        assert!(
            message.contains(field),
            "{method} {path}: message {message:?} does not name {field}"
        );
        assert_refused(
            &api,
            &before,
            answer,
            "invalid_request",
            &format!("{method} {path} {body}"),
        );
    }
    for query in ["nmae=x", "name=h-*&sate=QUEUED"] {
        let answer = api.get(&format!("/jobs?{query}"));
        let message = answer.1["message"].as_str().unwrap_or("").to_string();
        let field = if query.contains("sate") {
            "sate"
        } else {
            "nmae"
        };
        assert!(message.contains(field), "{query}: {message:?}");
        assert_error(answer, 400, "invalid_request");
    }
}

fn healthy(server: &Server) {
    let (status, answer) = server.api().get("/healthz");
    assert_eq!((status, &answer["status"]), (200, &json!("ok")), "{answer}");
    // And it still does work.
    let id = server.api().create(json!({"name": "after-hostile"}));
    let (status, answer) = server.api().delete(&format!("/jobs/{id}"));
    assert_eq!(status, 200, "{answer}");
}

fn truncated_head() -> String {
    format!(
        "POST /jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        token()
    )
}

/// 20 bytes of a body that would otherwise create a job.
const TRUNCATED_BODY: &str = r#"{"name":"trunc-job","#;

#[test]
fn a_truncated_body_creates_nothing() {
    assert_eq!(TRUNCATED_BODY.len(), 20);
    let server = Server::start();
    let api = server.api();
    fixture(&api);
    let before = snapshot(&api);

    // The client sends 20 of the 100 bytes and goes away.
    {
        let mut stream = TcpStream::connect(server.addr()).expect("connect");
        stream
            .write_all(format!("{}{TRUNCATED_BODY}", truncated_head()).as_bytes())
            .expect("write");
    }

    // The client sends 20 of the 100 bytes, stops sending, and waits for
    // the server to give up on the request, so the server has surely seen it.
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    stream
        .write_all(format!("{}{TRUNCATED_BODY}", truncated_head()).as_bytes())
        .expect("write");
    stream.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert_eq!(snapshot(&api), before);
    healthy(&server);

    // If it answers at all, it is a client error, and it does not blame the
    // size of a 20-byte body.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "answer to a truncated request: {answer:?}"
    );
    assert!(
        !answer.contains("body_too_large"),
        "a truncated 20-byte body is not too large: {answer:?}"
    );
}

#[test]
fn garbage_bytes_get_400_or_a_closed_connection() {
    let server = Server::start();
    let api = server.api();
    fixture(&api);
    let before = snapshot(&api);
    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"[..],
        b"GARBAGE GARBAGE GARBAGE\r\n\r\n",
        b"POST /jobs HTTP/1.1\r\nContent-Length: nope\r\n\r\n{\"name\":\"x\"}",
        b"POST /jobs HTTP/9.9\r\n\r\n",
        b"\0\0\0\0\r\n\r\n",
    ] {
        let answer = raw_exchange(&server.addr(), garbage);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
            "{:?} answered {answer:?}",
            String::from_utf8_lossy(garbage)
        );
    }
    assert_eq!(snapshot(&api), before);
    healthy(&server);
}

#[test]
fn a_refused_update_leaves_the_job_unchanged() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({
        "name": "upd",
        "data": {"v": 1},
        "firstRun": "2030-01-01 00:00:00",
    }));
    let before = api.job(id);
    for (body, code) in [
        (
            json!({"data": [1], "nextRun": "2031-01-01 00:00:00", "repeat": "FINISHED, +1 HOUR"}),
            "data_not_object",
        ),
        (
            json!({"data": {"v": 2}, "nextRun": "2031-13-01 00:00:00"}),
            "malformed_next_run",
        ),
        (
            json!({"data": {"v": 2}, "nextRun": "2031-01-01 00:00:00", "priority": 3}),
            "invalid_priority",
        ),
        (json!({"nextRun": "2031-01-01 00:00:00"}), "missing_data"),
    ] {
        let answer = api.patch(&format!("/jobs/{id}"), body.clone());
        assert_error(answer, 400, code);
        let after = api.job(id);
        assert_eq!(after["data"], json!({"v": 1}), "{body}");
        assert_eq!(after["nextRun"], "2030-01-01 00:00:00", "{body}");
        assert_eq!(after, before, "{body}");
    }
}

#[test]
fn a_refused_retry_rolls_back_and_keeps_the_lease() {
    let server = Server::start();
    let api = server.api();
    // A parent whose finished child is reported to its next run: a retry of
    // that run deletes the child before it checks the delay.
    let parent = api.create(json!({"name": "rb-parent", "data": {"v": 1}}));
    api.take("rb-parent");
    let child = api.create(json!({"name": "rb-child", "parentJobID": parent}));
    let (status, answer) = api.post(&format!("/jobs/{parent}/finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    api.take("rb-child");
    let (status, answer) = api.post(&format!("/jobs/{child}/finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.state(child).as_deref(), Some("FINISHED"));
    let handed = api.take("rb-parent");
    assert_eq!(handed["finishedChildJobs"][0]["jobID"], child);
    let lease = handed["lease"].as_str().expect("lease").to_string();
    let before = snapshot(&api);
    let held = api.job(parent);
    assert_eq!(held["state"], "RUNNING");

    let answer = api.post(
        &format!("/jobs/{parent}/retry"),
        json!({"delay": -5, "data": {"v": 2}, "lease": lease}),
    );
    assert_error(answer, 400, "negative_delay");
    assert_eq!(
        snapshot(&api),
        before,
        "the refused retry changed the store"
    );
    assert_eq!(api.state(child).as_deref(), Some("FINISHED"));
    assert_eq!(api.job(parent), held);

    // The lease still holds: a heartbeat with it works, and so does the
    // finish.
    let (status, answer) = api.post(
        &format!("/jobs/{parent}/heartbeat"),
        json!({"lease": lease}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = api.post(&format!("/jobs/{parent}/finish"), json!({"lease": lease}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.state(parent), None);
}

#[test]
fn unknown_routes_and_methods_answer_json() {
    let server = Server::start();
    let api = server.api();
    for path in ["/nope", "/jobs/1/nope", "/jobs/1/finish/2", "/"] {
        assert_error(api.get(path), 404, "no_such_route");
        assert_error(api.post(path, json!({})), 404, "no_such_route");
    }
    for (method, path) in [
        ("PUT", "/jobs"),
        ("DELETE", "/jobs"),
        ("GET", "/dequeue"),
        ("DELETE", "/dequeue"),
        ("GET", "/jobs/1/finish"),
        ("POST", "/jobs/1"),
        ("POST", "/healthz"),
    ] {
        let answer = api.send(method, path, None);
        assert_error(answer, 405, "method_not_allowed");
    }
}

#[test]
fn a_token_is_required_when_configured() {
    let server = Server::builder().arg("--token").arg("s3cret").start();
    let right = server.api().with_token("s3cret");
    for api in [
        server.api(),
        server.api().without_token(),
        server.api().with_token("wrong"),
        server.api().with_token("s3cre"),
        server.api().with_token("s3crett"),
    ] {
        assert_error(api.get("/jobs"), 401, "unauthorized");
        assert_error(api.post("/jobs", json!({"name": "x"})), 401, "unauthorized");
        assert_error(
            api.post("/dequeue", json!({"name": "*"})),
            401,
            "unauthorized",
        );
        assert_error(api.get("/jobs/1"), 401, "unauthorized");
    }
    assert_eq!(snapshot(&right), json!([]), "refused requests created jobs");

    let id = right.create(json!({"name": "x"}));
    assert_eq!(right.job(id)["name"], "x");

    // /healthz needs no token.
    let (status, answer) = server.api().get("/healthz");
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn listening_beyond_loopback_takes_the_token_file_and_refuses_clients_without_it() {
    // No --token: the server makes its token file and requires it on every
    // address (before, it refused to start; now a token always exists).
    let dir = tempfile::tempdir().expect("temp dir");
    let child = jobmgr_in(dir.path())
        .arg("server")
        .arg("--db")
        .arg(dir.path().join("jobs.db"))
        .args(["--http", "0.0.0.0:0", "--bedrock", "none"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn jobmgr server");
    let mut server = ChildGuard::new(child, "the server on 0.0.0.0");
    let ready = ready_line(server.child())
        .unwrap_or_else(|e| panic!("no ready line from the server on 0.0.0.0: {e}"));
    let port = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http=http://"))
        .and_then(|a| a.rsplit(':').next())
        .unwrap_or_else(|| panic!("no http= in {ready:?}"))
        .to_string();
    let token = std::fs::read_to_string(dir.path().join("token")).expect("the token file");
    let url = format!("http://127.0.0.1:{port}");
    assert_error(
        Api::new(&url).without_token().get("/jobs"),
        401,
        "unauthorized",
    );
    let (status, answer) = Api::new(&url).with_token(token.trim()).get("/jobs");
    assert_eq!(status, 200, "{answer}");
}
