//! Serving sleeping GetJob requests inside the commit that made their jobs
//! due. A request that found nothing sleeps, offering to be served
//! ([`super::waiters::Ticket::sleep_servable`]); a later write that makes a
//! job due (a create, a retry that comes due at once, a put-back) or frees
//! a throttle's slot it was picked for (see `throttles`) claims for it in
//! its own transaction and answers it once that transaction is durable. The
//! job's dispatch then waits for one durable commit, not two, and the
//! writer runs one claim fewer.
//!
//! What is handed out this way is delivered from the writer, right after the
//! commit; a request that went away in between has its jobs put back, as a
//! claim's would be (see `Queue::put_back`).
//!
//! Only on a store no other server shares (SQLite, whose one writer runs
//! transactions one at a time). On PostgreSQL a claim inside another write
//! would lock the throttles' and supervisors' rows after that write's own
//! rows, against claims that lock them first: a deadlock the database
//! breaks by failing one of them. Sleeping requests there are woken, and
//! claim for themselves.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Weak;

use tokio::runtime::Handle;

use super::rules;
use super::tracked::Tracked;
use super::waiters::{FreedSlot, Servable, Waiters};
use super::{Inner, Queue};
use crate::protocol::JobError;
use crate::protocol::view::HandOut;

/// Requests served in a transaction, with what each was handed, to answer
/// once it ends; and the throttles whose freed slots the served requests
/// were picked for and did not fill, to look at again once it commits.
#[derive(Debug, Default)]
pub struct Served {
    answers: Vec<(Servable, Vec<HandOut>)>,
    look_again: Vec<String>,
}

/// Serves the sleeping requests picked for the throttles' slots this
/// transaction freed, and those that the jobs it made due now would wake,
/// claiming for each in the transaction. The jobs handed out are no longer
/// woken for after the commit. Each claim is undone on its own if it fails
/// (or panics): its request then claims for itself, and the write that
/// made the jobs due goes on unharmed; only a claim that cannot be undone
/// fails the write (its transaction is broken).
///
/// Runs last in the write, after the throttles' freed slots were weighed:
/// what an undone claim leaves in the transaction's account of the slots
/// held (`throttles::Holds`) is read by nothing after it.
pub fn serve_sleepers(tx: &mut Tracked, waiters: &Waiters) -> Result<Served, JobError> {
    let mut served = Served::default();
    // Under load nobody sleeps: a create then lists nothing.
    if !waiters.any_servable() {
        return Ok(served);
    }
    let mut chosen = waiters.take_servable_for_slots(tx.slot_wake_ups());
    let due = tx.due_now();
    if !due.is_empty() {
        let for_jobs = waiters.take_servable(&due).into_iter();
        chosen.extend(for_jobs.map(|servable| (servable, Vec::new())));
    }
    for (servable, slots) in chosen {
        let Ok(mark) = tx.mark() else {
            // Dropped unanswered: it claims for itself, after this commit.
            continue;
        };
        let claimed = catch_unwind(AssertUnwindSafe(|| rules::get_jobs(tx, &servable.request)));
        match claimed {
            Ok(Ok(handouts)) if tx.keep_since_mark().is_ok() => {
                let ids: Vec<_> = handouts.iter().map(|handout| handout.job.id).collect();
                tx.forget_ready(&ids);
                served.look_again.extend(unfilled(&slots, &handouts));
                served.answers.push((servable, handouts));
            }
            outcome => {
                if let Ok(Err(error)) = &outcome {
                    tracing::warn!(%error, "could not serve a waiting GetJob in the commit that made its job due; it claims for itself");
                } else if outcome.is_err() {
                    tracing::error!(
                        "serving a waiting GetJob panicked; undone, it claims for itself"
                    );
                }
                tx.undo_since_mark(mark)?;
            }
        }
    }
    Ok(served)
}

/// The throttles of the freed slots a served claim did not fill. One that
/// found nothing settled its slots (it can take none of the jobs they held
/// back, and claims again for itself); one that took fewer jobs under a
/// throttle than its slot was for leaves it to the next waiter.
fn unfilled(slots: &[FreedSlot], handouts: &[HandOut]) -> Vec<String> {
    if handouts.is_empty() {
        return Vec::new();
    }
    slots
        .iter()
        .filter(|slot| !slot.settled_by(handouts))
        .map(|slot| slot.glob.clone())
        .collect()
}

impl Served {
    /// Answers the served requests once their transaction ended: with what
    /// they were handed if it committed (a request that went away has it
    /// put back, from the runtime), or, if it did not, by dropping their
    /// answers, which tells each to claim for itself. A committed one also
    /// has the slots its requests did not fill looked at again. Runs on the
    /// store's writer, so it holds the queue only weakly.
    pub fn answer(self, committed: bool, queue: &Weak<Inner>, runtime: &Handle) {
        if committed
            && !self.look_again.is_empty()
            && let Some(inner) = queue.upgrade()
        {
            inner.waiters.look_again(self.look_again);
        }
        for (servable, handouts) in self.answers {
            if !committed {
                continue;
            }
            if let Err(Ok(unread)) = servable.answer.send(Ok(handouts)) {
                let queue = queue.clone();
                runtime.spawn(async move {
                    if let Some(inner) = queue.upgrade() {
                        Queue { inner }.put_back(unread);
                    }
                });
            }
        }
    }
}
