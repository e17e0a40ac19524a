//! The opt-in sweeper for jobs held without a lease. A plain Bedrock client
//! holds a job without `retryAfter` until it reports it; if the client dies,
//! the job stays RUNNING forever. With `--requeue-unleased-after AGE`, this
//! task looks every so often for RUNNING jobs with no lease handed out at
//! least AGE ago, and puts them back as a lapsed lease would be (a lapse is
//! counted, so `--max-lapses` still FAILs a job that kills its workers).

use std::time::Duration;

use super::{Queue, rules};
use crate::server::ledger::retention::millis;

/// The longest pause between two sweeps.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);
/// The shortest pause between two sweeps.
const SHORTEST_PAUSE: Duration = Duration::from_millis(250);

/// Sweeps every tenth of `age` (within 250 ms and a minute) until the queue
/// shuts down.
pub(super) async fn run(queue: Queue, age: Duration) {
    let inner = &queue.inner;
    let mut pause = (age / 10).clamp(SHORTEST_PAUSE, LONGEST_PAUSE);
    // A scripted clock can jump: look as often as the scheduler does.
    if let Some(longest) = inner.clock.longest_sleep() {
        pause = pause.min(longest);
    }
    let age_ms = millis(age);
    let max_lapses = inner.config.max_lapses;
    tracing::info!(
        after = %humantime::format_duration(age),
        "jobs held without a lease are queued again once handed out this long ago"
    );
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let swept = queue
            .write(move |tx| {
                let handed_out_by = tx.now.plus_millis(-age_ms);
                rules::requeue_unleased(tx, handed_out_by, max_lapses)
            })
            .await;
        if let Err(error) = swept {
            tracing::error!(%error, "cannot sweep jobs held without a lease; trying again later");
        }
    }
    tracing::debug!("unleased-job sweeper stopped");
}
