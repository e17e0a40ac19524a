//! The queue's one timer task. It sleeps until the earliest moment a job
//! becomes due or a lease lapses (as the store and later commits report it),
//! then lapses expired leases and wakes the waiters for the jobs that became
//! due since it last looked. It never polls: with nothing scheduled it sleeps
//! until a commit schedules something. A lapse it could not act on (on a
//! store shared with other servers, the job's row is held by another
//! transaction and skipped) is tried again a little later, not at once.
//!
//! Only this task lapses leases, but a forward step of the wall clock is
//! made up for before any write, this task's included (see `steps`).

use std::time::Duration;

use super::waiters::DueJob;
use super::{Queue, rules};
use crate::protocol::Timestamp;

/// The most jobs named in one wake-up; past it, every waiter is woken.
const MAX_NAMED: usize = 4096;

/// How soon the timer looks again at a lease that lapsed but that its look
/// could not lapse: its row is held by another transaction (another server
/// lapsing it, a report of its holder, anything that locked it) until that
/// ends, and looking again at once would only spin.
const HELD_LAPSE_RETRY_MS: i64 = 250;

/// Runs until the queue shuts down.
pub(super) async fn run(queue: Queue) {
    let inner = &queue.inner;
    // Time the server was down does not count against holders: leases
    // still running get one more term from now, so a holder that kept
    // working can renew or report before its job is handed out again.
    // On a store shared with other servers, holders renewed through them
    // while this one was down: nothing to make up for.
    let extend = if inner.store.shared() {
        Ok(0)
    } else {
        queue.write(rules::extend_running_leases).await
    };
    match extend {
        Ok(0) => {}
        Ok(extended) => tracing::info!(
            extended,
            "leases of jobs held before the restart extended by one term"
        ),
        Err(error) => tracing::error!(%error, "cannot extend the leases held before the restart"),
    }
    inner.recovered.send_replace(true);
    let mut last = queue.now();
    let mut next = match tick(&queue, last).await {
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
            match tick(&queue, last).await {
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
/// finds the next moment to wake. Returns `now` and that moment: a moment
/// already past that this look lapsed nothing for is a lapse held by
/// another transaction, looked at again [`HELD_LAPSE_RETRY_MS`] later.
async fn tick(queue: &Queue, last: Timestamp) -> Result<(Timestamp, Option<Timestamp>), ()> {
    let max_lapses = queue.inner.config.max_lapses;
    let anyone_waiting = !queue.inner.waiters.is_empty();
    let outcome = queue
        .write(move |tx| {
            let (requeued, failed) = rules::expire_leases(tx, max_lapses)?;
            let lapsed = requeued.len() + failed.len();
            let now = tx.now;
            let due = if anyone_waiting {
                tx.due_between(last, now, MAX_NAMED + 1)?
            } else {
                Vec::new()
            };
            let next = tx.store().next_wakeup(now)?;
            Ok((now, due, next, lapsed))
        })
        .await;
    match outcome {
        Ok((now, due, next, lapsed)) => {
            if due.len() > MAX_NAMED {
                queue.inner.waiters.wake_all();
            } else {
                let due = due
                    .into_iter()
                    .map(|(id, name, priority)| DueJob { id, name, priority })
                    .collect();
                queue.inner.waiters.wake(due);
            }
            let next = match next {
                Some(at) if at <= now && lapsed == 0 => Some(now.plus_millis(HELD_LAPSE_RETRY_MS)),
                next => next,
            };
            Ok((now, next))
        }
        Err(error) => {
            tracing::error!(%error, "queue timer could not read the store; trying again in a second");
            Err(())
        }
    }
}
