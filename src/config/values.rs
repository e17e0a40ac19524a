//! Value types shared by command-line flags and configuration files:
//! durations (`30s`, `5m`), byte sizes (`128MiB`), `NAME=VALUE` pairs, and
//! the kind of worker.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as `250ms`, `30s`, `5m`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s.trim())
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration ({e}); write e.g. 30s, 5m, 1h"))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// A size in bytes, written as `65536`, `64KiB`, `128MiB`, `1GiB` (or
/// `KB`/`MB`/`GB`, taken as powers of 1024 too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let bad = || format!("{s:?} is not a size; write e.g. 65536, 64KiB, 128MiB, 1GiB");
        let number: u64 = number.parse().map_err(|_| bad())?;
        let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        number.checked_mul(factor).map(ByteSize).ok_or_else(bad)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(ByteSize(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n >= 1 << 30 && n % (1 << 30) == 0 {
            write!(f, "{}GiB", n >> 30)
        } else if n >= 1 << 20 && n % (1 << 20) == 0 {
            write!(f, "{}MiB", n >> 20)
        } else if n >= 1 << 10 && n % (1 << 10) == 0 {
            write!(f, "{}KiB", n >> 10)
        } else {
            write!(f, "{n}")
        }
    }
}

/// An environment variable for workers, `NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPair(pub String, pub String);

impl FromStr for EnvPair {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
        check_env_name(name)?;
        Ok(EnvPair(name.to_string(), value.to_string()))
    }
}

/// Checks an environment variable name: letters, digits and `_`, not
/// starting with a digit.
pub fn check_env_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not an environment variable name"))
    }
}

/// Reads a TOML table of `NAME = "VALUE"` as pairs.
pub fn env_table<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<EnvPair>>, D::Error> {
    let table = std::collections::BTreeMap::<String, String>::deserialize(d)?;
    table
        .into_iter()
        .map(|(name, value)| check_env_name(&name).map(|()| EnvPair(name, value)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(serde::de::Error::custom)
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Reads the job server: one URL (a string, which may list several
/// separated by commas), or an array of URLs of servers sharing a store,
/// kept as one comma-separated string.
pub fn server_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(Some(
        match OneOrMany::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a URL, or an array of URLs of servers that share a store",
            )
        })? {
            OneOrMany::One(url) => url,
            OneOrMany::Many(urls) => urls.join(","),
        },
    ))
}

/// A pressure threshold: a percentage above 0 and at most 100, or `off`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold(pub Option<f64>);

impl FromStr for Threshold {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim().trim_end_matches('%');
        if text.eq_ignore_ascii_case("off") {
            return Ok(Threshold(None));
        }
        text.parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && *p > 0.0 && *p <= 100.0)
            .map(|p| Threshold(Some(p)))
            .ok_or_else(|| {
                format!("{s:?} is not a pressure threshold; write a percentage above 0 and at most 100 (e.g. 10), or off")
            })
    }
}

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Number(n) => n.to_string(),
            Raw::Text(t) => t,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Threshold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(p) => s.serialize_f64(p),
            None => s.serialize_str("off"),
        }
    }
}

/// Reads a list of strings: one string (which may list several separated
/// by commas) or an array.
pub fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let list = match OneOrMany::deserialize(d)
        .map_err(|_| serde::de::Error::custom("expected a string, or an array of strings"))?
    {
        OneOrMany::One(text) => text.split(',').map(|s| s.trim().to_string()).collect(),
        OneOrMany::Many(items) => items,
    };
    Ok(Some(list))
}

/// Writes pairs as a TOML table of `NAME = "VALUE"`.
pub fn env_table_out<S: Serializer>(pairs: &Option<Vec<EnvPair>>, s: S) -> Result<S::Ok, S::Error> {
    let table: std::collections::BTreeMap<&str, &str> = pairs
        .iter()
        .flatten()
        .map(|p| (p.0.as_str(), p.1.as_str()))
        .collect();
    table.serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!("128MiB".parse::<ByteSize>(), Ok(ByteSize(128 << 20)));
        assert_eq!("64 KiB".parse::<ByteSize>(), Ok(ByteSize(64 << 10)));
        assert_eq!("100".parse::<ByteSize>(), Ok(ByteSize(100)));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("-1".parse::<ByteSize>().is_err());
        assert_eq!(
            "1m 30s".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(90)
        );
        assert!("soon".parse::<HumanDuration>().is_err());
        assert_eq!(ByteSize(128 << 20).to_string(), "128MiB");
    }

    #[test]
    fn thresholds_are_percentages_or_off() {
        assert_eq!("10".parse::<Threshold>(), Ok(Threshold(Some(10.0))));
        assert_eq!("2.5%".parse::<Threshold>(), Ok(Threshold(Some(2.5))));
        assert_eq!("100".parse::<Threshold>(), Ok(Threshold(Some(100.0))));
        assert_eq!("off".parse::<Threshold>(), Ok(Threshold(None)));
        assert_eq!("OFF".parse::<Threshold>(), Ok(Threshold(None)));
        for bad in ["120", "0", "-5", "abc", "", "NaN", "inf"] {
            let error = bad.parse::<Threshold>().unwrap_err();
            assert!(
                error.contains("at most 100") && error.contains("off"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn env_pairs_are_checked() {
        assert_eq!(
            "A_1=x=y".parse::<EnvPair>(),
            Ok(EnvPair("A_1".into(), "x=y".into()))
        );
        assert!("1A=x".parse::<EnvPair>().is_err());
        assert!("NOVALUE".parse::<EnvPair>().is_err());
        assert!("A-B=1".parse::<EnvPair>().is_err());
    }
}

/// What a worker is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum WorkerKind {
    /// An executable named after the job, in the worker path.
    #[default]
    Exec,
    /// A BedrockWorkerManager PHP class: `NAME.php` in the worker path,
    /// run by jobmgr's PHP runner.
    BwmPhp,
}

impl fmt::Display for WorkerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkerKind::Exec => "exec",
            WorkerKind::BwmPhp => "bwm-php",
        })
    }
}
