//! Hand-outs within the server's byte budget. The jobs a GetJobs or a
//! dequeue hands out are drawn on the budget, in order, before their answer
//! is built (see [`AnswerShare`]); those it has no room for are put back as
//! they were (no attempt counted) before the answer goes, so that the next
//! claim hands them out. The claim itself already stops at
//! [`crate::protocol::MAX_PAGE_BYTES`] (see `rules::get_jobs`): the budget
//! cuts an answer only while other clients hold most of it.

use tokio::sync::oneshot;

use super::Queue;
use crate::protocol::JobError;
use crate::protocol::view::HandOut;
use crate::server::budget::AnswerShare;

impl Queue {
    /// The first of `handouts` that `share` could draw on the budget for;
    /// the others are put back before this returns. Fails with
    /// [`JobError::ServerBusy`] when not even the first fits (all are put
    /// back).
    pub async fn within_budget(
        &self,
        handouts: Vec<HandOut>,
        share: &AnswerShare,
    ) -> Result<Vec<HandOut>, JobError> {
        let fits = handouts
            .iter()
            .take_while(|handout| share.draw(handout.answer_bytes()))
            .count();
        if fits == handouts.len() {
            return Ok(handouts);
        }
        let mut kept = Undelivered {
            handouts,
            queue: self.clone(),
        };
        let rest = kept.handouts.split_off(fits);
        tracing::info!(
            handed_out = fits,
            put_back = rest.len(),
            "the byte budget (--http-body-budget) holds only part of a hand-out; the rest stays queued"
        );
        // In a task of its own, so that a caller that goes away meanwhile
        // strands nothing (what it kept is put back too, by `kept`).
        let (done, put_back) = oneshot::channel();
        let queue = self.clone();
        self.inner.tasks.spawn(async move {
            if let Err(error) = queue.return_undelivered(rest).await {
                tracing::error!(%error, "could not put back jobs the byte budget had no room for; a leased one returns when its lease lapses");
            }
            let _ = done.send(());
        });
        let _ = put_back.await;
        let kept = std::mem::take(&mut kept.handouts);
        if kept.is_empty() {
            return Err(JobError::ServerBusy);
        }
        Ok(kept)
    }
}

/// Hand-outs on their way to their requester: put back if dropped first.
struct Undelivered {
    handouts: Vec<HandOut>,
    queue: Queue,
}

impl Drop for Undelivered {
    fn drop(&mut self) {
        self.queue.put_back(std::mem::take(&mut self.handouts));
    }
}
