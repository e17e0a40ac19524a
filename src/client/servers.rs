//! The job servers a client may use (`--server URL,URL,…`), and which one
//! it uses now: the first that answers, kept while it answers. A server
//! that cannot be reached is set aside for a cooldown (1 s, doubling with
//! each failure in a row up to 30 s, ±20 % jitter so that a fleet does not
//! come back to a server all at once), and the next one in the list is
//! used. When every server is set aside, the one that comes back first is
//! tried anyway: a call never fails without trying one.
//!
//! The servers of one list share one store (several servers on one
//! PostgreSQL database): a lease taken through one is reported through any.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::http::ClientError;

/// The first cooldown of a server that failed.
const FIRST_COOLDOWN: Duration = Duration::from_secs(1);
/// The longest cooldown.
const MAX_COOLDOWN: Duration = Duration::from_secs(30);

/// What is known of one server.
#[derive(Debug, Clone, Default)]
struct Health {
    /// Failures in a row.
    failures: u32,
    /// Set aside until then.
    down_until: Option<Instant>,
}

/// A list of servers' base URLs and the one in use.
#[derive(Debug)]
pub struct Servers {
    bases: Vec<String>,
    state: Mutex<(usize, Vec<Health>)>,
    /// Whether a switch is logged: not for a probe's own list (a start-up
    /// check), whose switches are not the supervisor's.
    log_switches: bool,
}

impl Servers {
    /// Reads `list`: one URL, or several separated by commas, each
    /// `http://HOST:PORT` or `https://HOST:PORT`. Refuses an empty list, an
    /// empty item, another scheme, and a URL given twice.
    pub fn parse(list: &str) -> Result<Servers, ClientError> {
        let mut bases: Vec<String> = Vec::new();
        for item in list.split(',') {
            let base = item.trim().trim_end_matches('/').to_string();
            let bad = |why: String| ClientError::BadList {
                list: list.to_string(),
                why,
            };
            if base.is_empty() {
                return Err(bad(
                    "an empty item: give one URL, or several separated by single commas".into(),
                ));
            }
            if !(base.starts_with("http://") || base.starts_with("https://")) || base.len() < 8 {
                if list.contains(',') {
                    return Err(bad(format!(
                        "{base:?} is not http://HOST:PORT or https://HOST:PORT"
                    )));
                }
                return Err(ClientError::BadUrl(base));
            }
            if bases.contains(&base) {
                return Err(bad(format!("{base} is given twice")));
            }
            bases.push(base);
        }
        let health = vec![Health::default(); bases.len()];
        Ok(Servers {
            bases,
            state: Mutex::new((0, health)),
            log_switches: true,
        })
    }

    /// Stops logging switches: for a one-off probe
    /// (the supervisor's start-up check that a server answers), whose
    /// choice of server is not the one the supervisor's calls use.
    pub fn quiet(&mut self) {
        self.log_switches = false;
    }

    /// The base URL of server `i`.
    pub fn base(&self, i: usize) -> &str {
        &self.bases[i]
    }

    /// The base URL of the server in use.
    pub fn current(&self) -> &str {
        &self.bases[self.lock().0]
    }

    /// Every base URL, comma-separated.
    pub fn describe(&self) -> String {
        self.bases.join(",")
    }

    /// How many servers the list has (at least one).
    pub fn count(&self) -> usize {
        self.bases.len()
    }

    /// The servers to try at `now`, in order: the one in use unless set
    /// aside, then the others not set aside in list order, then those set
    /// aside, the soonest back first.
    pub fn order(&self, now: Instant) -> Vec<usize> {
        let (current, health) = &*self.lock();
        let up = |i: &usize| health[*i].down_until.is_none_or(|until| until <= now);
        let mut order: Vec<usize> = std::iter::once(*current)
            .chain((0..self.bases.len()).filter(|i| i != current))
            .filter(up)
            .collect();
        let mut down: Vec<usize> = (0..self.bases.len()).filter(|i| !up(i)).collect();
        down.sort_by_key(|i| health[*i].down_until);
        order.extend(down);
        order
    }

    /// Server `i` answered: it is in use from now on.
    pub fn answered(&self, i: usize) {
        let (current, health) = &mut *self.lock();
        health[i] = Health::default();
        if *current != i && self.log_switches {
            tracing::warn!(
                from = %self.bases[*current],
                to = %self.bases[i],
                "job server switched"
            );
        }
        *current = i;
    }

    /// Server `i` could not be reached at `now`: set aside for its
    /// cooldown.
    pub fn failed(&self, i: usize, now: Instant) {
        if self.bases.len() < 2 {
            return;
        }
        let (_, health) = &mut *self.lock();
        let entry = &mut health[i];
        entry.failures = entry.failures.saturating_add(1);
        entry.down_until = Some(now + jittered(cooldown(entry.failures)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, Vec<Health>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The cooldown after `failures` failures in a row: 1 s, doubling, at most
/// 30 s.
fn cooldown(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(5);
    (FIRST_COOLDOWN * 2u32.pow(doublings)).min(MAX_COOLDOWN)
}

/// `base` ± 20 %.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.8 + rand::random::<f64>() * 0.4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_read_and_bad_lists_are_refused() {
        let servers = Servers::parse(" http://a:1/ ,https://b:2").unwrap();
        assert_eq!(servers.describe(), "http://a:1,https://b:2");
        for bad in [
            "",
            "http://a:1,",
            "http://a:1,,http://b:2",
            "http://a:1,bedrock://b:2",
            "http://a:1,http://a:1/",
            "localhost:8889",
        ] {
            assert!(Servers::parse(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn cooldowns_double_to_a_bound_with_jitter_within_a_fifth() {
        assert_eq!(cooldown(1), Duration::from_secs(1));
        assert_eq!(cooldown(2), Duration::from_secs(2));
        assert_eq!(cooldown(5), Duration::from_secs(16));
        assert_eq!(cooldown(6), Duration::from_secs(30));
        assert_eq!(cooldown(u32::MAX), Duration::from_secs(30));
        for _ in 0..1000 {
            let wait = jittered(Duration::from_secs(10));
            assert!(wait >= Duration::from_secs(8) && wait <= Duration::from_secs(12));
        }
    }

    #[test]
    fn a_server_that_failed_is_tried_last_until_its_cooldown_ends() {
        let servers = Servers::parse("http://a:1,http://b:2,http://c:3").unwrap();
        let t0 = Instant::now();
        assert_eq!(servers.order(t0), [0, 1, 2]);
        servers.failed(0, t0);
        assert_eq!(servers.order(t0), [1, 2, 0]);
        servers.answered(1);
        assert_eq!(servers.current(), "http://b:2");
        assert_eq!(servers.order(t0), [1, 2, 0]);
        // All set aside: the soonest back first, and nothing is skipped.
        servers.failed(1, t0);
        servers.failed(1, t0);
        for _ in 0..3 {
            servers.failed(2, t0);
        }
        assert_eq!(servers.order(t0).len(), 3);
        assert_eq!(servers.order(t0)[0], 0, "a's 1 s is the soonest");
        // After its cooldown, the one in use is first again.
        let later = t0 + Duration::from_secs(3);
        assert_eq!(servers.order(later)[0], 1);
    }

    #[test]
    fn one_server_is_never_set_aside() {
        let servers = Servers::parse("http://a:1").unwrap();
        servers.failed(0, Instant::now());
        assert_eq!(servers.order(Instant::now()), [0]);
    }
}
