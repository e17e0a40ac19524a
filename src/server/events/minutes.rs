//! The last hour by minute, counted in memory from the events this server
//! publishes: jobs finished, jobs failed, and the wait of each hand-out
//! (from when the job was due). Sixty buckets, one per minute of the
//! queue's clock, reused as the minutes pass: bounded whatever the load.
//! Recording takes a short lock once per committed write (not per event);
//! nothing is stored, so the counts start when this server starts and hold
//! only the changes committed through it.

use std::sync::Mutex;

use super::{EventKind, JobEvent};
use crate::protocol::{JobState, Timestamp};

/// The minutes kept.
pub const MINUTES: usize = 60;

/// One minute's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Minute {
    /// The minute (milliseconds since the epoch, divided by 60,000).
    pub minute: i64,
    /// Runs reported finished (a repeat's run included).
    pub finished: u64,
    /// Jobs that ended FAILED.
    pub failed: u64,
    /// Hand-outs.
    pub handed_out: u64,
    /// Their waits summed, in milliseconds.
    pub wait_ms: u64,
}

impl Minute {
    /// The mean wait of the minute's hand-outs in seconds, if any.
    pub fn mean_wait_secs(&self) -> Option<f64> {
        (self.handed_out > 0).then(|| self.wait_ms as f64 / 1000.0 / self.handed_out as f64)
    }
}

/// The last [`MINUTES`] minutes' counts.
#[derive(Debug)]
pub struct Minutes {
    ring: Mutex<[Minute; MINUTES]>,
}

impl Default for Minutes {
    fn default() -> Self {
        Minutes {
            ring: Mutex::new([Minute::default(); MINUTES]),
        }
    }
}

impl Minutes {
    /// Counts a committed write's events.
    pub fn record(&self, events: &[JobEvent]) {
        if events.is_empty() {
            return;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            let minute = event.at.0.div_euclid(60_000);
            let slot = &mut ring[minute.rem_euclid(MINUTES as i64) as usize];
            if slot.minute != minute {
                if slot.minute > minute {
                    // Older than the minute the slot holds now (a clock
                    // stepped back): not counted.
                    continue;
                }
                *slot = Minute {
                    minute,
                    ..Minute::default()
                };
            }
            match event.kind {
                EventKind::Finished => slot.finished += 1,
                EventKind::HandedOut => {
                    slot.handed_out += 1;
                    slot.wait_ms += event.waited_ms.unwrap_or(0).max(0) as u64;
                }
                _ => {}
            }
            if event.state == JobState::Failed.as_str()
                && matches!(event.kind, EventKind::Failed | EventKind::Lapsed)
            {
                slot.failed += 1;
            }
        }
    }

    /// The [`MINUTES`] minutes up to and including `now`'s, oldest first
    /// (minutes with nothing counted are zeros).
    pub fn last_hour(&self, now: Timestamp) -> Vec<Minute> {
        let ring = *self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let current = now.0.div_euclid(60_000);
        (current - MINUTES as i64 + 1..=current)
            .map(|minute| {
                let slot = ring[minute.rem_euclid(MINUTES as i64) as usize];
                if slot.minute == minute {
                    slot
                } else {
                    Minute {
                        minute,
                        ..Minute::default()
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, state: &'static str, at_ms: i64, waited_ms: Option<i64>) -> JobEvent {
        JobEvent {
            kind,
            job_id: 1,
            name: "A".into(),
            state,
            at: Timestamp(at_ms),
            attempt: 1,
            detail: serde_json::Map::new(),
            waited_ms,
        }
    }

    #[test]
    fn minutes_count_their_own_events_and_forget_an_hour_later() {
        let minutes = Minutes::default();
        let base = 1_000 * 60_000;
        minutes.record(&[
            event(EventKind::HandedOut, "RUNNING", base, Some(2_000)),
            event(EventKind::HandedOut, "RUNNING", base + 1, Some(4_000)),
            event(EventKind::Finished, "FINISHED", base + 2, None),
            event(EventKind::Failed, "FAILED", base + 60_000, None),
            event(EventKind::Lapsed, "FAILED", base + 60_001, None),
            event(EventKind::Lapsed, "QUEUED", base + 60_002, None),
            event(EventKind::Created, "QUEUED", base + 60_003, None),
        ]);
        let hour = minutes.last_hour(Timestamp(base + 60_000));
        assert_eq!(hour.len(), MINUTES);
        let (first, last) = (hour[MINUTES - 2], hour[MINUTES - 1]);
        assert_eq!((first.finished, first.failed, first.handed_out), (1, 0, 2));
        assert_eq!(first.mean_wait_secs(), Some(3.0));
        assert_eq!((last.finished, last.failed, last.handed_out), (0, 2, 0));
        assert_eq!(last.mean_wait_secs(), None);
        assert!(
            hour[..MINUTES - 2]
                .iter()
                .all(|m| m.finished + m.failed == 0)
        );

        // An hour on, the slot is reused and the old counts are gone.
        let later = base + 60 * 60_000;
        minutes.record(&[event(EventKind::Finished, "FINISHED", later, None)]);
        let hour = minutes.last_hour(Timestamp(later + 60_000));
        assert_eq!(hour[MINUTES - 2].finished, 1);
        assert_eq!(hour.iter().map(|m| m.finished + m.failed).sum::<u64>(), 1);
        // An event older than its slot's minute is not counted.
        minutes.record(&[event(EventKind::Finished, "FINISHED", base, None)]);
        let hour = minutes.last_hour(Timestamp(later));
        assert_eq!(hour.iter().map(|m| m.finished).sum::<u64>(), 1);
    }
}
