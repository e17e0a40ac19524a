//! Serving sleeping GetJob requests inside the commit that made their jobs
//! due. A request that found nothing sleeps, offering to be served
//! ([`super::waiters::Ticket::sleep_servable`]); a later write that makes a
//! job due (a create, a retry that comes due at once, a put-back) claims for
//! it in its own transaction and answers it once that transaction is
//! durable. The job's dispatch then waits for one durable commit, not two,
//! and the writer runs one claim fewer.
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

use tokio::runtime::Handle;

use super::Queue;
use super::rules;
use super::tracked::Tracked;
use super::waiters::{Servable, Waiters};
use crate::protocol::JobError;
use crate::protocol::view::HandOut;

/// Requests served in a transaction, with what each was handed, to answer
/// once it ends.
#[derive(Debug, Default)]
pub struct Served(Vec<(Servable, Vec<HandOut>)>);

/// Serves the sleeping requests that the jobs this transaction made due
/// now would wake, claiming for each in the transaction. The jobs handed
/// out are no longer woken for after the commit.
pub fn serve_sleepers(tx: &mut Tracked, waiters: &Waiters) -> Result<Served, JobError> {
    let due = tx.due_now();
    if due.is_empty() {
        return Ok(Served::default());
    }
    let mut served = Served::default();
    for servable in waiters.take_servable(&due) {
        let handouts = rules::get_jobs(tx, &servable.request)?;
        let ids: Vec<_> = handouts.iter().map(|handout| handout.job.id).collect();
        tx.forget_ready(&ids);
        served.0.push((servable, handouts));
    }
    Ok(served)
}

impl Served {
    /// Answers the served requests once their transaction ended: with what
    /// they were handed if it committed (a request that went away has it
    /// put back), or, if it did not, by dropping their answers, which tells
    /// each to claim for itself.
    pub fn answer(self, committed: bool, queue: &Queue, runtime: &Handle) {
        for (servable, handouts) in self.0 {
            if !committed {
                continue;
            }
            if let Err(Ok(unread)) = servable.answer.send(Ok(handouts)) {
                let _entered = runtime.enter();
                queue.put_back(unread);
            }
        }
    }
}
