//! A Bedrock client over a raw socket for the tests of the Bedrock port:
//! it writes requests as given and reads whole responses (status line,
//! headers, `Content-Length` body), so that every byte the server sends is
//! checked.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// One response: status line, headers and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The status line.
    pub status: String,
    /// The headers, as sent.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Response {
    /// The status number.
    pub fn code(&self) -> u16 {
        self.status
            .split(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    /// The body of a `200 OK` as JSON; panics otherwise.
    #[track_caller]
    pub fn json(&self) -> Value {
        assert_eq!(self.status, "200 OK", "response: {self:?}");
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    /// A `200 OK`, whatever its body.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert_eq!(self.status, "200 OK", "response: {self:?}");
    }

    /// An error: exactly this status line and an empty body.
    #[track_caller]
    pub fn assert_error(&self, line: &str) {
        assert_eq!(self.status, line, "response: {self:?}");
        assert_eq!(self.body, "", "an error has an empty body");
        assert_eq!(self.content_length(), 0);
    }

    /// One of these error lines, with an empty body.
    #[track_caller]
    pub fn assert_error_one_of(&self, lines: &[&str]) {
        assert!(lines.contains(&self.status.as_str()), "response: {self:?}");
        assert_eq!(self.body, "");
        assert_eq!(self.content_length(), 0);
    }

    /// `202 Successfully queued` (the answer to `Connection: forget`).
    #[track_caller]
    pub fn assert_queued_202(&self) {
        assert_eq!(self.status, "202 Successfully queued", "response: {self:?}");
        assert_eq!(self.body, "");
        assert_eq!(self.content_length(), 0);
    }

    /// `200 OK` with an empty body and `Content-Length: 0`.
    #[track_caller]
    pub fn assert_empty_ok(&self) {
        assert_eq!(self.status, "200 OK", "response: {self:?}");
        assert_eq!(self.body, "");
        assert_eq!(self.content_length(), 0);
    }

    pub fn content_length(&self) -> usize {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().expect("Content-Length is a number"))
            .expect("Content-Length is present")
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one response from the front of `buf`: `None` if it is not all
/// there yet. Panics on a response without `Content-Length`.
pub fn parse_response(buf: &[u8]) -> Option<(Response, usize)> {
    let head_end = find(buf, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).expect("response head is UTF-8");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("response header without ':' in {head:?}"));
            (name.trim().to_string(), value.trim().to_string())
        })
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .unwrap_or_else(|| panic!("response without Content-Length: {head:?}"))
        .1
        .parse()
        .expect("Content-Length is a number");
    let end = head_end + 4 + length;
    if buf.len() < end {
        return None;
    }
    let body = String::from_utf8(buf[head_end + 4..end].to_vec()).expect("body is UTF-8");
    Some((
        Response {
            status,
            headers,
            body,
        },
        end,
    ))
}

/// A connection to the Bedrock port that reads whole responses.
#[derive(Debug)]
pub struct Conn {
    /// The socket (for tests that write to it directly).
    pub stream: TcpStream,
    buf: Vec<u8>,
}

/// The safety net on every socket read; no test relies on it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Conn {
    pub fn open(addr: &str) -> Conn {
        assert!(!addr.is_empty(), "the server reported no Bedrock address");
        let stream = TcpStream::connect(addr).expect("connect to the Bedrock port");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// A connection to `addr` from the local address `from` (such as
    /// 127.0.0.2, to be another peer than 127.0.0.1).
    pub fn open_from(from: std::net::IpAddr, addr: &str) -> Conn {
        let stream = super::connect_from(from, addr);
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next response, or `None` if the server closed the connection
    /// first. Panics if nothing comes within the read timeout.
    pub fn next_response(&mut self) -> Option<Response> {
        loop {
            if let Some((response, used)) = parse_response(&self.buf) {
                self.buf.drain(..used);
                return Some(response);
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!(
                    "no response within {:?} ({e}); have {:?}",
                    self.stream.read_timeout().unwrap(),
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    #[track_caller]
    pub fn read_response(&mut self) -> Response {
        match self.next_response() {
            Some(response) => response,
            None => panic!(
                "connection closed before a whole response; have {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    #[track_caller]
    pub fn call(&mut self, bytes: &[u8]) -> Response {
        self.send(bytes);
        self.read_response()
    }

    #[track_caller]
    pub fn responses(&mut self, n: usize) -> Vec<Response> {
        (0..n).map(|_| self.read_response()).collect()
    }

    /// Asserts the server closes the connection with nothing more to say.
    #[track_caller]
    pub fn assert_closed(&mut self) {
        if let Some(response) = self.next_response() {
            panic!("expected the connection to close, got {response:?}");
        }
        assert!(
            self.buf.is_empty(),
            "the connection closed after a partial response {:?}",
            String::from_utf8_lossy(&self.buf)
        );
    }

    /// Asserts that nothing arrives for `for_how_long` (a short check that
    /// an incomplete request is not answered early).
    #[track_caller]
    pub fn assert_quiet(&mut self, for_how_long: Duration) {
        self.stream.set_read_timeout(Some(for_how_long)).unwrap();
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected silence, got {other:?} {byte:?}"),
        }
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    }
}
