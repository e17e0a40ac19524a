//! How long the ledger keeps things, as qless's `jobs-history`,
//! `jobs-history-count`, `stats-history`, `histogram-history` and
//! `max-worker-age` say. What a purge removed is a record
//! ([`crate::server::records::PurgeCounts`]).

use std::time::Duration;

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
