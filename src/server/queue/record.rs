//! What the queue's rules write to the ledger at each step of a job's life,
//! in the transaction of the step itself, at the transaction's time.

use std::collections::BTreeMap;

use super::tracked::Tracked;
use crate::protocol::{Data, Job, JobError, JobId, JobState, RunFacts, Timestamp, WorkerInfo};
use crate::server::ledger::failure::{self, LEASE_LOST, NO_REPORT};
use crate::server::ledger::utilisation::heard_span;
use crate::server::ledger::{ArchivedJob, Attempt, AttemptEnd, StatsDelta, hour_of};

/// A job was created.
pub fn created(tx: &mut Tracked, name: &str) -> Result<(), JobError> {
    let hour = hour_of(tx.now);
    tx.store().ledger().add_stats(
        name,
        hour,
        &StatsDelta {
            added: 1,
            ..StatsDelta::default()
        },
    )
}

/// A job was handed out; `due` is when it became due, `job` is as it is
/// now (its attempt counted).
pub fn handed_out(
    tx: &mut Tracked,
    job: &Job,
    due: Timestamp,
    worker: Option<&WorkerInfo>,
) -> Result<(), JobError> {
    let now = tx.now;
    if let Some(worker) = worker {
        heard_from(tx, &worker.id, Some(worker), None)?;
    }
    // A retryAfter job handed out again without a report.
    let ledger = tx.store().ledger();
    ledger.close_attempt(
        job.id,
        now,
        &AttemptEnd {
            outcome: "superseded".into(),
            ..AttemptEnd::default()
        },
    )?;
    ledger.open_attempt(&Attempt {
        job_id: job.id,
        name: job.name.clone(),
        attempt: job.attempts,
        worker: worker.map(|w| w.id.clone()),
        due,
        started: now,
        ended: None,
        end: None,
    })?;
    ledger.add_stats(
        &job.name,
        hour_of(now),
        &StatsDelta {
            started: 1,
            wait_ms: Some(now.0.saturating_sub(due.0)),
            ..StatsDelta::default()
        },
    )
}

/// A hand-out was never delivered and is undone.
pub fn undelivered(tx: &mut Tracked, job_id: JobId) -> Result<(), JobError> {
    tx.store().ledger().discard_open_attempt(job_id)
}

/// A job was deleted; an attempt still open ends as `deleted`.
pub fn deleted(tx: &mut Tracked, job_id: JobId) -> Result<(), JobError> {
    let now = tx.now;
    tx.store().ledger().close_attempt(
        job_id,
        now,
        &AttemptEnd {
            outcome: "deleted".into(),
            ..AttemptEnd::default()
        },
    )?;
    Ok(())
}

/// A holder renewed its lease.
pub fn heartbeat(tx: &mut Tracked, job_id: JobId) -> Result<(), JobError> {
    match tx.store().ledger().holder(job_id)? {
        Some(worker) => heard_from(tx, &worker, None, None),
        None => Ok(()),
    }
}

/// A supervisor announced itself (`info`), or was heard from by a
/// heartbeat or a report (`reported`: when the run it reported started; that
/// run is no longer open, and its executing time counts). When it was last heard from no longer ago than
/// `--worker-gone-after`, the time since counts as capacity it offered (its
/// slots × the time) and as busy time for each of its runs; a longer gap is
/// time it was gone, and counts as neither. So busy time never falls where
/// capacity does not, and a run that ends without a report (a lapse, a
/// deletion) kept its supervisor busy until it was last heard from.
pub fn heard_from(
    tx: &mut Tracked,
    worker: &str,
    info: Option<&WorkerInfo>,
    reported: Option<Timestamp>,
) -> Result<(), JobError> {
    let (now, gone_after) = (tx.now, tx.worker_gone_after_ms);
    let ledger = tx.store().ledger();
    let mut hours = BTreeMap::new();
    if let Some((last_seen, capacity)) = ledger.sighting(worker)?
        && now > last_seen
        && now.0 - last_seen.0 <= gone_after
    {
        let runs = ledger.open_runs(Some(worker))?;
        let runs = runs.into_iter().map(|(_, started)| started).chain(reported);
        hours = heard_span((last_seen, now), capacity, runs, (last_seen, now));
    }
    // The run it reported: its executing time, in the hour it ended.
    if let Some(started) = reported {
        hours.entry(hour_of(now)).or_default().run_ms = Some(now.0.saturating_sub(started.0));
    }
    for (hour, delta) in hours {
        ledger.add_worker_stats(worker, hour, &delta)?;
    }
    match info {
        Some(info) => ledger.see_worker(info, now),
        None => ledger.touch_worker(worker, now),
    }
}

/// How a run's report leaves the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaves {
    /// It runs again (a retry, a repeat, a paused parent).
    Stays,
    /// It finished for good (deleted, or a FINISHED child).
    Finished,
    /// It is FAILED.
    Failed,
}

/// A run ended: `outcome` is `finished`, `retried`, `failed` or
/// `lease_lost`; `reported` when its holder said so with its lease (not a
/// lapse, nor a report by someone else); `job` is as it is now.
fn ended(
    tx: &mut Tracked,
    job: &Job,
    end: AttemptEnd,
    leaves: Leaves,
    reported: bool,
) -> Result<(), JobError> {
    let now = tx.now;
    let open = tx.store().ledger().close_attempt(job.id, now, &end)?;
    if reported
        && let Some(open) = &open
        && let Some(worker) = open.worker.as_deref()
    {
        heard_from(tx, worker, None, Some(open.started))?;
    }
    let ledger = tx.store().ledger();
    let name = open.as_ref().map_or(job.name.as_str(), |a| a.name.as_str());
    let mut delta = StatsDelta::default();
    match end.outcome.as_str() {
        "finished" => {
            delta.finished = 1;
            delta.run_ms = open.as_ref().map(|a| now.0.saturating_sub(a.started.0));
        }
        _ if leaves == Leaves::Failed => delta.failed = 1,
        _ => delta.retried = 1,
    }
    if end.outcome == "finished" || leaves == Leaves::Failed {
        let entered = ledger.occurrence_start(job.id)?.unwrap_or(job.created);
        delta.service_ms = Some(now.0.saturating_sub(entered.0));
    }
    ledger.add_stats(name, hour_of(now), &delta)?;
    let state = match leaves {
        Leaves::Stays => return Ok(()),
        Leaves::Finished => JobState::Finished,
        Leaves::Failed => JobState::Failed,
    };
    if let (Leaves::Failed, Some(group)) = (leaves, &end.failure) {
        ledger.set_failure(job.id, group, now)?;
    }
    ledger.archive(&ArchivedJob {
        job_id: job.id,
        name: job.name.clone(),
        state: state.as_str().to_string(),
        data: job.data.clone(),
        created: job.created,
        ended: now,
        attempts: job.attempts,
        failure: end.failure.filter(|_| leaves == Leaves::Failed),
    })
}

/// A report (FinishJob, RetryJob, FailJob) ended a run; `data` is the
/// report's (its `_jobmgr` details say how), `run` what the supervisor saw;
/// `by_holder` when it came with the run's lease token (a report without
/// one, such as an operator's, does not count as hearing from the
/// supervisor that holds the job).
pub fn reported(
    tx: &mut Tracked,
    job: &Job,
    outcome: &str,
    data: Option<&Data>,
    run: Option<&RunFacts>,
    leaves: Leaves,
    by_holder: bool,
) -> Result<(), JobError> {
    let end = failure::reported_end(outcome, data, run);
    ended(tx, job, end, leaves, by_holder)
}

/// A holder handed the job back for want of its worker (see
/// [`failure::is_no_worker_hand_back`]): that hand-out was no run, so the
/// history keeps one row per streak of such hand-backs, counting them, and
/// the statistics count no retry and no run time. `by_holder` as for
/// [`reported`].
pub fn handed_back(
    tx: &mut Tracked,
    job: &Job,
    data: Option<&Data>,
    run: Option<&RunFacts>,
    by_holder: bool,
) -> Result<(), JobError> {
    let mut end = failure::reported_end(failure::HANDED_BACK, data, run);
    end.hand_backs = 1;
    let now = tx.now;
    let open = tx.store().ledger().close_hand_back(job.id, now, &end)?;
    match open.and_then(|open| open.worker) {
        Some(worker) if by_holder => heard_from(tx, &worker, None, None),
        _ => Ok(()),
    }
}

/// A lease lapsed; `failed` when the job is FAILED for it.
pub fn lapsed(tx: &mut Tracked, job: &Job, failed: bool) -> Result<(), JobError> {
    let end = AttemptEnd {
        outcome: LEASE_LOST.into(),
        failure: Some(LEASE_LOST.into()),
        ..AttemptEnd::default()
    };
    ended(
        tx,
        job,
        end,
        if failed {
            Leaves::Failed
        } else {
            Leaves::Stays
        },
        false,
    )
}

/// A `retryAfter` job was handed out too often without a report.
pub fn no_report(tx: &mut Tracked, job: &Job) -> Result<(), JobError> {
    let end = AttemptEnd {
        outcome: "failed".into(),
        failure: Some(NO_REPORT.into()),
        ..AttemptEnd::default()
    };
    ended(tx, job, end, Leaves::Failed, false)
}
