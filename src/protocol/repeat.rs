//! Repeat descriptions (`FINISHED, +1 DAY, START OF DAY, +4 HOURS`) and the
//! SQLite date modifiers they are made of. This module only reads and checks
//! the syntax; the calendar arithmetic is SQLite's own, done by the server's
//! calendar.

use std::fmt;

use super::JobError;

/// The moment a repeat counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepeatBase {
    /// From the time the run was scheduled for, whenever it actually ran.
    Scheduled,
    /// From the time the run started.
    Started,
    /// From the time the run finished.
    Finished,
}

/// A unit a modifier can shift by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Second,
    /// Minutes.
    Minute,
    /// Hours.
    Hour,
    /// Days.
    Day,
    /// Calendar months, with SQLite's overflow rules.
    Month,
    /// Calendar years.
    Year,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECONDS",
            Unit::Minute => "MINUTES",
            Unit::Hour => "HOURS",
            Unit::Day => "DAYS",
            Unit::Month => "MONTHS",
            Unit::Year => "YEARS",
        }
    }

    /// The most digits the amount may have: 8 for seconds, 3 otherwise.
    fn max_digits(self) -> usize {
        if self == Unit::Second { 8 } else { 3 }
    }
}

/// A period a `START OF` modifier rewinds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The start of the hour (not native to SQLite; done with `strftime`).
    Hour,
    /// Midnight.
    Day,
    /// The first of the month.
    Month,
    /// The first of January.
    Year,
}

/// One date modifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modifier {
    /// `+N UNIT` or `-N UNIT`.
    Shift {
        /// Signed amount.
        amount: i64,
        /// What it counts.
        unit: Unit,
    },
    /// `START OF HOUR|DAY|MONTH|YEAR`.
    StartOf(Period),
    /// `WEEKDAY N`: forward to the next day with this weekday, 0 = Sunday.
    Weekday(u8),
}

impl Modifier {
    /// Reads one modifier, case-insensitively. Spaces between words may be
    /// repeated, and a space after the sign is allowed (the seed writes
    /// `+ 1 HOUR`).
    pub fn parse(text: &str) -> Option<Self> {
        let upper = text.trim().to_ascii_uppercase();
        let words: Vec<&str> = upper.split_whitespace().collect();
        match words.as_slice() {
            ["START", "OF", period] => Some(Modifier::StartOf(match *period {
                "HOUR" => Period::Hour,
                "DAY" => Period::Day,
                "MONTH" => Period::Month,
                "YEAR" => Period::Year,
                _ => return None,
            })),
            ["WEEKDAY", day] => match day.as_bytes() {
                [d @ b'0'..=b'6'] => Some(Modifier::Weekday(d - b'0')),
                _ => None,
            },
            [sign, number, unit] if *sign == "+" || *sign == "-" => Self::shift(sign, number, unit),
            [signed_number, unit] => {
                if let Some(number) = signed_number.strip_prefix('+') {
                    Self::shift("+", number, unit)
                } else if let Some(number) = signed_number.strip_prefix('-') {
                    Self::shift("-", number, unit)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    fn shift(sign: &str, number: &str, unit: &str) -> Option<Self> {
        let negative = match sign {
            "+" => false,
            "-" => true,
            _ => return None,
        };
        let unit = match unit.strip_suffix('S').unwrap_or(unit) {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        };
        if number.is_empty()
            || number.len() > unit.max_digits()
            || !number.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let amount: i64 = number.parse().ok()?;
        Some(Modifier::Shift {
            amount: if negative { -amount } else { amount },
            unit,
        })
    }

    /// Parses a comma-separated list of modifiers, as `retryAfter` holds.
    pub fn parse_list(text: &str) -> Option<Vec<Self>> {
        let parts: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if parts.is_empty() {
            return None;
        }
        parts.into_iter().map(Modifier::parse).collect()
    }
}

impl fmt::Display for Modifier {
    /// The canonical spelling, which SQLite's `datetime()` accepts except for
    /// `START OF HOUR`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Modifier::Shift { amount, unit } => write!(f, "{amount:+} {}", unit.name()),
            Modifier::StartOf(period) => {
                let name = match period {
                    Period::Hour => "HOUR",
                    Period::Day => "DAY",
                    Period::Month => "MONTH",
                    Period::Year => "YEAR",
                };
                write!(f, "START OF {name}")
            }
            Modifier::Weekday(day) => write!(f, "WEEKDAY {day}"),
        }
    }
}

/// A parsed repeat description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    /// What the modifiers count from.
    pub base: RepeatBase,
    /// Applied in order to the base.
    pub modifiers: Vec<Modifier>,
    /// The description as stored: trimmed and upper-cased.
    pub text: String,
}

impl Repeat {
    /// Reads a repeat description. The canned `HOURLY`, `DAILY` and `WEEKLY`
    /// are `FINISHED, +1 HOUR`, `FINISHED, +1 DAY` and `FINISHED, +7 DAYS`, as
    /// the Bedrock::Jobs documentation defines them. Anything else is a base
    /// followed by one or more modifiers; otherwise `402 Malformed repeat`.
    pub fn parse(text: &str) -> Result<Self, JobError> {
        let stored = text.trim().to_ascii_uppercase();
        let canned = |amount, unit| Repeat {
            base: RepeatBase::Finished,
            modifiers: vec![Modifier::Shift { amount, unit }],
            text: stored.clone(),
        };
        match stored.as_str() {
            "HOURLY" => return Ok(canned(1, Unit::Hour)),
            "DAILY" => return Ok(canned(1, Unit::Day)),
            "WEEKLY" => return Ok(canned(7, Unit::Day)),
            _ => {}
        }
        let mut parts = stored.split(',').map(str::trim).filter(|p| !p.is_empty());
        let base = match parts.next() {
            Some("SCHEDULED") => RepeatBase::Scheduled,
            Some("STARTED") => RepeatBase::Started,
            Some("FINISHED") => RepeatBase::Finished,
            _ => return Err(JobError::MalformedRepeat),
        };
        let modifiers = parts
            .map(Modifier::parse)
            .collect::<Option<Vec<_>>>()
            .ok_or(JobError::MalformedRepeat)?;
        if modifiers.is_empty() || stored.len() > 1024 {
            return Err(JobError::MalformedRepeat);
        }
        Ok(Repeat {
            base,
            modifiers,
            text: stored,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_examples_parse() {
        for text in [
            "FINISHED, +1 HOUR",
            "SCHEDULED, +1 HOUR",
            "FINISHED, +1 DAY, START OF DAY, +4 HOURS",
            "FINISHED, +1 DAY, WEEKDAY 1, START OF DAY, +6 HOURS",
            "finished, +1 minute",
            "STARTED, -3 MONTHS, START OF MONTH",
            "SCHEDULED, +86400 SECONDS",
            "FINISHED, + 1 HOUR",
            "FINISHED, START OF HOUR",
        ] {
            let r = Repeat::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(r.text, text.to_ascii_uppercase());
        }
    }

    #[test]
    fn canned_repeats_follow_the_seed() {
        let hourly = Repeat::parse("hourly").unwrap();
        assert_eq!(hourly.base, RepeatBase::Finished);
        assert_eq!(
            hourly.modifiers,
            vec![Modifier::Shift {
                amount: 1,
                unit: Unit::Hour
            }]
        );
        assert_eq!(hourly.text, "HOURLY");
        let weekly = Repeat::parse("WEEKLY").unwrap();
        assert_eq!(
            weekly.modifiers,
            vec![Modifier::Shift {
                amount: 7,
                unit: Unit::Day
            }]
        );
    }

    #[test]
    fn malformed_repeats_are_refused() {
        for text in [
            "",
            "FINISHED",
            "SOMETIME, +1 HOUR",
            "FINISHED, +1 FORTNIGHT",
            "FINISHED, +1000 DAYS",
            "FINISHED, +123456789 SECONDS",
            "FINISHED, 1 HOUR",
            "FINISHED, WEEKDAY 7",
            "FINISHED, START OF WEEK",
            "FINISHED, +1 HOUR; DROP TABLE jobs",
            "FINISHED, +1.5 HOURS",
            "FINISHED, localtime",
            "FINISHED, é1 HOURS",
            "é",
            "FINISHED, €5 DAYS",
            "FINISHED, +1 HOUR,, ",
        ] {
            if text == "FINISHED, +1 HOUR,, " {
                // Empty items are skipped, as Bedrock's list parser does.
                assert!(Repeat::parse(text).is_ok());
                continue;
            }
            assert_eq!(
                Repeat::parse(text),
                Err(JobError::MalformedRepeat),
                "{text:?}"
            );
        }
    }

    #[test]
    fn modifiers_print_canonically() {
        assert_eq!(Modifier::parse("+ 1 hour").unwrap().to_string(), "+1 HOURS");
        assert_eq!(Modifier::parse("-2 days").unwrap().to_string(), "-2 DAYS");
        assert_eq!(
            Modifier::parse("weekday 0").unwrap().to_string(),
            "WEEKDAY 0"
        );
        assert_eq!(Modifier::parse_list("+5 MINUTES").unwrap().len(), 1);
        assert_eq!(Modifier::parse_list(""), None);
        assert_eq!(Modifier::parse_list("+5 MINUTES, bogus"), None);
        assert_eq!(Modifier::parse_list("é5 MINUTES"), None);
        assert_eq!(Modifier::parse("€"), None);
    }
}
