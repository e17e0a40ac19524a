//! A browser can never drive the HTTP API: requests naming a foreign host
//! (DNS rebinding), carrying a foreign origin, or with a body that is not
//! declared JSON are refused and change nothing; the same requests from an
//! ordinary client, or from names and origins the operator allowed, work.

use serde_json::{Value, json};

use crate::common::*;

const JOB: &str = r#"{"name":"from-a-page"}"#;

/// Jobs named `from-a-page`.
fn page_jobs(server: &Server) -> Vec<Value> {
    let (status, list) = server.api().get("/jobs?name=from-a-page");
    assert_eq!(status, 200, "{list}");
    list["jobs"].as_array().expect("jobs").clone()
}

fn port(server: &Server) -> String {
    server.addr().rsplit(':').next().unwrap().to_string()
}

#[test]
fn a_foreign_host_is_refused_and_the_servers_own_names_are_not() {
    let server = Server::start();
    let api = server.api();
    let port = port(&server);
    let rebound = format!("evil.example:{port}");
    let json_type = ("content-type", "application/json");
    // A page on evil.example whose name now resolves to 127.0.0.1.
    let answer =
        api.send_with_headers("POST", "/jobs", &[("host", &rebound), json_type], Some(JOB));
    assert_error(answer.clone(), 403, "foreign_host");
    let message = answer.1["message"].as_str().unwrap();
    assert!(message.contains("--allowed-host"), "{message}");
    assert_error(
        api.send_with_headers("GET", "/jobs", &[("host", &rebound)], None),
        403,
        "foreign_host",
    );
    assert_eq!(page_jobs(&server), Vec::<Value>::new(), "nothing created");

    // Its own address, localhost and a loopback literal are its own.
    for host in [
        server.addr(),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
    ] {
        let (status, answer) =
            api.send_with_headers("POST", "/jobs", &[("host", &host), json_type], Some(JOB));
        assert_eq!(status, 200, "Host: {host}: {answer}");
    }
    assert_eq!(page_jobs(&server).len(), 4);
    // Health checks may name the host as they please.
    let (status, _) = api.send_with_headers("GET", "/healthz", &[("host", &rebound)], None);
    assert_eq!(status, 200, "/healthz by any name");
}

#[test]
fn a_foreign_origin_is_refused_and_no_origin_is_fine() {
    let server = Server::start();
    let api = server.api();
    let json_type = ("content-type", "application/json");
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let answer =
            api.send_with_headers("POST", "/jobs", &[("origin", origin), json_type], Some(JOB));
        assert_error(answer.clone(), 403, "foreign_origin");
        assert!(
            answer.1["message"]
                .as_str()
                .unwrap()
                .contains("--allowed-origin"),
            "{}",
            answer.1
        );
        assert_error(
            api.send_with_headers("GET", "/jobs", &[("origin", origin)], None),
            403,
            "foreign_origin",
        );
    }
    assert_eq!(page_jobs(&server), Vec::<Value>::new(), "nothing created");
    // The server's own origin (same host and port as the request) is not
    // foreign: pages it serves itself may call it.
    let own = format!("http://{}", server.addr());
    let (status, answer) =
        api.send_with_headers("POST", "/jobs", &[("origin", &own), json_type], Some(JOB));
    assert_eq!(status, 200, "{answer}");
    // No Origin: an ordinary client.
    api.create(json!({"name": "from-a-page"}));
    assert_eq!(page_jobs(&server).len(), 2);
}

#[test]
fn bodies_not_declared_json_get_415_and_change_nothing() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "target"}));
    for content_type in [
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|t| ("content-type", t))
            .into_iter()
            .collect();
        assert_error(
            api.send_with_headers("POST", "/jobs", &headers, Some(JOB)),
            415,
            "unsupported_media_type",
        );
        assert_error(
            api.send_with_headers(
                "PATCH",
                &format!("/jobs/{id}"),
                &headers,
                Some(r#"{"data":{"changed":true}}"#),
            ),
            415,
            "unsupported_media_type",
        );
    }
    // A form's empty text/plain POST is refused too: it declares a type.
    assert_error(
        api.send_with_headers(
            "POST",
            &format!("/jobs/{id}/cancel"),
            &[("content-type", "text/plain")],
            Some(""),
        ),
        415,
        "unsupported_media_type",
    );
    assert_eq!(page_jobs(&server), Vec::<Value>::new(), "nothing created");
    assert_eq!(api.job(id)["data"], json!({}), "nothing changed");
    // Declared JSON (any case, with parameters) is taken.
    let (status, answer) = api.send_with_headers(
        "POST",
        "/jobs",
        &[("content-type", "Application/JSON; charset=utf-8")],
        Some(JOB),
    );
    assert_eq!(status, 200, "{answer}");
    // A request without a body needs no type.
    let (status, answer) = api.send_with_headers("DELETE", &format!("/jobs/{id}"), &[], None);
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn allowed_hosts_and_origins_are_let_through_and_no_others() {
    let server = Server::builder()
        .arg("--allowed-host")
        .arg("jobs.example.com")
        .arg("--allowed-origin")
        .arg("https://ops.example.com")
        .env("JOBMGR_ALLOWED_HOSTS", "ignored-when-the-flag-is-given")
        .start();
    let api = server.api();
    let port = port(&server);
    let json_type = ("content-type", "application/json");
    let named = format!("jobs.example.com:{port}");
    let (status, answer) =
        api.send_with_headers("POST", "/jobs", &[("host", &named), json_type], Some(JOB));
    assert_eq!(status, 200, "an allowed host: {answer}");
    let (status, answer) = api.send_with_headers(
        "POST",
        "/jobs",
        &[("origin", "https://ops.example.com"), json_type],
        Some(JOB),
    );
    assert_eq!(status, 200, "an allowed origin: {answer}");
    assert_error(
        api.send_with_headers(
            "POST",
            "/jobs",
            &[("origin", "https://evil.example"), json_type],
            Some(JOB),
        ),
        403,
        "foreign_origin",
    );
    assert_error(
        api.send_with_headers(
            "GET",
            "/jobs",
            &[("host", "ignored-when-the-flag-is-given")],
            None,
        ),
        403,
        "foreign_host",
    );
    assert_eq!(page_jobs(&server).len(), 2);

    // The environment's comma list, when no flag is given.
    let server = Server::builder()
        .env("JOBMGR_ALLOWED_HOSTS", "a.example,b.example")
        .env("JOBMGR_ALLOWED_ORIGINS", "https://c.example")
        .start();
    let api = server.api();
    for headers in [
        [("host", "a.example"), ("origin", "https://c.example")],
        [("host", "b.example"), ("x-none", "")],
    ] {
        let (status, answer) = api.send_with_headers("GET", "/jobs", &headers, None);
        assert_eq!(status, 200, "{headers:?}: {answer}");
    }
}

#[test]
fn a_malformed_allowed_origin_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = jobmgr_in(dir.path())
        .args(["server", "--http", "127.0.0.1:0", "--bedrock", "none"])
        .args(["--allowed-origin", "ops.example.com"])
        .run_bounded("jobmgr server with a bad --allowed-origin");
    assert_eq!(output.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("scheme://host[:port]"),
        "says what to give: {stderr}"
    );
}

#[test]
fn a_supervisors_embedded_server_checks_hosts_and_takes_its_allowed_names() {
    let sup = Supervisor::embedded()
        .arg("--allowed-host")
        .arg("jobs.example.com")
        .start();
    let api = Api::new(&sup.ready_field("http"));
    let (status, answer) =
        api.send_with_headers("GET", "/jobs", &[("host", "jobs.example.com:8889")], None);
    assert_eq!(status, 200, "{answer}");
    assert_error(
        api.send_with_headers("GET", "/jobs", &[("host", "evil.example:8889")], None),
        403,
        "foreign_host",
    );
    assert_error(
        api.send_with_headers(
            "POST",
            "/jobs",
            &[("origin", "http://evil.example")],
            Some(JOB),
        ),
        403,
        "foreign_origin",
    );
}
