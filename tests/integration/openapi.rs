//! The OpenAPI document is served and describes the routes that exist.

use crate::common::*;

#[test]
fn every_documented_operation_is_routed() {
    let server = Server::start();
    let api = server.api();
    let (status, doc) = api.get("/openapi.json");
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 20, "{paths:?}");
    let mut checked = 0;
    for (path, item) in paths {
        let mut concrete = path.replace("{id}", "1").replace("{group}", "exit:3");
        if path == "/events" {
            // Its answer is a stream, not JSON: ask for a refusal.
            concrete.push_str("?job=none");
        }
        for method in ["get", "post", "patch", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let body = (method != "get" && method != "delete").then(|| "{}".to_string());
            let (status, answer) = api.send(&method.to_uppercase(), &concrete, body);
            let code = answer["code"].as_str().unwrap_or("");
            assert!(
                code != "no_such_route" && code != "method_not_allowed",
                "{method} {path} is documented but not routed: HTTP {status} {answer}"
            );
            // Every documented status is one the operation declares.
            let declared = item[method]["responses"].as_object().expect("responses");
            assert!(
                declared.contains_key(&status.to_string()),
                "{method} {path}: HTTP {status} is not documented: {answer}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 24, "only {checked} operations checked");
}

#[test]
fn an_undocumented_route_is_refused() {
    let server = Server::start();
    assert_error(server.api().get("/jobs/1/bogus"), 404, "no_such_route");
    assert_error(
        server.api().send("PUT", "/jobs", Some("{}".into())),
        405,
        "method_not_allowed",
    );
}

// Regressions found by tests/schemathesis.sh, which tests the server
// against this document.

#[test]
fn null_for_an_optional_field_is_refused_and_changes_nothing() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(serde_json::json!({"name": "Kept"}));
    let before = api.get("/jobs").1;
    for (method, path, body) in [
        (
            "POST",
            "/jobs".to_string(),
            r#"{"name":"New","priority":null}"#,
        ),
        ("POST", "/jobs".to_string(), r#"{"name":null}"#),
        (
            "POST",
            "/jobs/batch".to_string(),
            r#"{"jobs":[{"name":"New","repeat":null}]}"#,
        ),
        (
            "POST",
            "/jobs/requeue".to_string(),
            r#"{"jobIDs":[1],"name":null}"#,
        ),
        ("POST", "/jobs/requeue".to_string(), r#"{"jobIDs":null}"#),
        (
            "POST",
            "/dequeue".to_string(),
            r#"{"name":"Kept","waitMs":null}"#,
        ),
        (
            "PATCH",
            format!("/jobs/{id}"),
            r#"{"data":{"a":1},"repeat":null}"#,
        ),
        ("POST", format!("/jobs/{id}/retry"), r#"{"delay":null}"#),
        ("POST", format!("/jobs/{id}/finish"), r#"{"lease":null}"#),
        ("POST", format!("/jobs/{id}/fail"), r#"{"lease":null}"#),
        ("POST", format!("/jobs/{id}/heartbeat"), r#"{"lease":null}"#),
    ] {
        let (status, answer) = api.send(method, &path, Some(body.into()));
        assert_eq!(status, 400, "{method} {path} {body}: {answer}");
        let message = answer["message"].as_str().unwrap_or("");
        assert!(
            message.contains("null") && message.contains("leave an optional field out"),
            "{method} {path} {body}: {answer}"
        );
    }
    assert_eq!(
        api.get("/jobs").1,
        before,
        "a refused request changed something"
    );
}

#[test]
fn the_document_says_what_the_server_takes() {
    let server = Server::start();
    let api = server.api();
    let (_, doc) = api.get("/openapi.json");
    let id_schema = &doc["components"]["parameters"]["JobIdPath"]["schema"];
    assert_eq!(id_schema["type"], "integer", "{id_schema}");
    assert_eq!(id_schema["minimum"], 1, "{id_schema}");
    // So 0 is outside it, and refused.
    assert_error(api.get("/jobs/0"), 400, "malformed_job_id");

    // An empty state filter means any state, as documented.
    let params = doc["paths"]["/jobs"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let state = params.iter().find(|p| p["name"] == "state").unwrap();
    assert!(
        state["schema"]["enum"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("")),
        "{state}"
    );
    api.create(serde_json::json!({"name": "Any"}));
    let (status, answer) = api.get("/jobs?state=");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["jobs"].as_array().map(Vec::len), Some(1), "{answer}");

    // priority and jobPriority are one field: the document allows either,
    // not both, and the server refuses both.
    let create = &doc["components"]["schemas"]["CreateJob"];
    assert_eq!(
        create["not"]["required"],
        serde_json::json!(["priority", "jobPriority"]),
        "{create}"
    );
    let (status, answer) = api.post(
        "/jobs",
        serde_json::json!({"name": "Both", "priority": 0, "jobPriority": 0}),
    );
    assert_eq!(status, 400, "{answer}");
}

#[test]
fn times_are_written_in_the_documented_form_or_refused() {
    let server = Server::start();
    let api = server.api();
    // A retry so far off that no time can be written used to come out as
    // the year -262143, as if long due; now it is refused.
    let id = api.create(serde_json::json!({"name": "Far"}));
    api.take("Far");
    let (status, answer) = api.post(
        &format!("/jobs/{id}/retry"),
        serde_json::json!({"delay": 9_000_000_000_000_000i64}),
    );
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("malformed_delay")),
        "{answer}"
    );
    assert_eq!(
        api.state(id).as_deref(),
        Some("RUNNING"),
        "changed by a refused retry"
    );
    // The last second the form can write is fine.
    let (status, answer) = api.post(
        &format!("/jobs/{id}/retry"),
        serde_json::json!({"nextRun": "9999-12-31 23:59:59"}),
    );
    assert_eq!(status, 200, "{answer}");
    // Years the form cannot write are refused, not written as "+10000-…".
    for time in ["+10000-01-01 00:00:00", "-0001-01-01 00:00:00"] {
        let (status, answer) = api.post(
            "/jobs",
            serde_json::json!({"name": "Odd", "firstRun": time}),
        );
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some("malformed_first_run")),
            "{time}: {answer}"
        );
    }
    let (_, doc) = api.get("/openapi.json");
    let pattern = doc["components"]["schemas"]["WrittenTime"]["pattern"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, list) = api.get("/jobs");
    for job in list["jobs"].as_array().unwrap() {
        for key in ["nextRun", "created"] {
            let text = job[key].as_str().unwrap();
            let digits = text.bytes().filter(u8::is_ascii_digit).count();
            assert!(
                text.len() >= 19 && text.as_bytes()[4] == b'-' && (digits == 14 || digits == 17),
                "{key} {text:?} does not match {pattern}"
            );
        }
    }
}

#[test]
fn failure_groups_are_read_and_acted_on_as_documented() {
    let server = Server::start();
    let api = server.api();
    let (_, doc) = api.get("/openapi.json");
    let key = &doc["components"]["schemas"]["FailureGroupKey"];
    assert_eq!(key["pattern"], "^[A-Za-z0-9_:+-]{1,64}$", "{key}");
    let bulk = &doc["components"]["schemas"]["BulkAction"];
    assert_eq!(bulk["additionalProperties"], false, "{bulk}");
    assert_eq!(
        (
            &bulk["properties"]["count"]["minimum"],
            &bulk["properties"]["count"]["maximum"]
        ),
        (&serde_json::json!(1), &serde_json::json!(10000)),
        "{bulk}"
    );

    let id = api.create(serde_json::json!({"name": "Broken"}));
    api.take("Broken");
    let (status, answer) = api.post(
        &format!("/jobs/{id}/fail"),
        serde_json::json!({"data": {"_jobmgr": {"outcome": "exit", "exitCode": 3}}}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = api.get("/failures/exit:3");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["jobs"][0]["jobID"], id, "{answer}");

    // Keys outside the pattern are refused.
    let long = "x".repeat(65);
    for bad in ["a%20b", "a.b", "a%2Fb", long.as_str()] {
        assert_error(api.get(&format!("/failures/{bad}")), 400, "invalid_request");
    }
    // So are counts outside 1..=10000, and a null one (which used to be
    // taken as "not given"); none of them changes anything.
    for body in [r#"{"count":null}"#, r#"{"count":0}"#, r#"{"count":10001}"#] {
        for action in ["retry", "delete"] {
            let (status, answer) = api.send(
                "POST",
                &format!("/failures/exit:3/{action}"),
                Some(body.into()),
            );
            assert_eq!(status, 400, "{action} {body}: {answer}");
        }
    }
    assert_eq!(api.state(id).as_deref(), Some("FAILED"));

    let (status, answer) = api.post("/failures/exit:3/retry", serde_json::json!({"count": 1}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, serde_json::json!({"retried": 1, "jobIDs": [id]}));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));

    // The history tells the failed attempt; an unknown job has none.
    let (status, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(status, 200, "{history}");
    assert_eq!(history["attempts"][0]["failure"], "exit:3", "{history}");
    assert_eq!(history["attempts"][0]["exitCode"], 3, "{history}");
    assert_error(api.get("/jobs/999/history"), 404, "no_such_job");
}

#[test]
fn statistics_never_reach_before_the_earliest_written_time() {
    let server = Server::start();
    let api = server.api();
    // The default window before an early `to` used to start in the year
    // -1, written as "-0001-12-31 00:00:00"; it now starts at the earliest
    // time the document's form can write.
    let (status, answer) = api.get("/stats?to=0000-01-01%2005:30:00");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["from"], "0000-01-01 00:00:00", "{answer}");
    assert_eq!(answer["to"], "0000-01-01 05:00:00", "{answer}");
    // An empty window is refused.
    assert_error(
        api.get("/stats?to=0000-01-01%2000:30:00"),
        400,
        "invalid_request",
    );
    assert_error(api.get("/stats?period=week"), 400, "invalid_request");
}
