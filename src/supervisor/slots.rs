//! Worker slots: how many jobs hold a place under `--max-workers` now, and
//! a wake-up for the fetch loop when one frees. A job holds its slot from
//! its hand-out until its worker, its cgroups, its scratch directory and its
//! uid are gone; its report is delivered after that, outside the slot, so
//! that no slot sits idle while the server commits a report. How many
//! reports may be on their way at once is bounded by the fetch loop (see
//! [`Slots::busy`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The slots of one pool.
#[derive(Debug, Default)]
pub struct Slots {
    taken: AtomicUsize,
    freed: Notify,
}

/// One job's place, given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Slots {
    /// Takes a slot for a job about to start.
    pub fn take(self: &Arc<Self>) -> Slot {
        self.taken.fetch_add(1, Ordering::SeqCst);
        Slot(Arc::clone(self))
    }

    /// How many slots are taken.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    /// How busy the pool counts as for the gate: the slots taken, or more
    /// when over `max_workers` jobs are still delivering their reports
    /// (`tasks` counts jobs until reported), so that at most `max_workers`
    /// reports are on their way beside `max_workers` workers.
    pub fn busy(&self, tasks: usize, max_workers: usize) -> usize {
        self.taken().max(tasks.saturating_sub(max_workers))
    }

    /// Resolves once a slot was given back since the last call (a slot
    /// given back while nobody waited is remembered once).
    pub async fn freed(&self) {
        self.freed.notified().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::SeqCst);
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slot_counts_until_dropped_and_its_return_wakes_the_waiter() {
        let slots = Arc::new(Slots::default());
        let first = slots.take();
        let second = slots.take();
        assert_eq!(slots.taken(), 2);
        drop(first);
        assert_eq!(slots.taken(), 1);
        // Given back before anyone waited: remembered.
        tokio::time::timeout(Duration::from_secs(5), slots.freed())
            .await
            .expect("the return was remembered");
        let waiter = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.freed().await })
        };
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was woken")
            .unwrap();
        assert_eq!(slots.taken(), 0);
    }

    #[test]
    fn reports_on_their_way_count_once_past_max_workers() {
        let slots = Arc::new(Slots::default());
        let _held: Vec<Slot> = (0..3).map(|_| slots.take()).collect();
        // 3 workers, 5 jobs not yet reported, max 4: the workers count.
        assert_eq!(slots.busy(5, 4), 3);
        // 3 workers and 6 reports on their way: 9 jobs, past twice the cap,
        // count as a full pool.
        assert_eq!(slots.busy(9, 4), 5);
    }
}
