//! Held GetJob requests. A waiter registers what it wants, then sleeps on its
//! own `Notify` until a job it could take becomes due. Jobs are assigned to
//! waiters first come, first served, so one new job wakes one waiter, not
//! all of them. An idle waiter costs a list entry and nothing else.
//!
//! # Why no wake-up is lost
//!
//! A wake-up names the job it is for, by id ([`DueJob`]), and is given to one
//! waiter, which then owes it: the waiter either takes that very job or
//! passes the wake-up on. A spurious wake-up costs one claim that finds
//! nothing; a lost one leaves a job QUEUED while a matching waiter sleeps, so
//! every doubt is settled by passing on. The request's side of this contract
//! is [`Owed`] and `Queue::get_jobs`: it registers, then claims (looks at the
//! store in a write transaction), and the store runs transactions one after
//! another, so a claim sees every job whose commit came before it.
//!
//! Every interleaving of a job's commit (which calls [`Waiters::wake`] after
//! it is durable) with a waiter W that matches it:
//!
//! - **W not registered yet.** W registers, then claims: the claim comes
//!   after the commit and sees the job (or someone else took it).
//! - **Woken before its claim** (W asleep). W claims after the commit. If it
//!   finds nothing, every job it was woken for was gone at that moment
//!   (taken, cancelled, deleted), so it owes nothing and sleeps again; this
//!   is also what ends a chain of spurious wake-ups. If it finds jobs, it
//!   passes on every woken-for job whose id is not among them.
//! - **Woken during or after its claim** (the claim read the store before the
//!   commit, and W is still first in line). W is still registered, so the
//!   wake-up lands in its ticket. If the claim found nothing, the ticket's
//!   `Notify` already holds a permit: W claims again at once, after the
//!   commit. If it found jobs, W takes the ticket's wake-ups when it
//!   unregisters ([`Ticket::disarm`]) and passes on each one whose job it did
//!   not take, whether or not its batch was full.
//! - **Woken after it unregistered.** It is no longer in the list, so the
//!   wake-up goes to the next matching waiter.
//! - **Dropped** (its client went away, its wait ended, an error, shutdown).
//!   The ticket passes on everything it was woken for ([`Ticket`]'s `Drop`),
//!   and the request passes on what it still owed ([`Owed`]'s `Drop`). Jobs
//!   a dropped request had already claimed are put back by the queue, and
//!   that commit wakes waiters of its own.
//! - **Priority filters and patterns.** A wake-up goes only to a waiter that
//!   matches the job's name and priority; a passed-on one is assigned afresh
//!   by the same rule, so it reaches only waiters that could take it.
//! - **Batches.** A waiter wanting `n` jobs is assigned up to `n` wake-ups.
//!   It may take better jobs instead of those (higher priority first); the
//!   ones it did not take are passed on, by id.
//! - **Served in the commit** (W asleep, offering to be served: see
//!   [`Ticket::sleep_servable`]). The commit that makes the job due takes
//!   W out of the list before it commits ([`Waiters::take_servable`]) and
//!   claims for it in its own transaction, so W is answered once that
//!   transaction is durable, without a claim of its own. Its wake-up is
//!   settled there: the jobs the claim did not take are woken for as any
//!   other, after the commit. Taken out, W can be neither woken nor served
//!   twice; if the transaction does not commit, W is told so and claims
//!   again; if W went away, what it was handed is put back. Requests that
//!   are claiming (not asleep) are passed over, so a job may go to a
//!   request that came after one of them: order among waiters is first come,
//!   first served only among those asleep.
//! - **Freed throttle slots.** A slot freed in a throttle is no job to
//!   name: the jobs it held back may be of any name. The throttles' module
//!   picks, among the listed waiters, those that may take one of them
//!   ([`Waiters::listed`]) and gives each a [`FreedSlot`] by its entry
//!   ([`Waiters::wake_for_slots`]); a waiter no longer listed has its slot
//!   looked at again. The waiter owes it as a job's wake-up: a claim that
//!   finds nothing settles it (it can take none of those jobs), as does one
//!   that takes as many jobs under the throttle as the slot was for; any
//!   other end passes it on, which here means the throttle is looked at
//!   again from the store ([`Waiters::look_again`]), and the waiters that
//!   may take its jobs then are woken.
//! - **Many names at once** (past [`MAX_DISTINCT_NAMES`]), and shutdown:
//!   every waiter is woken with no job named ([`Waiters::wake_all`]) and
//!   looks for itself. Each woken waiter claims after the commit, and any
//!   waiter still asleep registered after the wake-up and so claimed after
//!   the commit too; nobody sleeps beside a job it could take, and there is
//!   nothing to pass on.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use crate::protocol::pattern::glob_matches;
use crate::protocol::view::HandOut;
use crate::protocol::{GetJobs, JobError, JobId, NamePattern, Priority};

/// The most different job names one wake-up assigns one by one.
pub const MAX_DISTINCT_NAMES: usize = 256;

/// A job that just became due: what a wake-up is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueJob {
    /// The job.
    pub id: JobId,
    /// Its name, matched against waiters' patterns.
    pub name: String,
    /// Its priority, matched against waiters' priority filters.
    pub priority: Priority,
}

/// A slot freed in a throttle, given to a waiter that may take one of the
/// jobs the throttle held back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreedSlot {
    /// The throttle's GLOB.
    pub glob: String,
    /// How many of its held-back jobs the waiter was woken to take.
    pub count: usize,
}

impl FreedSlot {
    /// Whether a claim that handed out `handouts` settled this wake-up: it
    /// took as many jobs under the throttle as the slot was for.
    pub fn settled_by(&self, handouts: &[HandOut]) -> bool {
        let taken = handouts
            .iter()
            .filter(|handout| glob_matches(&self.glob, &handout.job.name))
            .count();
        taken >= self.count
    }
}

/// What a waiter was woken for: jobs that became due, slots freed in
/// throttles; both empty when woken to look for itself.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Woken {
    /// Jobs that became due.
    pub jobs: Vec<DueJob>,
    /// Slots freed in throttles.
    pub slots: Vec<FreedSlot>,
}

/// What a waiter was woken for, shared between it and the list: `None`
/// while asleep.
type WokenFor = Arc<Mutex<Option<Woken>>>;

/// A listed waiter as the throttles' module weighs it: who it is and what
/// it asks for.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its entry in the list.
    pub id: u64,
    /// The names it takes.
    pub pattern: Arc<NamePattern>,
    /// The priority it takes, when it names one.
    pub priority: Option<Priority>,
    /// How many jobs it takes.
    pub want: usize,
}

/// Throttles whose freed slots are to be looked at again, from the store,
/// by the queue's task for it (see `throttles`).
#[derive(Debug, Default)]
struct LookAgain {
    globs: Mutex<std::collections::BTreeSet<String>>,
    notify: Notify,
}

/// A sleeping request that a commit may serve in its own transaction: what
/// it asks for, and where its answer goes. Dropped unanswered (the commit
/// failed), it tells the request to claim for itself.
#[derive(Debug)]
pub struct Servable {
    /// The request.
    pub request: Arc<GetJobs>,
    /// Its answer, sent once the serving transaction is durable; if the
    /// request went away, the jobs come back in the error.
    pub answer: oneshot::Sender<Result<Vec<HandOut>, JobError>>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    pattern: Arc<NamePattern>,
    priority: Option<Priority>,
    want: usize,
    notify: Arc<Notify>,
    /// Jobs this waiter was woken for, to pass on if it leaves unserved.
    woken_for: WokenFor,
    /// Set while the request sleeps and may be served by a commit.
    servable: Option<Servable>,
}

#[derive(Debug, Default)]
struct List {
    next_id: u64,
    entries: Vec<Entry>,
}

/// The held GetJob requests of one queue.
#[derive(Debug, Default, Clone)]
pub struct Waiters {
    list: Arc<Mutex<List>>,
    look_again: Arc<LookAgain>,
}

impl Waiters {
    /// Registers a waiter for up to `want` jobs matching `pattern` (and
    /// `priority`, when given). Register before looking for jobs, so that a
    /// job made due in between is not missed.
    pub fn register(
        &self,
        pattern: Arc<NamePattern>,
        priority: Option<Priority>,
        want: usize,
    ) -> Ticket {
        let notify = Arc::new(Notify::new());
        let woken_for = Arc::new(Mutex::new(None));
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.next_id += 1;
        let id = list.next_id;
        list.entries.push(Entry {
            id,
            pattern,
            priority,
            want: want.max(1),
            notify: Arc::clone(&notify),
            woken_for: Arc::clone(&woken_for),
            servable: None,
        });
        Ticket {
            id,
            waiters: self.clone(),
            notify,
            woken_for,
            armed: true,
        }
    }

    /// How many requests are waiting.
    pub fn len(&self) -> usize {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    /// Whether no request is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes waiters for jobs that just became due: each job goes to the
    /// oldest matching waiter that still has room. Woken waiters leave the
    /// list; they register again if they find nothing. Past
    /// [`MAX_DISTINCT_NAMES`] different names at once, every waiter is woken
    /// instead, which bounds the work done under the list's lock.
    pub fn wake(&self, jobs: Vec<DueJob>) {
        if jobs.is_empty() {
            return;
        }
        // Jobs grouped by name and priority, since waiters match on those.
        let mut groups: Vec<Vec<DueJob>> = Vec::new();
        for job in jobs {
            match groups
                .iter_mut()
                .find(|group| group[0].name == job.name && group[0].priority == job.priority)
            {
                Some(group) => group.push(job),
                None => {
                    if groups.len() == MAX_DISTINCT_NAMES {
                        self.wake_all();
                        return;
                    }
                    groups.push(vec![job]);
                }
            }
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut room: Vec<usize> = list.entries.iter().map(|e| e.want).collect();
        let mut total_room: usize = room.iter().sum();
        let mut assigned: Vec<Vec<DueJob>> = (0..room.len()).map(|_| Vec::new()).collect();
        for mut group in groups {
            for (index, entry) in list.entries.iter().enumerate() {
                if group.is_empty() || total_room == 0 {
                    break;
                }
                let (name, priority) = (&group[0].name, group[0].priority);
                if room[index] == 0
                    || entry.priority.is_some_and(|p| p != priority)
                    || !entry.pattern.matches(name)
                {
                    continue;
                }
                let take = room[index].min(group.len());
                room[index] -= take;
                total_room -= take;
                assigned[index].extend(group.drain(..take));
            }
        }
        for (index, jobs) in assigned.into_iter().enumerate().rev() {
            if jobs.is_empty() {
                continue;
            }
            let entry = list.entries.remove(index);
            *entry.woken_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(Woken {
                jobs,
                slots: Vec::new(),
            });
            entry.notify.notify_one();
        }
    }

    /// The waiters listed now, oldest first.
    pub fn listed(&self) -> Vec<Listed> {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.entries
            .iter()
            .map(|entry| Listed {
                id: entry.id,
                pattern: Arc::clone(&entry.pattern),
                priority: entry.priority,
                want: entry.want,
            })
            .collect()
    }

    /// Wakes these waiters (by their [`Listed::id`]) for slots freed in
    /// throttles. A waiter no longer listed (woken meanwhile, or gone) has
    /// its slot looked at again instead.
    pub fn wake_for_slots(&self, slots: Vec<(u64, FreedSlot)>) {
        if slots.is_empty() {
            return;
        }
        let mut again = Vec::new();
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut woken: Vec<(Entry, Vec<FreedSlot>)> = Vec::new();
        for (id, slot) in slots {
            if let Some((_, held)) = woken.iter_mut().find(|(entry, _)| entry.id == id) {
                held.push(slot);
            } else if let Some(index) = list.entries.iter().position(|entry| entry.id == id) {
                woken.push((list.entries.remove(index), vec![slot]));
            } else {
                again.push(slot.glob);
            }
        }
        // Told under the list's lock, as `wake` does: a ticket that
        // unregisters meanwhile finds what it was woken for.
        for (entry, slots) in woken {
            *entry.woken_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(Woken {
                jobs: Vec::new(),
                slots,
            });
            entry.notify.notify_one();
        }
        drop(list);
        self.look_again(again);
    }

    /// Takes out of the list the sleeping requests among `slots` that
    /// offered to be served, with the slots they were picked for, and
    /// leaves the rest in `slots`: the caller claims for each in its
    /// transaction (see [`Waiters::take_servable`]).
    pub fn take_servable_for_slots(
        &self,
        slots: &mut Vec<(u64, FreedSlot)>,
    ) -> Vec<(Servable, Vec<FreedSlot>)> {
        if slots.is_empty() {
            return Vec::new();
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut served: Vec<(Servable, Vec<FreedSlot>, u64)> = Vec::new();
        let mut left = Vec::new();
        for (id, slot) in std::mem::take(slots) {
            if let Some((_, held, _)) = served.iter_mut().find(|(_, _, served)| *served == id) {
                held.push(slot);
                continue;
            }
            let index = list.entries.iter().position(|entry| {
                entry.id == id
                    && entry
                        .servable
                        .as_ref()
                        .is_some_and(|servable| !servable.answer.is_closed())
            });
            match index.and_then(|index| list.entries.remove(index).servable) {
                Some(servable) => served.push((servable, vec![slot], id)),
                None => left.push((id, slot)),
            }
        }
        *slots = left;
        served
            .into_iter()
            .map(|(servable, slots, _)| (servable, slots))
            .collect()
    }

    /// Asks for the freed slots of these throttles to be looked at again
    /// from the store (by the queue's task for it).
    pub fn look_again(&self, globs: Vec<String>) {
        if globs.is_empty() {
            return;
        }
        self.look_again
            .globs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(globs);
        self.look_again.notify.notify_one();
    }

    /// The throttles asked to be looked at again since the last call, once
    /// there are some.
    pub async fn to_look_at_again(&self) -> Vec<String> {
        loop {
            let globs = std::mem::take(
                &mut *self
                    .look_again
                    .globs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            if !globs.is_empty() {
                return globs.into_iter().collect();
            }
            self.look_again.notify.notified().await;
        }
    }

    /// Takes out of the list the sleeping requests that offered to be
    /// served and that jobs just made due would go to: each job goes to the
    /// oldest such request that matches it and has room (as [`Waiters::wake`]
    /// assigns them). The caller claims for each in the transaction that
    /// made the jobs due, and answers it once that transaction ends; the
    /// jobs none of them took are woken for after the commit.
    pub fn take_servable(&self, jobs: &[DueJob]) -> Vec<Servable> {
        // Jobs counted by name and priority, since requests match on those;
        // past [`MAX_DISTINCT_NAMES`] of them nobody is served, and the
        // wake-up after the commit (which then wakes everyone) does the rest.
        let mut groups: Vec<(&str, Priority, usize)> = Vec::new();
        for job in jobs {
            let known = groups
                .iter()
                .position(|(name, priority, _)| *name == job.name && *priority == job.priority);
            match known {
                Some(index) => groups[index].2 += 1,
                None if groups.len() == MAX_DISTINCT_NAMES => return Vec::new(),
                None => groups.push((&job.name, job.priority, 1)),
            }
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        // A request that stopped waiting (its answer dropped) is left to
        // unregister itself.
        let mut room: Vec<usize> = list
            .entries
            .iter()
            .map(|e| match &e.servable {
                Some(servable) if !servable.answer.is_closed() => e.want,
                _ => 0,
            })
            .collect();
        let mut total_room: usize = room.iter().sum();
        let mut chosen = vec![false; room.len()];
        for (name, priority, mut count) in groups {
            for (index, entry) in list.entries.iter().enumerate() {
                if count == 0 || total_room == 0 {
                    break;
                }
                if room[index] == 0
                    || entry.priority.is_some_and(|p| p != priority)
                    || !entry.pattern.matches(name)
                {
                    continue;
                }
                let take = room[index].min(count);
                room[index] -= take;
                total_room -= take;
                count -= take;
                chosen[index] = true;
            }
            if total_room == 0 {
                break;
            }
        }
        let mut served = Vec::new();
        for index in (0..chosen.len()).rev() {
            if chosen[index] {
                let entry = list.entries.remove(index);
                served.extend(entry.servable);
            }
        }
        served.reverse();
        served
    }

    /// Whether any sleeping request offers to be served: a write checks
    /// this before it lists the jobs it made due.
    pub fn any_servable(&self) -> bool {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .iter()
            .any(|entry| entry.servable.is_some())
    }

    /// Wakes every waiter (at shutdown, or when too many jobs became due at
    /// once to name them).
    pub fn wake_all(&self) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        for entry in list.entries.drain(..) {
            *entry.woken_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(Woken::default());
            entry.notify.notify_one();
        }
    }

    fn remove(&self, id: u64) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.entries.retain(|entry| entry.id != id);
    }
}

/// One registration. Dropping it unregisters; if it had been woken and was
/// dropped before acting on it (its client went away), the wake-up passes to
/// the next waiter, so no job is left sitting while others wait.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    waiters: Waiters,
    notify: Arc<Notify>,
    woken_for: WokenFor,
    armed: bool,
}

impl Ticket {
    /// Resolves when a job this waiter could take became due.
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// Ends the registration without passing anything on, and returns what
    /// it was woken for: the holder now owes those wake-ups (see [`Owed`]).
    pub fn disarm(mut self) -> Woken {
        self.armed = false;
        self.waiters.remove(self.id);
        self.woken_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// Offers this sleeping request to be served by the next commit that
    /// makes a job it could take due (see [`Waiters::take_servable`]); the
    /// answer comes on the receiver. `None` if it was already woken (its
    /// `notified` is then ready) or is no longer listed.
    pub fn sleep_servable(
        &self,
        request: Arc<GetJobs>,
    ) -> Option<oneshot::Receiver<Result<Vec<HandOut>, JobError>>> {
        let mut list = self.waiters.list.lock().unwrap_or_else(|e| e.into_inner());
        let entry = list.entries.iter_mut().find(|entry| entry.id == self.id)?;
        let (answer, answered) = oneshot::channel();
        entry.servable = Some(Servable { request, answer });
        Some(answered)
    }

    /// Whether this waiter was woken for some job.
    pub fn was_woken(&self) -> bool {
        self.woken_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.waiters.remove(self.id);
        let woken_for = self
            .woken_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(woken) = woken_for {
            self.waiters.pass_on(woken);
        }
    }
}

impl Waiters {
    /// Passes on wake-ups nobody acted on: each job to the next waiter
    /// that could take it, each freed slot to be looked at again.
    fn pass_on(&self, woken: Woken) {
        self.wake(woken.jobs);
        self.look_again(woken.slots.into_iter().map(|slot| slot.glob).collect());
    }
}

/// The wake-ups a request holds and has not yet settled: jobs it was woken
/// for, and slots freed in throttles. It settles them by taking those jobs
/// (as many jobs under the throttle as a slot was for), by a claim that
/// finds nothing (which proves the jobs are gone, and that it can take none
/// of those a throttle held back), or by passing them on; whatever is left
/// when it is dropped is passed on, so a request that ends in any way (an
/// answer, an error, its client gone) loses no wake-up.
#[derive(Debug)]
pub struct Owed {
    waiters: Waiters,
    woken: Woken,
}

impl Owed {
    /// Nothing owed yet, to `waiters`.
    pub fn new(waiters: Waiters) -> Self {
        Owed {
            waiters,
            woken: Woken::default(),
        }
    }

    /// Adds the wake-ups a ticket held.
    pub fn add(&mut self, woken: Woken) {
        self.woken.jobs.extend(woken.jobs);
        self.woken.slots.extend(woken.slots);
    }

    /// Settles everything: a claim made after every owed wake-up found no
    /// job, so the jobs they were for are gone, and none held back by the
    /// throttles whose slots were freed is one it can take.
    pub fn settle_all(&mut self) {
        self.woken = Woken::default();
    }

    /// Settles the wake-ups for jobs handed out and the freed slots they
    /// filled, and passes on the rest now.
    pub fn pass_on_all_but(mut self, handouts: &[HandOut]) {
        self.woken
            .jobs
            .retain(|job| !handouts.iter().any(|handout| handout.job.id == job.id));
        self.woken.slots.retain(|slot| !slot.settled_by(handouts));
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.waiters.pass_on(std::mem::take(&mut self.woken));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn due(id: JobId, name: &str, priority: Priority) -> DueJob {
        DueJob {
            id,
            name: name.into(),
            priority,
        }
    }

    fn jobs(jobs: Vec<DueJob>) -> Woken {
        Woken {
            jobs,
            slots: Vec::new(),
        }
    }

    fn slot(glob: &str, count: usize) -> FreedSlot {
        FreedSlot {
            glob: glob.into(),
            count,
        }
    }

    /// The throttles asked to be looked at again, if any (within 50 ms).
    async fn looked_at_again(waiters: &Waiters) -> Vec<String> {
        tokio::time::timeout(Duration::from_millis(50), waiters.to_look_at_again())
            .await
            .unwrap_or_default()
    }

    fn glob(p: &str) -> Arc<NamePattern> {
        Arc::new(NamePattern::Glob(p.into()))
    }

    async fn woken(ticket: &Ticket) -> bool {
        tokio::time::timeout(Duration::from_millis(50), ticket.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn one_job_wakes_one_matching_waiter_in_order() {
        let waiters = Waiters::default();
        let other = waiters.register(glob("Other*"), None, 1);
        let first = waiters.register(glob("*"), None, 1);
        let second = waiters.register(glob("*"), None, 1);
        waiters.wake(vec![due(1, "SendEmail", Priority::DEFAULT)]);
        assert!(!woken(&other).await);
        assert!(woken(&first).await);
        assert!(!woken(&second).await);
        assert_eq!(waiters.len(), 2);
    }

    #[tokio::test]
    async fn a_dropped_woken_waiter_passes_the_job_on() {
        let waiters = Waiters::default();
        let first = waiters.register(glob("*"), None, 1);
        let second = waiters.register(glob("*"), None, 1);
        waiters.wake(vec![due(1, "SendEmail", Priority::DEFAULT)]);
        drop(first);
        assert!(woken(&second).await);
    }

    #[tokio::test]
    async fn priority_filters_are_respected() {
        let waiters = Waiters::default();
        let high = waiters.register(glob("*"), Some(Priority::new(1000).unwrap()), 1);
        waiters.wake(vec![due(1, "a", Priority::DEFAULT)]);
        assert!(!woken(&high).await);
        waiters.wake(vec![due(2, "a", Priority::new(1000).unwrap())]);
        assert!(woken(&high).await);
    }

    #[tokio::test]
    async fn a_waiter_wanting_several_takes_several() {
        let waiters = Waiters::default();
        let many = waiters.register(glob("*"), None, 3);
        let next = waiters.register(glob("*"), None, 1);
        let jobs: Vec<_> = (0..3)
            .map(|i| due(i, &format!("j{i}"), Priority::DEFAULT))
            .collect();
        waiters.wake(jobs);
        assert!(woken(&many).await);
        assert!(!woken(&next).await);
        assert_eq!(many.disarm().jobs.len(), 3);
        assert!(next.disarm().jobs.is_empty());
        assert!(waiters.is_empty());
    }

    #[tokio::test]
    async fn many_different_names_wake_everyone_at_once() {
        let waiters = Waiters::default();
        let tickets: Vec<_> = (0..10)
            .map(|i| waiters.register(glob(&format!("only-{i}")), None, 1))
            .collect();
        let jobs: Vec<_> = (0..=MAX_DISTINCT_NAMES)
            .map(|i| due(i as JobId, &format!("name-{i}"), Priority::DEFAULT))
            .collect();
        waiters.wake(jobs);
        for ticket in &tickets {
            assert!(
                woken(ticket).await,
                "past the limit every waiter looks for itself"
            );
        }
        assert!(waiters.is_empty());
    }

    #[tokio::test]
    async fn a_batch_of_one_name_fills_waiters_in_order() {
        let waiters = Waiters::default();
        let a = waiters.register(glob("*"), None, 2);
        let b = waiters.register(glob("*"), None, 2);
        let c = waiters.register(glob("*"), None, 2);
        let jobs: Vec<_> = (0..3).map(|i| due(i, "same", Priority::DEFAULT)).collect();
        waiters.wake(jobs);
        assert!(woken(&a).await && woken(&b).await && !woken(&c).await);
        assert_eq!(a.disarm().jobs.len(), 2);
        assert_eq!(b.disarm().jobs.len(), 1);
    }

    #[tokio::test]
    async fn a_wake_up_names_its_job_and_a_drop_passes_on_exactly_those() {
        let waiters = Waiters::default();
        let first = waiters.register(glob("*"), None, 2);
        let second = waiters.register(glob("*"), None, 2);
        waiters.wake(vec![
            due(7, "same", Priority::DEFAULT),
            due(8, "same", Priority::DEFAULT),
        ]);
        drop(first);
        assert!(woken(&second).await);
        let ids: Vec<JobId> = second.disarm().jobs.iter().map(|job| job.id).collect();
        assert_eq!(ids, vec![7, 8]);
    }

    fn request(p: &str, priority: Option<Priority>, want: usize) -> Arc<GetJobs> {
        Arc::new(GetJobs {
            pattern: NamePattern::Glob(p.into()),
            num_results: want,
            priority,
            lease: crate::protocol::LeaseTerm::Millis(60_000),
            worker: None,
        })
    }

    #[tokio::test]
    async fn a_commit_serves_the_oldest_matching_sleeper_and_skips_the_rest() {
        let waiters = Waiters::default();
        // Not asleep yet (claiming): a commit wakes it, never serves it.
        let claiming = waiters.register(glob("*"), None, 1);
        let other = waiters.register(glob("Other*"), None, 1);
        let high = waiters.register(glob("*"), Some(Priority::new(1000).unwrap()), 1);
        let first = waiters.register(glob("*"), None, 1);
        let second = waiters.register(glob("*"), None, 1);
        let mut answers = Vec::new();
        for (ticket, p, priority) in [
            (&other, "Other*", None),
            (&high, "*", Some(Priority::new(1000).unwrap())),
            (&first, "*", None),
            (&second, "*", None),
        ] {
            answers.push(ticket.sleep_servable(request(p, priority, 1)).unwrap());
        }
        let served = waiters.take_servable(&[due(1, "SendEmail", Priority::DEFAULT)]);
        assert_eq!(served.len(), 1);
        assert_eq!(
            served[0].request.pattern,
            NamePattern::Glob("*".into()),
            "the first servable sleeper matching name and priority"
        );
        // Taken out of the list: neither woken nor served again.
        assert_eq!(waiters.len(), 4);
        drop(served);
        let mut answers = answers.into_iter();
        let (other_answer, high_answer, mut first_answer) = (
            answers.next().unwrap(),
            answers.next().unwrap(),
            answers.next().unwrap(),
        );
        assert!(
            first_answer.try_recv().is_err(),
            "dropped unanswered: the sleeper claims for itself"
        );
        drop((other_answer, high_answer));
        assert!(!woken(&claiming).await);
        waiters.wake(vec![due(2, "SendEmail", Priority::DEFAULT)]);
        assert!(woken(&claiming).await, "a request not asleep is woken");
        assert!(!woken(&second).await);
    }

    #[tokio::test]
    async fn a_woken_sleeper_cannot_be_served_and_its_offer_ends() {
        let waiters = Waiters::default();
        let ticket = waiters.register(glob("*"), None, 2);
        let mut answer = ticket.sleep_servable(request("*", None, 2)).unwrap();
        waiters.wake(vec![due(1, "a", Priority::DEFAULT)]);
        assert!(woken(&ticket).await);
        assert!(
            waiters
                .take_servable(&[due(2, "a", Priority::DEFAULT)])
                .is_empty(),
            "a woken request is out of the list"
        );
        assert!(matches!(
            answer.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        ));
        assert!(ticket.sleep_servable(request("*", None, 2)).is_none());
        assert_eq!(ticket.disarm().jobs, vec![due(1, "a", Priority::DEFAULT)]);
    }

    #[tokio::test]
    async fn owed_wake_ups_not_settled_are_passed_on_when_dropped() {
        let waiters = Waiters::default();
        let next = waiters.register(glob("*"), None, 1);
        let mut owed = Owed::new(waiters.clone());
        owed.add(jobs(vec![due(3, "x", Priority::DEFAULT)]));
        owed.settle_all();
        drop(owed);
        assert!(!woken(&next).await, "a settled wake-up is not passed on");
        let mut owed = Owed::new(waiters.clone());
        owed.add(jobs(vec![due(4, "x", Priority::DEFAULT)]));
        owed.pass_on_all_but(&[]);
        assert!(woken(&next).await);
        assert_eq!(next.disarm().jobs, vec![due(4, "x", Priority::DEFAULT)]);
    }

    #[tokio::test]
    async fn a_freed_slot_wakes_the_waiter_it_names_and_one_gone_is_looked_at_again() {
        let waiters = Waiters::default();
        let first = waiters.register(glob("t/*"), None, 1);
        let picked = waiters.register(glob("t/low"), None, 1);
        let id = waiters.listed()[1].id;
        assert_eq!(waiters.listed()[1].pattern, glob("t/low"));
        waiters.wake_for_slots(vec![(id, slot("t/*", 1)), (id + 7, slot("gone/*", 1))]);
        assert!(!woken(&first).await, "only the waiter picked is woken");
        assert!(woken(&picked).await);
        assert_eq!(looked_at_again(&waiters).await, ["gone/*"]);
        assert_eq!(picked.disarm().slots, [slot("t/*", 1)]);
        assert!(first.disarm().slots.is_empty());
    }

    fn handout(id: JobId, name: &str) -> HandOut {
        HandOut {
            job: crate::protocol::Job {
                id,
                name: name.into(),
                state: crate::protocol::JobState::Queued,
                data: Default::default(),
                priority: Priority::DEFAULT,
                created: crate::protocol::Timestamp(0),
                next_run: crate::protocol::Timestamp(0),
                last_run: None,
                repeat: String::new(),
                retry_after: String::new(),
                parent_id: 0,
                scheduled_run: None,
                lease: None,
                attempts: 0,
                lapses: 0,
            },
            parent_data: None,
            finished_children: Vec::new(),
            cancelled_children: Vec::new(),
            lease_token: String::new(),
            lease_expires: None,
            lease_term_ms: None,
            attempt: 1,
        }
    }

    #[tokio::test]
    async fn a_freed_slot_is_settled_by_nothing_found_or_by_filling_it_and_else_passed_on() {
        let waiters = Waiters::default();
        let freed = |count| Woken {
            jobs: Vec::new(),
            slots: vec![slot("t/*", count)],
        };
        let mut owed = Owed::new(waiters.clone());
        owed.add(freed(2));
        owed.settle_all();
        drop(owed);
        assert!(looked_at_again(&waiters).await.is_empty(), "found nothing");
        let mut owed = Owed::new(waiters.clone());
        owed.add(freed(2));
        owed.pass_on_all_but(&[handout(1, "t/a"), handout(2, "t/b")]);
        assert!(looked_at_again(&waiters).await.is_empty(), "filled");
        let mut owed = Owed::new(waiters.clone());
        owed.add(freed(2));
        owed.pass_on_all_but(&[handout(1, "t/a"), handout(2, "other")]);
        assert_eq!(looked_at_again(&waiters).await, ["t/*"], "one job short");
        let ticket = waiters.register(glob("t/*"), None, 1);
        let id = waiters.listed()[0].id;
        waiters.wake_for_slots(vec![(id, slot("t/*", 1))]);
        drop(ticket);
        assert_eq!(
            looked_at_again(&waiters).await,
            ["t/*"],
            "dropped before acting on it"
        );
    }
}
