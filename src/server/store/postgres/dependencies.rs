//! The dependency rows in PostgreSQL: [`DependencyTx`] for [`PgTx`]
//! (schema version 2). Rows are read unlocked: the queue locks the jobs
//! they name first, in id order.

use super::{PgTx, corrupt};
use crate::protocol::{JobError, JobId};
use crate::server::store::DependencyTx;

impl PgTx<'_> {
    fn ids(&mut self, sql: &str, id: JobId) -> Result<Vec<JobId>, JobError> {
        self.query(sql, &[&id])?
            .iter()
            .map(|row| row.try_get(0).map_err(|e| corrupt("dependency", e)))
            .collect()
    }
}

impl DependencyTx for PgTx<'_> {
    fn add(&mut self, job: JobId, on: &[JobId]) -> Result<(), JobError> {
        for dependency in on {
            self.execute(
                "INSERT INTO job_dependencies (job_id, depends_on) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
                &[&job, dependency],
            )?;
        }
        Ok(())
    }

    fn remove(&mut self, job: JobId, on: &[JobId]) -> Result<usize, JobError> {
        let mut removed = 0;
        for dependency in on {
            removed += self.execute(
                "DELETE FROM job_dependencies WHERE job_id = $1 AND depends_on = $2",
                &[&job, dependency],
            )?;
        }
        Ok(removed as usize)
    }

    fn outstanding(&mut self, job: JobId) -> Result<Vec<JobId>, JobError> {
        self.ids(
            "SELECT depends_on FROM job_dependencies WHERE job_id = $1 ORDER BY depends_on",
            job,
        )
    }

    fn dependents(&mut self, job: JobId) -> Result<Vec<JobId>, JobError> {
        self.ids(
            "SELECT job_id FROM job_dependencies WHERE depends_on = $1 ORDER BY job_id",
            job,
        )
    }
}
