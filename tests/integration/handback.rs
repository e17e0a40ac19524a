//! What the supervisor owes the jobs it was handed: its report keeps the
//! progress the worker sent, a fetch it stopped waiting for hands its jobs
//! back as they were before the hand-out, keeping an update made meanwhile
//! (HandBackJob, refused under a stale lease), and one hand-out it cannot read does not strand the rest of its
//! batch. The fetch cases put a small HTTP relay between the supervisor and
//! the real server, which can hold an answer (the jobs are leased, the
//! answer is "on the wire") or spoil one hand-out of a batch.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::*;

/// Waits until the supervisor's log says `line`.
fn wait_log(sup: &Supervisor, line: &str) {
    wait_for(&format!("the supervisor to log {line:?}"), sup, || {
        sup.stderr().contains(line).then_some(())
    });
}

// ---------------------------------------------------------------------------
// The final report keeps the worker's progress
// ---------------------------------------------------------------------------

#[test]
fn the_final_report_keeps_the_workers_progress() {
    let server = Server::start();
    let api = server.api();
    // The first run fails, so the second carries the failure's details
    // (`_jobmgr`); the second sends progress on fd 3 and succeeds without a
    // JSON line on stdout. `Stuck` does the same but fails again: its last
    // failure's report must keep the progress too.
    let script = sh(r#"cat > /dev/null
if [ "$JOBMGR_ATTEMPT" = 1 ]; then echo 'first run fails' >&2; exit 3; fi
echo '{"step":1}' >&3
echo '{"step":2}' >&3
case "$JOBMGR_JOB_NAME" in Stuck) exit 4;; esac
exit 0"#);
    let sup = Supervisor::builder(&server.url)
        .worker("Steps", &script)
        .worker("Stuck", &script)
        .arg("--max-attempts")
        .arg("2")
        .start();
    let repeat = "FINISHED, +1 HOUR";
    let steps = api.create(json!({"name": "Steps", "data": {"keep": 1}, "repeat": repeat}));
    let stuck = api.create(json!({"name": "Stuck", "data": {"keep": 1}, "repeat": repeat}));

    // Succeeded: back in the queue for its next hour, the failure's
    // details cleared, and the progress kept.
    let job = wait_for("Steps to succeed on its second run", &sup, || {
        let job = api.job(steps);
        let ran = job["lastRun"].as_str().is_some_and(|t| !t.is_empty());
        (job["state"] == "QUEUED" && ran && job["data"].get("_jobmgr").is_none()).then_some(job)
    });
    assert_eq!(
        job["data"],
        json!({"keep": 1, "step": 2}),
        "the success's report undid the worker's progress: {job}"
    );

    // Failed on its last attempt: moved on to its next hour with the
    // second failure's details beside the progress.
    let job = wait_for("Stuck to fail its second run", &sup, || {
        let job = api.job(stuck);
        (job["state"] == "QUEUED" && job["data"]["_jobmgr"]["attempt"] == 2).then_some(job)
    });
    assert_eq!(
        job["data"]["step"], 2,
        "the failure's report undid the progress: {job}"
    );
    assert_eq!(job["data"]["keep"], 1, "{job}");
    assert_eq!(job["data"]["_jobmgr"]["exitCode"], 4, "{job}");
}

// ---------------------------------------------------------------------------
// A relay between the supervisor and the server
// ---------------------------------------------------------------------------

/// What the relay does to `/dequeue` answers that carry jobs.
#[derive(Clone, Copy, PartialEq)]
enum Relay {
    /// Holds each until [`Proxy::release`].
    Hold,
    /// Spoils the hand-outs of jobs whose data says `"spoil"`: `"data"`
    /// makes their data a JSON array, which no worker can be given; `"id"`
    /// makes their `jobID` unreadable.
    Spoil,
}

/// A one-request-per-upstream-connection HTTP/1.1 relay on 127.0.0.1:0;
/// it stops accepting when dropped.
struct Proxy {
    url: String,
    state: Arc<RelayState>,
}

#[derive(Default)]
struct RelayState {
    seen: Mutex<Seen>,
    changed: Condvar,
    stopped: std::sync::atomic::AtomicBool,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.release();
        self.state
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

#[derive(Default)]
struct Seen {
    /// `/dequeue` answers with jobs, as the server sent them.
    answers: Vec<Value>,
    /// Answers being held.
    held: usize,
    released: bool,
}

impl Proxy {
    fn start(upstream: &str, relay: Relay) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let url = format!("http://{}", listener.local_addr().expect("relay address"));
        let state = Arc::new(RelayState::default());
        let shared = Arc::clone(&state);
        let upstream = upstream.to_string();
        // Connection threads end when their peers close.
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if shared.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let state = Arc::clone(&shared);
                let upstream = upstream.clone();
                std::thread::spawn(move || relay_connection(client, &upstream, relay, &state));
            }
        });
        Proxy { url, state }
    }

    /// Waits until an answer with jobs is being held.
    fn wait_held(&self, sup: &Supervisor) {
        wait_for("the relay to hold an answer with jobs", sup, || {
            (self.state.seen.lock().unwrap().held > 0).then_some(())
        });
    }

    /// Lets held answers go, and every later one.
    fn release(&self) {
        self.state.seen.lock().unwrap().released = true;
        self.state.changed.notify_all();
    }

    /// The `/dequeue` answers with jobs seen so far.
    fn answers(&self) -> Vec<Value> {
        self.state.seen.lock().unwrap().answers.clone()
    }
}

/// Reads one HTTP message head and its `Content-Length` body; `None` at
/// the end of the stream.
fn read_message(reader: &mut impl BufRead) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_string());
    }
    let length = head
        .iter()
        .find_map(|h| {
            let (name, value) = h.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// Writes a message with `head` (its length and connection headers
/// replaced) and `body`.
fn write_message(to: &mut impl Write, head: &[String], body: &[u8], close: bool) -> bool {
    let mut out = format!("{}\r\n", head[0]);
    for header in &head[1..] {
        let name = header.split(':').next().unwrap_or("").to_ascii_lowercase();
        if !matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            out.push_str(&format!("{header}\r\n"));
        }
    }
    out.push_str(&format!("content-length: {}\r\n", body.len()));
    if close {
        out.push_str("connection: close\r\n");
    }
    out.push_str("\r\n");
    to.write_all(out.as_bytes()).is_ok() && to.write_all(body).is_ok() && to.flush().is_ok()
}

fn relay_connection(client: TcpStream, upstream: &str, relay: Relay, state: &RelayState) {
    let Ok(mut to_client) = client.try_clone() else {
        return;
    };
    let mut from_client = BufReader::new(client);
    while let Some((head, body)) = read_message(&mut from_client) {
        let dequeue = head[0].starts_with("POST /dequeue ");
        let Ok(mut server) = TcpStream::connect(upstream) else {
            return;
        };
        if !write_message(&mut server, &head, &body, true) {
            return;
        }
        let mut from_server = BufReader::new(server);
        let Some((answer_head, mut answer)) = read_message(&mut from_server) else {
            return;
        };
        if dequeue
            && let Ok(mut parsed) = serde_json::from_slice::<Value>(&answer)
            && parsed["jobs"]
                .as_array()
                .is_some_and(|jobs| !jobs.is_empty())
        {
            let mut seen = state.seen.lock().unwrap();
            seen.answers.push(parsed.clone());
            match relay {
                Relay::Hold => {
                    seen.held += 1;
                    // Bounded: a test that never releases fails on its own
                    // deadline first.
                    let start = Instant::now();
                    while !seen.released && start.elapsed() < DEADLINE * 2 {
                        seen = state
                            .changed
                            .wait_timeout(seen, Duration::from_millis(100))
                            .unwrap()
                            .0;
                    }
                }
                Relay::Spoil => {
                    for job in parsed["jobs"].as_array_mut().into_iter().flatten() {
                        if job["data"]["spoil"] == "data" {
                            job["data"] = json!([1, 2, 3]);
                        } else if job["data"]["spoil"] == "id" {
                            job["jobID"] = json!("not a number");
                        }
                    }
                    answer = serde_json::to_vec(&parsed).unwrap();
                }
            }
        }
        // A supervisor that went away makes this fail: nothing to do.
        if !write_message(&mut to_client, &answer_head, &answer, false) {
            return;
        }
    }
}

/// A worker that records that it ran.
fn recording_worker(out: &Path) -> String {
    let o = out.display();
    sh(&format!(
        r#"cat > /dev/null
touch "{o}/ran-$JOBMGR_JOB_ID""#
    ))
}

/// A supervisor of `server` through a relay that holds answers with jobs,
/// with a lease far longer than any wait here (a job left leased would
/// stay RUNNING for the whole test), blocked in its first fetch.
fn held_fetch(server: &Server, out: &Path) -> (Proxy, Supervisor) {
    let proxy = Proxy::start(&server.addr(), Relay::Hold);
    let sup = Supervisor::builder(&proxy.url)
        .worker("Held", &recording_worker(out))
        .arg("--lease")
        .arg("1h")
        .start();
    (proxy, sup)
}

// ---------------------------------------------------------------------------
// A fetch the supervisor stops waiting for hands its jobs back
// ---------------------------------------------------------------------------

#[test]
fn a_dropped_fetch_on_sigtstp_hands_its_jobs_back() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let (proxy, sup) = held_fetch(&server, out.path());
    // The job is leased to the supervisor's fetch, whose answer is held.
    let id = api.create(json!({"name": "Held"}));
    proxy.wait_held(&sup);
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    sup.signal(Signal::SIGTSTP);
    wait_log(&sup, "quiet: no more jobs will be taken");
    proxy.release();
    wait_state(&api, &sup, id, "QUEUED");
    wait_log(
        &sup,
        "handed back a job that arrived after the supervisor stopped taking jobs",
    );
    assert!(
        !out.path().join(format!("ran-{id}")).exists(),
        "a quiet supervisor ran the job"
    );
}

#[test]
fn a_dropped_fetch_on_drain_hands_its_jobs_back() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let (proxy, mut sup) = held_fetch(&server, out.path());
    let id = api.create(json!({"name": "Held"}));
    proxy.wait_held(&sup);
    sup.signal(Signal::SIGTERM);
    wait_log(&sup, "draining");
    proxy.release();
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}; {}", sup.stderr());
    // Handed back before the supervisor exited.
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"), "{}", api.job(id));
    assert!(!out.path().join(format!("ran-{id}")).exists());
}

#[test]
fn a_fetch_in_flight_on_sighup_is_not_dropped() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let (proxy, sup) = held_fetch(&server, out.path());
    let id = api.create(json!({"name": "Held"}));
    proxy.wait_held(&sup);
    sup.signal(Signal::SIGHUP);
    wait_log(&sup, "configuration reloaded");
    proxy.release();
    // The fetch went on through the reload: its job runs.
    wait_for(&format!("job {id} to run and finish"), &sup, || {
        (out.path().join(format!("ran-{id}")).exists() && api.state(id).is_none()).then_some(())
    });
}

// ---------------------------------------------------------------------------
// A hand-back puts the job back exactly as it was before the hand-out
// ---------------------------------------------------------------------------

/// Lets the held fetch of a quieted supervisor answer, and waits until it
/// handed the job back.
fn quiet_and_hand_back(proxy: &Proxy, sup: &Supervisor) {
    proxy.wait_held(sup);
    sup.signal(Signal::SIGTSTP);
    wait_log(sup, "quiet: no more jobs will be taken");
    proxy.release();
    wait_log(
        sup,
        "handed back a job that arrived after the supervisor stopped taking jobs",
    );
}

/// POSTs `{"lease": lease}` to a job's `action`.
fn post_lease(api: &Api, id: i64, action: &str, lease: &Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/{action}"), json!({ "lease": lease }))
}

#[test]
fn a_handed_back_resumed_parent_keeps_its_finished_children() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    // A parent whose first run made a child, which finished: the parent is
    // queued again, and its next hand-out brings the child's result.
    let parent = api.create(json!({"name": "Held"}));
    let run = api.take("Held");
    let child = api.create(json!({"name": "Child", "parentJobID": parent, "data": {"r": 7}}));
    assert_eq!(post_lease(&api, parent, "finish", &run["lease"]).0, 200);
    let child_run = api.take("Child");
    let (status, body) = api.post(
        &format!("/jobs/{child}/finish"),
        json!({"lease": child_run["lease"], "data": {"r": 7}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(api.state(parent).as_deref(), Some("QUEUED"));

    // The resumed parent is handed to a supervisor that stops taking jobs
    // before the hand-out arrives, and hands it back.
    let (proxy, sup) = held_fetch(&server, out.path());
    quiet_and_hand_back(&proxy, &sup);
    let handout = &proxy.answers()[0]["jobs"][0];
    assert_eq!(handout["finishedChildJobs"][0]["jobID"], child, "{handout}");

    assert_eq!(api.state(parent).as_deref(), Some("QUEUED"));
    assert_eq!(
        api.state(child).as_deref(),
        Some("FINISHED"),
        "the hand-back deleted the parent's finished child"
    );
    let next = api.take("Held");
    assert_eq!(
        next["finishedChildJobs"],
        json!([{"jobID": child, "data": {"r": 7}}]),
        "the parent's next run does not get its child's result: {next}"
    );
    assert!(!out.path().join(format!("ran-{parent}")).exists());
}

#[test]
fn a_handed_back_job_keeps_its_attempts_and_retry_after_count() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    // A retryAfter job handed out three times without a report (Bedrock
    // counts them in its data, and fails the job at 10).
    let id = api.create(json!({
        "name": "Held",
        "retryAfter": "+1 HOUR",
        "data": {"keep": 1, "retryAfterCount": 3},
    }));
    let before = api.job(id);
    assert_eq!(before["attempts"], 0, "{before}");

    let (proxy, sup) = held_fetch(&server, out.path());
    quiet_and_hand_back(&proxy, &sup);
    let handout = &proxy.answers()[0]["jobs"][0];
    assert_eq!(handout["jobID"], id, "{handout}");

    let after = api.job(id);
    for field in ["state", "data", "nextRun", "lastRun", "attempts", "lapses"] {
        assert_eq!(
            after[field], before[field],
            "the hand-back changed {field}: before {before}, after {after}"
        );
    }
    assert_eq!(after["data"]["retryAfterCount"], 3, "{after}");
    assert!(
        api.outcomes(id).is_empty(),
        "the hand-out stayed in the job's history: {:?}",
        api.outcomes(id)
    );
    let next = api.take("Held");
    assert_eq!(
        next["attempt"], 1,
        "the hand-back counted an attempt: {next}"
    );
}

#[test]
fn a_hand_back_keeps_an_update_made_while_the_job_was_held() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let id = api.create(json!({"name": "Held", "data": {"v": 1}, "repeat": "FINISHED, +1 HOUR"}));
    let before = api.job(id);
    let (proxy, sup) = held_fetch(&server, out.path());
    proxy.wait_held(&sup);
    // Acknowledged while the supervisor holds the job.
    let (status, answer) = api.patch(
        &format!("/jobs/{id}"),
        json!({"data": {"v": 2}, "priority": 1000, "repeat": "FINISHED, +5 MINUTES"}),
    );
    assert_eq!(status, 200, "{answer}");
    quiet_and_hand_back(&proxy, &sup);

    let after = api.job(id);
    for (field, expected) in [
        ("data", json!({"v": 2})),
        ("priority", json!(1000)),
        ("repeat", json!("FINISHED, +5 MINUTES")),
        ("state", json!("QUEUED")),
        ("attempts", json!(0)),
        ("lastRun", before["lastRun"].clone()),
        ("nextRun", before["nextRun"].clone()),
    ] {
        assert_eq!(
            after[field], expected,
            "{field}: before {before}, after {after}"
        );
    }
}

#[test]
fn a_hand_back_keeps_the_update_of_a_held_retry_after_job() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({
        "name": "Retryable",
        "data": {"v": 1},
        "retryAfter": "+1 HOUR",
        "repeat": "SCHEDULED, +1 HOUR",
    }));
    let before = api.job(id);
    let taken = api.take("Retryable");
    let held = api.job(id);
    assert_eq!(held["state"], "RUNQUEUED", "{held}");
    assert_eq!(held["data"]["retryAfterCount"], 1, "{held}");
    let (status, answer) = api.patch(
        &format!("/jobs/{id}"),
        json!({"data": {"v": 2, "note": "kept"}, "priority": 250}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(post_lease(&api, id, "handback", &taken["lease"]).0, 200);

    // The update stays; the hand-out's bookkeeping (the retryAfter count,
    // the schedule's anchor) goes, as before the hand-out.
    let after = api.job(id);
    assert_eq!(after["data"], json!({"v": 2, "note": "kept"}), "{after}");
    assert_eq!(after["priority"], 250, "{after}");
    for field in ["state", "nextRun", "lastRun", "attempts", "repeat"] {
        assert_eq!(
            after[field], before[field],
            "{field}: before {before}, after {after}"
        );
    }
}

#[test]
fn a_hand_back_under_a_stale_lease_is_refused_over_http() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "hb", "data": {"v": 1}}));
    let first = api.take("hb");

    // Not this hand-out's lease, no lease at all: refused, nothing changed.
    assert_error(
        post_lease(&api, id, "handback", &json!("not-the-lease")),
        409,
        "lease_lost",
    );
    assert_error(
        api.post(&format!("/jobs/{id}/handback"), json!({})),
        400,
        "missing_lease",
    );
    assert_eq!(api.job(id)["state"], "RUNNING");

    // The holder's hand-back: the job is as before, its attempt uncounted.
    assert_eq!(post_lease(&api, id, "handback", &first["lease"]).0, 200);
    let job = api.job(id);
    assert_eq!(
        (&job["state"], &job["attempts"]),
        (&json!("QUEUED"), &json!(0)),
        "{job}"
    );

    // The same lease again, on a job no longer held under it: refused.
    assert_error(
        post_lease(&api, id, "handback", &first["lease"]),
        409,
        "lease_lost",
    );
    // A later holder is not disturbed by the earlier one's stale lease.
    let second = api.take("hb");
    assert_eq!(second["attempt"], 1, "{second}");
    assert_error(
        post_lease(&api, id, "handback", &first["lease"]),
        409,
        "lease_lost",
    );
    assert_eq!(api.job(id)["state"], "RUNNING");
    assert_error(
        post_lease(&api, 999_999, "handback", &first["lease"]),
        404,
        "no_such_job",
    );
}

/// One Bedrock request on its own connection: the status line.
fn bedrock_status(server: &Server, method: &str, headers: &[(&str, &str)]) -> String {
    let mut request = format!("{method}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    let answer = bedrock_exchange(&server.bedrock, request.as_bytes());
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn a_hand_back_under_a_stale_lease_is_refused_over_bedrock() {
    use jobmgr::client::{BedrockSource, JobSource};

    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "hb", "data": {"v": 1}}));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let source = BedrockSource::new(&server.bedrock)
        .expect("Bedrock address")
        .with_token(Some(api_token()));
    let lease = Duration::from_secs(3600);
    let get = |what: &str| {
        runtime
            .block_on(source.get_jobs("hb", 1, Duration::ZERO, lease))
            .expect(what)
            .into_iter()
            .next()
            .expect(what)
    };
    let first = get("the first hand-out");
    let token = first.lease.clone().expect("jobmgr's port gives a lease");
    let job_id = id.to_string();

    let stale = bedrock_status(
        &server,
        "HandBackJob",
        &[("jobID", &job_id), ("lease", "not-the-lease")],
    );
    assert!(stale.starts_with("409 Lease lost"), "{stale}");
    let missing = bedrock_status(&server, "HandBackJob", &[("jobID", &job_id)]);
    assert!(missing.starts_with("402 Missing lease"), "{missing}");
    assert_eq!(api.job(id)["state"], "RUNNING");

    // The source hands back with the command: as before, no attempt.
    runtime
        .block_on(source.hand_back(&first))
        .expect("the holder hands back");
    let job = api.job(id);
    assert_eq!(
        (&job["state"], &job["attempts"]),
        (&json!("QUEUED"), &json!(0)),
        "{job}"
    );
    assert!(api.outcomes(id).is_empty(), "{:?}", api.outcomes(id));

    let second = get("the second hand-out");
    assert_eq!(second.attempt, 1, "{:?}", second.handout);
    let late = bedrock_status(
        &server,
        "HandBackJob",
        &[("jobID", &job_id), ("lease", &token)],
    );
    assert!(late.starts_with("409 Lease lost"), "{late}");
    assert_eq!(
        runtime.block_on(source.hand_back(&first)),
        Err(jobmgr::client::SourceError::LeaseLost(id)),
        "a stale hand-back is not turned into a RetryJob"
    );
    assert_eq!(api.job(id)["state"], "RUNNING", "the new holder keeps it");
}

#[test]
fn a_hand_out_from_before_the_upgrade_is_handed_back_with_retry_job() {
    use jobmgr::client::{HttpSource, JobSource};

    let mut server = Server::start();
    let id = server.api().create(json!({"name": "hb"}));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let source = HttpSource::new(&server.url, Some(api_token())).expect("source");
    let job = runtime
        .block_on(source.get_jobs("hb", 1, Duration::ZERO, Duration::from_secs(3600)))
        .expect("get_jobs")
        .into_iter()
        .next()
        .expect("the job is handed out");
    // As if it was handed out by a server that kept no copy of it.
    server.kill9();
    server.store_execute("DELETE FROM jobs_before_handout");
    server.start_again_on_the_same_port();
    let api = server.api();

    assert_error(
        post_lease(&api, id, "handback", &json!(job.lease)),
        409,
        "hand_out_not_kept",
    );
    assert_eq!(api.job(id)["state"], "RUNNING", "a refusal changes nothing");
    runtime
        .block_on(source.hand_back(&job))
        .expect("the source falls back to RetryJob");
    assert_eq!(api.job(id)["state"], "QUEUED");
    assert_eq!(api.outcomes(id), ["retried"]);
}

#[test]
fn a_deleted_or_purged_job_leaves_no_copy_from_before_its_hand_out() {
    let server = Server::builder()
        .arg("--history-max-count")
        .arg("0")
        .start();
    let api = server.api();
    let kept = || server.store_query_i64("SELECT job_id FROM jobs_before_handout ORDER BY job_id");
    let finished = api.create(json!({"name": "done"}));
    let failed = api.create(json!({"name": "fails"}));
    let running = api.create(json!({"name": "runs"}));
    for (id, name) in [(finished, "done"), (failed, "fails"), (running, "runs")] {
        assert_eq!(api.take(name)["jobID"], id);
    }
    assert_eq!(kept(), [finished, failed, running], "after the hand-outs");

    assert_eq!(
        api.post(&format!("/jobs/{finished}/finish"), json!({})).0,
        200
    );
    assert_eq!(api.post(&format!("/jobs/{failed}/fail"), json!({})).0, 200);
    assert_eq!(kept(), [failed, running], "after the reports");
    let (status, purged) = api.post("/purge", json!({}));
    assert_eq!((status, &purged["failed"]), (200, &json!(1)), "{purged}");
    assert_eq!(kept(), [running], "after the purge");
}

// ---------------------------------------------------------------------------
// One bad hand-out does not strand its batch
// ---------------------------------------------------------------------------

#[test]
fn one_bad_handout_does_not_strand_its_batch() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    // All are due before the supervisor asks, so that they come in one
    // batch; the relay spoils two hand-outs of it: one whose data no worker
    // can be given (reported FAILED with the reason), and one that names no
    // job (which cannot be reported; it must not cost the others).
    let good: Vec<i64> = (0..3)
        .map(|i| api.create(json!({"name": "Batch", "data": {"i": i}})))
        .collect();
    let bad_data = api.create(json!({"name": "Batch", "data": {"spoil": "data"}}));
    let bad_id = api.create(json!({"name": "Batch", "data": {"spoil": "id"}}));
    let proxy = Proxy::start(&server.addr(), Relay::Spoil);
    let sup = Supervisor::builder(&proxy.url)
        .worker("Batch", &recording_worker(out.path()))
        .args_from(&["--lease", "1h", "--max-workers", "8", "--ramp", "8"])
        .start();
    for &id in &good {
        wait_for(&format!("good job {id} to run and finish"), &sup, || {
            (out.path().join(format!("ran-{id}")).exists() && api.state(id).is_none()).then_some(())
        });
    }
    // The batch really was one: the spoiled jobs came with the others.
    let batch = proxy
        .answers()
        .into_iter()
        .find(|a| {
            a["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|j| j["jobID"] == bad_id)
        })
        .expect("the answer with the spoiled jobs");
    let ids: Vec<&Value> = batch["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| &j["jobID"])
        .collect();
    for id in good.iter().chain([&bad_data]) {
        assert!(
            ids.contains(&&json!(id)),
            "job {id} was not in the spoiled batch: {batch}"
        );
    }

    let job = wait_state(&api, &sup, bad_data, "FAILED");
    assert_eq!(
        job["data"],
        json!({"spoil": "data"}),
        "its data was kept: {job}"
    );
    let (status, history) = api.get(&format!("/jobs/{bad_data}/history"));
    assert_eq!(status, 200, "{history}");
    assert!(
        history.to_string().contains("cannot read its hand-out"),
        "the reason is not in the history: {history}"
    );
    wait_log(&sup, "naming no job");
    for bad in [bad_data, bad_id] {
        assert!(
            !out.path().join(format!("ran-{bad}")).exists(),
            "job {bad} ran"
        );
    }
}

/// Several arguments at once.
trait ArgsFrom {
    fn args_from(self, args: &[&str]) -> Self;
}

impl ArgsFrom for SupervisorBuilder {
    fn args_from(self, args: &[&str]) -> Self {
        args.iter().fold(self, |builder, arg| builder.arg(arg))
    }
}
