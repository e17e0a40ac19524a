//! Per-supervisor statistics per hour, LaterJob's worker metrics: the runs
//! a supervisor reported and their executing time, the time its runs kept
//! it busy, the capacity it offered while it was heard from (worker slots ×
//! time), and its utilisation, busy time over capacity.
//!
//! Both capacity and busy time count from one sighting of a supervisor to
//! the next when the two are no further apart than `--worker-gone-after`; a
//! gap longer than that is time it was gone, and counts as neither. A run
//! keeps its supervisor busy from its hand-out until its report, or, when it
//! ended without one (a lapsed lease, a deleted job, a report without its
//! lease), until the supervisor was last heard from.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{HOUR_MS, Summary, hour_of};
use crate::protocol::Timestamp;

/// The most hours one span is spread over (about 14 months): a span longer
/// than that (a clock that jumped, a run held for a year) counts only its
/// latest hours, which is all statistics keep anyway.
pub const MAX_SPAN_HOURS: i64 = 10_000;

/// What one event adds to a supervisor's hour.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerDelta {
    /// A reported run's executing time, in ms.
    pub run_ms: Option<i64>,
    /// Busy time, in ms (slot-milliseconds).
    pub busy_ms: i64,
    /// Capacity offered, in ms (slot-milliseconds).
    pub capacity_ms: i64,
}

/// An hour (or a longer period) of one supervisor's statistics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerStatsRow {
    /// The supervisor's id (`HOST-PID`, `HOST-PID/POOL`).
    pub worker: String,
    /// The period's start, in ms.
    pub hour: i64,
    /// Executing times of the runs it reported.
    pub run: Summary,
    /// Busy slot-milliseconds.
    pub busy_ms: i64,
    /// Offered slot-milliseconds.
    pub capacity_ms: i64,
}

impl WorkerStatsRow {
    /// Adds another row's figures (for longer periods, or live additions).
    pub fn merge(&mut self, other: &WorkerStatsRow) {
        self.run.merge(&other.run);
        self.add(&WorkerDelta {
            run_ms: None,
            busy_ms: other.busy_ms,
            capacity_ms: other.capacity_ms,
        });
    }

    /// Adds one event.
    pub fn add(&mut self, delta: &WorkerDelta) {
        if let Some(ms) = delta.run_ms {
            self.run.add(ms.max(0) as f64);
        }
        self.busy_ms = self.busy_ms.saturating_add(delta.busy_ms.max(0));
        self.capacity_ms = self.capacity_ms.saturating_add(delta.capacity_ms.max(0));
    }

    /// Busy time over capacity; `None` when no capacity was offered.
    pub fn utilisation(&self) -> Option<f64> {
        (self.capacity_ms > 0).then(|| self.busy_ms as f64 / self.capacity_ms as f64)
    }

    /// The row as one point of a chart series (`time` is the period's start).
    pub fn to_json(&self) -> Value {
        json!({
            "time": Timestamp(self.hour).to_string(),
            "jobs": self.run.count,
            "run": self.run.to_json_secs(),
            "busySecs": self.busy_ms as f64 / 1000.0,
            "capacitySecs": self.capacity_ms as f64 / 1000.0,
            "utilisation": self.utilisation(),
        })
    }
}

/// The hours `[from, to)` covers, each with the milliseconds of the span
/// that fall in it, earliest first; at most [`MAX_SPAN_HOURS`] of them.
pub fn by_hour(from: Timestamp, to: Timestamp) -> impl Iterator<Item = (i64, i64)> {
    let end = to.0;
    let start = from
        .0
        .max(hour_of(to).saturating_sub((MAX_SPAN_HOURS - 1).saturating_mul(HOUR_MS)));
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let hour = hour_of(Timestamp(at));
        let next = hour.saturating_add(HOUR_MS).min(end);
        let item = (hour, next - at);
        at = next;
        Some(item)
    })
}

/// Hourly rows keyed by supervisor and hour, to which live spans (runs
/// still going, capacity since the last sighting) are added at query time.
#[derive(Debug, Default)]
pub struct WorkerHours(pub BTreeMap<(String, i64), WorkerStatsRow>);

impl WorkerHours {
    /// Adds `slots` × the part of `[from, to)` inside `[window_from,
    /// window_to)` to a supervisor's busy time (`busy`) or capacity.
    pub fn spread(
        &mut self,
        worker: &str,
        (from, to): (Timestamp, Timestamp),
        (window_from, window_to): (Timestamp, Timestamp),
        slots: i64,
        busy: bool,
    ) {
        let (from, to) = (from.max(window_from), to.min(window_to));
        for (hour, ms) in by_hour(from, to) {
            let row = self
                .0
                .entry((worker.to_string(), hour))
                .or_insert_with(|| WorkerStatsRow {
                    worker: worker.to_string(),
                    hour,
                    ..WorkerStatsRow::default()
                });
            let amount = ms.saturating_mul(slots);
            row.add(&if busy {
                WorkerDelta {
                    busy_ms: amount,
                    ..WorkerDelta::default()
                }
            } else {
                WorkerDelta {
                    capacity_ms: amount,
                    ..WorkerDelta::default()
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap()
    }

    #[test]
    fn a_span_is_split_at_each_hour() {
        let hours: Vec<(i64, i64)> =
            by_hour(at("2026-01-01 10:59:30"), at("2026-01-01 12:00:10")).collect();
        assert_eq!(
            hours,
            [
                (at("2026-01-01 10:00:00").0, 30_000),
                (at("2026-01-01 11:00:00").0, HOUR_MS),
                (at("2026-01-01 12:00:00").0, 10_000),
            ]
        );
        assert_eq!(
            by_hour(at("2026-01-01 10:00:00"), at("2026-01-01 10:00:00")).count(),
            0
        );
        assert_eq!(
            by_hour(at("2026-01-01 11:00:00"), at("2026-01-01 10:00:00")).count(),
            0
        );
    }

    #[test]
    fn a_very_long_span_counts_only_its_latest_hours() {
        let hours: Vec<(i64, i64)> = by_hour(at("1990-01-01"), at("2026-01-01 00:30:00")).collect();
        assert_eq!(hours.len() as i64, MAX_SPAN_HOURS);
        assert_eq!(hours.last(), Some(&(at("2026-01-01").0, 1_800_000)));
        assert!(hours.iter().all(|&(_, ms)| (0..=HOUR_MS).contains(&ms)));
    }

    #[test]
    fn utilisation_is_busy_over_capacity() {
        let mut hours = WorkerHours::default();
        let window = (at("2026-01-01"), at("2026-01-02"));
        let span = (at("2026-01-01 10:30:00"), at("2026-01-01 11:30:00"));
        hours.spread("w", span, window, 2, false);
        hours.spread("w", span, window, 1, true);
        let row = &hours.0[&("w".to_string(), at("2026-01-01 10:00:00").0)];
        assert_eq!((row.busy_ms, row.capacity_ms), (1_800_000, 3_600_000));
        assert_eq!(row.utilisation(), Some(0.5));
        assert_eq!(row.to_json()["busySecs"], 1800.0);
        // Outside the window counts nothing.
        hours.spread("w", (at("2025-12-31"), at("2026-01-01")), window, 1, true);
        assert_eq!(hours.0.len(), 2);
        assert_eq!(WorkerStatsRow::default().utilisation(), None);
    }
}
