//! Calendar arithmetic for repeats and `retryAfter`, done by SQLite's own
//! `datetime()` on a private in-memory connection, so that every store agrees
//! with SQLite to the second. `START OF HOUR`, which SQLite lacks, is
//! `strftime('%Y-%m-%d %H:00:00', …)`. A `SCHEDULED` repeat that fell
//! behind (an outage) is re-anchored to its next slot after now, as today's
//! Bedrock does, so that a fleet of jobs keeps its stagger.

use std::cell::RefCell;

use rusqlite::Connection;

use crate::protocol::repeat::{Period, Unit};
use crate::protocol::{Modifier, Repeat, RepeatBase, Timestamp};

/// A `SCHEDULED` repeat is re-anchored after a missed window only if its
/// interval is shorter than this (4 hours): longer ones may be bound to a
/// calendar date, and keep their computed time.
pub const REANCHOR_BELOW_SECS: i64 = 4 * 60 * 60;

thread_local! {
    static CALENDAR: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

/// Applies `modifiers` in order to `base` (truncated to the second, as
/// SQLite's `datetime()` does). `None` when SQLite finds no such time (out of
/// its range).
pub fn apply(base: Timestamp, modifiers: &[Modifier]) -> Option<Timestamp> {
    CALENDAR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Connection::open_in_memory().ok()?);
        }
        let conn = slot.as_ref()?;
        let mut current = base.to_sqlite_seconds();
        let mut pending: Vec<String> = Vec::new();
        for modifier in modifiers {
            if *modifier == Modifier::StartOf(Period::Hour) {
                current = datetime(conn, &current, &pending)?;
                pending.clear();
                current = conn
                    .query_row(
                        "SELECT strftime('%Y-%m-%d %H:00:00', ?1)",
                        [&current],
                        |row| row.get::<_, Option<String>>(0),
                    )
                    .ok()??;
            } else {
                pending.push(modifier.to_string());
            }
        }
        let result = datetime(conn, &current, &pending)?;
        Timestamp::parse(&result)
    })
}

/// `datetime(value, m1, m2, …)`; SQLite takes any number of modifiers.
fn datetime(conn: &Connection, value: &str, modifiers: &[String]) -> Option<String> {
    if modifiers.is_empty() {
        return Some(value.to_string());
    }
    let placeholders: Vec<String> = (2..=modifiers.len() + 1).map(|i| format!("?{i}")).collect();
    let sql = format!("SELECT datetime(?1, {})", placeholders.join(", "));
    let mut statement = conn.prepare_cached(&sql).ok()?;
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&value];
    params.extend(modifiers.iter().map(|m| m as &dyn rusqlite::ToSql));
    statement
        .query_row(params.as_slice(), |row| row.get::<_, Option<String>>(0))
        .ok()?
}

/// The next run of a repeating job: [`computed_run`], re-anchored when a
/// `SCHEDULED` repeat has fallen behind (see [`reanchor`]).
pub fn next_run(
    repeat: &Repeat,
    scheduled: Timestamp,
    started: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let computed = computed_run(repeat, scheduled, started, now)?;
    Some(match repeat.base {
        RepeatBase::Scheduled => reanchor(repeat, scheduled, computed, now),
        RepeatBase::Started | RepeatBase::Finished => computed,
    })
}

/// The repeat's modifiers applied to its base, which is `scheduled` (when
/// the run was due), `started` (when it was handed out; `now` if never) or
/// `now` (when it finished), exactly as SQLite computes them.
pub fn computed_run(
    repeat: &Repeat,
    scheduled: Timestamp,
    started: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let base = match repeat.base {
        RepeatBase::Scheduled => scheduled,
        RepeatBase::Started => started.unwrap_or(now),
        RepeatBase::Finished => now,
    };
    apply(base, &repeat.modifiers)
}

/// Bedrock's re-anchoring of a `SCHEDULED` repeat whose `computed` next run
/// is at or before `now`: when its interval (`computed` minus `previous`,
/// the run it counts from) is positive and under [`REANCHOR_BELOW_SECS`],
/// and every modifier is a fixed offset (`+N …` or `-N …`), the next run is
/// `previous + (floor(secondsBehind / interval) + 1) × interval`, the first
/// slot after now on the original phase. Otherwise `computed` stands, even
/// in the past. Seconds are whole, as SQLite's `strftime('%s')` counts them.
pub fn reanchor(
    repeat: &Repeat,
    previous: Timestamp,
    computed: Timestamp,
    now: Timestamp,
) -> Timestamp {
    let secs = |t: Timestamp| t.0.div_euclid(1000);
    let interval = secs(computed) - secs(previous);
    let fixed = repeat
        .modifiers
        .iter()
        .all(|m| matches!(m, Modifier::Shift { .. }));
    if computed > now || !fixed || interval <= 0 || interval >= REANCHOR_BELOW_SECS {
        return computed;
    }
    let behind = secs(now) - secs(previous);
    let skip = Modifier::Shift {
        amount: (behind.div_euclid(interval) + 1) * interval,
        unit: Unit::Second,
    };
    apply(previous, &[skip]).unwrap_or(computed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap()
    }

    #[test]
    fn the_seed_bases_differ_as_documented() {
        // Scheduled at 1:00pm, started 1:15pm, took 30 minutes.
        let scheduled = t("2024-05-01 13:00:00");
        let started = t("2024-05-01 13:15:00");
        let finished = t("2024-05-01 13:45:00");
        let hour = |base| Repeat::parse(&format!("{base}, +1 HOUR")).unwrap();
        assert_eq!(
            next_run(&hour("SCHEDULED"), scheduled, Some(started), finished),
            Some(t("2024-05-01 14:00:00"))
        );
        assert_eq!(
            next_run(&hour("STARTED"), scheduled, Some(started), finished),
            Some(t("2024-05-01 14:15:00"))
        );
        assert_eq!(
            next_run(&hour("FINISHED"), scheduled, Some(started), finished),
            Some(t("2024-05-01 14:45:00"))
        );
    }

    #[test]
    fn seed_examples_land_where_the_seed_says() {
        let now = t("2024-05-01 13:45:12"); // a Wednesday
        let daily4am = Repeat::parse("FINISHED, +1 DAY, START OF DAY, +4 HOURS").unwrap();
        assert_eq!(
            next_run(&daily4am, now, None, now),
            Some(t("2024-05-02 04:00:00"))
        );
        let monday6am =
            Repeat::parse("FINISHED, +1 DAY, WEEKDAY 1, START OF DAY, +6 HOURS").unwrap();
        assert_eq!(
            next_run(&monday6am, now, None, now),
            Some(t("2024-05-06 06:00:00"))
        );
        let top_of_hour = Repeat::parse("FINISHED, +1 HOUR, START OF HOUR").unwrap();
        assert_eq!(
            next_run(&top_of_hour, now, None, now),
            Some(t("2024-05-01 14:00:00"))
        );
    }

    #[test]
    fn month_arithmetic_is_sqlites() {
        // SQLite normalises 2024-01-31 +1 month to 2024-03-02.
        let jan31 = t("2024-01-31 10:00:00");
        let monthly = Repeat::parse("SCHEDULED, +1 MONTH").unwrap();
        assert_eq!(
            next_run(&monthly, jan31, None, jan31),
            Some(t("2024-03-02 10:00:00"))
        );
    }

    #[test]
    fn a_scheduled_repeat_that_fell_behind_lands_on_its_next_slot_after_now() {
        // Every 5 minutes, phase :01:30; the server was down for 47 minutes.
        let every5 = Repeat::parse("SCHEDULED, +5 MINUTES").unwrap();
        let previous = t("2026-03-01 10:01:30");
        let now = t("2026-03-01 10:48:10.250");
        assert_eq!(
            next_run(&every5, previous, None, now),
            Some(t("2026-03-01 10:51:30"))
        );
        // Exactly on a slot: the next one, never now itself.
        assert_eq!(
            next_run(&every5, previous, None, t("2026-03-01 10:46:30")),
            Some(t("2026-03-01 10:51:30"))
        );
        // Not behind: the computed time.
        assert_eq!(
            next_run(&every5, previous, None, t("2026-03-01 10:03:00")),
            Some(t("2026-03-01 10:06:30"))
        );
        // Several fixed offsets make one interval.
        let mixed = Repeat::parse("SCHEDULED, +1 HOUR, -20 MINUTES").unwrap();
        assert_eq!(
            next_run(&mixed, previous, None, now),
            Some(t("2026-03-01 11:21:30"))
        );
    }

    #[test]
    fn long_snapping_and_backward_repeats_keep_their_computed_time() {
        let previous = t("2026-03-01 10:01:30");
        let now = t("2026-03-03 00:00:00");
        for (repeat, computed) in [
            ("SCHEDULED, +4 HOURS", "2026-03-01 14:01:30"),
            ("SCHEDULED, +14400 SECONDS", "2026-03-01 14:01:30"),
            ("SCHEDULED, +1 DAY", "2026-03-02 10:01:30"),
            ("SCHEDULED, +1 HOUR, START OF HOUR", "2026-03-01 11:00:00"),
            ("SCHEDULED, +1 MINUTE, WEEKDAY 0", "2026-03-01 10:02:30"),
            ("SCHEDULED, -5 MINUTES", "2026-03-01 09:56:30"),
        ] {
            let parsed = Repeat::parse(repeat).unwrap();
            assert_eq!(
                next_run(&parsed, previous, None, now),
                Some(t(computed)),
                "{repeat}"
            );
        }
        // Just under 4 hours is re-anchored.
        let under = Repeat::parse("SCHEDULED, +14399 SECONDS").unwrap();
        assert!(next_run(&under, previous, None, now).unwrap() > now);
        // Other bases are never re-anchored.
        let finished = Repeat::parse("STARTED, +5 MINUTES").unwrap();
        assert_eq!(
            next_run(&finished, previous, Some(previous), now),
            Some(t("2026-03-01 10:06:30"))
        );
    }

    #[test]
    fn out_of_range_is_none() {
        let late = t("9999-12-31 00:00:00");
        assert_eq!(apply(late, &[Modifier::parse("+10 YEARS").unwrap()]), None);
    }
}
