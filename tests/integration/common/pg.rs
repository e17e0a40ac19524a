//! The store the fixtures' servers use, chosen by `JOBMGR_TEST_STORE`:
//! `sqlite` (the default: a file in each server's temporary directory) or
//! `postgres` (a database of its own for each server, on the PostgreSQL at
//! [`SERVER`], made before the server starts and dropped after it is
//! killed). CI runs the server's modules both ways (`.ci/run`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The PostgreSQL the tests use: trust authentication, user `postgres`.
pub const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// Which store the fixtures' servers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// An SQLite file per server.
    Sqlite,
    /// A PostgreSQL database per server (or per group of servers sharing
    /// it).
    Postgres,
}

/// The store chosen by `JOBMGR_TEST_STORE` (`sqlite` when unset); any
/// other value fails the test that asks.
pub fn store_kind() -> StoreKind {
    static KIND: OnceLock<Result<StoreKind, String>> = OnceLock::new();
    let kind = KIND.get_or_init(|| match std::env::var("JOBMGR_TEST_STORE") {
        Err(std::env::VarError::NotPresent) => Ok(StoreKind::Sqlite),
        Ok(value) => match value.as_str() {
            "" | "sqlite" => Ok(StoreKind::Sqlite),
            "postgres" => Ok(StoreKind::Postgres),
            other => Err(format!(
                "JOBMGR_TEST_STORE={other:?}: expected \"sqlite\" (the default) or \"postgres\""
            )),
        },
        Err(e) => Err(format!("JOBMGR_TEST_STORE: {e}")),
    });
    match kind {
        Ok(kind) => *kind,
        Err(message) => panic!("{message}"),
    }
}

/// Whether the fixtures' servers use PostgreSQL.
pub fn store_is_postgres() -> bool {
    store_kind() == StoreKind::Postgres
}

/// For a test that cannot apply to PostgreSQL: on PostgreSQL, says on
/// stderr that it is skipped and why, and returns true (the test returns);
/// on SQLite returns false.
///
/// ```ignore
/// if skip_on_postgres("opens the SQLite file") {
///     return;
/// }
/// ```
#[track_caller]
pub fn skip_on_postgres(reason: &str) -> bool {
    if !store_is_postgres() {
        return false;
    }
    let name = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    eprintln!("{name}: skipped on PostgreSQL: {reason}");
    true
}

/// A database of its own on [`SERVER`], dropped (`WITH (FORCE)`, so that
/// connections left by a killed server do not keep it) when this is
/// dropped. The fixtures' servers hold it in an `Arc`: servers on the same
/// store share one, and the last to go drops it, after its process.
pub struct TestDatabase {
    name: String,
    url: String,
}

/// Runs `f` on a thread of its own: the `postgres` crate's client blocks
/// on a runtime of its own, which panics inside another's, and the
/// fixtures' servers are also started and dropped by `#[tokio::test]`s.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| match scope.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// A connection to the `postgres` database, to create and drop others.
fn admin() -> postgres::Client {
    let url = format!("{SERVER}/postgres");
    postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
        panic!(
            "JOBMGR_TEST_STORE=postgres: cannot connect to {url} ({e}); the tests need \
             PostgreSQL on 127.0.0.1:5432 with trust authentication for the user postgres"
        )
    })
}

impl TestDatabase {
    /// Creates `jobmgr_t_<pid>_<n>` (dropping first one left by an earlier
    /// process of the same pid).
    pub fn create() -> TestDatabase {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "jobmgr_t_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        off_runtime(|| {
            let mut client = admin();
            // One statement per query: neither may run in a transaction
            // block.
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .unwrap_or_else(|e| panic!("drop a stale database {name}: {e}"));
            client
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("create the database {name}: {e}"));
        });
        TestDatabase {
            url: format!("{SERVER}/{name}"),
            name,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its URL, for `jobmgr server --db`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection to it, for tests that look at or change the store
    /// behind a server's back (not from inside an async runtime).
    pub fn connect(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }

    /// How many transactions ended in it (committed or rolled back), as
    /// PostgreSQL's statistics count them. Read from the `postgres`
    /// database, so that reading adds none to the count; each backend
    /// reports its own about once a second.
    pub fn transactions(&self) -> i64 {
        let name = &self.name;
        off_runtime(|| {
            admin()
                .query_one(
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                     WHERE datname = $1",
                    &[name],
                )
                .unwrap_or_else(|e| panic!("read the statistics of {name}: {e}"))
                .get(0)
        })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = &self.name;
        let dropped = off_runtime(|| {
            postgres::Client::connect(&format!("{SERVER}/postgres"), postgres::NoTls).and_then(
                |mut client| {
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                },
            )
        });
        if let Err(e) = dropped {
            // Not a panic: this may run while a failing test unwinds.
            eprintln!("could not drop the test database {}: {e}", self.name);
        }
    }
}
