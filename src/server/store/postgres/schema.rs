//! The PostgreSQL schema and its migrations. The table `jobmgr_schema`
//! records how many migrations a database has had; each release only
//! appends. Servers starting together take turns through an advisory lock.
//!
//! The tables are SQLite's (times in milliseconds since the epoch, data as
//! JSON text), with names in the "C" collation so that ranges on a GLOB's
//! literal prefix order bytes as SQLite does.

use postgres::Client;

/// Each entry upgrades the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: the jobs, the ledger, idempotency keys and hand-out snapshots, as
    // SQLite's schema 6 has them.
    r#"CREATE TABLE jobs (
        job_id        BIGSERIAL PRIMARY KEY,
        name          TEXT COLLATE "C" NOT NULL,
        state         TEXT    NOT NULL,
        data          TEXT    NOT NULL,
        priority      BIGINT  NOT NULL,
        created       BIGINT  NOT NULL,
        next_run      BIGINT  NOT NULL,
        last_run      BIGINT,
        repeat        TEXT    NOT NULL DEFAULT '',
        retry_after   TEXT    NOT NULL DEFAULT '',
        parent_id     BIGINT  NOT NULL DEFAULT 0,
        scheduled_run BIGINT,
        lease_token   TEXT,
        lease_expires BIGINT,
        lease_term_ms BIGINT,
        attempts      BIGINT  NOT NULL DEFAULT 0,
        lapses        BIGINT  NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_ready  ON jobs (priority, next_run, job_id) WHERE state IN ('QUEUED', 'RUNQUEUED');
    CREATE INDEX jobs_due    ON jobs (next_run)           WHERE state IN ('QUEUED', 'RUNQUEUED');
    CREATE INDEX jobs_name   ON jobs (name);
    CREATE INDEX jobs_parent ON jobs (parent_id, state)   WHERE parent_id != 0;
    CREATE INDEX jobs_lease  ON jobs (lease_expires)      WHERE state = 'RUNNING' AND lease_expires IS NOT NULL;
    CREATE INDEX jobs_unleased ON jobs (last_run)         WHERE state = 'RUNNING' AND lease_expires IS NULL;
    CREATE TABLE attempts (
        attempt_id   BIGSERIAL PRIMARY KEY,
        job_id       BIGINT  NOT NULL,
        name         TEXT COLLATE "C" NOT NULL,
        attempt      BIGINT  NOT NULL,
        worker       TEXT,
        due          BIGINT  NOT NULL,
        started      BIGINT  NOT NULL,
        ended        BIGINT,
        outcome      TEXT,
        failure      TEXT,
        exit_code    BIGINT,
        signal       TEXT,
        stdout       TEXT,
        stderr       TEXT,
        stdout_bytes BIGINT,
        stderr_bytes BIGINT
    );
    CREATE INDEX attempts_job    ON attempts (job_id, attempt_id);
    CREATE INDEX attempts_worker ON attempts (worker, started) WHERE worker IS NOT NULL;
    CREATE INDEX attempts_ended  ON attempts (ended)           WHERE ended IS NOT NULL;
    CREATE TABLE archive (
        job_id   BIGINT  PRIMARY KEY,
        name     TEXT COLLATE "C" NOT NULL,
        state    TEXT    NOT NULL,
        data     TEXT    NOT NULL,
        created  BIGINT  NOT NULL,
        ended    BIGINT  NOT NULL,
        attempts BIGINT  NOT NULL,
        failure  TEXT
    );
    CREATE INDEX archive_ended ON archive (ended, job_id);
    CREATE INDEX archive_name  ON archive (name, ended);
    CREATE TABLE failures (
        job_id BIGINT  PRIMARY KEY,
        grp    TEXT    NOT NULL,
        at     BIGINT  NOT NULL
    );
    CREATE INDEX failures_group ON failures (grp, at);
    CREATE TABLE stats (
        name         TEXT COLLATE "C" NOT NULL,
        hour         BIGINT  NOT NULL,
        added        BIGINT  NOT NULL DEFAULT 0,
        started      BIGINT  NOT NULL DEFAULT 0,
        finished     BIGINT  NOT NULL DEFAULT 0,
        failed       BIGINT  NOT NULL DEFAULT 0,
        retried      BIGINT  NOT NULL DEFAULT 0,
        wait_n       BIGINT  NOT NULL DEFAULT 0,
        wait_mean    DOUBLE PRECISION NOT NULL DEFAULT 0,
        wait_m2      DOUBLE PRECISION NOT NULL DEFAULT 0,
        wait_min     DOUBLE PRECISION,
        wait_max     DOUBLE PRECISION,
        run_n        BIGINT  NOT NULL DEFAULT 0,
        run_mean     DOUBLE PRECISION NOT NULL DEFAULT 0,
        run_m2       DOUBLE PRECISION NOT NULL DEFAULT 0,
        run_min      DOUBLE PRECISION,
        run_max      DOUBLE PRECISION,
        service_n    BIGINT  NOT NULL DEFAULT 0,
        service_mean DOUBLE PRECISION NOT NULL DEFAULT 0,
        service_m2   DOUBLE PRECISION NOT NULL DEFAULT 0,
        service_min  DOUBLE PRECISION,
        service_max  DOUBLE PRECISION,
        PRIMARY KEY (name, hour)
    );
    CREATE INDEX stats_hour ON stats (hour);
    CREATE TABLE stats_histogram (
        name   TEXT COLLATE "C" NOT NULL,
        hour   BIGINT  NOT NULL,
        kind   TEXT    NOT NULL,
        bucket BIGINT  NOT NULL,
        count  BIGINT  NOT NULL,
        PRIMARY KEY (name, hour, kind, bucket)
    );
    CREATE INDEX stats_histogram_hour ON stats_histogram (hour);
    CREATE TABLE workers (
        worker     TEXT COLLATE "C" PRIMARY KEY,
        host       TEXT    NOT NULL,
        pid        BIGINT  NOT NULL,
        capacity   BIGINT  NOT NULL,
        running    BIGINT  NOT NULL,
        load       DOUBLE PRECISION,
        first_seen BIGINT  NOT NULL,
        last_seen  BIGINT  NOT NULL
    );
    CREATE TABLE worker_stats (
        worker      TEXT COLLATE "C" NOT NULL,
        hour        BIGINT  NOT NULL,
        run_n       BIGINT  NOT NULL DEFAULT 0,
        run_mean    DOUBLE PRECISION NOT NULL DEFAULT 0,
        run_m2      DOUBLE PRECISION NOT NULL DEFAULT 0,
        run_min     DOUBLE PRECISION,
        run_max     DOUBLE PRECISION,
        busy_ms     BIGINT  NOT NULL DEFAULT 0,
        capacity_ms BIGINT  NOT NULL DEFAULT 0,
        PRIMARY KEY (worker, hour)
    );
    CREATE INDEX worker_stats_hour ON worker_stats (hour);
    CREATE TABLE idempotency_keys (
        key         TEXT    NOT NULL PRIMARY KEY,
        fingerprint TEXT    NOT NULL,
        job_ids     TEXT    NOT NULL,
        created     BIGINT  NOT NULL
    );
    CREATE INDEX idempotency_keys_created ON idempotency_keys (created);
    CREATE TABLE jobs_before_handout (
        job_id        BIGINT  PRIMARY KEY,
        handout_token TEXT    NOT NULL,
        name          TEXT COLLATE "C" NOT NULL,
        state         TEXT    NOT NULL,
        data          TEXT    NOT NULL,
        priority      BIGINT  NOT NULL,
        created       BIGINT  NOT NULL,
        next_run      BIGINT  NOT NULL,
        last_run      BIGINT,
        repeat        TEXT    NOT NULL DEFAULT '',
        retry_after   TEXT    NOT NULL DEFAULT '',
        parent_id     BIGINT  NOT NULL DEFAULT 0,
        scheduled_run BIGINT,
        lease_token   TEXT,
        lease_expires BIGINT,
        lease_term_ms BIGINT,
        attempts      BIGINT  NOT NULL DEFAULT 0,
        lapses        BIGINT  NOT NULL DEFAULT 0
    );"#,
    // 2: tags (found by tag through the primary key, and by job through
    // its index) and tracked jobs, as SQLite's schema 7 has them.
    r#"CREATE TABLE job_tags (
        tag    TEXT COLLATE "C" NOT NULL,
        job_id BIGINT  NOT NULL,
        PRIMARY KEY (tag, job_id)
    );
    CREATE INDEX job_tags_job ON job_tags (job_id, tag);
    CREATE TABLE tracked_jobs (
        job_id BIGINT  PRIMARY KEY,
        since  BIGINT  NOT NULL
    );"#,
    // 3: throttles and jobs parked behind a full one, as SQLite's schema 8.
    r#"CREATE TABLE throttles (
        glob TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        max  BIGINT NOT NULL
    );
    ALTER TABLE jobs ADD COLUMN held_back_by TEXT COLLATE "C";
    DROP INDEX jobs_ready;
    CREATE INDEX jobs_ready ON jobs (priority, next_run, job_id)
        WHERE state IN ('QUEUED', 'RUNQUEUED') AND held_back_by IS NULL;
    CREATE INDEX jobs_held_back ON jobs (held_back_by, priority DESC, next_run, job_id)
        WHERE held_back_by IS NOT NULL;
    CREATE INDEX jobs_held ON jobs (name) WHERE state IN ('RUNNING', 'RUNQUEUED');"#,
    // 4: dependencies, as SQLite's schema 9 has them.
    r#"CREATE TABLE job_dependencies (
        job_id     BIGINT NOT NULL,
        depends_on BIGINT NOT NULL,
        PRIMARY KEY (job_id, depends_on)
    );
    CREATE INDEX job_dependencies_on ON job_dependencies (depends_on, job_id);"#,
    // 5: listing the jobs in a state in id order, as SQLite's schema 10.
    r#"CREATE INDEX jobs_state ON jobs (state, job_id);"#,
    // 6: the runs still open, as SQLite's schema 11.
    r#"CREATE INDEX attempts_open ON attempts (worker, started) WHERE ended IS NULL;"#,
    // 7: the hand-backs an attempt row stands for, as SQLite's schema 12.
    r#"ALTER TABLE attempts ADD COLUMN hand_backs BIGINT NOT NULL DEFAULT 0;"#,
    // 8: dashboard sessions ended by a logout, as SQLite's schema 13.
    r#"CREATE TABLE ended_sessions (
        session TEXT   NOT NULL PRIMARY KEY,
        expires BIGINT NOT NULL
    );
    CREATE INDEX ended_sessions_expires ON ended_sessions (expires);"#,
    // 9: frozen jobs of a supervisor, as SQLite's schema 14.
    r#"ALTER TABLE workers ADD COLUMN frozen BIGINT NOT NULL DEFAULT 0;"#,
];

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock that servers starting together take turns on.
const MIGRATION_LOCK: i64 = 0x6a6f_626d_6772; // "jobmgr"

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The database refused.
    #[error(
        "{0}; the user needs the right to create tables in the database \
         (GRANT CREATE ON SCHEMA public TO the user)"
    )]
    Postgres(#[from] postgres::Error),
    /// The database was migrated by a newer jobmgr.
    #[error(
        "the database's jobmgr schema is version {found}, newer than this jobmgr supports \
         ({supported}); upgrade this server's jobmgr, or point it at another database"
    )]
    TooNew {
        /// The database's version.
        found: i64,
        /// This build's version.
        supported: i64,
    },
}

/// Brings the database up to [`CURRENT_VERSION`], every migration in one
/// transaction (a failure leaves the database as it was). Refuses a
/// database written by a newer jobmgr.
pub fn migrate(client: &mut Client) -> Result<(), SchemaError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    // Looked for first: `IF NOT EXISTS` logs a notice at every start.
    let exists: bool = tx
        .query_one("SELECT to_regclass('jobmgr_schema') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        tx.batch_execute("CREATE TABLE jobmgr_schema (version BIGINT NOT NULL)")?;
    }
    let version: i64 = match tx.query_opt("SELECT version FROM jobmgr_schema", &[])? {
        Some(row) => row.get(0),
        None => {
            tx.execute("INSERT INTO jobmgr_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    if version > CURRENT_VERSION {
        return Err(SchemaError::TooNew {
            found: version,
            supported: CURRENT_VERSION,
        });
    }
    // The lock is held until the last migration commits: one transaction
    // for them all, so that a failure leaves the database as it was.
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql)?;
        tx.execute(
            "UPDATE jobmgr_schema SET version = $1",
            &[&(index as i64 + 1)],
        )?;
        tracing::info!(version = index + 1, "migrated the job store's schema");
    }
    tx.commit()?;
    Ok(())
}
