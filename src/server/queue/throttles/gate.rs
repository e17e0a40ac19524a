//! Claims taking slots: a claim ([`Gate`]) locks the throttles its pattern
//! may meet, counts each one's held jobs once, and hands out a job only if
//! every throttle it matches has room. A job held back is *parked* behind
//! the full throttle (with every other ready job matching it), out of the
//! ready index, so later claims neither step over it nor let it block other
//! names; while that throttle has room, claims take its parked jobs, best
//! first, from an index range of their own.

use std::cmp::Reverse;

use super::may_overlap;
use crate::protocol::pattern::glob_matches;
use crate::protocol::{Job, JobError, NamePattern, Priority};
use crate::server::queue::tracked::Tracked;
use crate::server::store::{Take, Throttle};

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

    /// Up to `take.jobs` jobs this claim may hand out, best first: ready
    /// jobs and jobs parked behind throttles with room, each of whose
    /// throttles has room for it (its slots are counted as taken). Jobs
    /// held back are parked behind the full throttle. Each read is bounded
    /// by `take.bytes`, so that a claim of many big jobs never reads them
    /// all at once.
    pub fn candidates(
        &mut self,
        tx: &mut Tracked,
        pattern: &NamePattern,
        priority: Option<Priority>,
        take: Take,
    ) -> Result<Vec<Job>, JobError> {
        if self.slots.is_empty() {
            return tx.ready(pattern, priority, take);
        }
        let want = take.jobs;
        let now = tx.now;
        let mut chosen: Vec<Job> = Vec::new();
        // Each round parks every job it holds back behind a throttle
        // without room, whose parked jobs no later round looks at (room
        // only shrinks during a claim): the rounds end.
        // Jobs chosen in an earlier round are still ready in the store
        // (they are handed out after this returns): each round asks for
        // `want` and leaves those out.
        loop {
            let mut pool = tx.ready(pattern, priority, take)?;
            for i in 0..self.slots.len() {
                if self.room(tx, i)? > 0 {
                    let glob = self.slots[i].glob.clone();
                    pool.extend(
                        tx.store()
                            .throttles()
                            .parked_jobs(&glob, pattern, priority, now, take, true)?,
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
