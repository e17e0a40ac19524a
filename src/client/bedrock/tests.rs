//! Unit tests of the Bedrock client: framing, reading answers, modes.
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::ReadBuf;

use super::*;

fn handout(fields: Value) -> Map<String, Value> {
    match fields {
        Value::Object(map) => map,
        _ => unreachable!("an object"),
    }
}

#[test]
fn a_real_bedrocks_retry_after_is_a_term_that_an_earlier_repeat_shortens() {
    let term = |fields: Value| retry_after_term(&handout(fields)).map(|d| d.as_secs());
    assert_eq!(
        term(serde_json::json!({"retryAfter": "+5 MINUTES"})),
        Some(300)
    );
    assert_eq!(
        term(serde_json::json!({"retryAfter": "+1 HOUR, +30 SECONDS"})),
        Some(3_630)
    );
    assert_eq!(term(serde_json::json!({"retryAfter": ""})), None);
    assert_eq!(term(serde_json::json!({})), None);
    // Calendar arithmetic has no fixed length: no term.
    assert_eq!(term(serde_json::json!({"retryAfter": "+1 MONTH"})), None);
    // A repeat due sooner than the retryAfter is when Bedrock hands the
    // job out again.
    assert_eq!(
        term(serde_json::json!({"retryAfter": "+1 HOUR", "repeat": "FINISHED, +1 MINUTE"})),
        Some(60)
    );
    assert_eq!(
        term(serde_json::json!({"retryAfter": "+1 MINUTE", "repeat": "FINISHED, +1 HOUR"})),
        Some(60)
    );
    // SCHEDULED counts from the nextRun it was due at; one long past is
    // re-anchored, at most an interval away.
    let due = Timestamp(Timestamp::now().0 - 20_000).to_string();
    let scheduled = term(serde_json::json!({
        "retryAfter": "+1 HOUR", "repeat": "SCHEDULED, +1 MINUTE", "nextRun": due
    }))
    .unwrap();
    assert!((38..=40).contains(&scheduled), "{scheduled}");
    assert_eq!(
        term(serde_json::json!({
            "retryAfter": "+1 HOUR", "repeat": "SCHEDULED, +1 MINUTE",
            "nextRun": "2020-01-01 00:00:00"
        })),
        Some(60)
    );
    // A repeat that cannot be counted leaves the retryAfter.
    assert_eq!(
        term(serde_json::json!({"retryAfter": "+5 MINUTES", "repeat": "FINISHED, START OF DAY"})),
        Some(300)
    );
}

/// Hands out its bytes `step` at a time, then end of file.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl Trickle {
    fn new(data: &[u8], step: usize) -> Self {
        Trickle {
            data: data.to_vec(),
            pos: 0,
            step,
        }
    }
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .step
            .min(self.data.len() - self.pos)
            .min(buf.remaining());
        let start = self.pos;
        buf.put_slice(&self.data[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

async fn read_all(data: &[u8], step: usize) -> Result<Response, ExchangeError> {
    read_response(
        &mut Trickle::new(data, step),
        &mut Vec::new(),
        Duration::from_secs(5),
    )
    .await
}

#[tokio::test]
async fn reads_an_answer_split_into_single_bytes() {
    let body = br#"{"jobs":[{"jobID":7,"name":"a","data":{}}]}"#;
    let mut bytes = format!("200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    bytes.extend_from_slice(body);
    let response = read_all(&bytes, 1).await.expect("answer");
    assert_eq!(response.code, 200);
    assert_eq!(response.status_line, "200 OK");
    assert_eq!(response.body, body);
    let (jobs, unreadable) = parse_jobs(&response.body).expect("jobs");
    assert!(unreadable.is_empty());
    assert_eq!(
        (jobs[0].id, jobs[0].attempt, jobs[0].lease.clone()),
        (7, 1, None)
    );
}

#[tokio::test]
async fn leaves_the_next_answer_in_the_buffer() {
    let bytes = b"404 No job found\nContent-Length: 0\n\n200 OK\r\ncontent-length: 2\r\nX-Extra:  y \r\n\r\n{}";
    let mut stream = Trickle::new(bytes, 7);
    let mut buf = Vec::new();
    let first = read_response(&mut stream, &mut buf, Duration::from_secs(5))
        .await
        .expect("first");
    assert_eq!(
        (first.code, first.status_line.as_str(), first.body.len()),
        (404, "404 No job found", 0)
    );
    let second = read_response(&mut stream, &mut buf, Duration::from_secs(5))
        .await
        .expect("second");
    assert_eq!(
        (second.code, second.body.as_slice()),
        (200, b"{}".as_slice())
    );
    assert_eq!(second.headers.get("x-extra").map(String::as_str), Some("y"));
    assert!(buf.is_empty(), "nothing left over: {buf:?}");
}

#[tokio::test]
async fn an_answer_without_content_length_has_no_body() {
    let mut stream = Trickle::new(b"404 No job found\r\n\r\n405 Not held\r\n\r\n", 3);
    let mut buf = Vec::new();
    let first = read_response(&mut stream, &mut buf, Duration::from_secs(5))
        .await
        .expect("first");
    assert_eq!((first.code, first.body.len()), (404, 0));
    let second = read_response(&mut stream, &mut buf, Duration::from_secs(5))
        .await
        .expect("second");
    assert_eq!(second.status_line, "405 Not held");
}

#[tokio::test]
async fn refuses_an_oversize_answer_before_reading_its_body() {
    let bytes = format!("200 OK\r\nContent-Length: {}\r\n\r\n{{}}", MAX_BODY + 1);
    match read_all(bytes.as_bytes(), 4096).await {
        Err(ExchangeError::Protocol(message)) => {
            assert!(message.contains("limit"), "{message}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    let endless = vec![b'x'; MAX_HEAD + 10];
    let mut with_status = b"200 OK\r\nX: ".to_vec();
    with_status.extend_from_slice(&endless);
    for bytes in [endless, with_status] {
        assert!(matches!(
            read_all(&bytes, 1024).await,
            Err(ExchangeError::Protocol(_))
        ));
    }
    let mut many = b"200 OK\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        many.extend_from_slice(format!("h{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert!(matches!(
        read_all(&many, 1024).await,
        Err(ExchangeError::Protocol(_))
    ));
}

#[tokio::test]
async fn refuses_garbage_status_lines_and_headers() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
        b"hello\r\n\r\n",
        b"20 OK\r\n\r\n",
        b"2000 OK\r\n\r\n",
        b"099 Too low\r\n\r\n",
        b"600 Too high\r\n\r\n",
        b"200OK\r\n\r\n",
        b"200 OK\r\nno colon\r\n\r\n",
        b"200 OK\r\nContent-Length: -1\r\n\r\n",
        b"200 OK\r\nContent-Length: ten\r\n\r\n",
    ] {
        match read_all(bytes, 5).await {
            Err(ExchangeError::Protocol(_)) => {}
            other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bytes)),
        }
    }
    let bare = read_all(b"\r\n\r\n200\r\n\r\n", 5)
        .await
        .expect("bare code");
    assert_eq!(bare.code, 200);
}

#[tokio::test]
async fn a_close_says_whether_part_of_an_answer_had_come() {
    let nothing = read_all(b"", 5).await.expect_err("closed");
    assert!(
        matches!(nothing, ExchangeError::Closed { partial: false }),
        "{nothing:?}"
    );
    assert!(nothing.nothing_received());
    let cut = read_all(b"200 OK\r\nContent-Length: 10\r\n\r\nabc", 5)
        .await
        .expect_err("cut");
    assert!(
        matches!(cut, ExchangeError::Closed { partial: true }),
        "{cut:?}"
    );
    assert!(!cut.nothing_received());
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let (mut client, _server) = tokio::io::duplex(64);
    let error = read_response(&mut client, &mut Vec::new(), Duration::from_millis(50))
        .await
        .expect_err("timeout");
    assert!(matches!(error, ExchangeError::TimedOut { .. }), "{error:?}");
    assert!(!error.nothing_received(), "a timeout is not retried");
}

#[test]
fn requests_never_carry_a_line_break_in_a_value() {
    let mut data = Data::new();
    data.insert(
        "msg".into(),
        Value::String("one\r\ntwo \\ \"three\"".into()),
    );
    let request = Request::new("UpdateJob")
        .value("jobID", 5)
        .text("name", "a\nb\\c")
        .json("data", &data)
        .expect("json");
    let text = String::from_utf8(request.encode(None)).expect("utf-8");
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(
        lines,
        [
            "UpdateJob",
            "jobID: 5",
            "name: a\\nb\\\\c",
            // Escaped as Bedrock-PHP escapes JSON: Bedrock unescapes it.
            r#"data: {"msg":"one\\r\\ntwo \\\\ \\"three\\""}"#,
            "",
            ""
        ]
    );
    assert_eq!(
        crate::server::bedrock::frame::unescape("a\\nb\\\\c"),
        "a\nb\\c"
    );
    assert_eq!(escape("plain/name*"), "plain/name*");
}

#[test]
fn addresses_are_checked_and_described() {
    let source = BedrockSource::new("127.0.0.1:8888").expect("plain");
    assert_eq!(source.describe(), "bedrock://127.0.0.1:8888");
    let prefixed = BedrockSource::new("bedrock://db.example:9999").expect("prefixed");
    assert_eq!(prefixed.describe(), "bedrock://db.example:9999");
    assert_eq!(
        BedrockSource::new("[::1]:8888").expect("v6").describe(),
        "bedrock://[::1]:8888"
    );
    for bad in [
        "",
        "host",
        "host:",
        ":8888",
        "host:99999",
        "host:0",
        "host:port",
        "a b:1",
        "h/x:1",
    ] {
        assert!(
            matches!(BedrockSource::new(bad), Err(SourceError::Refused(_))),
            "{bad:?} should be refused"
        );
    }
    assert_eq!(source.fetch_mode(), FetchMode::Blocking);
}

#[test]
fn the_mode_follows_how_fast_404s_come() {
    let source = BedrockSource::new("127.0.0.1:1").expect("source");
    source.judge(Duration::from_millis(500), Duration::ZERO);
    assert_eq!(
        source.fetch_mode(),
        FetchMode::Blocking,
        "short waits tell nothing"
    );
    source.judge(Duration::from_secs(30), Duration::from_millis(5));
    assert_eq!(source.fetch_mode(), FetchMode::Polling);
    source.back_off();
    source.back_off();
    source.back_off();
    source.back_off();
    source.back_off();
    assert_eq!(lock(&source.inner.fetch).backoff, MAX_BACKOFF);
    let pause = source.pause();
    assert!(
        pause >= MAX_BACKOFF.mul_f64(0.8) && pause <= MAX_BACKOFF.mul_f64(1.2),
        "{pause:?}"
    );
    source.job_arrived();
    assert_eq!(lock(&source.inner.fetch).backoff, FIRST_BACKOFF);
    source.judge(Duration::from_secs(30), Duration::from_millis(1500));
    assert_eq!(source.fetch_mode(), FetchMode::Blocking);
}

#[test]
fn status_classes_map_to_errors() {
    let source = BedrockSource::new("127.0.0.1:1").expect("source");
    let answer = |line: &str| Response {
        code: line[..3].parse().expect("code"),
        status_line: line.into(),
        headers: HashMap::new(),
        body: Vec::new(),
    };
    assert!(matches!(
        source.failure("x", &answer("404 No job")),
        SourceError::NotFound(_)
    ));
    assert!(matches!(
        source.failure("x", &answer("405 Not held")),
        SourceError::Refused(_)
    ));
    assert!(matches!(
        source.failure("x", &answer("503 Busy")),
        SourceError::Unavailable(_)
    ));
    assert!(matches!(
        source.failure("x", &answer("302 Elsewhere")),
        SourceError::Protocol(_)
    ));
    assert!(answer("200 OK").keeps_alive());
    let mut closing = answer("200 OK");
    closing.headers.insert("connection".into(), "Close".into());
    assert!(!closing.keeps_alive());
}

#[test]
fn the_token_travels_in_a_header_after_the_method_line() {
    let token = ApiToken::new("abc123").expect("token");
    let request = Request::new("QueryJob").value("jobID", 7);
    let text = String::from_utf8(request.encode(Some(&token))).expect("utf-8");
    assert_eq!(text, "QueryJob\r\nToken: abc123\r\njobID: 7\r\n\r\n");
    let text = String::from_utf8(request.encode(None)).expect("utf-8");
    assert!(!text.contains("Token"), "{text}");
}
