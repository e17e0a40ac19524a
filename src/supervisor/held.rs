//! A job's place under `--max-workers`, and the jobs held ahead of one
//! (`--fetch-ahead`): fetched while every slot was taken, leased and
//! renewed but not started, each waits for the next slot given back. One
//! that gets no slot within `--fetch-ahead-hold`, or finds the machine's
//! gate closed when it gets one, or is still held when the supervisor
//! drains, goes back to the queue as it was before its hand-out
//! (HandBackJob: no attempt counted).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::gate::GateLimits;
use super::slots::{Hold, Slot};
use super::status::OnBoard;
use crate::client::{LeasedJob, SourceError};
use crate::metrics::Counted;

/// Where a job stands under `--max-workers`.
#[derive(Debug)]
pub enum Place {
    /// In a worker slot, counted as running, until its worker is gone
    /// (both given back when dropped).
    Slot {
        /// Its slot.
        _slot: Slot,
        /// Its count in the running workers' gauge.
        _running: Counted,
    },
    /// Held ahead, waiting for a slot, counted as held.
    Held(Hold, Counted),
    /// Its slot given back (or it never had one).
    Left,
}

/// Why a job held ahead went back to the queue unstarted.
#[derive(Debug, Clone, PartialEq)]
pub enum WentBack {
    /// No slot was given back within `--fetch-ahead-hold`.
    HoldExpired(Duration),
    /// It got a slot, but the machine's gate was closed then.
    GateClosed(String),
    /// The supervisor stops taking jobs: it drains, or was quieted (or
    /// stopped while the job was held).
    Draining,
}

impl WentBack {
    /// The reason's label in `jobmgr_jobs_handed_back_total`.
    pub fn label(&self) -> &'static str {
        match self {
            WentBack::HoldExpired(_) => "hold_expired",
            WentBack::GateClosed(_) => "gate_closed",
            WentBack::Draining => "draining",
        }
    }
}

impl fmt::Display for WentBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WentBack::HoldExpired(hold) => write!(
                f,
                "no slot freed within {} (fetch-ahead-hold)",
                crate::config::HumanDuration(*hold)
            ),
            WentBack::GateClosed(why) => write!(f, "the gate closed: {why}"),
            WentBack::Draining => write!(f, "draining or quiet: no more jobs are taken"),
        }
    }
}

/// What a held job waits on besides its slot.
#[derive(Debug)]
pub struct Waits<'a> {
    /// The longest it is held.
    pub hold: Duration,
    /// The gate's limits, asked again when the slot comes.
    pub limits: &'a GateLimits,
    /// Cancelled when the supervisor stops taking jobs (a drain, quiet).
    pub drain: &'a CancellationToken,
    /// Cancelled when the job must stop (the drain timeout, a lost lease).
    pub stop: &'a CancellationToken,
}

/// Why a held job did not get its place.
#[derive(Debug)]
pub enum NoPlace {
    /// It goes back to the queue.
    WentBack(WentBack),
    /// It was stopped (see [`Waits::stop`]).
    Stopped,
}

/// Puts a held job in its slot once one passes to it and the gate allows;
/// a job already in a slot stays there.
pub async fn take_place(
    place: &Mutex<Place>,
    shared: &Shared,
    waits: Waits<'_>,
    on_board: &OnBoard,
) -> Result<(), NoPlace> {
    let (mut hold, counted) = {
        let mut place = place.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *place, Place::Left) {
            Place::Held(hold, counted) => (hold, counted),
            other => {
                *place = other;
                return Ok(());
            }
        }
    };
    // A slot already passed wins over the hold's end in the same instant.
    let slot = tokio::select! {
        biased;
        slot = hold.slot() => slot,
        _ = tokio::time::sleep(waits.hold) => {
            hold.pause_ahead();
            return Err(NoPlace::WentBack(WentBack::HoldExpired(waits.hold)));
        }
        _ = waits.drain.cancelled() => return Err(NoPlace::WentBack(WentBack::Draining)),
        _ = waits.stop.cancelled() => return Err(NoPlace::Stopped),
    };
    drop((hold, counted));
    // The machine may have changed since the fetch: the gate's reading is
    // taken again (a job going back passes its slot on).
    let allowed = shared
        .load
        .sample()
        .map_err(|e| format!("cannot read the machine's load: {e}"))
        .and_then(|sample| {
            waits
                .limits
                .machine_allows(&sample)
                .map_err(|c| c.to_string())
        });
    if let Err(why) = allowed {
        return Err(NoPlace::WentBack(WentBack::GateClosed(why)));
    }
    on_board.placed();
    *place.lock().unwrap_or_else(|e| e.into_inner()) = Place::Slot {
        _slot: slot,
        _running: shared.running.enter(),
    };
    Ok(())
}

/// How many times a hand-back is tried before the job is left to its
/// lease.
const HAND_BACK_TRIES: u32 = 3;

/// Hands a held job back to the queue, as it was before its hand-out; a
/// server that cannot be reached is asked again twice, moments apart.
pub async fn go_back(shared: &Shared, job: &LeasedJob, why: &WentBack) {
    crate::metrics::held_job_handed_back(&shared.pool, why.label());
    let mut pause = Duration::from_millis(200);
    for tried in 1..=HAND_BACK_TRIES {
        match shared.source.hand_back(job).await {
            Ok(()) => return tracing::info!("held job handed back: {why}"),
            Err(SourceError::LeaseLost(_)) => {
                return tracing::warn!(
                    "held job not handed back ({why}): its lease was already lost, so the server has put it back or given it to another supervisor"
                );
            }
            Err(error) if tried < HAND_BACK_TRIES => {
                tracing::debug!(%error, "held job not handed back yet ({why}); trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(error) => tracing::warn!(
                %error,
                "held job could not be handed back ({why}); it returns when its lease lapses"
            ),
        }
    }
}
