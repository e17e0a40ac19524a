//! Waiting on a supervisor's work: polls with a deadline that, when they
//! time out, show the supervisor's log. Shared by the supervisor tests.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Api, DEADLINE, Supervisor};

/// A shell worker script.
pub fn sh(body: &str) -> String {
    format!("#!/bin/sh\n{body}\n")
}

/// Something with a log to show when a wait times out.
pub trait Logs {
    /// The log, introduced by what it is.
    fn logs(&self) -> String;
}

impl Logs for Supervisor {
    fn logs(&self) -> String {
        format!("supervisor stderr:\n{}", self.stderr())
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after
/// [`DEADLINE`] naming `what` and showing the supervisor's log.
pub fn wait_for<T>(what: &str, logs: &dyn Logs, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        if start.elapsed() > DEADLINE {
            panic!(
                "timed out after {DEADLINE:?} waiting for {what}; {}",
                logs.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the job is in `state`; returns it.
pub fn wait_state(api: &Api, logs: &dyn Logs, id: i64, state: &str) -> Value {
    wait_for(&format!("job {id} to be {state}"), logs, || {
        let (status, job) = api.get(&format!("/jobs/{id}"));
        (status == 200 && job["state"] == state).then_some(job)
    })
}
