//! The jobs' rows in PostgreSQL: [`StoreTx`] for [`PgTx`]. In a write
//! transaction every row an operation may change is locked as it is read:
//! a claim skips rows another server holds (`FOR UPDATE SKIP LOCKED`), a
//! read of one job waits for them (`FOR UPDATE`), and a child's parent is
//! locked before the child, so that two servers finishing siblings take
//! turns instead of deadlocking (a job's children are read unlocked: see
//! [`StoreTx::children`]).

use std::sync::LazyLock;

use postgres::Row;
use postgres::types::ToSql;

use super::glob::{Params, name_condition};
use super::{PgTx, corrupt, notify};
use crate::protocol::{
    Data, Job, JobError, JobId, JobState, Lease, NamePattern, Priority, Timestamp,
};
use crate::server::store::{ByteCount, ListQuery, Page, ReadyJob, StoreTx};

/// The columns of a job, in the order [`read_job`] reads them.
pub(super) const COLUMNS: &str = "job_id, name, state, data, priority, created, next_run, last_run, repeat, \
     retry_after, parent_id, scheduled_run, lease_token, lease_expires, lease_term_ms, attempts, lapses";

const READY: &str = "state IN ('QUEUED', 'RUNQUEUED')";

pub(super) fn read_job(row: &Row) -> Result<Job, JobError> {
    let get_err = |e: postgres::Error| corrupt("job", e);
    let state: String = row.try_get(2).map_err(get_err)?;
    let state = state.parse::<JobState>().map_err(|e| corrupt("state", e))?;
    let data: String = row.try_get(3).map_err(get_err)?;
    let data: Data = serde_json::from_str(&data).map_err(|e| corrupt("data", e))?;
    let priority =
        Priority::new(row.try_get(4).map_err(get_err)?).map_err(|e| corrupt("priority", e))?;
    let token: Option<String> = row.try_get(12).map_err(get_err)?;
    let lease = match token {
        Some(token) => Some(Lease {
            token,
            expires: row
                .try_get::<_, Option<i64>>(13)
                .map_err(get_err)?
                .map(Timestamp),
            term_ms: row.try_get(14).map_err(get_err)?,
        }),
        None => None,
    };
    Ok(Job {
        id: row.try_get(0).map_err(get_err)?,
        name: row.try_get(1).map_err(get_err)?,
        state,
        data,
        priority,
        created: Timestamp(row.try_get(5).map_err(get_err)?),
        next_run: Timestamp(row.try_get(6).map_err(get_err)?),
        last_run: row
            .try_get::<_, Option<i64>>(7)
            .map_err(get_err)?
            .map(Timestamp),
        repeat: row.try_get(8).map_err(get_err)?,
        retry_after: row.try_get(9).map_err(get_err)?,
        parent_id: row.try_get(10).map_err(get_err)?,
        scheduled_run: row
            .try_get::<_, Option<i64>>(11)
            .map_err(get_err)?
            .map(Timestamp),
        lease,
        attempts: row.try_get(15).map_err(get_err)?,
        lapses: row.try_get(16).map_err(get_err)?,
    })
}

pub(super) fn read_jobs(rows: Vec<Row>) -> Result<Vec<Job>, JobError> {
    rows.iter().map(read_job).collect()
}

/// The jobs of `rows` (each [`COLUMNS`] and then its stored size) that
/// `bytes` admits, in order, `taken` jobs having been taken before them.
pub(super) fn read_within(
    rows: Vec<Row>,
    bytes: &mut ByteCount,
    taken: usize,
) -> Result<Vec<Job>, JobError> {
    let mut jobs = Vec::new();
    for row in &rows {
        let size: i64 = row
            .try_get::<_, Option<i64>>(17)
            .map_err(|e| corrupt("size", e))?
            .unwrap_or(0);
        if !bytes.admit(usize::try_from(size).unwrap_or(0), taken + jobs.len() == 0) {
            break;
        }
        jobs.push(read_job(row)?);
    }
    Ok(jobs)
}

/// A row count as SQL's `LIMIT` takes it: `usize::MAX` (no bound) would
/// wrap to a negative number, which PostgreSQL refuses.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// A job's stored values that are not its own fields as they are.
struct JobValues {
    data: String,
    state: &'static str,
    priority: i64,
    created: i64,
    next_run: i64,
    last_run: Option<i64>,
    scheduled_run: Option<i64>,
    lease_token: Option<String>,
    lease_expires: Option<i64>,
    lease_term_ms: Option<i64>,
}

impl JobValues {
    fn of(job: &Job) -> Result<Self, JobError> {
        let lease = job.lease.as_ref();
        Ok(JobValues {
            data: serde_json::to_string(&job.data).map_err(|e| JobError::Store(e.to_string()))?,
            state: job.state.as_str(),
            priority: job.priority.value(),
            created: job.created.0,
            next_run: job.next_run.0,
            last_run: job.last_run.map(|t| t.0),
            scheduled_run: job.scheduled_run.map(|t| t.0),
            lease_token: lease.map(|l| l.token.clone()),
            lease_expires: lease.and_then(|l| l.expires).map(|t| t.0),
            lease_term_ms: lease.and_then(|l| l.term_ms),
        })
    }

    /// The 16 columns after `job_id`, in [`COLUMNS`]' order.
    fn params<'a>(&'a self, job: &'a Job) -> Vec<&'a (dyn ToSql + Sync)> {
        vec![
            &job.name,
            &self.state,
            &self.data,
            &self.priority,
            &self.created,
            &self.next_run,
            &self.last_run,
            &job.repeat,
            &job.retry_after,
            &job.parent_id,
            &self.scheduled_run,
            &self.lease_token,
            &self.lease_expires,
            &self.lease_term_ms,
            &job.attempts,
            &job.lapses,
        ]
    }
}

/// A job read to be changed: its parent's row locked first, if it is a
/// child (see the module's doc; a job's parent never changes, so reading it
/// unlocked is safe), then its own, in one statement. The parent's lock is
/// taken by a sub-select that depends on no row of the outer one, which
/// PostgreSQL runs once, as a one-time filter, before the outer scan reads
/// (and locks) the job's row.
static LOCK_PARENT_THEN_JOB: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {COLUMNS} FROM jobs WHERE job_id = $1 AND ( \
           SELECT count(*) FROM ( \
             SELECT 1 FROM jobs parent WHERE parent.job_id != 0 AND parent.job_id = ( \
               SELECT child.parent_id FROM jobs child WHERE child.job_id = $1) \
             FOR UPDATE) parent_locked) >= 0 \
         FOR UPDATE"
    )
});

impl PgTx<'_> {
    /// The job with this id, read with `lock` (a locking clause, or "").
    fn select_job(&mut self, id: JobId, lock: &str) -> Result<Option<Job>, JobError> {
        let sql = format!("SELECT {COLUMNS} FROM jobs WHERE job_id = $1{lock}");
        self.query_opt(&sql, &[&id])?
            .as_ref()
            .map(read_job)
            .transpose()
    }
}

impl StoreTx for PgTx<'_> {
    fn insert(&mut self, job: &Job) -> Result<JobId, JobError> {
        self.childless.remove(&job.parent_id);
        let values = JobValues::of(job)?;
        let row = self.query_opt(
            "INSERT INTO jobs (name, state, data, priority, created, next_run, last_run, repeat, \
             retry_after, parent_id, scheduled_run, lease_token, lease_expires, lease_term_ms, \
             attempts, lapses) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
             RETURNING job_id",
            &values.params(job),
        )?;
        row.ok_or_else(|| JobError::Store("the insert returned no id".into()))?
            .try_get(0)
            .map_err(|e| corrupt("job id", e))
    }

    fn get(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        if !self.locking {
            return self.select_job(id, "");
        }
        // The parent's row, then the job's, in one round trip (see
        // [`LOCK_PARENT_THEN_JOB`]).
        self.query_opt(&LOCK_PARENT_THEN_JOB, &[&id])?
            .as_ref()
            .map(read_job)
            .transpose()
    }

    fn peek(&mut self, id: JobId) -> Result<Option<Job>, JobError> {
        self.select_job(id, "")
    }

    fn update(&mut self, job: &Job) -> Result<(), JobError> {
        self.childless.remove(&job.parent_id);
        let values = JobValues::of(job)?;
        let mut params = values.params(job);
        params.push(&job.id);
        self.execute(
            "UPDATE jobs SET name = $1, state = $2, data = $3, priority = $4, created = $5, \
             next_run = $6, last_run = $7, repeat = $8, retry_after = $9, parent_id = $10, \
             scheduled_run = $11, lease_token = $12, lease_expires = $13, lease_term_ms = $14, \
             attempts = $15, lapses = $16, held_back_by = NULL WHERE job_id = $17",
            &params,
        )?;
        Ok(())
    }

    fn delete(&mut self, id: JobId) -> Result<(), JobError> {
        // One round trip for the job and what hangs on it.
        self.execute(
            "WITH before AS (DELETE FROM jobs_before_handout WHERE job_id = $1), \
             tags AS (DELETE FROM job_tags WHERE job_id = $1), \
             waits AS (DELETE FROM job_dependencies WHERE job_id = $1) \
             DELETE FROM jobs WHERE job_id = $1",
            &[&id],
        )?;
        Ok(())
    }

    fn keep_before_handout(&mut self, id: JobId, token: &str) -> Result<(), JobError> {
        let updates = COLUMNS
            .split(", ")
            .filter(|c| *c != "job_id")
            .map(|c| format!("{c} = excluded.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO jobs_before_handout (handout_token, {COLUMNS}) \
             SELECT $2, {COLUMNS} FROM jobs WHERE job_id = $1 \
             ON CONFLICT (job_id) DO UPDATE SET handout_token = excluded.handout_token, {updates}"
        );
        self.execute(&sql, &[&id, &token])?;
        Ok(())
    }

    fn take_before_handout(&mut self, id: JobId, token: &str) -> Result<Option<Job>, JobError> {
        let sql = format!(
            "DELETE FROM jobs_before_handout WHERE job_id = $1 AND handout_token = $2 \
             RETURNING {COLUMNS}"
        );
        self.query_opt(&sql, &[&id, &token])?
            .as_ref()
            .map(read_job)
            .transpose()
    }

    fn find_by_name(&mut self, name: &str) -> Result<Option<Job>, JobError> {
        if self.locking {
            // Two servers creating the same unique job take turns: the
            // second finds the first's job instead of making another.
            self.query(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 1))",
                &[&name],
            )?;
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE name = $1 ORDER BY job_id LIMIT 1{}",
            self.lock_clause()
        );
        self.query_opt(&sql, &[&name])?
            .as_ref()
            .map(read_job)
            .transpose()
    }

    fn ready(
        &mut self,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Job>, JobError> {
        // One query per priority, each an index range on (priority,
        // next_run), so that jobs scheduled for later are never stepped
        // over; rows another server is claiming are skipped. The rows'
        // sizes (names and data as stored) are summed by the database,
        // which sends no row past the first that goes over `max_bytes`:
        // a claim of many big jobs never reads them all. (Rows left out
        // stay locked until the claim commits; other servers skip them
        // meanwhile, as they skip every row this claim locked.)
        let mut params = Params::default();
        let priority_mark = params.push(0i64);
        let now_mark = params.push(now.0);
        let limit_mark = params.push(0i64);
        let bytes_mark = params.push(0i64);
        let name = name_condition(pattern, &mut params);
        let lock = if self.locking {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let sql = format!(
            "WITH locked AS ( \
               SELECT job_id, next_run, octet_length(name) + octet_length(data) AS size FROM jobs \
               WHERE {READY} AND held_back_by IS NULL AND priority = {priority_mark} \
               AND next_run <= {now_mark} AND {name} ORDER BY next_run, job_id LIMIT {limit_mark}{lock}), \
             sized AS (SELECT job_id, size, SUM(size) OVER (ORDER BY next_run, job_id) AS running \
               FROM locked) \
             SELECT {COLUMNS}, size::bigint FROM jobs JOIN sized USING (job_id) \
             WHERE running - size < {bytes_mark}::bigint ORDER BY running"
        );
        let priorities: Vec<i64> = match priority {
            Some(p) => vec![p.value()],
            None => Priority::ALL.to_vec(),
        };
        let mut found = Vec::new();
        let mut bytes = ByteCount::new(max_bytes);
        for p in priorities {
            let wanted = sql_limit(limit - found.len());
            if wanted == 0 || bytes.full() {
                break;
            }
            let left = sql_limit(bytes.left());
            let mut refs = params.refs();
            refs[0] = &p;
            refs[2] = &wanted;
            refs[3] = &left;
            let rows = self.query(&sql, &refs)?;
            let taken = read_within(rows, &mut bytes, found.len())?;
            found.extend(taken);
        }
        Ok(found)
    }

    fn children(&mut self, parent: JobId) -> Result<Vec<Job>, JobError> {
        // Not locked: a claim holds the child it takes while it reads the
        // parent's data, and a sibling's report holds the parent while it
        // reads the children; locking both ways round would deadlock. What
        // a parent's rule decides from its children (none left to run)
        // changes only through reports, cancels and deletes of children,
        // which lock the parent first ([`PgTx::get`]). A job found without
        // children is not looked up again in the same operation, unless it
        // inserts or updates a child.
        if self.childless.contains(&parent) {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE parent_id != 0 AND parent_id = $1 ORDER BY job_id"
        );
        let children = read_jobs(self.query(&sql, &[&parent])?)?;
        if children.is_empty() {
            self.childless.insert(parent);
        }
        Ok(children)
    }

    fn expired_leases(&mut self, now: Timestamp, limit: usize) -> Result<Vec<Job>, JobError> {
        let lock = if self.locking {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE state = 'RUNNING' AND lease_expires IS NOT NULL \
             AND lease_expires <= $1 ORDER BY lease_expires LIMIT $2{lock}"
        );
        read_jobs(self.query(&sql, &[&now.0, &sql_limit(limit)])?)
    }

    fn unleased_running(
        &mut self,
        handed_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<Job>, JobError> {
        let lock = if self.locking {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE state = 'RUNNING' AND lease_expires IS NULL \
             AND last_run IS NOT NULL AND last_run <= $1 ORDER BY last_run LIMIT $2{lock}"
        );
        read_jobs(self.query(&sql, &[&handed_out_by.0, &sql_limit(limit)])?)
    }

    fn due_between(
        &mut self,
        after: Timestamp,
        upto: Timestamp,
        limit: usize,
    ) -> Result<Vec<(JobId, String, Priority)>, JobError> {
        let rows = self.query(
            "SELECT job_id, name, priority FROM jobs WHERE state IN ('QUEUED', 'RUNQUEUED') \
             AND next_run > $1 AND next_run <= $2 ORDER BY next_run LIMIT $3",
            &[&after.0, &upto.0, &sql_limit(limit)],
        )?;
        rows.iter()
            .map(|row| {
                let get_err = |e: postgres::Error| corrupt("job", e);
                let priority = Priority::new(row.try_get(2).map_err(get_err)?)
                    .map_err(|e| corrupt("priority", e))?;
                Ok((
                    row.try_get(0).map_err(get_err)?,
                    row.try_get(1).map_err(get_err)?,
                    priority,
                ))
            })
            .collect()
    }

    fn next_wakeup(&mut self, now: Timestamp) -> Result<Option<Timestamp>, JobError> {
        let row = self.query_opt(
            "SELECT LEAST( \
               (SELECT MIN(next_run) FROM jobs WHERE state IN ('QUEUED', 'RUNQUEUED') AND next_run > $1), \
               (SELECT MIN(lease_expires) FROM jobs WHERE state = 'RUNNING' AND lease_expires IS NOT NULL))",
            &[&now.0],
        )?;
        let next: Option<i64> = match row {
            Some(row) => row.try_get(0).map_err(|e| corrupt("time", e))?,
            None => None,
        };
        Ok(next.map(Timestamp))
    }

    fn list(&mut self, query: &ListQuery) -> Result<Page, JobError> {
        let mut params = Params::default();
        let after = params.push(query.after_id.unwrap_or(0));
        let limit = params.push(sql_limit(query.limit.max(1)));
        let max_bytes = params.push(sql_limit(query.max_bytes));
        let mut filter = String::new();
        if let Some(pattern) = &query.pattern {
            filter.push_str(&name_condition(pattern, &mut params));
            filter.push_str(" AND ");
        }
        if let Some(state) = query.state {
            let mark = params.push(state.as_str().to_string());
            filter.push_str(&format!("state = {mark} AND "));
        }
        // With a tag, the tag's rows (in id order on the primary key) are
        // joined to their jobs.
        let from = match &query.tag {
            Some(tag) => {
                let mark = params.push(tag.clone());
                filter.push_str(&format!("tag = {mark} AND "));
                "job_tags JOIN jobs USING (job_id)"
            }
            None => "jobs",
        };
        // The page's bytes (names and data as stored) are counted by the
        // database, which sends no row past the first that goes over
        // `max_bytes`: a page of big jobs is never read whole into memory.
        let sql = format!(
            "SELECT {COLUMNS}, running FROM ( \
               SELECT {COLUMNS}, octet_length(name) + octet_length(data) AS size, \
                 SUM(octet_length(name) + octet_length(data)) OVER (ORDER BY job_id) AS running \
               FROM {from} WHERE {filter}job_id > {after} ORDER BY job_id LIMIT {limit}) page \
             WHERE {max_bytes}::bigint = 0 OR running - size <= {max_bytes}::bigint ORDER BY job_id"
        );
        let rows = self.query(&sql, &params.refs())?;
        let mut page = Page::default();
        for row in &rows {
            let running: i64 = row
                .try_get::<_, Option<i64>>(17)
                .map_err(|e| corrupt("size", e))?
                .unwrap_or(0);
            if query.max_bytes > 0 && running > sql_limit(query.max_bytes) && !page.jobs.is_empty()
            {
                page.cut = true;
                break;
            }
            page.jobs.push(read_job(row)?);
        }
        Ok(page)
    }

    fn idempotent_answer(
        &mut self,
        key: &str,
        since: Timestamp,
    ) -> Result<Option<(String, Vec<JobId>)>, JobError> {
        if self.locking {
            // Two servers given one key take turns: the second finds the
            // first's answer.
            self.query(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 2))",
                &[&key],
            )?;
        }
        let row = self.query_opt(
            "SELECT fingerprint, job_ids FROM idempotency_keys WHERE key = $1 AND created >= $2",
            &[&key, &since.0],
        )?;
        let Some(row) = row else {
            return Ok(None);
        };
        let fingerprint: String = row.try_get(0).map_err(|e| corrupt("key", e))?;
        let ids: String = row.try_get(1).map_err(|e| corrupt("key", e))?;
        let ids: Vec<JobId> = serde_json::from_str(&ids).map_err(|e| corrupt("key", e))?;
        Ok(Some((fingerprint, ids)))
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
        self.execute(
            "INSERT INTO idempotency_keys (key, fingerprint, job_ids, created) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO UPDATE SET \
             fingerprint = excluded.fingerprint, job_ids = excluded.job_ids, created = excluded.created",
            &[&key, &fingerprint, &ids, &now.0],
        )?;
        self.execute(
            "DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys \
             WHERE created < $1 ORDER BY created LIMIT 100)",
            &[&expired_before.0],
        )?;
        Ok(())
    }

    fn count_by_name(&mut self) -> Result<Vec<(String, JobState, u64)>, JobError> {
        let rows = self.query(
            "SELECT name, state, COUNT(*) FROM jobs GROUP BY name, state",
            &[],
        )?;
        rows.iter()
            .map(|row| {
                let get_err = |e: postgres::Error| corrupt("count", e);
                let state: String = row.try_get(1).map_err(get_err)?;
                let state = state.parse::<JobState>().map_err(|e| corrupt("state", e))?;
                let count: i64 = row.try_get(2).map_err(get_err)?;
                Ok((row.try_get(0).map_err(get_err)?, state, count.max(0) as u64))
            })
            .collect()
    }

    fn ledger(&mut self) -> &mut dyn crate::server::store::LedgerTx {
        self
    }

    fn labels(&mut self) -> &mut dyn crate::server::store::LabelTx {
        self
    }

    fn throttles(&mut self) -> &mut dyn crate::server::store::ThrottleTx {
        self
    }

    fn depends(&mut self) -> &mut dyn crate::server::store::DependencyTx {
        self
    }

    fn sessions(&mut self) -> &mut dyn crate::server::store::SessionTx {
        self
    }

    fn announce(
        &mut self,
        ready: &[ReadyJob],
        lease_expiry: Option<Timestamp>,
        freed: &[String],
    ) -> Result<(), JobError> {
        if ready.is_empty() && lease_expiry.is_none() && freed.is_empty() {
            return Ok(());
        }
        let payload = notify::encode(self.origin, ready, lease_expiry, freed);
        self.query("SELECT pg_notify($1, $2)", &[&notify::CHANNEL, &payload])?;
        Ok(())
    }
}
