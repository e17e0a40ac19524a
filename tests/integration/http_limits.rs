//! The HTTP port's limits, tried as an attacker would against the real
//! server binary: connection floods (in all, and from one address), slow
//! request heads, bodies that never finish, oversized bodies declared and
//! chunked, many big uploads at once, and big listings, while a normal
//! client is still answered and the server's RSS stays within its budget.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// Lets this test process hold the connections it floods with.
fn raise_own_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    }
}

/// A TCP connection to `server` from the local address `from`.
fn connect_from(from: IpAddr, server: &str) -> TcpStream {
    let server: SocketAddr = server.parse().expect("server address");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::new(from, 0).into())
        .expect("bind the client socket");
    socket.connect(&server.into()).expect("connect");
    socket.into()
}

/// `head` with the fixtures' bearer token after its request line: the
/// attacks here come from a client that has the token (one without it is
/// refused before its body is read).
fn authed(head: &str) -> String {
    let (line, rest) = head.split_once("\r\n").expect("a request line");
    format!("{line}\r\nAuthorization: Bearer {}\r\n{rest}", token())
}

/// An API caller whose connections come from `from`.
fn api_from(from: IpAddr) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .local_address(from)
        .timeout(DEADLINE)
        .build()
        .expect("client")
}

/// Creates a job from `from` and returns the HTTP status.
fn create_from(from: IpAddr, url: &str, name: &str) -> u16 {
    api_from(from)
        .post(format!("{url}/jobs"))
        .bearer_auth(token())
        .header("content-type", "application/json")
        .body(json!({"name": name}).to_string())
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| panic!("a normal client was not answered: {e}"))
}

/// What a flooding connection has seen: nothing yet (held by the server),
/// or an answer / a close (refused).
fn refused(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Opens `count` connections from `from` and waits until the server has
/// either held or refused each; returns them and how many it holds.
fn flood(from: IpAddr, server: &str, count: usize) -> (Vec<TcpStream>, usize) {
    let streams: Vec<TcpStream> = (0..count)
        .map(|_| {
            let stream = connect_from(from, server);
            stream.set_nonblocking(true).expect("nonblocking");
            stream
        })
        .collect();
    // The server accepts them all from its backlog; held ones stay silent.
    let mut last = usize::MAX;
    let mut steady = 0;
    let held = poll("the server to take in the whole flood", || {
        let held = streams.iter().filter(|s| !refused(s)).count();
        steady = if held == last { steady + 1 } else { 0 };
        last = held;
        // Unchanged for a second of polls: the backlog is drained.
        (steady >= 100 && held < count).then_some(held)
    });
    (streams, held)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn first_line(stream: &mut TcpStream) -> String {
    stream.set_nonblocking(false).expect("blocking");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(2).any(|w| w == b"\r\n") {
            break;
        }
    }
    String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const NEIGHBOUR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

#[test]
fn a_flood_of_connections_is_capped_while_a_normal_client_is_answered() {
    raise_own_fd_limit();
    let server = Server::builder()
        .arg("--http-max-connections")
        .arg("200")
        .arg("--http-max-connections-per-peer")
        .arg("1000")
        .arg("--http-header-timeout")
        .arg("5m")
        .start();
    let baseline_fds = open_fds(server.pid());
    let (streams, held) = flood(HERE, &server.addr(), 1000);
    // Silent connections have not sent the token: they share a quarter of
    // the port, the oldest evicted for each newcomer. Evicted ones are kept
    // to answer a request 503 until the port needs their place: the flood
    // never holds more than the port's cap.
    assert_eq!(held, 200, "the server holds exactly its cap");
    let fds = open_fds(server.pid());
    assert!(
        fds <= baseline_fds + 200 + 8,
        "the server has {fds} descriptors open under a flood of 1,000 (baseline {baseline_fds})"
    );
    // A client with the token is answered while the flood is held.
    assert_eq!(create_from(HERE, &server.url, "DuringFlood"), 200);
    drop(streams);
}

#[test]
fn a_port_full_of_authenticated_connections_refuses_a_newcomer_with_503() {
    let server = Server::builder()
        .arg("--http-max-connections")
        .arg("4")
        .start();
    let proven: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = connect_from(HERE, &server.addr());
            let head = authed(&format!(
                "GET /jobs/1 HTTP/1.1\r\nHost: {}\r\n\r\n",
                server.addr()
            ));
            stream.write_all(head.as_bytes()).expect("write");
            let line = first_line(&mut stream);
            assert!(line.starts_with("HTTP/1.1 404"), "served: {line:?}");
            stream
        })
        .collect();
    let mut newcomer = connect_from(HERE, &server.addr());
    let line = first_line(&mut newcomer);
    assert!(
        line.starts_with("HTTP/1.1 503"),
        "a newcomer is told 503, not queued, and no proven connection is closed: {line:?}"
    );
    drop(proven);
}

/// The head of the answer on `stream` (up to its blank line), or `None`
/// if the server closed or reset the connection before a whole head.
fn answer_head(stream: &mut TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading an answer: {e}"),
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// 200 clients with the token from one address, more than its cap of 128,
/// all connected before any sends (the newest evict the oldest, which
/// have not been read yet): each gets a status line, its answer or `503`
/// with `Retry-After`, and no connection is closed without one.
#[test]
fn a_burst_of_clients_over_the_per_address_cap_is_answered_503_never_closed_silently() {
    const CLIENTS: usize = 200;
    raise_own_fd_limit();
    // Time enough to connect them all before any request is read.
    let server = Server::builder()
        .arg("--http-header-timeout")
        .arg("5m")
        .start();
    // Arrivals counted, each thread waiting (with the suite's deadline,
    // unlike a Barrier, which a thread that panicked would hang) until all
    // have arrived.
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let all_at = |arrived: &std::sync::atomic::AtomicUsize, what: &str| {
        arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        poll(what, || {
            (arrived.load(std::sync::atomic::Ordering::SeqCst) >= CLIENTS).then_some(())
        });
    };
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (connected, answered) = (connected.clone(), answered.clone());
            let addr = server.addr();
            std::thread::spawn(move || {
                let mut stream = connect_from(HERE, &addr);
                all_at(&connected, "every client to connect");
                let head = authed(&format!("GET /jobs/1 HTTP/1.1\r\nHost: {addr}\r\n\r\n"));
                let sent = stream.write_all(head.as_bytes());
                let answer = sent.ok().and_then(|()| answer_head(&mut stream));
                // Served connections stay open until every client has its
                // answer, so that the burst is over the cap throughout.
                all_at(&answered, "every client to have its answer");
                answer
            })
        })
        .collect();
    let answers: Vec<Option<String>> = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .collect();
    let silent = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(
        silent, 0,
        "{silent} of {CLIENTS} clients were closed without a status line"
    );
    let answers: Vec<String> = answers.into_iter().flatten().collect();
    let served = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 404"))
        .count();
    for answer in answers.iter().filter(|a| !a.starts_with("HTTP/1.1 404")) {
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("retry-after: "),
            "{answer}"
        );
    }
    assert!(
        served <= 128 && served > 0,
        "{served} served at once from one address, against a cap of 128"
    );
}

#[test]
fn one_address_flooding_leaves_room_for_another() {
    raise_own_fd_limit();
    let server = Server::builder()
        .arg("--http-max-connections")
        .arg("400")
        .arg("--http-max-connections-per-peer")
        .arg("60")
        .arg("--http-header-timeout")
        .arg("5m")
        .start();
    let neighbours_silent = connect_from(NEIGHBOUR, &server.addr());
    neighbours_silent
        .set_nonblocking(true)
        .expect("nonblocking");
    let (streams, held) = flood(HERE, &server.addr(), 1000);
    // Its per-peer cap, and beside it the connections it evicted, kept
    // (outside its cap) to answer 503 until the port needs their place.
    assert_eq!(
        held, 399,
        "one address fills the port but for the neighbour"
    );
    assert!(
        !refused(&neighbours_silent),
        "one address's flood closes only its own connections"
    );
    // Another address is served while the flood holds its connections,
    // and so is the flooding address's own client with the token.
    assert_eq!(create_from(NEIGHBOUR, &server.url, "Neighbour"), 200);
    assert_eq!(create_from(HERE, &server.url, "Here"), 200);
    drop(streams);
}

/// Writes `bytes`, then reads until the server closes; returns what was
/// read, or None if the server had not closed by the deadline.
fn read_until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while start.elapsed() < DEADLINE {
        match stream.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(out),
        }
    }
    None
}

/// The slowloris pace: one header line per 200 ms, never the blank line,
/// until the server closes (true) or [`DEADLINE`] passes (false).
fn drip_until_closed(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    while start.elapsed() < DEADLINE {
        if stream.write_all(b"X-Slow: 1\r\n").is_err() {
            return true;
        }
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Reads one whole answer (head and `content-length` body) off `stream`,
/// leaving the connection open; returns its head.
fn read_one_answer(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content-length");
            if out.len() >= end + 4 + length {
                return head;
            }
        }
        let n = stream.read(&mut buf).expect("the answer");
        assert!(n > 0, "closed before the whole answer: {out:?}");
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_second_request_head_dripped_on_a_kept_alive_connection_is_cut_at_the_header_timeout() {
    let server = Server::builder()
        .arg("--http-header-timeout")
        .arg("1s")
        .arg("--http-idle-timeout")
        .arg("5m")
        .start();
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("write");
    let head = read_one_answer(&mut stream);
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    // The connection is kept alive: the next head is begun and dripped. It
    // must be cut at the header timeout (1 s), long before the idle one
    // (5 min), which is past the deadline polled here.
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .expect("write");
    assert!(
        drip_until_closed(&mut stream),
        "a second head dripped on a kept-alive connection was still open after {DEADLINE:?}"
    );
}

#[test]
fn a_request_head_sent_slowly_is_cut_at_the_header_timeout() {
    let server = Server::builder()
        .arg("--http-header-timeout")
        .arg("1s")
        .start();
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .expect("write");
    assert!(
        drip_until_closed(&mut stream),
        "a slowloris head was still open after {DEADLINE:?}"
    );
    // A connection that sends nothing at all is closed too.
    let mut silent = TcpStream::connect(server.addr()).expect("connect");
    assert!(
        read_until_closed(&mut silent).is_some(),
        "a silent connection was still open after {DEADLINE:?}"
    );
    // The hostile twin: a whole request on a fresh connection is answered.
    assert_eq!(server.api().get("/healthz").0, 200);
}

#[test]
fn an_idle_connection_is_closed_but_a_held_dequeue_is_not_idle() {
    let server = Server::builder()
        .arg("--http-idle-timeout")
        .arg("1s")
        .start();
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("write");
    let answer = read_until_closed(&mut stream).expect("an idle keep-alive connection is closed");
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "the request was answered before the close"
    );
    // A long-poll held for three idle timeouts is answered, not cut.
    let api = server.api();
    let waiter = {
        let api = api.clone();
        std::thread::spawn(move || api.post("/dequeue", json!({"name": "Late", "waitMs": 3000})))
    };
    let (status, answer) = waiter.join().expect("waiter");
    assert_eq!(status, 200, "a held dequeue was cut: {answer}");
    assert_eq!(answer["jobs"], json!([]));
}

/// Sends a request head and `body`, then reads the answer until close.
fn exchange(server: &Server, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream.write_all(head.as_bytes()).expect("write head");
    let _ = stream.write_all(body);
    let answer = read_until_closed(&mut stream).expect("the server closed the connection");
    String::from_utf8_lossy(&answer).into_owned()
}

fn json_of(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|_| panic!("answer is not JSON: {answer:?}"))
}

#[test]
fn a_body_that_never_finishes_is_cut_at_the_body_timeout() {
    let server = Server::builder()
        .arg("--http-body-timeout")
        .arg("1s")
        .start();
    let answer = exchange(
        &server,
        &authed(
            "POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: 100\r\n\r\n",
        ),
        b"{\"name\": \"Never",
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert_eq!(json_of(&answer)["code"], "body_timeout");
    let (status, jobs) = server.api().get("/jobs");
    assert_eq!((status, jobs["jobs"].clone()), (200, json!([])));
}

#[test]
fn an_oversized_content_length_is_refused_413_before_any_upload() {
    let server = Server::start();
    for (path, size) in [("/jobs", 1_000_000_000u64), ("/jobs/batch", 100 << 20)] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: {size}\r\n\r\n"
        );
        // Nothing of the body is sent: the answer must not wait for it.
        let answer = exchange(&server, &authed(&head), b"");
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer:?}");
        assert_eq!(json_of(&answer)["code"], "body_too_large");
    }
    // The hostile twin: a body within the limit is read.
    assert!(server.api().create(json!({"name": "Small"})) > 0);
}

#[test]
fn a_client_without_the_token_is_refused_before_its_body_is_read() {
    let server = Server::start();
    // A body within the limit, none of it sent: the 401 must not wait for it.
    let answer = exchange(
        &server,
        "POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: 1000000\r\n\r\n",
        b"",
    );
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    assert_eq!(json_of(&answer)["code"], "unauthorized");
    let (status, jobs) = server.api().get("/jobs");
    assert_eq!((status, jobs["jobs"].clone()), (200, json!([])));
}

#[test]
fn a_chunked_body_over_the_limit_is_cut() {
    let server = Server::start();
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream
        .write_all(
            authed(
                "POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n\
                 transfer-encoding: chunked\r\n\r\n",
            )
            .as_bytes(),
        )
        .expect("head");
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0usize;
    // Up to 16 MiB, stopping when the server closes: it must cut at 2 MiB.
    while sent < 16 << 20 {
        let mut piece = format!("{:x}\r\n", chunk.len()).into_bytes();
        piece.extend_from_slice(&chunk);
        piece.extend_from_slice(b"\r\n");
        if stream.write_all(&piece).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let answer = read_until_closed(&mut stream);
    let answer = String::from_utf8_lossy(answer.as_deref().unwrap_or_default()).into_owned();
    assert!(
        sent < 16 << 20,
        "the server read 16 MiB of a chunked body limited to 2 MiB: {answer:?}"
    );
    if !answer.is_empty() {
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    }
    assert_eq!(server.api().get("/jobs").1["jobs"], json!([]));
}

/// `count` uploads of `size` bytes each to `/jobs/batch`, chunked, each
/// sending `sent` bytes and then holding until `release`; returns for each
/// the first line it was answered with (empty if cut without one).
fn slow_uploads(server: &Server, count: usize, sent: usize) -> Vec<String> {
    let (ready, all_ready) = std::sync::mpsc::channel::<()>();
    let mut releases = Vec::new();
    let uploads: Vec<_> = (0..count)
        .map(|_| {
            let addr = server.addr();
            let ready = ready.clone();
            let (release, released) = std::sync::mpsc::channel::<()>();
            releases.push(release);
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).expect("connect");
                let head = "POST /jobs/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                            content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = stream.write_all(authed(head).as_bytes());
                let chunk = vec![b' '; 256 * 1024];
                let mut done = 0;
                while done < sent {
                    let mut piece = format!("{:x}\r\n", chunk.len()).into_bytes();
                    piece.extend_from_slice(&chunk);
                    piece.extend_from_slice(b"\r\n");
                    if stream.write_all(&piece).is_err() {
                        break;
                    }
                    done += chunk.len();
                }
                let _ = ready.send(());
                let _ = released.recv_timeout(DEADLINE);
                stream
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .expect("timeout");
                let mut buf = [0u8; 512];
                match stream.read(&mut buf) {
                    Ok(n) => String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                    Err(_) => String::new(),
                }
            })
        })
        .collect();
    for _ in 0..count {
        all_ready
            .recv_timeout(DEADLINE)
            .expect("every upload sent its part");
    }
    // Every upload has sent its part and holds: a normal client is answered.
    assert_eq!(create_from(HERE, &server.url, "WhileUploading"), 200);
    drop(releases);
    uploads
        .into_iter()
        .map(|u| u.join().expect("upload thread"))
        .collect()
}

#[test]
fn thirty_slow_big_uploads_stay_within_the_body_budget() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("64MiB")
        .arg("--http-body-timeout")
        .arg("5m")
        .start();
    let pid = server.pid();
    // Settle the server's own start-up allocations into the baseline.
    assert_eq!(server.api().get("/jobs").0, 200);
    let baseline = status_kib(pid, "VmHWM");
    // 30 uploads of 16 MiB each: 480 MiB offered, 64 MiB allowed.
    let answers = slow_uploads(&server, 30, 16 << 20);
    assert_peak_rss_within(pid, baseline, 64 + 48, "30 slow uploads of 16 MiB");
    // 64 MiB holds four uploads of 16 MiB; the others are told 503.
    let busy = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 503"))
        .count();
    assert!(
        busy >= 24,
        "uploads past the budget are refused: {answers:?}"
    );
    // Once they are gone, the budget is free again.
    let (status, answer) = server.api().post("/jobs", json!({"name": "After"}));
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn a_big_listing_is_paged_under_8_mib_and_concurrent_listings_stay_within_budget() {
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("64MiB")
        .start();
    let api = server.api();
    // 24 jobs of about 900 KiB of data: 21 MiB in all.
    let blob = "x".repeat(900 * 1024);
    let ids: Vec<i64> = (0..24)
        .map(|i| api.create(json!({"name": format!("Big{i}"), "data": {"blob": blob}})))
        .collect();
    let pid = server.pid();
    let baseline = status_kib(pid, "VmHWM");
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let api = api.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut pages = 0;
                let mut after = 0i64;
                loop {
                    let (status, page) = poll("a listing page within the budget", || {
                        let (status, page) = api.get(&format!("/jobs?limit=1000&after={after}"));
                        (status != 503).then_some((status, page))
                    });
                    assert_eq!(status, 200, "{page}");
                    let encoded = page.to_string().len();
                    assert!(encoded < 9 << 20, "a page of {encoded} bytes");
                    pages += 1;
                    for job in page["jobs"].as_array().expect("jobs") {
                        seen.push(job["jobID"].as_i64().expect("id"));
                    }
                    match page["nextAfter"].as_i64() {
                        Some(next) => after = next,
                        None => break,
                    }
                }
                (seen, pages)
            })
        })
        .collect();
    for reader in readers {
        let (seen, pages) = reader.join().expect("reader");
        assert_eq!(seen, ids, "paging saw every job once, in order");
        assert!(pages >= 3, "21 MiB of jobs came in {pages} pages");
    }
    assert_peak_rss_within(pid, baseline, 64 + 48, "8 concurrent listings of 21 MiB");
}

#[test]
fn a_big_failure_group_is_listed_under_8_mib() {
    let server = Server::start();
    let api = server.api();
    let blob = "x".repeat(900 * 1024);
    for _ in 0..12 {
        api.create(json!({"name": "BigFail", "data": {"blob": blob}}));
    }
    for _ in 0..12 {
        let job = api.take("BigFail");
        let id = job["jobID"].as_i64().expect("jobID");
        let (status, answer) =
            api.post(&format!("/jobs/{id}/fail"), json!({"lease": job["lease"]}));
        assert_eq!(status, 200, "{answer}");
    }
    let (status, page) = api.get("/failures/failed?limit=1000");
    assert_eq!(status, 200, "{page}");
    let jobs = page["jobs"].as_array().expect("jobs");
    let encoded = page.to_string().len();
    assert!(encoded < 9 << 20, "a failure group page of {encoded} bytes");
    assert!(!jobs.is_empty() && jobs.len() < 12, "{} jobs", jobs.len());
    assert_eq!(page["truncated"], true);
    // The twin: a page within the bound is whole and says nothing.
    let (_, small) = api.get("/failures/failed?limit=2");
    assert_eq!(small["jobs"].as_array().map(Vec::len), Some(2));
    assert!(small.get("truncated").is_none(), "{}", small["truncated"]);
}

/// A listing's status for `method` (GET or HEAD), from a client with the
/// token.
fn listing_status(server: &Server, method: reqwest::Method, path: &str) -> u16 {
    api_from(HERE)
        .request(method, format!("{}{path}", server.url))
        .bearer_auth(token())
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| panic!("a listing was not answered: {e}"))
}

#[test]
fn a_listing_by_get_or_head_takes_the_page_reserve_of_the_budget() {
    // A budget of exactly one page reserve (24 MiB).
    let server = Server::builder()
        .arg("--http-body-budget")
        .arg("24MiB")
        .arg("--http-body-timeout")
        .arg("5m")
        .start();
    for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
        assert_eq!(
            listing_status(&server, method.clone(), "/jobs"),
            200,
            "{method}"
        );
    }
    // An upload that declares 1 MiB and sends none of it holds that much of
    // the budget: no whole page is left.
    let mut holder = TcpStream::connect(server.addr()).expect("connect");
    holder
        .write_all(
            authed(
                "POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n\
                 content-length: 1048576\r\n\r\n",
            )
            .as_bytes(),
        )
        .expect("head");
    poll("a GET listing to be refused while the upload holds", || {
        (listing_status(&server, reqwest::Method::GET, "/jobs") == 503).then_some(())
    });
    for path in [
        "/jobs",
        "/jobs/1/history",
        "/workers",
        "/stats",
        "/stats/workers",
        "/failures",
        "/tracked",
    ] {
        for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
            assert_eq!(
                listing_status(&server, method.clone(), path),
                503,
                "{method} {path} builds a page without the budget for it"
            );
        }
    }
    // A request that builds no page is still served.
    assert_eq!(server.api().get("/healthz").0, 200);
    drop(holder);
    poll("the budget to be free again", || {
        (listing_status(&server, reqwest::Method::HEAD, "/jobs") == 200).then_some(())
    });
}

#[test]
fn a_body_budget_below_one_listing_page_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = jobmgr_in(dir.path())
        .args(["server", "--http", "127.0.0.1:0", "--bedrock", "none"])
        .args(["--http-body-budget", "16MiB"])
        .run_bounded("jobmgr server with a body budget below one page");
    assert_eq!(output.status.code(), Some(2), "a usage error: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--http-body-budget") && stderr.contains("at least 24MiB"),
        "says what to give: {stderr}"
    );
}

/// A job handed out again and again has as many attempts: its history
/// shows the latest 100 unless asked, at most 1000, and pages to older
/// ones with `skip`, instead of reading every attempt into one answer.
#[test]
fn a_history_shows_a_bounded_window_of_attempts_and_pages_to_older_ones() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "Again"}));
    let runs = 105;
    for _ in 0..runs {
        let job = api.take("Again");
        let lease = job["lease"].as_str().expect("lease").to_string();
        let (status, answer) = api.post(
            &format!("/jobs/{id}/retry"),
            json!({"lease": lease, "delay": 0}),
        );
        assert_eq!(status, 200, "{answer}");
    }
    let (status, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(status, 200, "{history}");
    let attempts = history["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 100);
    assert_eq!(history["attemptsTotal"], runs);
    assert_eq!(history["nextSkip"], 100);
    assert_eq!(attempts.last().unwrap()["attempt"], runs, "the latest last");

    let (status, older) = api.get(&format!("/jobs/{id}/history?skip=100&limit=10"));
    assert_eq!(status, 200, "{older}");
    let numbers: Vec<i64> = older["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2, 3, 4, 5]);
    assert!(older.get("nextSkip").is_none(), "{older}");

    for bad in [
        "limit=0",
        "limit=1001",
        "limit=-1",
        "skip=-1",
        "skip=x",
        "other=1",
    ] {
        let (status, answer) = api.get(&format!("/jobs/{id}/history?{bad}"));
        assert_eq!(status, 400, "{bad}: {answer}");
    }
    let (status, beyond) = api.get(&format!("/jobs/{id}/history?skip=1000000"));
    assert_eq!(status, 200, "{beyond}");
    assert_eq!(beyond["attempts"], json!([]));
}
