//! The SQLite store: one file in WAL mode with `synchronous=FULL`, one writer
//! thread that commits operations in groups (each in its own savepoint), and a
//! small pool of read-only connections.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use thiserror::Error;

use super::write_health::WriteHealth;
use super::{ByteCount, ListQuery, ReadOp, Reply, Store, StoreTx, WriteOp};
use crate::protocol::{
    Data, Job, JobError, JobId, JobState, Lease, NamePattern, Priority, Timestamp,
};

/// The most write operations committed together.
const MAX_GROUP: usize = 512;

/// The most read-only connections kept open.
const MAX_READERS: usize = 4;

/// Prepared statements kept per connection. The queue and the ledger prepare
/// about 40 distinct statements; rusqlite's default of 16 made every cycle
/// parse and plan most of its SQL again.
const STATEMENT_CACHE: usize = 128;

/// Why the store could not be opened.
#[derive(Debug, Error)]
pub enum StoreOpenError {
    /// SQLite refused.
    #[error("job store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The directory for the file could not be made.
    #[error(
        "cannot create the directory for the job store {path}: {source}; create it or pass another --db"
    )]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store file could not be created.
    #[error(
        "cannot create the job store {path}: {source}; check the directory's owner and mode or pass another --db"
    )]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the job store's writer thread: {0}")]
    Thread(std::io::Error),
    /// Another server (or supervisor with an embedded server) has the file.
    #[error(
        "the job store {path} is in use by another jobmgr server{}; two servers on one file miss each other's wake-ups, so stop that one or pass another --db",
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    InUse {
        /// The store's file.
        path: PathBuf,
        /// The pid holding it, when its lock file says.
        holder: Option<u32>,
    },
    /// The file was written by a newer jobmgr.
    #[error(
        "the job store's schema is version {found}, newer than this jobmgr supports ({supported}); upgrade jobmgr or use another --db"
    )]
    TooNew {
        /// The file's version.
        found: i64,
        /// This build's version.
        supported: i64,
    },
}

/// Jobs in one SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    /// This server's claim on the file, released by [`SqliteStore::close`].
    lock: Mutex<Option<super::file_lock::StoreLock>>,
    writer: super::inbox::Inbox,
    readers: Arc<Mutex<Vec<Connection>>>,
    health: WriteHealth,
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, migrating its schema,
    /// and starts its writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreOpenError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreOpenError::Directory {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let lock = super::file_lock::StoreLock::acquire(path)?;
        create_private(path).map_err(|source| StoreOpenError::File {
            path: path.to_path_buf(),
            source,
        })?;
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(mode, "the job store could not switch to WAL mode");
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF;")?;
        super::schema::migrate(&mut conn)?;
        set_up_writer(&conn)?;

        let health = WriteHealth::default();
        let writer_health = health.clone();
        let writer = super::inbox::Inbox::start("jobmgr-store", move |receiver| {
            write_loop(conn, receiver, &writer_health)
        })
        .map_err(StoreOpenError::Thread)?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            lock: Mutex::new(Some(lock)),
            writer,
            readers: Arc::new(Mutex::new(Vec::new())),
            health,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops taking writes, lets the writer finish what it has, and waits
    /// for it. Later writes answer `ShuttingDown`.
    pub fn close(&self) {
        self.writer.close();
        self.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.close();
    }
}

impl Store for SqliteStore {
    fn write_failure(&self) -> Option<String> {
        self.health.failure()
    }

    fn submit(&self, op: WriteOp) {
        self.writer.submit(op);
    }

    fn submit_read(&self, op: ReadOp) {
        let readers = Arc::clone(&self.readers);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let conn = match conn {
                Some(conn) => conn,
                None => match open_reader(&path) {
                    Ok(conn) => conn,
                    Err(error) => {
                        op(&mut FailingTx(JobError::Store(error.to_string())));
                        return;
                    }
                },
            };
            if let Err(error) = conn.execute_batch("BEGIN") {
                op(&mut FailingTx(store_error(error)));
                return;
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| op(&mut SqliteTx { conn: &conn })));
            let _ = conn.execute_batch("COMMIT");
            if outcome.is_err() {
                tracing::error!("a read operation panicked; its connection is dropped");
                return;
            }
            let mut pool = readers.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < MAX_READERS {
                pool.push(conn);
            }
        });
    }
}

/// Creates a new store file readable by its owner only (SQLite gives its WAL
/// and shared-memory files the same mode), so that workers running under
/// another user cannot read the jobs' data. An existing file is left as it is.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The writer connection's own settings.
///
/// - Its query plans do not depend on the values bound to them (SQLite's
///   query planner stability guarantee). Otherwise a statement whose plan
///   looked at a bound value (a GLOB pattern, an id compared with a partial
///   index's condition) is parsed and planned again at each run, which was a
///   fifth of the writer's time on the claim and report path. The writer's
///   statements are written for plans that need no value.
/// - Its statement journal is kept in memory. Each operation runs in a
///   savepoint, and a page it changes that an earlier operation of the group
///   changed is first copied to that journal, which SQLite spills to a
///   temporary file past 64 KiB: a write per page. In memory it holds one
///   operation's pages, and is emptied when the operation's savepoint ends.
fn set_up_writer(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.execute_batch("PRAGMA temp_store = MEMORY")
}

/// Runs a statement that returns no rows from the connection's cache of
/// prepared statements (the writer's transaction and savepoint statements,
/// run several times per operation, are parsed once).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The writer thread: takes every queued operation (up to [`MAX_GROUP`]),
/// runs each in a savepoint of one transaction, commits once, then answers
/// them all. Answers wait for the commit, so an acknowledged write is durable.
fn write_loop(conn: Connection, receiver: mpsc::Receiver<WriteOp>, health: &WriteHealth) {
    use super::write_health::{Next, Probes};
    let mut probes = Probes::default();
    while let Some(step) = probes.next(&receiver, health) {
        let first = match step {
            Next::Run(op) => op,
            Next::Probe => {
                probe(&conn, health);
                continue;
            }
        };
        run_group(
            &conn,
            super::inbox::gather(first, &receiver, MAX_GROUP),
            health,
        );
    }
    tracing::debug!("job store writer stopped");
}

fn run_group(conn: &Connection, group: Vec<WriteOp>, health: &WriteHealth) {
    let mut waiting: std::collections::VecDeque<WriteOp> = group.into();
    while !waiting.is_empty() {
        match run_transaction(conn, &mut waiting) {
            Ok(false) => {}
            Ok(true) => health.committed(),
            Err(reason) => health.failed(reason),
        }
        if let Some(reason) = super::write_health::take_noted() {
            health.failed(reason);
        }
    }
}

/// The bytes a failing store's probe writes: a job with this much data
/// fits once the probe commits.
const PROBE_BYTES: usize = 64 * 1024;

/// A failing store's own write: [`PROBE_BYTES`] written again in a table
/// of its own (made here, the first time a store fails: not part of the
/// schema, so that its version is not changed), committed durably as any
/// change. Healthy again if it commits.
fn probe(conn: &Connection, health: &WriteHealth) {
    let written = (|| {
        run_cached(conn, "BEGIN IMMEDIATE")?;
        let result = conn
            .execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY, pad BLOB NOT NULL);
                 INSERT OR REPLACE INTO store_probe (id, pad) VALUES (1, zeroblob({PROBE_BYTES}));"
            ))
            .and_then(|()| run_cached(conn, "COMMIT"));
        if result.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    })();
    match written {
        Ok(()) => {
            tracing::info!("the job store can write again");
            health.committed();
        }
        Err(error) => health.failed(error.to_string()),
    }
    super::write_health::take_noted();
}

/// Runs operations from the front of `waiting` in one transaction and
/// answers them after the commit. If SQLite ends the transaction on its own
/// (it rolls back on I/O errors and a full disk), the operations run so far
/// are answered with the error and the rest are left for a new transaction,
/// so nothing ever runs outside a transaction. Returns whether a change was
/// committed, or why the transaction failed.
fn run_transaction(
    conn: &Connection,
    waiting: &mut std::collections::VecDeque<WriteOp>,
) -> Result<bool, String> {
    let changes_before = conn.total_changes();
    let mut kept_any = false;
    if let Err(error) = run_cached(conn, "BEGIN IMMEDIATE") {
        let error = store_error(error);
        for op in waiting.drain(..) {
            super::inbox::refuse(op, error.clone());
        }
        return Err(error.to_string());
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(waiting.len());
    while let Some(op) = waiting.pop_front() {
        if let Err(error) = run_cached(conn, "SAVEPOINT op") {
            super::inbox::refuse(op, store_error(error));
            continue;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| op(&mut SqliteTx { conn })));
        let keep = matches!(outcome, Ok((true, _)));
        kept_any |= keep;
        let ended = if keep {
            run_cached(conn, "RELEASE op")
        } else {
            conn.execute_batch("ROLLBACK TO op; RELEASE op")
        };
        if let Err(error) = &ended {
            tracing::error!(%error, "could not end a savepoint");
        }
        match outcome {
            Ok((_, reply)) => replies.push(reply),
            Err(_) => tracing::error!("a write operation panicked; its changes were rolled back"),
        }
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back.
            let error = JobError::Store(match ended {
                Err(error) => format!("the transaction was rolled back: {error}"),
                Ok(()) => "the transaction was rolled back by SQLite".into(),
            });
            tracing::error!(%error, "a write group was rolled back; its operations are answered with the error");
            replies
                .into_iter()
                .for_each(|reply| reply(Some(error.clone())));
            return Err(error.to_string());
        }
    }
    let committing = std::time::Instant::now();
    let committed = run_cached(conn, "COMMIT");
    crate::metrics::commit(committing.elapsed().as_secs_f64());
    match committed {
        Ok(()) => {
            replies.into_iter().for_each(|reply| reply(None));
            Ok(kept_any && conn.total_changes() > changes_before)
        }
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            let error = store_error(error);
            tracing::error!(%error, "commit failed; the group's changes were rolled back");
            replies
                .into_iter()
                .for_each(|reply| reply(Some(error.clone())));
            Err(error.to_string())
        }
    }
}

pub(super) fn store_error(error: rusqlite::Error) -> JobError {
    super::write_health::note(&error);
    JobError::Store(error.to_string())
}

/// A transaction that refuses everything, for operations that cannot run.
pub(super) struct FailingTx(pub(super) JobError);

impl StoreTx for FailingTx {
    fn insert(&mut self, _: &Job) -> Result<JobId, JobError> {
        Err(self.0.clone())
    }
    fn get(&mut self, _: JobId) -> Result<Option<Job>, JobError> {
        Err(self.0.clone())
    }
    fn update(&mut self, _: &Job) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn delete(&mut self, _: JobId) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn find_by_name(&mut self, _: &str) -> Result<Option<Job>, JobError> {
        Err(self.0.clone())
    }
    fn ready(
        &mut self,
        _: &NamePattern,
        _: Option<Priority>,
        _: Timestamp,
        _: usize,
        _: usize,
    ) -> Result<Vec<Job>, JobError> {
        Err(self.0.clone())
    }
    fn children(&mut self, _: JobId) -> Result<Vec<Job>, JobError> {
        Err(self.0.clone())
    }
    fn keep_before_handout(&mut self, _: JobId, _: &str) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn take_before_handout(&mut self, _: JobId, _: &str) -> Result<Option<Job>, JobError> {
        Err(self.0.clone())
    }
    fn expired_leases(&mut self, _: Timestamp, _: usize) -> Result<Vec<Job>, JobError> {
        Err(self.0.clone())
    }
    fn unleased_running(&mut self, _: Timestamp, _: usize) -> Result<Vec<Job>, JobError> {
        Err(self.0.clone())
    }
    fn due_between(
        &mut self,
        _: Timestamp,
        _: Timestamp,
        _: usize,
    ) -> Result<Vec<(JobId, String, Priority)>, JobError> {
        Err(self.0.clone())
    }
    fn next_wakeup(&mut self, _: Timestamp) -> Result<Option<Timestamp>, JobError> {
        Err(self.0.clone())
    }
    fn list(&mut self, _: &ListQuery) -> Result<super::Page, JobError> {
        Err(self.0.clone())
    }
    fn idempotent_answer(
        &mut self,
        _: &str,
        _: Timestamp,
    ) -> Result<Option<(String, Vec<JobId>)>, JobError> {
        Err(self.0.clone())
    }
    fn remember_answer(
        &mut self,
        _: &str,
        _: &str,
        _: &[JobId],
        _: Timestamp,
        _: Timestamp,
    ) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn count_by_name(&mut self) -> Result<Vec<(String, JobState, u64)>, JobError> {
        Err(self.0.clone())
    }
    fn ledger(&mut self) -> &mut dyn super::LedgerTx {
        self
    }
    fn labels(&mut self) -> &mut dyn super::LabelTx {
        self
    }

    fn throttles(&mut self) -> &mut dyn super::ThrottleTx {
        self
    }
    fn depends(&mut self) -> &mut dyn super::DependencyTx {
        self
    }
    fn sessions(&mut self) -> &mut dyn super::SessionTx {
        self
    }
}

impl super::DependencyTx for FailingTx {
    fn add(&mut self, _: JobId, _: &[JobId]) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn remove(&mut self, _: JobId, _: &[JobId]) -> Result<usize, JobError> {
        Err(self.0.clone())
    }
    fn outstanding(&mut self, _: JobId) -> Result<Vec<JobId>, JobError> {
        Err(self.0.clone())
    }
    fn dependents(&mut self, _: JobId) -> Result<Vec<JobId>, JobError> {
        Err(self.0.clone())
    }
}

/// The columns of a job, in the order [`read_job`] reads them.
pub(super) const COLUMNS: &str = "job_id, name, state, data, priority, created, next_run, last_run, repeat, \
     retry_after, parent_id, scheduled_run, lease_token, lease_expires, lease_term_ms, attempts, lapses";

const READY: &str = "state IN ('QUEUED', 'RUNQUEUED')";

/// Ready and not parked behind a full throttle: the `jobs_ready` index's
/// condition, written as the index has it so that SQLite uses it.
const READY_FREE: &str = "state IN ('QUEUED', 'RUNQUEUED') AND held_back_by IS NULL";

// The sweeper's and the scheduler's queries name the partial indexes they
// were written for: without statistics SQLite would take the listing's
// `jobs_state (state, job_id)` for their `state = …`, and read and sort
// every job in that state on every sweep and wake-up.

/// Running jobs whose lease has lapsed, soonest first.
fn expired_leases_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM jobs INDEXED BY jobs_lease WHERE state = 'RUNNING' \
         AND lease_expires IS NOT NULL AND lease_expires <= ?1 ORDER BY lease_expires LIMIT ?2"
    )
}

/// Ready jobs that fall due in `(?1, ?2]`.
fn due_between_sql() -> String {
    format!(
        "SELECT job_id, name, priority FROM jobs INDEXED BY jobs_due WHERE {READY} \
         AND next_run > ?1 AND next_run <= ?2 ORDER BY next_run LIMIT ?3"
    )
}

/// The next time something falls due: a ready job, or a lease's end.
fn next_wakeup_sql() -> String {
    format!(
        "SELECT MIN(t) FROM ( \
           SELECT MIN(next_run) AS t FROM jobs INDEXED BY jobs_due WHERE {READY} AND next_run > ?1 \
           UNION ALL \
           SELECT MIN(lease_expires) FROM jobs INDEXED BY jobs_lease \
             WHERE state = 'RUNNING' AND lease_expires IS NOT NULL)"
    )
}

pub(super) struct SqliteTx<'c> {
    pub(super) conn: &'c Connection,
}

impl SqliteTx<'_> {
    fn query_jobs(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Job>, JobError> {
        let mut statement = self.conn.prepare_cached(sql).map_err(store_error)?;
        let rows = statement.query_map(params, read_job).map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }
}

/// The stored length of a job row's name and data (columns 1 and 3 of
/// [`COLUMNS`]), read before they are.
pub(super) fn stored_size(row: &Row<'_>) -> usize {
    [1, 3]
        .iter()
        .map(|&i| {
            row.get_ref(i)
                .map_or(0, |v| v.as_bytes().map_or(0, <[u8]>::len))
        })
        .sum()
}

pub(super) fn read_job(row: &Row<'_>) -> rusqlite::Result<Job> {
    let state: String = row.get(2)?;
    let state = state.parse::<JobState>().map_err(|e| conversion(2, e))?;
    let data: String = row.get(3)?;
    let data: Data = serde_json::from_str(&data).map_err(|e| conversion(3, e))?;
    let priority = Priority::new(row.get(4)?).map_err(|e| conversion(4, e))?;
    let token: Option<String> = row.get(12)?;
    Ok(Job {
        id: row.get(0)?,
        name: row.get(1)?,
        state,
        data,
        priority,
        created: Timestamp(row.get(5)?),
        next_run: Timestamp(row.get(6)?),
        last_run: row.get::<_, Option<i64>>(7)?.map(Timestamp),
        repeat: row.get(8)?,
        retry_after: row.get(9)?,
        parent_id: row.get(10)?,
        scheduled_run: row.get::<_, Option<i64>>(11)?.map(Timestamp),
        lease: token
            .map(|token| -> rusqlite::Result<Lease> {
                Ok(Lease {
                    token,
                    expires: row.get::<_, Option<i64>>(13)?.map(Timestamp),
                    term_ms: row.get(14)?,
                })
            })
            .transpose()?,
        attempts: row.get(15)?,
        lapses: row.get(16)?,
    })
}

fn conversion(column: usize, error: impl std::fmt::Display) -> rusqlite::Error {
    let error: Box<dyn std::error::Error + Send + Sync> = error.to_string().into();
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, error)
}

impl StoreTx for SqliteTx<'_> {
    fn insert(&mut self, job: &Job) -> Result<JobId, JobError> {
        let data = serde_json::to_string(&job.data).map_err(|e| JobError::Store(e.to_string()))?;
        let lease = job.lease.as_ref();
        let mut statement = self
            .conn
            .prepare_cached(
                "INSERT INTO jobs (name, state, data, priority, created, next_run, last_run, repeat, \
                 retry_after, parent_id, scheduled_run, lease_token, lease_expires, lease_term_ms, \
                 attempts, lapses) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )
            .map_err(store_error)?;
        statement
            .execute(params![
                job.name,
                job.state.as_str(),
                data,
                job.priority.value(),
                job.created.0,
                job.next_run.0,
                job.last_run.map(|t| t.0),
                job.repeat,
                job.retry_after,
                job.parent_id,
                job.scheduled_run.map(|t| t.0),
                lease.map(|l| l.token.as_str()),
                lease.and_then(|l| l.expires).map(|t| t.0),
                lease.and_then(|l| l.term_ms),
                job.attempts,
                job.lapses,
            ])
            .map_err(store_error)?;
        Ok(self.conn.last_insert_rowid())
    }

    fn get(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE job_id = ?1"))
            .map_err(store_error)?;
        statement
            .query_row([id], read_job)
            .optional()
            .map_err(store_error)
    }

    fn update(&mut self, job: &Job) -> Result<(), JobError> {
        let data = serde_json::to_string(&job.data).map_err(|e| JobError::Store(e.to_string()))?;
        let lease = job.lease.as_ref();
        let mut statement = self
            .conn
            .prepare_cached(
                "UPDATE jobs SET name = ?2, state = ?3, data = ?4, priority = ?5, created = ?6, \
                 next_run = ?7, last_run = ?8, repeat = ?9, retry_after = ?10, parent_id = ?11, \
                 scheduled_run = ?12, lease_token = ?13, lease_expires = ?14, lease_term_ms = ?15, \
                 attempts = ?16, lapses = ?17, held_back_by = NULL WHERE job_id = ?1",
            )
            .map_err(store_error)?;
        statement
            .execute(params![
                job.id,
                job.name,
                job.state.as_str(),
                data,
                job.priority.value(),
                job.created.0,
                job.next_run.0,
                job.last_run.map(|t| t.0),
                job.repeat,
                job.retry_after,
                job.parent_id,
                job.scheduled_run.map(|t| t.0),
                lease.map(|l| l.token.as_str()),
                lease.and_then(|l| l.expires).map(|t| t.0),
                lease.and_then(|l| l.term_ms),
                job.attempts,
                job.lapses,
            ])
            .map_err(store_error)?;
        Ok(())
    }

    fn delete(&mut self, id: JobId) -> Result<(), JobError> {
        for sql in [
            "DELETE FROM jobs WHERE job_id = ?1",
            "DELETE FROM jobs_before_handout WHERE job_id = ?1",
            "DELETE FROM job_tags WHERE job_id = ?1",
            "DELETE FROM job_dependencies WHERE job_id = ?1",
        ] {
            let mut statement = self.conn.prepare_cached(sql).map_err(store_error)?;
            statement.execute([id]).map_err(store_error)?;
        }
        Ok(())
    }

    fn keep_before_handout(&mut self, id: JobId, token: &str) -> Result<(), JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO jobs_before_handout (handout_token, {COLUMNS}) \
                 SELECT ?2, {COLUMNS} FROM jobs WHERE job_id = ?1"
            ))
            .map_err(store_error)?;
        statement.execute(params![id, token]).map_err(store_error)?;
        Ok(())
    }

    fn take_before_handout(&mut self, id: JobId, token: &str) -> Result<Option<Job>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&format!(
                "DELETE FROM jobs_before_handout WHERE job_id = ?1 AND handout_token = ?2 \
                 RETURNING {COLUMNS}"
            ))
            .map_err(store_error)?;
        statement
            .query_row(params![id, token], read_job)
            .optional()
            .map_err(store_error)
    }

    fn find_by_name(&mut self, name: &str) -> Result<Option<Job>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM jobs WHERE name = ?1 ORDER BY job_id LIMIT 1"
            ))
            .map_err(store_error)?;
        statement
            .query_row([name], read_job)
            .optional()
            .map_err(store_error)
    }

    fn ready(
        &mut self,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Job>, JobError> {
        // One query per priority, each an index range on (priority, next_run),
        // so that jobs scheduled for later never have to be stepped over.
        let (name_clause, name_param) = match pattern {
            NamePattern::Glob(glob) => ("name GLOB ?3", glob.clone()),
            NamePattern::List(names) => (
                "name IN (SELECT value FROM json_each(?3))",
                serde_json::to_string(names).map_err(|e| JobError::Store(e.to_string()))?,
            ),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE {READY_FREE} AND priority = ?1 AND next_run <= ?2 \
             AND {name_clause} ORDER BY next_run, job_id LIMIT ?4"
        );
        let priorities: Vec<i64> = match priority {
            Some(p) => vec![p.value()],
            None => Priority::ALL.to_vec(),
        };
        let mut found = Vec::new();
        let mut bytes = ByteCount::new(max_bytes);
        for p in priorities {
            let wanted = limit - found.len();
            if wanted == 0 || bytes.full() {
                break;
            }
            let mut statement = self.conn.prepare_cached(&sql).map_err(store_error)?;
            let mut rows = statement
                .query(params![p, now.0, name_param, wanted as i64])
                .map_err(store_error)?;
            while let Some(row) = rows.next().map_err(store_error)? {
                if !bytes.admit(stored_size(row), found.is_empty()) {
                    break;
                }
                found.push(read_job(row).map_err(store_error)?);
            }
        }
        Ok(found)
    }

    fn children(&mut self, parent: JobId) -> Result<Vec<Job>, JobError> {
        self.query_jobs(
            &format!(
                "SELECT {COLUMNS} FROM jobs WHERE parent_id != 0 AND parent_id = ?1 ORDER BY job_id"
            ),
            [parent],
        )
    }

    fn expired_leases(&mut self, now: Timestamp, limit: usize) -> Result<Vec<Job>, JobError> {
        self.query_jobs(&expired_leases_sql(), params![now.0, limit as i64])
    }

    fn unleased_running(
        &mut self,
        handed_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<Job>, JobError> {
        self.query_jobs(
            &format!(
                "SELECT {COLUMNS} FROM jobs WHERE state = 'RUNNING' AND lease_expires IS NULL \
                 AND last_run IS NOT NULL AND last_run <= ?1 ORDER BY last_run LIMIT ?2"
            ),
            params![handed_out_by.0, limit as i64],
        )
    }

    fn due_between(
        &mut self,
        after: Timestamp,
        upto: Timestamp,
        limit: usize,
    ) -> Result<Vec<(JobId, String, Priority)>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&due_between_sql())
            .map_err(store_error)?;
        let rows = statement
            .query_map(params![after.0, upto.0, limit as i64], |row| {
                let priority = Priority::new(row.get(2)?).map_err(|e| conversion(2, e))?;
                Ok((row.get(0)?, row.get::<_, String>(1)?, priority))
            })
            .map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }

    fn next_wakeup(&mut self, now: Timestamp) -> Result<Option<Timestamp>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(&next_wakeup_sql())
            .map_err(store_error)?;
        let next: Option<i64> = statement
            .query_row([now.0], |row| row.get(0))
            .map_err(store_error)?;
        Ok(next.map(Timestamp))
    }

    fn list(&mut self, query: &ListQuery) -> Result<super::Page, JobError> {
        // With a state, whether the GLOB's prefix is shared by many jobs.
        let wide_prefix = match super::listing::prefix_count_sql(query) {
            Some((sql, params)) => {
                let count: i64 = self
                    .conn
                    .prepare_cached(&sql)
                    .map_err(store_error)?
                    .query_row(rusqlite::params_from_iter(params), |row| row.get(0))
                    .map_err(store_error)?;
                count >= super::listing::WIDE_PREFIX_JOBS
            }
            None => false,
        };
        let (sql, params) = super::listing::list_sql(COLUMNS, query, wide_prefix);
        let mut statement = self.conn.prepare_cached(&sql).map_err(store_error)?;
        let mut rows = statement
            .query(rusqlite::params_from_iter(params))
            .map_err(store_error)?;
        let mut page = super::Page::default();
        let mut bytes = ByteCount::new(query.max_bytes);
        while let Some(row) = rows.next().map_err(store_error)? {
            if !bytes.admit(stored_size(row), page.jobs.is_empty()) {
                page.cut = true;
                break;
            }
            page.jobs.push(read_job(row).map_err(store_error)?);
        }
        Ok(page)
    }

    fn idempotent_answer(
        &mut self,
        key: &str,
        since: Timestamp,
    ) -> Result<Option<(String, Vec<JobId>)>, JobError> {
        let found: Option<(String, String)> = self
            .conn
            .prepare_cached(
                "SELECT fingerprint, job_ids FROM idempotency_keys WHERE key = ?1 AND created >= ?2",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![key, since.0], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(store_error)?;
        found
            .map(|(fingerprint, ids)| {
                let ids: Vec<JobId> =
                    serde_json::from_str(&ids).map_err(|e| JobError::Store(e.to_string()))?;
                Ok((fingerprint, ids))
            })
            .transpose()
    }

    fn remember_answer(
        &mut self,
        key: &str,
        fingerprint: &str,
        ids: &[JobId],
        now: Timestamp,
        expired_before: Timestamp,
    ) -> Result<(), JobError> {
        let ids = serde_json::to_string(ids).map_err(|e| JobError::Store(e.to_string()))?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO idempotency_keys (key, fingerprint, job_ids, created) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut statement| statement.execute(params![key, fingerprint, ids, now.0]))
            .map_err(store_error)?;
        self.conn
            .prepare_cached(
                "DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys \
                 WHERE created < ?1 ORDER BY created LIMIT 100)",
            )
            .and_then(|mut statement| statement.execute(params![expired_before.0]))
            .map_err(store_error)?;
        Ok(())
    }

    fn count_by_name(&mut self) -> Result<Vec<(String, JobState, u64)>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached("SELECT name, state, COUNT(*) FROM jobs GROUP BY name, state")
            .map_err(store_error)?;
        let rows = statement
            .query_map([], |row| {
                let state: String = row.get(1)?;
                let state = state.parse::<JobState>().map_err(|e| conversion(1, e))?;
                Ok((row.get(0)?, state, row.get::<_, i64>(2)? as u64))
            })
            .map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }

    fn mark(&mut self) -> Result<(), JobError> {
        // Outside a transaction (SQLite ended it on an error of its own), a
        // savepoint would begin one of its own and commit on release.
        if self.conn.is_autocommit() {
            return Err(JobError::Store(
                "the transaction was rolled back by SQLite".into(),
            ));
        }
        run_cached(self.conn, "SAVEPOINT part").map_err(store_error)
    }
    fn keep_since_mark(&mut self) -> Result<(), JobError> {
        run_cached(self.conn, "RELEASE part").map_err(store_error)
    }
    fn undo_since_mark(&mut self) -> Result<(), JobError> {
        self.conn
            .execute_batch("ROLLBACK TO part; RELEASE part")
            .map_err(store_error)
    }
    fn ledger(&mut self) -> &mut dyn super::LedgerTx {
        self
    }
    fn labels(&mut self) -> &mut dyn super::LabelTx {
        self
    }

    fn throttles(&mut self) -> &mut dyn super::ThrottleTx {
        self
    }

    fn depends(&mut self) -> &mut dyn super::DependencyTx {
        self
    }
    fn sessions(&mut self) -> &mut dyn super::SessionTx {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new store's file, and a connection to it set up as the writer's
    /// (planning without looking at values).
    fn writer_on_new_store() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        set_up_writer(&conn).unwrap();
        (dir, conn)
    }

    #[test]
    fn the_sweeper_and_scheduler_read_their_partial_indexes() {
        let (_dir, conn) = writer_on_new_store();
        for (sql, index) in [
            (expired_leases_sql(), "jobs_lease"),
            (due_between_sql(), "jobs_due"),
            (next_wakeup_sql(), "jobs_due"),
            (next_wakeup_sql(), "jobs_lease"),
            (
                super::super::sqlite_ledger::OPEN_RUNS_OF.to_string(),
                "attempts_open",
            ),
            (
                super::super::sqlite_ledger::OPEN_RUNS.to_string(),
                "attempts_open",
            ),
        ] {
            let count = conn.prepare(&sql).unwrap().parameter_count();
            let plan = plan_of(
                &conn,
                &sql,
                &vec![rusqlite::types::Value::Integer(1); count],
            );
            assert!(plan.contains(&format!("INDEX {index}")), "{sql}: {plan}");
            assert!(!plan.contains("jobs_state"), "{sql}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "no sort: {plan}");
        }
    }

    /// The plan of `sql` with `params`, one line per step.
    fn plan_of(conn: &Connection, sql: &str, params: &[rusqlite::types::Value]) -> String {
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = statement
            .query_map(rusqlite::params_from_iter(params), |row| row.get(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        plan.join("\n")
    }

    #[test]
    fn the_writers_glob_matches_read_the_range_of_their_prefix() {
        let (_dir, conn) = writer_on_new_store();
        use super::super::sqlite_throttles::{held_back_sql, held_matching_sql, park_matching_sql};
        let (sql, params) = held_matching_sql("Email*", Timestamp(0));
        let plan = plan_of(&conn, &sql, &params);
        assert!(
            plan.contains("INDEX jobs_held (name>? AND name<?)"),
            "{plan}"
        );
        let (sql, params) = park_matching_sql("Email*");
        let plan = plan_of(&conn, &sql, &params);
        assert!(
            plan.contains("INDEX jobs_name (name>? AND name<?)"),
            "{plan}"
        );
        // No prefix, no range: the held jobs' index whole, not the table.
        let (sql, params) = held_matching_sql("*", Timestamp(0));
        let plan = plan_of(&conn, &sql, &params);
        assert!(plan.contains("jobs_held"), "{plan}");
        // The jobs a throttle holds back: its parked ones' range, and the
        // range of its prefix for those not parked.
        let wanted = NamePattern::Glob("Email*".into());
        for (parked, index) in [
            (true, "INDEX jobs_held_back (held_back_by=?"),
            (false, "INDEX jobs_name (name>? AND name<?)"),
        ] {
            let (sql, params) =
                held_back_sql("Email*", &wanted, None, Timestamp(0), 8, parked).unwrap();
            let plan = plan_of(&conn, &sql, &params);
            assert!(plan.contains(index), "{plan}");
        }
    }

    /// Every statement the connection has prepared, with how often SQLite
    /// prepared it again.
    fn reprepares(conn: &Connection) -> Vec<(String, i32)> {
        use rusqlite::ffi;
        let mut found = Vec::new();
        // SAFETY: the handle is this connection's, used on this thread; the
        // statements it lists stay alive (in the connection's cache) while
        // they are read, and their SQL is copied out.
        unsafe {
            let db = conn.handle();
            let mut statement = ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !statement.is_null() {
                let sql = std::ffi::CStr::from_ptr(ffi::sqlite3_sql(statement))
                    .to_string_lossy()
                    .into_owned();
                let count =
                    ffi::sqlite3_stmt_status(statement, ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
                found.push((sql, count));
                statement = ffi::sqlite3_next_stmt(db, statement);
            }
        }
        found
    }

    #[test]
    fn the_writers_statements_are_planned_once_whatever_their_values() {
        let (dir, conn) = writer_on_new_store();
        let path = dir.path().join("jobs.db");
        let mut tx = SqliteTx { conn: &conn };
        // The claim and report path's reads, each run with changing values:
        // a GLOB pattern, every priority, ids on either side of a partial
        // index's condition.
        for round in 0..4i64 {
            for pattern in [
                NamePattern::Glob(format!("name-{round}*")),
                NamePattern::Glob("*".into()),
                NamePattern::List(vec![format!("exact-{round}")]),
            ] {
                tx.ready(&pattern, None, Timestamp(round), 10, 0).unwrap();
            }
            tx.children(round).unwrap();
            tx.get(round).unwrap();
            let ledger = tx.ledger();
            ledger.open_runs(Some(&format!("worker-{round}"))).unwrap();
            ledger.open_runs(None).unwrap();
            ledger.occurrence_start(round).unwrap();
            tx.depends().dependents(round).unwrap();
        }
        let again: Vec<_> = reprepares(&conn)
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .collect();
        assert!(again.is_empty(), "prepared again at a new value: {again:?}");
        // The check itself sees what it is about: the same reads on a
        // connection that plans with values are prepared again.
        let plain = Connection::open(&path).unwrap();
        let mut tx = SqliteTx { conn: &plain };
        for round in 0..3 {
            tx.children(round).unwrap();
        }
        assert!(reprepares(&plain).iter().any(|(_, count)| *count > 0));
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("PRAGMA user_version = 99").unwrap();
        }
        match SqliteStore::open(&path) {
            Err(StoreOpenError::TooNew { found: 99, .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("a newer schema was accepted"),
        }
    }

    #[test]
    fn a_new_store_and_its_wal_are_readable_by_the_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = SqliteStore::open(&path).unwrap();
        let wal = dir.path().join("jobs.db-wal");
        for file in [&path, &wal] {
            let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{} has mode {mode:o}", file.display());
        }
        drop(store);
        // An existing file keeps the mode its owner gave it.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        drop(SqliteStore::open(&path).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn opening_migrates_to_the_current_version_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, super::super::schema::CURRENT_VERSION);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        // Reopening an up-to-date file changes nothing.
        drop(conn);
        drop(SqliteStore::open(&path).unwrap());
    }
}
