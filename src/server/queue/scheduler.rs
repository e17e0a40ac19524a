//! The queue's one timer task. It sleeps until the earliest moment a job
//! becomes due or a lease lapses (as the store and later commits report it),
//! then lapses expired leases and wakes the waiters for the jobs that became
//! due since it last looked. It never polls: with nothing scheduled it sleeps
//! until a commit schedules something.
//!
//! Only this task lapses leases, so it is also where a forward step of the
//! wall clock is made up for: before lapsing any lease, it compares how far
//! the wall clock moved since its last look with how much real (monotonic)
//! time passed, and extends every running lease by the difference. A holder
//! heartbeating by monotonic time keeps its job; one that died lapses one
//! step later, as it would have without the step. (A backward step only
//! makes leases last longer, and is left alone.)

use std::time::Duration;

use std::sync::{Arc, Mutex};

use super::clock::StepWatch;
use super::tracked::Tracked;
use super::waiters::DueJob;
use super::{Queue, rules};
use crate::protocol::{JobError, JobState, Timestamp};
use crate::server::store::ListQuery;

/// The most jobs named in one wake-up; past it, every waiter is woken.
const MAX_NAMED: usize = 4096;

/// Runs until the queue shuts down.
pub(super) async fn run(queue: Queue) {
    let inner = &queue.inner;
    // Time the server was down does not count against holders: leases
    // still running get one more term from now, so a holder that kept
    // working can renew or report before its job is handed out again.
    match queue.write(rules::extend_running_leases).await {
        Ok(0) => {}
        Ok(extended) => tracing::info!(
            extended,
            "leases of jobs held before the restart extended by one term"
        ),
        Err(error) => tracing::error!(%error, "cannot extend the leases held before the restart"),
    }
    inner.recovered.send_replace(true);
    let steps = Arc::new(Mutex::new(StepWatch::new()));
    let mut last = queue.now();
    let mut next = match tick(&queue, last, &steps).await {
        Ok((upto, next)) => {
            last = upto;
            next
        }
        Err(()) => Some(queue.now().plus_millis(1000)),
    };
    loop {
        {
            let mut state = inner.timer.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pending) = state.pending.take() {
                next = Some(next.map_or(pending, |n| n.min(pending)));
            }
            state.armed = next;
        }
        let now = queue.now();
        if next.is_some_and(|at| at <= now) {
            // Disarm first: a commit during the tick may schedule something
            // the tick's own look at the store misses; its nudge must land in
            // `pending`, not be dropped as "already armed".
            inner
                .timer
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .armed = None;
            match tick(&queue, last, &steps).await {
                Ok((upto, following)) => {
                    last = upto;
                    next = following;
                }
                Err(()) => next = Some(queue.now().plus_millis(1000)),
            }
            continue;
        }
        let sleep = async {
            match next {
                // One extra millisecond: the timer wheel may round down.
                Some(at) => {
                    let mut wait = Duration::from_millis((at.0 - now.0) as u64 + 1);
                    if let Some(longest) = inner.clock.longest_sleep() {
                        wait = wait.min(longest);
                    }
                    tokio::time::sleep(wait).await
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => break,
            _ = inner.timer.notify.notified() => {}
            _ = sleep => {}
        }
    }
    tracing::debug!("queue scheduler stopped");
}

/// Lapses expired leases, wakes waiters for jobs due in `(last, now]`, and
/// finds the next moment to wake. Returns `now` and that moment.
async fn tick(
    queue: &Queue,
    last: Timestamp,
    steps: &Arc<Mutex<StepWatch>>,
) -> Result<(Timestamp, Option<Timestamp>), ()> {
    let max_lapses = queue.inner.config.max_lapses;
    let anyone_waiting = !queue.inner.waiters.is_empty();
    let scripted = queue.inner.clock.is_scripted();
    let steps = Arc::clone(steps);
    let outcome = queue
        .write(move |tx| {
            let step = steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .forward_step(tx.now);
            if step > 0 && !scripted {
                let extended = extend_leases_by(tx, step)?;
                tracing::warn!(
                    step_ms = step,
                    extended,
                    "the wall clock stepped forward; running leases extended by the step"
                );
            }
            rules::expire_leases(tx, max_lapses)?;
            let now = tx.now;
            let due = if anyone_waiting {
                tx.store().due_between(last, now, MAX_NAMED + 1)?
            } else {
                Vec::new()
            };
            let next = tx.store().next_wakeup(now)?;
            Ok((now, due, next))
        })
        .await;
    match outcome {
        Ok((now, due, next)) => {
            if due.len() > MAX_NAMED {
                queue.inner.waiters.wake_all();
            } else {
                let due = due
                    .into_iter()
                    .map(|(id, name, priority)| DueJob { id, name, priority })
                    .collect();
                queue.inner.waiters.wake(due);
            }
            Ok((now, next))
        }
        Err(error) => {
            tracing::error!(%error, "queue timer could not read the store; trying again in a second");
            Err(())
        }
    }
}

/// Moves every held job's lease expiry `step_ms` later (and, for a
/// RUNQUEUED job, whose lease lapses by becoming due, its `nextRun`).
/// Returns how many.
fn extend_leases_by(tx: &mut Tracked, step_ms: i64) -> Result<usize, JobError> {
    let mut held = tx.store().expired_leases(Timestamp(i64::MAX), usize::MAX)?;
    // RUNQUEUED jobs are few; a step is rare.
    held.extend(tx.store().list(&ListQuery {
        state: Some(JobState::Runqueued),
        limit: usize::MAX,
        ..ListQuery::default()
    })?);
    let mut extended = 0;
    for mut job in held {
        let Some(lease) = job.lease.as_mut() else {
            continue;
        };
        let Some(expires) = lease.expires else {
            continue;
        };
        let expires = expires.plus_millis(step_ms);
        lease.expires = Some(expires);
        if job.state == JobState::Runqueued {
            job.next_run = expires;
        }
        tx.update(&job)?;
        extended += 1;
    }
    Ok(extended)
}
