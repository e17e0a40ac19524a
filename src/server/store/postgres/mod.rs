//! The PostgreSQL store, for several servers on one database: one writer
//! connection per server that runs the write operations queued together in
//! one transaction (each in a savepoint of its own), a small pool of
//! read-only connections, row locks so that servers skip each other's
//! claims, commits announced to the other servers
//! with `NOTIFY`, and the database's clock as the one clock.

mod clock;
mod connect;
mod dependencies;
mod glob;
mod group;
mod jobs;
mod labels;
mod ledger;
mod ledger_stats;
mod notify;
#[cfg(test)]
pub(crate) mod plans;
mod schema;
mod sessions;
mod throttles;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, Row, Statement};

use super::inbox::{Inbox, refuse};
use super::sqlite::FailingTx;
use super::write_health::WriteHealth;
use super::{ReadOp, Store, WriteOp};
use crate::protocol::JobError;

pub use clock::DatabaseClock;
pub use connect::{PgOpenError, redacted};
pub use notify::Announcements;

/// The most read-only connections kept open.
const MAX_READERS: u32 = 4;

/// The read connections.
type ReaderPool = r2d2::Pool<r2d2_postgres::PostgresConnectionManager<postgres::NoTls>>;

/// Jobs in a PostgreSQL database, shared with other servers.
pub struct PgStore {
    url: String,
    writer: Inbox,
    /// `None` only while dropped (see [`Drop`]).
    readers: Option<ReaderPool>,
    health: WriteHealth,
    clock: Arc<DatabaseClock>,
    announcements: Announcements,
}

impl PgStore {
    /// Connects to the database at `url` (retrying with backoff while it
    /// cannot be reached, until `give_up_after` if given or until
    /// `cancelled` is set), creates or migrates its schema, and starts the
    /// writer and the listener for other servers' commits.
    pub fn open(
        url: &str,
        give_up_after: Option<Duration>,
        cancelled: &std::sync::atomic::AtomicBool,
    ) -> Result<Self, PgOpenError> {
        let config = connect::parse(url)?;
        let mut client = connect::with_backoff(&config, give_up_after, cancelled)?;
        schema::migrate(&mut client).map_err(|e| PgOpenError::from_postgres(&config, e))?;
        let clock = Arc::new(
            DatabaseClock::measure(&mut client)
                .map_err(|e| PgOpenError::from_postgres(&config, e))?,
        );
        let manager =
            r2d2_postgres::PostgresConnectionManager::new(config.clone(), postgres::NoTls);
        let readers = r2d2::Pool::builder()
            .max_size(MAX_READERS)
            .min_idle(Some(0))
            .connection_timeout(Duration::from_secs(5))
            .build_unchecked(manager);
        let announcements = Announcements::listen(config.clone(), Arc::clone(&clock));
        let health = WriteHealth::default();
        let writer_health = health.clone();
        let writer_clock = Arc::clone(&clock);
        let origin = announcements.origin();
        let writer = Inbox::start("jobmgr-pg-store", move |receiver| {
            let writer = Writer {
                config,
                conn: Some(Conn::new(client)),
                health: writer_health,
                clock: writer_clock,
                origin,
            };
            writer.run(receiver)
        })
        .map_err(PgOpenError::Thread)?;
        Ok(PgStore {
            url: redacted(url),
            writer,
            readers: Some(readers),
            health,
            clock,
            announcements,
        })
    }

    /// The database's address, without its password.
    pub fn describe(&self) -> &str {
        &self.url
    }

    /// The database's clock, as this server reads it.
    pub fn clock(&self) -> Arc<DatabaseClock> {
        Arc::clone(&self.clock)
    }

    /// Stops taking writes, lets the writer finish what it has, and waits
    /// for it; stops listening. Later writes answer `ShuttingDown`.
    pub fn close(&self) {
        self.writer.close();
        self.announcements.stop();
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.close();
        // Each read connection owns a runtime of its own, which may not be
        // dropped on an async thread (the last handle on the store may go
        // on one, when a server stops): the pool goes on a thread of its
        // own.
        if let Some(readers) = self.readers.take() {
            let _ = std::thread::Builder::new()
                .name("jobmgr-pg-close".into())
                .spawn(move || drop(readers));
        }
    }
}

impl Store for PgStore {
    fn write_failure(&self) -> Option<String> {
        self.health.failure()
    }

    fn submit(&self, op: WriteOp) {
        self.writer.submit(op);
    }

    fn submit_read(&self, op: ReadOp) {
        let readers = self
            .readers
            .clone()
            .expect("the read pool lives as long as the store");
        tokio::task::spawn_blocking(move || {
            let mut client = match readers.get() {
                Ok(client) => client,
                Err(error) => {
                    op(&mut FailingTx(unavailable(&error.to_string())));
                    return;
                }
            };
            if let Err(error) =
                client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            {
                op(&mut FailingTx(pg_error(&error)));
                return;
            }
            let mut cache = HashMap::new();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                op(&mut PgTx {
                    client: &mut client,
                    cache: &mut cache,
                    locking: false,
                    origin: 0,
                    deferred: Vec::new(),
                    childless: Default::default(),
                    throttles: None,
                })
            }));
            let _ = client.batch_execute("COMMIT");
            if outcome.is_err() {
                tracing::error!("a read operation panicked");
            }
        });
    }

    fn shared(&self) -> bool {
        true
    }

    fn announcements(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<super::Announcement>> {
        self.announcements.take_receiver()
    }
}

/// The error for a database that cannot be reached.
pub(super) fn unavailable(why: &str) -> JobError {
    JobError::StoreUnavailable(why.to_string())
}

/// A PostgreSQL error as a store error. A conflict when the operation met
/// another server's in a deadlock or a serialization failure (it was
/// rolled back, and the queue runs it again); "unavailable" (503: retry,
/// or go to another server) when retrying can work: a lost or refused
/// connection, a database shutting down or out of connections; anything
/// else failed the operation (502).
pub(super) fn pg_error(error: &postgres::Error) -> JobError {
    match error.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            if code == "40P01" || code == "40001" {
                return JobError::StoreConflict(db.message().to_string());
            }
            let retryable = ["08", "53", "57", "40"]
                .iter()
                .any(|class| code.starts_with(class));
            if retryable {
                unavailable(db.message())
            } else {
                JobError::Store(db.message().to_string())
            }
        }
        None if is_connection_error(error) => unavailable(&error.to_string()),
        None => JobError::Store(error.to_string()),
    }
}

/// Whether a client-side error is about the connection (closed, or an
/// I/O error under it), not about a statement.
fn is_connection_error(error: &postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    error.to_string().contains("connection")
}

/// The writer's session settings (see [`Conn::new`]).
pub(crate) const WRITER_SETTINGS: &str = "SET enable_seqscan = off";

/// A connection with the statements it has prepared.
pub(super) struct Conn {
    client: Client,
    cache: HashMap<String, Statement>,
}

impl Conn {
    /// The writer's connection. Its plans do not depend on the tables'
    /// statistics: with sequential scans priced out, every statement that
    /// an index can serve uses it, whether the tables were analyzed while
    /// empty (a cached plan would scan them in full forever after, as they
    /// grow) or never. Every statement the writer runs on a large table
    /// has an index to use (`plans` tests this on an analyzed-empty
    /// database).
    fn new(mut client: Client) -> Self {
        if let Err(error) = client.batch_execute(WRITER_SETTINGS) {
            tracing::warn!(%error, "could not set the writer's plan settings");
        }
        Conn {
            client,
            cache: HashMap::new(),
        }
    }
}

/// One transaction on a PostgreSQL connection. In a write transaction
/// (`locking`), reads of rows the operation may change lock them, so that
/// servers sharing the database take turns on each job and skip each
/// other's claims.
pub(super) struct PgTx<'c> {
    pub(super) client: &'c mut Client,
    pub(super) cache: &'c mut HashMap<String, Statement>,
    pub(super) locking: bool,
    /// This server's id in announcements to the others.
    pub(super) origin: u64,
    /// Statistics events to write at the end of the transaction.
    deferred: Vec<ledger::Deferred>,
    /// Jobs this operation found without children (see [`StoreTx::children`]),
    /// forgotten when it inserts or updates a child.
    ///
    /// [`StoreTx::children`]: super::StoreTx::children
    childless: std::collections::HashSet<crate::protocol::JobId>,
    /// The throttles, as a write transaction first read them (see
    /// [`ThrottleTx::list_throttles`]); forgotten when one is changed.
    ///
    /// [`ThrottleTx::list_throttles`]: super::ThrottleTx::list_throttles
    throttles: Option<Vec<super::Throttle>>,
}

impl PgTx<'_> {
    /// The statement for `sql`, prepared once per connection.
    fn statement(&mut self, sql: &str) -> Result<Statement, JobError> {
        if let Some(statement) = self.cache.get(sql) {
            return Ok(statement.clone());
        }
        crate::metrics::store_statement();
        let statement = self.client.prepare(sql).map_err(|e| pg_error(&e))?;
        #[cfg(test)]
        if self.locking {
            plans::prepared(sql);
        }
        self.cache.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    /// Runs a query, returning its rows.
    pub(super) fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, JobError> {
        let statement = self.statement(sql)?;
        crate::metrics::store_statement();
        self.client
            .query(&statement, params)
            .map_err(|e| pg_error(&e))
    }

    /// Runs a query that returns at most one row.
    pub(super) fn query_opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, JobError> {
        let statement = self.statement(sql)?;
        crate::metrics::store_statement();
        self.client
            .query_opt(&statement, params)
            .map_err(|e| pg_error(&e))
    }

    /// Runs a statement, returning how many rows it changed.
    pub(super) fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, JobError> {
        let statement = self.statement(sql)?;
        crate::metrics::store_statement();
        self.client
            .execute(&statement, params)
            .map_err(|e| pg_error(&e))
    }

    /// `FOR UPDATE` in a write transaction, nothing in a read.
    pub(super) fn lock_clause(&self) -> &'static str {
        if self.locking { " FOR UPDATE" } else { "" }
    }
}

/// A value read from a row that does not hold what the store wrote.
pub(super) fn corrupt(what: &str, error: impl std::fmt::Display) -> JobError {
    JobError::Store(format!("a stored {what} cannot be read: {error}"))
}

/// The writer thread's state: its connection (reopened when lost).
struct Writer {
    config: postgres::Config,
    conn: Option<Conn>,
    health: WriteHealth,
    clock: Arc<DatabaseClock>,
    origin: u64,
}

impl Writer {
    /// Runs the queued operations in groups, each group in one transaction
    /// (see [`group`]), and answers them once it has ended.
    fn run(mut self, receiver: mpsc::Receiver<WriteOp>) {
        use super::write_health::{Next, Probes};
        let mut probes = Probes::default();
        while let Some(step) = probes.next(&receiver, &self.health) {
            match step {
                Next::Run(op) => {
                    self.run_group(super::inbox::gather(op, &receiver, group::MAX_GROUP))
                }
                Next::Probe => self.probe(),
            }
        }
        tracing::debug!("job store writer stopped");
    }

    /// The connection, reconnecting once if it was lost; `None` (with the
    /// reason) while the database cannot be reached.
    fn connection(&mut self) -> Result<&mut Conn, JobError> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            match self.config.connect(postgres::NoTls) {
                Ok(mut client) => {
                    if let Err(error) = self.clock.remeasure(&mut client) {
                        tracing::warn!(%error, "could not read the database's clock");
                    }
                    tracing::info!("job store: connected to the database again");
                    self.conn = Some(Conn::new(client));
                }
                Err(error) => return Err(unavailable(&connect::reason(&error))),
            }
        }
        self.conn
            .as_mut()
            .ok_or_else(|| unavailable("no connection"))
    }

    /// The connection, in a new transaction. A connection that died while
    /// idle (the database restarted, the network blinked) is noticed only
    /// here: nothing has run in it yet, so it is opened again once.
    fn begin(&mut self) -> Result<&mut Conn, JobError> {
        crate::metrics::store_statement();
        let begun = self.connection()?.client.batch_execute("BEGIN");
        if let Err(error) = begun {
            let error = pg_error(&error);
            if !matches!(error, JobError::StoreUnavailable(_)) {
                return Err(error);
            }
            self.conn = None;
            let conn = self.connection()?;
            conn.client
                .batch_execute("BEGIN")
                .map_err(|e| pg_error(&e))?;
        }
        self.connection()
    }

    /// A failing store's own write: a transaction given an id, whose
    /// commit the database writes durably, as any change. Healthy again if
    /// it commits.
    fn probe(&mut self) {
        let written = self.begin().and_then(|conn| {
            conn.client
                .batch_execute("SELECT txid_current(); COMMIT")
                .map_err(|e| pg_error(&e))
        });
        match written {
            Ok(()) => {
                tracing::info!("the job store can write again");
                self.health.committed();
            }
            Err(error) => {
                if let Some(conn) = self.conn.as_mut() {
                    let _ = conn.client.batch_execute("ROLLBACK");
                    if conn.client.is_closed() {
                        self.conn = None;
                    }
                }
                self.health.failed(error.to_string());
            }
        }
    }

    fn run_group(&mut self, ops: Vec<WriteOp>) {
        self.clock
            .refresh_if_due(self.conn.as_mut().map(|c| &mut c.client));
        let origin = self.origin;
        let conn = match self.begin() {
            Ok(conn) => conn,
            Err(error) => {
                self.health.failed(error.to_string());
                for op in ops {
                    refuse(op, error.clone());
                }
                return;
            }
        };
        match group::run(conn, ops, origin) {
            Ok(true) => self.health.committed(),
            Ok(false) => {}
            Err(reason) => {
                self.health.failed(reason);
                if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
                    self.conn = None;
                }
            }
        }
    }
}
