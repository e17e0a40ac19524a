//! No lock-out by connections that have not authenticated: any local user
//! (a worker too) can open sockets from every address in 127.0.0.0/8, so
//! per-address caps alone let it fill both ports. Here floods from
//! 127.0.0.2..=127.0.0.40, more than every cap, are held open (and reopened
//! as the server closes them, as an attacker would), while a client with
//! the token on 127.0.0.1 must still be answered on both ports;
//! connections that send requests without the token are answered 401 and
//! closed; and authenticated idle connections survive a flood.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::*;

/// Caps small enough for a light test, which the flood exceeds threefold:
/// 39 addresses × 16 connections = 624 per port against 200 in all.
const MAX: &str = "200";
const PER_PEER: usize = 16;
const ADDRESSES: std::ops::RangeInclusive<u8> = 2..=40;

fn raise_own_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    }
}

/// A server with the small caps; its unauthenticated connections get the
/// whole test to prove themselves on HTTP (so that, without eviction, the
/// flood would hold the port for the whole wait).
fn server() -> Server {
    let per_peer = PER_PEER.to_string();
    Server::builder()
        .arg("--http-max-connections")
        .arg(MAX)
        .arg("--http-max-connections-per-peer")
        .arg(&per_peer)
        .arg("--bedrock-max-connections")
        .arg(MAX)
        .arg("--bedrock-max-connections-per-peer")
        .arg(&per_peer)
        .arg("--http-header-timeout")
        .arg("5m")
        .start()
}

fn attacker(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// Whether the server has closed `stream` (nonblocking); what it said
/// before is read and dropped, so an answered connection the server keeps
/// open is held on.
fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() != ErrorKind::WouldBlock,
        }
    }
}

/// An attacker holding [`PER_PEER`] connections from each address of
/// [`ADDRESSES`] to each of `targets`, reopening each one the server
/// closes, until dropped. `send` is written on every connection it opens.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
}

impl Flood {
    fn start(targets: &[String], send: impl Fn(&str) -> Vec<u8> + Send + 'static) -> Flood {
        raise_own_fd_limit();
        let open = |target: &str, from: IpAddr| -> TcpStream {
            let stream = connect_from(from, target);
            stream.set_nonblocking(true).expect("nonblocking");
            stream
        };
        let mut held: Vec<(String, IpAddr, TcpStream)> = Vec::new();
        for target in targets {
            for n in ADDRESSES {
                for _ in 0..PER_PEER {
                    let mut stream = open(target, attacker(n));
                    let _ = stream.write_all(&send(target));
                    held.push((target.clone(), attacker(n), stream));
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut reopened = 0;
                while !stop.load(Ordering::Relaxed) {
                    for (target, from, stream) in &mut held {
                        if closed(stream) {
                            let mut fresh = open(target, *from);
                            let _ = fresh.write_all(&send(target));
                            *stream = fresh;
                            reopened += 1;
                        }
                    }
                    // The attacker's pace: a sweep over its sockets every
                    // 20 ms (this paces the attack; it waits for nothing).
                    std::thread::sleep(Duration::from_millis(20));
                }
                reopened
            })
        };
        Flood {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A Bedrock request with the token from 127.0.0.1, on a new connection.
fn bedrock_query(server: &Server) -> String {
    raw_exchange_from(
        attacker(1),
        &server.bedrock,
        &with_token_header(b"QueryJob\r\njobID: 1\r\n\r\n"),
    )
}

/// An HTTP request with the token from 127.0.0.1, on a new connection.
fn http_query(server: &Server) -> String {
    let head = format!(
        "GET /jobs/1 HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        server.addr(),
        token()
    );
    raw_exchange_from(attacker(1), &server.addr(), head.as_bytes())
}

/// Polls until a client with the token is answered on both ports.
fn both_ports_answer(server: &Server, during: &str) {
    poll(
        &format!("a Bedrock client with the token to be answered {during}"),
        || {
            let answer = bedrock_query(server);
            answer.starts_with("404 ").then_some(())
        },
    );
    poll(
        &format!("an HTTP client with the token to be answered {during}"),
        || {
            let answer = http_query(server);
            answer.starts_with("HTTP/1.1 404").then_some(())
        },
    );
}

#[test]
fn silent_connections_from_many_addresses_do_not_lock_out_a_client_with_the_token() {
    let server = server();
    let flood = Flood::start(&[server.bedrock.clone(), server.addr()], |_| Vec::new());
    both_ports_answer(&server, "during a flood of silent connections");
    // And again, five times, while the flood keeps reopening. On a loaded
    // machine the flood may close a client's new connection before its
    // request is read (closed, or told to retry at once), and a retry is
    // served. What must never come is a refusal for want of places (the
    // lock-out).
    for _ in 0..5 {
        poll(
            "a Bedrock client with the token to be answered again",
            || {
                let answer = bedrock_query(&server);
                assert!(
                    !answer.starts_with("503 Too many"),
                    "Bedrock refused: {answer:?}"
                );
                answer.starts_with("404 ").then_some(())
            },
        );
        poll("an HTTP client with the token to be answered again", || {
            let answer = http_query(&server);
            assert!(
                !answer.contains("too_many_connections"),
                "HTTP refused: {answer:?}"
            );
            answer.starts_with("HTTP/1.1 404").then_some(())
        });
    }
    drop(flood);
}

/// A request without the token for each port.
fn tokenless(server: &Server, target: &str) -> Vec<u8> {
    if target == server.bedrock {
        b"QueryJob\r\njobID: 1\r\n\r\n".to_vec()
    } else {
        format!("GET /jobs/1 HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
    }
}

#[test]
fn a_request_without_the_token_is_refused_and_its_connection_closed() {
    let server = server();
    for target in [server.bedrock.clone(), server.addr()] {
        let mut stream = connect_from(attacker(2), &target);
        stream
            .write_all(&tokenless(&server, &target))
            .expect("write");
        let said = read_until_closed(&mut stream, &target);
        assert!(
            said.starts_with("401 ") || said.starts_with("HTTP/1.1 401"),
            "{target}: {said:?}"
        );
    }
}

#[test]
fn connections_sending_requests_without_the_token_do_not_lock_anyone_out() {
    let server = server();
    let (bedrock, http) = (server.bedrock.clone(), server.addr());
    let flood = Flood::start(&[bedrock.clone(), http.clone()], move |target| {
        if target == bedrock {
            b"QueryJob\r\njobID: 1\r\n\r\n".to_vec()
        } else {
            format!("GET /jobs/1 HTTP/1.1\r\nHost: {http}\r\n\r\n").into_bytes()
        }
    });
    both_ports_answer(&server, "during a flood of requests without the token");
    drop(flood);
}

/// A connection with the token that has been answered once, then idles.
fn proven_bedrock(server: &Server) -> TcpStream {
    let mut stream = connect_from(attacker(1), &server.bedrock);
    exchange(
        &mut stream,
        &with_token_header(b"QueryJob\r\njobID: 1\r\n\r\n"),
        "404 ",
    );
    stream
}

fn proven_http(server: &Server) -> TcpStream {
    let mut stream = connect_from(attacker(1), &server.addr());
    exchange(&mut stream, &http_keepalive(server), "HTTP/1.1 404");
    stream
}

fn http_keepalive(server: &Server) -> Vec<u8> {
    format!(
        "GET /jobs/1 HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        server.addr(),
        token()
    )
    .into_bytes()
}

/// Sends `request` on `stream` and reads its answer's first bytes, which
/// must start with `expect`.
fn exchange(stream: &mut TcpStream, request: &[u8], expect: &str) {
    stream.write_all(request).expect("write");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).expect("an answer");
    let said = String::from_utf8_lossy(&buf[..n]);
    assert!(said.starts_with(expect), "{said:?}");
}

#[test]
fn authenticated_idle_connections_are_not_evicted_by_a_flood() {
    let server = server();
    let mut bedrock: Vec<TcpStream> = (0..8).map(|_| proven_bedrock(&server)).collect();
    let mut http: Vec<TcpStream> = (0..8).map(|_| proven_http(&server)).collect();
    let flood = Flood::start(&[server.bedrock.clone(), server.addr()], |_| Vec::new());
    // The flood has cycled through the unauthenticated pool many times
    // over once a client with the token is answered through it.
    both_ports_answer(
        &server,
        "during a flood, with idle authenticated connections",
    );
    for stream in &mut bedrock {
        exchange(
            stream,
            &with_token_header(b"QueryJob\r\njobID: 1\r\n\r\n"),
            "404 ",
        );
    }
    let request = http_keepalive(&server);
    for stream in &mut http {
        exchange(stream, &request, "HTTP/1.1 404");
    }
    drop(flood);
}
