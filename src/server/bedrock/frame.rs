//! Bedrock's text framing: a method line, `Name: value` headers with
//! backslash escapes, a blank line, and a body of `Content-Length` bytes.
//! The parser is incremental (it is handed whatever bytes have arrived) and
//! bounded: no request may exceed [`MAX_REQUEST`] bytes, whatever its shape.
//! A later duplicate header replaces an earlier one, except
//! `Content-Length`: two of them are refused, since a proxy in front that
//! takes the other one would frame the connection differently.
//!
//! Two kinds of bytes are refused before anything after them is read: text
//! that is not UTF-8 (as the HTTP API refuses it), and anything that looks
//! like HTTP (a method line starting `GET`, `POST`, … or a `Host` or
//! `Origin` header). A browser can be made to send the latter to any port
//! (a cross-protocol request, with a `text/plain` body that reads as
//! Bedrock commands); as Redis's protected mode does, the connection is
//! answered with an error and closed, so no command in such a body runs.

use std::collections::HashMap;

/// The largest request accepted, headers and body together, counting any
/// blank lines before it. Job data (up to
/// 1 MiB) travels in a header, so this leaves room for that and the rest.
pub const MAX_REQUEST: usize = 2 * 1024 * 1024 + 64 * 1024;

/// The most headers one request may carry.
pub const MAX_HEADERS: usize = 256;

/// One request. Its `Debug` form hides the `token` header's value.
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// The first word of the method line, as sent.
    pub method: String,
    /// Headers by lower-cased name, values trimmed but not unescaped; a
    /// later duplicate replaces an earlier one (there is never more than one
    /// `content-length`).
    pub headers: HashMap<String, String>,
    /// The body.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: std::collections::BTreeMap<&str, &str> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let shown = if name == "token" { "<hidden>" } else { value };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("headers", &headers)
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

impl Request {
    /// A header's value with its escapes undone, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<String> {
        self.raw_header(name).map(unescape)
    }

    /// A header's value as sent. JSON values are read from this first: JSON
    /// has escapes of its own (`\n` inside a string) that header unescaping
    /// would break.
    pub fn raw_header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// Why bytes could not be read as a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The request is larger than [`MAX_REQUEST`], or has too many headers.
    TooLarge,
    /// `Content-Length` is not a number.
    BadContentLength,
    /// `Content-Length` is given more than once.
    DuplicateContentLength,
    /// A header line has no `:`.
    BadHeader,
    /// A line (or the body) is not UTF-8.
    NotUtf8,
    /// The request looks like HTTP (a browser's cross-protocol request).
    LooksLikeHttp,
}

/// HTTP's methods: a Bedrock request whose method line starts with one of
/// these (in any case) is an HTTP request sent to the wrong port.
const HTTP_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Headers only HTTP clients (browsers above all) send; Bedrock clients
/// never do.
const HTTP_ONLY_HEADERS: [&str; 2] = ["host", "origin"];

impl FrameError {
    /// The status line to answer with before closing the connection.
    pub fn status_line(&self) -> &'static str {
        match self {
            FrameError::TooLarge => "413 Request too large",
            FrameError::BadContentLength => "400 Malformed Content-Length",
            FrameError::DuplicateContentLength => "400 Duplicate Content-Length",
            FrameError::BadHeader => "400 Malformed header line",
            FrameError::NotUtf8 => "400 Request is not valid UTF-8",
            FrameError::LooksLikeHttp => {
                "400 HTTP request on the Bedrock port: send HTTP to the HTTP port"
            }
        }
    }
}

/// Reads one request from the front of `buf`. Returns the request and how
/// many bytes it used, `Ok(None)` if more bytes are needed, or an error (after
/// which the connection should be closed). Blank lines before a request are
/// skipped.
pub fn parse(buf: &[u8]) -> Result<Option<(Request, usize)>, FrameError> {
    FrameReader::default().next(buf)
}

/// An incremental reader: fed a buffer that only grows at its end, it picks
/// up where it stopped, so each byte is looked at once however slowly a
/// request arrives.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Where the current line starts.
    line_start: usize,
    /// Where the search for the current line's end resumes.
    search_from: usize,
    /// Where the current request starts, once its first line is complete.
    start: Option<usize>,
    /// Whether anything but blank space arrived for the request.
    begun: bool,
    method: Option<String>,
    headers: HashMap<String, String>,
    /// Where the body starts and how long it is, once the headers ended.
    body: Option<(usize, usize)>,
}

impl FrameReader {
    /// Whether a request has begun to arrive and is not complete.
    pub fn in_request(&self) -> bool {
        self.begun
    }

    /// Reads on in `buf` (the same buffer as before, possibly longer).
    /// After a request is returned with the count of bytes it used, the
    /// reader starts afresh, expecting those bytes to be removed from the
    /// front of the buffer.
    pub fn next(&mut self, buf: &[u8]) -> Result<Option<(Request, usize)>, FrameError> {
        loop {
            if let Some((body_start, length)) = self.body {
                if buf.len() < body_start + length {
                    return Ok(None);
                }
                let body = &buf[body_start..body_start + length];
                if std::str::from_utf8(body).is_err() {
                    return Err(FrameError::NotUtf8);
                }
                let request = Request {
                    method: self.method.take().unwrap_or_default(),
                    headers: std::mem::take(&mut self.headers),
                    body: body.to_vec(),
                };
                *self = FrameReader::default();
                return Ok(Some((request, body_start + length)));
            }
            let Some(offset) = buf[self.search_from..].iter().position(|&b| b == b'\n') else {
                let fresh = &buf[self.search_from..];
                self.begun |= fresh.iter().any(|b| !b.is_ascii_whitespace());
                self.search_from = buf.len();
                if buf.len() > MAX_REQUEST {
                    return Err(FrameError::TooLarge);
                }
                return Ok(None);
            };
            let end = self.search_from + offset;
            let line_start = self.line_start;
            let line = &buf[line_start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            self.line_start = end + 1;
            self.search_from = end + 1;
            let Some(_) = self.start else {
                if end + 1 > MAX_REQUEST {
                    return Err(FrameError::TooLarge);
                }
                if line.iter().all(|&b| b == b' ' || b == b'\t') {
                    continue;
                }
                self.begun = true;
                self.start = Some(line_start);
                let text = std::str::from_utf8(line).map_err(|_| FrameError::NotUtf8)?;
                let method = text.split_whitespace().next().unwrap_or("");
                if HTTP_METHODS.iter().any(|m| m.eq_ignore_ascii_case(method)) {
                    return Err(FrameError::LooksLikeHttp);
                }
                self.method = Some(method.to_string());
                continue;
            };
            if end + 1 > MAX_REQUEST {
                return Err(FrameError::TooLarge);
            }
            let text = std::str::from_utf8(line).map_err(|_| FrameError::NotUtf8)?;
            if text.trim().is_empty() {
                let length = match self.headers.get("content-length") {
                    None => 0,
                    Some(text) => text
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| FrameError::BadContentLength)?,
                };
                if length > MAX_REQUEST || end + 1 + length > MAX_REQUEST {
                    return Err(FrameError::TooLarge);
                }
                self.body = Some((end + 1, length));
                continue;
            }
            let Some((name, value)) = text.split_once(':') else {
                return Err(FrameError::BadHeader);
            };
            if self.headers.len() >= MAX_HEADERS {
                return Err(FrameError::TooLarge);
            }
            let name = name.trim().to_ascii_lowercase();
            if HTTP_ONLY_HEADERS.contains(&name.as_str()) {
                return Err(FrameError::LooksLikeHttp);
            }
            if name == "content-length" && self.headers.contains_key(&name) {
                return Err(FrameError::DuplicateContentLength);
            }
            self.headers.insert(name, value.trim().to_string());
        }
    }
}

/// Undoes Bedrock's header escapes as Bedrock's own parser does
/// (`SUnescape`): `\b`, `\f`, `\n`, `\r`, `\t` and `\uXXXX` are the
/// characters they name, and a backslash before any other character stands
/// for that character (`\\`, `\"`, `\/`). A `\u` without four hex digits
/// of a character, and a trailing backslash, are kept as written.
pub fn unescape(value: &str) -> String {
    if !value.contains('\\') {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek().copied() {
            Some('n') => {
                chars.next();
                out.push('\n');
            }
            Some('r') => {
                chars.next();
                out.push('\r');
            }
            Some('t') => {
                chars.next();
                out.push('\t');
            }
            Some('b') => {
                chars.next();
                out.push('\u{8}');
            }
            Some('f') => {
                chars.next();
                out.push('\u{c}');
            }
            Some('u') => {
                let hex: String = chars.clone().skip(1).take(4).collect();
                match (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32)
                {
                    Some(decoded) => {
                        for _ in 0..5 {
                            chars.next();
                        }
                        out.push(decoded);
                    }
                    None => out.push('\\'),
                }
            }
            Some(other) => {
                chars.next();
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Writes a response: the status line, `Content-Length` (always), a blank
/// line and the body.
pub fn response(status_line: &str, body: &str) -> Vec<u8> {
    response_with(status_line, &[], body)
}

/// Writes a response that tells the client the connection closes after it
/// (`Connection: close`).
pub fn closing_response(status_line: &str, body: &str) -> Vec<u8> {
    response_with(status_line, &[("Connection", "close")], body)
}

/// Writes a response with these headers before `Content-Length`.
pub fn response_with(status_line: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(status_line.len() + body.len() + 64);
    out.extend_from_slice(status_line.as_bytes());
    for (name, value) in headers {
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(b"\r\nContent-Length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_request_with_headers_and_body() {
        let bytes = b"CreateJob / HTTP/1.1\r\nName: SendEmail\r\nDATA: {\"a\":1}\r\nContent-Length: 3\r\n\r\nabcGetJob\n";
        let (request, used) = parse(bytes).unwrap().unwrap();
        assert_eq!(request.method, "CreateJob");
        assert_eq!(request.header("name").as_deref(), Some("SendEmail"));
        assert_eq!(request.raw_header("Data"), Some("{\"a\":1}"));
        assert_eq!(request.body, b"abc");
        assert_eq!(&bytes[used..], b"GetJob\n");
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        let (request, _) = parse(b"QueryJob\r\nToken: s3cret\r\njobID: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        let shown = format!("{request:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("jobid") && shown.contains("<hidden>"),
            "{shown}"
        );
    }

    #[test]
    fn waits_for_more_bytes() {
        assert_eq!(parse(b"GetJob\r\nname: x\r\n"), Ok(None));
        assert_eq!(parse(b"CreateJob\r\nContent-Length: 5\r\n\r\nab"), Ok(None));
        assert_eq!(parse(b""), Ok(None));
    }

    #[test]
    fn bare_newlines_and_duplicate_headers() {
        let (request, _) = parse(b"QueryJob\nJobID: 1\njobid: 2\n\n").unwrap().unwrap();
        assert_eq!(request.header("jobID").as_deref(), Some("2"));
    }

    #[test]
    fn refuses_oversize_and_bad_lengths() {
        assert_eq!(
            parse(b"X\r\nContent-Length: abc\r\n\r\n"),
            Err(FrameError::BadContentLength)
        );
        assert_eq!(
            parse(b"X\r\nContent-Length: 99999999999\r\n\r\n"),
            Err(FrameError::TooLarge)
        );
        let endless = vec![b'a'; MAX_REQUEST + 2];
        assert_eq!(parse(&endless), Err(FrameError::TooLarge));
        assert_eq!(
            parse(b"X\r\nno colon here\r\n\r\n"),
            Err(FrameError::BadHeader)
        );
    }

    #[test]
    fn reading_in_pieces_gives_the_same_request() {
        let bytes: &[u8] = b"\r\n  \nCreateJob\r\nname: a\r\nContent-Length: 4\r\n\r\nbodyGetJob\n";
        let whole = parse(bytes).unwrap().unwrap();
        let mut reader = FrameReader::default();
        let mut got = None;
        for end in 0..=bytes.len() {
            if let Some(found) = reader.next(&bytes[..end]).unwrap() {
                got = Some(found);
                break;
            }
        }
        assert_eq!(got, Some(whole));
        assert!(!reader.in_request());
    }

    #[test]
    fn unescapes_header_values() {
        assert_eq!(unescape(r"a\nb\tc\\d\u00e9"), "a\nb\tc\\dé");
        assert_eq!(unescape(r"trailing\"), "trailing\\");
        assert_eq!(unescape(r"\uZZZZ"), "\\uZZZZ");
        // Any other escaped character stands for itself, as in Bedrock.
        assert_eq!(unescape(r#"{\"a\":\"b\/c\"}"#), r#"{"a":"b/c"}"#);
        assert_eq!(unescape(r"\b\f\x"), "\u{8}\u{c}x");
    }

    #[test]
    fn a_duplicate_content_length_is_refused_whatever_its_value() {
        for bytes in [
            &b"CreateJob\r\nContent-Length: 2\r\ncontent-length: 0\r\n\r\n{}"[..],
            &b"CreateJob\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"[..],
        ] {
            assert_eq!(parse(bytes), Err(FrameError::DuplicateContentLength));
        }
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_wherever_it_is() {
        for bytes in [
            &b"\xc3\x28CreateJob\r\nname: x\r\n\r\n"[..],
            b"CreateJob\r\nname: \xa0\xa1\r\n\r\n",
            b"CreateJob\r\nContent-Length: 2\r\n\r\n\xff\xfe",
        ] {
            assert_eq!(parse(bytes), Err(FrameError::NotUtf8), "{bytes:?}");
        }
    }

    #[test]
    fn http_is_refused_at_its_first_line_or_header() {
        // Refused as soon as the line arrives, before the rest is read.
        for bytes in [
            &b"POST / HTTP/1.1\r\n"[..],
            b"get /jobs HTTP/1.0\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"CreateJob\r\nHost: 127.0.0.1:8888\r\n",
            b"CreateJob\r\norigin: http://evil.example\r\n",
        ] {
            assert_eq!(parse(bytes), Err(FrameError::LooksLikeHttp), "{bytes:?}");
        }
        // Bedrock's own method lines may end like HTTP's.
        assert!(
            parse(b"CreateJob / HTTP/1.1\r\nname: a\r\n\r\n")
                .unwrap()
                .is_some()
        );
        assert!(parse(b"GetJobs\r\nname: a\r\n\r\n").unwrap().is_some());
    }

    #[test]
    fn closing_responses_say_so() {
        assert_eq!(
            closing_response("200 OK", "{}"),
            b"200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn responses_always_carry_a_length() {
        assert_eq!(
            response("404 No job found", ""),
            b"404 No job found\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(
            response("200 OK", "{}"),
            b"200 OK\r\nContent-Length: 2\r\n\r\n{}"
        );
    }
}
