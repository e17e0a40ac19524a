//! Tags and tracked jobs behind a trait, beside the jobs themselves,
//! written in the same transactions.
//!
//! Tags are rows `job_tags(tag, job_id)`, whose primary key on `(tag,
//! job_id)` answers a listing by tag in id order, and an index on `job_id`
//! a job's own; they are deleted with their job (the archive keeps none).
//! Tracked jobs are rows `tracked_jobs(job_id, since)`: they outlive their
//! job, so that a tracked job that ended still shows as ended, until it is
//! untracked or retention purges its archive entry.

use crate::protocol::{JobError, JobId, Labels};

/// Row-level access to tags and tracking inside one transaction.
pub trait LabelTx {
    /// The tags and tracking of each of `ids`, in their order.
    fn of(&mut self, ids: &[JobId]) -> Result<Vec<Labels>, JobError>;
    /// Adds `add` to a job's tags (one already there is kept once), then
    /// removes `remove`.
    fn change_tags(&mut self, id: JobId, add: &[String], remove: &[String])
    -> Result<(), JobError>;
    /// Tracks a job (`since` the time given) or stops tracking it; returns
    /// whether that changed anything.
    fn set_tracked(&mut self, id: JobId, tracked: bool, since: i64) -> Result<bool, JobError>;
    /// Up to `limit` tracked job ids greater than `after`, in order.
    fn tracked(&mut self, after: JobId, limit: usize) -> Result<Vec<JobId>, JobError>;
    /// The `limit` tags on most jobs, with how many jobs each is on; most
    /// first, then by tag.
    fn top_tags(&mut self, limit: usize) -> Result<Vec<(String, u64)>, JobError>;
}
