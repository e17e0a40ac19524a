//! Where the queue reads the time: the system clock, or, for tests that
//! script timings, a file holding the time; and [`StepWatch`], which tells a
//! step of the wall clock from time passing.

use std::path::PathBuf;

use crate::protocol::Timestamp;

/// Where the queue reads the time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// The longest the scheduler may sleep before it looks at the time
    /// again: `None` for a clock that moves with real time, a bound for
    /// one that can jump (a scripted clock), so that a moment it jumped
    /// past is noticed.
    fn longest_sleep(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether the clock's jumps are a script's way of passing time (a
    /// file holding the time), rather than steps of a clock that moves with
    /// real time, which the queue makes up for (see [`StepWatch`]).
    fn is_scripted(&self) -> bool {
        false
    }
}

/// The database's clock, for a store several servers share.
impl Clock for crate::server::store::DatabaseClock {
    fn now(&self) -> Timestamp {
        crate::server::store::DatabaseClock::now(self)
    }
}

/// Notices forward steps of the wall clock (a bad NTP sync, an operator's
/// `date -s`). Leases are judged by wall time while holders renew them by
/// monotonic time, so a step of an hour would lapse every lease at once and
/// hand out again jobs still running; the queue extends every lease by the
/// step before its next operation runs.
///
/// The watch follows the store's transactions: each write looks at the clock
/// ([`StepWatch::look`]) before its operation runs, and the reading counts
/// as seen once the write is kept ([`StepWatch::kept`]) and, for good, once
/// its transaction commits ([`StepWatch::ended`]). A step made up for in a
/// transaction that rolls back is seen again by the next write, and one made
/// up for in a kept write is not made up for again by a later one, even in
/// the same group commit.
#[derive(Debug, Default)]
pub struct StepWatch {
    /// The last reading of a committed write.
    committed: Option<Reading>,
    /// The last reading of a kept write whose transaction is still open.
    open: Option<Reading>,
}

/// A reading of the wall clock and of real (monotonic) time, taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    wall: Timestamp,
    mono: std::time::Instant,
}

impl StepWatch {
    /// The least step noticed: smaller differences are scheduling delays
    /// and slewing.
    pub const THRESHOLD_MS: i64 = 2_000;

    /// A watch that has not looked yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks at the wall clock reading `wall`, taken now: returns the
    /// reading and by how many milliseconds the clock moved further than
    /// real time since the last reading already in the store's state, when
    /// that is a step (past [`StepWatch::THRESHOLD_MS`], plus 1% of the
    /// time elapsed for slewing), else 0.
    pub fn look(&self, wall: Timestamp) -> (Reading, i64) {
        let now = Reading {
            wall,
            mono: std::time::Instant::now(),
        };
        let step = match self.open.or(self.committed) {
            Some(last) => {
                let real = now.mono.saturating_duration_since(last.mono).as_millis() as i64;
                let ahead = (wall.0 - last.wall.0) - real;
                if ahead > Self::THRESHOLD_MS + real / 100 {
                    ahead
                } else {
                    0
                }
            }
            None => 0,
        };
        (now, step)
    }

    /// The write that took `reading` (and made up for its step) was kept in
    /// the open transaction: later writes measure from it.
    pub fn kept(&mut self, reading: Reading) {
        self.open = Some(reading);
    }

    /// The transaction holding the kept write that took `reading` ended:
    /// committed, or rolled back (then the write's step counts as unseen).
    pub fn ended(&mut self, reading: Reading, committed: bool) {
        if committed && self.committed.is_none_or(|last| last.mono <= reading.mono) {
            self.committed = Some(reading);
        }
        if self.open == Some(reading) {
            self.open = None;
        }
    }
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that reads the time from a file on every call: a time in
/// Bedrock's form (`2026-01-01 00:00:00.000`) or milliseconds since the
/// epoch, which tests write to script a run with known timings; or an
/// offset from the system time in milliseconds with its sign (`+3600000`),
/// a clock that moves with real time and that tests step by writing a new
/// offset. While the file is missing or does not parse, the system time is
/// used, and said once.
#[derive(Debug)]
pub struct FileClock {
    path: PathBuf,
    warned: std::sync::atomic::AtomicBool,
}

impl FileClock {
    /// A clock reading `path`.
    pub fn new(path: PathBuf) -> Self {
        FileClock {
            path,
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn read(&self) -> Option<Timestamp> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let text = text.trim();
        if let Some(offset) = Self::offset(text) {
            return Some(Timestamp::now().plus_millis(offset));
        }
        text.parse::<i64>()
            .ok()
            .map(Timestamp)
            .or_else(|| Timestamp::parse(text))
    }
}

impl FileClock {
    fn offset(text: &str) -> Option<i64> {
        if text.starts_with('+') || text.starts_with('-') {
            text.parse::<i64>().ok()
        } else {
            None
        }
    }
}

impl Clock for FileClock {
    fn is_scripted(&self) -> bool {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| Self::offset(text.trim()))
            .is_none()
    }

    /// A scripted time is looked at every 50 ms; an offset clock moves
    /// with real time and is slept on as the system clock is, so that a
    /// test stepping it sees what a step of the system clock does.
    fn longest_sleep(&self) -> Option<std::time::Duration> {
        self.is_scripted()
            .then_some(std::time::Duration::from_millis(50))
    }

    fn now(&self) -> Timestamp {
        match self.read() {
            Some(at) => at,
            None => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(path = %self.path.display(), "the clock file is missing or unreadable; using the system time");
                }
                Timestamp::now()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_clock_reads_either_form_and_falls_back_to_the_system() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clock");
        let clock = FileClock::new(path.clone());
        let before = Timestamp::now();
        assert!(clock.now() >= before);
        std::fs::write(&path, "1700000000123\n").unwrap();
        assert_eq!(clock.now(), Timestamp(1_700_000_000_123));
        std::fs::write(&path, "2026-01-01 00:00:05").unwrap();
        assert_eq!(
            clock.now(),
            Timestamp::parse("2026-01-01 00:00:05").unwrap()
        );
        assert!(clock.is_scripted());
        std::fs::write(&path, "+3600000").unwrap();
        assert!(clock.now() >= before.plus_millis(3_600_000));
        assert!(!clock.is_scripted(), "an offset moves with real time");
        assert_eq!(clock.longest_sleep(), None);
        std::fs::write(&path, "soon").unwrap();
        assert!(clock.now() >= before);
    }

    /// Looks at `wall` and keeps the write in a transaction that then ends
    /// (`Some(committed)`) or stays open (`None`); returns the step seen.
    fn write(watch: &mut StepWatch, wall: Timestamp, ends: Option<bool>) -> i64 {
        let (reading, step) = watch.look(wall);
        watch.kept(reading);
        if let Some(committed) = ends {
            watch.ended(reading, committed);
        }
        step
    }

    #[test]
    fn a_step_watch_tells_a_step_from_time_passing() {
        let mut watch = StepWatch::new();
        let start = Timestamp::now();
        assert_eq!(write(&mut watch, start, Some(true)), 0);
        assert_eq!(write(&mut watch, start.plus_millis(100), Some(true)), 0);
        let step = write(&mut watch, start.plus_millis(3_600_000), Some(true));
        assert!(step > 3_500_000 && step <= 3_600_000, "{step}");
        assert_eq!(
            write(&mut watch, start.plus_millis(3_600_000), Some(true)),
            0
        );
    }

    #[test]
    fn a_step_seen_in_a_transaction_that_rolled_back_is_seen_again() {
        let mut watch = StepWatch::new();
        let start = Timestamp::now();
        write(&mut watch, start, Some(true));
        let stepped = start.plus_millis(3_600_000);
        assert!(write(&mut watch, stepped, Some(false)) > 0);
        let again = write(&mut watch, stepped, Some(true));
        assert!(
            again > 3_500_000,
            "the step was lost with the rollback: {again}"
        );
        assert_eq!(write(&mut watch, stepped, Some(true)), 0);
    }

    #[test]
    fn a_step_seen_by_a_kept_write_is_not_seen_again_by_a_later_one() {
        let mut watch = StepWatch::new();
        let start = Timestamp::now();
        write(&mut watch, start, Some(true));
        let stepped = start.plus_millis(3_600_000);
        // Two writes of one group commit: the second runs before the
        // first's transaction has committed.
        let (first, step) = watch.look(stepped);
        assert!(step > 0);
        watch.kept(first);
        let (second, again) = watch.look(stepped);
        assert_eq!(again, 0, "the step was made up for twice in one group");
        watch.kept(second);
        watch.ended(first, true);
        watch.ended(second, true);
        assert_eq!(write(&mut watch, stepped, Some(true)), 0);
        // A write that failed (never kept) leaves the step unseen for the next.
        let later = stepped.plus_millis(3_600_000);
        let (_, step) = watch.look(later);
        assert!(step > 0);
        assert!(write(&mut watch, later, Some(true)) > 0);
    }
}
