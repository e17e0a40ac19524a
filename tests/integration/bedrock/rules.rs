//! Bedrock's remaining rules through the Bedrock port of a real server whose
//! time is scripted (`--clock-file`), so that every time is exact: missed
//! `SCHEDULED` windows re-anchored on their phase (spec §4),
//! `data.originalNextRun` for `retryAfter` jobs with a `SCHEDULED` repeat,
//! `manual…` jobs without a hand-out count, `402 Malformed delay`,
//! `Connection: close` echoed, `401 Invalid JSON` for a CreateJobs element
//! that is not a job, and a duplicate `Content-Length` refused.

use jobmgr::protocol::Timestamp;
use serde_json::json;

use super::*;

/// A server on a scripted clock, and a connection to its Bedrock port.
fn scripted(at: &str) -> (Clock, Server, Conn) {
    let clock = Clock::at(at);
    let server = clock.server().start();
    let conn = Conn::open(&server.bedrock);
    (clock, server, conn)
}

/// QueryJob's `nextRun`.
#[track_caller]
fn next_run(conn: &mut Conn, id: i64) -> String {
    let job = query(conn, id);
    job["nextRun"]
        .as_str()
        .unwrap_or_else(|| panic!("nextRun is text: {job}"))
        .to_string()
}

/// FinishJob over the port; panics unless it succeeds.
#[track_caller]
fn finish(conn: &mut Conn, id: i64) {
    conn.call(&req("FinishJob", &[("jobID", &id.to_string())]))
        .assert_empty_ok();
}

/// Whether a response carries `Connection: close`.
fn says_close(response: &Response) -> bool {
    response
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close"))
}

#[test]
fn missed_scheduled_windows_are_reanchored_on_their_original_phase() {
    let (clock, _server, mut conn) = scripted("2026-05-01 10:03:00");
    // A fleet staggered by phase: every 5 minutes at :00:20 and :02:40,
    // every 10 minutes at :01:00.
    let a = create(
        &mut conn,
        &[
            ("name", "stagger"),
            ("repeat", "SCHEDULED, +5 MINUTES"),
            ("firstRun", "2026-05-01 10:00:20"),
        ],
    );
    let b = create(
        &mut conn,
        &[
            ("name", "stagger"),
            ("repeat", "SCHEDULED, +5 MINUTES"),
            ("firstRun", "2026-05-01 10:02:40"),
        ],
    );
    let c = create(
        &mut conn,
        &[
            ("name", "stagger-retried"),
            ("repeat", "scheduled, +10 minutes"),
            ("firstRun", "2026-05-01 10:01:00"),
        ],
    );
    let got = conn
        .call(&req(
            "GetJobs",
            &[("name", "stagger*"), ("numResults", "3")],
        ))
        .json();
    assert_eq!(got["jobs"].as_array().map(Vec::len), Some(3), "{got}");

    // An outage: nine windows of a and b missed, four of c.
    clock.set("2026-05-01 10:47:05");
    finish(&mut conn, a);
    finish(&mut conn, b);
    conn.call(&req("RetryJob", &[("jobID", &c.to_string())]))
        .assert_empty_ok();
    // The first slot after now on each job's own phase, not the first
    // missed window (10:05:20, 10:07:40, 10:11:00), which would run them
    // all at once.
    assert_eq!(next_run(&mut conn, a), "2026-05-01 10:50:20");
    assert_eq!(next_run(&mut conn, b), "2026-05-01 10:47:40");
    assert_eq!(next_run(&mut conn, c), "2026-05-01 10:51:00");

    // Not behind: the computed time, as before.
    clock.set("2026-05-01 10:48:00");
    let got = get_job(&mut conn, "stagger");
    assert_eq!(got["jobID"], json!(b));
    finish(&mut conn, b);
    assert_eq!(next_run(&mut conn, b), "2026-05-01 10:52:40");
}

#[test]
fn long_and_snapping_scheduled_repeats_keep_their_computed_time_when_behind() {
    let (clock, _server, mut conn) = scripted("2026-05-01 10:03:00");
    // 2026-05-01 is a Friday (WEEKDAY 5).
    let cases = [
        (
            "SCHEDULED, +4 HOURS",
            "2026-05-01 00:00:00",
            "2026-05-01 04:00:00",
        ),
        (
            "SCHEDULED, +1 DAY",
            "2026-04-29 09:00:00",
            "2026-04-30 09:00:00",
        ),
        (
            "SCHEDULED, +1 HOUR, START OF HOUR",
            "2026-05-01 00:30:00",
            "2026-05-01 01:00:00",
        ),
        (
            "SCHEDULED, +5 MINUTES, WEEKDAY 5",
            "2026-05-01 00:10:00",
            "2026-05-01 00:15:00",
        ),
        (
            "SCHEDULED, -5 MINUTES",
            "2026-05-01 10:00:00",
            "2026-05-01 09:55:00",
        ),
    ];
    let ids: Vec<i64> = cases
        .iter()
        .map(|(repeat, first_run, _)| {
            let id = create(
                &mut conn,
                &[
                    ("name", "kept"),
                    ("repeat", repeat),
                    ("firstRun", first_run),
                ],
            );
            assert_eq!(get_job(&mut conn, "kept")["jobID"], json!(id));
            id
        })
        .collect();
    clock.set("2026-05-01 10:47:05");
    for ((repeat, _, computed), id) in cases.iter().zip(ids) {
        finish(&mut conn, id);
        assert_eq!(next_run(&mut conn, id), *computed, "{repeat}");
    }
}

#[test]
fn retry_after_jobs_with_a_scheduled_repeat_count_from_their_latest_hand_out() {
    let (clock, server, mut conn) = scripted("2026-05-01 10:00:30");
    let api = server.api();
    let id = create(
        &mut conn,
        &[
            ("name", "hourly-report"),
            ("data", r#"{"k":1}"#),
            ("repeat", "SCHEDULED, +1 HOUR"),
            ("retryAfter", "+5 MINUTES"),
            ("firstRun", "2026-05-01 10:00:00"),
        ],
    );
    let id_text = id.to_string();

    // The first hand-out keeps the time the run was due at.
    let first = get_job(&mut conn, "hourly-report");
    assert_eq!(first["data"], json!({"k": 1}));
    let job = query(&mut conn, id);
    assert_eq!(job["state"], "RUNQUEUED");
    assert_eq!(job["nextRun"], "2026-05-01 10:05:30");
    assert_eq!(
        job["data"],
        json!({"k": 1, "retryAfterCount": 1, "originalNextRun": "2026-05-01 10:00:00"})
    );
    // A hand-out after the retryAfter lapsed keeps the time it was due at
    // in its turn, replacing the first one's.
    clock.set("2026-05-01 10:06:00");
    let second = get_job(&mut conn, "hourly-report");
    assert_eq!(second["nextRun"], "2026-05-01 10:05:30");
    let job = query(&mut conn, id);
    assert_eq!(job["nextRun"], "2026-05-01 10:11:00");
    assert_eq!(
        job["data"],
        json!({"k": 1, "retryAfterCount": 2, "originalNextRun": "2026-05-01 10:05:30"})
    );
    // Progress (UpdateJob) from the holder replaces the data, not the
    // server's bookkeeping.
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &id_text), ("data", r#"{"k":1,"step":2}"#)],
    ))
    .assert_empty_ok();
    assert_eq!(
        query(&mut conn, id)["data"],
        json!({"k": 1, "step": 2, "retryAfterCount": 2, "originalNextRun": "2026-05-01 10:05:30"})
    );
    // The repeat counts from it, and the key stays with the job's data,
    // the server's value even when the worker sends back an older one.
    clock.set("2026-05-01 10:07:00");
    conn.call(&req(
        "FinishJob",
        &[
            ("jobID", &id_text),
            (
                "data",
                r#"{"k":2,"originalNextRun":"2026-05-01 10:00:00","retryAfterCount":2}"#,
            ),
        ],
    ))
    .assert_empty_ok();
    let job = query(&mut conn, id);
    assert_eq!(
        (&job["state"], &job["nextRun"], &job["data"]),
        (
            &json!("QUEUED"),
            &json!("2026-05-01 11:05:30"),
            &json!({"k": 2, "originalNextRun": "2026-05-01 10:05:30"})
        )
    );

    // RetryJob with ignoreRepeat and new data keeps the anchor of the
    // hand-out it reports on; the next hand-out replaces it.
    clock.set("2026-05-01 11:05:35");
    get_job(&mut conn, "hourly-report");
    conn.call(&req(
        "RetryJob",
        &[
            ("jobID", &id_text),
            ("delay", "60"),
            ("ignoreRepeat", "true"),
            ("data", r#"{"k":3}"#),
        ],
    ))
    .assert_empty_ok();
    let job = query(&mut conn, id);
    assert_eq!(job["nextRun"], "2026-05-01 11:06:35");
    assert_eq!(
        job["data"],
        json!({"k": 3, "originalNextRun": "2026-05-01 11:05:30"})
    );
    clock.set("2026-05-01 11:06:40");
    get_job(&mut conn, "hourly-report");
    assert_eq!(
        api.job(id)["data"]["originalNextRun"],
        "2026-05-01 11:06:35"
    );
    // A RetryJob that follows the repeat: from that anchor.
    conn.call(&req("RetryJob", &[("jobID", &id_text)]))
        .assert_empty_ok();
    let job = query(&mut conn, id);
    assert_eq!(job["nextRun"], "2026-05-01 12:06:35");
    assert_eq!(
        job["data"],
        json!({"k": 3, "originalNextRun": "2026-05-01 11:06:35"})
    );
}

/// Seconds from `from` to `to`, two of QueryJob's times.
#[track_caller]
fn secs_between(from: &Value, to: &Value) -> f64 {
    let at = |t: &Value| {
        let text = t.as_str().unwrap_or_else(|| panic!("a time: {t}"));
        Timestamp::parse(text).unwrap_or_else(|| panic!("a time: {text}"))
    };
    (at(to).0 - at(from).0) as f64 / 1000.0
}

/// Bedrock's own `CreateJobTest::retryRecurringJobs`, step by step, on a
/// scripted clock: every hand-out of a `retryAfter` job with a `SCHEDULED`
/// repeat overwrites `data.originalNextRun` with the nextRun it was handed
/// out at, and FinishJob counts the repeat from that and keeps the key.
#[test]
fn original_next_run_is_overwritten_at_every_hand_out_and_kept_after_finish_job() {
    let (clock, _server, mut conn) = scripted("2026-05-01 10:00:00");
    let id = create(
        &mut conn,
        &[
            ("name", "testRetryable"),
            ("repeat", "SCHEDULED, +10 SECONDS"),
            ("retryAfter", "+5 SECOND"),
        ],
    );
    let created = query(&mut conn, id);
    assert_eq!(created["nextRun"], created["created"], "{created}");

    // The first hand-out: RUNQUEUED, nextRun 5 s after lastRun.
    let first = get_job(&mut conn, "testRetryable");
    assert_eq!(first["data"], json!({}), "{first}");
    let job = query(&mut conn, id);
    assert_eq!(job["state"], "RUNQUEUED", "{job}");
    assert_eq!(secs_between(&job["lastRun"], &job["nextRun"]), 5.0, "{job}");
    assert_eq!(job["data"]["originalNextRun"], created["nextRun"], "{job}");
    conn.call(&req("GetJob", &[("name", "testRetryable")]))
        .assert_error("404 No job found");

    // Handed out again once the retryAfter passed (a second late, as a
    // poll would be): its data still has the first hand-out's anchor, and
    // the hand-out overwrites it with the nextRun it was due at now.
    clock.set("2026-05-01 10:00:06");
    let second = get_job(&mut conn, "testRetryable");
    assert_eq!(
        second["data"]["originalNextRun"], created["nextRun"],
        "{second}"
    );
    conn.call(&req("GetJob", &[("name", "testRetryable")]))
        .assert_error("404 No job found");
    let job = query(&mut conn, id);
    assert_eq!(job["data"]["originalNextRun"], second["nextRun"], "{job}");

    // Finished: QUEUED, the next run 10 s on from that anchor (Bedrock's
    // test allows 9 to 11 s after lastRun), the key kept.
    finish(&mut conn, id);
    let job = query(&mut conn, id);
    assert_eq!(job["state"], "QUEUED", "{job}");
    let gap = secs_between(&job["lastRun"], &job["nextRun"]);
    assert!(
        (9.0..=11.0).contains(&gap),
        "nextRun - lastRun = {gap} s: {job}"
    );
    assert_eq!(job["data"]["originalNextRun"], second["nextRun"], "{job}");
}

#[test]
fn manual_jobs_get_no_retry_after_count_and_no_hand_out_limit() {
    let (clock, _server, mut conn) = scripted("2026-05-01 10:00:00");
    let manual = create(
        &mut conn,
        &[("name", "manual/Review"), ("retryAfter", "+1 MINUTE")],
    );
    let automatic = create(
        &mut conn,
        &[("name", "auto/Review"), ("retryAfter", "+1 MINUTE")],
    );
    for round in 0..12 {
        clock.set(&format!("2026-05-01 10:{:02}:00", 2 * round));
        let got = get_job(&mut conn, "manual/Review");
        assert_eq!(got["jobID"], json!(manual), "round {round}");
        let job = query(&mut conn, manual);
        assert_eq!(job["state"], "RUNQUEUED", "round {round}");
        assert_eq!(job["data"], json!({}), "no count, round {round}");

        let answer = conn.call(&req("GetJob", &[("name", "auto/Review")]));
        if round < 10 {
            assert_eq!(answer.json()["jobID"], json!(automatic), "round {round}");
            let count = query(&mut conn, automatic)["data"]["retryAfterCount"].clone();
            assert_eq!(count, json!(round + 1));
        } else {
            // The eleventh hand-out of the other job fails it instead.
            answer.assert_error("404 No job found");
            assert_eq!(query(&mut conn, automatic)["state"], "FAILED");
        }
    }
    // The manual job can still be finished.
    finish(&mut conn, manual);
}

#[test]
fn retry_delay_of_more_than_8_digits_is_malformed() {
    let (_clock, server, mut conn) = scripted("2026-05-01 10:00:00");
    let id = create(&mut conn, &[("name", "delayed")]);
    let id_text = id.to_string();
    get_job(&mut conn, "delayed");
    for delay in ["100000000", "123456789012345678901234567890"] {
        conn.call(&req("RetryJob", &[("jobID", &id_text), ("delay", delay)]))
            .assert_error("402 Malformed delay");
        assert_eq!(query(&mut conn, id)["state"], "RUNNING", "unchanged");
    }
    // The same rule over HTTP.
    assert_error(
        server
            .api()
            .post(&format!("/jobs/{id}/retry"), json!({"delay": 100_000_000})),
        400,
        "malformed_delay",
    );
    // Eight digits are a delay.
    conn.call(&req(
        "RetryJob",
        &[("jobID", &id_text), ("delay", "99999999")],
    ))
    .assert_empty_ok();
    let expected = Timestamp::parse("2026-05-01 10:00:00")
        .expect("time")
        .plus_millis(99_999_999_000)
        .to_string();
    let job = query(&mut conn, id);
    assert_eq!(
        (&job["state"], &job["nextRun"]),
        (&json!("QUEUED"), &json!(expected))
    );

    // A repeating job is retried at its repeat time: its delay is not used,
    // so it is not checked.
    let repeating = create(
        &mut conn,
        &[("name", "delayed-repeat"), ("repeat", "FINISHED, +1 HOUR")],
    );
    get_job(&mut conn, "delayed-repeat");
    conn.call(&req(
        "RetryJob",
        &[("jobID", &repeating.to_string()), ("delay", "100000000")],
    ))
    .assert_empty_ok();
    assert_eq!(next_run(&mut conn, repeating), "2026-05-01 11:00:00");
}

#[test]
fn connection_close_is_echoed_in_the_answer_then_the_connection_closes() {
    let server = Server::start();
    let mut conn = Conn::open(&server.bedrock);
    // Without it, no Connection header and the connection stays open.
    let id = create(&mut conn, &[("name", "echo")]);
    let plain = conn.call(&req("QueryJob", &[("jobID", &id.to_string())]));
    assert!(!says_close(&plain), "{plain:?}");

    let answer = conn.call(&req(
        "QueryJob",
        &[("jobID", &id.to_string()), ("Connection", "close")],
    ));
    assert_eq!(answer.json()["jobID"], json!(id));
    assert!(says_close(&answer), "{answer:?}");
    conn.assert_closed();

    // An error answer too, whatever the value's case.
    let mut conn = Conn::open(&server.bedrock);
    let answer = conn.call(&req(
        "QueryJob",
        &[("jobID", "987654321"), ("connection", "CLOSE")],
    ));
    answer.assert_error("404 No job with this jobID");
    assert!(says_close(&answer), "{answer:?}");
    conn.assert_closed();

    // `Connection: forget` closes after its 202, and says so.
    let mut conn = Conn::open(&server.bedrock);
    let answer = conn.call(&req(
        "CreateJob",
        &[("name", "echo-forget"), ("Connection", "forget")],
    ));
    answer.assert_queued_202();
    assert!(says_close(&answer), "{answer:?}");
    conn.assert_closed();
}

#[test]
fn create_jobs_with_an_element_that_is_not_a_job_is_401_invalid_json() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    for jobs in [
        r#"[{}]"#,
        r#"[{"name":"fine"},{}]"#,
        r#"[{"name":"fine"},5]"#,
        r#"[{"name":"fine"},[{"name":"nested"}]]"#,
        r#"[]"#,
        r#"{"name":"fine"}"#,
    ] {
        conn.call(&req("CreateJobs", &[("jobs", jobs)]))
            .assert_error("401 Invalid JSON");
    }
    // A job with a bad parameter gets that parameter's error, as in
    // CreateJob and in Bedrock.
    for (jobs, line) in [
        (r#"[{"name":"fine"},{"data":{}}]"#, "402 Missing name"),
        (
            r#"[{"name":"fine"},{"name":"x","jobPriority":7}]"#,
            "402 Invalid priority value",
        ),
        (
            r#"[{"name":"fine"},{"name":"x","repeat":"SOMETIME"}]"#,
            "402 Malformed repeat",
        ),
    ] {
        conn.call(&req("CreateJobs", &[("jobs", jobs)]))
            .assert_error(line);
    }
    let (_, list) = api.get("/jobs");
    assert_eq!(list["jobs"], json!([]), "all or nothing: nothing created");
    // HTTP keeps its own documented answer (its 401 means unauthorized).
    assert_error(
        api.post("/jobs/batch", json!({"jobs": [{}]})),
        400,
        "missing_name",
    );
    // A good list is created.
    let ids = conn
        .call(&req(
            "CreateJobs",
            &[("jobs", r#"[{"name":"a"},{"name":"b"}]"#)],
        ))
        .json();
    assert_eq!(ids["jobIDs"].as_array().map(Vec::len), Some(2), "{ids}");
}

#[test]
fn duplicate_content_length_is_refused_and_the_connection_closed() {
    let server = Server::start();
    for lengths in [("0", "17"), ("17", "17")] {
        let mut conn = Conn::open(&server.bedrock);
        let bytes = format!(
            "CreateJob\r\nname: smuggled\r\nContent-Length: {}\r\nContent-Length: {}\r\n\r\n\
             {{\"name\":\"body\"}}",
            lengths.0, lengths.1
        );
        let answer = conn.call(bytes.as_bytes());
        answer.assert_error("400 Duplicate Content-Length");
        assert!(says_close(&answer), "{answer:?}");
        conn.assert_closed();
    }
    let (_, list) = server.api().get("/jobs");
    assert_eq!(list["jobs"], json!([]), "nothing was created");
    // One Content-Length, and duplicates of other headers (the later
    // wins), are still served.
    let mut conn = Conn::open(&server.bedrock);
    let id = conn
        .call(&req_with_body(
            "CreateJob",
            &[("name", "first"), ("name", "second")],
            r#"{"data":{"x":1}}"#,
        ))
        .json()["jobID"]
        .as_i64()
        .expect("jobID");
    assert_eq!(query(&mut conn, id)["name"], "second");
    assert_serving(&server);
}
