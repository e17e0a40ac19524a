//! The server's one byte budget: what both ports hold for their clients
//! beyond each connection's free share (request bodies, listing pages, the
//! jobs a GetJobs or dequeue hands out), counted in KiB so that it fits a
//! semaphore's permits. A request draws on it without waiting and holds
//! what it drew until its answer has been sent; a draw that does not fit
//! is refused, and the request is answered "server busy".

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server's one byte budget (see the module's documentation).
pub type ByteBudget = Arc<Semaphore>;

/// A [`ByteBudget`] of `bytes`.
pub fn byte_budget(bytes: usize) -> ByteBudget {
    Arc::new(Semaphore::new(bytes / 1024))
}

/// How many times its jobs' bytes an answer holds at its peak: the rows
/// read, their JSON values and the encoded answer.
pub const ANSWER_COPIES: usize = 3;

/// The most one job's answer draws: a page's reserve, which the budget
/// always holds (a server refuses to start with less). A job bigger than a
/// page (its data with its children's) is handed out alone, as the first of
/// its answer; drawing all it costs would never fit, and it would be put
/// back at every claim, holding up every job behind it.
pub const ANSWER_MOST: usize = ANSWER_COPIES * crate::protocol::MAX_PAGE_BYTES;

/// The share of the budget one request holds, in KiB; given back when the
/// request ends (when the last clone is dropped).
#[derive(Clone, Default)]
pub struct Holding(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl Holding {
    /// KiB held.
    pub fn kib(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Takes `kib` more from `budget` without waiting; false if it has not
    /// that much left.
    pub fn take(&self, budget: &ByteBudget, kib: usize) -> bool {
        if kib == 0 {
            return true;
        }
        let Ok(count) = u32::try_from(kib) else {
            return false;
        };
        let Ok(permit) = Arc::clone(budget).try_acquire_many_owned(count) else {
            return false;
        };
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_mut() {
            Some(existing) => existing.merge(permit),
            None => *held = Some(permit),
        }
        true
    }
}

/// What a request may draw on the budget for its answer, held with the
/// rest of the request's share until the answer has been sent.
#[derive(Clone)]
pub struct AnswerShare {
    budget: ByteBudget,
    holding: Holding,
}

impl AnswerShare {
    /// Draws on `budget` into `holding`.
    pub fn new(budget: ByteBudget, holding: Holding) -> Self {
        AnswerShare { budget, holding }
    }

    /// Draws what an answer holding `bytes` of jobs costs
    /// ([`ANSWER_COPIES`] times them, at most [`ANSWER_MOST`]); false,
    /// drawing nothing, if the budget has not that much left.
    pub fn draw(&self, bytes: usize) -> bool {
        let kib = bytes
            .saturating_mul(ANSWER_COPIES)
            .min(ANSWER_MOST)
            .div_ceil(1024);
        self.holding.take(&self.budget, kib)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_draws_until_the_budget_is_spent_and_gives_back_when_dropped() {
        let budget = byte_budget(3 * 1024 * 1024);
        let share = AnswerShare::new(Arc::clone(&budget), Holding::default());
        assert!(share.draw(512 * 1024), "1.5 MiB of 3");
        assert!(share.draw(512 * 1024), "3 MiB of 3");
        assert!(!share.draw(1), "nothing is left");
        assert_eq!(budget.available_permits(), 0);
        drop(share);
        assert_eq!(budget.available_permits(), 3 * 1024, "all given back");
    }

    #[test]
    fn a_job_bigger_than_the_budget_draws_a_pages_reserve_and_fits_an_idle_budget() {
        let budget = byte_budget(ANSWER_MOST);
        let share = AnswerShare::new(Arc::clone(&budget), Holding::default());
        assert!(share.draw(ANSWER_MOST), "three times the budget, capped");
        assert_eq!(budget.available_permits(), 0);
        assert!(!share.draw(1), "nothing is left beside it");
    }
}
