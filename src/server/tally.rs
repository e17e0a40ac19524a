//! Log lines that a flood would repeat: refused connections, refused job
//! tokens. Anyone who can open sockets can make them as fast as the server
//! answers, so each is said at most once per [`Tally::EVERY`], with how
//! many occurrences it stands for (itself and those held back since the
//! line before). The first occurrence is always said at once.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Occurrences of one kind of event, and when one was last said.
#[derive(Debug, Default)]
pub struct Tally {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Occurrences since the last one said.
    held_back: u64,
    said: Option<Instant>,
}

impl Tally {
    /// The least time between two lines of one tally.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// Counts one occurrence now; see [`Tally::note_at`].
    pub fn note(&self) -> Option<u64> {
        self.note_at(Instant::now())
    }

    /// Counts one occurrence at `now`: `Some(count)` when it is to be
    /// logged (`count` is itself and the occurrences held back since the
    /// last line), `None` when it is held back.
    pub fn note_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held_back += 1;
        if state
            .said
            .is_some_and(|at| now.duration_since(at) < Self::EVERY)
        {
            return None;
        }
        state.said = Some(now);
        Some(std::mem::take(&mut state.held_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_said_then_one_line_a_period_with_its_count() {
        let tally = Tally::default();
        let t0 = Instant::now();
        assert_eq!(tally.note_at(t0), Some(1));
        for n in 1..=1000 {
            assert_eq!(tally.note_at(t0 + Duration::from_millis(n)), None);
        }
        assert_eq!(tally.note_at(t0 + Tally::EVERY), Some(1001));
        assert_eq!(tally.note_at(t0 + Tally::EVERY), None);
        assert_eq!(tally.note_at(t0 + 5 * Tally::EVERY), Some(2));
    }
}
