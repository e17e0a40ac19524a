//! Tags and tracked jobs in PostgreSQL: [`LabelTx`] for [`PgTx`], the same
//! rows and meaning as SQLite's. A change of a job's tags or tracking is
//! made after the rule read the job for update, so changes of one job take
//! turns across servers.

use super::{PgTx, corrupt};
use crate::protocol::{JobError, JobId, Labels};
use crate::server::store::LabelTx;

/// A row count as SQL's `LIMIT` takes it.
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl LabelTx for PgTx<'_> {
    fn of(&mut self, ids: &[JobId]) -> Result<Vec<Labels>, JobError> {
        let mut out = vec![Labels::default(); ids.len()];
        if ids.is_empty() {
            return Ok(out);
        }
        let list: Vec<i64> = ids.to_vec();
        let get_err = |e: postgres::Error| corrupt("tag", e);
        let rows = self.query(
            "SELECT job_id, tag FROM job_tags WHERE job_id = ANY($1) ORDER BY job_id, tag",
            &[&list],
        )?;
        for row in &rows {
            let id: i64 = row.try_get(0).map_err(get_err)?;
            let tag: String = row.try_get(1).map_err(get_err)?;
            for (at, _) in ids.iter().enumerate().filter(|(_, i)| **i == id) {
                out[at].tags.push(tag.clone());
            }
        }
        let rows = self.query(
            "SELECT job_id FROM tracked_jobs WHERE job_id = ANY($1)",
            &[&list],
        )?;
        for row in &rows {
            let id: i64 = row.try_get(0).map_err(get_err)?;
            for (at, _) in ids.iter().enumerate().filter(|(_, i)| **i == id) {
                out[at].tracked = true;
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
        if !add.is_empty() {
            self.execute(
                "INSERT INTO job_tags (tag, job_id) SELECT tag, $2 FROM unnest($1::text[]) AS tag \
                 ON CONFLICT DO NOTHING",
                &[&add, &id],
            )?;
        }
        if !remove.is_empty() {
            self.execute(
                "DELETE FROM job_tags WHERE job_id = $2 AND tag = ANY($1)",
                &[&remove, &id],
            )?;
        }
        Ok(())
    }

    fn set_tracked(&mut self, id: JobId, tracked: bool, since: i64) -> Result<bool, JobError> {
        let changed = if tracked {
            self.execute(
                "INSERT INTO tracked_jobs (job_id, since) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&id, &since],
            )?
        } else {
            self.execute("DELETE FROM tracked_jobs WHERE job_id = $1", &[&id])?
        };
        Ok(changed > 0)
    }

    fn tracked(&mut self, after: JobId, limit: usize) -> Result<Vec<JobId>, JobError> {
        let rows = self.query(
            "SELECT job_id FROM tracked_jobs WHERE job_id > $1 ORDER BY job_id LIMIT $2",
            &[&after, &sql_limit(limit)],
        )?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(|e| corrupt("tracked job", e)))
            .collect()
    }

    fn top_tags(&mut self, limit: usize) -> Result<Vec<(String, u64)>, JobError> {
        let rows = self.query(
            "SELECT tag, COUNT(*) AS jobs FROM job_tags GROUP BY tag \
             ORDER BY jobs DESC, tag LIMIT $1",
            &[&sql_limit(limit)],
        )?;
        rows.iter()
            .map(|row| {
                let get_err = |e: postgres::Error| corrupt("tag count", e);
                let count: i64 = row.try_get(1).map_err(get_err)?;
                Ok((row.try_get(0).map_err(get_err)?, count.max(0) as u64))
            })
            .collect()
    }
}
