//! Making up for forward steps of the wall clock (a bad NTP sync, an
//! operator's `date -s`). Leases are judged by wall time while holders renew
//! them by monotonic time, so a step of an hour would lapse every lease at
//! once, and a claim would hand out again jobs whose holders are still at
//! work. Every write looks for a step before its operation runs and, in the
//! same transaction, extends every held lease by it: no claim, heartbeat or
//! lapse ever sees the stepped clock against unextended leases. A holder
//! heartbeating by monotonic time keeps its job; one that died lapses one
//! step later, as it would have without the step. Leases granted or renewed
//! after the step are not extended, since the step is seen once (see
//! [`StepWatch`]). A backward step only makes leases last longer, and is
//! left alone; so are the jumps of a scripted clock.

use std::sync::Mutex;

use super::clock::{Reading, StepWatch};
use super::tracked::Tracked;
use crate::protocol::{JobError, JobState, Timestamp};
use crate::server::store::ListQuery;

/// Looks for a step of the clock since the last write, at the time `tx`
/// runs at, and extends every held lease by it unless `scripted`. Returns
/// the reading, for [`StepWatch::kept`] once the write's operation succeeds,
/// and whether leases were extended (then the scheduler's alarm, set by
/// the clock before the step, is stale).
pub(super) fn make_up_for_step(
    tx: &mut Tracked,
    watch: &Mutex<StepWatch>,
    scripted: bool,
) -> Result<(Reading, bool), JobError> {
    let (reading, step) = watch.lock().unwrap_or_else(|e| e.into_inner()).look(tx.now);
    let stepped = step > 0 && !scripted;
    if stepped {
        let extended = extend_leases_by(tx, step)?;
        tracing::warn!(
            step_ms = step,
            extended,
            "the wall clock stepped forward; held leases extended by the step"
        );
    }
    Ok((reading, stepped))
}

/// Moves every held job's lease expiry `step_ms` later (and, for a
/// RUNQUEUED job, whose lease lapses by becoming due, its `nextRun`).
/// Returns how many.
fn extend_leases_by(tx: &mut Tracked, step_ms: i64) -> Result<usize, JobError> {
    let mut held = tx.store().expired_leases(Timestamp(i64::MAX), usize::MAX)?;
    // RUNQUEUED jobs are few; a step is rare.
    held.extend(
        tx.store()
            .list(&ListQuery {
                state: Some(JobState::Runqueued),
                limit: usize::MAX,
                ..ListQuery::default()
            })?
            .jobs,
    );
    let mut extended = 0;
    for mut job in held {
        let Some(lease) = job.lease.as_mut() else {
            continue;
        };
        let Some(expires) = lease.expires else {
            continue;
        };
        let expires = expires.plus_millis(step_ms);
        lease.expires = Some(expires);
        if job.state == JobState::Runqueued {
            job.next_run = expires;
        }
        tx.update(&job)?;
        extended += 1;
    }
    Ok(extended)
}
