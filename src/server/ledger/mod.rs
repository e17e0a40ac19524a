//! The server's ledger of what happened to jobs, beside the queue itself:
//! every attempt (who ran it, when, how it ended, the tail of its output),
//! the archive of ended jobs, hourly statistics per job name and per
//! supervisor, the registry of supervisors, and failure groups. The queue's
//! rules write it in the same transaction as the change it records (through
//! `queue::record`, so that the ledger never depends on the queue);
//! [`retention`] purges it. The rows themselves are
//! [`crate::server::records`], which the store keeps; they are named here
//! too for the ledger's users.
//!
//! None of it changes what a Bedrock client sees.

pub mod failure;
pub mod retention;
pub mod utilisation;

use crate::protocol::Timestamp;
pub use crate::server::records::{
    ArchivedJob, Attempt, AttemptEnd, FailureGroup, Histogram, OpenAttempt, PurgeCounts,
    StatsDelta, StatsRow, Summary, WorkerDelta, WorkerRow, WorkerStatsRow, histogram, summary,
};
pub use retention::Retention;

/// One hour in milliseconds: statistics are kept per hour.
pub const HOUR_MS: i64 = 3_600_000;

/// The start of the hour `at` falls in.
pub fn hour_of(at: Timestamp) -> i64 {
    at.0.div_euclid(HOUR_MS) * HOUR_MS
}
