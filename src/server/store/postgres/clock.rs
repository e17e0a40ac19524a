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
    /// This machine's clock (ms since the epoch).
    local: fn() -> i64,
    /// Milliseconds to add to this machine's clock.
    offset_ms: AtomicI64,
    measured: Mutex<Instant>,
}

fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The offset of the database's clock from `local`, in ms.
fn offset(client: &mut Client, local: fn() -> i64) -> Result<i64, postgres::Error> {
    let before = local();
    let row = client.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        &[],
    )?;
    let after = local();
    let database: i64 = row.get(0);
    Ok(database - (before + after) / 2)
}

impl DatabaseClock {
    /// Measures the offset on `client`.
    pub(super) fn measure(client: &mut Client) -> Result<Self, postgres::Error> {
        Self::measure_against(client, local_ms)
    }

    /// Measures the offset on `client` from the clock `local`.
    fn measure_against(client: &mut Client, local: fn() -> i64) -> Result<Self, postgres::Error> {
        let offset = offset(client, local)?;
        if offset.abs() > 1_000 {
            tracing::warn!(
                offset_ms = offset,
                "this machine's clock is off from the database's; jobmgr goes by the database's"
            );
        }
        Ok(DatabaseClock {
            local,
            offset_ms: AtomicI64::new(offset),
            measured: Mutex::new(Instant::now()),
        })
    }

    /// Measures again on `client`.
    pub(super) fn remeasure(&self, client: &mut Client) -> Result<(), postgres::Error> {
        let offset = offset(client, self.local)?;
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
        Timestamp((self.local)() + self.offset_ms.load(Ordering::Relaxed))
    }

    /// Milliseconds added to this machine's clock.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's clock an hour fast, as a badly set server would be.
    fn an_hour_fast() -> i64 {
        local_ms() + 3_600_000
    }

    fn database_ms(client: &mut Client) -> i64 {
        client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .unwrap()
            .get(0)
    }

    /// On the project's machines PostgreSQL runs on 127.0.0.1:5432; only
    /// the clock is read (no database is made).
    #[test]
    fn a_server_whose_clock_is_an_hour_fast_reads_the_databases_time() {
        // The sync client blocks on a runtime of its own: not in a test
        // runtime, and off the test thread's.
        let mut client = std::thread::spawn(|| {
            Client::connect(
                "postgres://postgres@127.0.0.1:5432/postgres",
                postgres::NoTls,
            )
        })
        .join()
        .unwrap()
        .expect("PostgreSQL on 127.0.0.1:5432 (trust authentication for postgres)");
        let clock = DatabaseClock::measure_against(&mut client, an_hour_fast).unwrap();
        let offset = clock.offset_ms();
        assert!(
            (-3_600_000 - 1_000..=-3_600_000 + 1_000).contains(&offset),
            "offset {offset} ms"
        );
        let before = database_ms(&mut client);
        let read = clock.now().0;
        let after = database_ms(&mut client);
        // Within the round trips' error, not an hour off.
        assert!(
            (before - 1_000..=after + 1_000).contains(&read),
            "read {read}, database between {before} and {after}"
        );
        clock.remeasure(&mut client).unwrap();
        assert!((clock.now().0 - database_ms(&mut client)).abs() < 1_000);
    }
}
