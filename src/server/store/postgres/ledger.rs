//! The ledger's rows in PostgreSQL: [`LedgerTx`] for [`PgTx`], a port of
//! the SQLite store's (`sqlite_ledger.rs`) statement for statement, with the
//! same results in the same order: attempts, the archive, failure groups,
//! the registry of supervisors and purges here, the hourly statistics in
//! [`super::ledger_stats`].

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use postgres::Row;
use postgres::types::FromSql;

use super::glob::{Params, name_condition};
use super::{PgTx, corrupt, ledger_stats};
use crate::protocol::{Data, JobError, JobId, NamePattern, Timestamp, WorkerInfo};
use crate::server::records::{
    ArchivedJob, Attempt, AttemptEnd, FailureGroup, OpenAttempt, PurgeCounts, StatsDelta, StatsRow,
    WorkerDelta, WorkerRow, WorkerStatsRow,
};
use crate::server::store::{ArchiveQuery, LedgerTx, PurgeLimits};

/// Column `i` of a row of `what`, or the error saying it cannot be read.
pub(super) fn col<'r, T: FromSql<'r>>(row: &'r Row, i: usize, what: &str) -> Result<T, JobError> {
    row.try_get(i).map_err(|e| corrupt(what, e))
}

/// A stored count, as SQLite's store reads it (a negative one is 0).
pub(super) fn count(row: &Row, i: usize, what: &str) -> Result<u64, JobError> {
    Ok(col::<i64>(row, i, what)?.max(0) as u64)
}

/// A stored count that must fit a `u32`.
fn small(row: &Row, i: usize, what: &str) -> Result<u32, JobError> {
    u32::try_from(col::<i64>(row, i, what)?).map_err(|e| corrupt(what, e))
}

/// Text as PostgreSQL can keep it: a `TEXT` cannot hold NUL, which SQLite
/// keeps and a worker's output may have; each becomes U+FFFD.
fn storable(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`storable`] for text that may be absent.
fn storable_opt(text: &Option<String>) -> Option<Cow<'_, str>> {
    text.as_deref().map(storable)
}

/// A count or limit as a BIGINT parameter (larger ones are clamped).
pub(super) fn bigint(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// The columns of an attempt, in the order [`read_attempt`] reads them.
const ATTEMPT_COLUMNS: &str = "job_id, name, attempt, worker, due, started, ended, outcome, \
     failure, exit_code, signal, stdout, stderr, stdout_bytes, stderr_bytes, hand_backs";

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
                hand_backs: col::<i64>(row, 15, WHAT)?.max(0) as u64,
            }),
            None => None,
        },
    })
}

/// The columns of an archived job, in the order [`read_archived`] reads them.
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

/// A statistics event held until the end of its transaction. Each row
/// written is locked; an operation that hands out jobs of several names
/// would lock them in hand-out order, and two such operations on two
/// servers deadlocked. Summed and written together at the end, sorted by
/// row, every transaction takes them in one order: supervisors' rows after
/// the names'.
#[derive(Debug)]
pub(super) enum Deferred {
    /// [`LedgerTx::add_stats`].
    Stats {
        name: String,
        hour: i64,
        delta: StatsDelta,
    },
    /// [`LedgerTx::add_worker_stats`].
    WorkerStats {
        worker: String,
        hour: i64,
        delta: WorkerDelta,
    },
}

impl PgTx<'_> {
    /// Writes the statistics events held back, summed per row, in row
    /// order: the names' rows, then the supervisors'.
    pub(super) fn write_deferred(&mut self) -> Result<(), JobError> {
        let mut names: BTreeMap<(String, i64), StatsRow> = BTreeMap::new();
        let mut workers: BTreeMap<(String, i64), WorkerStatsRow> = BTreeMap::new();
        for event in std::mem::take(&mut self.deferred) {
            match event {
                Deferred::Stats { name, hour, delta } => {
                    names
                        .entry((name.clone(), hour))
                        .or_insert_with(|| StatsRow {
                            name,
                            hour,
                            ..StatsRow::default()
                        })
                        .add(&delta);
                }
                Deferred::WorkerStats {
                    worker,
                    hour,
                    delta,
                } => workers
                    .entry((worker.clone(), hour))
                    .or_insert_with(|| WorkerStatsRow {
                        worker,
                        hour,
                        ..WorkerStatsRow::default()
                    })
                    .add(&delta),
            }
        }
        let names: Vec<StatsRow> = names.into_values().collect();
        let workers: Vec<WorkerStatsRow> = workers.into_values().collect();
        ledger_stats::add_stats(self, &names)?;
        ledger_stats::add_worker_stats(self, &workers)
    }
}

impl LedgerTx for PgTx<'_> {
    fn add_stats(&mut self, name: &str, hour: i64, delta: &StatsDelta) -> Result<(), JobError> {
        // Written at the end of the operation, in key order (see `Deferred`).
        self.deferred.push(Deferred::Stats {
            name: name.to_string(),
            hour,
            delta: delta.clone(),
        });
        Ok(())
    }

    fn stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<StatsRow>, JobError> {
        ledger_stats::stats(self, pattern, from, to)
    }

    fn add_worker_stats(
        &mut self,
        worker: &str,
        hour: i64,
        delta: &WorkerDelta,
    ) -> Result<(), JobError> {
        self.deferred.push(Deferred::WorkerStats {
            worker: worker.to_string(),
            hour,
            delta: *delta,
        });
        Ok(())
    }

    fn worker_stats(
        &mut self,
        pattern: Option<&NamePattern>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<WorkerStatsRow>, JobError> {
        ledger_stats::worker_stats(self, pattern, from, to)
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
             signal = $6, stdout = $7, stderr = $8, stdout_bytes = $9, stderr_bytes = $10, \
             hand_backs = $11 WHERE job_id = $1 AND ended IS NULL \
             RETURNING name, started, worker",
            &[
                &job_id,
                &ended.0,
                &storable(&end.outcome),
                &storable_opt(&end.failure),
                &end.exit_code,
                &storable_opt(&end.signal),
                &storable_opt(&end.stdout),
                &storable_opt(&end.stderr),
                &end.stdout_bytes.map(bigint),
                &end.stderr_bytes.map(bigint),
                &bigint(end.hand_backs),
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

    fn close_hand_back(
        &mut self,
        job_id: JobId,
        ended: Timestamp,
        end: &AttemptEnd,
    ) -> Result<Option<OpenAttempt>, JobError> {
        const WHAT: &str = "attempt";
        let latest = self.query_opt(
            "SELECT attempt_id, outcome FROM attempts WHERE job_id = $1 AND ended IS NOT NULL \
             ORDER BY attempt_id DESC LIMIT 1",
            &[&job_id],
        )?;
        let streak = match latest {
            Some(row) if col::<Option<String>>(&row, 1, WHAT)?.as_deref() == Some(&end.outcome) => {
                Some(col::<i64>(&row, 0, WHAT)?)
            }
            _ => None,
        };
        let Some(streak) = streak else {
            return self.close_attempt(job_id, ended, end);
        };
        let rows = self.query(
            "DELETE FROM attempts WHERE job_id = $1 AND ended IS NULL \
             RETURNING name, started, worker",
            &[&job_id],
        )?;
        self.execute(
            "UPDATE attempts SET ended = $2, hand_backs = hand_backs + 1, failure = $3 \
             WHERE attempt_id = $1",
            &[&streak, &ended.0, &storable_opt(&end.failure)],
        )?;
        rows.first()
            .map(|row| {
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
                &storable_opt(&job.failure),
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
            &[&job_id, &storable(group), &at.0],
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

    fn latest_failed_in_group(&mut self, group: &str) -> Result<Option<JobId>, JobError> {
        self.query(
            "SELECT f.job_id FROM failures f \
             JOIN jobs j ON j.job_id = f.job_id AND j.state = 'FAILED' \
             WHERE f.grp = $1 ORDER BY f.at DESC, f.job_id DESC LIMIT 1",
            &[&group],
        )?
        .first()
        .map(|row| col(row, 0, "failed job id"))
        .transpose()
    }

    fn see_worker(&mut self, info: &WorkerInfo, now: Timestamp) -> Result<(), JobError> {
        self.execute(
            "INSERT INTO workers (worker, host, pid, capacity, running, load, first_seen, last_seen, frozen) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8) \
             ON CONFLICT (worker) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
             capacity = excluded.capacity, running = excluded.running, load = excluded.load, \
             last_seen = GREATEST(workers.last_seen, excluded.last_seen), frozen = excluded.frozen",
            &[
                &info.id,
                &info.host,
                &i64::from(info.pid),
                &i64::from(info.capacity),
                &i64::from(info.running),
                &info.load,
                &now.0,
                &i64::from(info.frozen),
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
            "SELECT worker, host, pid, capacity, running, load, first_seen, last_seen, frozen \
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
                        frozen: small(row, 8, WHAT)?,
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
        // Tags go with their job; a tracked job that ended goes from the
        // tracked list with its archive entry.
        self.execute(
            "DELETE FROM job_tags t WHERE t.job_id IN (SELECT job_id FROM jobmgr_purged) \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = t.job_id)",
            &[],
        )?;
        self.execute(
            "DELETE FROM tracked_jobs t WHERE t.job_id IN (SELECT job_id FROM jobmgr_purged) \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = t.job_id)",
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
        // The claim's plan rests on the queue's statistics: without them
        // (a burst of creates, autovacuum off or not yet round) PostgreSQL
        // may scan every ready job on each dequeue. ANALYZE samples a
        // bounded number of rows and blocks neither reads nor writes.
        self.execute("ANALYZE jobs", &[])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_stored_as_given_but_for_nul() {
        assert!(matches!(storable("out\nput"), Cow::Borrowed("out\nput")));
        assert_eq!(storable("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(
            storable_opt(&Some("\0".into())).as_deref(),
            Some("\u{FFFD}")
        );
        assert_eq!(storable_opt(&None), None);
    }

    #[test]
    fn a_time_window_is_not_read_in_id_order() {
        let window = ArchiveQuery {
            since: Some(Timestamp(5)),
            limit: 10,
            ..ArchiveQuery::default()
        };
        let (sql, params) = archive_sql(&window);
        assert!(sql.ends_with("ORDER BY job_id + 0 LIMIT $3"), "{sql}");
        assert_eq!(params.refs().len(), 3);
        let page = ArchiveQuery {
            pattern: Some(NamePattern::Glob("job-*".into())),
            limit: 10,
            ..ArchiveQuery::default()
        };
        let (sql, _) = archive_sql(&page);
        assert!(sql.ends_with("ORDER BY job_id LIMIT $5"), "{sql}");
    }
}
