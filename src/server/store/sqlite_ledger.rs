//! The ledger's tables in the SQLite store (schema versions 2 and 3).

use rusqlite::{OptionalExtension, Row, params};

use super::ArchiveQuery;
use super::ledger::{LedgerTx, PurgeLimits};
use super::sqlite::{FailingTx, SqliteTx, store_error};
use crate::protocol::{Data, JobError, JobId, NamePattern, Timestamp, WorkerInfo};
use crate::server::records::{
    ArchivedJob, Attempt, AttemptEnd, FailureGroup, OpenAttempt, PurgeCounts, StatsDelta, StatsRow,
    Summary, WorkerDelta, WorkerRow, WorkerStatsRow, histogram,
};

const ATTEMPT_COLUMNS: &str = "job_id, name, attempt, worker, due, started, ended, outcome, \
     failure, exit_code, signal, stdout, stderr, stdout_bytes, stderr_bytes, hand_backs";

fn read_attempt(row: &Row<'_>) -> rusqlite::Result<Attempt> {
    let outcome: Option<String> = row.get(7)?;
    Ok(Attempt {
        job_id: row.get(0)?,
        name: row.get(1)?,
        attempt: row.get(2)?,
        worker: row.get(3)?,
        due: Timestamp(row.get(4)?),
        started: Timestamp(row.get(5)?),
        ended: row.get::<_, Option<i64>>(6)?.map(Timestamp),
        end: match outcome {
            Some(outcome) => Some(AttemptEnd {
                outcome,
                failure: row.get(8)?,
                exit_code: row.get(9)?,
                signal: row.get(10)?,
                stdout: row.get(11)?,
                stderr: row.get(12)?,
                stdout_bytes: row.get::<_, Option<i64>>(13)?.map(|n| n.max(0) as u64),
                stderr_bytes: row.get::<_, Option<i64>>(14)?.map(|n| n.max(0) as u64),
                hand_backs: row.get::<_, i64>(15)?.max(0) as u64,
            }),
            None => None,
        },
    })
}

/// A supervisor's runs still open, read at each of its reports and
/// hand-outs (from the `attempts_open` index, not the whole history).
pub(super) const OPEN_RUNS_OF: &str =
    "SELECT worker, started FROM attempts WHERE worker = ?1 AND ended IS NULL";

/// Every supervisor's runs still open.
pub(super) const OPEN_RUNS: &str =
    "SELECT worker, started FROM attempts WHERE ended IS NULL AND worker IS NOT NULL";

const STATS_COLUMNS: &str = "name, hour, added, started, finished, failed, retried, \
     wait_n, wait_mean, wait_m2, wait_min, wait_max, run_n, run_mean, run_m2, run_min, run_max, \
     service_n, service_mean, service_m2, service_min, service_max";

fn read_stats(row: &Row<'_>) -> rusqlite::Result<StatsRow> {
    let count = |i: usize| -> rusqlite::Result<u64> { Ok(row.get::<_, i64>(i)?.max(0) as u64) };
    let summary = |at: usize| read_summary(row, at);
    Ok(StatsRow {
        name: row.get(0)?,
        hour: row.get(1)?,
        added: count(2)?,
        started: count(3)?,
        finished: count(4)?,
        failed: count(5)?,
        retried: count(6)?,
        wait: summary(7)?,
        run: summary(12)?,
        service: summary(17)?,
        wait_histogram: None,
        run_histogram: None,
    })
}

/// The SET clauses that add one sample (given as `excluded.X_mean` with
/// `excluded.X_n` = 1, or nothing with 0) to summary `X` by Welford's
/// update; every right-hand side reads the row as it was.
fn welford(x: &str) -> String {
    format!(
        "{x}_mean = CASE WHEN excluded.{x}_n = 0 THEN {x}_mean \
           ELSE {x}_mean + (excluded.{x}_mean - {x}_mean) / ({x}_n + 1) END, \
         {x}_m2 = CASE WHEN excluded.{x}_n = 0 THEN {x}_m2 \
           ELSE {x}_m2 + (excluded.{x}_mean - {x}_mean) \
             * (excluded.{x}_mean - ({x}_mean + (excluded.{x}_mean - {x}_mean) / ({x}_n + 1))) END, \
         {x}_min = CASE WHEN excluded.{x}_n = 0 THEN {x}_min \
           ELSE MIN(COALESCE({x}_min, excluded.{x}_min), excluded.{x}_min) END, \
         {x}_max = CASE WHEN excluded.{x}_n = 0 THEN {x}_max \
           ELSE MAX(COALESCE({x}_max, excluded.{x}_max), excluded.{x}_max) END, \
         {x}_n = {x}_n + excluded.{x}_n"
    )
}

/// Adds one event to an hour's row in one statement, without reading it.
static ADD_STATS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO stats ({STATS_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, \
           ?8, COALESCE(?9, 0), 0, ?9, ?9, ?10, COALESCE(?11, 0), 0, ?11, ?11, \
           ?12, COALESCE(?13, 0), 0, ?13, ?13) \
         ON CONFLICT (name, hour) DO UPDATE SET \
           added = added + excluded.added, started = started + excluded.started, \
           finished = finished + excluded.finished, failed = failed + excluded.failed, \
           retried = retried + excluded.retried, {}, {}, {}",
        welford("wait"),
        welford("run"),
        welford("service")
    )
});

/// Adds one event to a supervisor's hour in one statement.
static ADD_WORKER_STATS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO worker_stats (worker, hour, run_n, run_mean, run_m2, run_min, run_max, \
           busy_ms, capacity_ms) VALUES (?1, ?2, ?3, COALESCE(?4, 0), 0, ?4, ?4, ?5, ?6) \
         ON CONFLICT (worker, hour) DO UPDATE SET \
           busy_ms = busy_ms + excluded.busy_ms, \
           capacity_ms = capacity_ms + excluded.capacity_ms, {}",
        welford("run")
    )
});

fn read_summary(row: &Row<'_>, at: usize) -> rusqlite::Result<Summary> {
    Ok(Summary {
        count: row.get::<_, i64>(at)?.max(0) as u64,
        mean: row.get(at + 1)?,
        m2: row.get(at + 2)?,
        min: row.get::<_, Option<f64>>(at + 3)?.unwrap_or(0.0),
        max: row.get::<_, Option<f64>>(at + 4)?.unwrap_or(0.0),
    })
}

const ARCHIVE_COLUMNS: &str = "job_id, name, state, data, created, ended, attempts, failure";

fn read_archived(row: &Row<'_>) -> rusqlite::Result<ArchivedJob> {
    let data: String = row.get(3)?;
    Ok(ArchivedJob {
        job_id: row.get(0)?,
        name: row.get(1)?,
        state: row.get(2)?,
        data: serde_json::from_str::<Data>(&data).unwrap_or_default(),
        created: Timestamp(row.get(4)?),
        ended: Timestamp(row.get(5)?),
        attempts: row.get(6)?,
        failure: row.get(7)?,
    })
}

impl LedgerTx for SqliteTx<'_> {
    fn add_stats(&mut self, name: &str, hour: i64, delta: &StatsDelta) -> Result<(), JobError> {
        // A sample, or no sample: count 0 and no value (so no min or max).
        let sample = |ms: Option<i64>| (i64::from(ms.is_some()), ms.map(|ms| ms.max(0) as f64));
        let (wait_n, wait) = sample(delta.wait_ms);
        let (run_n, run) = sample(delta.run_ms);
        let (service_n, service) = sample(delta.service_ms);
        self.conn
            .prepare_cached(&ADD_STATS_SQL)
            .map_err(store_error)?
            .execute(params![
                name,
                hour,
                delta.added as i64,
                delta.started as i64,
                delta.finished as i64,
                delta.failed as i64,
                delta.retried as i64,
                wait_n,
                wait,
                run_n,
                run,
                service_n,
                service,
            ])
            .map_err(store_error)?;
        for (kind, ms) in [("wait", delta.wait_ms), ("run", delta.run_ms)] {
            if let Some(ms) = ms {
                self.conn
                    .prepare_cached(
                        "INSERT INTO stats_histogram (name, hour, kind, bucket, count) \
                         VALUES (?1, ?2, ?3, ?4, 1) \
                         ON CONFLICT (name, hour, kind, bucket) DO UPDATE SET count = count + 1",
                    )
                    .map_err(store_error)?
                    .execute(params![name, hour, kind, histogram::bucket(ms) as i64])
                    .map_err(store_error)?;
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
        let mut statement = self
            .conn
            .prepare_cached(&format!(
                "SELECT {STATS_COLUMNS} FROM stats WHERE hour >= ?1 AND hour < ?2 ORDER BY name, hour"
            ))
            .map_err(store_error)?;
        let rows = statement
            .query_map(params![from.0, to.0], read_stats)
            .map_err(store_error)?;
        let mut out: std::collections::BTreeMap<(String, i64), StatsRow> = Default::default();
        for row in rows {
            let row = row.map_err(store_error)?;
            if pattern.is_none_or(|p| p.matches(&row.name)) {
                out.insert((row.name.clone(), row.hour), row);
            }
        }
        let mut buckets = self
            .conn
            .prepare_cached(
                "SELECT name, hour, kind, bucket, count FROM stats_histogram \
                 WHERE hour >= ?1 AND hour < ?2",
            )
            .map_err(store_error)?;
        let buckets = buckets
            .query_map(params![from.0, to.0], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, i64>(4)?,
                ))
            })
            .map_err(store_error)?;
        for bucket in buckets {
            let (name, hour, kind, bucket, count) = bucket.map_err(store_error)?;
            let (Some(row), Ok(bucket)) = (out.get_mut(&(name, hour)), usize::try_from(bucket))
            else {
                continue;
            };
            if bucket >= histogram::bucket_count() {
                continue;
            }
            let histogram = match kind.as_str() {
                "wait" => &mut row.wait_histogram,
                "run" => &mut row.run_histogram,
                _ => continue,
            };
            histogram
                .get_or_insert_default()
                .0
                .insert(bucket, count.max(0) as u64);
        }
        Ok(out.into_values().collect())
    }

    fn add_worker_stats(
        &mut self,
        worker: &str,
        hour: i64,
        delta: &WorkerDelta,
    ) -> Result<(), JobError> {
        self.conn
            .prepare_cached(&ADD_WORKER_STATS_SQL)
            .map_err(store_error)?
            .execute(params![
                worker,
                hour,
                i64::from(delta.run_ms.is_some()),
                delta.run_ms.map(|ms| ms.max(0) as f64),
                delta.busy_ms.max(0),
                delta.capacity_ms.max(0),
            ])
            .map_err(store_error)?;
        Ok(())
    }

    fn worker_stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<WorkerStatsRow>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT worker, hour, run_n, run_mean, run_m2, run_min, run_max, busy_ms, \
                 capacity_ms FROM worker_stats WHERE hour >= ?1 AND hour < ?2 ORDER BY worker, hour",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map(params![from.0, to.0], |row| {
                Ok(WorkerStatsRow {
                    worker: row.get(0)?,
                    hour: row.get(1)?,
                    run: read_summary(row, 2)?,
                    busy_ms: row.get(7)?,
                    capacity_ms: row.get(8)?,
                })
            })
            .map_err(store_error)?;
        let mut out = Vec::new();
        for row in rows {
            let row = row.map_err(store_error)?;
            if pattern.is_none_or(|p| p.matches(&row.worker)) {
                out.push(row);
            }
        }
        Ok(out)
    }

    fn open_attempt(&mut self, attempt: &Attempt) -> Result<(), JobError> {
        self.conn
            .prepare_cached(
                "INSERT INTO attempts (job_id, name, attempt, worker, due, started) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(store_error)?
            .execute(params![
                attempt.job_id,
                attempt.name,
                attempt.attempt,
                attempt.worker,
                attempt.due.0,
                attempt.started.0,
            ])
            .map_err(store_error)?;
        Ok(())
    }

    fn close_attempt(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        self.conn
            .prepare_cached(
                "UPDATE attempts SET ended = ?2, outcome = ?3, failure = ?4, exit_code = ?5, \
                 signal = ?6, stdout = ?7, stderr = ?8, stdout_bytes = ?9, stderr_bytes = ?10, \
                 hand_backs = ?11 WHERE job_id = ?1 AND ended IS NULL \
                 RETURNING name, started, worker",
            )
            .map_err(store_error)?
            .query_row(
                params![
                    job_id,
                    ended.0,
                    end.outcome,
                    end.failure,
                    end.exit_code,
                    end.signal,
                    end.stdout,
                    end.stderr,
                    end.stdout_bytes.map(|n| n.min(i64::MAX as u64) as i64),
                    end.stderr_bytes.map(|n| n.min(i64::MAX as u64) as i64),
                    end.hand_backs.min(i64::MAX as u64) as i64,
                ],
                |row| {
                    Ok(OpenAttempt {
                        name: row.get(0)?,
                        started: Timestamp(row.get(1)?),
                        worker: row.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(store_error)
    }

    fn close_hand_back(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        let streak: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT attempt_id, outcome FROM attempts WHERE job_id = ?1 AND ended IS NOT NULL \
                 ORDER BY attempt_id DESC LIMIT 1",
            )
            .map_err(store_error)?
            .query_row([job_id], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
            })
            .optional()
            .map_err(store_error)?
            .filter(|(_, outcome)| outcome.as_deref() == Some(end.outcome.as_str()))
            .map(|(id, _)| id);
        let Some(streak) = streak else {
            return self.close_attempt(job_id, ended, end);
        };
        let open = self
            .conn
            .prepare_cached(
                "DELETE FROM attempts WHERE job_id = ?1 AND ended IS NULL \
                 RETURNING name, started, worker",
            )
            .map_err(store_error)?
            .query_row([job_id], |row| {
                Ok(OpenAttempt {
                    name: row.get(0)?,
                    started: Timestamp(row.get(1)?),
                    worker: row.get(2)?,
                })
            })
            .optional()
            .map_err(store_error)?;
        self.conn
            .prepare_cached(
                "UPDATE attempts SET ended = ?2, hand_backs = hand_backs + 1, failure = ?3 \
                 WHERE attempt_id = ?1",
            )
            .map_err(store_error)?
            .execute(params![streak, ended.0, end.failure])
            .map_err(store_error)?;
        Ok(open)
    }

    fn discard_open_attempt(&mut self, job_id: JobId) -> Result<(), JobError> {
        self.conn
            .prepare_cached("DELETE FROM attempts WHERE job_id = ?1 AND ended IS NULL")
            .map_err(store_error)?
            .execute([job_id])
            .map_err(store_error)?;
        Ok(())
    }

    fn occurrence_start(&mut self, job_id: JobId) -> Result<Option<Timestamp>, JobError> {
        self.conn
            .prepare_cached(
                "SELECT due FROM attempts WHERE job_id = ?1 AND attempt = 1 \
                 ORDER BY attempt_id DESC LIMIT 1",
            )
            .map_err(store_error)?
            .query_row([job_id], |row| row.get::<_, i64>(0))
            .optional()
            .map(|t| t.map(Timestamp))
            .map_err(store_error)
    }

    fn attempts(
        &mut self,
        job_id: JobId,
        skip: usize,
        limit: usize,
    ) -> Result<(Vec<Attempt>, u64), JobError> {
        let total: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM attempts WHERE job_id = ?1")
            .map_err(store_error)?
            .query_row([job_id], |row| row.get(0))
            .map_err(store_error)?;
        let mut statement = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ?1 \
                 ORDER BY attempt_id DESC LIMIT ?2 OFFSET ?3"
            ))
            .map_err(store_error)?;
        let clamp = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let rows = statement
            .query_map(params![job_id, clamp(limit), clamp(skip)], read_attempt)
            .map_err(store_error)?;
        let mut attempts: Vec<Attempt> = rows.collect::<Result<_, _>>().map_err(store_error)?;
        attempts.reverse();
        Ok((attempts, total.max(0) as u64))
    }

    fn archive(&mut self, job: &ArchivedJob) -> Result<(), JobError> {
        let data = serde_json::to_string(&job.data).map_err(|e| JobError::Store(e.to_string()))?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO archive (job_id, name, state, data, created, ended, attempts, failure) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .map_err(store_error)?
            .execute(params![
                job.job_id,
                job.name,
                job.state,
                data,
                job.created.0,
                job.ended.0,
                job.attempts,
                job.failure,
            ])
            .map_err(store_error)?;
        Ok(())
    }

    fn archived(&mut self, job_id: JobId) -> Result<Option<ArchivedJob>, JobError> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {ARCHIVE_COLUMNS} FROM archive WHERE job_id = ?1"
            ))
            .map_err(store_error)?
            .query_row([job_id], read_archived)
            .optional()
            .map_err(store_error)
    }

    fn archived_list(&mut self, query: &ArchiveQuery) -> Result<Vec<ArchivedJob>, JobError> {
        let (sql, params) = super::archive_listing::archive_sql(ARCHIVE_COLUMNS, query);
        let mut statement = self.conn.prepare_cached(&sql).map_err(store_error)?;
        let rows = statement
            .query_map(rusqlite::params_from_iter(params), read_archived)
            .map_err(store_error)?;
        rows.collect::<Result<_, _>>().map_err(store_error)
    }

    fn set_failure(&mut self, job_id: JobId, group: &str, at: Timestamp) -> Result<(), JobError> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO failures (job_id, grp, at) VALUES (?1, ?2, ?3)")
            .map_err(store_error)?
            .execute(params![job_id, group, at.0])
            .map_err(store_error)?;
        Ok(())
    }

    fn clear_failure(&mut self, job_id: JobId) -> Result<(), JobError> {
        self.conn
            .prepare_cached("DELETE FROM failures WHERE job_id = ?1")
            .map_err(store_error)?
            .execute([job_id])
            .map_err(store_error)?;
        Ok(())
    }

    fn failure_groups(&mut self) -> Result<Vec<FailureGroup>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT f.grp, COUNT(*), MIN(f.at), MAX(f.at) FROM failures f \
                 JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
                 GROUP BY f.grp ORDER BY COUNT(*) DESC, f.grp",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map([], |row| {
                Ok(FailureGroup {
                    group: row.get(0)?,
                    count: row.get::<_, i64>(1)?.max(0) as u64,
                    first: Timestamp(row.get(2)?),
                    last: Timestamp(row.get(3)?),
                })
            })
            .map_err(store_error)?;
        rows.collect::<Result<_, _>>().map_err(store_error)
    }

    fn failed_in_group(&mut self, group: &str, limit: usize) -> Result<Vec<JobId>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT f.job_id FROM failures f \
                 JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
                 WHERE f.grp = ?1 ORDER BY f.at, f.job_id LIMIT ?2",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map(params![group, limit.min(i64::MAX as usize) as i64], |row| {
                row.get(0)
            })
            .map_err(store_error)?;
        rows.collect::<Result<_, _>>().map_err(store_error)
    }

    fn latest_failed_in_group(&mut self, group: &str) -> Result<Option<JobId>, JobError> {
        self.conn
            .prepare_cached(
                "SELECT f.job_id FROM failures f \
                 JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
                 WHERE f.grp = ?1 ORDER BY f.at DESC, f.job_id DESC LIMIT 1",
            )
            .map_err(store_error)?
            .query_row([group], |row| row.get(0))
            .optional()
            .map_err(store_error)
    }

    fn see_worker(&mut self, info: &WorkerInfo, now: Timestamp) -> Result<(), JobError> {
        self.conn
            .prepare_cached(
                "INSERT INTO workers (worker, host, pid, capacity, running, load, first_seen, last_seen, frozen) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8) \
                 ON CONFLICT (worker) DO UPDATE SET host = ?2, pid = ?3, capacity = ?4, \
                 running = ?5, load = ?6, last_seen = MAX(last_seen, ?7), frozen = ?8",
            )
            .map_err(store_error)?
            .execute(params![
                info.id,
                info.host,
                info.pid,
                info.capacity,
                info.running,
                info.load,
                now.0,
                info.frozen
            ])
            .map_err(store_error)?;
        Ok(())
    }

    fn touch_worker(&mut self, worker: &str, now: Timestamp) -> Result<(), JobError> {
        self.conn
            .prepare_cached("UPDATE workers SET last_seen = MAX(last_seen, ?2) WHERE worker = ?1")
            .map_err(store_error)?
            .execute(params![worker, now.0])
            .map_err(store_error)?;
        Ok(())
    }

    fn sighting(&mut self, worker: &str) -> Result<Option<(Timestamp, u32)>, JobError> {
        self.conn
            .prepare_cached("SELECT last_seen, capacity FROM workers WHERE worker = ?1")
            .map_err(store_error)?
            .query_row([worker], |row| Ok((Timestamp(row.get(0)?), row.get(1)?)))
            .optional()
            .map_err(store_error)
    }

    fn holder(&mut self, job_id: JobId) -> Result<Option<String>, JobError> {
        self.conn
            .prepare_cached(
                "SELECT worker FROM attempts WHERE job_id = ?1 AND ended IS NULL \
                 AND worker IS NOT NULL ORDER BY attempt_id DESC LIMIT 1",
            )
            .map_err(store_error)?
            .query_row([job_id], |row| row.get(0))
            .optional()
            .map_err(store_error)
    }

    fn open_runs(&mut self, worker: Option<&str>) -> Result<Vec<(String, Timestamp)>, JobError> {
        let read = |row: &Row<'_>| Ok((row.get(0)?, Timestamp(row.get(1)?)));
        let rows = match worker {
            Some(worker) => self
                .conn
                .prepare_cached(OPEN_RUNS_OF)
                .map_err(store_error)?
                .query_map([worker], read)
                .map_err(store_error)?
                .collect::<Result<_, _>>(),
            None => self
                .conn
                .prepare_cached(OPEN_RUNS)
                .map_err(store_error)?
                .query_map([], read)
                .map_err(store_error)?
                .collect::<Result<_, _>>(),
        };
        rows.map_err(store_error)
    }

    fn workers(&mut self) -> Result<Vec<WorkerRow>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT worker, host, pid, capacity, running, load, first_seen, last_seen, frozen \
                 FROM workers ORDER BY last_seen DESC, worker",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map([], |row| {
                Ok(WorkerRow {
                    info: WorkerInfo {
                        id: row.get(0)?,
                        host: row.get(1)?,
                        pid: row.get(2)?,
                        capacity: row.get(3)?,
                        running: row.get(4)?,
                        load: row.get(5)?,
                        frozen: row.get(8)?,
                    },
                    first_seen: Timestamp(row.get(6)?),
                    last_seen: Timestamp(row.get(7)?),
                    jobs: Vec::new(),
                })
            })
            .map_err(store_error)?;
        let mut workers: Vec<WorkerRow> = rows.collect::<Result<_, _>>().map_err(store_error)?;
        let mut held = self
            .conn
            .prepare_cached(
                "SELECT job_id FROM attempts WHERE worker = ?1 AND ended IS NULL ORDER BY job_id",
            )
            .map_err(store_error)?;
        for worker in &mut workers {
            worker.jobs = held
                .query_map([&worker.info.id], |row| row.get(0))
                .map_err(store_error)?
                .collect::<Result<_, _>>()
                .map_err(store_error)?;
        }
        Ok(workers)
    }

    fn busy_ms(&mut self, worker: &str, from: Timestamp, to: Timestamp) -> Result<i64, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT started, ended FROM attempts WHERE worker = ?1 AND started < ?3 \
                 AND (ended IS NULL OR ended > ?2)",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map(params![worker, from.0, to.0], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, Option<i64>>(1)?))
            })
            .map_err(store_error)?;
        let mut busy = 0i64;
        for row in rows {
            let (started, ended) = row.map_err(store_error)?;
            let end = ended.unwrap_or(to.0).min(to.0);
            busy = busy.saturating_add((end - started.max(from.0)).max(0));
        }
        Ok(busy)
    }

    fn purge(&mut self, limits: &PurgeLimits) -> Result<PurgeCounts, JobError> {
        let exec = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> Result<u64, JobError> {
            self.conn
                .execute(sql, p)
                .map(|n| n as u64)
                .map_err(store_error)
        };
        // Ended jobs past the count: mark the cutoff by the newest kept.
        let count_cutoff: Option<i64> = self
            .conn
            .query_row(
                "SELECT ended FROM archive ORDER BY ended DESC, job_id DESC LIMIT 1 OFFSET ?1",
                [limits.history_max_count.min(i64::MAX as u64) as i64],
                |row| row.get(0),
            )
            .optional()
            .map_err(store_error)?;
        exec(
            "CREATE TEMP TABLE IF NOT EXISTS purged (job_id INTEGER PRIMARY KEY)",
            &[],
        )?;
        exec("DELETE FROM temp.purged", &[])?;
        exec(
            "INSERT INTO temp.purged SELECT job_id FROM archive WHERE ended < ?1",
            &[&limits.history_before.0],
        )?;
        if count_cutoff.is_some() {
            exec(
                "INSERT OR IGNORE INTO temp.purged SELECT job_id FROM archive \
                 ORDER BY ended DESC, job_id DESC LIMIT -1 OFFSET ?1",
                &[&(limits.history_max_count.min(i64::MAX as u64) as i64)],
            )?;
        }
        // FAILED jobs go with their archive entry (as Sidekiq's dead set
        // is trimmed); a job that was retried since is not FAILED and stays.
        let failed = exec(
            "DELETE FROM jobs WHERE state = 'FAILED' AND job_id IN (SELECT job_id FROM temp.purged)",
            &[],
        )?;
        exec(
            "DELETE FROM jobs_before_handout WHERE job_id IN (SELECT job_id FROM temp.purged) \
             AND job_id NOT IN (SELECT job_id FROM jobs)",
            &[],
        )?;
        // Tags go with their job; a tracked job that ended goes from the
        // tracked list with its archive entry.
        exec(
            "DELETE FROM job_tags WHERE job_id IN (SELECT job_id FROM temp.purged) \
             AND job_id NOT IN (SELECT job_id FROM jobs)",
            &[],
        )?;
        exec(
            "DELETE FROM tracked_jobs WHERE job_id IN (SELECT job_id FROM temp.purged) \
             AND job_id NOT IN (SELECT job_id FROM jobs)",
            &[],
        )?;
        let archived = exec(
            "DELETE FROM archive WHERE job_id IN (SELECT job_id FROM temp.purged)",
            &[],
        )?;
        let mut attempts = exec(
            "DELETE FROM attempts WHERE ended IS NOT NULL AND ended < ?1",
            &[&limits.history_before.0],
        )?;
        attempts += exec(
            "DELETE FROM attempts WHERE job_id IN (SELECT job_id FROM temp.purged) \
             AND job_id NOT IN (SELECT job_id FROM jobs)",
            &[],
        )?;
        // Attempts left open by jobs that are gone (none should be).
        attempts += exec(
            "DELETE FROM attempts WHERE ended IS NULL AND job_id NOT IN (SELECT job_id FROM jobs)",
            &[],
        )?;
        exec("DELETE FROM temp.purged", &[])?;
        exec(
            "DELETE FROM failures WHERE job_id NOT IN (SELECT job_id FROM jobs WHERE state = 'FAILED')",
            &[],
        )?;
        let stats = exec(
            "DELETE FROM stats WHERE hour < ?1",
            &[&limits.stats_before.0],
        )? + exec(
            "DELETE FROM worker_stats WHERE hour < ?1",
            &[&limits.stats_before.0],
        )?;
        let histograms = exec(
            "DELETE FROM stats_histogram WHERE hour < ?1",
            &[&limits.histograms_before.0.max(limits.stats_before.0)],
        )?;
        let workers = exec(
            "DELETE FROM workers WHERE last_seen < ?1 AND worker NOT IN \
             (SELECT worker FROM attempts WHERE ended IS NULL AND worker IS NOT NULL)",
            &[&limits.history_before.0],
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

/// A transaction that refuses everything.
impl LedgerTx for FailingTx {
    fn add_stats(&mut self, _: &str, _: i64, _: &StatsDelta) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn stats(
        &mut self,
        _: Option<&NamePattern>,
        _: Timestamp,
        _: Timestamp,
    ) -> Result<Vec<StatsRow>, JobError> {
        Err(self.0.clone())
    }
    fn add_worker_stats(&mut self, _: &str, _: i64, _: &WorkerDelta) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn worker_stats(
        &mut self,
        _: Option<&NamePattern>,
        _: Timestamp,
        _: Timestamp,
    ) -> Result<Vec<WorkerStatsRow>, JobError> {
        Err(self.0.clone())
    }
    fn open_attempt(&mut self, _: &Attempt) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn close_attempt(
        &mut self,
        _: JobId,
        _: Timestamp,
        _: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        Err(self.0.clone())
    }
    fn close_hand_back(
        &mut self,
        _: JobId,
        _: Timestamp,
        _: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        Err(self.0.clone())
    }
    fn discard_open_attempt(&mut self, _: JobId) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn occurrence_start(&mut self, _: JobId) -> Result<Option<Timestamp>, JobError> {
        Err(self.0.clone())
    }
    fn attempts(&mut self, _: JobId, _: usize, _: usize) -> Result<(Vec<Attempt>, u64), JobError> {
        Err(self.0.clone())
    }
    fn archive(&mut self, _: &ArchivedJob) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn archived(&mut self, _: JobId) -> Result<Option<ArchivedJob>, JobError> {
        Err(self.0.clone())
    }
    fn archived_list(&mut self, _: &ArchiveQuery) -> Result<Vec<ArchivedJob>, JobError> {
        Err(self.0.clone())
    }
    fn set_failure(&mut self, _: JobId, _: &str, _: Timestamp) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn clear_failure(&mut self, _: JobId) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn failure_groups(&mut self) -> Result<Vec<FailureGroup>, JobError> {
        Err(self.0.clone())
    }
    fn failed_in_group(&mut self, _: &str, _: usize) -> Result<Vec<JobId>, JobError> {
        Err(self.0.clone())
    }
    fn latest_failed_in_group(&mut self, _: &str) -> Result<Option<JobId>, JobError> {
        Err(self.0.clone())
    }
    fn see_worker(&mut self, _: &WorkerInfo, _: Timestamp) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn touch_worker(&mut self, _: &str, _: Timestamp) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn sighting(&mut self, _: &str) -> Result<Option<(Timestamp, u32)>, JobError> {
        Err(self.0.clone())
    }
    fn holder(&mut self, _: JobId) -> Result<Option<String>, JobError> {
        Err(self.0.clone())
    }
    fn open_runs(&mut self, _: Option<&str>) -> Result<Vec<(String, Timestamp)>, JobError> {
        Err(self.0.clone())
    }
    fn workers(&mut self) -> Result<Vec<WorkerRow>, JobError> {
        Err(self.0.clone())
    }
    fn busy_ms(&mut self, _: &str, _: Timestamp, _: Timestamp) -> Result<i64, JobError> {
        Err(self.0.clone())
    }
    fn purge(&mut self, _: &PurgeLimits) -> Result<PurgeCounts, JobError> {
        Err(self.0.clone())
    }
}
