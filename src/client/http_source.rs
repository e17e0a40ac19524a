//! [`JobSource`] over the HTTP/JSON API.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::source::{JobSource, LeasedJob, Report, SourceError};
use super::{ClientError, HttpClient};
use crate::protocol::{CreateJob, Data, JobId, WorkerInfo};
use crate::server::store::BoxFuture;

/// A job server reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpSource {
    client: HttpClient,
}

impl HttpSource {
    /// A source at `url` (`http://HOST:PORT`), with an optional bearer token.
    pub fn new(url: &str, token: Option<String>) -> Result<Self, ClientError> {
        Ok(HttpSource {
            client: HttpClient::new(url, token)?,
        })
    }
}

fn source_error(error: ClientError) -> SourceError {
    match error {
        ClientError::Transport { .. } | ClientError::BadUrl(_) => {
            SourceError::Unavailable(error.to_string())
        }
        ClientError::Api { ref code, .. } if code == "lease_lost" => SourceError::LeaseLost(0),
        ClientError::Api { status, .. } if status >= 500 => {
            SourceError::Unavailable(error.to_string())
        }
        ClientError::Api { status: 404, .. } => SourceError::NotFound(error.to_string()),
        ClientError::Api { .. } => SourceError::Refused(error.to_string()),
    }
}

impl HttpSource {
    async fn dequeue(
        &self,
        pattern: &str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: Option<&WorkerInfo>,
    ) -> Result<Vec<LeasedJob>, SourceError> {
        let mut body = json!({
            "name": pattern,
            "numResults": count.max(1),
            "waitMs": wait.as_millis() as u64,
            "leaseMs": lease.as_millis() as u64,
        });
        if let Some(worker) = worker {
            body["worker"] = json!(worker);
        }
        let answer = self
            .client
            .call(
                Method::POST,
                "/dequeue",
                Some(&body),
                wait + Duration::from_secs(30),
            )
            .await
            .map_err(source_error)?;
        let jobs = answer["jobs"].as_array().ok_or_else(|| {
            SourceError::Protocol(format!("dequeue answer without jobs: {answer}"))
        })?;
        jobs.iter()
            .map(|job| match job {
                Value::Object(map) => LeasedJob::from_handout(map.clone()),
                other => Err(SourceError::Protocol(format!(
                    "job is not an object: {other}"
                ))),
            })
            .collect()
    }
}

impl JobSource for HttpSource {
    fn get_jobs<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.dequeue(pattern, count, wait, lease, None))
    }

    fn get_jobs_as<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: &'a WorkerInfo,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.dequeue(pattern, count, wait, lease, Some(worker)))
    }

    fn announce<'a>(&'a self, worker: &'a WorkerInfo) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let body = json!({ "worker": worker });
            self.client
                .quick(Method::POST, "/workers", Some(&body))
                .await
                .map_err(source_error)?;
            Ok(())
        })
    }

    fn heartbeat<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return Ok(());
            };
            let path = format!("/jobs/{}/heartbeat", job.id);
            match self
                .client
                .quick(Method::POST, &path, Some(&json!({"lease": lease})))
                .await
            {
                Ok(_) => Ok(()),
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(job.id),
                    other => other,
                }),
            }
        })
    }

    fn update<'a>(
        &'a self,
        job: &'a LeasedJob,
        data: &'a Data,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let path = format!("/jobs/{}", job.id);
            let mut body = json!({"data": data});
            if let Some(lease) = &job.lease {
                body["lease"] = json!(lease);
            }
            match self.client.quick(Method::PATCH, &path, Some(&body)).await {
                Ok(_) => Ok(()),
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(job.id),
                    other => other,
                }),
            }
        })
    }

    fn report<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let mut body = serde_json::Map::new();
            if let Some(lease) = lease {
                body.insert("lease".into(), json!(lease));
            }
            let data = match report {
                Report::Finish { data } | Report::Fail { data } => data,
                Report::Retry {
                    delay_secs,
                    ignore_repeat,
                    data,
                } => {
                    body.insert("delay".into(), json!(delay_secs));
                    if *ignore_repeat {
                        body.insert("ignoreRepeat".into(), json!(true));
                    }
                    data
                }
            };
            if let Some(data) = data {
                body.insert("data".into(), Value::Object(data.clone()));
            }
            let path = format!("/jobs/{id}/{}", report.kind());
            match self
                .client
                .quick(Method::POST, &path, Some(&Value::Object(body)))
                .await
            {
                Ok(_) => Ok(()),
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(id),
                    other => other,
                }),
            }
        })
    }

    fn create<'a>(&'a self, job: &'a CreateJob) -> BoxFuture<'a, Result<JobId, SourceError>> {
        Box::pin(async move {
            let mut body = serde_json::Map::new();
            body.insert("name".into(), json!(job.name));
            body.insert("data".into(), Value::Object(job.data.clone()));
            if let Some(repeat) = &job.repeat {
                body.insert("repeat".into(), json!(repeat.text));
            }
            if let Some(priority) = job.priority {
                body.insert("priority".into(), json!(priority.value()));
            }
            if let Some(first_run) = job.first_run {
                body.insert("firstRun".into(), json!(first_run.to_string()));
            }
            if let Some(retry_after) = &job.retry_after {
                body.insert("retryAfter".into(), json!(retry_after.text));
            }
            if let Some(parent) = job.parent_id {
                body.insert("parentJobID".into(), json!(parent));
            }
            body.insert("unique".into(), json!(job.unique));
            body.insert("overwrite".into(), json!(job.overwrite));
            let answer = self
                .client
                .quick(Method::POST, "/jobs", Some(&Value::Object(body)))
                .await
                .map_err(source_error)?;
            answer["jobID"].as_i64().ok_or_else(|| {
                SourceError::Protocol(format!("create answer without jobID: {answer}"))
            })
        })
    }

    fn exists<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            match self
                .client
                .quick(Method::GET, &format!("/jobs/{id}"), None)
                .await
            {
                Ok(_) => Ok(true),
                Err(error) if error.is_not_found() => Ok(false),
                Err(error) => Err(source_error(error)),
            }
        })
    }

    fn delete<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.client
                .quick(Method::DELETE, &format!("/jobs/{id}"), None)
                .await
                .map_err(source_error)?;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        self.client.base().to_string()
    }
}
