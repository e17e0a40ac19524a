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

/// Notices forward steps of the wall clock (a bad NTP sync, an operator's
/// `date -s`). Leases are judged by wall time while holders renew them by
/// monotonic time, so a step of an hour would lapse every lease at once and
/// hand out again jobs still running; the queue extends every lease by the
/// step before it lapses any.
#[derive(Debug)]
pub struct StepWatch {
    last: Option<(Timestamp, std::time::Instant)>,
}

impl StepWatch {
    /// The least step noticed: smaller differences are scheduling delays
    /// and slewing.
    pub const THRESHOLD_MS: i64 = 2_000;

    /// A watch that has not looked yet.
    pub fn new() -> Self {
        StepWatch { last: None }
    }

    /// Looks at the wall clock reading `wall`, taken now: returns by how
    /// many milliseconds it moved further than real time since the last
    /// look, when that is a step (past [`StepWatch::THRESHOLD_MS`], plus 1%
    /// of the time elapsed for slewing), else 0.
    pub fn forward_step(&mut self, wall: Timestamp) -> i64 {
        let mono = std::time::Instant::now();
        let step = match self.last {
            Some((last_wall, last_mono)) => {
                let real = mono.duration_since(last_mono).as_millis() as i64;
                let moved = wall.0 - last_wall.0;
                let ahead = moved - real;
                if ahead > Self::THRESHOLD_MS + real / 100 {
                    ahead
                } else {
                    0
                }
            }
            None => 0,
        };
        self.last = Some((wall, mono));
        step
    }
}

impl Default for StepWatch {
    fn default() -> Self {
        Self::new()
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

    fn longest_sleep(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(50))
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
        std::fs::write(&path, "soon").unwrap();
        assert!(clock.now() >= before);
    }

    #[test]
    fn a_step_watch_tells_a_step_from_time_passing() {
        let mut watch = StepWatch::new();
        let start = Timestamp::now();
        assert_eq!(watch.forward_step(start), 0);
        assert_eq!(watch.forward_step(start.plus_millis(100)), 0);
        let step = watch.forward_step(start.plus_millis(3_600_000));
        assert!(step > 3_500_000 && step <= 3_600_000, "{step}");
        assert_eq!(watch.forward_step(start.plus_millis(3_600_000)), 0);
    }
}
