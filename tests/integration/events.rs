//! `GET /events`: every committed state change of every job arrives, in
//! order per job; a consumer that stops reading is dropped with a note and
//! never holds up creates; filters, the stream caps, bad parameters, resuming
//! with `Last-Event-ID`, and `jobmgr job watch`.

use crate::common::*;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// One server-sent event: its `event:` name and `data:` object.
#[derive(Debug, Clone)]
struct Event {
    kind: String,
    id: Option<String>,
    data: Value,
}

/// An open event stream, read event by event.
struct Stream {
    reader: BufReader<reqwest::blocking::Response>,
}

impl Stream {
    /// Opens `GET /events?query` (with `Last-Event-ID` when given); panics
    /// unless it is answered 200 with `text/event-stream`.
    fn open(server: &Server, query: &str, last_event_id: Option<&str>) -> Stream {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let mut request = client
            .get(format!("{}/events?{query}", server.url))
            .bearer_auth(token());
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().expect("GET /events");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let mut stream = Stream {
            reader: BufReader::new(response),
        };
        // The stream's opening comment says it is subscribed.
        let mut line = String::new();
        while !line.starts_with(": jobmgr events") {
            line.clear();
            assert!(stream.reader.read_line(&mut line).expect("read") > 0);
        }
        stream
    }

    /// The next event (comments skipped); `None` when the stream ended.
    fn next(&mut self) -> Option<Event> {
        let (mut kind, mut id, mut data) = (None, None, String::new());
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).expect("read the stream") == 0 {
                return None;
            }
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                if let Some(kind) = kind.take() {
                    let data = serde_json::from_str(&data).expect("data is JSON");
                    return Some(Event { kind, id, data });
                }
                continue;
            }
            if let Some(value) = line.strip_prefix("event: ") {
                kind = Some(value.to_string());
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push_str(value);
            } else if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.to_string());
            }
        }
    }

    /// The next `n` events.
    fn take(&mut self, n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| {
                self.next()
                    .unwrap_or_else(|| panic!("the stream ended after {i} of {n} events"))
            })
            .collect()
    }
}

/// The status line of `GET /events?query` sent from `from` (a loopback
/// address), and the connection, left open.
fn open_raw(server: &Server, from: &str, query: &str) -> (String, TcpStream) {
    let addr: SocketAddr = server.addr().parse().expect("server address");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{from}:0").parse().expect("local address");
    socket.bind(&local.into()).expect("bind");
    socket.connect(&addr.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    write!(
        stream,
        "GET /events?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\r\n",
        token()
    )
    .expect("send");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut status = Vec::new();
    let mut byte = [0u8];
    while !status.ends_with(b"\r\n") {
        assert_eq!(stream.read(&mut byte).expect("read status"), 1);
        status.push(byte[0]);
    }
    (String::from_utf8_lossy(&status).trim().to_string(), stream)
}

/// The kinds and states a job's events went through.
fn steps(events: &[&Event]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e.kind.clone(),
                e.data["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn step(kind: &str, state: &str) -> (String, String) {
    (kind.to_string(), state.to_string())
}

#[test]
fn the_stream_delivers_every_state_change_of_1000_jobs_in_order_per_job() {
    let server = Server::start();
    let api = server.api();
    let mut stream = Stream::open(&server, "", None);
    let jobs: Vec<Value> = (0..1000)
        .map(|i| json!({"name": format!("ev-many-{}", i % 4)}))
        .collect();
    let ids = api.create_batch(jobs);
    // What each job goes through, by its name's number: 0 finished, 1
    // retried then finished, 2 failed then deleted, 3 progress then finished.
    let plan = |name: &str| name.rsplit('-').next().unwrap().parse::<u32>().unwrap();
    // Each kind by its name, so that a retried job (due again at once) is
    // taken again only when asked for.
    let mut retried = Vec::new();
    for n in 0..4 {
        let handed = api
            .dequeue(json!({"name": format!("ev-many-{n}"), "numResults": 250, "leaseMs": 600000}));
        assert_eq!(handed.len(), 250, "ev-many-{n}");
        for job in handed {
            let (id, lease) = (job["jobID"].as_i64().unwrap(), job["lease"].clone());
            let path = |action: &str| format!("/jobs/{id}/{action}");
            let report = match plan(job["name"].as_str().unwrap()) {
                0 => api.post(&path("finish"), json!({"lease": lease})),
                1 => {
                    retried.push(id);
                    api.post(&path("retry"), json!({"lease": lease, "delay": 0}))
                }
                2 => api.post(
                    &path("fail"),
                    json!({"lease": lease, "run": {"exitCode": 3}}),
                ),
                _ => {
                    let (status, answer) = api.patch(
                        &format!("/jobs/{id}"),
                        json!({"data": {"done": 50}, "lease": lease}),
                    );
                    assert_eq!(status, 200, "{answer}");
                    api.post(&path("finish"), json!({"lease": lease}))
                }
            };
            assert_eq!(report.0, 200, "{}", report.1);
        }
    }
    let again = api.dequeue(json!({"name": "ev-many-1", "numResults": 1000, "leaseMs": 600000}));
    assert_eq!(again.len(), retried.len());
    for job in again {
        let id = job["jobID"].as_i64().unwrap();
        let (status, answer) = api.post(
            &format!("/jobs/{id}/finish"),
            json!({"lease": job["lease"]}),
        );
        assert_eq!(status, 200, "{answer}");
    }
    for &id in &ids {
        if api.state(id).as_deref() == Some("FAILED") {
            assert_eq!(api.delete(&format!("/jobs/{id}")).0, 200);
        }
    }
    // 250 jobs each of 3, 5, 4 and 4 events.
    let events = stream.take(250 * (3 + 5 + 4 + 4));
    let mut by_job: HashMap<i64, Vec<&Event>> = HashMap::new();
    let mut last_seq = 0;
    for event in &events {
        let seq: u64 = event
            .id
            .as_deref()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(seq > last_seq, "ids rise: {seq} after {last_seq}");
        last_seq = seq;
        assert_eq!(event.data["kind"], event.kind.as_str());
        assert!(event.data["time"].is_string());
        by_job
            .entry(event.data["jobID"].as_i64().unwrap())
            .or_default()
            .push(event);
    }
    assert_eq!(by_job.len(), 1000);
    for id in ids {
        let events = &by_job[&id];
        let name = events[0].data["name"].as_str().unwrap();
        let expected = match plan(name) {
            0 => vec![
                step("created", "QUEUED"),
                step("handed_out", "RUNNING"),
                step("finished", "FINISHED"),
            ],
            1 => vec![
                step("created", "QUEUED"),
                step("handed_out", "RUNNING"),
                step("retried", "QUEUED"),
                step("handed_out", "RUNNING"),
                step("finished", "FINISHED"),
            ],
            2 => vec![
                step("created", "QUEUED"),
                step("handed_out", "RUNNING"),
                step("failed", "FAILED"),
                step("deleted", "DELETED"),
            ],
            _ => vec![
                step("created", "QUEUED"),
                step("handed_out", "RUNNING"),
                step("progress", "RUNNING"),
                step("finished", "FINISHED"),
            ],
        };
        assert_eq!(steps(events), expected, "job {id} ({name})");
        if plan(name) == 2 {
            assert_eq!(events[2].data["exitCode"], 3, "{:?}", events[2]);
        }
    }
}

#[test]
fn a_stalled_consumer_is_dropped_with_a_note_and_creates_go_on() {
    let server = Server::start();
    let api = server.api();
    // A client that opens a stream and reads nothing, with a small window.
    let addr: SocketAddr = server.addr().parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stalled: TcpStream = socket.into();
    write!(
        stalled,
        "GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\r\n",
        token()
    )
    .unwrap();
    // Created by the thousand and one by one until the server drops the
    // stream (far more than the ring and the socket buffers hold): every
    // create is answered meanwhile.
    let mut batches = 0;
    while !server.stderr().contains("did not keep up") {
        assert!(batches < 300, "the stalled stream was never dropped");
        let jobs: Vec<Value> = (0..1000).map(|_| json!({"name": "ev-stall"})).collect();
        let (status, answer) = api.post("/jobs/batch", json!({"jobs": jobs}));
        assert_eq!(status, 200, "{answer}");
        api.create(json!({"name": "ev-stall-single"}));
        batches += 1;
    }
    // Now read, at once (the client has DROP_GRACE to read up to the note
    // before its connection is closed): what was buffered, then the note,
    // then the end.
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match stalled.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(error) => panic!("reading the stalled stream: {error}"),
        }
        if seen.windows(5).any(|w| w == b"\r\n0\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&seen);
    let note = text
        .find("event: dropped\ndata: ")
        .map(|at| &text[at + "event: dropped\ndata: ".len()..])
        .unwrap_or_else(|| panic!("no drop note in {} bytes", text.len()));
    let note: Value = serde_json::from_str(note.lines().next().unwrap()).expect("note JSON");
    assert!(note["missed"].as_u64().unwrap() > 0, "{note}");
    assert!(note["message"].as_str().unwrap().contains("Last-Event-ID"));
    assert!(
        server.stderr().contains("did not keep up"),
        "the drop is logged"
    );
    // Creates go on after the drop.
    for _ in 0..100 {
        api.create(json!({"name": "ev-stall-single"}));
    }
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 200, "{health}");
}

#[test]
fn streams_are_filtered_by_name_and_by_job() {
    let server = Server::start();
    let api = server.api();
    let mut by_name = Stream::open(&server, "name=flt-a*", None);
    for name in ["flt-b-1", "flt-a-1", "flt-b-2", "flt-a-2"] {
        api.create(json!({"name": name}));
    }
    let names: Vec<Value> = by_name
        .take(2)
        .iter()
        .map(|e| e.data["name"].clone())
        .collect();
    assert_eq!(names, [json!("flt-a-1"), json!("flt-a-2")]);

    let ids: Vec<i64> = (0..3)
        .map(|_| api.create(json!({"name": "flt-job"})))
        .collect();
    let mut by_job = Stream::open(&server, &format!("job={}&job={}", ids[0], ids[2]), None);
    let mut by_list = Stream::open(&server, &format!("job={},{}", ids[0], ids[2]), None);
    for id in [ids[1], ids[0], ids[2]] {
        assert_eq!(api.delete(&format!("/jobs/{id}")).0, 200);
    }
    for stream in [&mut by_job, &mut by_list] {
        let seen: Vec<(i64, String)> = stream
            .take(2)
            .iter()
            .map(|e| (e.data["jobID"].as_i64().unwrap(), e.kind.clone()))
            .collect();
        assert_eq!(
            seen,
            [(ids[0], "deleted".into()), (ids[2], "deleted".into())]
        );
    }
}

#[test]
fn a_stream_of_tracked_jobs_shows_only_those_tracked_also_before_a_restart() {
    let mut server = Server::start();
    let api = server.api();
    let before = api.create(json!({"name": "trk-before"}));
    assert_eq!(api.post(&format!("/jobs/{before}/track"), json!({})).0, 200);
    // Tracked before this start: read from the store.
    server.restart();
    let api = server.api();
    let mut tracked = Stream::open(&server, "tracked=true", None);
    let untracked = api.create(json!({"name": "trk-other"}));
    let now = api.create(json!({"name": "trk-now"}));
    assert_eq!(api.post(&format!("/jobs/{now}/track"), json!({})).0, 200);
    for id in [untracked, before, now] {
        assert_eq!(api.delete(&format!("/jobs/{id}")).0, 200);
    }
    // Whether a job is tracked is read as its event is sent: on a loaded
    // machine `now`'s creation may be sent after its track, and shown.
    let mut seen: Vec<(i64, String)> = Vec::new();
    while seen.iter().filter(|(_, kind)| kind == "deleted").count() < 2 {
        let event = tracked.take(1).remove(0);
        seen.push((event.data["jobID"].as_i64().unwrap(), event.kind.clone()));
        assert!(
            seen.len() <= 4,
            "more than the tracked jobs' events: {seen:?}"
        );
    }
    assert!(
        seen.iter().all(|(id, _)| *id == before || *id == now),
        "an untracked job's event: {seen:?}"
    );
    let deleted: Vec<i64> = seen
        .iter()
        .filter(|(_, kind)| kind == "deleted")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(deleted, [before, now], "{seen:?}");
}

#[test]
fn bad_parameters_are_refused_with_what_to_do() {
    let server = Server::start();
    let api = server.api();
    for query in [
        "name=",
        "job=abc",
        "job=0",
        "job=1,,2",
        "tracked=yes",
        "durationMs=0",
        "durationMs=x",
        "durationMs=86400001",
        "since=1",
        "lastEventId=nonsense",
    ] {
        let (status, answer) = api.get(&format!("/events?{query}"));
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer["message"].as_str().is_some(), "{answer}");
    }
    let (status, _) = api.without_token().get("/events");
    assert_eq!(status, 401);
    // A stream with an end ends.
    let mut stream = Stream::open(&server, "durationMs=200", None);
    assert!(stream.next().is_none());
}

#[test]
fn streams_are_capped_in_all_and_per_address() {
    let server = Server::builder()
        .arg("--http-max-event-streams")
        .arg("3")
        .arg("--http-max-event-streams-per-peer")
        .arg("2")
        .start();
    let (first, _a) = open_raw(&server, "127.0.0.1", "");
    let (second, _b) = open_raw(&server, "127.0.0.1", "");
    assert!(
        first.contains(" 200 ") && second.contains(" 200 "),
        "{first} {second}"
    );
    let (third, _c) = open_raw(&server, "127.0.0.1", "");
    assert!(third.contains(" 503 "), "{third}");
    let (other, other_stream) = open_raw(&server, "127.0.0.2", "");
    assert!(other.contains(" 200 "), "{other}");
    let (full, mut refused) = open_raw(&server, "127.0.0.3", "");
    assert!(full.contains(" 503 "), "{full}");
    let mut answer = String::new();
    let _ = refused.read_to_string(&mut answer);
    assert!(answer.contains("too_many_event_streams"), "{answer}");
    assert!(answer.contains("--http-max-event-streams"), "{answer}");
    // A stream that ends gives its place back.
    drop(other_stream);
    poll("a place for a new stream", || {
        let (status, _stream) = open_raw(&server, "127.0.0.3", "durationMs=50");
        status.contains(" 200 ").then_some(())
    });
}

#[test]
fn a_stream_resumes_after_its_last_event_id() {
    let server = Server::start();
    let api = server.api();
    let mut stream = Stream::open(&server, "", None);
    let ids: Vec<i64> = (0..3)
        .map(|_| api.create(json!({"name": "resume"})))
        .collect();
    let first = stream.next().expect("an event");
    assert_eq!(first.data["jobID"], ids[0]);
    drop(stream);
    let mut resumed = Stream::open(&server, "", first.id.as_deref());
    let next: Vec<Value> = resumed
        .take(2)
        .iter()
        .map(|e| e.data["jobID"].clone())
        .collect();
    assert_eq!(next, [json!(ids[1]), json!(ids[2])]);
    // An id from another run of the server: a gap, then now.
    let mut other = Stream::open(&server, "", Some("1-5"));
    let gap = other.next().expect("a note");
    assert_eq!(gap.kind, "gap");
    assert!(gap.data["message"].as_str().unwrap().contains("restarted"));
    let id = api.create(json!({"name": "resume"}));
    assert_eq!(other.next().expect("an event").data["jobID"], id);
}

#[test]
fn job_watch_prints_a_jobs_events_and_exits_when_it_ends() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "watched"}));
    let job = api.take("watched");
    let lease = job["lease"].clone();
    let mut watch = Command::new(bin())
        .args([
            "job",
            "watch",
            &id.to_string(),
            "--format",
            "json",
            "--server",
        ])
        .arg(&server.url)
        .arg("--token-file")
        .arg(server.token_file())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn job watch");
    let stdout = watch.stdout.take().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = lines.send(line.expect("a line"));
        }
    });
    // Progress until watch shows it (it may still be connecting).
    let mut printed = Vec::new();
    poll("watch shows the job's progress", || {
        let (status, answer) = api.patch(
            &format!("/jobs/{id}"),
            json!({"data": {"step": 1}, "lease": lease}),
        );
        assert_eq!(status, 200, "{answer}");
        printed.extend(seen.try_iter());
        (!printed.is_empty()).then_some(())
    });
    let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({"lease": lease}));
    assert_eq!(status, 200, "{answer}");
    let status = poll("watch exits", || watch.try_wait().expect("wait"));
    printed.extend(seen.iter());
    assert!(status.success(), "{status}");
    let events: Vec<Value> = printed
        .iter()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    assert!(events.iter().all(|e| e["jobID"] == id), "{printed:?}");
    assert_eq!(events[0]["kind"], "progress");
    let last = events.last().unwrap();
    assert_eq!(
        (&last["kind"], &last["state"]),
        (&json!("finished"), &json!("FINISHED"))
    );
}
