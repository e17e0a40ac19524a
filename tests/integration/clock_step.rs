//! A forward step of the server's wall clock (its time is read from a file
//! holding an offset from the system time, `--clock-file`, which the test
//! steps) must not lapse the leases of jobs whose holders still heartbeat;
//! a job whose holder is gone still lapses. The step is made up for by the
//! first write after it, whatever it is; the scheduler, sleeping on a
//! monotonic timer until the earliest lease lapses, may wake much later.

use crate::common::*;

use serde_json::{Value, json};

/// Why these tests do not apply to a store shared by several servers.
const ON_POSTGRES: &str = "a shared store's clock is the database's, counted on by each server's \
     monotonic clock: a step of a server's wall clock cannot reach it, and a step of the \
     database's own clock is not made up for, since every server would make it up once more \
     (src/server/store/postgres/clock.rs)";

#[test]
fn a_server_clock_step_lapses_every_lease_at_once() {
    if skip_on_postgres(ON_POSTGRES) {
        return;
    }
    let clock = Clock::at("+0");
    let server = clock.server().start();
    let api = server.api();
    let alive = api.create(json!({"name": "step/alive"}));
    let gone = api.create(json!({"name": "step/gone"}));
    let held = api.dequeue(json!({"name": "step/alive", "leaseMs": 60_000}));
    let token = held[0]["lease"].clone();
    let abandoned = api.dequeue(json!({"name": "step/gone", "leaseMs": 1_000}));
    assert_eq!(abandoned.len(), 1);

    // The wall clock jumps an hour ahead; real time does not.
    clock.set("+3600000");

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

/// The job's state and how many times it was handed out.
fn held(api: &Api, id: i64) -> (Value, Value) {
    let job = api.job(id);
    (job["state"].clone(), job["attempts"].clone())
}

/// Defect: a step was made up for only at the scheduler's next tick, which
/// comes when the earliest lease lapses (here a minute of real time away).
/// A claim in between judged unextended leases by the stepped clock: a
/// leased `retryAfter` job, RUNQUEUED until its lease lapses, looked due
/// and was handed out again under a new token, and its live holder's
/// heartbeat was refused.
#[test]
fn a_clock_step_noticed_only_at_the_next_tick_hands_out_held_jobs_again() {
    if skip_on_postgres(ON_POSTGRES) {
        return;
    }
    let clock = Clock::at("+0");
    let server = clock.server().start();
    let api = server.api();
    let retried = api.create(json!({"name": "step/retried", "retryAfter": "+1 MINUTE"}));
    let running = api.create(json!({"name": "step/running"}));
    let retried_token = api.take("step/retried")["lease"].clone();
    let running_token =
        api.dequeue(json!({"name": "step/running", "leaseMs": 60_000}))[0]["lease"].clone();
    assert_eq!(held(&api, retried).0, "RUNQUEUED");
    assert_eq!(held(&api, running).0, "RUNNING");

    clock.set("+3600000");

    // The first request after the step: no scheduler tick came before it.
    let again = api.dequeue(json!({"name": "step/*", "numResults": 2}));
    assert!(
        again.is_empty(),
        "jobs still held were handed out again after the step: {again:?}"
    );
    for (id, token) in [(retried, &retried_token), (running, &running_token)] {
        let (status, answer) = api.post(&format!("/jobs/{id}/heartbeat"), json!({"lease": token}));
        assert_eq!(
            status, 200,
            "job {id}'s holder lost its lease to the step: {answer}"
        );
        assert_eq!(held(&api, id).1, 1, "job {id} was handed out again");
    }
    assert_eq!(held(&api, retried).0, "RUNQUEUED");
    assert_eq!(held(&api, running).0, "RUNNING");
    for (id, token) in [(retried, &retried_token), (running, &running_token)] {
        let (status, answer) = api.post(&format!("/jobs/{id}/finish"), json!({"lease": token}));
        assert_eq!(
            status, 200,
            "job {id}'s holder reports after the step: {answer}"
        );
    }
}

/// Defect: leases granted after a step but before the scheduler's next
/// tick were extended by the step again at that tick: a job taken with a
/// one-second lease after the step, whose holder then went away, was held
/// for another hour.
#[test]
fn a_lease_granted_after_a_clock_step_is_not_extended_by_it() {
    if skip_on_postgres(ON_POSTGRES) {
        return;
    }
    let clock = Clock::at("+0");
    let server = clock.server().start();
    let api = server.api();
    // Its holder goes away; the scheduler's first look after the step is
    // when its two-second lease lapses.
    let before = api.create(json!({"name": "step/before"}));
    let taken = api.dequeue(json!({"name": "step/before", "leaseMs": 2_000}));
    assert_eq!(taken.len(), 1, "{taken:?}");

    clock.set("+3600000");

    let kept = api.create(json!({"name": "step/kept"}));
    let granted = api.dequeue(json!({"name": "step/kept", "leaseMs": 60_000}));
    let expires = granted[0]["leaseExpires"].clone();
    let gone = api.create(json!({"name": "step/gone"}));
    let taken = api.dequeue(json!({"name": "step/gone", "leaseMs": 1_000}));
    assert_eq!(taken.len(), 1, "{taken:?}");
    poll(
        "the one-second lease granted after the step to lapse",
        || (api.job(gone)["lapses"] == 1).then_some(()),
    );
    poll(
        "the lease taken before the step to lapse one step later",
        || (api.job(before)["lapses"] == 1).then_some(()),
    );
    let job = api.job(kept);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(
        job["leaseExpires"], expires,
        "a lease granted after the step was extended by it"
    );
    let logged = server.stderr();
    assert_eq!(
        logged.matches("the wall clock stepped forward").count(),
        1,
        "{logged}"
    );
}
