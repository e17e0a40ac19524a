//! Tags and tracked jobs in SQLite: [`LabelTx`] for [`SqliteTx`] (and for
//! [`FailingTx`], which refuses).

use rusqlite::params;

use super::LabelTx;
use super::sqlite::{FailingTx, SqliteTx, store_error};
use crate::protocol::{JobError, JobId, Labels};

/// `ids` as the JSON array `json_each` reads.
fn id_list(ids: &[JobId]) -> Result<String, JobError> {
    serde_json::to_string(ids).map_err(|e| JobError::Store(e.to_string()))
}

impl LabelTx for SqliteTx<'_> {
    fn of(&mut self, ids: &[JobId]) -> Result<Vec<Labels>, JobError> {
        let mut out = vec![Labels::default(); ids.len()];
        if ids.is_empty() {
            return Ok(out);
        }
        let position = |id: JobId| ids.iter().position(|&i| i == id);
        let list = id_list(ids)?;
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT job_id, tag FROM job_tags \
                 WHERE job_id IN (SELECT value FROM json_each(?1)) ORDER BY job_id, tag",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map([&list], |row| Ok((row.get::<_, i64>(0)?, row.get(1)?)))
            .map_err(store_error)?;
        for row in rows {
            let (id, tag): (JobId, String) = row.map_err(store_error)?;
            if let Some(at) = position(id) {
                out[at].tags.push(tag);
            }
        }
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT job_id FROM tracked_jobs WHERE job_id IN (SELECT value FROM json_each(?1))",
            )
            .map_err(store_error)?;
        let rows = statement
            .query_map([&list], |row| row.get::<_, i64>(0))
            .map_err(store_error)?;
        for row in rows {
            if let Some(at) = position(row.map_err(store_error)?) {
                out[at].tracked = true;
            }
        }
        // A job listed twice gets its labels in each place.
        for (at, &id) in ids.iter().enumerate() {
            if let Some(first) = position(id).filter(|&first| first != at) {
                out[at] = out[first].clone();
            }
        }
        Ok(out)
    }

    fn change_tags(
        &mut self,
        id: JobId,
        add: &[String],
        remove: &[String],
    ) -> Result<(), JobError> {
        for tag in add {
            self.conn
                .prepare_cached("INSERT OR IGNORE INTO job_tags (tag, job_id) VALUES (?1, ?2)")
                .and_then(|mut statement| statement.execute(params![tag, id]))
                .map_err(store_error)?;
        }
        for tag in remove {
            self.conn
                .prepare_cached("DELETE FROM job_tags WHERE tag = ?1 AND job_id = ?2")
                .and_then(|mut statement| statement.execute(params![tag, id]))
                .map_err(store_error)?;
        }
        Ok(())
    }

    fn set_tracked(&mut self, id: JobId, tracked: bool, since: i64) -> Result<bool, JobError> {
        let changed = if tracked {
            self.conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO tracked_jobs (job_id, since) VALUES (?1, ?2)",
                )
                .and_then(|mut statement| statement.execute(params![id, since]))
        } else {
            self.conn
                .prepare_cached("DELETE FROM tracked_jobs WHERE job_id = ?1")
                .and_then(|mut statement| statement.execute([id]))
        }
        .map_err(store_error)?;
        Ok(changed > 0)
    }

    fn tracked(&mut self, after: JobId, limit: usize) -> Result<Vec<JobId>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT job_id FROM tracked_jobs WHERE job_id > ?1 ORDER BY job_id LIMIT ?2",
            )
            .map_err(store_error)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement
            .query_map(params![after, limit], |row| row.get(0))
            .map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }

    fn top_tags(&mut self, limit: usize) -> Result<Vec<(String, u64)>, JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT tag, COUNT(*) AS jobs FROM job_tags GROUP BY tag \
                 ORDER BY jobs DESC, tag LIMIT ?1",
            )
            .map_err(store_error)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement
            .query_map([limit], |row| {
                Ok((row.get(0)?, row.get::<_, i64>(1)?.max(0) as u64))
            })
            .map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }
}

impl LabelTx for FailingTx {
    fn of(&mut self, _: &[JobId]) -> Result<Vec<Labels>, JobError> {
        Err(self.0.clone())
    }
    fn change_tags(&mut self, _: JobId, _: &[String], _: &[String]) -> Result<(), JobError> {
        Err(self.0.clone())
    }
    fn set_tracked(&mut self, _: JobId, _: bool, _: i64) -> Result<bool, JobError> {
        Err(self.0.clone())
    }
    fn tracked(&mut self, _: JobId, _: usize) -> Result<Vec<JobId>, JobError> {
        Err(self.0.clone())
    }
    fn top_tags(&mut self, _: usize) -> Result<Vec<(String, u64)>, JobError> {
        Err(self.0.clone())
    }
}
