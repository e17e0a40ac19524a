//! The database's clock as the one clock of every server on it: each server
//! measures how far the database's clock is from its own (half a round
//! trip's error), again every few seconds, and reads the time as its own
//! clock plus that offset. Skew between server machines then changes
//! nothing: due times and leases are judged by the database's time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::Client;

use crate::protocol::Timestamp;

/// How often the offset is measured again.
const REMEASURE_EVERY: Duration = Duration::from_secs(10);

/// The database's clock, read through this machine's.
#[derive(Debug)]
pub struct DatabaseClock {
    /// Milliseconds to add to this machine's clock.
    offset_ms: AtomicI64,
    measured: Mutex<Instant>,
}

fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The offset of the database's clock from this machine's, in ms.
fn offset(client: &mut Client) -> Result<i64, postgres::Error> {
    let before = local_ms();
    let row = client.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        &[],
    )?;
    let after = local_ms();
    let database: i64 = row.get(0);
    Ok(database - (before + after) / 2)
}

impl DatabaseClock {
    /// Measures the offset on `client`.
    pub(super) fn measure(client: &mut Client) -> Result<Self, postgres::Error> {
        let offset = offset(client)?;
        if offset.abs() > 1_000 {
            tracing::warn!(
                offset_ms = offset,
                "this machine's clock is off from the database's; jobmgr goes by the database's"
            );
        }
        Ok(DatabaseClock {
            offset_ms: AtomicI64::new(offset),
            measured: Mutex::new(Instant::now()),
        })
    }

    /// Measures again on `client`.
    pub(super) fn remeasure(&self, client: &mut Client) -> Result<(), postgres::Error> {
        let offset = offset(client)?;
        self.offset_ms.store(offset, Ordering::Relaxed);
        *self.measured.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Ok(())
    }

    /// Measures again on `client` if the last measure is old.
    pub(super) fn refresh_if_due(&self, client: Option<&mut Client>) {
        let due = self
            .measured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            >= REMEASURE_EVERY;
        if let (true, Some(client)) = (due, client)
            && let Err(error) = self.remeasure(client)
        {
            tracing::debug!(%error, "could not read the database's clock");
        }
    }

    /// The database's time now.
    pub fn now(&self) -> Timestamp {
        Timestamp(local_ms() + self.offset_ms.load(Ordering::Relaxed))
    }

    /// Milliseconds added to this machine's clock.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}
