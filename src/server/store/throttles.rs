//! Throttles in the store: the `throttles` table (a name GLOB and how many
//! jobs matching it may be held at once), the count of held jobs matching
//! one, and the jobs a claim *parked* behind a full throttle.
//!
//! A parked job (its `held_back_by` column names the throttle) is left out
//! of the ready index that claims walk, so a claim never steps over the
//! jobs a full throttle holds back: it parks them once, and looks at a
//! throttle's parked jobs (an index range of their own, best first) only
//! while that throttle has room. Any write of a job unparks it.

use super::Take;
use crate::protocol::{Job, JobError, JobId, NamePattern, Priority, Timestamp};

/// One throttle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    /// The GLOB job names are matched against (as GetJobs matches them).
    pub glob: String,
    /// How many jobs matching it may be held at once (0 pauses them).
    pub max: i64,
}

/// The condition, on a job's columns, that it holds a throttle's slot at
/// `?now`: RUNNING, or RUNQUEUED (a `retryAfter` job handed out) until it
/// is due again, which is when its holder's lease lapses. The queue's
/// `throttles::Holds` says the same of a job it has read.
pub(super) const HELD: &str =
    "state IN ('RUNNING', 'RUNQUEUED') AND (state = 'RUNNING' OR next_run > {now})";

/// Row-level access to throttles and parked jobs inside one transaction.
pub trait ThrottleTx {
    /// Every throttle, in GLOB order, read without locking.
    fn list_throttles(&mut self) -> Result<Vec<Throttle>, JobError>;
    /// Locks the rows of these throttles (in GLOB order) until the
    /// transaction ends, so that servers sharing the store count and claim
    /// for one throttle one at a time; returns those that exist.
    fn lock_throttles(&mut self, globs: &[String]) -> Result<Vec<Throttle>, JobError>;
    /// How many jobs whose name matches `glob` hold a slot at `now`.
    fn held_matching(&mut self, glob: &str, now: Timestamp) -> Result<u64, JobError>;
    /// Creates or changes a throttle.
    fn set_throttle(&mut self, glob: &str, max: i64) -> Result<(), JobError>;
    /// Removes a throttle; returns whether it existed.
    fn delete_throttle(&mut self, glob: &str) -> Result<bool, JobError>;
    /// How many throttles there are.
    fn count_throttles(&mut self) -> Result<usize, JobError>;
    /// Parks one job behind the throttle `glob`.
    fn park_job(&mut self, id: JobId, glob: &str) -> Result<(), JobError>;
    /// Parks every ready job not parked yet whose name matches `glob`
    /// (behind it); returns how many.
    fn park_matching(&mut self, glob: &str) -> Result<u64, JobError>;
    /// As many jobs as `take` allows (at least one) parked behind `glob`
    /// that are due at `now` and match `pattern` (and `priority`), best
    /// first. With `lock`, in a write transaction, rows other servers hold
    /// are skipped and those returned are locked.
    fn parked_jobs(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        take: Take,
        lock: bool,
    ) -> Result<Vec<Job>, JobError>;
    /// How many jobs (up to `limit`) `glob` holds back at `now` that match
    /// `pattern` (and `priority`): due, and parked behind it, or matching
    /// it and not parked at all (parked behind a throttle just removed, or
    /// by a claim on another server that has not committed the parking
    /// yet). Read without locking.
    fn count_held_back(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, JobError>;
    /// Unparks every job parked behind `glob`.
    fn release_parked(&mut self, glob: &str) -> Result<(), JobError>;
}

/// The `{now}` placeholder of [`HELD`] filled with a parameter mark.
pub(super) fn held_condition(now_mark: &str) -> String {
    HELD.replace("{now}", now_mark)
}
