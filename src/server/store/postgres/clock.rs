//! The database's clock as the one clock of every server on it. Each
//! server reads the database's time (half a round trip's error) and counts
//! on from it with its own monotonic clock, reading it again every few
//! seconds. This machine's wall clock plays no part: its skew, or a step of
//! it, changes nothing; due times and leases are judged by the database's
//! time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use postgres::Client;

use crate::protocol::Timestamp;

/// How often the database's time is read again.
const REMEASURE_EVERY: Duration = Duration::from_secs(10);

/// The database's clock, as read at one moment of this machine's
/// monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Reading {
    database_ms: i64,
    at: Instant,
}

/// The database's time: the last reading plus the monotonic time since.
#[derive(Debug)]
pub struct DatabaseClock {
    last: Mutex<Reading>,
}

/// Reads the database's time, dated at the middle of the round trip.
fn read(client: &mut Client) -> Result<Reading, postgres::Error> {
    let before = Instant::now();
    let row = client.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        &[],
    )?;
    let after = Instant::now();
    Ok(Reading {
        database_ms: row.get(0),
        at: before + (after - before) / 2,
    })
}

impl DatabaseClock {
    /// Reads the database's time on `client`.
    pub(super) fn measure(client: &mut Client) -> Result<Self, postgres::Error> {
        let reading = read(client)?;
        let clock = DatabaseClock {
            last: Mutex::new(reading),
        };
        let skew = clock.now().0 - crate::protocol::Timestamp::now().0;
        if skew.abs() > 1_000 {
            tracing::warn!(
                skew_ms = skew,
                "this machine's clock is off from the database's; jobmgr goes by the database's"
            );
        }
        Ok(clock)
    }

    /// Reads the database's time again on `client`.
    pub(super) fn remeasure(&self, client: &mut Client) -> Result<(), postgres::Error> {
        let reading = read(client)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = reading;
        Ok(())
    }

    /// Reads the database's time again on `client` if the last reading is
    /// old.
    pub(super) fn refresh_if_due(&self, client: Option<&mut Client>) {
        let due = self.reading().at.elapsed() >= REMEASURE_EVERY;
        if let (true, Some(client)) = (due, client)
            && let Err(error) = self.remeasure(client)
        {
            tracing::debug!(%error, "could not read the database's clock");
        }
    }

    fn reading(&self) -> Reading {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The database's time now.
    pub fn now(&self) -> Timestamp {
        let reading = self.reading();
        Timestamp(reading.database_ms + reading.at.elapsed().as_millis() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_ms(client: &mut Client) -> i64 {
        read(client).unwrap().database_ms
    }

    /// On the project's machines PostgreSQL runs on 127.0.0.1:5432; only
    /// the clock is read (no database is made). This machine's wall clock
    /// is not read at all, so its skew cannot matter.
    #[test]
    fn the_clock_reads_the_databases_time_and_counts_on_from_it() {
        // The sync client blocks on a runtime of its own: off the test's.
        let mut client = std::thread::spawn(|| {
            Client::connect(
                "postgres://postgres@127.0.0.1:5432/postgres",
                postgres::NoTls,
            )
        })
        .join()
        .unwrap()
        .expect("PostgreSQL on 127.0.0.1:5432 (trust authentication for postgres)");
        let clock = DatabaseClock::measure(&mut client).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let before = database_ms(&mut client);
        let read = clock.now().0;
        let after = database_ms(&mut client);
        // Within the round trips' error: it counted on from the reading.
        assert!(
            (before - 100..=after + 100).contains(&read),
            "read {read}, database between {before} and {after}"
        );
        clock.remeasure(&mut client).unwrap();
        assert!((clock.now().0 - database_ms(&mut client)).abs() < 100);
    }
}
