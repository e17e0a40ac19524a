//! The queue's depth per name and state, for the overview. Counting it
//! reads every job (about 0.6 s with a million stored), so the overview
//! shows the last count and starts a new one in the background once the
//! last is older than ten times what it took: the overview answers at
//! once, the counts lag by at most a few seconds with a million jobs (and
//! by one refresh of the page with a few thousand), and counting never
//! takes more than about a tenth of a core however many pages poll.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::{JobError, JobState, Timestamp};
use crate::server::queue::Queue;

/// Jobs per name and state.
pub type Counts = Arc<Vec<(String, JobState, u64)>>;

/// The last count, shared by every page.
#[derive(Clone, Default)]
pub struct Depth(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    last: Option<Count>,
    counting: bool,
}

#[derive(Clone)]
struct Count {
    counts: Counts,
    /// When it was counted, by the queue's clock (to show) and monotonic.
    at: Timestamp,
    taken: Instant,
    took: Duration,
}

impl Depth {
    /// The last count and when it was made; counts now when there is none,
    /// and in the background when it is stale.
    pub async fn get(&self, queue: &Queue) -> Result<(Counts, Timestamp), JobError> {
        let stale = {
            let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match &state.last {
                None => None,
                Some(last) => {
                    let stale = last.taken.elapsed() > last.took * 10;
                    let answer = (last.counts.clone(), last.at);
                    if stale && !state.counting {
                        state.counting = true;
                        Some((answer, true))
                    } else {
                        Some((answer, false))
                    }
                }
            }
        };
        match stale {
            None => {
                let count = count(queue).await?;
                let answer = (count.counts.clone(), count.at);
                let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
                state.last = Some(count);
                Ok(answer)
            }
            Some((answer, refresh)) => {
                if refresh {
                    let (depth, queue) = (self.clone(), queue.clone());
                    tokio::spawn(async move {
                        let result = count(&queue).await;
                        let mut state = depth.0.lock().unwrap_or_else(|e| e.into_inner());
                        state.counting = false;
                        match result {
                            Ok(count) => state.last = Some(count),
                            Err(e) => tracing::warn!("dashboard: counting jobs failed: {e}"),
                        }
                    });
                }
                Ok(answer)
            }
        }
    }
}

async fn count(queue: &Queue) -> Result<Count, JobError> {
    let at = queue.now();
    let taken = Instant::now();
    let counts = queue.count_by_name().await?;
    Ok(Count {
        counts: Arc::new(counts),
        at,
        taken: Instant::now(),
        took: taken.elapsed(),
    })
}
