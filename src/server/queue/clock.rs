//! Where the queue reads the time: the system clock, or, for tests that
//! script timings, a file holding the time.

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
/// epoch. Tests write it to script a run with known timings. While the file
/// is missing or does not parse, the system time is used, and said once.
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
        text.parse::<i64>()
            .ok()
            .map(Timestamp)
            .or_else(|| Timestamp::parse(text))
    }
}

impl Clock for FileClock {
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
        std::fs::write(&path, "soon").unwrap();
        assert!(clock.now() >= before);
    }
}
