//! Leases on hand-outs: tokens and expiry, lapses, renewal by heartbeat,
//! refusal of stale reports, `--max-lapses`, and `retryAfter` as a lease.

use crate::common::*;

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

/// The local clock, in milliseconds since the epoch (same machine as the
/// server).
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A server timestamp for `ms` milliseconds since the epoch.
fn stamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("time in range")
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

/// Sleeps until the local clock reads `ms` (pacing, not waiting for the
/// server).
fn sleep_until(ms: i64) {
    let left = ms - now_ms();
    if left > 0 {
        std::thread::sleep(std::time::Duration::from_millis(left as u64));
    }
}

/// Polls until the job's lease has lapsed `lapses` times and it is QUEUED
/// again; returns the job.
fn wait_lapsed(api: &Api, id: i64, lapses: i64) -> Value {
    poll(
        &format!("job {id} to lapse back to QUEUED ({lapses})"),
        || {
            let job = api.job(id);
            (job["state"] == "QUEUED" && job["lapses"] == lapses).then_some(job)
        },
    )
}

#[test]
fn every_hand_out_carries_a_lease_token_and_expiry() {
    let server = Server::start();
    let api = server.api();
    let ids: Vec<i64> = (0..3)
        .map(|i| api.create(json!({"name": format!("lease-tok-{i}")})))
        .collect();
    for &id in &ids {
        let job = api.job(id);
        assert_eq!(job["leaseExpires"], "", "not held yet: {job}");
        assert_eq!(
            (job["attempts"].as_i64(), job["lapses"].as_i64()),
            (Some(0), Some(0))
        );
    }

    let handed = api.dequeue(json!({"name": "lease-tok-*", "numResults": 3, "leaseMs": 60000}));
    assert_eq!(handed.len(), 3, "{handed:?}");
    let mut tokens = std::collections::HashSet::new();
    for h in &handed {
        let token = h["lease"].as_str().expect("lease token");
        assert!(!token.is_empty(), "empty lease token: {h}");
        assert!(tokens.insert(token.to_string()), "token reused: {h}");
        assert_eq!(h["attempt"], 1, "{h}");

        let job = api.job(h["jobID"].as_i64().unwrap());
        assert_eq!(job["state"], "RUNNING", "{job}");
        assert_eq!(
            job["leaseExpires"], h["leaseExpires"],
            "QueryJob shows the lease: {job}"
        );
        assert_eq!(
            (job["attempts"].as_i64(), job["lapses"].as_i64()),
            (Some(1), Some(0))
        );
        // lastRun is the hand-out time truncated to the second.
        let term = ms(&h["leaseExpires"]) - ms(&job["lastRun"]);
        assert!(
            (60_000..61_000).contains(&term),
            "lease of 60 s, got {term} ms: {job}"
        );
    }

    // Without leaseMs, the server's default (--lease 5m) applies.
    let id = api.create(json!({"name": "lease-default"}));
    let h = api.take("lease-default");
    let job = api.job(id);
    let term = ms(&h["leaseExpires"]) - ms(&job["lastRun"]);
    assert!(
        (300_000..301_000).contains(&term),
        "default lease of 5 min, got {term} ms"
    );

    // Once reported, the job is no longer held and shows no lease.
    let h = &handed[0];
    let id = h["jobID"].as_i64().unwrap();
    let (status, answer) = api.post(
        &format!("/jobs/{id}/retry"),
        json!({"lease": h["lease"], "delay": 60}),
    );
    assert_eq!(status, 200, "{answer}");
    let job = api.job(id);
    assert_eq!(
        (job["state"].as_str(), job["leaseExpires"].as_str()),
        (Some("QUEUED"), Some("")),
        "{job}"
    );
}

#[test]
fn an_unreported_lease_lapses_and_the_job_is_handed_out_again() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-lapse", "data": {"v": 1}}));
    let longer = api.create(json!({"name": "lease-lapse-longer"}));
    let first = api.dequeue(json!({"name": "lease-lapse", "leaseMs": 300}));
    assert_eq!(first.len(), 1);
    let first = &first[0];
    assert_eq!(first["attempt"], 1);
    let held = api.dequeue(json!({"name": "lease-lapse-longer", "leaseMs": 1200}));

    let job = wait_lapsed(&api, id, 1);
    // A lapse takes only leases that ended: the longer one is still held.
    let other = api.job(longer);
    if now_ms() < ms(&held[0]["leaseExpires"]) {
        assert_eq!(
            (other["state"].as_str(), other["lapses"].as_i64()),
            (Some("RUNNING"), Some(0)),
            "a lease lapsed before it ended: {other}"
        );
    }
    assert_eq!(job["attempts"], 1, "{job}");
    assert_eq!(
        job["leaseExpires"], "",
        "a lapsed job holds no lease: {job}"
    );
    assert_eq!(job["data"], json!({"v": 1}), "{job}");
    // The lapse put it back at the time it lapsed, which is not before the
    // lease's end.
    assert!(
        ms(&job["nextRun"]) >= ms(&first["leaseExpires"]),
        "lapsed before its lease ended: {job} vs {first}"
    );

    let second = api.take("lease-lapse");
    assert_eq!(second["jobID"], id);
    assert_eq!(second["attempt"], 2, "{second}");
    assert_ne!(
        second["lease"], first["lease"],
        "a re-issue gets a new token"
    );
    let job = api.job(id);
    assert_eq!(
        (
            job["state"].as_str(),
            job["attempts"].as_i64(),
            job["lapses"].as_i64()
        ),
        (Some("RUNNING"), Some(2), Some(1)),
        "{job}"
    );
}

#[test]
fn heartbeats_renew_the_lease() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-beat"}));
    // A lease twenty beats long, so that a busy machine stalling the test
    // for a moment does not lapse it; the beats go on past its first term.
    let handed = api.dequeue(json!({"name": "lease-beat", "leaseMs": 2000}));
    let token = handed[0]["lease"].clone();
    let original = ms(&handed[0]["leaseExpires"]);
    let started = std::time::Instant::now();

    let mut last = original;
    let mut beats = 0;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        // Pacing of the heartbeats, not a wait for anything.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (status, answer) = api.post(&format!("/jobs/{id}/heartbeat"), json!({"lease": token}));
        assert_eq!(status, 200, "heartbeat {beats}: {answer}");
        let expires = ms(&answer["leaseExpires"]);
        if beats == 0 {
            assert!(
                expires > original,
                "a heartbeat extends the lease: {answer}"
            );
        }
        assert!(expires >= last, "a lease never moves back: {answer}");
        last = expires;
        beats += 1;
    }
    assert!(now_ms() > original, "the test outlived the original lease");

    let job = api.job(id);
    assert_eq!(
        (
            job["state"].as_str(),
            job["lapses"].as_i64(),
            job["attempts"].as_i64()
        ),
        (Some("RUNNING"), Some(0), Some(1)),
        "a job heartbeated regularly never lapses: {job}"
    );
    assert_eq!(ms(&job["leaseExpires"]), last, "{job}");
    let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({"lease": token}));
    assert_eq!(status, 200, "the holder can still finish: {answer}");
    assert_eq!(api.state(id), None);
}

#[test]
fn reports_under_a_lapsed_and_reissued_lease_are_refused() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-stale", "data": {"v": 1}}));
    let old = api.dequeue(json!({"name": "lease-stale", "leaseMs": 300}))[0].clone();
    wait_lapsed(&api, id, 1);
    let new = api.dequeue(json!({"name": "lease-stale", "leaseMs": 60000}))[0].clone();
    assert_eq!(new["attempt"], 2);
    let before = api.job(id);

    let stale = old["lease"].clone();
    let path = |action: &str| format!("/jobs/{id}/{action}");
    assert_error(
        api.post(
            &path("finish"),
            json!({"lease": stale, "data": {"v": "finished late"}}),
        ),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(
            &path("retry"),
            json!({"lease": stale, "delay": 0, "data": {"v": "retried late"}}),
        ),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(
            &path("fail"),
            json!({"lease": stale, "data": {"v": "failed late"}}),
        ),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("heartbeat"), json!({"lease": stale})),
        409,
        "lease_lost",
    );
    assert_eq!(api.job(id), before, "stale reports changed nothing");

    // The new holder's token works.
    let (status, answer) = api.post(&path("heartbeat"), json!({"lease": new["lease"]}));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = api.post(
        &path("retry"),
        json!({"lease": new["lease"], "delay": 0, "data": {"v": 2}}),
    );
    assert_eq!(status, 200, "{answer}");
    let job = api.job(id);
    assert_eq!(
        (job["state"].as_str(), &job["data"]),
        (Some("QUEUED"), &json!({"v": 2})),
        "{job}"
    );

    // A finish without any token is accepted, Bedrock style.
    let third = api.take("lease-stale");
    assert_eq!(third["attempt"], 3);
    let (status, answer) = api.post(&path("finish"), json!({}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.state(id), None, "finished job is deleted");
}

#[test]
fn a_wrong_token_is_refused_and_a_heartbeat_needs_a_lease() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-wrong", "data": {"v": 1}}));
    let held = api.dequeue(json!({"name": "lease-wrong", "leaseMs": 60000}))[0].clone();
    let before = api.job(id);
    let wrong = "0123456789abcdef0123456789abcdef";
    assert_ne!(held["lease"], wrong);

    let path = |action: &str| format!("/jobs/{id}/{action}");
    assert_error(
        api.post(&path("finish"), json!({"lease": wrong, "data": {"v": 2}})),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("retry"), json!({"lease": wrong, "delay": 0})),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("fail"), json!({"lease": wrong})),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("heartbeat"), json!({"lease": wrong})),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("heartbeat"), json!({})),
        400,
        "missing_lease",
    );
    assert_error(
        api.post(&path("heartbeat"), json!({"lease": ""})),
        400,
        "missing_lease",
    );
    assert_eq!(api.job(id), before, "refused reports changed nothing");

    let (status, answer) = api.post(&path("fail"), json!({"lease": held["lease"]}));
    assert_eq!(status, 200, "the right token works: {answer}");
    assert_eq!(api.state(id).as_deref(), Some("FAILED"));
}

#[test]
fn max_lapses_fails_the_job() {
    let server = Server::builder().arg("--max-lapses").arg("2").start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-max"}));
    assert_eq!(
        api.dequeue(json!({"name": "lease-max", "leaseMs": 200}))
            .len(),
        1
    );
    let job = wait_lapsed(&api, id, 1);
    assert_eq!(job["attempts"], 1);

    assert_eq!(
        api.dequeue(json!({"name": "lease-max", "leaseMs": 200}))
            .len(),
        1
    );
    let job = poll("the second lapse to fail the job", || {
        let job = api.job(id);
        (job["state"] != "RUNNING").then_some(job)
    });
    assert_eq!(
        (
            job["state"].as_str(),
            job["lapses"].as_i64(),
            job["attempts"].as_i64()
        ),
        (Some("FAILED"), Some(2), Some(2)),
        "{job}"
    );
    assert_eq!(job["leaseExpires"], "", "{job}");
    assert!(
        api.dequeue(json!({"name": "lease-max"})).is_empty(),
        "a FAILED job is not handed out"
    );
    // Its failure group says why, and its history has both lapses.
    let (_, groups) = api.get("/failures");
    assert_eq!(groups["groups"][0]["group"], "lease_lost", "{groups}");
    assert_eq!(api.outcomes(id), ["lease_lost", "lease_lost"]);
}

#[test]
fn retry_after_jobs_are_runqueued_and_handed_out_again() {
    let server = Server::start();
    let api = server.api();
    // The repeat keeps the job after FinishJob, so that its data can be seen.
    let id = api.create(json!({
        "name": "lease-ra",
        "data": {"k": "v"},
        "retryAfter": "+1 SECONDS",
        "repeat": "FINISHED, +1 HOURS",
    }));
    let first = api.take("lease-ra");
    assert_eq!(first["attempt"], 1);
    assert!(
        first["data"].get("retryAfterCount").is_none(),
        "answer shows data before: {first}"
    );

    let job = api.job(id);
    assert_eq!(job["state"], "RUNQUEUED", "{job}");
    assert_eq!(
        job["data"],
        json!({"k": "v", "retryAfterCount": 1}),
        "{job}"
    );
    let next_run = ms(&job["nextRun"]);
    assert_eq!(
        next_run,
        ms(&job["lastRun"]) + 1000,
        "nextRun = hand-out + 1 s: {job}"
    );
    assert_eq!(
        job["leaseExpires"], job["nextRun"],
        "the lease is the retryAfter: {job}"
    );
    // Dequeue at once and keep trying: an early hand-out shows in lastRun.
    let second = poll("the retryAfter job to be handed out again", || {
        api.dequeue(json!({"name": "lease-ra"})).pop()
    });
    assert_eq!(second["jobID"], id);
    assert_eq!(second["attempt"], 2, "{second}");
    assert_ne!(second["lease"], first["lease"], "a new token: {second}");
    let job = api.job(id);
    assert_eq!(job["state"], "RUNQUEUED", "{job}");
    assert_eq!(
        job["data"],
        json!({"k": "v", "retryAfterCount": 2}),
        "{job}"
    );
    assert!(
        ms(&job["lastRun"]) >= next_run,
        "handed out again before nextRun: {job}"
    );

    let before = api.job(id);
    assert_error(
        api.post(
            &format!("/jobs/{id}/finish"),
            json!({"lease": first["lease"]}),
        ),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(
            &format!("/jobs/{id}/heartbeat"),
            json!({"lease": first["lease"]}),
        ),
        409,
        "lease_lost",
    );
    assert_eq!(api.job(id), before, "the old token changed nothing");

    let (status, answer) = api.post(
        &format!("/jobs/{id}/finish"),
        json!({"lease": second["lease"]}),
    );
    assert_eq!(status, 200, "{answer}");
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED", "the repeat queues it again: {job}");
    assert_eq!(
        job["data"],
        json!({"k": "v"}),
        "FinishJob removes retryAfterCount: {job}"
    );
}

#[test]
fn retry_after_count_of_ten_fails_the_job_instead_of_handing_it_out() {
    let server = Server::start();
    let api = server.api();
    let spent = api.create(json!({
        "name": "lease-ra-spent",
        "data": {"retryAfterCount": 10},
        "retryAfter": "+1 SECONDS",
    }));
    assert!(api.dequeue(json!({"name": "lease-ra-spent"})).is_empty());
    let job = api.job(spent);
    assert_eq!(job["state"], "FAILED", "{job}");
    assert_eq!(job["attempts"], 0, "it was not handed out: {job}");

    // Nine is not yet the limit: handed out (the tenth), then failed at the
    // next attempt.
    let last = api.create(json!({
        "name": "lease-ra-last",
        "data": {"retryAfterCount": 9},
        "retryAfter": "+1 SECONDS",
    }));
    let handed = api.take("lease-ra-last");
    assert_eq!(handed["jobID"], last);
    assert_eq!(api.job(last)["data"]["retryAfterCount"], 10);
    let job = poll("the next hand-out attempt to fail the job", || {
        let jobs = api.dequeue(json!({"name": "lease-ra-last"}));
        assert!(jobs.is_empty(), "handed out an eleventh time: {jobs:?}");
        let job = api.job(last);
        (job["state"] != "RUNQUEUED").then_some(job)
    });
    assert_eq!(job["state"], "FAILED", "{job}");
    assert_eq!(job["attempts"], 1, "{job}");
}

#[test]
fn finishing_after_a_lapse_before_anyone_retook_the_job() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "lease-late", "data": {"v": 1}}));
    let old = api.dequeue(json!({"name": "lease-late", "leaseMs": 300}))[0].clone();
    let before = wait_lapsed(&api, id, 1);

    let path = |action: &str| format!("/jobs/{id}/{action}");
    // The lapse made it QUEUED: not held, so a tokenless report is refused by
    // state, and the old token is refused as lost.
    assert_error(
        api.post(&path("finish"), json!({"data": {"v": 2}})),
        409,
        "not_held_for_finish",
    );
    assert_error(
        api.post(
            &path("finish"),
            json!({"lease": old["lease"], "data": {"v": 2}}),
        ),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&path("retry"), json!({"delay": 0})),
        409,
        "not_held_for_finish",
    );
    assert_error(api.post(&path("fail"), json!({})), 409, "not_held_for_fail");
    assert_error(
        api.post(&path("heartbeat"), json!({"lease": old["lease"]})),
        409,
        "lease_lost",
    );
    assert_eq!(api.job(id), before, "refused reports changed nothing");

    let again = api.take("lease-late");
    assert_eq!(
        (again["jobID"].as_i64(), again["attempt"].as_i64()),
        (Some(id), Some(2))
    );
    assert_eq!(again["data"], json!({"v": 1}));
}

/// A lease handed out just as the server's timer fires for something else
/// (a job falling due) must still lapse when it ends. A large batch keeps
/// the store busy across that moment, so that the timer's work and the
/// hand-out are committed together: the order the two then act in must not
/// matter. Several rounds, since which acts first is up to the server.
#[test]
fn leases_handed_out_as_the_timer_fires_still_lapse() {
    let server = Server::start();
    let api = server.api();
    let filler: Vec<Value> = (0..10_000)
        .map(|_| json!({"name": "lease-race-filler"}))
        .collect();
    let filler = json!({"jobs": filler});
    for round in 0..10 {
        let alarm = now_ms() + 400;
        api.create(json!({"name": format!("lease-race-alarm-{round}"), "firstRun": stamp(alarm)}));
        let id = api.create(json!({"name": format!("lease-race-{round}")}));
        let busy = {
            let api = api.clone();
            let body = filler.clone();
            std::thread::spawn(move || {
                sleep_until(alarm - 200);
                let (status, answer) = api.post("/jobs/batch", body);
                assert_eq!(status, 200, "{answer}");
            })
        };
        sleep_until(alarm + 20 + 10 * (round % 3));
        let held = api.dequeue(json!({"name": format!("lease-race-{round}"), "leaseMs": 100}));
        assert_eq!(held.len(), 1, "{held:?}");
        busy.join().expect("filler thread");
        let expires = held[0]["leaseExpires"].clone();
        poll(
            &format!("round {round}: the lease ending {expires} to lapse"),
            || (api.job(id)["state"] == "QUEUED").then_some(()),
        );
    }
}
