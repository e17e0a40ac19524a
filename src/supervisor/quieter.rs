//! Warnings that repeat, said once a minute per key: a job handed back
//! every few seconds for want of its worker would otherwise fill the log.
//! The next line said tells how many were held back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many keys are remembered; job names come from outside, so the map
/// is bounded. When full, keys quiet for a whole period are forgotten; if
/// none is, every warning is said (nothing is held back unseen).
const MAX_KEYS: usize = 1024;

/// Per key: when it was last said, and how many were held back since.
pub struct Quieter {
    every: Duration,
    said: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Quieter {
    /// Says each key at most once per `every`.
    pub fn new(every: Duration) -> Quieter {
        Quieter {
            every,
            said: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held_back)` when this occurrence of `key` is to be said, with
    /// how many were held back since the last one said; `None` to hold it
    /// back.
    pub fn say(&self, key: &str, now: Instant) -> Option<u64> {
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((last, held)) = said.get_mut(key) {
            if now.duration_since(*last) < self.every {
                *held += 1;
                return None;
            }
            let was = *held;
            *last = now;
            *held = 0;
            return Some(was);
        }
        if said.len() >= MAX_KEYS {
            let every = self.every;
            said.retain(|_, (last, _)| now.duration_since(*last) < every);
            if said.len() >= MAX_KEYS {
                return Some(0);
            }
        }
        said.insert(key.to_string(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_said_once_a_period_with_the_count_held_back() {
        let quieter = Quieter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(quieter.say("Late", t0), Some(0));
        assert_eq!(quieter.say("Late", t0 + Duration::from_secs(10)), None);
        assert_eq!(quieter.say("Late", t0 + Duration::from_secs(20)), None);
        assert_eq!(quieter.say("Other", t0 + Duration::from_secs(20)), Some(0));
        assert_eq!(quieter.say("Late", t0 + Duration::from_secs(61)), Some(2));
        assert_eq!(quieter.say("Late", t0 + Duration::from_secs(62)), None);
    }

    #[test]
    fn many_keys_are_bounded_and_never_silenced_unseen() {
        let quieter = Quieter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for n in 0..MAX_KEYS {
            assert_eq!(quieter.say(&format!("job-{n}"), t0), Some(0));
        }
        // Full of recent keys: a new one is said, and not remembered.
        assert_eq!(quieter.say("new", t0), Some(0));
        assert_eq!(quieter.say("new", t0), Some(0));
        assert_eq!(quieter.said.lock().unwrap().len(), MAX_KEYS);
        // A period later the old keys make room.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(quieter.say("new", later), Some(0));
        assert_eq!(quieter.say("new", later), None);
        assert!(quieter.said.lock().unwrap().len() < MAX_KEYS);
    }
}
