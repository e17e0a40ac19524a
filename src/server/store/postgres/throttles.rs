//! Throttles and parked jobs in PostgreSQL: [`ThrottleTx`] for [`PgTx`].
//! A claim locks the rows of the throttles it may count against
//! (`FOR UPDATE`, in GLOB order, before it reads any job), so that two
//! servers never both count a free slot and both take it: the second
//! counts only after the first has committed. Parked jobs another server
//! is claiming are skipped, as ready ones are.

use postgres::types::ToSql;

use super::glob::{Params, name_condition};
use super::jobs::{COLUMNS, read_within, sql_limit};
use super::{PgTx, corrupt};
use crate::protocol::{Job, JobError, JobId, NamePattern, Priority, Timestamp};
use crate::server::store::throttles::{Throttle, ThrottleTx, held_condition};
use crate::server::store::{ByteCount, Take};

fn read_throttles(rows: &[postgres::Row]) -> Result<Vec<Throttle>, JobError> {
    rows.iter()
        .map(|row| {
            Ok(Throttle {
                glob: row.try_get(0).map_err(|e| corrupt("throttle", e))?,
                max: row.try_get(1).map_err(|e| corrupt("throttle", e))?,
            })
        })
        .collect()
}

impl ThrottleTx for PgTx<'_> {
    fn list_throttles(&mut self) -> Result<Vec<Throttle>, JobError> {
        // Read once per transaction (every write operation looks at them):
        // another server's change committed meanwhile is seen by the next
        // transaction, as if this one had run just before it.
        if let Some(throttles) = &self.throttles {
            return Ok(throttles.clone());
        }
        let rows = self.query("SELECT glob, max FROM throttles ORDER BY glob", &[])?;
        let throttles = read_throttles(&rows)?;
        if self.locking {
            self.throttles = Some(throttles.clone());
        }
        Ok(throttles)
    }

    fn lock_throttles(&mut self, globs: &[String]) -> Result<Vec<Throttle>, JobError> {
        let sql = format!(
            "SELECT glob, max FROM throttles WHERE glob = ANY($1::text[]) ORDER BY glob{}",
            self.lock_clause()
        );
        let globs = globs.to_vec();
        let rows = self.query(&sql, &[&globs])?;
        read_throttles(&rows)
    }

    fn held_matching(&mut self, glob: &str, now: Timestamp) -> Result<u64, JobError> {
        let mut params = Params::default();
        let now_mark = params.push(now.0);
        let name = name_condition(&NamePattern::Glob(glob.to_string()), &mut params);
        let sql = format!(
            "SELECT COUNT(*) FROM jobs WHERE {} AND {name}",
            held_condition(&now_mark)
        );
        let row = self.query_opt(&sql, &params.refs())?;
        let count: i64 = match row {
            Some(row) => row.try_get(0).map_err(|e| corrupt("count", e))?,
            None => 0,
        };
        Ok(count.max(0) as u64)
    }

    fn set_throttle(&mut self, glob: &str, max: i64) -> Result<(), JobError> {
        self.throttles = None;
        self.execute(
            "INSERT INTO throttles (glob, max) VALUES ($1, $2) \
             ON CONFLICT (glob) DO UPDATE SET max = excluded.max",
            &[&glob, &max],
        )?;
        Ok(())
    }

    fn delete_throttle(&mut self, glob: &str) -> Result<bool, JobError> {
        self.throttles = None;
        Ok(self.execute("DELETE FROM throttles WHERE glob = $1", &[&glob])? > 0)
    }

    fn count_throttles(&mut self) -> Result<usize, JobError> {
        let row = self.query_opt("SELECT COUNT(*) FROM throttles", &[])?;
        let count: i64 = match row {
            Some(row) => row.try_get(0).map_err(|e| corrupt("count", e))?,
            None => 0,
        };
        Ok(count.max(0) as usize)
    }

    fn park_job(&mut self, id: JobId, glob: &str) -> Result<(), JobError> {
        self.execute(
            "UPDATE jobs SET held_back_by = $2 WHERE job_id = $1",
            &[&id, &glob],
        )?;
        Ok(())
    }

    fn park_matching(&mut self, glob: &str) -> Result<u64, JobError> {
        let mut params = Params::default();
        let glob_mark = params.push(glob.to_string());
        let name = name_condition(&NamePattern::Glob(glob.to_string()), &mut params);
        // Rows another server is claiming or writing are left: parking is
        // an optimisation, and a job left unparked is only looked at again.
        let sql = format!(
            "UPDATE jobs SET held_back_by = {glob_mark} WHERE job_id IN ( \
               SELECT job_id FROM jobs WHERE state IN ('QUEUED', 'RUNQUEUED') \
               AND held_back_by IS NULL AND {name} FOR UPDATE SKIP LOCKED)"
        );
        self.execute(&sql, &params.refs())
    }

    fn parked_jobs(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        take: Take,
        lock: bool,
    ) -> Result<Vec<Job>, JobError> {
        let mut params = Params::default();
        let glob_mark = params.push(glob.to_string());
        let now_mark = params.push(now.0);
        let limit_mark = params.push(sql_limit(take.jobs));
        let mut bytes = ByteCount::new(take.bytes);
        let bytes_mark = params.push(sql_limit(bytes.left()));
        let name = name_condition(pattern, &mut params);
        let priority = match priority {
            Some(p) => format!(" AND priority = {}", params.push(p.value())),
            None => String::new(),
        };
        let lock = if lock && self.locking {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        // Sized by the database, as `ready` is (see there).
        let sql = format!(
            "WITH locked AS ( \
               SELECT job_id, priority, next_run, octet_length(name) + octet_length(data) AS size \
               FROM jobs WHERE held_back_by = {glob_mark} \
               AND state IN ('QUEUED', 'RUNQUEUED') AND next_run <= {now_mark} AND {name}{priority} \
               ORDER BY priority DESC, next_run, job_id LIMIT {limit_mark}{lock}), \
             sized AS (SELECT job_id, size, \
               SUM(size) OVER (ORDER BY priority DESC, next_run, job_id) AS running FROM locked) \
             SELECT {COLUMNS}, size::bigint FROM jobs JOIN sized USING (job_id) \
             WHERE running - size < {bytes_mark}::bigint ORDER BY running"
        );
        read_within(self.query(&sql, &params.refs())?, &mut bytes, 0)
    }

    fn count_held_back(
        &mut self,
        glob: &str,
        pattern: &NamePattern,
        priority: Option<Priority>,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, JobError> {
        // Parked behind it, then not parked: claims on other servers run
        // beside this transaction, and one that held jobs back may not
        // have committed their parking (or skipped rows it found locked).
        let mut found = 0;
        for parked in [true, false] {
            let left = limit - found;
            if left == 0 {
                break;
            }
            let mut params = Params::default();
            let now_mark = params.push(now.0);
            let limit_mark = params.push(sql_limit(left));
            let held_back = if parked {
                format!("held_back_by = {}", params.push(glob.to_string()))
            } else {
                let throttled = NamePattern::Glob(glob.to_string());
                format!(
                    "held_back_by IS NULL AND {}",
                    name_condition(&throttled, &mut params)
                )
            };
            let wanted = name_condition(pattern, &mut params);
            let priority = match priority {
                Some(p) => format!(" AND priority = {}", params.push(p.value())),
                None => String::new(),
            };
            let sql = format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE {held_back} \
                 AND state IN ('QUEUED', 'RUNQUEUED') AND next_run <= {now_mark} \
                 AND {wanted}{priority} LIMIT {limit_mark}) AS held_back"
            );
            let count: i64 = match self.query_opt(&sql, &params.refs())? {
                Some(row) => row.try_get(0).map_err(|e| corrupt("count", e))?,
                None => 0,
            };
            found += usize::try_from(count).unwrap_or(0);
        }
        Ok(found.min(limit))
    }

    fn release_parked(&mut self, glob: &str) -> Result<(), JobError> {
        let params: [&(dyn ToSql + Sync); 1] = [&glob];
        self.execute(
            "UPDATE jobs SET held_back_by = NULL WHERE held_back_by = $1",
            &params,
        )?;
        Ok(())
    }
}
