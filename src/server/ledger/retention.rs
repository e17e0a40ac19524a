//! How long the ledger keeps things, as qless's `jobs-history`,
//! `jobs-history-count`, `stats-history`, `histogram-history` and
//! `max-worker-age` say, and what a purge removed.

use std::time::Duration;

use serde_json::{Value, json};

/// The ledger's retention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retention {
    /// Ended jobs (the archive, FAILED jobs still queued, and attempts)
    /// are kept this long after they ended.
    pub history_max_age: Duration,
    /// At most this many ended jobs are kept; the oldest go first.
    pub history_max_count: u64,
    /// Hourly statistics, per name and per supervisor, are kept this long.
    pub stats_max_age: Duration,
    /// Their histograms are kept this long.
    pub histogram_max_age: Duration,
    /// A supervisor not seen for this long is shown as gone.
    pub worker_gone_after: Duration,
    /// How often the server purges.
    pub purge_every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 86_400;
        Retention {
            history_max_age: Duration::from_secs(7 * DAY),
            history_max_count: 50_000,
            stats_max_age: Duration::from_secs(30 * DAY),
            histogram_max_age: Duration::from_secs(7 * DAY),
            worker_gone_after: Duration::from_secs(120),
            purge_every: Duration::from_secs(300),
        }
    }
}

/// A duration in milliseconds, saturating.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// What one purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeCounts {
    /// Archived jobs.
    pub archived: u64,
    /// FAILED jobs removed from the queue with their archive entry.
    pub failed: u64,
    /// Attempts.
    pub attempts: u64,
    /// Hourly statistics rows, per name and per supervisor.
    pub stats: u64,
    /// Histograms dropped from rows that stay.
    pub histograms: u64,
    /// Supervisors gone for longer than the history is kept.
    pub workers: u64,
}

impl PurgeCounts {
    /// The counts for the API.
    pub fn to_json(&self) -> Value {
        json!({
            "archived": self.archived,
            "failed": self.failed,
            "attempts": self.attempts,
            "stats": self.stats,
            "histograms": self.histograms,
            "workers": self.workers,
        })
    }

    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        *self == PurgeCounts::default()
    }
}
