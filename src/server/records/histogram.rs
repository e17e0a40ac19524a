//! Duration histograms at qless's resolution: one bucket per second for the
//! first minute, per minute for the first hour, per 15 minutes for the first
//! day, per hour for the first three days, then per day up to 30 days; the
//! last bucket holds everything longer. Stored sparse (only buckets with a
//! count), since most of the 286 buckets stay empty.

use std::collections::BTreeMap;

use serde_json::{Value, json};

const SECOND: i64 = 1;
const MINUTE: i64 = 60;
const HOUR: i64 = 3600;
const DAY: i64 = 86_400;

/// Bucket runs: (start, width, how many buckets), in seconds.
const RUNS: [(i64, i64, i64); 5] = [
    (0, SECOND, 60),
    (MINUTE, MINUTE, 59),
    (HOUR, 15 * MINUTE, 92),
    (DAY, HOUR, 48),
    (3 * DAY, DAY, 27),
];

/// How many buckets there are.
pub fn bucket_count() -> usize {
    RUNS.iter().map(|r| r.2 as usize).sum()
}

/// The bucket of a duration in milliseconds (negative counts as zero).
pub fn bucket(ms: i64) -> usize {
    let secs = ms.max(0) / 1000;
    let mut index = 0usize;
    for (start, width, count) in RUNS {
        if secs < start + width * count {
            return index + ((secs - start) / width) as usize;
        }
        index += count as usize;
    }
    bucket_count() - 1
}

/// The bounds of a bucket in seconds: `[from, to)`, `to` = `None` for the
/// open-ended last one.
pub fn bounds(bucket: usize) -> (i64, Option<i64>) {
    let mut index = 0usize;
    for (start, width, count) in RUNS {
        if bucket < index + count as usize {
            let from = start + width * (bucket - index) as i64;
            let last = bucket + 1 == bucket_count();
            return (from, (!last).then_some(from + width));
        }
        index += count as usize;
    }
    (3 * DAY + 26 * DAY, None)
}

/// A sparse histogram: bucket index to count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram(pub BTreeMap<usize, u64>);

impl Histogram {
    /// Counts one duration in milliseconds.
    pub fn add(&mut self, ms: i64) {
        *self.0.entry(bucket(ms)).or_default() += 1;
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (bucket, count) in &other.0 {
            *self.0.entry(*bucket).or_default() += count;
        }
    }

    /// The stored form: `{"bucket": count}`.
    pub fn to_stored(&self) -> String {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .map(|(b, c)| (b.to_string(), json!(c)))
            .collect();
        Value::Object(map).to_string()
    }

    /// Reads the stored form; what does not parse counts as empty.
    pub fn from_stored(text: &str) -> Histogram {
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
            return Histogram::default();
        };
        Histogram(
            map.iter()
                .filter_map(|(b, c)| Some((b.parse().ok()?, c.as_u64()?)))
                .filter(|(b, _)| *b < bucket_count())
                .collect(),
        )
    }

    /// The non-empty buckets, for charts: `[{"from": s, "to": s|null, "count": n}]`.
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|(bucket, count)| {
                    let (from, to) = bounds(*bucket);
                    json!({"from": from, "to": to, "count": count})
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_qless_resolution() {
        assert_eq!(bucket_count(), 286);
        assert_eq!(bounds(bucket(0)), (0, Some(1)));
        assert_eq!(bounds(bucket(59_999)), (59, Some(60)));
        assert_eq!(bounds(bucket(60_000)), (60, Some(120)));
        assert_eq!(bounds(bucket(3_599_999)), (3540, Some(3600)));
        assert_eq!(bounds(bucket(3_600_000)), (3600, Some(4500)));
        assert_eq!(bounds(bucket(86_399_999)), (85_500, Some(86_400)));
        assert_eq!(bounds(bucket(86_400_000)), (86_400, Some(90_000)));
        assert_eq!(bounds(bucket(3 * 86_400_000)), (259_200, Some(345_600)));
        // Longer than 30 days, and negative durations, are clamped.
        assert_eq!(bounds(bucket(i64::MAX)), (2_505_600, None));
        assert_eq!(bucket(-5), 0);
        // Every bucket's bounds give back that bucket.
        for b in 0..bucket_count() {
            assert_eq!(bucket(bounds(b).0 * 1000), b);
        }
    }

    #[test]
    fn a_histogram_survives_storage_and_ignores_junk() {
        let mut histogram = Histogram::default();
        [500, 700, 61_000, 7_200_000]
            .iter()
            .for_each(|ms| histogram.add(*ms));
        assert_eq!(histogram.0[&0], 2);
        let back = Histogram::from_stored(&histogram.to_stored());
        assert_eq!(back, histogram);
        assert_eq!(Histogram::from_stored("not json"), Histogram::default());
        assert_eq!(
            Histogram::from_stored(r#"{"9999": 1, "x": 2, "3": "y"}"#),
            Histogram::default()
        );
        let mut merged = back.clone();
        merged.merge(&histogram);
        assert_eq!(merged.0[&0], 4);
        assert_eq!(
            histogram.to_json()[0],
            json!({"from": 0, "to": 1, "count": 2})
        );
    }
}
