//! The ledger's rows ([`crate::server::records`]) behind a trait, beside
//! the jobs themselves, written in the same transactions.

use super::ArchiveQuery;
use crate::protocol::{JobError, JobId, NamePattern, Timestamp, WorkerInfo};
use crate::server::records::{
    ArchivedJob, Attempt, AttemptEnd, FailureGroup, OpenAttempt, PurgeCounts, StatsDelta, StatsRow,
    WorkerDelta, WorkerRow, WorkerStatsRow,
};

/// What a purge removes: everything that ended before the cutoffs.
#[derive(Debug, Clone, Copy)]
pub struct PurgeLimits {
    /// Ended jobs and attempts that ended before this go.
    pub history_before: Timestamp,
    /// Beyond this many ended jobs, the oldest go.
    pub history_max_count: u64,
    /// Statistics of hours before this go.
    pub stats_before: Timestamp,
    /// Histograms of hours before this go.
    pub histograms_before: Timestamp,
}

/// Row-level access to the ledger inside one transaction.
pub trait LedgerTx {
    /// Adds an event to the statistics of `name` for the hour starting at `hour`.
    fn add_stats(&mut self, name: &str, hour: i64, delta: &StatsDelta) -> Result<(), JobError>;
    /// Hourly rows with `from <= hour < to`, by name then hour.
    fn stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<StatsRow>, JobError>;

    /// Adds an event to a supervisor's statistics for the hour starting at `hour`.
    fn add_worker_stats(
        &mut self,
        worker: &str,
        hour: i64,
        delta: &WorkerDelta,
    ) -> Result<(), JobError>;
    /// Supervisors' hourly rows with `from <= hour < to`, by supervisor then hour.
    fn worker_stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<WorkerStatsRow>, JobError>;

    /// Records a hand-out.
    fn open_attempt(&mut self, attempt: &Attempt) -> Result<(), JobError>;
    /// Ends the job's open attempt, if it has one, and says what it was.
    fn close_attempt(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError>;
    /// Ends the job's open attempt as a hand-back for want of its worker
    /// (`end`, with its outcome `handed_back`): when the job's latest ended
    /// attempt is such a hand-back too, that row counts one more and ends
    /// now, and the open one is forgotten; otherwise the open one ends as
    /// the first of a streak. Says what the open attempt was.
    fn close_hand_back(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError>;
    /// Forgets the job's open attempt (a hand-out that was never delivered).
    fn discard_open_attempt(&mut self, job_id: JobId) -> Result<(), JobError>;
    /// When the job's current occurrence entered the queue: the due time of
    /// its latest first attempt.
    fn occurrence_start(&mut self, job_id: JobId) -> Result<Option<Timestamp>, JobError>;
    /// Up to `limit` of a job's recorded attempts, oldest first, after
    /// skipping its `skip` latest; and how many it has in all.
    fn attempts(
        &mut self,
        job_id: JobId,
        skip: usize,
        limit: usize,
    ) -> Result<(Vec<Attempt>, u64), JobError>;

    /// Keeps an ended job (replacing an earlier entry for it).
    fn archive(&mut self, job: &ArchivedJob) -> Result<(), JobError>;
    /// The archived job, if kept.
    fn archived(&mut self, job_id: JobId) -> Result<Option<ArchivedJob>, JobError>;
    /// Archived jobs in id order (see [`ArchiveQuery`]).
    fn archived_list(&mut self, query: &ArchiveQuery) -> Result<Vec<ArchivedJob>, JobError>;

    /// Puts a FAILED job in a failure group.
    fn set_failure(&mut self, job_id: JobId, group: &str, at: Timestamp) -> Result<(), JobError>;
    /// Takes a job out of its failure group.
    fn clear_failure(&mut self, job_id: JobId) -> Result<(), JobError>;
    /// Groups of jobs still FAILED, largest first.
    fn failure_groups(&mut self) -> Result<Vec<FailureGroup>, JobError>;
    /// Up to `limit` FAILED jobs of a group, earliest failure first.
    fn failed_in_group(&mut self, group: &str, limit: usize) -> Result<Vec<JobId>, JobError>;
    /// The FAILED job of a group that failed last (by the index on the
    /// group and the time, walked backwards), if any.
    fn latest_failed_in_group(&mut self, group: &str) -> Result<Option<JobId>, JobError>;

    /// Records what a supervisor says about itself.
    fn see_worker(&mut self, info: &WorkerInfo, now: Timestamp) -> Result<(), JobError>;
    /// Marks a supervisor as seen.
    fn touch_worker(&mut self, worker: &str, now: Timestamp) -> Result<(), JobError>;
    /// When a supervisor was last seen, and the capacity it said it had.
    fn sighting(&mut self, worker: &str) -> Result<Option<(Timestamp, u32)>, JobError>;
    /// The supervisor holding a job's open attempt, if it said who it is.
    fn holder(&mut self, job_id: JobId) -> Result<Option<String>, JobError>;
    /// Every open attempt taken by `worker` (by any supervisor that said
    /// who it is, for `None`): the supervisor and when the attempt started.
    fn open_runs(&mut self, worker: Option<&str>) -> Result<Vec<(String, Timestamp)>, JobError>;
    /// Every supervisor in the registry, most recently seen first.
    fn workers(&mut self) -> Result<Vec<WorkerRow>, JobError>;
    /// Milliseconds a supervisor's attempts spent running in `[from, to)`
    /// (an attempt still running counts up to `to`).
    fn busy_ms(&mut self, worker: &str, from: Timestamp, to: Timestamp) -> Result<i64, JobError>;

    /// Removes what retention no longer keeps.
    fn purge(&mut self, limits: &PurgeLimits) -> Result<PurgeCounts, JobError>;
}
