//! The dependency rows in the SQLite store (schema version 7).

use rusqlite::params;

use super::dependencies::DependencyTx;
use super::sqlite::{SqliteTx, store_error};
use crate::protocol::{JobError, JobId};

impl SqliteTx<'_> {
    fn ids(&self, sql: &str, id: JobId) -> Result<Vec<JobId>, JobError> {
        let mut statement = self.conn.prepare_cached(sql).map_err(store_error)?;
        let rows = statement
            .query_map([id], |row| row.get(0))
            .map_err(store_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(store_error)
    }
}

impl DependencyTx for SqliteTx<'_> {
    fn add(&mut self, job: JobId, on: &[JobId]) -> Result<(), JobError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO job_dependencies (job_id, depends_on) VALUES (?1, ?2)",
            )
            .map_err(store_error)?;
        for dependency in on {
            statement
                .execute(params![job, dependency])
                .map_err(store_error)?;
        }
        Ok(())
    }

    fn remove(&mut self, job: JobId, on: &[JobId]) -> Result<usize, JobError> {
        let mut statement = self
            .conn
            .prepare_cached("DELETE FROM job_dependencies WHERE job_id = ?1 AND depends_on = ?2")
            .map_err(store_error)?;
        let mut removed = 0;
        for dependency in on {
            removed += statement
                .execute(params![job, dependency])
                .map_err(store_error)?;
        }
        Ok(removed)
    }

    fn outstanding(&mut self, job: JobId) -> Result<Vec<JobId>, JobError> {
        self.ids(
            "SELECT depends_on FROM job_dependencies WHERE job_id = ?1 ORDER BY depends_on",
            job,
        )
    }

    fn dependents(&mut self, job: JobId) -> Result<Vec<JobId>, JobError> {
        self.ids(
            "SELECT job_id FROM job_dependencies WHERE depends_on = ?1 ORDER BY job_id",
            job,
        )
    }
}
