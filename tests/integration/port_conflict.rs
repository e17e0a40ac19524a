//! The embedded server's ports taken (its defaults are a local Bedrock's):
//! the supervisor's error says what answers there and what to run instead.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;

use crate::common::*;

/// Starts a supervisor with an embedded server on `http` and `bedrock`;
/// returns its exit code and stderr.
fn start_embedded(http: &str, bedrock: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("empty.toml");
    std::fs::write(&config, "").expect("config");
    let output = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&config)
        .arg("--worker-path")
        .arg(dir.path())
        .arg("--db")
        .arg(dir.path().join("jobs.db"))
        .args(["--http", http, "--bedrock", bedrock])
        .run_bounded("a supervisor whose port is taken");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_taken_bedrock_port_where_a_bedrock_answers_says_to_use_it_as_the_server() {
    // A stand-in Bedrock on a port from the OS: it answers a Ping with 200.
    let bedrock = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = bedrock.local_addr().unwrap().to_string();
    let (asked, request) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = bedrock.accept() {
            let mut head = Vec::new();
            let mut buf = [0u8; 256];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = asked.send(String::from_utf8_lossy(&head).into_owned());
            let _ = stream.write_all(b"200 OK\r\nContent-Length: 0\r\n\r\n");
        }
        // The listener is dropped only here, after the supervisor's bind.
    });
    let (code, stderr) = start_embedded("127.0.0.1:0", &addr);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        request.recv_timeout(DEADLINE).expect("the port was probed"),
        "Ping\r\n\r\n"
    );
    for said in [
        format!("cannot listen on {addr}: address already in use"),
        format!("a Bedrock server answers on {addr}"),
        format!("run with --server bedrock://{addr}"),
        "--http ADDR and --bedrock ADDR".to_string(),
    ] {
        assert!(stderr.contains(&said), "{said:?} not in:\n{stderr}");
    }
}

#[test]
fn a_taken_http_port_where_nothing_answers_names_the_flags_and_does_not_hang() {
    // Hostile: both held by listeners that never answer.
    let http = TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let http_addr = http.local_addr().unwrap().to_string();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let (code, stderr) = start_embedded(&http_addr, &silent_addr);
    assert_eq!(code, 1, "{stderr}");
    for said in [
        format!("cannot listen on {http_addr}: address already in use"),
        "the embedded server's HTTP port is taken".to_string(),
        format!("if a Bedrock server runs here, run with --server bedrock://{silent_addr}"),
        "--http ADDR and --bedrock ADDR".to_string(),
    ] {
        assert!(stderr.contains(&said), "{said:?} not in:\n{stderr}");
    }
    assert!(!stderr.contains("answers on"), "{stderr}");
    drop((http, silent));
}

/// `jobmgr server` on a port a jobmgr server already holds: the error says
/// one answers there, and which flags and variables move the ports.
#[test]
fn a_standalone_server_on_a_taken_port_says_what_holds_it_and_how_to_move() {
    let first = Server::start();
    let bedrock = first.bedrock.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let output = jobmgr_in(dir.path())
        .arg("server")
        .arg("--db")
        .arg(dir.path().join("jobs.db"))
        .args(["--http", "127.0.0.1:0", "--bedrock", &bedrock])
        .run_bounded("a second server on a taken Bedrock port");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for said in [
        format!("cannot listen on {bedrock}: address already in use"),
        format!("a jobmgr server already answers on {bedrock}"),
        "--http ADDR and --bedrock ADDR".to_string(),
        "JOBMGR_BEDROCK".to_string(),
    ] {
        assert!(stderr.contains(&said), "missing {said:?} in: {stderr}");
    }
}
