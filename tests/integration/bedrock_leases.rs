//! Leases on the Bedrock port (issue 18, defect 3): a client that asks
//! (`leaseMs`) gets a lease it renews with `Heartbeat` and shows with its
//! reports, so a `bedrock://` supervisor killed mid-job loses its job when
//! the lease lapses and its late reports are refused; a plain Bedrock client
//! is answered exactly as before; and the opt-in sweeper
//! (`--requeue-unleased-after`) puts back jobs held without a lease.

use std::time::Duration;

use jobmgr::client::{BedrockSource, JobSource, Report, SourceError};
use serde_json::{Value, json};

use crate::common::*;

/// The keys of Bedrock's own GetJob answer for a plain job.
const BEDROCK_KEYS: [&str; 9] = [
    "created",
    "data",
    "jobID",
    "lastRun",
    "name",
    "nextRun",
    "priority",
    "repeat",
    "retryAfter",
];

/// One request on its own connection (`Connection: close`, so the answer
/// ends with the connection): the status line and the body.
fn call(server: &Server, method: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut request = format!("{method}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    let answer = bedrock_exchange(&server.bedrock, request.as_bytes());
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {answer:?}"));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

/// A `200 OK` answer's body as JSON.
#[track_caller]
fn ok_json((status, body): (String, String)) -> Value {
    assert_eq!(status, "200 OK", "body: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The sorted keys of a JSON object.
fn keys(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {object}"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

/// Polls until the job is QUEUED after `lapses` lapses; returns it.
fn wait_lapsed(api: &Api, server: &Server, id: i64, lapses: i64) -> Value {
    let start = std::time::Instant::now();
    loop {
        let job = api.job(id);
        if job["state"] == "QUEUED" && job["lapses"] == lapses {
            return job;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "job {id} was not put back after {lapses} lapse(s) within {DEADLINE:?}: {job}\nserver stderr:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bedrock_supervisors_hold_jobs_without_a_lease_a_killed_one_loses_its_job_when_the_lease_lapses()
{
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "crash", "repeat": "FINISHED, +1 HOUR"}));
    // The first run reports progress (so it is seen running) and hangs;
    // the second finishes.
    let worker = "#!/bin/sh\ncat > /dev/null\n\
        if [ \"$JOBMGR_ATTEMPT\" = 1 ]; then echo '{\"phase\":\"first\"}' >&3; exec sleep 60; fi\n\
        echo '{\"phase\":\"second\"}'\n";
    let url = format!("bedrock://{}", server.bedrock);
    let mut first = Supervisor::builder(&url)
        .worker("crash", worker)
        .arg("--lease")
        .arg("1s")
        .start();
    let running = poll("the first run to report its progress", || {
        let job = api.job(id);
        (job["state"] == "RUNNING" && job["data"]["phase"] == "first").then_some(job)
    });
    assert_ne!(
        running["leaseExpires"], "",
        "a bedrock:// supervisor holds its job under a lease: {running}"
    );
    first.kill9();

    let lapsed = wait_lapsed(&api, &server, id, 1);
    assert_eq!(lapsed["attempts"], 1, "{lapsed}");

    let second = Supervisor::builder(&url)
        .worker("crash", worker)
        .arg("--lease")
        .arg("1s")
        .start();
    let job = poll("the job to run again and finish", || {
        let job = api.job(id);
        (job["state"] == "QUEUED" && job["data"]["phase"] == "second").then_some(job)
    });
    // Its history: the killed holder's run lost its lease, the next one
    // finished.
    assert_eq!(api.outcomes(id), ["lease_lost", "finished"], "{job}");
    assert!(
        !second.stderr().contains("gives no leases"),
        "jobmgr's port is known to give leases:\n{}",
        second.stderr()
    );
}

#[test]
fn a_late_report_from_a_lapsed_bedrock_lease_is_refused() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "bl/late", "data": {"v": 1}}));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let source = BedrockSource::new(&server.bedrock)
        .expect("Bedrock address")
        .with_token(Some(api_token()));

    let lapsing = Duration::from_millis(300);
    let jobs = runtime
        .block_on(source.get_jobs("bl/late", 1, Duration::ZERO, lapsing))
        .expect("get_jobs");
    let old = jobs.into_iter().next().expect("the job is handed out");
    assert_eq!(old.id, id);
    assert!(old.lease.is_some(), "a lease is given: {:?}", old.handout);
    assert_eq!(old.lease_term, Some(lapsing), "{:?}", old.handout);
    assert_eq!(source.gives_leases(), Some(true));

    wait_lapsed(&api, &server, id, 1);
    let jobs = runtime
        .block_on(source.get_jobs("bl/late", 1, Duration::ZERO, Duration::from_secs(60)))
        .expect("get_jobs");
    let new = jobs
        .into_iter()
        .next()
        .expect("the job is handed out again");
    assert_ne!(new.lease, old.lease, "a new hand-out, a new lease");

    // Every late call of the old holder is refused as a lost lease...
    let progress = serde_json::Map::from_iter([("v".to_string(), json!(2))]);
    let late_update = runtime.block_on(source.update(&old, &progress));
    assert_eq!(late_update, Err(SourceError::LeaseLost(id)));
    let late_heartbeat = runtime.block_on(source.heartbeat(&old));
    assert_eq!(late_heartbeat, Err(SourceError::LeaseLost(id)));
    let finish = Report::Finish { data: None };
    let late_finish = runtime.block_on(source.report(id, old.lease.as_deref(), &finish));
    assert_eq!(late_finish, Err(SourceError::LeaseLost(id)));
    let lease = old.lease.clone().expect("lease");
    for method in ["RetryJob", "FailJob"] {
        let (status, body) = call(
            &server,
            method,
            &[("jobID", &id.to_string()), ("lease", &lease)],
        );
        assert!(status.starts_with("409 Lease lost"), "{method}: {status}");
        assert_eq!(body, "", "{method}: an error has an empty body");
    }
    // ...and changed nothing: the new holder's run goes on.
    let job = api.job(id);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(job["data"], json!({"v": 1}), "{job}");

    runtime
        .block_on(source.heartbeat(&new))
        .expect("the new holder renews");
    runtime
        .block_on(source.report(id, new.lease.as_deref(), &finish))
        .expect("the new holder finishes");
    assert_eq!(api.state(id), None, "a finished one-off job is deleted");
}

#[test]
fn a_plain_bedrock_get_job_is_answered_without_lease_fields() {
    let server = Server::start();
    let api = server.api();
    let plain = api.create(json!({"name": "bl/plain"}));
    let many = api.create(json!({"name": "bl/many"}));
    let leased = api.create(json!({"name": "bl/leased"}));

    let job = ok_json(call(&server, "GetJob", &[("name", "bl/plain")]));
    assert_eq!(keys(&job), BEDROCK_KEYS, "{job}");
    let answer = ok_json(call(
        &server,
        "GetJobs",
        &[("name", "bl/many"), ("numResults", "5")],
    ));
    assert_eq!(keys(&answer), ["jobs"], "{answer}");
    assert_eq!(keys(&answer["jobs"][0]), BEDROCK_KEYS, "{answer}");
    for id in [plain, many] {
        let job = api.job(id);
        assert_eq!(job["state"], "RUNNING", "{job}");
        assert_eq!(job["leaseExpires"], "", "held until reported: {job}");
    }
    // Reports without a lease are taken as before.
    let (status, body) = call(&server, "FinishJob", &[("jobID", &plain.to_string())]);
    assert_eq!((status.as_str(), body.as_str()), ("200 OK", ""));
    assert_eq!(api.state(plain), None);

    // Asking for a lease adds the lease fields, and the job is leased.
    let job = ok_json(call(
        &server,
        "GetJob",
        &[("name", "bl/leased"), ("leaseMs", "60000")],
    ));
    let mut expected: Vec<&str> = BEDROCK_KEYS.to_vec();
    expected.extend(["attempt", "lease", "leaseExpires", "leaseMs"]);
    expected.sort();
    assert_eq!(keys(&job), expected, "{job}");
    assert_eq!(job["leaseMs"], 60000, "{job}");
    assert_eq!(api.job(leased)["leaseExpires"], job["leaseExpires"]);
    let renewed = ok_json(call(
        &server,
        "Heartbeat",
        &[
            ("jobID", &leased.to_string()),
            ("lease", job["lease"].as_str().expect("token")),
        ],
    ));
    assert_eq!(keys(&renewed), ["leaseExpires"], "{renewed}");

    // Hostile: a lease term out of bounds, a heartbeat without a token.
    api.create(json!({"name": "bl/bad"}));
    for bad in ["0", "99", "86400001", "soon", "-5"] {
        let (status, body) = call(&server, "GetJob", &[("name", "bl/bad"), ("leaseMs", bad)]);
        assert_eq!(status, "402 Malformed leaseMs", "leaseMs {bad}");
        assert_eq!(body, "");
    }
    let (status, _) = call(&server, "Heartbeat", &[("jobID", &leased.to_string())]);
    assert_eq!(status, "402 Missing lease");
    let (status, _) = call(
        &server,
        "Heartbeat",
        &[("jobID", &leased.to_string()), ("lease", "not-the-token")],
    );
    assert!(status.starts_with("409 Lease lost"), "{status}");
}

/// The sweeper's line at start-up.
const SWEEPER_ON: &str = "jobs held without a lease are queued again";

#[test]
fn the_sweeper_requeues_an_unleased_running_job_older_than_its_age_and_leaves_others_alone() {
    let clock = Clock::at("2030-01-01 00:00:00");
    let server = clock
        .server()
        .arg("--requeue-unleased-after")
        .arg("1h")
        .start();
    let api = server.api();
    let old = api.create(json!({"name": "bl/old"}));
    let young = api.create(json!({"name": "bl/young"}));
    let leased = api.create(json!({"name": "bl/leased"}));
    ok_json(call(&server, "GetJob", &[("name", "bl/old")]));
    clock.set("2030-01-01 00:30:00");
    ok_json(call(&server, "GetJob", &[("name", "bl/young")]));
    ok_json(call(
        &server,
        "GetJob",
        &[("name", "bl/leased"), ("leaseMs", "86400000")],
    ));
    for id in [old, young, leased] {
        assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    }

    // An hour and a second after the first hand-out: only that one is old.
    clock.set("2030-01-01 01:00:01");
    let job = wait_lapsed(&api, &server, old, 1);
    assert_eq!(job["leaseExpires"], "", "{job}");
    // The sweep that put it back looked at the others in the same transaction.
    for id in [young, leased] {
        let job = api.job(id);
        assert_eq!(
            (job["state"].as_str(), job["lapses"].as_i64()),
            (Some("RUNNING"), Some(0)),
            "{job}"
        );
    }
    assert_eq!(api.outcomes(old), ["lease_lost"]);
    let stderr = server.stderr();
    assert!(stderr.contains(SWEEPER_ON), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("held without a lease") && l.contains(&format!("job_id={old}"))),
        "each requeued job is logged:\n{stderr}"
    );

    // It can be handed out again, and it is, to the next GetJob.
    let again = ok_json(call(&server, "GetJob", &[("name", "bl/old")]));
    assert_eq!(again["jobID"], old);
}

#[test]
fn the_sweeper_fails_a_job_at_max_lapses() {
    let clock = Clock::at("2030-01-01 00:00:00");
    let server = clock
        .server()
        .env("JOBMGR_REQUEUE_UNLEASED_AFTER", "2m")
        .arg("--max-lapses")
        .arg("1")
        .start();
    let api = server.api();
    let id = api.create(json!({"name": "bl/killer"}));
    ok_json(call(&server, "GetJob", &[("name", "bl/killer")]));
    clock.set("2030-01-01 00:02:01");
    let job = poll("the unleased job to be FAILED", || {
        let job = api.job(id);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(job["lapses"], 1, "{job}");
}

#[test]
fn the_sweeper_is_off_by_default() {
    let clock = Clock::at("2030-01-01 00:00:00");
    let server = clock.server().start();
    let api = server.api();
    let unleased = api.create(json!({"name": "bl/unleased"}));
    let leased = api.create(json!({"name": "bl/leased"}));
    ok_json(call(&server, "GetJob", &[("name", "bl/unleased")]));
    ok_json(call(
        &server,
        "GetJob",
        &[("name", "bl/leased"), ("leaseMs", "1000")],
    ));
    clock.set("2030-01-08 00:00:00");
    // The leased job lapses on the server's timer...
    wait_lapsed(&api, &server, leased, 1);
    // ...the unleased one is held until reported, as Bedrock holds it.
    let job = api.job(unleased);
    assert_eq!(
        (job["state"].as_str(), job["lapses"].as_i64()),
        (Some("RUNNING"), Some(0)),
        "{job}"
    );
    let stderr = server.stderr();
    assert!(!stderr.contains(SWEEPER_ON), "no sweeper runs:\n{stderr}");
}

#[test]
fn a_source_learns_that_a_server_without_heartbeat_gives_no_leases() {
    // A "real Bedrock": answers every command 430, as Bedrock answers one it
    // does not know.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let serving = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return buf,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = stream.write_all(b"430 Unrecognized command\r\nContent-Length: 0\r\n\r\n");
        buf
    });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let source = BedrockSource::new(&addr).expect("address");
    assert_eq!(source.gives_leases(), None);
    assert_eq!(runtime.block_on(source.probe_leases()), Some(false));
    assert_eq!(source.gives_leases(), Some(false));
    let request = serving.join().expect("fake server");
    assert!(
        String::from_utf8_lossy(&request).starts_with("Heartbeat\r\n"),
        "{}",
        String::from_utf8_lossy(&request)
    );

    // jobmgr's port knows the command.
    let server = Server::start();
    let source = BedrockSource::new(&server.bedrock)
        .expect("address")
        .with_token(Some(api_token()));
    assert_eq!(runtime.block_on(source.probe_leases()), Some(true));
}

/// A stand-in for a real Bedrock, which gives no leases: `Heartbeat` is
/// unknown (`430`), the first GetJobs hands out job 7 (without a lease),
/// later ones find nothing, and reports succeed. Records every request's
/// head; stops serving when dropped.
struct LeaselessBedrock {
    addr: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LeaselessBedrock {
    /// Hands out job 7, named `plain`, with empty data.
    fn start() -> LeaselessBedrock {
        Self::handing_out(json!({"jobID": 7, "name": "plain", "data": {}}))
    }

    /// Hands out `job` (which should be job 7) to the first GetJobs.
    fn handing_out(job: Value) -> LeaselessBedrock {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (seen, stop) = (Arc::clone(&seen2), Arc::clone(&stop2));
                        let job = job.clone();
                        std::thread::spawn(move || serve_leaseless(stream, &job, &seen, &stop));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        LeaselessBedrock { addr, seen, stop }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("seen").clone()
    }
}

impl Drop for LeaselessBedrock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn serve_leaseless(
    mut stream: std::net::TcpStream,
    job: &Value,
    seen: &std::sync::Mutex<Vec<String>>,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let method = head.lines().next().unwrap_or_default().to_string();
        let first_get = {
            let mut seen = seen.lock().expect("seen");
            seen.push(head);
            method == "GetJobs" && seen.iter().filter(|h| h.starts_with("GetJobs")).count() == 1
        };
        let answer = match method.as_str() {
            "GetJobs" if first_get => {
                let body = json!({ "jobs": [job] }).to_string();
                format!("200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            }
            "GetJobs" => "404 No job found\r\nContent-Length: 0\r\n\r\n".to_string(),
            "FinishJob" | "RetryJob" | "FailJob" | "UpdateJob" => {
                "200 OK\r\nContent-Length: 0\r\n\r\n".to_string()
            }
            _ => "430 Unrecognized command\r\nContent-Length: 0\r\n\r\n".to_string(),
        };
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn against_a_real_bedrock_a_hand_back_is_an_immediate_retry_job() {
    let bedrock = LeaselessBedrock::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let source = BedrockSource::new(&bedrock.addr).expect("Bedrock address");
    let job = runtime
        .block_on(source.get_jobs("plain", 1, Duration::ZERO, Duration::from_secs(60)))
        .expect("get_jobs")
        .into_iter()
        .next()
        .expect("job 7 is handed out");
    assert_eq!(job.lease, None);
    runtime
        .block_on(source.hand_back(&job))
        .expect("handed back");
    let seen = bedrock.seen();
    let back = seen
        .iter()
        .find(|h| h.starts_with("RetryJob"))
        .unwrap_or_else(|| panic!("no RetryJob was sent: {seen:?}"));
    assert!(back.contains("jobID: 7"), "{back}");
    assert!(back.contains("delay: 0"), "{back}");
    assert!(
        !seen.iter().any(|h| h.starts_with("HandBackJob")),
        "a real Bedrock was sent HandBackJob: {seen:?}"
    );
}

#[test]
fn against_a_real_bedrock_a_job_is_stopped_before_its_retry_after_hands_it_out_again() {
    // Bedrock hands a job with retryAfter out again once it passes, and its
    // term cannot be renewed: the worker must be stopped before then, and
    // the job left to Bedrock (no report), rather than run twice at once.
    let bedrock = LeaselessBedrock::handing_out(
        json!({"jobID": 7, "name": "slow", "data": {}, "retryAfter": "+3 SECONDS"}),
    );
    let out = tempfile::tempdir().expect("temp dir");
    let ended = out.path().join("ended");
    let sup = Supervisor::builder(&format!("bedrock://{}", bedrock.addr))
        .worker(
            "slow",
            &format!(
                "#!/bin/sh\ncat > /dev/null\nsleep 60\ntouch {}\n",
                ended.display()
            ),
        )
        .start();
    poll(
        "the worker to be stopped before the retryAfter passes",
        || {
            sup.stderr()
                .contains("retryAfter passes soon")
                .then_some(())
        },
    );
    poll("the stopped job to end without a report", || {
        sup.stderr()
            .contains("the lease was lost; the result is discarded")
            .then_some(())
    });
    let reports: Vec<String> = bedrock
        .seen()
        .into_iter()
        .filter(|h| {
            h.starts_with("FinishJob") || h.starts_with("FailJob") || h.starts_with("RetryJob")
        })
        .collect();
    assert!(
        reports.is_empty(),
        "no report for a job Bedrock hands out again: {reports:?}"
    );
    assert!(!ended.exists(), "the worker was stopped, not left to run");
}

#[test]
fn a_job_without_retry_after_runs_to_its_end_against_a_real_bedrock() {
    let bedrock = LeaselessBedrock::start();
    let sup = Supervisor::builder(&format!("bedrock://{}", bedrock.addr))
        .worker("plain", "#!/bin/sh\ncat > /dev/null\nsleep 4\n")
        .start();
    poll("the job to be finished", || {
        bedrock
            .seen()
            .into_iter()
            .any(|h| h.starts_with("FinishJob"))
            .then_some(())
    });
    assert!(
        !sup.stderr().contains("retryAfter passes soon"),
        "{}",
        sup.stderr()
    );
}

#[test]
fn a_bedrock_supervisor_warns_once_that_a_real_bedrock_gives_no_leases() {
    let bedrock = LeaselessBedrock::start();
    let sup = Supervisor::builder(&format!("bedrock://{}", bedrock.addr))
        .worker("plain", "#!/bin/sh\ncat > /dev/null\n")
        .start();
    let finish = poll("the job to be finished on the leaseless server", || {
        bedrock
            .seen()
            .into_iter()
            .find(|h| h.starts_with("FinishJob"))
    });
    assert!(finish.contains("jobID: 7"), "{finish}");
    assert!(
        !finish.to_ascii_lowercase().contains("lease:"),
        "no lease to show: {finish}"
    );
    poll(
        "the supervisor to ask whether the server gives leases",
        || {
            bedrock
                .seen()
                .iter()
                .any(|h| h.starts_with("Heartbeat"))
                .then_some(())
        },
    );
    let stderr = poll("the warning", || {
        let stderr = sup.stderr();
        stderr.contains("gives no leases").then_some(stderr)
    });
    assert_eq!(
        stderr.matches("gives no leases").count(),
        1,
        "one warning, though both the probe and the hand-out told it:\n{stderr}"
    );
}
