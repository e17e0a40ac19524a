//! Which jobs wait for which: the rows of `job_dependencies`, one per job
//! and a job it still waits for. A row goes when the job it names
//! finishes (or the dependent drops it, or is deleted); so a job has rows
//! exactly while it is DEPENDS, and the rows of a job it waited for that
//! failed or was deleted stay, to show why it waits.

use crate::protocol::{JobError, JobId};

/// Access to the dependency rows inside one store transaction (see
/// [`super::StoreTx::depends`]). Reads are not locked: the queue's rules
/// lock the jobs concerned first, lower ids before higher (a job only ever
/// depends on earlier jobs), as every server does.
pub trait DependencyTx {
    /// Records that `job` waits for each of `on`; a pair already recorded
    /// is kept once.
    fn add(&mut self, job: JobId, on: &[JobId]) -> Result<(), JobError>;
    /// Forgets that `job` waits for each of `on`; returns how many of them
    /// it waited for.
    fn remove(&mut self, job: JobId, on: &[JobId]) -> Result<usize, JobError>;
    /// The jobs `job` still waits for, in id order.
    fn outstanding(&mut self, job: JobId) -> Result<Vec<JobId>, JobError>;
    /// The jobs waiting for `job`, in id order.
    fn dependents(&mut self, job: JobId) -> Result<Vec<JobId>, JobError>;
}
