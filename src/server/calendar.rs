//! Calendar arithmetic for repeats and `retryAfter`, done by SQLite's own
//! `datetime()` on a private in-memory connection, so that every store agrees
//! with SQLite to the second. `START OF HOUR`, which SQLite lacks, is
//! `strftime('%Y-%m-%d %H:00:00', …)`.

use std::cell::RefCell;

use rusqlite::Connection;

use crate::protocol::repeat::Period;
use crate::protocol::{Modifier, Repeat, RepeatBase, Timestamp};

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

/// The next run of a repeating job: the repeat's modifiers applied to its
/// base, which is `scheduled` (when the run was due), `started` (when it was
/// handed out; `now` if never) or `now` (when it finished).
pub fn next_run(
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
    fn out_of_range_is_none() {
        let late = t("9999-12-31 00:00:00");
        assert_eq!(apply(late, &[Modifier::parse("+10 YEARS").unwrap()]), None);
    }
}
