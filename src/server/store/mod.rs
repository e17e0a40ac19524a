//! Persistence of jobs behind a trait, so that the queue's rules are written
//! once and a PostgreSQL store can follow the SQLite one.
//!
//! A [`Store`] runs operations against a [`StoreTx`]: a write operation runs
//! inside one transaction, and its answer is released only after that
//! transaction is durably committed. An operation that returns an error
//! leaves nothing behind.

mod archive_listing;
mod dependencies;
mod file_lock;
mod inbox;
mod labels;
mod ledger;
mod listing;
mod postgres;
mod schema;
mod sessions;
mod sqlite;
mod sqlite_dependencies;
mod sqlite_labels;
mod sqlite_ledger;
mod sqlite_sessions;
mod sqlite_throttles;
mod throttles;
mod within_bytes;
mod write_health;

pub use archive_listing::ArchiveQuery;
pub use dependencies::DependencyTx;
pub use labels::LabelTx;
pub use ledger::{LedgerTx, PurgeLimits};
pub use sessions::SessionTx;
pub use throttles::{Throttle, ThrottleTx};
pub use within_bytes::{ByteCount, Take};

pub use postgres::{DatabaseClock, PgOpenError, PgStore, redacted as postgres_url_redacted};
#[cfg(test)]
pub(crate) use postgres::{WRITER_SETTINGS as POSTGRES_WRITER_SETTINGS, plans as postgres_plans};
pub use sqlite::SqliteStore;

/// The error of opening the SQLite store.
pub mod sqlite_error {
    pub use super::sqlite::StoreOpenError;
}

use tokio::sync::oneshot;

use crate::protocol::{Job, JobError, JobId, JobState, NamePattern, Priority, Timestamp};

/// Which jobs a listing wants.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only names matching this.
    pub pattern: Option<NamePattern>,
    /// Only this state.
    pub state: Option<JobState>,
    /// Only jobs with this tag (found through the tag's index).
    pub tag: Option<String>,
    /// Only ids greater than this (for paging).
    pub after_id: Option<JobId>,
    /// At most this many.
    pub limit: usize,
    /// At most about this many bytes of names and data (0: no bound); a
    /// page always holds at least one job.
    pub max_bytes: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The jobs, in id order.
    pub jobs: Vec<Job>,
    /// Whether the page stopped at [`ListQuery::max_bytes`] before its
    /// limit, with more jobs after it.
    pub cut: bool,
}

/// A job a commit made ready, as announced to other servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyJob {
    /// The job.
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its priority.
    pub priority: Priority,
    /// When it is due.
    pub next_run: Timestamp,
}

/// What another server sharing the store committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcement {
    /// The jobs its commit made ready, the earliest lease it set, and the
    /// throttles whose slots it freed.
    Changes {
        /// Jobs written in QUEUED or RUNQUEUED.
        ready: Vec<ReadyJob>,
        /// The earliest lease expiry written.
        lease_expiry: Option<Timestamp>,
        /// The GLOBs of throttles whose slots it freed (or that it changed).
        freed: Vec<String>,
    },
    /// Announcements may have been missed (the listening connection was
    /// lost): every waiter and the timer should look again.
    Missed,
}

/// Row-level access to stored jobs inside one transaction.
pub trait StoreTx {
    /// Inserts a job and returns its new id.
    fn insert(&mut self, job: &Job) -> Result<JobId, JobError>;
    /// The job with this id.
    fn get(&mut self, id: JobId) -> Result<Option<Job>, JobError>;
    /// The job with this id, read without locking it against other
    /// servers sharing the store: for what an operation only shows (a
    /// child's `parentData`), never for what it decides or changes.
    fn peek(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        self.get(id)
    }
    /// Writes every field of an existing job.
    fn update(&mut self, job: &Job) -> Result<(), JobError>;
    /// Removes a job, with its tags and what it waits for (not what waits
    /// for it).
    fn delete(&mut self, id: JobId) -> Result<(), JobError>;
    /// The oldest job with exactly this name.
    fn find_by_name(&mut self, name: &str) -> Result<Option<Job>, JobError>;
    /// Up to `limit` jobs that may be handed out at `now`, best first:
    /// priority descending, then `nextRun` ascending, within `max_bytes`
    /// of names and data as stored (at least one job; see [`ByteCount`]),
    /// so that a claim of many big jobs never reads them all. Jobs parked
    /// behind a full throttle are left out (see [`ThrottleTx`]).
    fn ready(
        &mut self,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Job>, JobError>;
    /// Every child of a job. Not locked against other servers: a change
    /// of a child that matters to its parent locks the parent first (see
    /// the PostgreSQL store).
    fn children(&mut self, parent: JobId) -> Result<Vec<Job>, JobError>;
    /// Keeps the stored job as it is now, before a hand-out under `token`,
    /// replacing what was kept at its previous hand-out.
    fn keep_before_handout(&mut self, id: JobId, token: &str) -> Result<(), JobError>;
    /// The job as it was before the hand-out under `token`, if that is its
    /// latest hand-out; it is forgotten.
    fn take_before_handout(&mut self, id: JobId, token: &str) -> Result<Option<Job>, JobError>;
    /// Up to `limit` running jobs whose lease expired at or before `now`.
    fn expired_leases(&mut self, now: Timestamp, limit: usize) -> Result<Vec<Job>, JobError>;
    /// Up to `limit` running jobs without a lease that lapses (handed out to
    /// a plain Bedrock client) that were last handed out at or before
    /// `handed_out_by`, earliest first.
    fn unleased_running(
        &mut self,
        handed_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<Job>, JobError>;
    /// Ids, names and priorities of up to `limit` jobs that became due in
    /// `(after, upto]`.
    fn due_between(
        &mut self,
        after: Timestamp,
        upto: Timestamp,
        limit: usize,
    ) -> Result<Vec<(JobId, String, Priority)>, JobError>;
    /// The earliest moment after `now` at which a job becomes due, or any
    /// running job's lease lapses (which may be already past).
    fn next_wakeup(&mut self, now: Timestamp) -> Result<Option<Timestamp>, JobError>;
    /// Jobs in id order.
    fn list(&mut self, query: &ListQuery) -> Result<Page, JobError>;
    /// How many jobs are in each state.
    fn count_by_name(&mut self) -> Result<Vec<(String, JobState, u64)>, JobError>;
    /// The ledger, in the same transaction.
    fn ledger(&mut self) -> &mut dyn LedgerTx;
    /// Tags and tracking, in the same transaction.
    fn labels(&mut self) -> &mut dyn LabelTx;
    /// Throttles and parked jobs, in the same transaction.
    fn throttles(&mut self) -> &mut dyn ThrottleTx;
    /// The dependencies between jobs, in the same transaction.
    fn depends(&mut self) -> &mut dyn DependencyTx;
    /// Dashboard sessions ended by a logout, in the same transaction.
    fn sessions(&mut self) -> &mut dyn SessionTx;
    /// Tells the other servers sharing the store, once this transaction
    /// commits, which jobs it made ready, the earliest lease it set and the
    /// throttles whose slots it freed. Nothing to do for a store no other
    /// server shares.
    fn announce(
        &mut self,
        _ready: &[ReadyJob],
        _lease_expiry: Option<Timestamp>,
        _freed: &[String],
    ) -> Result<(), JobError> {
        Ok(())
    }
    /// Marks this point of the transaction, to keep what follows with
    /// [`StoreTx::keep_since_mark`] or undo it with
    /// [`StoreTx::undo_since_mark`] (one mark at a time). A store without
    /// nested transactions says so with an error.
    fn mark(&mut self) -> Result<(), JobError> {
        Err(JobError::Store(
            "this store cannot undo part of a transaction".into(),
        ))
    }
    /// Keeps what was done since the mark, and forgets the mark.
    fn keep_since_mark(&mut self) -> Result<(), JobError> {
        Ok(())
    }
    /// Undoes what was done since the mark, and forgets the mark.
    fn undo_since_mark(&mut self) -> Result<(), JobError> {
        Ok(())
    }
    /// The request fingerprint and job ids remembered for an idempotency
    /// key, if it was used at or after `since`.
    fn idempotent_answer(
        &mut self,
        key: &str,
        since: Timestamp,
    ) -> Result<Option<(String, Vec<JobId>)>, JobError>;
    /// Remembers the answer to a key (replacing an expired one), and
    /// forgets a bounded number of keys used before `expired_before`.
    fn remember_answer(
        &mut self,
        key: &str,
        fingerprint: &str,
        ids: &[JobId],
        now: Timestamp,
        expired_before: Timestamp,
    ) -> Result<(), JobError>;
}

/// Called once a write operation's transaction has ended: with `None` when it
/// committed, or the error that stopped the commit.
pub type Reply = Box<dyn FnOnce(Option<JobError>) + Send>;

/// A write operation: runs in the transaction and says whether its changes
/// are kept, with the reply to send once the outcome is durable.
pub type WriteOp = Box<dyn FnOnce(&mut dyn StoreTx) -> (bool, Reply) + Send>;

/// A read operation, run against a consistent snapshot.
pub type ReadOp = Box<dyn FnOnce(&mut dyn StoreTx) + Send>;

/// A durable home for jobs.
pub trait Store: Send + Sync {
    /// Queues a write operation. Its reply is called after the commit.
    /// Write operations run one at a time, in order; a store may commit
    /// several together (each undone alone if it fails), and their replies
    /// are called after that commit, before any operation of a later one
    /// runs.
    fn submit(&self, op: WriteOp);
    /// Runs a read operation off the async runtime.
    fn submit_read(&self, op: ReadOp);
    /// Why writes fail, while they do (a full disk, an I/O error): set by a
    /// failed write, cleared by the next that commits a change.
    fn write_failure(&self) -> Option<String> {
        None
    }
    /// Whether other servers share the store (and its jobs' leases).
    fn shared(&self) -> bool {
        false
    }
    /// What other servers sharing the store commit; `Some` only once, for
    /// the queue.
    fn announcements(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Announcement>> {
        None
    }
}

impl dyn Store {
    /// Runs `op` in a write transaction; resolves once the outcome is
    /// durable. An `Err` from `op` rolls back everything it did.
    pub async fn write<R, F>(&self, op: F) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn StoreTx) -> Result<R, JobError> + Send + 'static,
    {
        self.write_then(op, |_: &R, _| {}).await
    }

    /// As [`write`](#method.write), and once the transaction that kept
    /// `op`'s changes has ended, calls `ended` with `op`'s result and
    /// whether the transaction committed. `ended` runs on the writer,
    /// before any operation of a later commit runs; not at all if `op`
    /// failed.
    pub async fn write_then<R, F, E>(&self, op: F, ended: E) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn StoreTx) -> Result<R, JobError> + Send + 'static,
        E: FnOnce(&R, bool) + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(move |store: &mut dyn StoreTx| {
            let result = op(store);
            let keep = result.is_ok();
            let reply: Reply = Box::new(move |commit_error| {
                if let Ok(value) = &result {
                    ended(value, commit_error.is_none());
                }
                let _ = tx.send(match commit_error {
                    None => result,
                    Some(error) => Err(error),
                });
            });
            (keep, reply)
        }));
        rx.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// Runs `op` against a read snapshot.
    pub async fn read<R, F>(&self, op: F) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn StoreTx) -> Result<R, JobError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit_read(Box::new(move |store: &mut dyn StoreTx| {
            let _ = tx.send(op(store));
        }));
        rx.await.unwrap_or_else(|_| Err(abandoned()))
    }
}

/// The error for an operation that ended without an answer (it panicked, or
/// the store stopped under it).
fn abandoned() -> JobError {
    JobError::Store("the operation ended without an answer; see the server log".into())
}
