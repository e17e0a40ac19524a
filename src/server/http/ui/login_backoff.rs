//! Wrong dashboard logins, by client address: after each wrong token the
//! address may not try again for a while, 1 s after the first and doubling
//! with each wrong token after it, up to [`MAX_PAUSE`]. While it waits,
//! every login from it is answered `429` without the token being looked
//! at, so that trying faster, or on many connections at once, tests no more
//! tokens: a login is looked at in one step with the pause it may start
//! ([`LoginBackoff::attempt`]), so logins sent at once are looked at one at
//! a time. A right token forgets the address's wrong ones, and so does
//! [`FORGET_AFTER`] without a wrong one.
//!
//! Addresses are the connection buckets of [`crate::server::admission`]
//! (an IPv4 address, or an IPv6 /64). Sessions already open, and the API's
//! bearer token, are never held back. At most [`MAX_ADDRESSES`] addresses
//! are remembered: past that, the one whose pause ends first is forgotten.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::server::admission::bucket;

/// The pause after the first wrong token; each further one doubles it.
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// How long an address's wrong tokens are remembered after its last one.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// The most addresses remembered at once.
pub const MAX_ADDRESSES: usize = 4096;

/// One address's wrong tokens.
#[derive(Debug, Clone, Copy)]
struct Strikes {
    /// Wrong tokens in a row.
    count: u32,
    /// The last one.
    last: Instant,
    /// No login is looked at before this.
    until: Instant,
}

/// Wrong dashboard logins by address, and the pause each imposes.
#[derive(Debug, Default)]
pub struct LoginBackoff {
    addresses: Mutex<HashMap<IpAddr, Strikes>>,
}

/// What became of a login ([`LoginBackoff::attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The right token.
    Right,
    /// A wrong token, and the pause it starts.
    Wrong(Duration),
    /// Not looked at: the address waits this much longer.
    Paused(Duration),
}

/// The pause after `count` wrong tokens in a row.
fn pause_after(count: u32) -> Duration {
    let doublings = count.saturating_sub(1).min(16);
    (FIRST_PAUSE * (1u32 << doublings)).min(MAX_PAUSE)
}

impl LoginBackoff {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Strikes>> {
        self.addresses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `ip` must still wait before its next login is looked at,
    /// if it must.
    pub fn waiting(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let addresses = self.lock();
        let strikes = addresses.get(&bucket(ip))?;
        (strikes.until > now).then(|| strikes.until - now)
    }

    /// Looks at a login from `ip` (`right` tells whether its token is
    /// right), in one step with the pause it may start, so that logins
    /// sent at once on many connections are looked at one at a time: a
    /// login during a pause is not looked at (`Paused`, with what is left
    /// of it); a wrong token starts the next pause (`Wrong`, with it); a
    /// right one forgets the address's wrong ones.
    pub fn attempt(&self, ip: IpAddr, now: Instant, right: impl FnOnce() -> bool) -> Attempt {
        let mut addresses = self.lock();
        let key = bucket(ip);
        if let Some(strikes) = addresses.get(&key)
            && strikes.until > now
        {
            return Attempt::Paused(strikes.until - now);
        }
        if right() {
            addresses.remove(&key);
            return Attempt::Right;
        }
        Attempt::Wrong(Self::strike(&mut addresses, key, now))
    }

    /// Counts a wrong token from `ip`; returns the pause it starts.
    pub fn failed(&self, ip: IpAddr, now: Instant) -> Duration {
        Self::strike(&mut self.lock(), bucket(ip), now)
    }

    fn strike(addresses: &mut HashMap<IpAddr, Strikes>, key: IpAddr, now: Instant) -> Duration {
        if !addresses.contains_key(&key) && addresses.len() >= MAX_ADDRESSES {
            addresses.retain(|_, s| now.saturating_duration_since(s.last) < FORGET_AFTER);
            if addresses.len() >= MAX_ADDRESSES {
                let first_free = addresses.iter().min_by_key(|(_, s)| s.until);
                if let Some(address) = first_free.map(|(address, _)| *address) {
                    addresses.remove(&address);
                }
            }
        }
        let strikes = addresses.entry(key).or_insert(Strikes {
            count: 0,
            last: now,
            until: now,
        });
        if now.saturating_duration_since(strikes.last) >= FORGET_AFTER {
            strikes.count = 0;
        }
        strikes.count = strikes.count.saturating_add(1);
        strikes.last = now;
        let pause = pause_after(strikes.count);
        strikes.until = now + pause;
        pause
    }

    /// Forgets the wrong tokens of `ip`, which showed the right one.
    pub fn succeeded(&self, ip: IpAddr) {
        self.lock().remove(&bucket(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_wrong_token_doubles_the_pause_up_to_the_longest() {
        let backoff = LoginBackoff::default();
        let start = Instant::now();
        let one = ip("10.0.0.1");
        assert_eq!(backoff.waiting(one, start), None);
        let mut now = start;
        let mut pauses = Vec::new();
        for _ in 0..9 {
            let pause = backoff.failed(one, now);
            assert_eq!(backoff.waiting(one, now), Some(pause));
            pauses.push(pause.as_secs());
            now += pause;
            assert_eq!(backoff.waiting(one, now), None, "free once it ends");
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn addresses_wait_alone_and_a_right_token_or_time_forgets() {
        let backoff = LoginBackoff::default();
        let now = Instant::now();
        backoff.failed(ip("10.0.0.1"), now);
        backoff.failed(ip("2001:db8::1"), now);
        assert!(backoff.waiting(ip("10.0.0.2"), now).is_none());
        assert!(backoff.waiting(ip("::ffff:10.0.0.1"), now).is_some());
        assert!(
            backoff.waiting(ip("2001:db8::ffff"), now).is_some(),
            "one /64"
        );
        backoff.succeeded(ip("10.0.0.1"));
        assert!(backoff.waiting(ip("10.0.0.1"), now).is_none());
        let later = now + Duration::from_secs(2);
        assert_eq!(backoff.failed(ip("10.0.0.1"), later), FIRST_PAUSE);
        let much_later = later + FORGET_AFTER;
        assert_eq!(
            backoff.failed(ip("2001:db8::2"), much_later),
            FIRST_PAUSE,
            "forgotten after a quiet while"
        );
    }

    #[test]
    fn a_login_during_a_pause_is_not_looked_at_and_one_is_looked_at_a_time() {
        let backoff = LoginBackoff::default();
        let now = Instant::now();
        let one = ip("10.0.0.1");
        assert_eq!(
            backoff.attempt(one, now, || false),
            Attempt::Wrong(FIRST_PAUSE)
        );
        // Sent at once beside it: within its pause, its token unread.
        let looked = std::cell::Cell::new(false);
        let attempt = backoff.attempt(one, now, || {
            looked.set(true);
            true
        });
        assert_eq!(attempt, Attempt::Paused(FIRST_PAUSE));
        assert!(!looked.get(), "a paused login's token is not looked at");
        let after = now + FIRST_PAUSE;
        assert_eq!(backoff.attempt(one, after, || true), Attempt::Right);
        assert_eq!(backoff.waiting(one, after), None);
        assert_eq!(
            backoff.attempt(one, after, || false),
            Attempt::Wrong(FIRST_PAUSE),
            "a right token forgot the wrong ones"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let backoff = LoginBackoff::default();
        let now = Instant::now();
        for n in 0..(MAX_ADDRESSES as u32 + 10) {
            backoff.failed(IpAddr::V4(n.into()), now);
        }
        assert_eq!(backoff.lock().len(), MAX_ADDRESSES);
    }
}
