//! The site's load: HTTP/1.1 GETs over keep-alive connections, either at a
//! fixed rate whatever the answers (open loop: each request has a scheduled
//! send time, goes out on the first free connection, and its latency counts
//! from that scheduled time, so a slow answer is never hidden by the
//! requests it delays), or as fast as the answers come (closed loop, to
//! find the site's capacity).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long an answer may take before the request counts as failed.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a window of load saw.
pub struct Window {
    /// Latencies in ms of the requests answered 200, from their scheduled
    /// send time (open loop) or their send (closed loop).
    pub latencies: Vec<f64>,
    /// Requests that failed (no answer, or not 200).
    pub errors: usize,
    /// Answers per second: those answered over the time from the first
    /// scheduled send to the last answer (or the window, if longer).
    pub rate: f64,
}

/// One keep-alive connection, opened again when the server closes it.
struct Connection {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buffer: Vec<u8>,
}

impl Connection {
    fn new(addr: SocketAddr) -> Self {
        Connection {
            addr,
            stream: None,
            buffer: Vec::with_capacity(4096),
        }
    }

    /// Sends `request` and reads its answer; whether it was a 200. A
    /// keep-alive connection the server closed meanwhile is opened again
    /// once.
    fn exchange(&mut self, request: &[u8]) -> bool {
        for _ in 0..2 {
            if self.stream.is_none() {
                let Ok(stream) = TcpStream::connect(self.addr) else {
                    return false;
                };
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
                self.stream = Some(stream);
            }
            match self.one(request) {
                Ok((ok, keep)) => {
                    if !keep {
                        self.stream = None;
                    }
                    return ok;
                }
                Err(_) => self.stream = None,
            }
        }
        false
    }

    /// One request and answer: (status 200, connection kept).
    fn one(&mut self, request: &[u8]) -> std::io::Result<(bool, bool)> {
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(request)?;
        self.buffer.clear();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buffer.extend_from_slice(&chunk[..n]);
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&self.buffer[..head_end]).to_ascii_lowercase();
        let ok = head.starts_with("http/1.1 200");
        let keep = !head.contains("\r\nconnection: close");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let mut body = self.buffer.len() - head_end;
        while body < length {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            body += n;
        }
        Ok((ok, keep))
    }
}

/// The bytes of a GET of `path`.
pub fn request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: site\r\n\r\n").into_bytes()
}

/// `rate` requests a second for `length`, each scheduled at a fixed time
/// and sent on the first of `connections` free then; waits for the last
/// answers.
pub fn open_loop(
    addr: SocketAddr,
    request: &[u8],
    rate: f64,
    length: Duration,
    connections: usize,
) -> Window {
    let next = AtomicU64::new(0);
    let results = Mutex::new((Vec::new(), 0usize));
    // A moment for the threads to start before the first send.
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + length;
    let last = Mutex::new(start);
    std::thread::scope(|scope| {
        for _ in 0..connections {
            scope.spawn(|| {
                let mut connection = Connection::new(addr);
                let mut latencies = Vec::new();
                let mut errors = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let at = start + Duration::from_secs_f64(i as f64 / rate);
                    if at >= end {
                        break;
                    }
                    let now = Instant::now();
                    if at > now {
                        std::thread::sleep(at - now);
                    }
                    let ok = connection.exchange(request);
                    let done = Instant::now();
                    if ok {
                        latencies.push((done - at).as_secs_f64() * 1e3);
                    } else {
                        errors += 1;
                    }
                    let mut last = last.lock().expect("lock");
                    *last = (*last).max(done);
                }
                let mut results = results.lock().expect("lock");
                results.0.extend(latencies);
                results.1 += errors;
            });
        }
    });
    let (latencies, errors) = results.into_inner().expect("lock");
    let took = (last.into_inner().expect("lock") - start).max(length);
    Window {
        rate: latencies.len() as f64 / took.as_secs_f64(),
        latencies,
        errors,
    }
}

/// `connections` clients each sending its next request as soon as the
/// last is answered, for `length`.
pub fn closed_loop(
    addr: SocketAddr,
    request: &[u8],
    length: Duration,
    connections: usize,
) -> Window {
    let results = Mutex::new((Vec::new(), 0usize));
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..connections {
            scope.spawn(|| {
                let mut connection = Connection::new(addr);
                let mut latencies = Vec::new();
                let mut errors = 0;
                while start.elapsed() < length {
                    let sent = Instant::now();
                    if connection.exchange(request) {
                        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                    } else {
                        errors += 1;
                    }
                }
                let mut results = results.lock().expect("lock");
                results.0.extend(latencies);
                results.1 += errors;
            });
        }
    });
    let (latencies, errors) = results.into_inner().expect("lock");
    Window {
        rate: latencies.len() as f64 / start.elapsed().as_secs_f64(),
        latencies,
        errors,
    }
}
