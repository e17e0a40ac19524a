//! Timestamps as Bedrock writes them: UTC, `YYYY-MM-DD HH:MM:SS[.mmm]`,
//! held as milliseconds since the Unix epoch.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use std::fmt;

/// A point in time, in milliseconds since 1970-01-01 00:00:00 UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The first time the server takes: 0000-01-01 00:00:00, the start of
    /// the `YYYY-MM-DD HH:MM:SS` form and of SQLite's calendar.
    pub const EARLIEST: Timestamp = Timestamp(-62_167_219_200_000);

    /// The last time the server takes: 9999-12-31 23:59:59.999, the end of
    /// the `YYYY-MM-DD HH:MM:SS` form and of SQLite's calendar.
    pub const LATEST: Timestamp = Timestamp(253_402_300_799_999);

    /// The current wall-clock time.
    pub fn now() -> Self {
        Timestamp(Utc::now().timestamp_millis())
    }

    /// Milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// This time truncated to the whole second, as Bedrock stores `created`
    /// and `lastRun` (saturating at the start of `i64`, like
    /// [`Timestamp::plus_millis`]).
    pub fn whole_second(self) -> Self {
        Timestamp(self.0.div_euclid(1000).saturating_mul(1000))
    }

    /// This time moved by `ms` milliseconds, saturating at the ends of `i64`.
    pub fn plus_millis(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Parses the date forms Bedrock accepts for `firstRun` and `nextRun`:
    /// `YYYY-MM-DD`, `YYYY-MM-DD HH:MM:SS`, `YYYY-MM-DD HH:MM:SS.fff`, and the
    /// ISO 8601 spellings with `T` and an optional `Z`. All are UTC, and
    /// from [`Timestamp::EARLIEST`] to [`Timestamp::LATEST`] (chrono would
    /// also read `+10000-01-01` or `-0001-01-01`, which cannot be written
    /// back in the same form).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_suffix('Z').unwrap_or(text);
        let parsed = if text.len() == 10 {
            let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
            Some(Self::from_naive(date.and_hms_opt(0, 0, 0)?))
        } else {
            ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"]
                .iter()
                .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
                .map(Self::from_naive)
        };
        parsed.filter(|t| (Self::EARLIEST..=Self::LATEST).contains(t))
    }

    fn from_naive(naive: NaiveDateTime) -> Self {
        Timestamp(naive.and_utc().timestamp_millis())
    }

    /// The time to the second, `YYYY-MM-DD HH:MM:SS`, the form SQLite's
    /// `datetime()` reads and writes.
    pub fn to_sqlite_seconds(self) -> String {
        self.datetime().format("%Y-%m-%d %H:%M:%S").to_string()
    }

    fn datetime(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dt = self.datetime();
        if self.0.rem_euclid(1000) == 0 {
            write!(f, "{}", dt.format("%Y-%m-%d %H:%M:%S"))
        } else {
            write!(f, "{}", dt.format("%Y-%m-%d %H:%M:%S%.3f"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_bedrock_forms() {
        let t = Timestamp::parse("2016-10-18 18:45:19").unwrap();
        assert_eq!(t.to_string(), "2016-10-18 18:45:19");
        let t = Timestamp::parse("2016-10-18 18:45:19.250").unwrap();
        assert_eq!(t.to_string(), "2016-10-18 18:45:19.250");
        assert_eq!(t.whole_second().to_string(), "2016-10-18 18:45:19");
        let t = Timestamp::parse("2016-10-18").unwrap();
        assert_eq!(t.to_string(), "2016-10-18 00:00:00");
        let t = Timestamp::parse("2016-10-18T18:45:19Z").unwrap();
        assert_eq!(t.to_string(), "2016-10-18 18:45:19");
    }

    #[test]
    fn times_are_read_within_years_0000_to_9999() {
        assert_eq!(Timestamp::LATEST.to_string(), "9999-12-31 23:59:59.999");
        assert_eq!(
            Timestamp::parse("9999-12-31 23:59:59.999"),
            Some(Timestamp::LATEST)
        );
        assert_eq!(Timestamp::EARLIEST.to_string(), "0000-01-01 00:00:00");
        assert_eq!(Timestamp::parse("0000-01-01"), Some(Timestamp::EARLIEST));
        // Found while checking schemathesis' answers: these were taken and
        // then written as "+10000-01-01 00:00:00" and "-0001-01-01 00:00:00".
        for outside in [
            "+10000-01-01 00:00:00",
            "-0001-01-01 00:00:00",
            "+10000-01-01T00:00:00Z",
        ] {
            assert_eq!(Timestamp::parse(outside), None, "{outside}");
        }
    }

    #[test]
    fn whole_seconds_at_the_ends_of_time_do_not_overflow() {
        // Found by fuzz/fuzz_targets/repeat.rs.
        assert_eq!(Timestamp(i64::MIN).whole_second(), Timestamp(i64::MIN));
        assert_eq!(
            Timestamp(i64::MAX).whole_second(),
            Timestamp(i64::MAX / 1000 * 1000)
        );
        assert_eq!(Timestamp(-1).whole_second(), Timestamp(-1000));
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            "",
            "tomorrow",
            "2016-13-01",
            "2016-10-18 25:00:00",
            "2016-10-18 18:45",
            "1;DROP",
        ] {
            assert_eq!(Timestamp::parse(bad), None, "{bad:?}");
        }
    }
}
