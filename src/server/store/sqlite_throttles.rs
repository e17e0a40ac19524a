//! Throttles and parked jobs in the SQLite store: [`ThrottleTx`] for
//! [`SqliteTx`]. One writer runs every write transaction, so locking a
//! throttle is reading it.

use rusqlite::types::Value;
use rusqlite::{params, params_from_iter};

use super::listing::{WILDCARDS, after_prefix};
use super::sqlite::{COLUMNS, FailingTx, SqliteTx, read_job, store_error, stored_size};
use super::throttles::{Throttle, ThrottleTx, held_condition};
use super::{ByteCount, Take};
use crate::protocol::{Job, JobError, JobId, NamePattern, Priority, Timestamp};

fn read_throttles(
    tx: &SqliteTx<'_>,
    sql: &str,
    params: &[Value],
) -> Result<Vec<Throttle>, JobError> {
    let mut statement = tx.conn.prepare_cached(sql).map_err(store_error)?;
    let rows = statement
        .query_map(params_from_iter(params), |row| {
            Ok(Throttle {
                glob: row.get(0)?,
                max: row.get(1)?,
            })
        })
        .map_err(store_error)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
}

/// `name GLOB ?` for `glob` (a parameter appended), with the range of its
/// literal prefix spelled out: the writer plans its statements without
/// looking at the values bound to them (see `sqlite::set_up_writer`), so
/// SQLite would not find that range in the name's indexes by itself.
fn glob_in_range(glob: &str, params: &mut Vec<Value>) -> String {
    params.push(Value::Text(glob.to_string()));
    let mut clause = format!("name GLOB ?{}", params.len());
    let prefix = glob.split(WILDCARDS).next().unwrap_or_default();
    if !prefix.is_empty() {
        params.push(Value::Text(prefix.to_string()));
        clause = format!("name >= ?{} AND {clause}", params.len());
        if let Some(end) = after_prefix(prefix) {
            params.push(Value::Text(end));
            clause = format!("name < ?{} AND {clause}", params.len());
        }
    }
    clause
}

/// Counts the jobs matching `glob` that hold a throttle's slot at `now`,
/// from the held jobs' index (the range of the GLOB's prefix, if it has one).
pub(super) fn held_matching_sql(glob: &str, now: Timestamp) -> (String, Vec<Value>) {
    let mut params = vec![Value::Integer(now.0)];
    let names = glob_in_range(glob, &mut params);
    let sql = format!(
        "SELECT COUNT(*) FROM jobs INDEXED BY jobs_held WHERE {} AND {names}",
        held_condition("?1")
    );
    (sql, params)
}

/// Parks the ready jobs matching `glob` behind it: a prefix reads its range
/// of the name index; a GLOB that starts with a wildcard, every ready job.
pub(super) fn park_matching_sql(glob: &str) -> (String, Vec<Value>) {
    let mut params = Vec::new();
    let names = glob_in_range(glob, &mut params);
    // Without statistics SQLite would take the state's index, every ready
    // job, over the prefix's range.
    let index = if params.len() > 1 {
        "INDEXED BY jobs_name"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE jobs {index} SET held_back_by = ?1 WHERE state IN ('QUEUED', 'RUNQUEUED') \
         AND held_back_by IS NULL AND {names}"
    );
    (sql, params)
}

/// Counts up to `limit` due jobs matching `pattern` (and `priority`) that
/// `glob` holds back: parked behind it, or (`parked` false) matching it
/// and not parked at all, read from the prefix's range of the name index
/// (as [`park_matching_sql`] reads it).
pub(super) fn held_back_sql(
    glob: &str,
    pattern: &NamePattern,
    priority: Option<Priority>,
    now: Timestamp,
    limit: usize,
    parked: bool,
) -> Result<(String, Vec<Value>), JobError> {
    let mut params = vec![
        Value::Integer(now.0),
        Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
    ];
    let (index, held_back) = if parked {
        params.push(Value::Text(glob.to_string()));
        ("", format!("held_back_by = ?{}", params.len()))
    } else {
        let names = glob_in_range(glob, &mut params);
        let index = if params.len() > 3 {
            "INDEXED BY jobs_name"
        } else {
            ""
        };
        (index, format!("held_back_by IS NULL AND {names}"))
    };
    let wanted = name_clause(pattern, &mut params)?;
    let priority = match priority {
        Some(p) => {
            params.push(Value::Integer(p.value()));
            format!(" AND priority = ?{}", params.len())
        }
        None => String::new(),
    };
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM jobs {index} WHERE {held_back} \
         AND state IN ('QUEUED', 'RUNQUEUED') AND next_run <= ?1 AND {wanted}{priority} LIMIT ?2)"
    );
    Ok((sql, params))
}

/// The condition that `pattern` makes on `name`, its parameters appended.
fn name_clause(pattern: &NamePattern, params: &mut Vec<Value>) -> Result<String, JobError> {
    Ok(match pattern {
        NamePattern::Glob(glob) => {
            params.push(Value::Text(glob.clone()));
            format!("name GLOB ?{}", params.len())
        }
        NamePattern::List(names) => {
            params.push(Value::Text(
                serde_json::to_string(names).map_err(|e| JobError::Store(e.to_string()))?,
            ));
            format!("name IN (SELECT value FROM json_each(?{}))", params.len())
        }
    })
}

impl ThrottleTx for SqliteTx<'_> {
    fn list_throttles(&mut self) -> Result<Vec<Throttle>, JobError> {
        read_throttles(self, "SELECT glob, max FROM throttles ORDER BY glob", &[])
    }

    fn lock_throttles(&mut self, globs: &[String]) -> Result<Vec<Throttle>, JobError> {
        let list = serde_json::to_string(globs).map_err(|e| JobError::Store(e.to_string()))?;
        read_throttles(
            self,
            "SELECT glob, max FROM throttles WHERE glob IN (SELECT value FROM json_each(?1)) \
             ORDER BY glob",
            &[Value::Text(list)],
        )
    }

    fn held_matching(&mut self, glob: &str, now: Timestamp) -> Result<u64, JobError> {
        let (sql, params) = held_matching_sql(glob, now);
        let count: i64 = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.query_row(params_from_iter(&params), |row| row.get(0)))
            .map_err(store_error)?;
        Ok(count.max(0) as u64)
    }

    fn set_throttle(&mut self, glob: &str, max: i64) -> Result<(), JobError> {
        self.conn
            .prepare_cached(
                "INSERT INTO throttles (glob, max) VALUES (?1, ?2) \
                 ON CONFLICT (glob) DO UPDATE SET max = excluded.max",
            )
            .and_then(|mut s| s.execute(params![glob, max]))
            .map_err(store_error)?;
        Ok(())
    }

    fn delete_throttle(&mut self, glob: &str) -> Result<bool, JobError> {
        let removed = self
            .conn
            .prepare_cached("DELETE FROM throttles WHERE glob = ?1")
            .and_then(|mut s| s.execute([glob]))
            .map_err(store_error)?;
        Ok(removed > 0)
    }

    fn count_throttles(&mut self) -> Result<usize, JobError> {
        let count: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM throttles")
            .and_then(|mut s| s.query_row([], |row| row.get(0)))
            .map_err(store_error)?;
        Ok(count.max(0) as usize)
    }

    fn park_job(&mut self, id: JobId, glob: &str) -> Result<(), JobError> {
        self.conn
            .prepare_cached("UPDATE jobs SET held_back_by = ?2 WHERE job_id = ?1")
            .and_then(|mut s| s.execute(params![id, glob]))
            .map_err(store_error)?;
        Ok(())
    }

    fn park_matching(&mut self, glob: &str) -> Result<u64, JobError> {
        let (sql, params) = park_matching_sql(glob);
        let parked = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.execute(params_from_iter(&params)))
            .map_err(store_error)?;
        Ok(parked as u64)
    }

    fn parked_jobs(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        take: Take,
        _lock: bool,
    ) -> Result<Vec<Job>, JobError> {
        let mut params = vec![
            Value::Text(glob.to_string()),
            Value::Integer(now.0),
            Value::Integer(i64::try_from(take.jobs).unwrap_or(i64::MAX)),
        ];
        let name = name_clause(pattern, &mut params)?;
        let priority = match priority {
            Some(p) => {
                params.push(Value::Integer(p.value()));
                format!(" AND priority = ?{}", params.len())
            }
            None => String::new(),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE held_back_by = ?1 AND state IN ('QUEUED', 'RUNQUEUED') \
             AND next_run <= ?2 AND {name}{priority} \
             ORDER BY priority DESC, next_run, job_id LIMIT ?3"
        );
        let mut statement = self.conn.prepare_cached(&sql).map_err(store_error)?;
        let mut rows = statement
            .query(params_from_iter(params))
            .map_err(store_error)?;
        let mut found = Vec::new();
        let mut bytes = ByteCount::new(take.bytes);
        while let Some(row) = rows.next().map_err(store_error)? {
            if !bytes.admit(stored_size(row), found.is_empty()) {
                break;
            }
            found.push(read_job(row).map_err(store_error)?);
        }
        Ok(found)
    }

    fn count_held_back(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, JobError> {
        let mut found = 0;
        for parked in [true, false] {
            let left = limit - found;
            if left == 0 {
                break;
            }
            let (sql, params) = held_back_sql(glob, pattern, priority, now, left, parked)?;
            let count: i64 = self
                .conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_row(params_from_iter(&params), |row| row.get(0)))
                .map_err(store_error)?;
            found += usize::try_from(count).unwrap_or(0);
        }
        Ok(found.min(limit))
    }

    fn release_parked(&mut self, glob: &str) -> Result<(), JobError> {
        self.conn
            .prepare_cached("UPDATE jobs SET held_back_by = NULL WHERE held_back_by = ?1")
            .and_then(|mut s| s.execute([glob]))
            .map_err(store_error)?;
        Ok(())
    }
}

impl ThrottleTx for FailingTx {
    fn list_throttles(&mut self) -> Result<Vec<Throttle>, JobError> {
        Err(self.0.clone())
    }
    fn lock_throttles(&mut self, _: &[String]) -> Result<Vec<Throttle>, JobError> {
        Err(self.0.clone())
    }
    fn held_matching(&mut self, _: &str, _: Timestamp) -> Result<u64, JobError> {
        Err(self.0.clone())
    }
    fn set_throttle(&mut self, _: &str, _: i64) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn delete_throttle(&mut self, _: &str) -> Result<bool, JobError> {
        Err(self.0.clone())
    }
    fn count_throttles(&mut self) -> Result<usize, JobError> {
        Err(self.0.clone())
    }
    fn park_job(&mut self, _: JobId, _: &str) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn park_matching(&mut self, _: &str) -> Result<u64, JobError> {
        Err(self.0.clone())
    }
    fn parked_jobs(
        &mut self,
        _: &str,
        _: &NamePattern,
        _: Option<Priority>,
        _: Timestamp,
        _: Take,
        _: bool,
    ) -> Result<Vec<Job>, JobError> {
        Err(self.0.clone())
    }
    fn count_held_back(
        &mut self,
        _: &str,
        _: &NamePattern,
        _: Option<Priority>,
        _: Timestamp,
        _: usize,
    ) -> Result<usize, JobError> {
        Err(self.0.clone())
    }
    fn release_parked(&mut self, _: &str) -> Result<(), JobError> {
        Err(self.0.clone())
    }
}
