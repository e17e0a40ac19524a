//! Held GetJob requests. A waiter registers what it wants, then sleeps on its
//! own `Notify` until a job it could take becomes due. Jobs are assigned to
//! waiters first come, first served, so one new job wakes one waiter, not
//! all of them. An idle waiter costs a list entry and nothing else.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::protocol::{NamePattern, Priority};

/// The most different job names one wake-up assigns one by one.
pub const MAX_DISTINCT_NAMES: usize = 256;

/// The jobs a waiter was woken for, shared between it and the list.
type WokenFor = Arc<Mutex<Option<Vec<(String, Priority)>>>>;

#[derive(Debug)]
struct Entry {
    id: u64,
    pattern: Arc<NamePattern>,
    priority: Option<Priority>,
    want: usize,
    notify: Arc<Notify>,
    /// Names this waiter was woken for, to pass on if it leaves unserved.
    woken_for: WokenFor,
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
    pub fn wake(&self, jobs: &[(String, Priority)]) {
        if jobs.is_empty() {
            return;
        }
        let mut distinct: Vec<((&str, Priority), usize)> = Vec::new();
        for (name, priority) in jobs {
            match distinct
                .iter_mut()
                .find(|((n, p), _)| *n == name.as_str() && p == priority)
            {
                Some((_, count)) => *count += 1,
                None => {
                    if distinct.len() == MAX_DISTINCT_NAMES {
                        self.wake_all();
                        return;
                    }
                    distinct.push(((name.as_str(), *priority), 1));
                }
            }
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut room: Vec<usize> = list.entries.iter().map(|e| e.want).collect();
        let mut total_room: usize = room.iter().sum();
        let mut assigned: Vec<Vec<(String, Priority)>> = vec![Vec::new(); room.len()];
        for ((name, priority), mut count) in distinct {
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
                assigned[index].extend(std::iter::repeat_n((name.to_string(), priority), take));
            }
        }
        for (index, names) in assigned.into_iter().enumerate().rev() {
            if names.is_empty() {
                continue;
            }
            let entry = list.entries.remove(index);
            *entry.woken_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(names);
            entry.notify.notify_one();
        }
    }

    /// Wakes every waiter (at shutdown, or when too many jobs became due at
    /// once to name them).
    pub fn wake_all(&self) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        for entry in list.entries.drain(..) {
            *entry.woken_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
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
    /// it was woken for: the holder is about to look for those jobs itself.
    pub fn disarm(mut self) -> Vec<(String, Priority)> {
        self.armed = false;
        self.waiters.remove(self.id);
        self.woken_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
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
        if let Some(names) = woken_for {
            self.waiters.wake(&names);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        waiters.wake(&[("SendEmail".into(), Priority::DEFAULT)]);
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
        waiters.wake(&[("SendEmail".into(), Priority::DEFAULT)]);
        drop(first);
        assert!(woken(&second).await);
    }

    #[tokio::test]
    async fn priority_filters_are_respected() {
        let waiters = Waiters::default();
        let high = waiters.register(glob("*"), Some(Priority::new(1000).unwrap()), 1);
        waiters.wake(&[("a".into(), Priority::DEFAULT)]);
        assert!(!woken(&high).await);
        waiters.wake(&[("a".into(), Priority::new(1000).unwrap())]);
        assert!(woken(&high).await);
    }

    #[tokio::test]
    async fn a_waiter_wanting_several_takes_several() {
        let waiters = Waiters::default();
        let many = waiters.register(glob("*"), None, 3);
        let next = waiters.register(glob("*"), None, 1);
        let jobs: Vec<_> = (0..3)
            .map(|i| (format!("j{i}"), Priority::DEFAULT))
            .collect();
        waiters.wake(&jobs);
        assert!(woken(&many).await);
        assert!(!woken(&next).await);
        assert_eq!(many.disarm().len(), 3);
        assert!(next.disarm().is_empty());
        assert!(waiters.is_empty());
    }

    #[tokio::test]
    async fn many_different_names_wake_everyone_at_once() {
        let waiters = Waiters::default();
        let tickets: Vec<_> = (0..10)
            .map(|i| waiters.register(glob(&format!("only-{i}")), None, 1))
            .collect();
        let jobs: Vec<_> = (0..=MAX_DISTINCT_NAMES)
            .map(|i| (format!("name-{i}"), Priority::DEFAULT))
            .collect();
        waiters.wake(&jobs);
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
        let jobs: Vec<_> = (0..3)
            .map(|_| ("same".to_string(), Priority::DEFAULT))
            .collect();
        waiters.wake(&jobs);
        assert!(woken(&a).await && woken(&b).await && !woken(&c).await);
        assert_eq!(a.disarm().len(), 2);
        assert_eq!(b.disarm().len(), 1);
    }
}
