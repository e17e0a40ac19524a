//! The supervisor's first words: "ready" only once its server has answered
//! (else "waiting for server at URL: why"), and the embedded server named
//! plainly in its log fields.

use std::net::TcpListener;
use std::process::{Command, Stdio};

use crate::common::*;

/// Starts a supervisor of `url` with a directory of its own; returns its
/// first stdout line, then kills it.
fn first_line(url: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    std::fs::create_dir(d.join("workers")).expect("workers");
    std::fs::write(d.join("empty.toml"), "").expect("config");
    let mut command = Command::new(bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    command
        .arg("--config")
        .arg(d.join("empty.toml"))
        .args(["--server", url])
        .arg("--worker-path")
        .arg(d.join("workers"))
        .arg("--spool-dir")
        .arg(d.join("spool"))
        .arg("--scratch-dir")
        .arg(d.join("scratch"))
        .env("JOBMGR_TOKEN", token())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().expect("spawn jobmgr");
    let line = ready_line(&mut child);
    kill_and_reap(&mut child, "a supervisor for its first line");
    line.expect("a first line on stdout")
}

#[test]
fn ready_is_said_only_when_the_server_answers() {
    // A port nobody listens on: bound by us, then released.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let line = first_line(&url);
    assert!(
        line.starts_with(&format!("jobmgr supervisor waiting for server at {url}: ")),
        "{line}"
    );
    assert!(line.contains("Connection refused"), "the cause: {line}");
    assert!(!line.contains("ready"), "{line}");

    let server = Server::start();
    let line = first_line(&server.url);
    assert!(
        line.starts_with("jobmgr supervisor ready: server=http://"),
        "{line}"
    );
}

#[test]
fn the_embedded_server_is_named_plainly_in_the_log() {
    let sup = Supervisor::embedded().start();
    let log = wait_for("the supervisor's start line", &sup, || {
        let log = sup.stderr();
        log.contains("supervisor started").then_some(log)
    });
    assert!(log.contains("server=embedded"), "{log}");
    assert!(!log.contains("server=embedded server"), "{log}");
}
