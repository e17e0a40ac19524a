//! Worker slots: how many jobs hold a place under `--max-workers` now, the
//! jobs held ahead for the next free place (`--fetch-ahead`), and a wake-up
//! for the fetch loop when a place is given back. A job holds its slot from
//! its hand-out (or, held ahead, from the moment a slot passes to it) until
//! its worker, its cgroups, its scratch directory and its uid are gone; its
//! report is delivered after that, outside the slot, so that no slot sits
//! idle while the server commits a report. How many reports may be on
//! their way at once is bounded by the fetch loop (see [`Slots::busy`]).
//!
//! A slot given back while jobs are held passes straight to the one held
//! longest, so that it never counts as free: the fetch loop cannot fetch a
//! job for it beside the held one, and `--max-workers` bounds the workers
//! running whatever is held.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

/// The slots of one pool.
#[derive(Debug, Default)]
pub struct Slots {
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    taken: usize,
    /// `--max-workers`: a slot given back while more are taken (after a
    /// reload lowered it) is not passed on.
    max: usize,
    /// The jobs held ahead, the longest held first.
    held: VecDeque<(u64, oneshot::Sender<Slot>)>,
    next_hold: u64,
    /// A held job went back unstarted: no job is fetched ahead until a
    /// slot is given back.
    ahead_paused: bool,
}

/// One job's place, given back when dropped.
#[derive(Debug)]
pub struct Slot(Option<Arc<Slots>>);

/// A job held ahead, waiting for a slot; dropped, it waits no more (a slot
/// passed to it meanwhile goes on to the next).
#[derive(Debug)]
pub struct Hold {
    slots: Arc<Slots>,
    id: u64,
    passed: oneshot::Receiver<Slot>,
}

impl Slots {
    /// The slots of a pool of `max` workers.
    pub fn new(max: usize) -> Arc<Self> {
        let slots = Arc::new(Slots::default());
        slots.lock().max = max;
        slots
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot for a job about to start (the gate found room).
    pub fn take(self: &Arc<Self>) -> Slot {
        self.lock().taken += 1;
        Slot(Some(Arc::clone(self)))
    }

    /// A slot now if one is free and nobody is held before this job, else
    /// a place in the queue of held jobs.
    pub fn take_or_hold(self: &Arc<Self>) -> Result<Slot, Hold> {
        let mut state = self.lock();
        if state.taken < state.max && state.held.is_empty() {
            state.taken += 1;
            return Ok(Slot(Some(Arc::clone(self))));
        }
        let (sender, passed) = oneshot::channel();
        let id = state.next_hold;
        state.next_hold += 1;
        state.held.push_back((id, sender));
        Err(Hold {
            slots: Arc::clone(self),
            id,
            passed,
        })
    }

    /// How many slots are taken.
    pub fn taken(&self) -> usize {
        self.lock().taken
    }

    /// How many jobs are held ahead, waiting for a slot.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// How many more jobs may be fetched ahead now, of `fetch_ahead`: none
    /// while a slot is free or more are taken than `--max-workers` (after a
    /// reload lowered it), and none after a held job went back unstarted
    /// until a slot is free again.
    pub fn ahead_room(&self, fetch_ahead: usize) -> usize {
        let state = self.lock();
        if state.ahead_paused || state.taken != state.max {
            return 0;
        }
        fetch_ahead.saturating_sub(state.held.len())
    }

    /// A held job went back unstarted: fetch none ahead until a slot is
    /// free, so that a pool of long jobs does not fetch and hand back
    /// the same jobs over and over.
    pub fn pause_ahead(&self) {
        self.lock().ahead_paused = true;
    }

    /// Sets `--max-workers` (after a reload); held jobs get the slots it
    /// adds.
    pub fn set_max(self: &Arc<Self>, max: usize) {
        self.lock().max = max;
        loop {
            // Taken under the lock, sent after it: a slot whose job stopped
            // waiting is given back, which takes the lock again.
            let next = {
                let mut state = self.lock();
                if state.taken >= state.max {
                    return;
                }
                let Some((_, sender)) = state.held.pop_front() else {
                    return;
                };
                state.taken += 1;
                sender
            };
            // A job that stopped waiting returns its slot when dropped.
            let _ = next.send(Slot(Some(Arc::clone(self))));
        }
    }

    /// How busy the pool counts as for the gate: the slots taken, or more
    /// when over `max_workers` jobs are still delivering their reports
    /// (`tasks` counts jobs until reported, held ones among them), so that
    /// at most `max_workers` reports are on their way beside `max_workers`
    /// workers.
    pub fn busy(&self, tasks: usize, max_workers: usize) -> usize {
        let state = self.lock();
        let reporting = tasks.saturating_sub(state.held.len() + max_workers);
        state.taken.max(reporting)
    }

    /// Whether a pool found `busy` (see [`Slots::busy`]) is full of
    /// reports on their way rather than of workers: then no slot that
    /// frees brings a fetch, and reports offered to the next fetch must go
    /// by themselves (they would wait for a fetch that waits for them).
    pub fn full_of_reports(&self, busy: usize) -> bool {
        busy > self.lock().taken
    }

    /// Resolves once a slot was given back since the last call (a slot
    /// given back while nobody waited is remembered once), whether it
    /// passed to a held job or is free.
    pub async fn freed(&self) {
        self.freed.notified().await
    }

    /// A slot given back: to the job held longest, else free.
    fn give_back(self: &Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                let next = if state.taken <= state.max {
                    state.held.pop_front()
                } else {
                    None
                };
                if next.is_none() {
                    // Free: jobs may be fetched ahead again.
                    state.taken -= 1;
                    state.ahead_paused = false;
                }
                next
            };
            self.freed.notify_one();
            let Some((_, sender)) = next else {
                return;
            };
            match sender.send(Slot(Some(Arc::clone(self)))) {
                Ok(()) => return,
                // Its job stopped waiting: on to the next.
                Err(mut slot) => slot.0 = None,
            }
        }
    }
}

impl Hold {
    /// This job goes back unstarted: see [`Slots::pause_ahead`].
    pub fn pause_ahead(&self) {
        self.slots.pause_ahead();
    }

    /// Waits for a slot to pass to this job (cancel-safe: a slot passed
    /// while nobody awaits is kept for the next call).
    pub async fn slot(&mut self) -> Slot {
        match (&mut self.passed).await {
            Ok(slot) => slot,
            // The sender lives in the queue until it sends, and the queue
            // as long as this hold: never, but if so, no slot comes.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.slots.lock().held.retain(|(id, _)| *id != self.id);
        // A slot passed to it and not taken is dropped with `passed`, and
        // so given back.
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.0.take() {
            slots.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slot_counts_until_dropped_and_its_return_wakes_the_waiter() {
        let slots = Slots::new(4);
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
        let slots = Slots::new(4);
        let _held: Vec<Slot> = (0..3).map(|_| slots.take()).collect();
        // 3 workers, 5 jobs not yet reported, max 4: the workers count.
        assert_eq!(slots.busy(5, 4), 3);
        // 3 workers and 6 reports on their way: 9 jobs, past twice the cap,
        // count as a full pool.
        assert_eq!(slots.busy(9, 4), 5);
        // Then the pool is full of reports, not of workers: no fetch
        // follows a slot that frees.
        assert!(slots.full_of_reports(slots.busy(9, 4)));
        assert!(!slots.full_of_reports(slots.busy(5, 4)));
        let _fourth = slots.take();
        assert!(!slots.full_of_reports(slots.busy(8, 4)));
        assert!(slots.full_of_reports(slots.busy(9, 4)));
    }

    #[tokio::test]
    async fn a_slot_given_back_passes_to_the_job_held_longest_and_never_counts_free() {
        let slots = Slots::new(1);
        let running = slots.take_or_hold().expect("a free slot");
        let mut first = slots.take_or_hold().expect_err("held: the slot is taken");
        let mut second = slots.take_or_hold().expect_err("held behind the first");
        assert_eq!((slots.taken(), slots.held()), (1, 2));
        // Full, with two held: nothing more ahead for a fetch-ahead of 2.
        assert_eq!(slots.ahead_room(2), 0);
        assert_eq!(slots.ahead_room(3), 1);
        // Held jobs do not count as reports on their way.
        assert_eq!(slots.busy(3, 1), 1);
        drop(running);
        assert_eq!((slots.taken(), slots.held()), (1, 1));
        let passed = tokio::time::timeout(Duration::from_secs(5), first.slot())
            .await
            .expect("the longest held got the slot");
        // The second is still held: the one slot is the first's.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.slot())
                .await
                .is_err()
        );
        drop(passed);
        let last = tokio::time::timeout(Duration::from_secs(5), second.slot())
            .await
            .expect("then the second");
        assert_eq!((slots.taken(), slots.held()), (1, 0));
        drop(last);
        assert_eq!(slots.taken(), 0);
    }

    #[tokio::test]
    async fn a_hold_given_up_leaves_the_queue_and_a_slot_passed_to_it_goes_on() {
        let slots = Slots::new(1);
        let running = slots.take();
        let gone = slots.take_or_hold().expect_err("held");
        let mut next = slots.take_or_hold().expect_err("held");
        drop(gone);
        assert_eq!(slots.held(), 1);
        drop(running);
        let slot = tokio::time::timeout(Duration::from_secs(5), next.slot())
            .await
            .expect("the slot skipped the hold given up");
        // Passed to a hold that is then dropped before it looked: given back.
        let unlooked = slots.take_or_hold().expect_err("held");
        drop(slot);
        assert_eq!((slots.taken(), slots.held()), (1, 0));
        drop(unlooked);
        assert_eq!((slots.taken(), slots.held()), (0, 0));
    }

    #[test]
    fn a_hold_that_went_back_pauses_fetching_ahead_until_a_slot_is_free() {
        let slots = Slots::new(1);
        assert_eq!(slots.ahead_room(1), 0, "a free slot: nothing ahead");
        let running = slots.take();
        assert_eq!(slots.ahead_room(2), 2);
        let held = slots.take_or_hold().expect_err("full");
        slots.pause_ahead();
        assert_eq!(slots.ahead_room(2), 0);
        // Passed to the held job: not free, still paused.
        drop(running);
        assert_eq!((slots.taken(), slots.ahead_room(2)), (1, 0));
        drop(held);
        assert_eq!(
            slots.taken(),
            0,
            "the slot passed and not taken was given back"
        );
        let _again = slots.take();
        assert_eq!(slots.ahead_room(1), 1);
        // More taken than the max (a reload lowered it): nothing ahead.
        let _over = slots.take();
        assert_eq!(slots.ahead_room(1), 0);
    }

    #[tokio::test]
    async fn a_raised_max_passes_its_new_slots_to_held_jobs_and_a_lowered_one_passes_none() {
        let slots = Slots::new(2);
        let a = slots.take();
        let b = slots.take();
        let mut held = slots.take_or_hold().expect_err("full");
        slots.set_max(3);
        let c = tokio::time::timeout(Duration::from_secs(5), held.slot())
            .await
            .expect("the new slot passed");
        assert_eq!(slots.taken(), 3);
        slots.set_max(1);
        let mut waiting = slots.take_or_hold().expect_err("over the max");
        drop(a);
        drop(b);
        // 3 taken then 1 left over a max of 1: nothing passed until then.
        assert_eq!((slots.taken(), slots.held()), (1, 1));
        drop(c);
        let d = tokio::time::timeout(Duration::from_secs(5), waiting.slot())
            .await
            .expect("passed once within the max");
        assert_eq!(slots.taken(), 1);
        drop(d);
        assert_eq!(slots.taken(), 0);
    }
}
