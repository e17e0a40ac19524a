//! A store transaction that remembers which jobs it made ready or scheduled,
//! so that the queue can wake waiters and set its timer once the transaction
//! is committed, without any rule having to remember to.

use crate::protocol::{Job, JobError, JobId, JobState, NamePattern, Priority, Timestamp};
use crate::server::store::{ReadyJob, StoreTx};

use super::waiters::DueJob;

/// What a committed transaction means for waiters and the timer.
#[derive(Debug, Default)]
pub struct Changes {
    /// Jobs written in QUEUED or RUNQUEUED, with their `nextRun`.
    pub ready: Vec<(DueJob, Timestamp)>,
    /// The earliest lease expiry written.
    pub lease_expiry: Option<Timestamp>,
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
}

impl<'a> Tracked<'a> {
    /// Wraps a store transaction.
    pub fn new(store: &'a mut dyn StoreTx, now: Timestamp, worker_gone_after_ms: i64) -> Self {
        Tracked {
            store,
            now,
            worker_gone_after_ms,
            changes: Changes::default(),
        }
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
        Ok(())
    }

    /// Reads a job.
    pub fn get(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        self.store.get(id)
    }

    /// Reads a job that must exist.
    pub fn existing(&mut self, id: JobId) -> Result<Job, JobError> {
        self.store.get(id)?.ok_or(JobError::NoSuchJob)
    }

    /// Removes a job.
    pub fn delete(&mut self, id: JobId) -> Result<(), JobError> {
        self.store.delete(id)
    }

    /// The oldest job with this exact name.
    pub fn find_by_name(&mut self, name: &str) -> Result<Option<Job>, JobError> {
        self.store.find_by_name(name)
    }

    /// Jobs that may be handed out now.
    pub fn ready(
        &mut self,
        pattern: &NamePattern,
        priority: Option<Priority>,
        limit: usize,
    ) -> Result<Vec<Job>, JobError> {
        let now = self.now;
        self.store.ready(pattern, priority, now, limit)
    }

    /// Every child of a job.
    pub fn children(&mut self, parent: JobId) -> Result<Vec<Job>, JobError> {
        self.store.children(parent)
    }

    /// Tells other servers sharing the store what this transaction made
    /// ready and the earliest lease it set, once it commits.
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
        self.store.announce(&ready, self.changes.lease_expiry)
    }

    /// The underlying transaction, for reads the queue makes directly.
    pub fn store(&mut self) -> &mut dyn StoreTx {
        self.store
    }
}
