//! The ledger's rows in PostgreSQL: [`LedgerTx`] for [`PgTx`], a port of
//! the SQLite store's (`sqlite_ledger.rs`) statement for statement, with the
//! same results in the same order. Statistics grow by single-statement
//! upserts that never read the row first, so that servers sharing the
//! database never lose each other's increments.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use postgres::Row;
use postgres::types::FromSql;

use super::glob::{Params, name_condition};
use super::{PgTx, corrupt};
use crate::protocol::{Data, JobError, JobId, NamePattern, Timestamp, WorkerInfo};
use crate::server::ledger::{
    ArchivedJob, Attempt, AttemptEnd, FailureGroup, OpenAttempt, PurgeCounts, StatsDelta, StatsRow,
    Summary, WorkerDelta, WorkerRow, WorkerStatsRow, histogram,
};
use crate::server::store::{ArchiveQuery, LedgerTx, PurgeLimits};

/// Column `i` of a row of `what`, or the error saying it cannot be read.
fn col<'r, T: FromSql<'r>>(row: &'r Row, i: usize, what: &str) -> Result<T, JobError> {
    row.try_get(i).map_err(|e| corrupt(what, e))
}

/// A stored count, as SQLite's store reads it (a negative one is 0).
fn count(row: &Row, i: usize, what: &str) -> Result<u64, JobError> {
    Ok(col::<i64>(row, i, what)?.max(0) as u64)
}

/// A stored count that must fit a `u32`.
fn small(row: &Row, i: usize, what: &str) -> Result<u32, JobError> {
    u32::try_from(col::<i64>(row, i, what)?).map_err(|e| corrupt(what, e))
}

/// A count or limit as a BIGINT parameter (larger ones are clamped).
fn bigint(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

const ATTEMPT_COLUMNS: &str = "job_id, name, attempt, worker, due, started, ended, outcome, \
     failure, exit_code, signal, stdout, stderr, stdout_bytes, stderr_bytes";

/// An attempt from [`ATTEMPT_COLUMNS`].
fn read_attempt(row: &Row) -> Result<Attempt, JobError> {
    const WHAT: &str = "attempt";
    let outcome: Option<String> = col(row, 7, WHAT)?;
    let bytes = |i: usize| -> Result<Option<u64>, JobError> {
        Ok(col::<Option<i64>>(row, i, WHAT)?.map(|n| n.max(0) as u64))
    };
    Ok(Attempt {
        job_id: col(row, 0, WHAT)?,
        name: col(row, 1, WHAT)?,
        attempt: col(row, 2, WHAT)?,
        worker: col(row, 3, WHAT)?,
        due: Timestamp(col(row, 4, WHAT)?),
        started: Timestamp(col(row, 5, WHAT)?),
        ended: col::<Option<i64>>(row, 6, WHAT)?.map(Timestamp),
        end: match outcome {
            Some(outcome) => Some(AttemptEnd {
                outcome,
                failure: col(row, 8, WHAT)?,
                exit_code: col(row, 9, WHAT)?,
                signal: col(row, 10, WHAT)?,
                stdout: col(row, 11, WHAT)?,
                stderr: col(row, 12, WHAT)?,
                stdout_bytes: bytes(13)?,
                stderr_bytes: bytes(14)?,
            }),
            None => None,
        },
    })
}

const STATS_COLUMNS: &str = "name, hour, added, started, finished, failed, retried, \
     wait_n, wait_mean, wait_m2, wait_min, wait_max, run_n, run_mean, run_m2, run_min, run_max, \
     service_n, service_mean, service_m2, service_min, service_max";

/// An hour's statistics from [`STATS_COLUMNS`], without histograms.
fn read_stats(row: &Row) -> Result<StatsRow, JobError> {
    const WHAT: &str = "statistics row";
    Ok(StatsRow {
        name: col(row, 0, WHAT)?,
        hour: col(row, 1, WHAT)?,
        added: count(row, 2, WHAT)?,
        started: count(row, 3, WHAT)?,
        finished: count(row, 4, WHAT)?,
        failed: count(row, 5, WHAT)?,
        retried: count(row, 6, WHAT)?,
        wait: read_summary(row, 7)?,
        run: read_summary(row, 12)?,
        service: read_summary(row, 17)?,
        wait_histogram: None,
        run_histogram: None,
    })
}

/// The summary in the five columns from `at` (`X_n, X_mean, X_m2, X_min, X_max`).
fn read_summary(row: &Row, at: usize) -> Result<Summary, JobError> {
    const WHAT: &str = "summary";
    Ok(Summary {
        count: count(row, at, WHAT)?,
        mean: col(row, at + 1, WHAT)?,
        m2: col(row, at + 2, WHAT)?,
        min: col::<Option<f64>>(row, at + 3, WHAT)?.unwrap_or(0.0),
        max: col::<Option<f64>>(row, at + 4, WHAT)?.unwrap_or(0.0),
    })
}

/// The SET clauses that add one sample (given as `excluded.X_mean` with
/// `excluded.X_n` = 1, or nothing with 0) to summary `X` of `table` by
/// Welford's update; every right-hand side reads the row as it was. The
/// row's own columns are named with the table, as `excluded` has them too.
fn welford(table: &str, x: &str) -> String {
    let new_mean =
        format!("{table}.{x}_mean + (excluded.{x}_mean - {table}.{x}_mean) / ({table}.{x}_n + 1)");
    format!(
        "{x}_mean = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_mean ELSE {new_mean} END, \
         {x}_m2 = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_m2 \
           ELSE {table}.{x}_m2 + (excluded.{x}_mean - {table}.{x}_mean) \
             * (excluded.{x}_mean - ({new_mean})) END, \
         {x}_min = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_min \
           ELSE LEAST(COALESCE({table}.{x}_min, excluded.{x}_min), excluded.{x}_min) END, \
         {x}_max = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_max \
           ELSE GREATEST(COALESCE({table}.{x}_max, excluded.{x}_max), excluded.{x}_max) END, \
         {x}_n = {table}.{x}_n + excluded.{x}_n"
    )
}

/// Adds one event to an hour's row in one statement, without reading it.
static ADD_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO stats ({STATS_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
           $8, COALESCE($9::float8, 0), 0, $9, $9, $10, COALESCE($11::float8, 0), 0, $11, $11, \
           $12, COALESCE($13::float8, 0), 0, $13, $13) \
         ON CONFLICT (name, hour) DO UPDATE SET \
           added = stats.added + excluded.added, started = stats.started + excluded.started, \
           finished = stats.finished + excluded.finished, failed = stats.failed + excluded.failed, \
           retried = stats.retried + excluded.retried, {}, {}, {}",
        welford("stats", "wait"),
        welford("stats", "run"),
        welford("stats", "service")
    )
});

/// Counts one duration in an hour's histogram.
const ADD_HISTOGRAM_SQL: &str = "INSERT INTO stats_histogram (name, hour, kind, bucket, count) \
     VALUES ($1, $2, $3, $4, 1) \
     ON CONFLICT (name, hour, kind, bucket) DO UPDATE SET count = stats_histogram.count + 1";

/// Adds one event to a supervisor's hour in one statement.
static ADD_WORKER_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO worker_stats (worker, hour, run_n, run_mean, run_m2, run_min, run_max, \
         busy_ms, capacity_ms) VALUES ($1, $2, $3, COALESCE($4::float8, 0), 0, $4, $4, $5, $6) \
         ON CONFLICT (worker, hour) DO UPDATE SET \
           busy_ms = worker_stats.busy_ms + excluded.busy_ms, \
           capacity_ms = worker_stats.capacity_ms + excluded.capacity_ms, {}",
        welford("worker_stats", "run")
    )
});

const ARCHIVE_COLUMNS: &str = "job_id, name, state, data, created, ended, attempts, failure";

/// An archived job from [`ARCHIVE_COLUMNS`]. Data that does not parse reads
/// as empty, as in the SQLite store.
fn read_archived(row: &Row) -> Result<ArchivedJob, JobError> {
    const WHAT: &str = "archived job";
    let data: String = col(row, 3, WHAT)?;
    Ok(ArchivedJob {
        job_id: col(row, 0, WHAT)?,
        name: col(row, 1, WHAT)?,
        state: col(row, 2, WHAT)?,
        data: serde_json::from_str::<Data>(&data).unwrap_or_default(),
        created: Timestamp(col(row, 4, WHAT)?),
        ended: Timestamp(col(row, 5, WHAT)?),
        attempts: col(row, 6, WHAT)?,
        failure: col(row, 7, WHAT)?,
    })
}

/// The SQL and parameters listing `query` (see
/// `archive_listing::archive_sql`), in id order. PostgreSQL has no
/// `INDEXED BY`. Its statistics per name serve a name pattern well, but it
/// does not know that the times jobs ended rise with their ids: with a time
/// window it would walk the ids in order from the oldest, reading every
/// entry before a recent window. Ordering by `job_id + 0` (the same order,
/// which no index gives) has it use the window's index and sort the
/// matches, as SQLite's `INDEXED BY archive_ended` does.
fn archive_sql(query: &ArchiveQuery) -> (String, Params) {
    let mut params = Params::default();
    let mut conditions = vec![format!(
        "job_id > {}",
        params.push(query.after_id.unwrap_or(0))
    )];
    if let Some(state) = query.state {
        conditions.push(format!("state = {}", params.push(state.as_str())));
    }
    if let Some(since) = query.since {
        conditions.push(format!("ended >= {}", params.push(since.0)));
    }
    if let Some(until) = query.until {
        conditions.push(format!("ended < {}", params.push(until.0)));
    }
    if let Some(pattern) = &query.pattern {
        conditions.push(name_condition(pattern, &mut params));
    }
    let order = if query.since.is_some() || query.until.is_some() {
        "job_id + 0"
    } else {
        "job_id"
    };
    let limit = params.push(bigint(query.limit.max(1)));
    let sql = format!(
        "SELECT {ARCHIVE_COLUMNS} FROM archive WHERE {} ORDER BY {order} LIMIT {limit}",
        conditions.join(" AND ")
    );
    (sql, params)
}

impl LedgerTx for PgTx<'_> {
    fn add_stats(&mut self, name: &str, hour: i64, delta: &StatsDelta) -> Result<(), JobError> {
        // A sample, or no sample: count 0 and no value (so no min or max).
        let sample = |ms: Option<i64>| (i64::from(ms.is_some()), ms.map(|ms| ms.max(0) as f64));
        let (wait_n, wait) = sample(delta.wait_ms);
        let (run_n, run) = sample(delta.run_ms);
        let (service_n, service) = sample(delta.service_ms);
        self.execute(
            &ADD_STATS_SQL,
            &[
                &name,
                &hour,
                &bigint(delta.added),
                &bigint(delta.started),
                &bigint(delta.finished),
                &bigint(delta.failed),
                &bigint(delta.retried),
                &wait_n,
                &wait,
                &run_n,
                &run,
                &service_n,
                &service,
            ],
        )?;
        for (kind, ms) in [("wait", delta.wait_ms), ("run", delta.run_ms)] {
            if let Some(ms) = ms {
                let bucket = bigint(histogram::bucket(ms));
                self.execute(ADD_HISTOGRAM_SQL, &[&name, &hour, &kind, &bucket])?;
            }
        }
        Ok(())
    }

    fn stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<StatsRow>, JobError> {
        // The pattern narrows the rows read; `matches` decides, as in SQLite.
        let mut params = Params::default();
        let window = format!(
            "hour >= {} AND hour < {}",
            params.push(from.0),
            params.push(to.0)
        );
        let filter = pattern
            .map(|p| format!(" AND {}", name_condition(p, &mut params)))
            .unwrap_or_default();
        let rows = self.query(
            &format!(
                "SELECT {STATS_COLUMNS} FROM stats WHERE {window}{filter} ORDER BY name, hour"
            ),
            &params.refs(),
        )?;
        let mut out: BTreeMap<(String, i64), StatsRow> = BTreeMap::new();
        for row in &rows {
            let row = read_stats(row)?;
            if pattern.is_none_or(|p| p.matches(&row.name)) {
                out.insert((row.name.clone(), row.hour), row);
            }
        }
        let buckets = self.query(
            &format!(
                "SELECT name, hour, kind, bucket, count FROM stats_histogram \
                 WHERE {window}{filter}"
            ),
            &params.refs(),
        )?;
        for bucket in &buckets {
            const WHAT: &str = "histogram bucket";
            let name: String = col(bucket, 0, WHAT)?;
            let hour: i64 = col(bucket, 1, WHAT)?;
            let kind: String = col(bucket, 2, WHAT)?;
            let index: i64 = col(bucket, 3, WHAT)?;
            let n = count(bucket, 4, WHAT)?;
            let (Some(row), Ok(index)) = (out.get_mut(&(name, hour)), usize::try_from(index))
            else {
                continue;
            };
            if index >= histogram::bucket_count() {
                continue;
            }
            let histogram = match kind.as_str() {
                "wait" => &mut row.wait_histogram,
                "run" => &mut row.run_histogram,
                _ => continue,
            };
            histogram.get_or_insert_default().0.insert(index, n);
        }
        Ok(out.into_values().collect())
    }

    fn add_worker_stats(
        &mut self,
        worker: &str,
        hour: i64,
        delta: &WorkerDelta,
    ) -> Result<(), JobError> {
        self.execute(
            &ADD_WORKER_STATS_SQL,
            &[
                &worker,
                &hour,
                &i64::from(delta.run_ms.is_some()),
                &delta.run_ms.map(|ms| ms.max(0) as f64),
                &delta.busy_ms.max(0),
                &delta.capacity_ms.max(0),
            ],
        )?;
        Ok(())
    }

    fn worker_stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<WorkerStatsRow>, JobError> {
        // The pattern's condition is on `name`: the supervisor is named so.
        let mut params = Params::default();
        let window = format!(
            "hour >= {} AND hour < {}",
            params.push(from.0),
            params.push(to.0)
        );
        let filter = pattern
            .map(|p| format!(" AND {}", name_condition(p, &mut params)))
            .unwrap_or_default();
        let rows = self.query(
            &format!(
                "SELECT name, hour, run_n, run_mean, run_m2, run_min, run_max, busy_ms, \
                 capacity_ms FROM (SELECT worker AS name, * FROM worker_stats) w \
                 WHERE {window}{filter} ORDER BY name, hour"
            ),
            &params.refs(),
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            const WHAT: &str = "supervisor's statistics row";
            let row = WorkerStatsRow {
                worker: col(row, 0, WHAT)?,
                hour: col(row, 1, WHAT)?,
                run: read_summary(row, 2)?,
                busy_ms: col(row, 7, WHAT)?,
                capacity_ms: col(row, 8, WHAT)?,
            };
            if pattern.is_none_or(|p| p.matches(&row.worker)) {
                out.push(row);
            }
        }
        Ok(out)
    }

    fn open_attempt(&mut self, attempt: &Attempt) -> Result<(), JobError> {
        self.execute(
            "INSERT INTO attempts (job_id, name, attempt, worker, due, started) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &attempt.job_id,
                &attempt.name,
                &attempt.attempt,
                &attempt.worker,
                &attempt.due.0,
                &attempt.started.0,
            ],
        )?;
        Ok(())
    }

    fn close_attempt(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        // Every open attempt of the job ends (there should be one); the
        // first returned is the answer, as SQLite's `query_row` gives.
        let rows = self.query(
            "UPDATE attempts SET ended = $2, outcome = $3, failure = $4, exit_code = $5, \
             signal = $6, stdout = $7, stderr = $8, stdout_bytes = $9, stderr_bytes = $10 \
             WHERE job_id = $1 AND ended IS NULL \
             RETURNING name, started, worker",
            &[
                &job_id,
                &ended.0,
                &end.outcome,
                &end.failure,
                &end.exit_code,
                &end.signal,
                &end.stdout,
                &end.stderr,
                &end.stdout_bytes.map(bigint),
                &end.stderr_bytes.map(bigint),
            ],
        )?;
        rows.first()
            .map(|row| {
                const WHAT: &str = "attempt";
                Ok(OpenAttempt {
                    name: col(row, 0, WHAT)?,
                    started: Timestamp(col(row, 1, WHAT)?),
                    worker: col(row, 2, WHAT)?,
                })
            })
            .transpose()
    }

    fn discard_open_attempt(&mut self, job_id: JobId) -> Result<(), JobError> {
        self.execute(
            "DELETE FROM attempts WHERE job_id = $1 AND ended IS NULL",
            &[&job_id],
        )?;
        Ok(())
    }

    fn occurrence_start(&mut self, job_id: JobId) -> Result<Option<Timestamp>, JobError> {
        self.query_opt(
            "SELECT due FROM attempts WHERE job_id = $1 AND attempt = 1 \
             ORDER BY attempt_id DESC LIMIT 1",
            &[&job_id],
        )?
        .map(|row| Ok(Timestamp(col(&row, 0, "attempt's due time")?)))
        .transpose()
    }

    fn attempts(
        &mut self,
        job_id: JobId,
        skip: usize,
        limit: usize,
    ) -> Result<(Vec<Attempt>, u64), JobError> {
        let total = match self.query_opt(
            "SELECT count(*) FROM attempts WHERE job_id = $1",
            &[&job_id],
        )? {
            Some(row) => count(&row, 0, "count of attempts")?,
            None => 0,
        };
        let rows = self.query(
            &format!(
                "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = $1 \
                 ORDER BY attempt_id DESC LIMIT $2 OFFSET $3"
            ),
            &[&job_id, &bigint(limit), &bigint(skip)],
        )?;
        let mut attempts = rows
            .iter()
            .map(read_attempt)
            .collect::<Result<Vec<_>, _>>()?;
        attempts.reverse();
        Ok((attempts, total))
    }

    fn archive(&mut self, job: &ArchivedJob) -> Result<(), JobError> {
        let data = serde_json::to_string(&job.data).map_err(|e| JobError::Store(e.to_string()))?;
        self.execute(
            "INSERT INTO archive (job_id, name, state, data, created, ended, attempts, failure) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (job_id) DO UPDATE SET name = excluded.name, state = excluded.state, \
             data = excluded.data, created = excluded.created, ended = excluded.ended, \
             attempts = excluded.attempts, failure = excluded.failure",
            &[
                &job.job_id,
                &job.name,
                &job.state,
                &data,
                &job.created.0,
                &job.ended.0,
                &job.attempts,
                &job.failure,
            ],
        )?;
        Ok(())
    }

    fn archived(&mut self, job_id: JobId) -> Result<Option<ArchivedJob>, JobError> {
        self.query_opt(
            &format!("SELECT {ARCHIVE_COLUMNS} FROM archive WHERE job_id = $1"),
            &[&job_id],
        )?
        .as_ref()
        .map(read_archived)
        .transpose()
    }

    fn archived_list(&mut self, query: &ArchiveQuery) -> Result<Vec<ArchivedJob>, JobError> {
        let (sql, params) = archive_sql(query);
        self.query(&sql, &params.refs())?
            .iter()
            .map(read_archived)
            .collect()
    }

    fn set_failure(&mut self, job_id: JobId, group: &str, at: Timestamp) -> Result<(), JobError> {
        self.execute(
            "INSERT INTO failures (job_id, grp, at) VALUES ($1, $2, $3) \
             ON CONFLICT (job_id) DO UPDATE SET grp = excluded.grp, at = excluded.at",
            &[&job_id, &group, &at.0],
        )?;
        Ok(())
    }

    fn clear_failure(&mut self, job_id: JobId) -> Result<(), JobError> {
        self.execute("DELETE FROM failures WHERE job_id = $1", &[&job_id])?;
        Ok(())
    }

    fn failure_groups(&mut self) -> Result<Vec<FailureGroup>, JobError> {
        // `grp` has the database's collation: order it by bytes, as SQLite.
        let rows = self.query(
            "SELECT f.grp, COUNT(*), MIN(f.at), MAX(f.at) FROM failures f \
             JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
             GROUP BY f.grp ORDER BY COUNT(*) DESC, f.grp COLLATE \"C\"",
            &[],
        )?;
        rows.iter()
            .map(|row| {
                const WHAT: &str = "failure group";
                Ok(FailureGroup {
                    group: col(row, 0, WHAT)?,
                    count: count(row, 1, WHAT)?,
                    first: Timestamp(col(row, 2, WHAT)?),
                    last: Timestamp(col(row, 3, WHAT)?),
                })
            })
            .collect()
    }

    fn failed_in_group(&mut self, group: &str, limit: usize) -> Result<Vec<JobId>, JobError> {
        self.query(
            "SELECT f.job_id FROM failures f \
             JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
             WHERE f.grp = $1 ORDER BY f.at, f.job_id LIMIT $2",
            &[&group, &bigint(limit)],
        )?
        .iter()
        .map(|row| col(row, 0, "failed job id"))
        .collect()
    }

    fn see_worker(&mut self, info: &WorkerInfo, now: Timestamp) -> Result<(), JobError> {
        self.execute(
            "INSERT INTO workers (worker, host, pid, capacity, running, load, first_seen, last_seen) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
             ON CONFLICT (worker) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
             capacity = excluded.capacity, running = excluded.running, load = excluded.load, \
             last_seen = GREATEST(workers.last_seen, excluded.last_seen)",
            &[
                &info.id,
                &info.host,
                &i64::from(info.pid),
                &i64::from(info.capacity),
                &i64::from(info.running),
                &info.load,
                &now.0,
            ],
        )?;
        Ok(())
    }

    fn touch_worker(&mut self, worker: &str, now: Timestamp) -> Result<(), JobError> {
        self.execute(
            "UPDATE workers SET last_seen = GREATEST(last_seen, $2) WHERE worker = $1",
            &[&worker, &now.0],
        )?;
        Ok(())
    }

    fn sighting(&mut self, worker: &str) -> Result<Option<(Timestamp, u32)>, JobError> {
        self.query_opt(
            "SELECT last_seen, capacity FROM workers WHERE worker = $1",
            &[&worker],
        )?
        .map(|row| {
            const WHAT: &str = "supervisor";
            Ok((Timestamp(col(&row, 0, WHAT)?), small(&row, 1, WHAT)?))
        })
        .transpose()
    }

    fn holder(&mut self, job_id: JobId) -> Result<Option<String>, JobError> {
        self.query_opt(
            "SELECT worker FROM attempts WHERE job_id = $1 AND ended IS NULL \
             AND worker IS NOT NULL ORDER BY attempt_id DESC LIMIT 1",
            &[&job_id],
        )?
        .map(|row| col(&row, 0, "attempt's supervisor"))
        .transpose()
    }

    fn open_runs(&mut self, worker: Option<&str>) -> Result<Vec<(String, Timestamp)>, JobError> {
        let rows = match worker {
            Some(worker) => self.query(
                "SELECT worker, started FROM attempts WHERE worker = $1 AND ended IS NULL",
                &[&worker],
            )?,
            None => self.query(
                "SELECT worker, started FROM attempts WHERE ended IS NULL AND worker IS NOT NULL",
                &[],
            )?,
        };
        rows.iter()
            .map(|row| {
                const WHAT: &str = "open attempt";
                Ok((col(row, 0, WHAT)?, Timestamp(col(row, 1, WHAT)?)))
            })
            .collect()
    }

    fn workers(&mut self) -> Result<Vec<WorkerRow>, JobError> {
        const WHAT: &str = "supervisor";
        let rows = self.query(
            "SELECT worker, host, pid, capacity, running, load, first_seen, last_seen \
             FROM workers ORDER BY last_seen DESC, worker",
            &[],
        )?;
        let mut workers = rows
            .iter()
            .map(|row| {
                Ok(WorkerRow {
                    info: WorkerInfo {
                        id: col(row, 0, WHAT)?,
                        host: col(row, 1, WHAT)?,
                        pid: small(row, 2, WHAT)?,
                        capacity: small(row, 3, WHAT)?,
                        running: small(row, 4, WHAT)?,
                        load: col(row, 5, WHAT)?,
                    },
                    first_seen: Timestamp(col(row, 6, WHAT)?),
                    last_seen: Timestamp(col(row, 7, WHAT)?),
                    jobs: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, JobError>>()?;
        // The jobs each holds, in id order: one query for them all rather
        // than one a supervisor, as each is a round trip here.
        let mut held: HashMap<String, Vec<JobId>> = HashMap::new();
        for row in self.query(
            "SELECT worker, job_id FROM attempts WHERE ended IS NULL AND worker IS NOT NULL \
             ORDER BY job_id",
            &[],
        )? {
            let worker: String = col(&row, 0, "open attempt")?;
            held.entry(worker)
                .or_default()
                .push(col(&row, 1, "open attempt")?);
        }
        for worker in &mut workers {
            worker.jobs = held.remove(&worker.info.id).unwrap_or_default();
        }
        Ok(workers)
    }

    fn busy_ms(&mut self, worker: &str, from: Timestamp, to: Timestamp) -> Result<i64, JobError> {
        let rows = self.query(
            "SELECT started, ended FROM attempts WHERE worker = $1 AND started < $3 \
             AND (ended IS NULL OR ended > $2)",
            &[&worker, &from.0, &to.0],
        )?;
        let mut busy = 0i64;
        for row in &rows {
            let started: i64 = col(row, 0, "attempt")?;
            let ended: Option<i64> = col(row, 1, "attempt")?;
            let end = ended.unwrap_or(to.0).min(to.0);
            busy = busy.saturating_add((end - started.max(from.0)).max(0));
        }
        Ok(busy)
    }

    fn purge(&mut self, limits: &PurgeLimits) -> Result<PurgeCounts, JobError> {
        let max_count = bigint(limits.history_max_count);
        let before = limits.history_before.0;
        // Ended jobs past the count: mark the cutoff by the newest kept.
        let over_count = self
            .query_opt(
                "SELECT ended FROM archive ORDER BY ended DESC, job_id DESC LIMIT 1 OFFSET $1",
                &[&max_count],
            )?
            .is_some();
        // The ids that go, in a temporary table (SQLite's `temp.purged`)
        // that lasts as long as the connection, unless the purge that
        // created it rolls back. Looked for first: `IF NOT EXISTS` would
        // log a notice on every purge.
        let exists = self
            .query_opt("SELECT to_regclass('pg_temp.jobmgr_purged')::text", &[])?
            .map(|row| col::<Option<String>>(&row, 0, "temporary table"))
            .transpose()?
            .flatten()
            .is_some();
        if !exists {
            self.execute(
                "CREATE TEMP TABLE jobmgr_purged (job_id BIGINT PRIMARY KEY)",
                &[],
            )?;
        }
        self.execute("DELETE FROM jobmgr_purged", &[])?;
        self.execute(
            "INSERT INTO jobmgr_purged SELECT job_id FROM archive WHERE ended < $1",
            &[&before],
        )?;
        if over_count {
            self.execute(
                "INSERT INTO jobmgr_purged SELECT job_id FROM archive \
                 ORDER BY ended DESC, job_id DESC OFFSET $1 ON CONFLICT DO NOTHING",
                &[&max_count],
            )?;
        }
        // FAILED jobs go with their archive entry (as Sidekiq's dead set
        // is trimmed); a job that was retried since is not FAILED and stays.
        let failed = self.execute(
            "DELETE FROM jobs WHERE state = 'FAILED' \
             AND job_id IN (SELECT job_id FROM jobmgr_purged)",
            &[],
        )?;
        // `NOT EXISTS` rather than SQLite's `NOT IN (SELECT …)`, which
        // PostgreSQL runs row by row once the ids outgrow its memory; the
        // ids are never NULL, so the two mean the same.
        self.execute(
            "DELETE FROM jobs_before_handout b WHERE b.job_id IN (SELECT job_id FROM jobmgr_purged) \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = b.job_id)",
            &[],
        )?;
        let archived = self.execute(
            "DELETE FROM archive WHERE job_id IN (SELECT job_id FROM jobmgr_purged)",
            &[],
        )?;
        let mut attempts = self.execute(
            "DELETE FROM attempts WHERE ended IS NOT NULL AND ended < $1",
            &[&before],
        )?;
        attempts += self.execute(
            "DELETE FROM attempts a WHERE a.job_id IN (SELECT job_id FROM jobmgr_purged) \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = a.job_id)",
            &[],
        )?;
        // Attempts left open by jobs that are gone (none should be).
        attempts += self.execute(
            "DELETE FROM attempts a WHERE a.ended IS NULL \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = a.job_id)",
            &[],
        )?;
        self.execute("DELETE FROM jobmgr_purged", &[])?;
        self.execute(
            "DELETE FROM failures f WHERE NOT EXISTS \
             (SELECT 1 FROM jobs j WHERE j.job_id = f.job_id AND j.state = 'FAILED')",
            &[],
        )?;
        let stats_before = limits.stats_before.0;
        let stats = self.execute("DELETE FROM stats WHERE hour < $1", &[&stats_before])?
            + self.execute("DELETE FROM worker_stats WHERE hour < $1", &[&stats_before])?;
        let histograms = self.execute(
            "DELETE FROM stats_histogram WHERE hour < $1",
            &[&limits.histograms_before.0.max(stats_before)],
        )?;
        let workers = self.execute(
            "DELETE FROM workers w WHERE w.last_seen < $1 AND NOT EXISTS \
             (SELECT 1 FROM attempts a WHERE a.worker = w.worker AND a.ended IS NULL)",
            &[&before],
        )?;
        Ok(PurgeCounts {
            archived,
            failed,
            attempts,
            stats,
            histograms,
            workers,
        })
    }
}
