//! Fuzzes repeat descriptions and their evaluation: `Repeat::parse`,
//! `RetryAfter::parse` and `Modifier::parse` (src/protocol), the timestamps
//! they count from (`Timestamp::parse`), and the server's calendar, which
//! evaluates them with SQLite's `datetime()` (`calendar::next_run`,
//! `calendar::apply`).
//!
//! The input is text: its first line is the time to count from (a Bedrock
//! timestamp, or milliseconds since the epoch; anything else means
//! 2024-05-01 13:45:12.345), the rest is the repeat (and, read again, the
//! `retryAfter`).
//!
//! Properties:
//! - nothing panics;
//! - a repeat that parses is stored trimmed and upper-cased, at most 1024
//!   bytes, with a base and at least one modifier;
//! - each modifier prints in a form that parses back to itself, and the
//!   printed repeat parses back to the same base and modifiers;
//! - a time that parses lies within years 0000 to 9999 and prints in a
//!   form that parses back to itself;
//! - a `retryAfter` parses exactly when every comma-separated item is a
//!   modifier (and it is at most 256 bytes);
//! - the next run from any time is a whole second, or nothing when SQLite
//!   finds no such time; it counts from the base the repeat names;
//! - the next run is the computed one, except a `SCHEDULED` repeat
//!   re-anchored after a missed window: then it is after now, on the
//!   schedule's phase;
//! - when the modifiers only shift by seconds, minutes, hours or days, and
//!   every step stays within years 1000 to 9000, the next run is the base
//!   to the second plus their sum: SQLite's arithmetic is exact there.
//!
//! Run (from fuzz/; new inputs go to the first directory, the seeds in
//! corpus/ stay as they are):
//! `cargo +nightly fuzz run repeat /tmp/repeat_corpus corpus/repeat -- -runs=3000000 -max_len=2048`

#![no_main]

use jobmgr::protocol::repeat::Unit;
use jobmgr::protocol::{Modifier, Repeat, RepeatBase, RetryAfter, Timestamp};
use jobmgr::server::calendar;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check(&String::from_utf8_lossy(data)));

/// 1000-01-01 and 9000-01-01, in milliseconds since the epoch.
const SAFE_FROM: i64 = -30_610_224_000_000;
const SAFE_TO: i64 = 221_845_392_000_000;

fn check(text: &str) {
    let (first, rest) = text.split_once('\n').unwrap_or(("", text));
    let from = Timestamp::parse(first)
        .or_else(|| first.trim().parse::<i64>().ok().map(Timestamp))
        .unwrap_or(Timestamp(1_714_571_112_345));
    if let Some(parsed) = Timestamp::parse(first) {
        // Only times the server can write back in the same form.
        assert!(
            (Timestamp::EARLIEST..=Timestamp::LATEST).contains(&parsed),
            "{first:?} read as {parsed:?}"
        );
        assert_eq!(
            Timestamp::parse(&parsed.to_string()),
            Some(parsed),
            "{first:?}"
        );
    }

    for item in rest.split(',') {
        if let Some(modifier) = Modifier::parse(item) {
            let printed = modifier.to_string();
            assert_eq!(
                Modifier::parse(&printed),
                Some(modifier),
                "{item:?} printed {printed:?}"
            );
        }
    }

    retry_after(rest, from);

    let Ok(repeat) = Repeat::parse(rest) else {
        return;
    };
    assert_eq!(repeat.text, rest.trim().to_ascii_uppercase());
    assert!(
        repeat.text.len() <= 1024,
        "{} bytes stored",
        repeat.text.len()
    );
    assert!(!repeat.modifiers.is_empty());
    let base = match repeat.base {
        RepeatBase::Scheduled => "SCHEDULED",
        RepeatBase::Started => "STARTED",
        RepeatBase::Finished => "FINISHED",
    };
    let printed: Vec<String> = std::iter::once(base.to_string())
        .chain(repeat.modifiers.iter().map(Modifier::to_string))
        .collect();
    let printed = printed.join(", ");
    if printed.len() <= 1024 {
        let again = Repeat::parse(&printed).unwrap_or_else(|e| panic!("{printed:?}: {e}"));
        assert_eq!(
            (again.base, &again.modifiers),
            (repeat.base, &repeat.modifiers),
            "{printed:?}"
        );
    }

    // Scheduled, started and finished at three different times.
    let scheduled = from;
    let started = from.plus_millis(61_000);
    let now = from.plus_millis(3_722_000);
    let computed = calendar::computed_run(&repeat, scheduled, Some(started), now);
    let counted_from = match repeat.base {
        RepeatBase::Scheduled => scheduled,
        RepeatBase::Started => started,
        RepeatBase::Finished => now,
    };
    assert_eq!(computed, calendar::apply(counted_from, &repeat.modifiers));
    if let Some(computed) = computed {
        assert_eq!(
            computed.0.rem_euclid(1000),
            0,
            "not a whole second: {computed:?}"
        );
    }
    if let Some(expected) = exact_sum(counted_from, &repeat.modifiers) {
        assert_eq!(computed, Some(expected), "{rest:?} from {counted_from}");
    }
    let next = calendar::next_run(&repeat, scheduled, Some(started), now);
    if let (Some(next), Some(computed)) = (next, computed)
        && next != computed
    {
        let interval = computed.0.div_euclid(1000) - scheduled.0.div_euclid(1000);
        assert_eq!(repeat.base, RepeatBase::Scheduled, "{rest:?}");
        assert!(
            computed <= now && next > now,
            "{rest:?}: {computed} to {next}"
        );
        assert!(0 < interval && interval < calendar::REANCHOR_BELOW_SECS);
        let moved = next.0.div_euclid(1000) - scheduled.0.div_euclid(1000);
        assert_eq!(moved.rem_euclid(interval), 0, "{rest:?}: off the phase");
    } else {
        assert_eq!(next, computed, "{rest:?}");
    }
}

fn retry_after(text: &str, from: Timestamp) {
    let trimmed = text.trim();
    let items: Vec<&str> = trimmed
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let each = !items.is_empty() && items.iter().all(|i| Modifier::parse(i).is_some());
    match RetryAfter::parse(text) {
        Ok(retry) => {
            assert!(each && trimmed.len() <= 256, "{text:?}");
            assert_eq!(retry.modifiers.len(), items.len());
            assert_eq!(retry.text, trimmed);
            if let Some(at) = calendar::apply(from, &retry.modifiers) {
                assert_eq!(at.0.rem_euclid(1000), 0, "not a whole second: {at:?}");
            }
        }
        Err(_) => assert!(!each || trimmed.len() > 256, "{text:?} refused"),
    }
}

/// The base to the second plus the shifts, when they are all exact units
/// and every step stays well inside SQLite's years.
fn exact_sum(base: Timestamp, modifiers: &[Modifier]) -> Option<Timestamp> {
    let mut at = base.whole_second().0;
    if !(SAFE_FROM..SAFE_TO).contains(&at) {
        return None;
    }
    for modifier in modifiers {
        let Modifier::Shift { amount, unit } = *modifier else {
            return None;
        };
        let seconds = match unit {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Month | Unit::Year => return None,
        };
        at = at.checked_add(amount.checked_mul(seconds * 1000)?)?;
        if !(SAFE_FROM..SAFE_TO).contains(&at) {
            return None;
        }
    }
    Some(Timestamp(at))
}
