//! How per-supervisor statistics per hour are counted, LaterJob's worker
//! metrics: the runs a supervisor reported and their executing time, the
//! time its runs kept it busy, the capacity it offered while it was heard
//! from (worker slots × time); its utilisation, busy time over capacity, is
//! read off the row ([`crate::server::records::WorkerStatsRow`]).
//!
//! Both capacity and busy time count from one sighting of a supervisor to
//! the next when the two are no further apart than `--worker-gone-after`; a
//! gap longer than that is time it was gone, and counts as neither. A run
//! keeps its supervisor busy from its hand-out until its report, or, when it
//! ended without one (a lapsed lease, a deleted job, a report without its
//! lease), until the supervisor was last heard from.

use std::collections::BTreeMap;

use super::{HOUR_MS, hour_of};
use crate::protocol::Timestamp;
use crate::server::records::WorkerDelta;

/// The most hours one span is spread over (about 14 months): a span longer
/// than that (a clock that jumped, a run held for a year) counts only its
/// latest hours, which is all statistics keep anyway.
pub const MAX_SPAN_HOURS: i64 = 10_000;

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

/// What a supervisor's time from its sighting at `last_seen` until
/// `until` adds to its hours, clipped to `[window_from, window_to)`: its
/// `capacity` slots offered, and busy time for each run it holds (given by
/// when the run started). Both the ledger's writes at each sighting and the
/// live additions of a query count time this way.
pub fn heard_span(
    (last_seen, until): (Timestamp, Timestamp),
    capacity: u32,
    runs: impl IntoIterator<Item = Timestamp>,
    (window_from, window_to): (Timestamp, Timestamp),
) -> BTreeMap<i64, WorkerDelta> {
    let clip = |from: Timestamp| by_hour(from.max(window_from), until.min(window_to));
    let mut hours: BTreeMap<i64, WorkerDelta> = BTreeMap::new();
    for (hour, ms) in clip(last_seen) {
        hours.entry(hour).or_default().capacity_ms = ms.saturating_mul(i64::from(capacity));
    }
    for started in runs {
        for (hour, ms) in clip(started.max(last_seen)) {
            let delta = hours.entry(hour).or_default();
            delta.busy_ms = delta.busy_ms.saturating_add(ms);
        }
    }
    hours
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::records::WorkerStatsRow;

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
        let window = (at("2026-01-01"), at("2026-01-02"));
        // Heard from 10:30 to 11:30 with 2 slots, one run from 10:00 on
        // (busy only from the sighting) and one from 11:15.
        let hours = heard_span(
            (at("2026-01-01 10:30:00"), at("2026-01-01 11:30:00")),
            2,
            [at("2026-01-01 10:00:00"), at("2026-01-01 11:15:00")],
            window,
        );
        let mut ten = WorkerStatsRow::default();
        ten.add(&hours[&at("2026-01-01 10:00:00").0]);
        assert_eq!((ten.busy_ms, ten.capacity_ms), (1_800_000, 3_600_000));
        assert_eq!(ten.utilisation(), Some(0.5));
        assert_eq!(ten.to_json()["busySecs"], 1800.0);
        let eleven = hours[&at("2026-01-01 11:00:00").0];
        assert_eq!((eleven.busy_ms, eleven.capacity_ms), (2_700_000, 3_600_000));
        // Outside the window counts nothing.
        let outside = heard_span(
            (at("2025-12-31 23:00:00"), at("2026-01-01 00:00:00")),
            1,
            [at("2025-12-31 23:00:00")],
            window,
        );
        assert!(outside.is_empty(), "{outside:?}");
        assert_eq!(WorkerStatsRow::default().utilisation(), None);
    }
}
