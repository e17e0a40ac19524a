//! A forward step of the server's wall clock (its time is read from a file
//! holding an offset from the system time, `--clock-file`, which the test
//! steps) must not lapse the leases of jobs whose holders still heartbeat;
//! a job whose holder is gone still lapses.

use crate::common::*;

use serde_json::json;

#[test]
fn a_server_clock_step_lapses_every_lease_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "+0").expect("clock file");
    let server = Server::builder()
        .arg("--clock-file")
        .arg(clock.to_str().expect("utf-8 path"))
        .start();
    let api = server.api();
    let alive = api.create(json!({"name": "step/alive"}));
    let gone = api.create(json!({"name": "step/gone"}));
    let held = api.dequeue(json!({"name": "step/alive", "leaseMs": 60_000}));
    let token = held[0]["lease"].clone();
    let abandoned = api.dequeue(json!({"name": "step/gone", "leaseMs": 1_000}));
    assert_eq!(abandoned.len(), 1);

    // The wall clock jumps an hour ahead; real time does not.
    std::fs::write(&clock, "+3600000").expect("clock file");

    // The abandoned job lapses one term after it was taken, by real time:
    // the scheduler has looked at the stepped clock.
    poll("the abandoned job's lease to lapse after the step", || {
        (api.job(gone)["state"] == "QUEUED").then_some(())
    });
    // The holder of `alive`, heartbeating well within its term, still holds it.
    let (status, answer) = api.post(&format!("/jobs/{alive}/heartbeat"), json!({"lease": token}));
    assert_eq!(
        status, 200,
        "the holder lost its lease to the step: {answer}"
    );
    let job = api.job(alive);
    assert_eq!(job["state"], "RUNNING", "{job}");
    let again = api.dequeue(json!({"name": "step/*", "numResults": 2}));
    let ids: Vec<_> = again.iter().map(|j| j["jobID"].as_i64()).collect();
    assert_eq!(
        ids,
        vec![Some(gone)],
        "only the abandoned job is handed out again"
    );
    let (status, answer) = api.post(&format!("/jobs/{alive}/finish"), json!({"lease": token}));
    assert_eq!(status, 200, "the holder reports after the step: {answer}");
    assert!(server.stderr().contains("the wall clock stepped forward"));
}
