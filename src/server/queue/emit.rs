//! The job state changes the queue's rules publish as events, one function
//! per kind of step, so that each rule adds one line where it commits the
//! change (see [`crate::server::events`]).

use serde_json::json;

use super::tracked::Tracked;
use crate::protocol::{Job, JobState, RunFacts, Timestamp, WorkerInfo};
use crate::server::events::{EventKind, JobEvent};

/// A job was created (`job` as inserted, `id` its new id).
pub fn created(tx: &mut Tracked, job: &Job, id: i64) {
    let mut event = JobEvent::of(EventKind::Created, job, tx.now);
    event.job_id = id;
    let event = event.with("priority", json!(job.priority));
    let event = if job.parent_id != 0 {
        event.with("parentJobID", json!(job.parent_id))
    } else {
        event
    };
    tx.emit(event);
}

/// A job was handed out, to `worker` when the taker said who it is; it
/// was due at `due`.
pub fn handed_out(tx: &mut Tracked, job: &Job, due: Timestamp, worker: Option<&WorkerInfo>) {
    let expires = job.lease.as_ref().and_then(|l| l.expires);
    let mut event = JobEvent::of(EventKind::HandedOut, job, tx.now);
    event.waited_ms = Some((tx.now.0 - due.0).max(0));
    let event = event
        .with("holder", json!(worker.map(|w| w.id.as_str())))
        .with("leaseExpires", json!(expires.map(|e| e.to_string())));
    tx.emit(event);
}

/// A report (or the server) ended a run: `kind` says how, `state` is where
/// it left the job (the job itself may be about to be deleted), `outcome`
/// the report's word, `run` what the supervisor saw.
pub fn reported(
    tx: &mut Tracked,
    kind: EventKind,
    job: &Job,
    state: JobState,
    outcome: &str,
    run: Option<&RunFacts>,
) {
    let mut event = JobEvent::of(kind, job, tx.now).with("outcome", json!(outcome));
    event.state = state.as_str();
    if let Some(run) = run {
        event = event
            .with("exitCode", json!(run.exit_code))
            .with("signal", json!(run.signal));
    }
    tx.emit(event);
}

/// A lease lapsed; `job` is as it is left (QUEUED or FAILED).
pub fn lapsed(tx: &mut Tracked, job: &Job) {
    let event = JobEvent::of(EventKind::Lapsed, job, tx.now).with("lapses", json!(job.lapses));
    tx.emit(event);
}

/// `kind` happened to `job`, which is now as given.
pub fn plain(tx: &mut Tracked, kind: EventKind, job: &Job) {
    tx.emit_of(kind, job);
}

/// `job` was deleted.
pub fn deleted(tx: &mut Tracked, job: &Job) {
    let event = JobEvent::deleted(job, tx.now);
    tx.emit(event);
}
