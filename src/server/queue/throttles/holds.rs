//! Which jobs hold a throttle's slot, and what frees one: the account one
//! write transaction keeps. Every read, write and removal of a job in the
//! transaction goes through it (`Tracked` calls it), so each path that ends
//! a hold is seen, whichever rule took it: a finish, retry or fail, a
//! rename by RetryJob or RequeueJobs, a delete, a cancel, a lapsed lease, a
//! hand-back, an undelivered hand-out put back. A hold ends under the name
//! the job held it by, which a rename changes in the same write.
//!
//! A RUNQUEUED job's hold also ends with no write at all, when it is due
//! again; the timer, which wakes waiters for it then, says so
//! ([`Holds::due_again`]).

use std::collections::HashMap;

use crate::protocol::{Job, JobId, JobState, Timestamp};

/// Whether `job` holds a slot of the throttles it matches at `now`: a
/// RUNNING job, and a RUNQUEUED one (a `retryAfter` job handed out) until
/// it is due again, which is when its holder's lease lapses. The store
/// counts the same jobs (`store::throttles::HELD`).
fn holds_slot(job: &Job, now: Timestamp) -> bool {
    match job.state {
        JobState::Running => true,
        JobState::Runqueued => job.next_run > now,
        _ => false,
    }
}

/// What one transaction ended: the holds, by name, and the throttles it
/// changed.
#[derive(Debug, Default)]
pub struct Ended {
    /// Names under which a write ended a hold.
    pub by_write: Vec<String>,
    /// Names of jobs that became due by time; those that were RUNQUEUED
    /// ended their hold.
    pub by_time: Vec<String>,
    /// Throttles raised, lowered or removed.
    pub throttles: Vec<String>,
}

impl Ended {
    /// Whether nothing ended.
    pub fn is_empty(&self) -> bool {
        self.by_write.is_empty() && self.by_time.is_empty() && self.throttles.is_empty()
    }
}

/// The holds one write transaction saw, and those it ended.
#[derive(Debug, Default)]
pub struct Holds {
    /// Jobs read or written in it: the name each holds a slot under, or
    /// `None` when it holds none.
    seen: HashMap<JobId, Option<String>>,
    ended: Ended,
}

impl Holds {
    /// A job as read.
    pub fn read(&mut self, job: &Job, now: Timestamp) {
        self.seen.insert(job.id, held_name(job, now));
    }

    /// A job as written: a hold it had ends if it holds none now or holds
    /// it under another name. A job written without being read (a lapsed
    /// lease, read by the store's own query) may have held, by its name.
    pub fn wrote(&mut self, job: &Job, now: Timestamp) {
        let holds = held_name(job, now);
        match self.seen.get(&job.id) {
            Some(Some(held)) if holds.as_deref() != Some(held.as_str()) => {
                self.ended.by_write.push(held.clone());
            }
            Some(_) => {}
            None if holds.is_none() => self.ended.by_write.push(job.name.clone()),
            None => {}
        }
        self.seen.insert(job.id, holds);
    }

    /// A job removed: a hold it had ends.
    pub fn removed(&mut self, id: JobId) {
        if let Some(Some(held)) = self.seen.remove(&id) {
            self.ended.by_write.push(held);
        }
    }

    /// Jobs that became due by time (the timer's): a RUNQUEUED one among
    /// them ended its hold.
    pub fn due_again<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        self.ended
            .by_time
            .extend(names.into_iter().map(str::to_string));
    }

    /// A throttle raised, lowered or removed: its slots are weighed again.
    pub fn throttle_changed(&mut self, glob: &str) {
        self.ended.throttles.push(glob.to_string());
    }

    /// What ended so far, each name once; forgotten here.
    pub fn take_ended(&mut self) -> Ended {
        let mut ended = std::mem::take(&mut self.ended);
        for names in [
            &mut ended.by_write,
            &mut ended.by_time,
            &mut ended.throttles,
        ] {
            names.sort_unstable();
            names.dedup();
        }
        ended
    }
}

/// The name `job` holds a slot under at `now`, if it holds one.
fn held_name(job: &Job, now: Timestamp) -> Option<String> {
    holds_slot(job, now).then(|| job.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: JobId, name: &str, state: JobState) -> Job {
        Job {
            id,
            name: name.into(),
            state,
            data: Default::default(),
            priority: Default::default(),
            created: Timestamp(0),
            next_run: Timestamp(0),
            last_run: None,
            repeat: String::new(),
            retry_after: String::new(),
            parent_id: 0,
            scheduled_run: None,
            lease: None,
            attempts: 0,
            lapses: 0,
        }
    }

    #[test]
    fn a_rename_ends_the_hold_under_the_old_name() {
        let now = Timestamp(1_000);
        let mut holds = Holds::default();
        holds.read(&job(1, "old/a", JobState::Running), now);
        holds.wrote(&job(1, "new/a", JobState::Queued), now);
        assert_eq!(holds.take_ended().by_write, ["old/a"]);
    }

    #[test]
    fn a_job_that_still_holds_ends_nothing_and_one_that_held_none_either() {
        let now = Timestamp(1_000);
        let mut holds = Holds::default();
        holds.read(&job(1, "a", JobState::Running), now);
        holds.wrote(&job(1, "a", JobState::Running), now);
        holds.read(&job(2, "b", JobState::Queued), now);
        holds.wrote(&job(2, "b", JobState::Failed), now);
        holds.removed(2);
        assert!(holds.take_ended().is_empty());
    }

    #[test]
    fn removing_or_writing_unread_ends_a_hold() {
        let now = Timestamp(1_000);
        let mut holds = Holds::default();
        let mut retried = job(1, "r", JobState::Runqueued);
        retried.next_run = Timestamp(2_000);
        holds.read(&retried, now);
        holds.removed(1);
        holds.wrote(&job(2, "lapsed", JobState::Queued), now);
        holds.wrote(&job(3, "taken", JobState::Running), now);
        assert_eq!(holds.take_ended().by_write, ["lapsed", "r"]);
    }
}
