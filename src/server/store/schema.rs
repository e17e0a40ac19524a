//! The SQLite schema and its migrations. `PRAGMA user_version` records how
//! many migrations a database has had; each release only appends.

use rusqlite::{Connection, Transaction, params};

use super::sqlite::StoreOpenError;
use crate::protocol::Data;
use crate::server::ledger::failure;

/// Each entry upgrades the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: the first release.
    "CREATE TABLE jobs (
        job_id        INTEGER PRIMARY KEY AUTOINCREMENT,
        name          TEXT    NOT NULL,
        state         TEXT    NOT NULL,
        data          TEXT    NOT NULL,
        priority      INTEGER NOT NULL,
        created       INTEGER NOT NULL,
        next_run      INTEGER NOT NULL,
        last_run      INTEGER,
        repeat        TEXT    NOT NULL DEFAULT '',
        retry_after   TEXT    NOT NULL DEFAULT '',
        parent_id     INTEGER NOT NULL DEFAULT 0,
        scheduled_run INTEGER,
        lease_token   TEXT,
        lease_expires INTEGER,
        lease_term_ms INTEGER,
        attempts      INTEGER NOT NULL DEFAULT 0,
        lapses        INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_ready  ON jobs (priority, next_run) WHERE state IN ('QUEUED', 'RUNQUEUED');
    CREATE INDEX jobs_due    ON jobs (next_run)           WHERE state IN ('QUEUED', 'RUNQUEUED');
    CREATE INDEX jobs_name   ON jobs (name);
    CREATE INDEX jobs_parent ON jobs (parent_id, state)   WHERE parent_id != 0;
    CREATE INDEX jobs_lease  ON jobs (lease_expires)      WHERE state = 'RUNNING' AND lease_expires IS NOT NULL;",
    // 2: the ledger: attempts, the archive, failure groups, hourly
    // statistics and the worker registry.
    "CREATE TABLE attempts (
        attempt_id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id     INTEGER NOT NULL,
        name       TEXT    NOT NULL,
        attempt    INTEGER NOT NULL,
        worker     TEXT,
        due        INTEGER NOT NULL,
        started    INTEGER NOT NULL,
        ended      INTEGER,
        outcome    TEXT,
        failure    TEXT,
        exit_code  INTEGER,
        signal     TEXT,
        stdout     TEXT,
        stderr     TEXT
    );
    CREATE INDEX attempts_job    ON attempts (job_id, attempt_id);
    CREATE INDEX attempts_worker ON attempts (worker, started) WHERE worker IS NOT NULL;
    CREATE INDEX attempts_ended  ON attempts (ended)           WHERE ended IS NOT NULL;
    CREATE TABLE archive (
        job_id   INTEGER PRIMARY KEY,
        name     TEXT    NOT NULL,
        state    TEXT    NOT NULL,
        data     TEXT    NOT NULL,
        created  INTEGER NOT NULL,
        ended    INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        failure  TEXT
    );
    CREATE INDEX archive_ended ON archive (ended, job_id);
    CREATE TABLE failures (
        job_id INTEGER PRIMARY KEY,
        grp    TEXT    NOT NULL,
        at     INTEGER NOT NULL
    );
    CREATE INDEX failures_group ON failures (grp, at);
    CREATE TABLE stats (
        name         TEXT    NOT NULL,
        hour         INTEGER NOT NULL,
        added        INTEGER NOT NULL DEFAULT 0,
        started      INTEGER NOT NULL DEFAULT 0,
        finished     INTEGER NOT NULL DEFAULT 0,
        failed       INTEGER NOT NULL DEFAULT 0,
        retried      INTEGER NOT NULL DEFAULT 0,
        wait_n       INTEGER NOT NULL DEFAULT 0,
        wait_mean    REAL    NOT NULL DEFAULT 0,
        wait_m2      REAL    NOT NULL DEFAULT 0,
        wait_min     REAL,
        wait_max     REAL,
        run_n        INTEGER NOT NULL DEFAULT 0,
        run_mean     REAL    NOT NULL DEFAULT 0,
        run_m2       REAL    NOT NULL DEFAULT 0,
        run_min      REAL,
        run_max      REAL,
        service_n    INTEGER NOT NULL DEFAULT 0,
        service_mean REAL    NOT NULL DEFAULT 0,
        service_m2   REAL    NOT NULL DEFAULT 0,
        service_min  REAL,
        service_max  REAL,
        PRIMARY KEY (name, hour)
    ) WITHOUT ROWID;
    CREATE TABLE stats_histogram (
        name   TEXT    NOT NULL,
        hour   INTEGER NOT NULL,
        kind   TEXT    NOT NULL,
        bucket INTEGER NOT NULL,
        count  INTEGER NOT NULL,
        PRIMARY KEY (name, hour, kind, bucket)
    ) WITHOUT ROWID;
    CREATE INDEX stats_histogram_hour ON stats_histogram (hour);
    CREATE INDEX stats_hour ON stats (hour);
    CREATE TABLE workers (
        worker     TEXT    PRIMARY KEY,
        host       TEXT    NOT NULL,
        pid        INTEGER NOT NULL,
        capacity   INTEGER NOT NULL,
        running    INTEGER NOT NULL,
        load       REAL,
        first_seen INTEGER NOT NULL,
        last_seen  INTEGER NOT NULL
    ) WITHOUT ROWID;",
    // 3: hourly statistics per supervisor: runs reported and their
    // executing time, busy and offered slot-milliseconds.
    "CREATE TABLE worker_stats (
        worker      TEXT    NOT NULL,
        hour        INTEGER NOT NULL,
        run_n       INTEGER NOT NULL DEFAULT 0,
        run_mean    REAL    NOT NULL DEFAULT 0,
        run_m2      REAL    NOT NULL DEFAULT 0,
        run_min     REAL,
        run_max     REAL,
        busy_ms     INTEGER NOT NULL DEFAULT 0,
        capacity_ms INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (worker, hour)
    ) WITHOUT ROWID;
    CREATE INDEX worker_stats_hour ON worker_stats (hour);",
    // 4: idempotency keys of creates: the first answer to a key, kept a
    // day, so that a client retrying a create it lost the answer to gets
    // that answer instead of duplicates.
    "CREATE TABLE idempotency_keys (
        key         TEXT    NOT NULL PRIMARY KEY,
        fingerprint TEXT    NOT NULL,
        job_ids     TEXT    NOT NULL,
        created     INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX idempotency_keys_created ON idempotency_keys (created);",
    // 5: each job as it was before its latest hand-out, under that
    // hand-out's lease token, so that the holder can hand it back exactly
    // (HandBackJob) when it never started it.
    "CREATE TABLE jobs_before_handout (
        job_id        INTEGER PRIMARY KEY,
        handout_token TEXT    NOT NULL,
        name          TEXT    NOT NULL,
        state         TEXT    NOT NULL,
        data          TEXT    NOT NULL,
        priority      INTEGER NOT NULL,
        created       INTEGER NOT NULL,
        next_run      INTEGER NOT NULL,
        last_run      INTEGER,
        repeat        TEXT    NOT NULL DEFAULT '',
        retry_after   TEXT    NOT NULL DEFAULT '',
        parent_id     INTEGER NOT NULL DEFAULT 0,
        scheduled_run INTEGER,
        lease_token   TEXT,
        lease_expires INTEGER,
        lease_term_ms INTEGER,
        attempts      INTEGER NOT NULL DEFAULT 0,
        lapses        INTEGER NOT NULL DEFAULT 0
    );",
    // 6: finding ended jobs by name (a GLOB's literal prefix is a range on
    // it) and time; the total bytes of each stream a worker wrote, beside
    // the tail the attempt keeps.
    "CREATE INDEX archive_name ON archive (name, ended);
    ALTER TABLE attempts ADD COLUMN stdout_bytes INTEGER;
    ALTER TABLE attempts ADD COLUMN stderr_bytes INTEGER;",
    // 7: tags (found by tag through the primary key, and by job through
    // its index) and tracked jobs (see `labels`).
    "CREATE TABLE job_tags (
        tag    TEXT    NOT NULL,
        job_id INTEGER NOT NULL,
        PRIMARY KEY (tag, job_id)
    ) WITHOUT ROWID;
    CREATE INDEX job_tags_job ON job_tags (job_id, tag);
    CREATE TABLE tracked_jobs (
        job_id INTEGER PRIMARY KEY,
        since  INTEGER NOT NULL
    );",
    // 8: throttles (how many jobs matching a GLOB may be held at once), and
    // jobs parked behind a full one, left out of the ready index so that
    // claims do not step over them (see store::throttles).
    "CREATE TABLE throttles (
        glob TEXT    NOT NULL PRIMARY KEY,
        max  INTEGER NOT NULL
    ) WITHOUT ROWID;
    ALTER TABLE jobs ADD COLUMN held_back_by TEXT;
    DROP INDEX jobs_ready;
    CREATE INDEX jobs_ready ON jobs (priority, next_run)
        WHERE state IN ('QUEUED', 'RUNQUEUED') AND held_back_by IS NULL;
    CREATE INDEX jobs_held_back ON jobs (held_back_by, priority DESC, next_run, job_id)
        WHERE held_back_by IS NOT NULL;
    CREATE INDEX jobs_held ON jobs (name) WHERE state IN ('RUNNING', 'RUNQUEUED');",
    // 9: dependencies: one row per DEPENDS job and a job it still waits
    // for, found from either side.
    "CREATE TABLE job_dependencies (
        job_id     INTEGER NOT NULL,
        depends_on INTEGER NOT NULL,
        PRIMARY KEY (job_id, depends_on)
    ) WITHOUT ROWID;
    CREATE INDEX job_dependencies_on ON job_dependencies (depends_on, job_id);",
    // 10: listing the jobs in a state in id order (with a name pattern
    // checked on each), without reading the whole table.
    "CREATE INDEX jobs_state ON jobs (state, job_id);",
    // 11: the runs still open (of a supervisor, or all), read at every
    // report and hand-out: without it each read stepped over every attempt
    // the ledger keeps, a cost that grew with the history.
    "CREATE INDEX attempts_open ON attempts (worker, started) WHERE ended IS NULL;",
    // 12: how many hand-backs for want of the job's worker an attempt row
    // stands for (one row per streak of them).
    "ALTER TABLE attempts ADD COLUMN hand_backs INTEGER NOT NULL DEFAULT 0;",
    // 13: dashboard sessions ended by a logout, kept until their cookie
    // would have expired (see store::sessions).
    "CREATE TABLE ended_sessions (
        session TEXT    NOT NULL PRIMARY KEY,
        expires INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX ended_sessions_expires ON ended_sessions (expires);",
    // 14: how many of a supervisor's running jobs are frozen.
    "ALTER TABLE workers ADD COLUMN frozen INTEGER NOT NULL DEFAULT 0;",
];

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// The version that added the ledger (attempts, failure groups, statistics).
const LEDGER_VERSION: usize = 2;

/// Puts the FAILED jobs of a store older than the ledger into failure
/// groups, read from the run details their data carries (as a FailJob's
/// would be), so that `jobmgr failures` lists them and can retry them. Their
/// failure time is their last run. They get no archive entry, so retention
/// never purges them: only an operator's retry or delete removes them.
fn group_earlier_failures(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let mut failed = tx.prepare(
        "SELECT job_id, data, COALESCE(last_run, created) FROM jobs \
         WHERE state = 'FAILED' AND job_id NOT IN (SELECT job_id FROM failures)",
    )?;
    let mut group = tx.prepare("INSERT INTO failures (job_id, grp, at) VALUES (?1, ?2, ?3)")?;
    let mut rows = failed.query([])?;
    while let Some(row) = rows.next()? {
        let data = serde_json::from_str::<Data>(&row.get::<_, String>(1)?).ok();
        let end = failure::reported_end("failed", data.as_ref(), None);
        let grp = end.failure.unwrap_or_else(|| "failed".into());
        group.execute(params![row.get::<_, i64>(0)?, grp, row.get::<_, i64>(2)?])?;
    }
    Ok(())
}

/// Brings the database up to [`CURRENT_VERSION`], one transaction per
/// migration. Refuses a database written by a newer jobmgr.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreOpenError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if version > CURRENT_VERSION {
        return Err(StoreOpenError::TooNew {
            found: version,
            supported: CURRENT_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        if index + 1 == LEDGER_VERSION {
            group_earlier_failures(&tx)?;
        }
        tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))?;
        tx.commit()?;
        tracing::info!(version = index + 1, "migrated job store schema");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store as the first release left it: one queued job, and FAILED
    /// jobs with and without the supervisor's run details.
    fn first_release_store() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch("PRAGMA user_version = 1").unwrap();
        for (id, state, data, last_run) in [
            (1, "QUEUED", r#"{"a":1}"#, None),
            (
                2,
                "FAILED",
                r#"{"_jobmgr":{"outcome":"exit","exitCode":3}}"#,
                Some(5_000),
            ),
            (3, "FAILED", r#"{"b":2}"#, None),
            (4, "FAILED", "not json", Some(7_000)),
        ] {
            conn.execute(
                "INSERT INTO jobs (job_id, name, state, data, priority, created, next_run, last_run) \
                 VALUES (?1, 'n', ?2, ?3, 500, 1000, 1000, ?4)",
                params![id, state, data, last_run],
            )
            .unwrap();
        }
        conn
    }

    #[test]
    fn upgrading_keeps_every_job_and_groups_earlier_failures() {
        let mut conn = first_release_store();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, CURRENT_VERSION);
        let jobs: Vec<(i64, String, String)> = conn
            .prepare("SELECT job_id, state, data FROM jobs ORDER BY job_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(jobs.len(), 4, "{jobs:?}");
        assert_eq!(jobs[0], (1, "QUEUED".into(), r#"{"a":1}"#.into()));
        let groups: Vec<(i64, String, i64)> = conn
            .prepare("SELECT job_id, grp, at FROM failures ORDER BY job_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            groups,
            [
                (2, "exit:3".into(), 5_000),
                (3, "failed".into(), 1_000),
                (4, "failed".into(), 7_000)
            ]
        );
        // Nothing was archived, so retention cannot purge them.
        let archived: i64 = conn
            .query_row("SELECT COUNT(*) FROM archive", [], |r| r.get(0))
            .unwrap();
        assert_eq!(archived, 0);
        // Migrating again changes nothing.
        migrate(&mut conn).unwrap();
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM failures", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 3);
    }
}
