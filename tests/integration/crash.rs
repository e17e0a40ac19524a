//! `kill -9` and restart on the same store (SQLite file or PostgreSQL
//! database): every acknowledged write is there, and a job held at the crash
//! is neither lost nor stuck.

use crate::common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Every job on the server, by id, read page by page.
fn all_jobs(api: &Api) -> HashMap<i64, Value> {
    let mut jobs = HashMap::new();
    let mut after = 0;
    loop {
        let (status, answer) = api.get(&format!("/jobs?limit=1000&after={after}"));
        assert_eq!(status, 200, "{answer}");
        let page = answer["jobs"].as_array().expect("jobs");
        for job in page {
            let id = job["jobID"].as_i64().expect("jobID");
            after = after.max(id);
            assert!(
                jobs.insert(id, job.clone()).is_none(),
                "listed twice: {job}"
            );
        }
        if page.is_empty() {
            return jobs;
        }
    }
}

/// The data a create stores for job `i` of thread `t`: big enough to span
/// pages now and then.
fn payload(t: usize, i: usize) -> Value {
    json!({"t": t, "i": i, "fill": "x".repeat(50 + (t * 131 + i * 17) % 700)})
}

#[test]
fn acknowledged_creates_survive_kill_9() {
    let mut server = Server::start();
    let api = server.api();
    // id -> (name, data)
    let acked: Arc<Mutex<HashMap<i64, (String, Value)>>> = Arc::default();

    let threads: Vec<_> = (0..4)
        .map(|t| {
            let api = api.clone();
            let acked = Arc::clone(&acked);
            std::thread::spawn(move || {
                for i in 0..50 {
                    let name = format!("crash-ack-{t}-{i}");
                    let data = payload(t, i);
                    let id = api.create(json!({"name": name, "data": data}));
                    acked.lock().unwrap().insert(id, (name, data));
                }
            })
        })
        .collect();
    for b in 0..4 {
        let jobs: Vec<(String, Value)> = (0..25)
            .map(|i| (format!("crash-batch-{b}-{i}"), payload(10 + b, i)))
            .collect();
        let body: Vec<Value> = jobs
            .iter()
            .map(|(name, data)| json!({"name": name, "data": data}))
            .collect();
        let (status, answer) = api.post("/jobs/batch", json!({"jobs": body}));
        assert_eq!(status, 200, "{answer}");
        let ids = answer["jobIDs"].as_array().expect("jobIDs");
        assert_eq!(ids.len(), jobs.len());
        let mut acked = acked.lock().unwrap();
        for (id, job) in ids.iter().zip(jobs) {
            acked.insert(id.as_i64().expect("id"), job);
        }
    }
    for thread in threads {
        thread.join().expect("create thread");
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert_eq!(acked.len(), 300);

    server.restart();
    let api = server.api();
    let found = all_jobs(&api);
    assert_eq!(found.len(), acked.len(), "jobs after the crash");
    for (id, (name, data)) in &acked {
        let job = found
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged job {id} ({name}) lost"));
        assert_eq!(
            (&job["name"], &job["data"]),
            (&json!(name), data),
            "job {id}"
        );
        assert_eq!(job["state"], "QUEUED", "{job}");
    }

    // The restarted server goes on: new ids do not reuse old ones.
    let newest = api.create(json!({"name": "crash-after"}));
    assert!(newest > *acked.keys().max().unwrap(), "id {newest} reused");
}

#[test]
fn creates_answered_before_a_kill_9_survive_it() {
    let mut server = Server::start();
    let url = server.url.clone();
    let answered = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let url = url.clone();
            let answered = Arc::clone(&answered);
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .expect("client");
                let mut acked = Vec::new();
                // Bounded, in case the kill never comes.
                for i in 0..100_000 {
                    let name = format!("crash-mid-{t}-{i}");
                    let sent = client
                        .post(format!("{url}/jobs"))
                        .bearer_auth(token())
                        .header("content-type", "application/json")
                        .body(json!({"name": name, "data": payload(t, i)}).to_string())
                        .send()
                        .and_then(|r| Ok((r.status().as_u16(), r.text()?)));
                    match sent {
                        Ok((200, body)) => {
                            let answer: Value = serde_json::from_str(&body).expect("JSON answer");
                            acked.push((answer["jobID"].as_i64().expect("jobID"), t, i));
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        // The server died under this request (or refused it
                        // while dying): nothing was promised.
                        _ => break,
                    }
                }
                acked
            })
        })
        .collect();

    poll("creates to be answered while threads keep sending", || {
        (answered.load(Ordering::SeqCst) >= 200).then_some(())
    });
    server.kill9();
    let acked: Vec<(i64, usize, usize)> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("create thread"))
        .collect();
    assert!(acked.len() >= 200);

    server.restart();
    let found = all_jobs(&server.api());
    for &(id, t, i) in &acked {
        let job = found
            .get(&id)
            .unwrap_or_else(|| panic!("answered create {id} (crash-mid-{t}-{i}) lost"));
        assert_eq!(job["name"], format!("crash-mid-{t}-{i}"), "{job}");
        assert_eq!(job["data"], payload(t, i), "job {id}");
    }
    // Unanswered creates may or may not be there, but never torn.
    for (id, job) in &found {
        let name = job["name"].as_str().expect("name");
        let mut parts = name.trim_start_matches("crash-mid-").split('-');
        let t: usize = parts.next().and_then(|p| p.parse().ok()).expect("t");
        let i: usize = parts.next().and_then(|p| p.parse().ok()).expect("i");
        assert_eq!(job["data"], payload(t, i), "job {id} ({name})");
    }
}

#[test]
fn a_job_running_at_a_crash_lapses_back_after_restart() {
    let mut server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "crash-running", "data": {"v": 1}}));
    // Long enough to outlast the restart, short enough to wait for.
    let held = api.dequeue(json!({"name": "crash-running", "leaseMs": 4000}))[0].clone();
    let before = api.job(id);

    server.restart();
    let api = server.api();
    let mut job = api.job(id);
    // The lease may have been extended to one term past the restart; the
    // rest of the job is as it was.
    assert!(
        ms(&job["leaseExpires"]) >= ms(&before["leaseExpires"]),
        "{job}"
    );
    job["leaseExpires"] = before["leaseExpires"].clone();
    assert_eq!(job, before, "the held job is as it was before the crash");
    assert_eq!(job["state"], "RUNNING");

    let job = poll("the crashed holder's lease to lapse", || {
        let job = api.job(id);
        (job["state"] != "RUNNING").then_some(job)
    });
    assert_eq!(
        (
            job["state"].as_str(),
            job["lapses"].as_i64(),
            job["attempts"].as_i64()
        ),
        (Some("QUEUED"), Some(1), Some(1)),
        "{job}"
    );
    assert!(
        ms(&job["nextRun"]) >= ms(&held["leaseExpires"]),
        "lapsed early: {job}"
    );
    assert_eq!(job["data"], json!({"v": 1}));

    let again = api.take("crash-running");
    assert_eq!(
        (again["jobID"].as_i64(), again["attempt"].as_i64()),
        (Some(id), Some(2))
    );
    assert_error(
        api.post(
            &format!("/jobs/{id}/finish"),
            json!({"lease": held["lease"]}),
        ),
        409,
        "lease_lost",
    );
}

#[test]
fn a_lease_that_ended_while_the_server_was_down_gets_one_more_term() {
    if skip_on_postgres(
        "a restarted server does not extend the leases of running jobs by one term: other \
         servers on the database may have gone on serving renewals while it was down",
    ) {
        return;
    }
    let mut server = Server::start();
    let api = server.api();
    let reported = api.create(json!({"name": "crash-down-reported"}));
    let silent = api.create(json!({"name": "crash-down-silent"}));
    let held = api.dequeue(json!({"name": "crash-down-reported", "leaseMs": 3000}))[0].clone();
    let quiet = api.dequeue(json!({"name": "crash-down-silent", "leaseMs": 3000}))[0].clone();
    server.kill9();
    let expires = ms(&held["leaseExpires"]).max(ms(&quiet["leaseExpires"]));
    poll("the leases to end while the server is down", || {
        (now_ms() > expires).then_some(())
    });

    let restarted_at = now_ms();
    server.restart();
    let api = server.api();
    // Downtime does not count against the holder: the lease runs one more
    // term from the restart, so the holder's report still lands.
    let job = api.job(reported);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert!(
        ms(&job["leaseExpires"]) >= restarted_at + 3000,
        "no extra term: {job}"
    );
    let (status, answer) = api.post(
        &format!("/jobs/{reported}/finish"),
        json!({"lease": held["lease"]}),
    );
    assert_eq!(
        status, 200,
        "the holder's report after the restart: {answer}"
    );
    assert_eq!(api.state(reported), None);

    // A holder that never comes back: the job lapses after that term.
    let job = poll(
        "the silent holder's lease to lapse after the restart",
        || {
            let job = api.job(silent);
            (job["state"] != "RUNNING").then_some(job)
        },
    );
    assert_eq!(
        (job["state"].as_str(), job["lapses"].as_i64()),
        (Some("QUEUED"), Some(1)),
        "{job}"
    );
    assert!(
        ms(&job["nextRun"]) >= restarted_at + 3000,
        "lapsed before its extra term: {job}"
    );
    let again = api.take("crash-down-silent");
    assert_eq!(again["attempt"], 2);
}
