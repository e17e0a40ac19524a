//! A store transaction that remembers which jobs it made ready or scheduled,
//! so that the queue can wake waiters and set its timer once the transaction
//! is committed, without any rule having to remember to.

use crate::protocol::{Job, JobError, JobId, JobState, NamePattern, Priority, Timestamp};
use crate::server::store::{ReadyJob, StoreTx, Take};

use super::throttles::Holds;
use super::waiters::{DueJob, FreedSlot};
use crate::server::events::{EventKind, JobEvent};

/// What a committed transaction means for waiters and the timer.
#[derive(Debug, Default)]
pub struct Changes {
    /// Jobs written in QUEUED or RUNQUEUED, with their `nextRun`.
    pub ready: Vec<(DueJob, Timestamp)>,
    /// The earliest lease expiry written.
    pub lease_expiry: Option<Timestamp>,
    /// The job state changes made, in order, published once committed.
    pub events: Vec<JobEvent>,
    /// Throttles whose slots it freed, or that it changed, told to the
    /// servers sharing the store.
    pub freed: Vec<String>,
    /// This server's waiters given those slots, to wake once committed.
    pub slot_wake_ups: Vec<(u64, FreedSlot)>,
}

/// What a transaction had recorded at a mark (see [`Tracked::mark`]).
#[derive(Debug, Clone, Copy)]
pub struct Recorded {
    ready: usize,
    events: usize,
    lease_expiry: Option<Timestamp>,
}

/// A transaction plus the time the operation runs at, recording [`Changes`].
pub struct Tracked<'a> {
    store: &'a mut dyn StoreTx,
    /// The time the operation runs at.
    pub now: Timestamp,
    /// How long a supervisor may go unheard before it counts as gone, in
    /// ms: the ledger counts its capacity only between closer sightings.
    pub worker_gone_after_ms: i64,
    changes: Changes,
    /// Which of the jobs it read and wrote hold throttles' slots, and the
    /// holds it ended.
    holds: Holds,
}

impl<'a> Tracked<'a> {
    /// Wraps a store transaction.
    pub fn new(store: &'a mut dyn StoreTx, now: Timestamp, worker_gone_after_ms: i64) -> Self {
        Tracked {
            store,
            now,
            worker_gone_after_ms,
            changes: Changes::default(),
            holds: Holds::default(),
        }
    }

    /// Records a job state change, published if the transaction commits.
    pub fn emit(&mut self, event: JobEvent) {
        self.changes.events.push(event);
    }

    /// Records that `kind` happened to `job`, which is now as given.
    pub fn emit_of(&mut self, kind: EventKind, job: &Job) {
        let event = JobEvent::of(kind, job, self.now);
        self.emit(event);
    }

    /// The changes recorded so far.
    pub fn into_changes(self) -> Changes {
        self.changes
    }

    fn note(&mut self, id: JobId, job: &Job) {
        if job.state.is_ready_state() {
            let due = DueJob {
                id,
                name: job.name.clone(),
                priority: job.priority,
            };
            self.changes.ready.push((due, job.next_run));
        }
        if job.state == JobState::Running
            && let Some(expires) = job.lease.as_ref().and_then(|l| l.expires)
        {
            let earliest = self
                .changes
                .lease_expiry
                .map_or(expires, |e| e.min(expires));
            self.changes.lease_expiry = Some(earliest);
        }
    }

    /// Inserts a job.
    pub fn insert(&mut self, job: &Job) -> Result<JobId, JobError> {
        let id = self.store.insert(job)?;
        self.note(id, job);
        Ok(id)
    }

    /// Writes a job.
    pub fn update(&mut self, job: &Job) -> Result<(), JobError> {
        self.store.update(job)?;
        self.note(job.id, job);
        self.holds.wrote(job, self.now);
        Ok(())
    }

    /// Reads a job.
    pub fn get(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        let job = self.store.get(id)?;
        if let Some(job) = &job {
            self.holds.read(job, self.now);
        }
        Ok(job)
    }

    /// Reads a job that must exist.
    pub fn existing(&mut self, id: JobId) -> Result<Job, JobError> {
        self.get(id)?.ok_or(JobError::NoSuchJob)
    }

    /// Removes a job.
    pub fn delete(&mut self, id: JobId) -> Result<(), JobError> {
        self.store.delete(id)?;
        self.holds.removed(id);
        Ok(())
    }

    /// The account of throttles' slots held and freed in this transaction.
    pub fn holds(&mut self) -> &mut Holds {
        &mut self.holds
    }

    /// Tells the servers sharing the store, once committed, that these
    /// throttles' slots were freed.
    pub fn freed_slots(&mut self, globs: Vec<String>) {
        self.changes.freed.extend(globs);
    }

    /// Wakes these waiters of this server for freed slots once committed
    /// (unless served in the commit: see `serving`).
    pub fn wake_for_slots(&mut self, slots: Vec<(u64, FreedSlot)>) {
        self.changes.slot_wake_ups.extend(slots);
    }

    /// The waiters to wake for freed slots once committed, for a commit
    /// that serves some of them.
    pub fn slot_wake_ups(&mut self) -> &mut Vec<(u64, FreedSlot)> {
        &mut self.changes.slot_wake_ups
    }

    /// The jobs due in `(after, upto]` (see [`StoreTx::due_between`]); the
    /// RUNQUEUED ones among them ended their hold of a throttle's slot.
    pub fn due_between(
        &mut self,
        after: Timestamp,
        upto: Timestamp,
        limit: usize,
    ) -> Result<Vec<(JobId, String, Priority)>, JobError> {
        let due = self.store.due_between(after, upto, limit)?;
        self.holds
            .due_again(due.iter().map(|(_, name, _)| name.as_str()));
        Ok(due)
    }

    /// Marks this point of the transaction (see [`StoreTx::mark`]), with
    /// what it recorded so far.
    pub fn mark(&mut self) -> Result<Recorded, JobError> {
        self.store.mark()?;
        Ok(Recorded {
            ready: self.changes.ready.len(),
            events: self.changes.events.len(),
            lease_expiry: self.changes.lease_expiry,
        })
    }

    /// Keeps what was done since the mark.
    pub fn keep_since_mark(&mut self) -> Result<(), JobError> {
        self.store.keep_since_mark()
    }

    /// Undoes what was done since the mark, and forgets what it recorded.
    pub fn undo_since_mark(&mut self, recorded: Recorded) -> Result<(), JobError> {
        self.changes.ready.truncate(recorded.ready);
        self.changes.events.truncate(recorded.events);
        self.changes.lease_expiry = recorded.lease_expiry;
        self.store.undo_since_mark()
    }

    /// The jobs this transaction made ready that are due at its time, in
    /// the order it wrote them (each once).
    pub fn due_now(&self) -> Vec<DueJob> {
        let mut seen = std::collections::HashSet::new();
        self.changes
            .ready
            .iter()
            .filter(|(job, next_run)| *next_run <= self.now && seen.insert(job.id))
            .map(|(job, _)| job.clone())
            .collect()
    }

    /// Forgets that this transaction made these jobs ready now: they were
    /// handed out in it, so nobody is to be woken for them after it. What
    /// the hand-out itself scheduled for later (a `retryAfter` job's next
    /// hand-out) is kept, for the timer.
    pub fn forget_ready(&mut self, ids: &[JobId]) {
        let ids: std::collections::HashSet<JobId> = ids.iter().copied().collect();
        let now = self.now;
        self.changes
            .ready
            .retain(|(job, next_run)| *next_run > now || !ids.contains(&job.id));
    }

    /// The oldest job with this exact name.
    pub fn find_by_name(&mut self, name: &str) -> Result<Option<Job>, JobError> {
        self.store.find_by_name(name)
    }

    /// Jobs that may be handed out now, as many as `take` allows.
    pub fn ready(
        &mut self,
        pattern: &NamePattern,
        priority: Option<Priority>,
        take: Take,
    ) -> Result<Vec<Job>, JobError> {
        let now = self.now;
        self.store
            .ready(pattern, priority, now, take.jobs, take.bytes)
    }

    /// Every child of a job.
    pub fn children(&mut self, parent: JobId) -> Result<Vec<Job>, JobError> {
        self.store.children(parent)
    }

    /// Tells other servers sharing the store what this transaction made
    /// ready, the earliest lease it set and the throttles whose slots it
    /// freed, once it commits.
    pub fn announce(&mut self) -> Result<(), JobError> {
        let ready: Vec<ReadyJob> = self
            .changes
            .ready
            .iter()
            .map(|(job, next_run)| ReadyJob {
                id: job.id,
                name: job.name.clone(),
                priority: job.priority,
                next_run: *next_run,
            })
            .collect();
        self.store
            .announce(&ready, self.changes.lease_expiry, &self.changes.freed)
    }

    /// The underlying transaction, for reads the queue makes directly.
    pub fn store(&mut self) -> &mut dyn StoreTx {
        self.store
    }
}
