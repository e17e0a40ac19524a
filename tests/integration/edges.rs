//! Edge cases found in review, each a regression test: clients that go away
//! at awkward moments, non-ASCII where ASCII was assumed, leases shorter
//! than the supervisor's own, repeating jobs and their schedule, workers that
//! cannot start or leave something holding their output.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::PermissionsExt;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::*;

fn ms(value: &Value) -> i64 {
    let text = value.as_str().expect("a time");
    jobmgr::protocol::Timestamp::parse(text)
        .expect("a valid time")
        .0
}

fn now_ms() -> i64 {
    jobmgr::protocol::Timestamp::now().0
}

#[test]
fn a_bedrock_client_that_hangs_up_after_get_job_is_handed_nothing() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "hangup"}));
    let mut stream = TcpStream::connect(&server.bedrock).expect("connect");
    stream
        .write_all(&with_token_header(b"GetJob\r\nname: hangup\r\n\r\n"))
        .expect("write");
    stream.shutdown(Shutdown::Both).expect("shutdown");
    drop(stream);
    poll("the server to notice the hang-up", || {
        let log = server.stderr();
        (log.contains("went away before its GetJob was answered")
            || log.contains("putting them back"))
        .then_some(())
    });
    // The hang-up may be seen before the claim it cut short commits: the
    // job is handed out again once that claim's jobs are put back.
    let taken = poll("the job to be handed out again", || {
        api.dequeue(json!({"name": "hangup"})).into_iter().next()
    });
    assert_eq!(taken["jobID"], id);
    let job = api.job(id);
    assert_eq!(
        job["attempts"], 1,
        "the undelivered hand-out does not count: {job}"
    );
}

#[test]
fn non_ascii_in_a_repeat_or_retry_after_is_refused_not_a_crash() {
    let server = Server::start();
    let api = server.api();
    for repeat in ["FINISHED, é1 HOURS", "é", "FINISHED, €5 DAYS"] {
        assert_error(
            api.post("/jobs", json!({"name": "x", "repeat": repeat})),
            400,
            "malformed_repeat",
        );
    }
    assert_error(
        api.post("/jobs", json!({"name": "x", "retryAfter": "é5 MINUTES"})),
        400,
        "malformed_retry_after",
    );
    let answer = bedrock_exchange(
        &server.bedrock,
        "CreateJob\r\nname: x\r\nretryAfter: é5 MINUTES\r\n\r\n".as_bytes(),
    );
    assert!(answer.starts_with("402 Malformed retryAfter"), "{answer}");
    assert_eq!(
        server.api().get("/healthz").0,
        200,
        "the server is still up"
    );
}

#[test]
fn progress_under_a_lost_lease_is_refused_and_bookkeeping_survives_progress() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "progress", "data": {"v": 1}}));
    let first = api.dequeue(json!({"name": "progress", "leaseMs": 200}))[0].clone();
    poll("the lease to lapse", || {
        (api.job(id)["lapses"] == 1).then_some(())
    });
    let second = api.take("progress");
    assert_error(
        api.patch(
            &format!("/jobs/{id}"),
            json!({"data": {"v": 99}, "lease": first["lease"]}),
        ),
        409,
        "lease_lost",
    );
    assert_eq!(api.job(id)["data"], json!({"v": 1}));
    let (status, answer) = api.patch(
        &format!("/jobs/{id}"),
        json!({"data": {"v": 2}, "lease": second["lease"]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.job(id)["data"], json!({"v": 2}));

    // A held retryAfter job keeps its hand-out count through progress.
    let counted = api.create(json!({"name": "counted", "retryAfter": "+1 HOURS"}));
    let held = api.take("counted");
    let (status, _) = api.patch(
        &format!("/jobs/{counted}"),
        json!({"data": {"progress": 1}, "lease": held["lease"]}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        api.job(counted)["data"],
        json!({"progress": 1, "retryAfterCount": 1})
    );
}

#[test]
fn a_retry_after_shorter_than_the_supervisors_lease_is_renewed_in_time() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let runs = builder.path().join("runs");
    let sup = builder
        .worker(
            "Slow",
            "#!/bin/sh\ncat > /dev/null\necho run >> \"$RUNS\"\nsleep 9\n",
        )
        .arg("--lease")
        .arg("30s")
        .arg("--env")
        .arg(&format!("RUNS={}", runs.display()))
        .start();
    // A term of 4 s, renewed every third of it: long enough that a renewal
    // delayed by a busy machine still lands in time, short enough that the
    // 9 s run outlives it twice over.
    let id = api.create(json!({"name": "Slow", "retryAfter": "+4 SECONDS"}));
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    let text = std::fs::read_to_string(&runs).expect("runs file");
    assert_eq!(
        text.lines().count(),
        1,
        "ran once, not again when the retryAfter passed: {}",
        sup.stderr()
    );
}

#[test]
fn a_server_outage_shorter_than_the_lease_does_not_stop_the_running_worker() {
    let mut server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let runs = builder.path().join("runs");
    let sup = builder
        .worker(
            "Slow",
            "#!/bin/sh\ncat > /dev/null\necho run >> \"$RUNS\"\nsleep 5\necho '{\"done\":true}'\n",
        )
        .arg("--lease")
        .arg("6s")
        .arg("--env")
        .arg(&format!("RUNS={}", runs.display()))
        .start();
    let id = api.create(json!({"name": "Slow", "repeat": "FINISHED, +1 HOUR"}));
    poll("the worker to start", || runs.exists().then_some(()));
    server.kill9();
    // Down until a renewal has failed; the first failure must not stop the
    // worker (the lease still holds for a while).
    poll("a lease renewal to fail", || {
        sup.stderr().contains("lease renewal failed").then_some(())
    });
    server.start_again_on_the_same_port();
    let job = poll("the job to finish", || {
        let job = api.job(id);
        (job["data"]["done"] == true).then_some(job)
    });
    let text = std::fs::read_to_string(&runs).expect("runs file");
    assert_eq!(text.lines().count(), 1, "ran once: {}", sup.stderr());
    assert_eq!(job["lapses"], 0, "{job}");
    assert!(
        !sup.stderr().contains("stopping the worker"),
        "{}",
        sup.stderr()
    );
}

#[test]
fn a_repeating_job_handed_back_at_drain_keeps_its_occurrence() {
    let server = Server::start();
    let api = server.api();
    let mut sup = Supervisor::builder(&server.url)
        .worker("Long", "#!/bin/sh\ncat > /dev/null\nsleep 60\n")
        .arg("--drain-timeout")
        .arg("1s")
        .start();
    let id = api.create(json!({"name": "Long", "repeat": "SCHEDULED, +1 DAY"}));
    poll("the job to run", || {
        (api.state(id).as_deref() == Some("RUNNING")).then_some(())
    });
    sup.signal(Signal::SIGTERM);
    assert!(sup.wait_exit().success());
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert!(
        ms(&job["nextRun"]) <= now_ms() + 5_000,
        "handed back for now, not tomorrow: {job}"
    );
}

#[test]
fn a_repeating_job_that_keeps_failing_moves_on_to_its_next_occurrence() {
    let server = Server::start();
    let api = server.api();
    let _sup = Supervisor::builder(&server.url)
        .worker("Broken", "#!/bin/sh\ncat > /dev/null\nexit 3\n")
        .arg("--max-attempts")
        .arg("1")
        .start();
    let before = now_ms();
    let id = api.create(json!({"name": "Broken", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the failure to be reported", || {
        let job = api.job(id);
        (job["data"]["_jobmgr"]["exitCode"] == 3).then_some(job)
    });
    assert_eq!(job["state"], "QUEUED", "the schedule continues: {job}");
    assert!(
        ms(&job["nextRun"]) >= before + 3_500_000,
        "at the next occurrence: {job}"
    );
}

#[test]
fn a_repeating_job_gets_all_its_attempts_at_each_occurrence_after_one_given_up() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let attempts = builder.path().join("attempts");
    let _sup = builder
        .worker(
            "Flaky",
            &format!(
                "#!/bin/sh
cat > /dev/null
echo \"$JOBMGR_ATTEMPT\" >> '{}'
exit 3
",
                attempts.display()
            ),
        )
        .arg("--max-attempts")
        .arg("2")
        .start();
    api.create(json!({"name": "Flaky", "repeat": "FINISHED, +1 SECOND"}));
    // Two tries, given up on, then the next occurrence: two tries again.
    let seen = poll("three occurrences' attempts", || {
        let text = std::fs::read_to_string(&attempts).unwrap_or_default();
        let seen: Vec<String> = text.lines().map(str::to_string).collect();
        (seen.len() >= 5).then_some(seen)
    });
    assert_eq!(seen[..5], ["1", "2", "1", "2", "1"], "{seen:?}");
}

#[test]
fn a_worker_that_cannot_start_fails_with_the_reason() {
    let server = Server::start();
    let api = server.api();
    let _sup = Supervisor::builder(&server.url)
        .worker("NoInterpreter", "#!/nonexistent/interpreter\n")
        .worker("Fine", "#!/bin/sh\ncat > /dev/null\n")
        .arg("--max-attempts")
        .arg("1")
        .start();
    let bad = api.create(json!({"name": "NoInterpreter"}));
    let job = poll("the job to fail", || {
        let job = api.job(bad);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(job["data"]["_jobmgr"]["outcome"], "cannot_start", "{job}");
    let good = api.create(json!({"name": "Fine"}));
    poll("the supervisor to go on serving", || {
        api.state(good).is_none().then_some(())
    });
}

#[test]
fn output_held_open_by_an_escaped_process_is_kept_and_the_job_reported() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let pidfile = builder.path().join("escaped.pid");
    // The escaped process is not the test's child, so the test never
    // signals it: it ends by itself once this file exists (or after 30 s).
    let stop = builder.path().join("escaped.stop");
    let sup = builder
        .worker(
            "Escape",
            "#!/bin/sh\ncat > /dev/null\n\
             setsid sh -c 'i=0; while [ ! -e \"$1\" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done' escaped \"$STOP\" &\n\
             p=$!\necho $p > \"$PIDFILE\"\n\
             # Wait until it has left the worker's session.\n\
             while [ \"$(ps -o sid= -p $p | tr -d ' ')\" != \"$p\" ]; do sleep 0.05; done\n\
             echo '{\"a\":1}'\n",
        )
        .arg("--env")
        .arg(&format!("PIDFILE={}", pidfile.display()))
        .arg("--env")
        .arg(&format!("STOP={}", stop.display()))
        .start();
    let id = api.create(json!({"name": "Escape", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the job to be reported", || {
        let job = api.job(id);
        (job["state"] == "QUEUED" && job["data"]["a"] == 1).then_some(job)
    });
    assert_eq!(
        job["data"],
        json!({"a": 1}),
        "stdout's last line was read: {job}"
    );
    let pid: i32 = poll("the escaped pid", || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    });
    if sup.stderr().contains("cgroups: none") {
        // Without cgroups nothing can reach it; the report still came.
        assert!(
            sup.stderr().contains("still holds its output open"),
            "{}",
            sup.stderr()
        );
    } else {
        // With cgroups it dies with its job, though it left the session.
        poll("the escaped process to be killed with its job", || {
            (!alive_with(pid, &stop.to_string_lossy())).then_some(())
        });
    }
    // Clean up what this test started, without a signal: tell it to end.
    std::fs::write(&stop, "").unwrap();
    poll("the escaped process to end by itself", || {
        (!alive_with(pid, &stop.to_string_lossy())).then_some(())
    });
}

#[test]
fn a_scratch_directory_others_can_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
    let output = jobmgr_in(dir.path())
        .args(["--server", "http://127.0.0.1:9", "--worker-path"])
        .arg(dir.path())
        .arg("--scratch-dir")
        .arg(&scratch)
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .run_bounded("a supervisor with a world-writable scratch directory to be refused");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("writable by other users"), "{stderr}");
}

#[test]
fn unusable_poll_wait_and_lease_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, message) in [
        ("--poll-wait", "0s", "poll-wait must be between"),
        ("--poll-wait", "2h", "poll-wait must be between"),
        ("--lease", "2d", "lease must be between"),
    ] {
        let output = jobmgr_in(dir.path())
            .args(["--server", "http://127.0.0.1:9", "--worker-path"])
            .arg(dir.path())
            .args([flag, value])
            .run_bounded(&format!("a supervisor with {flag} {value} to be refused"));
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{flag} {value}: {stderr}");
    }
}
