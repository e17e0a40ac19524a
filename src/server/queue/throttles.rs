//! Throttles across the fleet: how many jobs whose name matches a GLOB may
//! be held at once, by every supervisor of every server sharing the store.
//!
//! - **What holds a slot.** A RUNNING job, and a RUNQUEUED one (a
//!   `retryAfter` job handed out) until it is due again, which is when its
//!   holder's lease lapses. A job matching several throttles holds a slot
//!   in each, and is handed out only when each has room.
//! - **Claims.** A claim ([`Gate`]) locks the throttles its pattern may
//!   meet, counts each one's held jobs once, and hands out a job only if
//!   every throttle it matches has room. A job held back is *parked*
//!   behind the full throttle (with every other ready job matching it), out
//!   of the ready index, so later claims neither step over it nor let it
//!   block other names; while that throttle has room, claims take its
//!   parked jobs, best first, from an index range of their own.
//! - **Freed slots.** A write that ends a hold (a report, a hand-back, a
//!   lapsed lease, a put-back, a delete) names the best parked jobs of each
//!   throttle that now has room as ready, so waiters are woken (and, on
//!   PostgreSQL, other servers told) as for a job becoming ready.
//! - **Changes.** Lowering a throttle stops hand-outs until the held jobs
//!   drain; nothing is stopped. Raising or deleting one wakes waiters for
//!   its parked jobs; deleting one unparks them.

use std::cmp::Reverse;

use serde_json::{Value, json};

use super::Queue;
use super::tracked::Tracked;
use crate::protocol::pattern::glob_matches;
use crate::protocol::{Job, JobError, JobState, MAX_NAME_BYTES, NamePattern, Priority, Timestamp};
use crate::server::store::{ReadyJob, Throttle};

/// The most throttles a store keeps.
pub const MAX_THROTTLES: usize = 1000;

/// The highest `max` a throttle takes.
pub const MAX_THROTTLE: i64 = 1_000_000;

/// The most parked jobs of one throttle a freed slot names as ready.
const WAKE_PER_THROTTLE: usize = 8;

/// The most unparked jobs a deleted throttle names as ready.
const WAKE_ON_DELETE: usize = 256;

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

/// Whether `job` holds a slot of the throttles it matches at `now`.
pub fn holds_slot(job: &Job, now: Timestamp) -> bool {
    match job.state {
        JobState::Running => true,
        JobState::Runqueued => job.next_run > now,
        _ => false,
    }
}

/// One throttle as a claim counts against it.
#[derive(Debug)]
struct Slot {
    glob: String,
    max: i64,
    /// Jobs held when first counted, in this transaction.
    held: Option<i64>,
    /// Jobs this claim took that match it.
    taken: i64,
    /// Whether this claim parked its ready jobs already.
    swept: bool,
}

/// The throttles one claim counts against, locked for it.
#[derive(Debug, Default)]
pub struct Gate {
    slots: Vec<Slot>,
}

impl Gate {
    /// Locks the throttles a claim for `pattern` may meet (in GLOB order,
    /// before any job is read, so that servers take them in one order).
    pub fn open(tx: &mut Tracked, pattern: &NamePattern) -> Result<Gate, JobError> {
        let globs: Vec<String> = tx
            .store()
            .throttles()
            .list_throttles()?
            .into_iter()
            .filter(|t| may_overlap(&t.glob, pattern))
            .map(|t| t.glob)
            .collect();
        if globs.is_empty() {
            return Ok(Gate::default());
        }
        let slots = tx
            .store()
            .throttles()
            .lock_throttles(&globs)?
            .into_iter()
            .map(|Throttle { glob, max }| Slot {
                glob,
                max,
                held: None,
                taken: 0,
                swept: false,
            })
            .collect();
        Ok(Gate { slots })
    }

    /// Free slots of throttle `i` for this claim.
    fn room(&mut self, tx: &mut Tracked, i: usize) -> Result<i64, JobError> {
        let now = tx.now;
        let slot = &mut self.slots[i];
        let held = match slot.held {
            Some(held) => held,
            None => {
                let held = tx.store().throttles().held_matching(&slot.glob, now)?;
                let held = i64::try_from(held).unwrap_or(i64::MAX);
                slot.held = Some(held);
                held
            }
        };
        Ok(slot.max - held - slot.taken)
    }

    /// Up to `want` jobs this claim may hand out, best first: ready jobs
    /// and jobs parked behind throttles with room, each of whose throttles
    /// has room for it (its slots are counted as taken). Jobs held back are
    /// parked behind the full throttle.
    pub fn candidates(
        &mut self,
        tx: &mut Tracked,
        pattern: &NamePattern,
        priority: Option<Priority>,
        want: usize,
    ) -> Result<Vec<Job>, JobError> {
        if self.slots.is_empty() {
            return tx.ready(pattern, priority, want);
        }
        let now = tx.now;
        let mut chosen: Vec<Job> = Vec::new();
        // Each round parks every job it holds back behind a throttle
        // without room, whose parked jobs no later round looks at (room
        // only shrinks during a claim): the rounds end.
        // Jobs chosen in an earlier round are still ready in the store
        // (they are handed out after this returns): each round asks for
        // `want` and leaves those out.
        loop {
            let mut pool = tx.ready(pattern, priority, want)?;
            for i in 0..self.slots.len() {
                if self.room(tx, i)? > 0 {
                    let glob = self.slots[i].glob.clone();
                    pool.extend(
                        tx.store()
                            .throttles()
                            .parked_jobs(&glob, pattern, priority, now, want, true)?,
                    );
                }
            }
            pool.retain(|j| !chosen.iter().any(|c| c.id == j.id));
            pool.sort_by_key(|j| (Reverse(j.priority.value()), j.next_run, j.id));
            pool.dedup_by_key(|j| j.id);
            let mut held_back = false;
            for job in pool {
                if chosen.len() == want {
                    break;
                }
                let matching: Vec<usize> = (0..self.slots.len())
                    .filter(|&i| glob_matches(&self.slots[i].glob, &job.name))
                    .collect();
                let mut full = None;
                for &i in &matching {
                    if self.room(tx, i)? <= 0 {
                        full = Some(i);
                        break;
                    }
                }
                match full {
                    None => {
                        for i in matching {
                            self.slots[i].taken += 1;
                        }
                        chosen.push(job);
                    }
                    Some(i) => {
                        held_back = true;
                        let glob = self.slots[i].glob.clone();
                        tx.store().throttles().park_job(job.id, &glob)?;
                        if !self.slots[i].swept {
                            self.slots[i].swept = true;
                            tx.store().throttles().park_matching(&glob)?;
                        }
                    }
                }
            }
            if !held_back || chosen.len() == want {
                return Ok(chosen);
            }
        }
    }

    /// Gives back the slots of a candidate that was not handed out.
    pub fn give_back(&mut self, name: &str) {
        for slot in &mut self.slots {
            if glob_matches(&slot.glob, name) {
                slot.taken -= 1;
            }
        }
    }
}

/// After an operation: for each throttle matching a job whose hold it
/// ended, names as ready the best parked jobs it now has room for, so that
/// waiters (here and on other servers) are woken for them.
pub fn wake_for_freed_slots(tx: &mut Tracked) -> Result<(), JobError> {
    let names = tx.take_left_held();
    if names.is_empty() {
        return Ok(());
    }
    let now = tx.now;
    for throttle in tx.store().throttles().list_throttles()? {
        if !names.iter().any(|name| glob_matches(&throttle.glob, name)) {
            continue;
        }
        wake_for_parked(tx, &throttle, now)?;
    }
    Ok(())
}

/// Names as ready the best parked jobs of `throttle` that it has room for.
fn wake_for_parked(tx: &mut Tracked, throttle: &Throttle, now: Timestamp) -> Result<(), JobError> {
    let held = tx.store().throttles().held_matching(&throttle.glob, now)?;
    let room = throttle.max - i64::try_from(held).unwrap_or(i64::MAX);
    if room <= 0 {
        return Ok(());
    }
    let limit = usize::try_from(room)
        .unwrap_or(usize::MAX)
        .min(WAKE_PER_THROTTLE);
    let parked = tx.store().throttles().parked_jobs(
        &throttle.glob,
        &NamePattern::Glob("*".into()),
        None,
        now,
        limit,
        false,
    )?;
    for job in parked {
        tx.wake_for(&ReadyJob {
            id: job.id,
            name: job.name,
            priority: job.priority,
            next_run: job.next_run,
        });
    }
    Ok(())
}

/// Creates or changes a throttle, and wakes waiters for what it now has
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
    let now = tx.now;
    wake_for_parked(
        tx,
        &Throttle {
            glob: glob.to_string(),
            max,
        },
        now,
    )
}

/// Removes a throttle, unparking the jobs it held back; returns whether it
/// existed.
fn delete(tx: &mut Tracked, glob: &str) -> Result<bool, JobError> {
    tx.store().throttles().lock_throttles(&[glob.to_string()])?;
    if !tx.store().throttles().delete_throttle(glob)? {
        return Ok(false);
    }
    let now = tx.now;
    for job in tx
        .store()
        .throttles()
        .release_parked(glob, now, WAKE_ON_DELETE)?
    {
        tx.wake_for(&job);
    }
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
