//! Blocking dequeue: a held request is answered by the commit or the moment
//! that makes a matching job due, ends empty when its wait runs out, never
//! goes to a client that left, and is answered at shutdown.

use crate::common::*;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Milliseconds since the epoch of a server timestamp
/// (`YYYY-MM-DD HH:MM:SS[.mmm]`, UTC).
fn ms(text: &Value) -> i64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {text}"));
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .unwrap_or_else(|e| panic!("bad timestamp {text:?}: {e}"))
        .and_utc()
        .timestamp_millis()
}

/// A server timestamp for `ms` milliseconds since the epoch.
fn stamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("time in range")
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

/// The local clock, in milliseconds since the epoch (same machine as the
/// server).
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// How many dequeue requests the server holds.
fn waiting(api: &Api) -> i64 {
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 200, "{health}");
    health["waiting"].as_i64().expect("waiting")
}

/// Polls until the server holds exactly `n` dequeue requests.
fn wait_for_waiters(api: &Api, n: i64) {
    poll(&format!("{n} held dequeue requests"), || {
        (waiting(api) == n).then_some(())
    });
}

/// Sends a dequeue on a thread of its own; joins to `(status, body)`.
fn dequeue_in_thread(api: &Api, body: Value) -> JoinHandle<(u16, Value)> {
    let api = api.clone();
    std::thread::spawn(move || api.post("/dequeue", body))
}

/// The jobs of a dequeue answered on a thread; panics unless it was 200.
fn joined_jobs(handle: JoinHandle<(u16, Value)>) -> Vec<Value> {
    let (status, answer) = handle.join().expect("dequeue thread");
    assert_eq!(status, 200, "dequeue failed: {answer}");
    answer["jobs"].as_array().expect("jobs").clone()
}

/// When the job was handed out, to the millisecond: its lease's end less
/// the lease's term.
fn handed_out_at(api: &Api, id: i64, lease_ms: i64) -> i64 {
    ms(&api.job(id)["leaseExpires"]) - lease_ms
}

#[test]
fn a_create_wakes_the_waiting_dequeue_it_matches_and_no_other() {
    let server = Server::start();
    let api = server.api();
    let held = dequeue_in_thread(
        &api,
        json!({"name": "lp-create-match", "waitMs": 20000, "leaseMs": 60000}),
    );
    wait_for_waiters(&api, 1);

    // A job nobody waits for leaves the waiter waiting.
    let unwanted = api.create(json!({"name": "lp-create-unwanted"}));
    assert_eq!(waiting(&api), 1, "a job of another name woke the waiter");
    assert!(
        !held.is_finished(),
        "the waiter was answered by another name"
    );

    // A job of another name wakes the (younger) waiter for that name, not
    // the older one.
    let other_held = dequeue_in_thread(
        &api,
        json!({"name": "lp-create-other", "waitMs": 20000, "leaseMs": 60000}),
    );
    wait_for_waiters(&api, 2);
    let other = api.create(json!({"name": "lp-create-other"}));
    let jobs = joined_jobs(other_held);
    assert_eq!(jobs.len(), 1, "the waiter for that name got it: {jobs:?}");
    assert_eq!(jobs[0]["jobID"], other);
    assert!(
        !held.is_finished(),
        "the waiter was answered by another name"
    );
    wait_for_waiters(&api, 1);

    let id = api.create(json!({"name": "lp-create-match", "data": {"n": 1}}));
    let jobs = joined_jobs(held);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        (jobs[0]["jobID"].as_i64(), jobs[0]["attempt"].as_i64()),
        (Some(id), Some(1))
    );
    assert_eq!(jobs[0]["data"], json!({"n": 1}));
    assert_eq!(api.job(id)["state"], "RUNNING");
    let unwanted = api.job(unwanted);
    assert_eq!(
        (unwanted["state"].as_str(), unwanted["attempts"].as_i64()),
        (Some("QUEUED"), Some(0)),
        "{unwanted}"
    );
    assert_eq!(waiting(&api), 0);
}

#[test]
fn a_waiting_dequeue_is_answered_when_a_job_falls_due() {
    let server = Server::start();
    let api = server.api();
    // Two to three seconds ahead, on a whole second.
    let first_run = (now_ms() / 1000 + 3) * 1000;
    let id = api.create(json!({"name": "lp-due", "firstRun": stamp(first_run)}));
    assert!(now_ms() < first_run, "premise: the job is not due yet");

    let jobs = api.dequeue(json!({"name": "lp-due", "waitMs": 20000, "leaseMs": 60000}));
    let returned = now_ms();
    assert_eq!(
        jobs.len(),
        1,
        "the held dequeue got the job when it fell due: {jobs:?}"
    );
    assert_eq!(jobs[0]["jobID"], id);
    assert_eq!(ms(&jobs[0]["nextRun"]), first_run, "{}", jobs[0]);
    assert!(returned >= first_run, "answered before the job was due");
    let at = handed_out_at(&api, id, 60000);
    assert!(
        at >= first_run,
        "handed out at {at}, before firstRun {first_run}"
    );
}

#[test]
fn a_retry_delay_wakes_a_waiting_dequeue() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lp-retry"}));
    let first = api.take("lp-retry");

    let held = dequeue_in_thread(
        &api,
        json!({"name": "lp-retry", "waitMs": 20000, "leaseMs": 60000}),
    );
    wait_for_waiters(&api, 1);
    let retried = now_ms();
    let (status, answer) = api.post(
        &format!("/jobs/{id}/retry"),
        json!({"lease": first["lease"], "delay": 1}),
    );
    assert_eq!(status, 200, "{answer}");

    let jobs = joined_jobs(held);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let second = &jobs[0];
    assert_eq!(
        (second["jobID"].as_i64(), second["attempt"].as_i64()),
        (Some(id), Some(2))
    );
    assert_ne!(second["lease"], first["lease"]);
    let next_run = ms(&second["nextRun"]);
    assert!(next_run > retried, "the retry delayed the job: {second}");
    let at = handed_out_at(&api, id, 60000);
    assert!(
        at >= next_run,
        "handed out at {at}, before its nextRun {next_run}"
    );
}

#[test]
fn a_repeat_wakes_a_waiting_dequeue() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lp-repeat", "repeat": "FINISHED, +1 SECONDS"}));
    let first = api.take("lp-repeat");

    let held = dequeue_in_thread(
        &api,
        json!({"name": "lp-repeat", "waitMs": 20000, "leaseMs": 60000}),
    );
    wait_for_waiters(&api, 1);
    let finished = now_ms();
    let (status, answer) = api.post(
        &format!("/jobs/{id}/finish"),
        json!({"lease": first["lease"], "data": {"run": 2}}),
    );
    assert_eq!(status, 200, "{answer}");

    let jobs = joined_jobs(held);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let second = &jobs[0];
    assert_eq!(second["jobID"], id, "{second}");
    assert_ne!(second["lease"], first["lease"], "{second}");
    assert_eq!(second["data"], json!({"run": 2}));
    let next_run = ms(&second["nextRun"]);
    assert!(
        next_run > finished,
        "the repeat scheduled the job later: {second}"
    );
    let at = handed_out_at(&api, id, 60000);
    assert!(
        at >= next_run,
        "handed out at {at}, before its nextRun {next_run}"
    );
}

#[test]
fn a_lapsed_lease_wakes_a_waiting_dequeue() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lp-lapse"}));
    // Long enough for the waiter to be seen waiting first, even on a busy
    // machine.
    let first = api.dequeue(json!({"name": "lp-lapse", "leaseMs": 5000}))[0].clone();

    let held = dequeue_in_thread(
        &api,
        json!({"name": "lp-lapse", "waitMs": 20000, "leaseMs": 60000}),
    );
    wait_for_waiters(&api, 1);
    assert_eq!(
        api.job(id)["state"],
        "RUNNING",
        "premise: still held while the waiter waits"
    );

    let jobs = joined_jobs(held);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        (jobs[0]["jobID"].as_i64(), jobs[0]["attempt"].as_i64()),
        (Some(id), Some(2))
    );
    let at = handed_out_at(&api, id, 60000);
    assert!(
        at >= ms(&first["leaseExpires"]),
        "re-issued before the lease ended"
    );
    assert_eq!(api.job(id)["lapses"], 1);
}

#[test]
fn a_wait_with_nothing_due_ends_empty() {
    let server = Server::start();
    let api = server.api();
    let later = api.create(json!({"name": "lp-empty", "firstRun": stamp(now_ms() + 3_600_000)}));
    let other = api.create(json!({"name": "lp-empty-other"}));

    let started = Instant::now();
    let jobs = api.dequeue(json!({"name": "lp-empty", "waitMs": 500}));
    let held_for = started.elapsed();
    assert!(jobs.is_empty(), "{jobs:?}");
    assert!(
        held_for >= Duration::from_millis(500),
        "answered after {held_for:?}, before the wait ended"
    );
    for id in [later, other] {
        let job = api.job(id);
        assert_eq!(
            (job["state"].as_str(), job["attempts"].as_i64()),
            (Some("QUEUED"), Some(0)),
            "{job}"
        );
    }
    assert_eq!(waiting(&api), 0);
}

#[test]
fn several_waiters_each_get_one_distinct_job() {
    let server = Server::start();
    let api = server.api();
    let held: Vec<_> = (0..5)
        .map(|_| {
            dequeue_in_thread(
                &api,
                json!({"name": "lp-many-*", "waitMs": 20000, "leaseMs": 60000}),
            )
        })
        .collect();
    wait_for_waiters(&api, 5);

    let jobs: Vec<Value> = (0..5)
        .map(|i| json!({"name": format!("lp-many-{i}")}))
        .collect();
    let created: HashSet<i64> = api.create_batch(jobs).into_iter().collect();
    assert_eq!(created.len(), 5);

    let mut got = HashSet::new();
    for handle in held {
        let jobs = joined_jobs(handle);
        assert_eq!(jobs.len(), 1, "each waiter gets one job: {jobs:?}");
        assert_eq!(jobs[0]["attempt"], 1, "{}", jobs[0]);
        assert!(
            got.insert(jobs[0]["jobID"].as_i64().unwrap()),
            "handed out twice: {}",
            jobs[0]
        );
    }
    assert_eq!(got, created);
    for id in created {
        let job = api.job(id);
        assert_eq!(
            (job["state"].as_str(), job["attempts"].as_i64()),
            (Some("RUNNING"), Some(1)),
            "{job}"
        );
    }
}

#[test]
fn a_waiter_that_disconnects_is_never_handed_a_job() {
    let server = Server::start();
    let api = server.api();
    let body = json!({"name": "lp-gone", "waitMs": 30000}).to_string();
    let request = format!(
        "POST /dequeue HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        server.addr(),
        token(),
        body.len(),
        body
    );
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    stream.write_all(request.as_bytes()).expect("send request");
    wait_for_waiters(&api, 1);
    stream.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 64];
    assert!(
        matches!(stream.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the held request was answered early"
    );
    drop(stream);
    wait_for_waiters(&api, 0);

    let id = api.create(json!({"name": "lp-gone"}));
    let job = api.job(id);
    assert_eq!(
        (
            job["state"].as_str(),
            job["attempts"].as_i64(),
            job["lastRun"].as_str()
        ),
        (Some("QUEUED"), Some(0), Some("")),
        "the gone waiter took the job: {job}"
    );
    let fresh = api.take("lp-gone");
    assert_eq!(
        (fresh["jobID"].as_i64(), fresh["attempt"].as_i64()),
        (Some(id), Some(1))
    );
}

#[test]
fn shutdown_answers_a_held_dequeue_and_exits_cleanly() {
    let mut server = Server::start();
    let api = server.api();
    let url = format!("{}/dequeue", server.url);
    // The longest wait there is: only the shutdown can answer it in time.
    let held = std::thread::spawn(move || {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client");
        client
            .post(url)
            .bearer_auth(token())
            .header("content-type", "application/json")
            .body(json!({"name": "lp-shutdown", "waitMs": 3_600_000}).to_string())
            .send()
            .and_then(|r| Ok((r.status().as_u16(), r.text()?)))
    });
    wait_for_waiters(&api, 1);

    let status = server.terminate();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    match held.join().expect("dequeue thread") {
        Ok((status, body)) => {
            let body: Value = serde_json::from_str(&body).expect("JSON answer");
            assert_eq!(
                (status, &body),
                (200, &json!({"jobs": []})),
                "held dequeue answer"
            );
        }
        // A closed connection is an acceptable answer too.
        Err(error) => assert!(!error.is_timeout(), "held dequeue timed out: {error}"),
    }
}
