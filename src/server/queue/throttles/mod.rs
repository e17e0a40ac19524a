//! Throttles across the fleet: how many jobs whose name matches a GLOB may
//! be held at once, by every supervisor of every server sharing the store.
//! This module owns their accounting; the store only counts and parks.
//!
//! - **What holds a slot, and what frees one** (`holds`). A RUNNING job,
//!   and a RUNQUEUED one (a `retryAfter` job handed out) until it is due
//!   again, which is when its holder's lease lapses. A job matching several
//!   throttles holds a slot in each, and is handed out only when each has
//!   room. Each write's reads, writes and removals of jobs go through one
//!   account ([`Holds`], kept by `Tracked`), which ends a hold under the
//!   name the job held it by, whatever rule wrote it.
//! - **What takes one** (`gate`). A claim ([`Gate`]) locks the throttles
//!   its pattern may meet, counts each one's held jobs once, and hands out
//!   a job only if every throttle it matches has room. A job held back is
//!   *parked* behind the full throttle, out of the ready index, so later
//!   claims neither step over it nor let it block other names.
//! - **Whom a freed slot wakes** (`wake`). Every waiter, of any name the
//!   throttle matches, that asks for a job it held back, as many as it has
//!   room for: in the write that freed it for this server's waiters, and,
//!   on a store other servers share, on each of them once told.
//! - **Changes.** Lowering a throttle stops hand-outs until the held jobs
//!   drain; nothing is stopped. Raising or deleting one wakes waiters for
//!   the jobs it held back; deleting one unparks them.

mod gate;
mod holds;
mod wake;

use serde_json::{Value, json};

use super::Queue;
use super::tracked::Tracked;
use crate::protocol::pattern::glob_matches;
use crate::protocol::{JobError, MAX_NAME_BYTES, NamePattern, Timestamp};

pub use gate::Gate;
pub use holds::Holds;
pub(super) use wake::{follow_freed_slots, wake_for_freed_slots};

/// The most throttles a store keeps.
pub const MAX_THROTTLES: usize = 1000;

/// The highest `max` a throttle takes.
pub const MAX_THROTTLE: i64 = 1_000_000;

/// Why a throttle's GLOB or max is refused, in words that say what to send.
pub fn check(glob: &str, max: Option<i64>) -> Result<(), String> {
    if glob.is_empty() {
        return Err("a throttle needs a GLOB of job names, such as api/* or SendEmail".into());
    }
    if glob.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a throttle's GLOB is at most {MAX_NAME_BYTES} bytes, as a job name is"
        ));
    }
    if crate::protocol::text::has_control(glob) {
        return Err("a throttle's GLOB cannot hold control characters".into());
    }
    if glob.contains(',') {
        return Err(
            "a throttle's GLOB is one pattern, without commas; set one throttle per pattern".into(),
        );
    }
    if !sets_close(glob) {
        return Err(format!(
            "the GLOB {glob:?} opens a [set] it never closes (it would match nothing); close it with ]"
        ));
    }
    if let Some(max) = max
        && !(0..=MAX_THROTTLE).contains(&max)
    {
        return Err(format!(
            "max must be a whole number from 0 (pause the jobs) to {MAX_THROTTLE}, not {max}"
        ));
    }
    Ok(())
}

/// Whether every `[` set of a GLOB is closed, read as SQLite reads it.
fn sets_close(glob: &str) -> bool {
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '[' {
            let mut j = i + 1;
            if chars.get(j) == Some(&'^') {
                j += 1;
            }
            if chars.get(j) == Some(&']') {
                j += 1;
            }
            while j < chars.len() && chars[j] != ']' {
                j += 1;
            }
            if j >= chars.len() {
                return false;
            }
            i = j;
        }
        i += 1;
    }
    true
}

/// The literal start of a GLOB, before its first wildcard.
fn literal_prefix(glob: &str) -> &str {
    glob.split(['*', '?', '[']).next().unwrap_or_default()
}

/// Whether some name could match both the throttle's GLOB and a claim's
/// pattern: never wrong when it says no (two GLOBs whose literal starts
/// differ share no name), and cheap.
pub fn may_overlap(glob: &str, pattern: &NamePattern) -> bool {
    match pattern {
        NamePattern::List(names) => names.iter().any(|name| glob_matches(glob, name)),
        NamePattern::Glob(wanted) => {
            let (a, b) = (literal_prefix(glob), literal_prefix(wanted));
            a.starts_with(b) || b.starts_with(a)
        }
    }
}

/// Creates or changes a throttle; waiters are woken for what it now has
/// room for.
fn set(tx: &mut Tracked, glob: &str, max: i64) -> Result<(), JobError> {
    let exists = tx
        .store()
        .throttles()
        .lock_throttles(&[glob.to_string()])?
        .len()
        == 1;
    if !exists {
        let count = tx.store().throttles().count_throttles()?;
        if count >= MAX_THROTTLES {
            return Err(JobError::TooManyThrottles(MAX_THROTTLES));
        }
    }
    tx.store().throttles().set_throttle(glob, max)?;
    tx.holds().throttle_changed(glob);
    Ok(())
}

/// Removes a throttle, unparking the jobs it held back (waiters are woken
/// for them); returns whether it existed.
fn delete(tx: &mut Tracked, glob: &str) -> Result<bool, JobError> {
    tx.store().throttles().lock_throttles(&[glob.to_string()])?;
    if !tx.store().throttles().delete_throttle(glob)? {
        return Ok(false);
    }
    tx.store().throttles().release_parked(glob)?;
    tx.holds().throttle_changed(glob);
    Ok(true)
}

/// The throttles a job of this name is counted under, each with its cap
/// and how many matching jobs hold a slot at `now`, as QueryJob shows them:
/// `[{"glob", "max", "running"}]`.
pub fn matching(
    tx: &mut dyn crate::server::store::StoreTx,
    name: &str,
    now: Timestamp,
) -> Result<Vec<Value>, JobError> {
    let mut out = Vec::new();
    for throttle in tx.throttles().list_throttles()? {
        let matches = NamePattern::parse(&throttle.glob).is_ok_and(|p| p.matches(name));
        if matches {
            let running = tx.throttles().held_matching(&throttle.glob, now)?;
            out.push(json!({"glob": throttle.glob, "max": throttle.max, "running": running}));
        }
    }
    Ok(out)
}

impl Queue {
    /// Creates or changes the throttle `glob` (checked with [`check`]).
    pub async fn set_throttle(&self, glob: String, max: i64) -> Result<(), JobError> {
        self.write(move |tx| set(tx, &glob, max)).await
    }

    /// Removes the throttle `glob`; returns whether it existed.
    pub async fn delete_throttle(&self, glob: String) -> Result<bool, JobError> {
        self.write(move |tx| delete(tx, &glob)).await
    }

    /// Every throttle with how many matching jobs hold a slot now, as
    /// `{"glob", "max", "running"}` objects in GLOB order.
    pub async fn throttles(&self) -> Result<Vec<Value>, JobError> {
        let now = self.now();
        self.read(move |tx| {
            let throttles = tx.throttles().list_throttles()?;
            throttles
                .into_iter()
                .map(|t| {
                    let running = tx.throttles().held_matching(&t.glob, now)?;
                    Ok(json!({"glob": t.glob, "max": t.max, "running": running}))
                })
                .collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_maxima_are_checked() {
        for good in ["api/*", "SendEmail", "[a-c]*", "[]]x", "*"] {
            assert!(check(good, Some(2)).is_ok(), "{good}");
        }
        for bad in ["", "a,b", "[abc", "a\nb", &"x".repeat(256)] {
            assert!(check(bad, Some(1)).is_err(), "{bad:?}");
        }
        assert!(check("a", Some(0)).is_ok());
        assert!(check("a", Some(-1)).is_err());
        assert!(check("a", Some(MAX_THROTTLE + 1)).is_err());
    }

    #[test]
    fn overlap_is_never_denied_when_a_name_matches_both() {
        let globs = [
            "api/*",
            "api/slow*",
            "batch/*",
            "*",
            "a?i/*",
            "[ab]*",
            "apix",
        ];
        let names = ["api/x", "api/slow1", "batch/1", "apix", "abi/z", "b"];
        for throttle in globs {
            for wanted in globs {
                let both = names
                    .iter()
                    .any(|n| glob_matches(throttle, n) && glob_matches(wanted, n));
                if both {
                    assert!(
                        may_overlap(throttle, &NamePattern::Glob(wanted.into())),
                        "{throttle} and {wanted}"
                    );
                }
            }
        }
        assert!(!may_overlap("api/*", &NamePattern::Glob("batch/*".into())));
    }
}
