//! Whom a freed slot wakes. A slot freed in a throttle lets go a job it
//! held back, of any name the throttle matches, so it names no job: for
//! each throttle with room, the waiters that ask for some of its held-back
//! jobs are picked, and each is given the slot by its entry in the list
//! (see `waiters` for how it is then owed). Waiters are weighed by what
//! they ask for (pattern and priority): in each such group, as many of the
//! oldest as there are held-back jobs for it, up to the room. Every group
//! with such jobs is woken, so a waiter that finds none it can take (its
//! jobs are held back by another throttle too) takes no slot from another.
//!
//! A job is *held back* by a throttle when it is due and matches it, and
//! is parked behind it or not parked at all: a claim on another server
//! that met the full throttle may not have committed its parking yet, a
//! removed throttle's jobs were just unparked, and a job nobody parked is
//! as good to wake for.
//!
//! When the slots are weighed:
//!
//! - **In the write that freed them**, for this server's waiters. The store
//!   runs this server's writes one at a time, so each claim of theirs came
//!   before the write (and what it parked is seen) or comes after it (and
//!   sees the room). On SQLite, a sleeping waiter picked is served in the
//!   same commit (`serving`); the others are woken once it is durable. On
//!   a store other servers share, the room read here may still count a job
//!   another server is freeing at the same moment: that server's
//!   announcement has the throttle looked at again here.
//! - **After another server's commit that freed them** (its announcement
//!   names the throttles), and **when a waiter passes a slot on**: looked
//!   at again from the store, after that commit, by [`follow_freed_slots`].
//!   A claim on the other server that counted the freed job as held shows
//!   its held-back jobs parked or not parked, and both are counted.

use std::collections::BTreeSet;

use super::may_overlap;
use crate::protocol::pattern::glob_matches;
use crate::protocol::{JobError, Timestamp};
use crate::server::queue::Queue;
use crate::server::queue::tracked::Tracked;
use crate::server::queue::waiters::{FreedSlot, Listed, Waiters};
use crate::server::store::{StoreTx, Throttle};

/// The most groups of waiters (by what they ask for) weighed one by one
/// for a throttle; past it, every waiter that may meet the throttle is
/// woken to look for itself.
const MAX_GROUPS: usize = 32;

/// At the end of a write: names the throttles whose slots it freed (for
/// the servers sharing the store), and picks this server's waiters that
/// may take the jobs those throttles held back, to be served in the commit
/// or woken after it.
pub fn wake_for_freed_slots(tx: &mut Tracked, waiters: &Waiters) -> Result<(), JobError> {
    let ended = tx.holds().take_ended();
    if ended.is_empty() {
        return Ok(());
    }
    let throttles = tx.store().throttles().list_throttles()?;
    let matching = |names: &[String]| -> Vec<String> {
        throttles
            .iter()
            .filter(|t| names.iter().any(|name| glob_matches(&t.glob, name)))
            .map(|t| t.glob.clone())
            .collect()
    };
    // Every server's timer sees a job due again: only writes are told.
    let mut told: BTreeSet<String> = matching(&ended.by_write).into_iter().collect();
    told.extend(ended.throttles);
    let mut globs = told.clone();
    globs.extend(matching(&ended.by_time));
    tx.freed_slots(told.into_iter().collect());
    if waiters.is_empty() || globs.is_empty() {
        return Ok(());
    }
    let now = tx.now;
    let slots = pick(tx.store(), &waiters.listed(), &globs, &throttles, now)?;
    tx.wake_for_slots(slots);
    Ok(())
}

/// The waiters among `listed` to give the freed slots of `globs` to, at
/// `now`: see the module's documentation. A GLOB that is no throttle (any
/// more) holds nothing back, and has room for every job it matches.
fn pick(
    store: &mut dyn StoreTx,
    listed: &[Listed],
    globs: &BTreeSet<String>,
    throttles: &[Throttle],
    now: Timestamp,
) -> Result<Vec<(u64, FreedSlot)>, JobError> {
    let mut slots = Vec::new();
    for glob in globs {
        let meeting: Vec<&Listed> = listed
            .iter()
            .filter(|waiter| may_overlap(glob, &waiter.pattern))
            .collect();
        if meeting.is_empty() {
            continue;
        }
        let room = match throttles.iter().find(|t| &t.glob == glob) {
            Some(throttle) => {
                let held = store.throttles().held_matching(glob, now)?;
                throttle.max - i64::try_from(held).unwrap_or(i64::MAX)
            }
            None => i64::MAX,
        };
        if room <= 0 {
            continue;
        }
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        let groups = groups(&meeting);
        if groups.len() > MAX_GROUPS {
            slots.extend(meeting.iter().map(|waiter| {
                let slot = FreedSlot {
                    glob: glob.clone(),
                    count: waiter.want,
                };
                (waiter.id, slot)
            }));
            continue;
        }
        for group in groups {
            let wanted: usize = group.iter().map(|waiter| waiter.want).sum();
            let (pattern, priority) = (&group[0].pattern, group[0].priority);
            let mut held_back = store.throttles().count_held_back(
                glob,
                pattern,
                priority,
                now,
                room.min(wanted),
            )?;
            for waiter in group {
                if held_back == 0 {
                    break;
                }
                let count = waiter.want.min(held_back);
                held_back -= count;
                let slot = FreedSlot {
                    glob: glob.clone(),
                    count,
                };
                slots.push((waiter.id, slot));
            }
        }
    }
    Ok(slots)
}

/// Waiters grouped by what they ask for, each group oldest first, in the
/// order of their oldest.
fn groups<'a>(waiters: &[&'a Listed]) -> Vec<Vec<&'a Listed>> {
    let mut groups: Vec<Vec<&Listed>> = Vec::new();
    for waiter in waiters {
        let same = groups.iter_mut().find(|group| {
            group[0].priority == waiter.priority && group[0].pattern == waiter.pattern
        });
        match same {
            Some(group) => group.push(waiter),
            None => groups.push(vec![waiter]),
        }
    }
    groups
}

/// Looks again, from the store, at the throttles whose freed slots another
/// server's commit named or a waiter passed on, and wakes the waiters that
/// may take their held-back jobs; until the queue shuts down.
pub async fn follow_freed_slots(queue: Queue) {
    let waiters = queue.inner.waiters.clone();
    loop {
        let globs = tokio::select! {
            _ = queue.inner.shutdown.cancelled() => return,
            globs = waiters.to_look_at_again() => globs,
        };
        if waiters.is_empty() {
            continue;
        }
        let listed = waiters.listed();
        let now = queue.now();
        let picked = queue.read(move |tx| {
            let throttles = tx.throttles().list_throttles()?;
            pick(tx, &listed, &globs.into_iter().collect(), &throttles, now)
        });
        let picked = tokio::select! {
            _ = queue.inner.shutdown.cancelled() => return,
            picked = picked => picked,
        };
        match picked {
            Ok(slots) => waiters.wake_for_slots(slots),
            Err(error) => {
                tracing::warn!(%error, "cannot read the throttles whose slots were freed; every waiting request looks for itself");
                waiters.wake_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::protocol::{CreateJob, FinishJob, GetJobs, LeaseTerm, NamePattern, Priority};
    use crate::server::queue::QueueConfig;
    use crate::server::store::SqliteStore;

    fn wants(glob: &str) -> GetJobs {
        GetJobs {
            pattern: NamePattern::Glob(glob.into()),
            num_results: 10,
            priority: None,
            lease: LeaseTerm::Millis(60_000),
            worker: None,
        }
    }

    fn listed(id: u64, glob: &str, priority: Option<Priority>, want: usize) -> Listed {
        Listed {
            id,
            pattern: Arc::new(NamePattern::Glob(glob.into())),
            priority,
            want,
        }
    }

    #[tokio::test]
    async fn each_group_of_waiters_gets_as_many_slots_as_it_has_held_back_jobs_up_to_the_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
        let queue = Queue::start(store.clone(), QueueConfig::default());
        queue.ready().await;
        queue.set_throttle("t/*".into(), 2).await.unwrap();
        for _ in 0..2 {
            queue.create(CreateJob::named("t/held")).await.unwrap();
        }
        let held = queue.get_jobs(wants("t/*"), None).await.unwrap();
        for name in ["t/a", "t/a", "t/a", "t/b"] {
            queue.create(CreateJob::named(name)).await.unwrap();
        }
        // Parked behind the full throttle by a claim that took nothing.
        assert!(queue.get_jobs(wants("t/*"), None).await.unwrap().is_empty());
        for handout in held {
            let finish = FinishJob {
                id: handout.job.id,
                data: None,
                lease: Some(handout.lease_token),
                run: None,
            };
            queue.finish(finish).await.unwrap();
        }
        let high = Some(Priority::new(1000).unwrap());
        let waiters = vec![
            listed(1, "t/a", None, 1),
            listed(2, "t/b", None, 1),
            listed(3, "t/a", None, 1),
            listed(4, "t/a", None, 1),
            listed(5, "other/*", None, 1),
            listed(6, "t/a", high, 1),
            listed(7, "t/*", None, 5),
        ];
        let now = queue.now();
        let slots = queue
            .read(move |tx| {
                let throttles = tx.throttles().list_throttles()?;
                let globs = ["t/*".to_string()].into_iter().collect();
                pick(tx, &waiters, &globs, &throttles, now)
            })
            .await
            .unwrap();
        let picked: Vec<(u64, usize)> = slots.iter().map(|(id, s)| (*id, s.count)).collect();
        // Room for two: the two oldest on t/a, the one on t/b, and the one
        // on t/* for two; none for another name or a priority none has.
        assert_eq!(picked, [(1, 1), (3, 1), (2, 1), (7, 2)]);
        assert!(slots.iter().all(|(_, slot)| slot.glob == "t/*"));
        queue.shutdown();
        queue.settle().await;
        store.close();
    }
}
