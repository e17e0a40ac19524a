//! Count, mean, variance, minimum and maximum of a stream of durations,
//! kept in constant space (Welford's method) and mergeable, so that hourly
//! rows add up to days without the raw samples.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A running summary of durations in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How many samples.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// The sum of squared differences from the mean (Welford's M2).
    pub m2: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
}

impl Summary {
    /// Adds one sample.
    pub fn add(&mut self, sample: f64) {
        self.merge(&Summary {
            count: 1,
            mean: sample,
            m2: 0.0,
            min: sample,
            max: sample,
        });
    }

    /// Adds every sample of `other` (Chan et al.'s parallel update).
    pub fn merge(&mut self, other: &Summary) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        let count = self.count + other.count;
        let delta = other.mean - self.mean;
        let (n1, n2, n) = (self.count as f64, other.count as f64, count as f64);
        self.mean += delta * n2 / n;
        self.m2 += other.m2 + delta * delta * n1 * n2 / n;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.count = count;
    }

    /// The sample variance (divided by `count - 1`); 0 below two samples.
    pub fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.m2 / (self.count - 1) as f64
        }
    }

    /// The summary for people and charts, in seconds: count, mean,
    /// variance (in seconds²), min and max; `null`s when empty.
    pub fn to_json_secs(&self) -> Value {
        if self.count == 0 {
            return json!({"count": 0, "mean": null, "variance": null, "min": null, "max": null});
        }
        json!({
            "count": self.count,
            "mean": self.mean / 1000.0,
            "variance": self.variance() / 1_000_000.0,
            "min": self.min / 1000.0,
            "max": self.max / 1000.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(samples: &[f64]) -> Summary {
        let mut summary = Summary::default();
        samples.iter().for_each(|s| summary.add(*s));
        summary
    }

    #[test]
    fn mean_variance_min_and_max_of_a_stream() {
        let summary = of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(summary.count, 8);
        assert!((summary.mean - 5.0).abs() < 1e-12);
        // Sample variance: 32 / 7.
        assert!((summary.variance() - 32.0 / 7.0).abs() < 1e-12);
        assert_eq!((summary.min, summary.max), (2.0, 9.0));
    }

    #[test]
    fn merged_halves_equal_the_whole() {
        let whole = of(&[1.0, 10.0, 3.0, 8.0, 8.0, 2.5]);
        let mut left = of(&[1.0, 10.0, 3.0]);
        left.merge(&of(&[8.0, 8.0, 2.5]));
        assert_eq!(left.count, whole.count);
        assert!((left.mean - whole.mean).abs() < 1e-12);
        assert!((left.variance() - whole.variance()).abs() < 1e-9);
        assert_eq!((left.min, left.max), (whole.min, whole.max));
        // Merging nothing changes nothing, and into nothing copies.
        let mut empty = Summary::default();
        empty.merge(&whole);
        assert_eq!(empty, whole);
        left.merge(&Summary::default());
        assert_eq!(left.count, 6);
    }

    #[test]
    fn fewer_than_two_samples_have_no_spread() {
        assert_eq!(of(&[]).variance(), 0.0);
        assert_eq!(of(&[7.0]).variance(), 0.0);
        assert_eq!(of(&[]).to_json_secs()["mean"], Value::Null);
        assert_eq!(of(&[1500.0]).to_json_secs()["mean"], json!(1.5));
    }
}
