//! The back-off's decisions, apart from any I/O: when the pressure pauses
//! the taking of jobs, when it freezes running ones and when they thaw
//! (with hysteresis, so that a reading hovering at the threshold does not
//! freeze and thaw jobs at every tick), and, per job, when a freeze has
//! lasted long enough that the job is thawed anyway.

use std::time::{Duration, Instant};

/// The thresholds, in percent of the pressure signal; `None` is off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// At or above: no new job is taken.
    pub pause: Option<f64>,
    /// At or above: running jobs are frozen.
    pub freeze: Option<f64>,
}

impl Thresholds {
    /// Whether this reading pauses the taking of jobs.
    pub fn pauses(&self, percent: f64) -> bool {
        self.pause.is_some_and(|pause| percent >= pause)
    }

    /// Below what frozen jobs thaw: the pause threshold, or half the freeze
    /// threshold when pausing is off.
    pub fn thaw_below(&self) -> Option<f64> {
        self.freeze.map(|freeze| self.pause.unwrap_or(freeze / 2.0))
    }
}

/// Whether running jobs are to be frozen, following the readings with
/// hysteresis: on at the freeze threshold, off only below the thaw one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hysteresis {
    freezing: bool,
}

impl Hysteresis {
    /// Whether jobs are to be frozen now.
    pub fn freezing(&self) -> bool {
        self.freezing
    }

    /// Takes a reading (`None`: none could be taken, which thaws: jobs are
    /// not kept frozen on no evidence); returns whether jobs are to be
    /// frozen.
    pub fn update(&mut self, reading: Option<f64>, thresholds: &Thresholds) -> bool {
        self.freezing = match (reading, thresholds.freeze, thresholds.thaw_below()) {
            (Some(percent), Some(freeze), Some(thaw)) => {
                if self.freezing {
                    percent >= thaw
                } else {
                    percent >= freeze
                }
            }
            _ => false,
        };
        self.freezing
    }
}

/// One job's freezes: the stretch it is in, the time it spent frozen, and
/// until when it is spared after a freeze that lasted too long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreezeClock {
    since: Option<Instant>,
    total: Duration,
    spared_until: Option<Instant>,
    ended: bool,
}

/// What to do with one job at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Stay,
    /// Freeze it.
    Freeze,
    /// Thaw it: the pressure fell (or the job ends).
    Thaw,
    /// Thaw it although the pressure stays: it was frozen `max_freeze` in
    /// one stretch. It is spared for as long again.
    ThawOverdue,
}

impl FreezeClock {
    /// Whether the job is frozen now.
    pub fn frozen(&self) -> bool {
        self.since.is_some()
    }

    /// The time it spent frozen, the stretch it is in included.
    pub fn frozen_for(&self, now: Instant) -> Duration {
        self.total
            + self
                .since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// What to do at `now`, when jobs are to be `freezing` or not.
    pub fn step(&self, freezing: bool, now: Instant, max_freeze: Duration) -> Step {
        match self.since {
            Some(_) if self.ended || !freezing => Step::Thaw,
            Some(since) if now.saturating_duration_since(since) >= max_freeze => Step::ThawOverdue,
            Some(_) => Step::Stay,
            None if freezing && !self.ended && self.spared_until.is_none_or(|t| now >= t) => {
                Step::Freeze
            }
            None => Step::Stay,
        }
    }

    /// Records a freeze at `now`.
    pub fn froze(&mut self, now: Instant) {
        if self.since.is_none() {
            self.since = Some(now);
        }
    }

    /// Records a thaw at `now`; `spare` spares the job from freezing for
    /// that long. Returns how long the stretch lasted.
    pub fn thawed(&mut self, now: Instant, spare: Option<Duration>) -> Duration {
        let stretch = self
            .since
            .take()
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        self.total += stretch;
        if let Some(spare) = spare {
            self.spared_until = Some(now + spare);
        }
        stretch
    }

    /// Records that the job ends: it is never frozen again.
    pub fn end(&mut self) {
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Thresholds = Thresholds {
        pause: Some(10.0),
        freeze: Some(25.0),
    };

    #[test]
    fn freezing_starts_at_the_freeze_threshold_and_ends_below_the_pause_one() {
        let mut h = Hysteresis::default();
        let steps = [
            (5.0, false),
            (24.9, false),
            (25.0, true),
            (40.0, true),
            // Between the two: stays frozen.
            (15.0, true),
            (10.0, true),
            (9.99, false),
            // Between the two again, from below: stays thawed.
            (20.0, false),
            (25.0, true),
        ];
        for (reading, frozen) in steps {
            assert_eq!(h.update(Some(reading), &BOTH), frozen, "at {reading}");
        }
        assert!(BOTH.pauses(10.0) && !BOTH.pauses(9.99));
    }

    #[test]
    fn without_a_pause_threshold_jobs_thaw_below_half_the_freeze_one() {
        let t = Thresholds {
            pause: None,
            freeze: Some(30.0),
        };
        assert_eq!(t.thaw_below(), Some(15.0));
        assert!(!t.pauses(99.0));
        let mut h = Hysteresis::default();
        assert!(h.update(Some(30.0), &t));
        assert!(h.update(Some(15.0), &t));
        assert!(!h.update(Some(14.9), &t));
    }

    #[test]
    fn no_reading_or_freezing_off_thaws() {
        let mut h = Hysteresis::default();
        assert!(h.update(Some(50.0), &BOTH));
        assert!(!h.update(None, &BOTH));
        let off = Thresholds {
            pause: Some(10.0),
            freeze: None,
        };
        assert!(!h.update(Some(100.0), &off));
        assert_eq!(off.thaw_below(), None);
    }

    #[test]
    fn a_job_frozen_too_long_is_thawed_and_spared_for_as_long_again() {
        let max = Duration::from_secs(60);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut clock = FreezeClock::default();
        assert_eq!(clock.step(false, t0, max), Step::Stay);
        assert_eq!(clock.step(true, t0, max), Step::Freeze);
        clock.froze(t0);
        assert!(clock.frozen());
        assert_eq!(clock.step(true, t0 + s(59), max), Step::Stay);
        assert_eq!(clock.frozen_for(t0 + s(59)), s(59));
        assert_eq!(clock.step(true, t0 + s(60), max), Step::ThawOverdue);
        assert_eq!(clock.thawed(t0 + s(60), Some(max)), s(60));
        // Spared while the pressure stays, then frozen again.
        assert_eq!(clock.step(true, t0 + s(119), max), Step::Stay);
        assert_eq!(clock.step(true, t0 + s(120), max), Step::Freeze);
        clock.froze(t0 + s(120));
        assert_eq!(clock.step(false, t0 + s(130), max), Step::Thaw);
        assert_eq!(clock.thawed(t0 + s(130), None), s(10));
        assert_eq!(clock.frozen_for(t0 + s(500)), s(70));
    }

    #[test]
    fn a_job_that_ends_is_thawed_and_never_frozen_again() {
        let max = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut clock = FreezeClock::default();
        clock.froze(t0);
        clock.end();
        assert_eq!(clock.step(true, t0, max), Step::Thaw);
        clock.thawed(t0, None);
        assert_eq!(clock.step(true, t0, max), Step::Stay);
    }
}
