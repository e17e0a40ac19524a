//! Bedrock::Jobs semantics, one function per command, over a tracked store
//! transaction. Each function either completes or returns an error, and the
//! caller's transaction is rolled back on error, so a refused command changes
//! nothing.

use serde_json::{Value, json};

use super::emit;
use super::record::{self, Leaves};
use super::tracked::Tracked;
use crate::protocol::MAX_PAGE_BYTES;
use crate::protocol::view::HandOut;
use crate::protocol::{
    CreateJob, Data, FailJob, FinishJob, GetJobs, Job, JobError, JobId, JobState, Lease, LeaseTerm,
    Repeat, RepeatBase, RequeueJobs, RetryAfter, RetryJob, Timestamp, UpdateJob, check_name,
};
use crate::server::calendar;
use crate::server::events::EventKind;
use crate::server::ledger::failure::is_no_worker_hand_back;
use crate::server::store::{ByteCount, Take};

/// Hand-outs of a `retryAfter` job without a report after which it fails.
pub const MAX_RETRY_AFTER_HANDOUTS: i64 = 10;

/// The data key where GetJob counts unreported `retryAfter` hand-outs.
const RETRY_AFTER_COUNT: &str = "retryAfterCount";

/// The data key where every hand-out of a `retryAfter` job with a
/// `SCHEDULED` repeat keeps the nextRun it was due at, overwriting the
/// earlier one (as Bedrock does): the base of its next run, since the
/// hand-out moves `nextRun` to when it is handed out again. Reports keep it.
const ORIGINAL_NEXT_RUN: &str = "originalNextRun";

/// Data keys that are bookkeeping, not the caller's, when comparing data for
/// a unique CreateJob.
const BOOKKEEPING_KEYS: [&str; 2] = [RETRY_AFTER_COUNT, ORIGINAL_NEXT_RUN];

/// The longest RetryJob delay in seconds: Bedrock applies it as
/// `+N SECONDS`, a modifier of at most 8 digits.
pub const MAX_RETRY_DELAY_SECS: i64 = 99_999_999;

/// Whether a job is one a person dequeues by hand (its name starts with
/// `manual`): Bedrock neither counts its `retryAfter` hand-outs nor fails it
/// after [`MAX_RETRY_AFTER_HANDOUTS`].
pub fn is_manual(name: &str) -> bool {
    name.starts_with("manual")
}

/// States in which a child still holds its parent paused.
const PENDING_CHILD: [JobState; 4] = [
    JobState::Queued,
    JobState::Runqueued,
    JobState::Running,
    JobState::Paused,
];

/// A fresh, unguessable lease token.
pub fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// CreateJob. Returns the id of the new job, or of the existing one for a
/// `unique` job that exists.
pub fn create(tx: &mut Tracked, cmd: &CreateJob) -> Result<JobId, JobError> {
    check_name(&cmd.name)?;
    if cmd.parent_id.is_some() && !cmd.depends.is_empty() {
        return Err(JobError::ChildDepends);
    }
    let mut initial_state = JobState::Queued;
    if let Some(parent_id) = cmd.parent_id {
        let parent = tx.get(parent_id)?.ok_or(JobError::ParentMissing)?;
        if !matches!(
            parent.state,
            JobState::Running | JobState::Runqueued | JobState::Paused
        ) {
            return Err(JobError::ParentNotRunning);
        }
        if parent.is_child() {
            return Err(JobError::Grandchild);
        }
        // Children of a running parent wait for it to finish; a child created
        // while the parent is paused (a sibling made by a child) runs at once.
        if parent.state != JobState::Paused {
            initial_state = JobState::Paused;
        }
    }

    let waiting_for = super::dependencies::unfinished(tx, &cmd.depends)?;
    if !waiting_for.is_empty() {
        initial_state = JobState::Depends;
    }

    if cmd.unique
        && let Some(mut existing) = tx.find_by_name(&cmd.name)?
    {
        if existing.is_child() && existing.parent_id != cmd.parent_id.unwrap_or(0) {
            return Err(JobError::ChildOfOtherParent);
        }
        if !cmd.overwrite {
            return Ok(existing.id);
        }
        super::labels::tag_new(tx, existing.id, &cmd.tags)?;
        if same_data(&existing.data, &cmd.data) {
            return Ok(existing.id);
        }
        let mut merged = Value::Object(std::mem::take(&mut existing.data));
        json_patch::merge(&mut merged, &Value::Object(cmd.data.clone()));
        existing.data = match merged {
            Value::Object(map) => map,
            _ => Data::new(),
        };
        if let Some(repeat) = &cmd.repeat {
            existing.repeat = repeat.text.clone();
        }
        if let Some(priority) = cmd.priority {
            existing.priority = priority;
        }
        tx.update(&existing)?;
        return Ok(existing.id);
    }

    let now = tx.now;
    let job = Job {
        id: 0,
        name: cmd.name.clone(),
        state: initial_state,
        data: cmd.data.clone(),
        priority: cmd.priority.unwrap_or_default(),
        created: now.whole_second(),
        next_run: cmd.first_run.unwrap_or(now),
        last_run: None,
        repeat: cmd
            .repeat
            .as_ref()
            .map(|r| r.text.clone())
            .unwrap_or_default(),
        retry_after: cmd
            .retry_after
            .as_ref()
            .map(|r| r.text.clone())
            .unwrap_or_default(),
        parent_id: cmd.parent_id.unwrap_or(0),
        scheduled_run: None,
        lease: None,
        attempts: 0,
        lapses: 0,
    };
    let id = tx.insert(&job)?;
    super::labels::tag_new(tx, id, &cmd.tags)?;
    super::dependencies::record(tx, id, &waiting_for)?;
    record::created(tx, &job.name)?;
    emit::created(tx, &job, id);
    Ok(id)
}

/// Data equality for `unique`, ignoring Bedrock's bookkeeping keys.
fn same_data(stored: &Data, incoming: &Data) -> bool {
    let strip = |data: &Data| {
        let mut data = data.clone();
        for key in BOOKKEEPING_KEYS {
            data.remove(key);
        }
        data
    };
    strip(stored) == strip(incoming)
}

/// GetJob(s): hands out up to `num_results` due jobs, best first, each
/// only while every throttle it matches has room (see `throttles`), and
/// only while the hand-outs fit in [`MAX_PAGE_BYTES`] (by
/// [`HandOut::answer_bytes`]; the first always does): the jobs past it are
/// left as they are, queued for the next claim. A candidate worn out by
/// [`MAX_RETRY_AFTER_HANDOUTS`] is FAILED and its place taken by the next
/// due job, so that a claim finds nothing only when nothing it could take
/// is due (a woken waiter relies on that).
pub fn get_jobs(tx: &mut Tracked, cmd: &GetJobs) -> Result<Vec<HandOut>, JobError> {
    let mut handed = Vec::with_capacity(cmd.num_results.min(1024));
    let mut bytes = ByteCount::new(MAX_PAGE_BYTES);
    let mut gate = super::throttles::Gate::open(tx, &cmd.pattern)?;
    loop {
        if bytes.full() {
            return Ok(handed);
        }
        let take = Take {
            jobs: cmd.num_results - handed.len(),
            bytes: bytes.left(),
        };
        let candidates = gate.candidates(tx, &cmd.pattern, cmd.priority, take)?;
        let found = candidates.len();
        let before = handed.len();
        let mut answer_full = false;
        for snapshot in candidates {
            let name = snapshot.name.clone();
            if answer_full {
                gate.give_back(&name);
                continue;
            }
            match hand_out(tx, cmd, snapshot, &mut bytes, handed.is_empty())? {
                Handed::Out(handout) => handed.push(*handout),
                Handed::Failed => gate.give_back(&name),
                Handed::NoRoom => {
                    gate.give_back(&name);
                    answer_full = true;
                }
            }
        }
        // Every candidate handed out (or fewer found than wanted): nothing
        // more is due. A worn-out one left a place to fill: look again (each
        // round FAILs at least one job, so this ends).
        if answer_full || handed.len() - before == found || handed.len() == cmd.num_results {
            return Ok(handed);
        }
    }
}

/// What became of a candidate.
enum Handed {
    /// Handed out under a lease.
    Out(Box<HandOut>),
    /// FAILed: a `retryAfter` job handed out [`MAX_RETRY_AFTER_HANDOUTS`]
    /// times already.
    Failed,
    /// Left as it was: the answer has no room for it.
    NoRoom,
}

/// Hands out one due job under a lease, if its hand-out fits in what is
/// left of `bytes` (or is the `first`), or FAILs it when it is a
/// `retryAfter` job handed out [`MAX_RETRY_AFTER_HANDOUTS`] times already.
fn hand_out(
    tx: &mut Tracked,
    cmd: &GetJobs,
    snapshot: Job,
    bytes: &mut ByteCount,
    first: bool,
) -> Result<Handed, JobError> {
    let now = tx.now;
    let mut job = snapshot.clone();
    if !job.retry_after.is_empty()
        && !is_manual(&job.name)
        && retry_after_count(&job.data) >= MAX_RETRY_AFTER_HANDOUTS
    {
        tracing::info!(job_id = job.id, job_name = %job.name, "retryAfter job handed out {MAX_RETRY_AFTER_HANDOUTS} times without a report; marking it FAILED");
        job.state = JobState::Failed;
        job.lease = None;
        tx.update(&job)?;
        record::no_report(tx, &job)?;
        emit::reported(tx, EventKind::Failed, &job, job.state, "no_report", None);
        return Ok(Handed::Failed);
    }

    let parent_data = if job.is_child() {
        Some(
            tx.store()
                .peek(job.parent_id)?
                .map(|p| p.data)
                .unwrap_or_default(),
        )
    } else {
        None
    };
    let mut finished_children = Vec::new();
    let mut cancelled_children = Vec::new();
    for child in tx.children(job.id)? {
        match child.state {
            JobState::Finished => finished_children.push((child.id, child.data)),
            JobState::Cancelled => cancelled_children.push((child.id, child.data)),
            _ => {}
        }
    }

    let mut handout = HandOut {
        job: snapshot,
        parent_data,
        finished_children,
        cancelled_children,
        lease_token: String::new(),
        lease_expires: None,
        lease_term_ms: None,
        attempt: 0,
    };
    if !bytes.admit(handout.answer_bytes(), first) {
        return Ok(Handed::NoRoom);
    }
    let due = handout.job.next_run;

    let token = new_token();
    tx.store().keep_before_handout(job.id, &token)?;
    job.last_run = Some(now.whole_second());
    job.scheduled_run = Some(due);
    job.attempts += 1;
    if job.retry_after.is_empty() {
        job.state = JobState::Running;
        job.lease = Some(match cmd.lease {
            LeaseTerm::UntilReported => Lease {
                token: token.clone(),
                expires: None,
                term_ms: None,
            },
            LeaseTerm::Millis(ms) => Lease {
                token: token.clone(),
                expires: Some(now.plus_millis(ms)),
                term_ms: Some(ms),
            },
        });
    } else {
        let retry_at = RetryAfter::parse(&job.retry_after)
            .ok()
            .and_then(|ra| calendar::apply(now, &ra.modifiers))
            .unwrap_or(now.plus_millis(3_600_000));
        let repeat_at = repeat_time(&job, &job.repeat, due, now);
        let next = repeat_at.map_or(retry_at, |r| r.min(retry_at));
        job.state = JobState::Runqueued;
        job.next_run = next;
        note_retry_after_handout(&mut job, due);
        let term = (next.0 - now.0).max(1000);
        job.lease = Some(Lease {
            token: token.clone(),
            expires: Some(next),
            term_ms: Some(term),
        });
    }
    tx.update(&job)?;
    record::handed_out(tx, &job, due, cmd.worker.as_ref())?;
    emit::handed_out(tx, &job, due, cmd.worker.as_ref());
    handout.lease_expires = job.lease.as_ref().and_then(|l| l.expires);
    handout.lease_term_ms = job.lease.as_ref().and_then(|l| l.term_ms);
    handout.lease_token = token;
    handout.attempt = job.attempts;
    Ok(Handed::Out(Box::new(handout)))
}

/// Bedrock's bookkeeping in the data of a `retryAfter` job handed out while
/// due at `due`: the hand-out is counted (not for a [`is_manual`] job), and
/// with a `SCHEDULED` repeat `due` goes in `originalNextRun`, replacing what
/// an earlier hand-out put there.
fn note_retry_after_handout(job: &mut Job, due: Timestamp) {
    if !is_manual(&job.name) {
        let count = retry_after_count(&job.data) + 1;
        job.data.insert(RETRY_AFTER_COUNT.into(), json!(count));
    }
    if repeats_from_schedule(&job.repeat) {
        job.data
            .insert(ORIGINAL_NEXT_RUN.into(), json!(due.to_string()));
    }
}

/// Whether a stored repeat counts from the scheduled time.
fn repeats_from_schedule(repeat: &str) -> bool {
    Repeat::parse(repeat).is_ok_and(|r| r.base == RepeatBase::Scheduled)
}

fn retry_after_count(data: &Data) -> i64 {
    match data.get(RETRY_AFTER_COUNT) {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

/// The job as it is now (`current`), with what a hand-out changed put back
/// as it was before it (`before`): its state, due time, last run and the
/// run it was due at, attempt count, lease, and the `retryAfter`
/// bookkeeping in its data. What was changed since (an UpdateJob's data,
/// priority or repeat) stays: the job is as if that change had come before
/// the hand-out.
fn undo_handout(mut current: Job, before: &Job) -> Job {
    current.state = before.state;
    current.next_run = before.next_run;
    current.last_run = before.last_run;
    current.scheduled_run = before.scheduled_run;
    current.attempts = before.attempts;
    current.lease = before.lease.clone();
    for key in BOOKKEEPING_KEYS {
        match before.data.get(key) {
            Some(value) => current.data.insert(key.into(), value.clone()),
            None => current.data.remove(key),
        };
    }
    current
}

/// Puts back jobs whose hand-out could not be delivered (the client went
/// away) as they were before it (see [`undo_handout`]), provided nobody
/// reported on them since. The hand-out does not count.
pub fn return_undelivered(tx: &mut Tracked, handouts: &[HandOut]) -> Result<usize, JobError> {
    let mut returned = 0;
    // Locked in id order (see `requeue`).
    let mut handouts: Vec<&HandOut> = handouts.iter().collect();
    handouts.sort_by_key(|h| h.job.id);
    for handout in handouts {
        let Some(current) = tx.get(handout.job.id)? else {
            continue;
        };
        let still_ours = current
            .lease
            .as_ref()
            .is_some_and(|l| l.token == handout.lease_token);
        if still_ours {
            let job = undo_handout(current, &handout.job);
            tx.update(&job)?;
            record::undelivered(tx, job.id)?;
            emit::plain(tx, EventKind::Returned, &job);
            returned += 1;
        }
    }
    Ok(returned)
}

/// HandBackJob: the holder of a hand-out it never started puts the job back
/// as it was before that hand-out (see [`undo_handout`]: its state, due
/// time, attempts and `retryAfter` count; an UpdateJob made meanwhile
/// stays), as if it had never been handed out: no attempt, lapse or report
/// is counted, and the ledger forgets the hand-out. Its children are
/// untouched, so a resumed parent's next hand-out reports them again.
pub fn hand_back(tx: &mut Tracked, id: JobId, token: &str) -> Result<(), JobError> {
    let job = tx.existing(id)?;
    check_lease(&job, Some(token))?;
    if !job.state.is_held() {
        return Err(JobError::NotHeldForHandBack);
    }
    let before = tx
        .store()
        .take_before_handout(id, token)?
        .ok_or(JobError::HandOutNotKept(id))?;
    let job = undo_handout(job, &before);
    tx.update(&job)?;
    emit::plain(tx, EventKind::Returned, &job);
    record::undelivered(tx, id)
}

/// Refuses a report whose token is not the job's current lease.
fn check_lease(job: &Job, token: Option<&str>) -> Result<(), JobError> {
    match token {
        Some(token) if job.lease.as_ref().is_none_or(|l| l.token != token) => {
            Err(JobError::LeaseLost(job.id))
        }
        _ => Ok(()),
    }
}

/// The next run from a repeat description, or `None` when it does not
/// repeat or SQLite finds no such time.
fn repeat_time(job: &Job, repeat: &str, scheduled: Timestamp, now: Timestamp) -> Option<Timestamp> {
    if repeat.is_empty() {
        return None;
    }
    let parsed = match Repeat::parse(repeat) {
        Ok(parsed) => parsed,
        Err(_) => {
            tracing::warn!(
                job_id = job.id,
                repeat,
                "stored repeat does not parse; not repeating"
            );
            return None;
        }
    };
    let next = calendar::next_run(&parsed, scheduled, job.last_run, now);
    if next.is_none() {
        tracing::warn!(
            job_id = job.id,
            repeat,
            "repeat gives no valid time; not repeating"
        );
    }
    next
}

/// The report a worker makes on a held job.
pub enum Report<'a> {
    /// FinishJob.
    Finish(&'a FinishJob),
    /// RetryJob.
    Retry(&'a RetryJob),
}

/// FinishJob and RetryJob, which Bedrock implements as one command.
pub fn finish_or_retry(tx: &mut Tracked, report: Report<'_>) -> Result<(), JobError> {
    let now = tx.now;
    let (id, data, lease) = match &report {
        Report::Finish(f) => (f.id, &f.data, f.lease.as_deref()),
        Report::Retry(r) => (r.id, &r.data, r.lease.as_deref()),
    };
    let (outcome, run) = match report {
        Report::Finish(f) => ("finished", f.run.as_ref()),
        Report::Retry(r) => ("retried", r.run.as_ref()),
    };
    let mut job = tx.existing(id)?;
    check_lease(&job, lease)?;
    if !job.state.is_held() {
        return Err(JobError::NotHeldForFinish);
    }
    // What the ledger records of this report, however it leaves the job.
    let by_holder = lease.is_some();
    let kind = match report {
        Report::Finish(_) => EventKind::Finished,
        Report::Retry(_) => EventKind::Retried,
    };
    // Handed back for want of its worker, the job did not run: that
    // hand-out counts no attempt.
    let no_worker = matches!(report, Report::Retry(_)) && is_no_worker_hand_back(data.as_ref());
    if no_worker {
        job.attempts = job.attempts.saturating_sub(1).max(0);
    }
    let record_report = |tx: &mut Tracked, job: &Job, leaves: Leaves| {
        let (kind, state) = match leaves {
            Leaves::Stays if job.state == JobState::Paused => (EventKind::Paused, job.state),
            Leaves::Stays => (kind, job.state),
            Leaves::Finished => (kind, JobState::Finished),
            Leaves::Failed => (EventKind::Failed, JobState::Failed),
        };
        emit::reported(tx, kind, job, state, outcome, run);
        if no_worker && leaves == Leaves::Stays {
            return record::handed_back(tx, job, data.as_ref(), run, by_holder);
        }
        record::reported(tx, job, outcome, data.as_ref(), run, leaves, by_holder)
    };
    if job.is_child() {
        let parent_state = tx.get(job.parent_id)?.map(|p| p.state);
        if parent_state != Some(JobState::Paused) {
            return Err(JobError::ParentNotPaused);
        }
    }

    // Children that ended were reported to this run; they go now. Children
    // still PAUSED were created by this run and will be released below.
    let children = tx.children(id)?;
    for child in &children {
        if matches!(child.state, JobState::Finished | JobState::Cancelled) {
            tx.delete(child.id)?;
            emit::deleted(tx, child);
        }
    }

    // A retryAfter job's schedule anchor is the server's: it outlives new
    // data (the next hand-out replaces it).
    let original_next_run = if job.retry_after.is_empty() {
        None
    } else {
        job.data.get(ORIGINAL_NEXT_RUN).cloned()
    };
    let mut repeat = job.repeat.clone();
    if let Some(data) = data {
        if matches!(data.get("delete"), Some(Value::Bool(true)))
            || data.get("delete") == Some(&json!("true"))
        {
            repeat.clear();
        }
        job.data = data.clone();
    }
    job.data.remove(RETRY_AFTER_COUNT);
    if let Some(original) = &original_next_run {
        job.data.insert(ORIGINAL_NEXT_RUN.into(), original.clone());
    }

    let pending_children: Vec<&Job> = children
        .iter()
        .filter(|c| PENDING_CHILD.contains(&c.state))
        .collect();
    if matches!(report, Report::Finish(_)) && !pending_children.is_empty() {
        job.state = JobState::Paused;
        job.next_run = job.last_run.unwrap_or(now);
        job.lease = None;
        tx.update(&job)?;
        for child in pending_children {
            if child.state == JobState::Paused {
                let mut child = child.clone();
                child.state = JobState::Queued;
                tx.update(&child)?;
                emit::plain(tx, EventKind::Resumed, &child);
            }
        }
        return record_report(tx, &job, Leaves::Stays);
    }

    let mut ignore_repeat = false;
    if let Report::Retry(retry) = &report {
        if let Some(name) = &retry.name {
            check_name(name)?;
            job.name = name.clone();
        }
        if let Some(priority) = retry.priority {
            job.priority = priority;
        }
        ignore_repeat = retry.ignore_repeat;
    }

    let next = if !repeat.is_empty() && !ignore_repeat {
        let scheduled = scheduled_base(&job, &repeat, original_next_run.as_ref());
        repeat_time(&job, &repeat, scheduled, now)
    } else {
        None
    };
    let next_occurrence = next.is_some();
    let next = match (&report, next) {
        (_, Some(next)) => Some(next),
        (Report::Retry(retry), None) => Some(retry_time(retry, now)?),
        (Report::Finish(_), None) => None,
    };

    job.lease = None;
    if let Some(next) = next {
        if next_occurrence {
            // A repeating job's next run is a new occurrence (finished, or
            // retried at its repeat time: a run given up on): its attempts
            // and lapses count afresh.
            job.attempts = 0;
            job.lapses = 0;
        }
        job.state = JobState::Queued;
        job.next_run = next;
        tx.update(&job)?;
        return record_report(tx, &job, Leaves::Stays);
    }

    if job.is_child() {
        job.state = JobState::Finished;
        tx.update(&job)?;
        record_report(tx, &job, Leaves::Finished)?;
        resume_parent_if_done(tx, job.parent_id, &PENDING_CHILD)?;
        return Ok(());
    }
    if !tx.children(id)?.is_empty() {
        return Err(JobError::OutstandingChildren);
    }
    record_report(tx, &job, Leaves::Finished)?;
    tx.delete(id)
}

/// What a report's repeat counts from: the run's due time, which for a
/// `retryAfter` job with a `SCHEDULED` repeat is the one its latest
/// hand-out kept (`original_next_run`), since the hand-out moved `nextRun`.
fn scheduled_base(job: &Job, repeat: &str, original_next_run: Option<&Value>) -> Timestamp {
    if job.retry_after.is_empty() || !repeats_from_schedule(repeat) {
        return job.next_run;
    }
    original_next_run
        .and_then(Value::as_str)
        .and_then(Timestamp::parse)
        .or(job.scheduled_run)
        .unwrap_or(job.next_run)
}

/// When a RetryJob that does not follow a repeat runs next: its `nextRun`,
/// else `delay` seconds from now (whole seconds, as Bedrock's `+N SECONDS`).
fn retry_time(retry: &RetryJob, now: Timestamp) -> Result<Timestamp, JobError> {
    if let Some(at) = retry.next_run {
        return Ok(at);
    }
    if retry.delay_secs < 0 {
        return Err(JobError::NegativeDelay);
    }
    if retry.delay_secs > MAX_RETRY_DELAY_SECS {
        return Err(JobError::Malformed("delay"));
    }
    let at = now
        .whole_second()
        .plus_millis(retry.delay_secs.saturating_mul(1000));
    // Beyond that, no time can be written (it came out as the year
    // -262143, as if long due).
    if at > Timestamp::LATEST {
        return Err(JobError::Malformed("delay"));
    }
    Ok(at)
}

/// Queues a paused parent once none of its children is in `pending` states.
fn resume_parent_if_done(
    tx: &mut Tracked,
    parent_id: JobId,
    pending: &[JobState],
) -> Result<(), JobError> {
    let still_pending = tx
        .children(parent_id)?
        .iter()
        .any(|c| pending.contains(&c.state));
    if still_pending {
        return Ok(());
    }
    if let Some(mut parent) = tx.get(parent_id)?
        && parent.state == JobState::Paused
    {
        parent.state = JobState::Queued;
        tx.update(&parent)?;
        emit::plain(tx, EventKind::Resumed, &parent);
    }
    Ok(())
}

/// FailJob.
pub fn fail(tx: &mut Tracked, cmd: &FailJob) -> Result<(), JobError> {
    let mut job = tx.existing(cmd.id)?;
    check_lease(&job, cmd.lease.as_deref())?;
    if !job.state.is_held() {
        return Err(JobError::NotHeldForFail);
    }
    if let Some(data) = &cmd.data {
        job.data = data.clone();
    }
    job.state = JobState::Failed;
    job.lease = None;
    tx.update(&job)?;
    emit::reported(
        tx,
        EventKind::Failed,
        &job,
        job.state,
        "failed",
        cmd.run.as_ref(),
    );
    record::reported(
        tx,
        &job,
        "failed",
        cmd.data.as_ref(),
        cmd.run.as_ref(),
        Leaves::Failed,
        cmd.lease.is_some(),
    )
}

/// UpdateJob: new data, and optionally a new repeat, priority or next run.
/// Refused whole when it would make a held RUNQUEUED job due earlier.
pub fn update(tx: &mut Tracked, cmd: &UpdateJob) -> Result<(), JobError> {
    let now = tx.now;
    let mut job = tx.existing(cmd.id)?;
    check_lease(&job, cmd.lease.as_deref())?;
    let held_until = job.next_run;
    // Progress from a holder replaces the data, but the hand-out count and
    // the schedule's anchor of a held retryAfter job are the server's
    // bookkeeping, not the holder's.
    let kept: Vec<(&str, Value)> = BOOKKEEPING_KEYS
        .iter()
        .filter_map(|&key| Some((key, job.data.get(key)?.clone())))
        .collect();
    job.data = cmd.data.clone();
    if job.state.is_held() {
        for (key, value) in kept {
            job.data.entry(key).or_insert(value);
        }
    }
    if let Some(priority) = cmd.priority {
        job.priority = priority;
    }
    if let Some(next_run) = cmd.next_run {
        job.next_run = next_run;
    } else if let Some(repeat) = &cmd.repeat
        && let Some(next) = calendar::next_run(repeat, job.next_run, job.last_run, now)
    {
        job.next_run = next;
    }
    // A RUNQUEUED job is handed out again once due: while its holder has
    // it, its nextRun may only move later.
    if job.state == JobState::Runqueued && job.is_held_at(now) && job.next_run < held_until {
        return Err(JobError::NextRunHeld(job.id));
    }
    if cmd.clear_repeat {
        job.repeat.clear();
    } else if let Some(repeat) = &cmd.repeat {
        job.repeat = repeat.text.clone();
    }
    tx.update(&job)?;
    emit::plain(tx, EventKind::Progress, &job);
    Ok(())
}

/// DeleteJob. Children that ended go with their parent.
pub fn delete(tx: &mut Tracked, id: JobId) -> Result<(), JobError> {
    let job = tx.existing(id)?;
    match job.state {
        JobState::Running => return Err(JobError::DeleteRunning),
        JobState::Paused => return Err(JobError::DeletePaused),
        _ => {}
    }
    for child in tx.children(id)? {
        tx.delete(child.id)?;
        tx.store().ledger().clear_failure(child.id)?;
        emit::deleted(tx, &child);
    }
    tx.delete(id)?;
    emit::deleted(tx, &job);
    tx.store().ledger().clear_failure(id)?;
    // A RUNQUEUED job deleted while handed out: its attempt ends here.
    record::deleted(tx, id)?;
    // A paused parent whose last pending child is deleted runs again.
    if job.is_child() {
        resume_parent_if_done(tx, job.parent_id, &PENDING_CHILD)?;
    }
    Ok(())
}

/// CancelJob: a child that has not run (or failed) is cancelled; when no
/// sibling is left to run, the parent is queued again.
pub fn cancel(tx: &mut Tracked, id: JobId) -> Result<(), JobError> {
    let mut job = tx.existing(id)?;
    if !tx.children(id)?.is_empty() {
        return Err(JobError::CancelParent);
    }
    if !job.is_child() {
        return Err(JobError::CancelOrphan);
    }
    if matches!(
        job.state,
        JobState::Finished | JobState::Running | JobState::Paused
    ) {
        tracing::info!(job_id = id, state = %job.state, "CancelJob on a job that cannot be cancelled in its state; nothing to do");
        return Ok(());
    }
    job.state = JobState::Cancelled;
    job.lease = None;
    tx.update(&job)?;
    emit::plain(tx, EventKind::Cancelled, &job);
    resume_parent_if_done(
        tx,
        job.parent_id,
        &[JobState::Queued, JobState::Runqueued, JobState::Running],
    )
}

/// RequeueJobs: the jobs go back to QUEUED, due at their creation time.
/// Refused whole, naming them, when any of them is held (see
/// [`Job::is_held_at`]): queued again, it would run twice at once.
pub fn requeue(tx: &mut Tracked, cmd: &RequeueJobs) -> Result<usize, JobError> {
    if let Some(name) = &cmd.name {
        check_name(name)?;
    }
    // Locked in id order, whatever order the client gave: two requests
    // naming the same jobs through two servers must not wait on each other.
    let mut ids = cmd.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let mut jobs = Vec::with_capacity(ids.len());
    for id in ids {
        jobs.extend(tx.get(id)?);
    }
    let now = tx.now;
    let held: Vec<JobId> = jobs
        .iter()
        .filter(|job| job.is_held_at(now))
        .map(|job| job.id)
        .collect();
    if !held.is_empty() {
        return Err(JobError::RequeueHeld(held));
    }
    let mut requeued = 0;
    for mut job in jobs {
        let id = job.id;
        // A job waiting for its dependencies keeps waiting, due at its
        // creation time once they finish.
        if job.state != JobState::Depends {
            job.state = JobState::Queued;
        }
        job.next_run = job.created;
        job.lease = None;
        // Queued again as new, as a failure group's retry does: a job that
        // used up its attempts, lapses or unreported hand-outs would
        // otherwise fail again at its next hand-out, without a full try.
        job.attempts = 0;
        job.lapses = 0;
        job.data.remove(RETRY_AFTER_COUNT);
        if let Some(name) = &cmd.name {
            job.name = name.clone();
        }
        tx.update(&job)?;
        tx.store().ledger().clear_failure(id)?;
        emit::plain(tx, EventKind::Requeued, &job);
        requeued += 1;
    }
    Ok(requeued)
}

/// Renews the lease of a held job; returns when it now lapses (`None` for a
/// lease held until reported).
pub fn heartbeat(
    tx: &mut Tracked,
    id: JobId,
    token: &str,
    default_term_ms: i64,
) -> Result<Option<Timestamp>, JobError> {
    let now = tx.now;
    let mut job = tx.existing(id)?;
    let lease = match &job.lease {
        Some(lease) if lease.token == token && job.state.is_held() => lease.clone(),
        _ => return Err(JobError::LeaseLost(id)),
    };
    if lease.expires.is_none() {
        return Ok(None);
    }
    let term = lease.term_ms.unwrap_or(default_term_ms);
    let expires = now.plus_millis(term);
    if job.state == JobState::Runqueued {
        job.next_run = expires;
    }
    job.lease = Some(Lease {
        expires: Some(expires),
        ..lease
    });
    tx.update(&job)?;
    record::heartbeat(tx, id)?;
    Ok(Some(expires))
}

/// Gives every running job's lease at least one more term from now (at
/// start-up, so that downtime does not lapse leases). Returns how many.
pub fn extend_running_leases(tx: &mut Tracked) -> Result<usize, JobError> {
    let now = tx.now;
    let mut extended = 0;
    for mut job in tx.store().expired_leases(Timestamp(i64::MAX), usize::MAX)? {
        let Some(lease) = job.lease.as_mut() else {
            continue;
        };
        let (Some(expires), Some(term)) = (lease.expires, lease.term_ms) else {
            continue;
        };
        let renewed = now.plus_millis(term);
        if renewed > expires {
            lease.expires = Some(renewed);
            tx.update(&job)?;
            extended += 1;
        }
    }
    Ok(extended)
}

/// Puts back running jobs whose lease lapsed; a job that lapsed
/// `max_lapses` times is FAILED instead. Returns the ids put back and failed.
pub fn expire_leases(
    tx: &mut Tracked,
    max_lapses: i64,
) -> Result<(Vec<JobId>, Vec<JobId>), JobError> {
    let now = tx.now;
    let expired = tx.store().expired_leases(now, 1000)?;
    lapse_all(tx, expired, max_lapses, "lease lapsed")
}

/// Puts back running jobs handed out without a lease (to plain Bedrock
/// clients) at or before `handed_out_by`, counting a lapse as a lapsed lease
/// does, so that `max_lapses` still fails a job that kills its workers.
/// Returns the ids put back and failed.
pub fn requeue_unleased(
    tx: &mut Tracked,
    handed_out_by: Timestamp,
    max_lapses: i64,
) -> Result<(Vec<JobId>, Vec<JobId>), JobError> {
    let stale = tx.store().unleased_running(handed_out_by, 1000)?;
    lapse_all(
        tx,
        stale,
        max_lapses,
        "held without a lease for longer than --requeue-unleased-after",
    )
}

/// Counts a lapse on each job and queues it again now, or FAILs it at
/// `max_lapses`; `why` goes in the log line of each.
fn lapse_all(
    tx: &mut Tracked,
    jobs: Vec<Job>,
    max_lapses: i64,
    why: &str,
) -> Result<(Vec<JobId>, Vec<JobId>), JobError> {
    let now = tx.now;
    let (mut requeued, mut failed) = (Vec::new(), Vec::new());
    for mut job in jobs {
        job.lapses += 1;
        job.lease = None;
        if job.lapses >= max_lapses {
            job.state = JobState::Failed;
            tracing::warn!(job_id = job.id, job_name = %job.name, lapses = job.lapses, "{why}; lapsed too many times, job FAILED");
            failed.push(job.id);
        } else {
            job.state = JobState::Queued;
            job.next_run = now;
            tracing::warn!(job_id = job.id, job_name = %job.name, lapses = job.lapses, "{why}; job queued again");
            requeued.push(job.id);
        }
        tx.update(&job)?;
        record::lapsed(tx, &job, job.state == JobState::Failed)?;
        emit::lapsed(tx, &job);
    }
    Ok((requeued, failed))
}

/// Queues again up to `count` FAILED jobs of a failure group, earliest
/// failure first, as new: due now, with their attempts and lapses counted
/// afresh. Returns their ids. A job found no longer FAILED once locked
/// (another server sharing the store retried or deleted it meanwhile) is
/// left as it is.
pub fn retry_failed(tx: &mut Tracked, group: &str, count: usize) -> Result<Vec<JobId>, JobError> {
    let now = tx.now;
    let mut ids = tx.store().ledger().failed_in_group(group, count)?;
    // Locked in id order, as every server does.
    ids.sort_unstable();
    let mut retried = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(mut job) = tx.get(id)?.filter(|j| j.state == JobState::Failed) else {
            continue;
        };
        job.state = JobState::Queued;
        job.next_run = now;
        job.attempts = 0;
        job.lapses = 0;
        job.lease = None;
        job.data.remove(RETRY_AFTER_COUNT);
        tx.update(&job)?;
        tx.store().ledger().clear_failure(id)?;
        emit::plain(tx, EventKind::Requeued, &job);
        retried.push(id);
    }
    Ok(retried)
}

/// Deletes up to `count` FAILED jobs of a failure group, earliest failure
/// first (their archive entries stay until purged). Returns their ids. A
/// job found no longer FAILED once locked is left as it is.
pub fn delete_failed(tx: &mut Tracked, group: &str, count: usize) -> Result<Vec<JobId>, JobError> {
    let mut ids = tx.store().ledger().failed_in_group(group, count)?;
    ids.sort_unstable();
    let mut deleted = Vec::with_capacity(ids.len());
    for id in ids {
        if tx.get(id)?.is_some_and(|j| j.state == JobState::Failed) {
            delete(tx, id)?;
            deleted.push(id);
        }
    }
    Ok(deleted)
}
