//! [`JobSource`] in-process, straight onto the embedded server's queue.

use std::time::Duration;

use super::source::{
    JobSource, LeasedJob, Report, SourceError, hand_back_by_retry, read_handouts, refuse_unreadable,
};
use crate::future::BoxFuture;
use crate::protocol::{
    CreateJob, Data, FailJob, FinishJob, GetJobs, JobError, JobId, LeaseTerm, NamePattern,
    RetryJob, RunFacts, UpdateJob, WorkerInfo,
};
use crate::server::queue::Queue;

/// The embedded server's queue.
#[derive(Clone)]
pub struct LocalSource {
    queue: Queue,
}

impl LocalSource {
    /// A source over `queue`.
    pub fn new(queue: Queue) -> Self {
        LocalSource { queue }
    }
}

fn source_error(error: JobError) -> SourceError {
    match error {
        JobError::LeaseLost(id) => SourceError::LeaseLost(id),
        JobError::Store(_)
        | JobError::StoreUnavailable(_)
        | JobError::StoreConflict(_)
        | JobError::StoreOutcomeUnknown
        | JobError::ServerBusy
        | JobError::ShuttingDown => SourceError::Unavailable(error.to_string()),
        JobError::NoSuchJob => SourceError::NotFound(error.status_line()),
        other => SourceError::Refused(other.status_line()),
    }
}

impl LocalSource {
    async fn fetch(
        &self,
        pattern: &str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: Option<WorkerInfo>,
    ) -> Result<Vec<LeasedJob>, SourceError> {
        let pattern = NamePattern::parse(pattern).map_err(source_error)?;
        let cmd = GetJobs {
            pattern,
            num_results: count.max(1),
            priority: None,
            lease: LeaseTerm::Millis(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)),
            worker,
        };
        let wait = (!wait.is_zero()).then_some(wait);
        let handouts = self.queue.get_jobs(cmd, wait).await.map_err(source_error)?;
        let (jobs, unreadable) = read_handouts(
            handouts
                .into_iter()
                .map(|h| serde_json::Value::Object(h.leased_json())),
        );
        // In a task of its own: this fetch may be cancelled once it returns
        // (see `fetch_is_cancel_safe`), so it has no await left after the
        // claim.
        if !unreadable.is_empty() {
            let source = self.clone();
            tokio::spawn(async move { refuse_unreadable(&source, unreadable).await });
        }
        Ok(jobs)
    }
}

impl JobSource for LocalSource {
    fn get_jobs<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.fetch(pattern, count, wait, lease, None))
    }

    fn get_jobs_as<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: &'a WorkerInfo,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.fetch(pattern, count, wait, lease, Some(worker.clone())))
    }

    fn announce<'a>(&'a self, worker: &'a WorkerInfo) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.queue
                .see_worker(worker.clone())
                .await
                .map_err(source_error)
        })
    }

    fn heartbeat<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return Ok(());
            };
            self.queue
                .heartbeat(job.id, lease.clone())
                .await
                .map(|_| ())
                .map_err(source_error)
        })
    }

    fn hands_back_exactly(&self) -> bool {
        true
    }

    fn hand_back<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return hand_back_by_retry(self, job).await;
            };
            match self.queue.hand_back(job.id, lease.clone()).await {
                Err(JobError::HandOutNotKept(_)) => hand_back_by_retry(self, job).await,
                other => other.map_err(source_error),
            }
        })
    }

    fn update<'a>(
        &'a self,
        job: &'a LeasedJob,
        data: &'a Data,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let cmd = UpdateJob {
                id: job.id,
                data: data.clone(),
                repeat: None,
                clear_repeat: false,
                priority: None,
                next_run: None,
                lease: job.lease.clone(),
            };
            self.queue.update(cmd).await.map_err(source_error)
        })
    }

    fn report<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        self.report_run(id, lease, report, None)
    }

    fn report_run<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
        run: Option<&'a RunFacts>,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let lease = lease.map(str::to_string);
            let result = match report {
                Report::Finish { data } => {
                    self.queue
                        .finish(FinishJob {
                            id,
                            data: data.clone(),
                            lease,
                            run: run.cloned(),
                        })
                        .await
                }
                Report::Fail { data } => {
                    self.queue
                        .fail(FailJob {
                            id,
                            data: data.clone(),
                            lease,
                            run: run.cloned(),
                        })
                        .await
                }
                Report::Retry {
                    delay_secs,
                    ignore_repeat,
                    data,
                    name,
                    next_run,
                } => {
                    let mut cmd = RetryJob::now(id);
                    cmd.delay_secs = *delay_secs;
                    cmd.name = name.clone();
                    cmd.next_run = next_run
                        .as_deref()
                        .map(|t| crate::protocol::parse_time("nextRun", t))
                        .transpose()
                        .map_err(|e| SourceError::Refused(e.to_string()))?;
                    cmd.ignore_repeat = *ignore_repeat;
                    cmd.data = data.clone();
                    cmd.lease = lease;
                    cmd.run = run.cloned();
                    self.queue.retry(cmd).await
                }
            };
            result.map_err(source_error)
        })
    }

    fn create<'a>(&'a self, job: &'a CreateJob) -> BoxFuture<'a, Result<JobId, SourceError>> {
        Box::pin(async move { self.queue.create(job.clone()).await.map_err(source_error) })
    }

    fn exists<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            match self.queue.query(id).await {
                Ok(_) => Ok(true),
                Err(JobError::NoSuchJob) => Ok(false),
                Err(error) => Err(source_error(error)),
            }
        })
    }

    fn delete<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move { self.queue.delete(id).await.map_err(source_error) })
    }

    fn fetch_is_cancel_safe(&self) -> bool {
        // The queue puts back what a cancelled claim took.
        true
    }

    fn describe(&self) -> String {
        "embedded".into()
    }
}
