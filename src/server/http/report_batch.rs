//! `POST /reports`: several FinishJob, RetryJob and FailJob reports in one
//! request, as a supervisor sends them under load. Each report is read as
//! its own endpoint reads it (`/jobs/{id}/finish`, `…/retry`, `…/fail`),
//! plus its `jobID` and `outcome`; a batch with a report that cannot be read
//! is refused whole, and changes nothing. Every report is then its own write
//! (one refused, say for a lost lease, leaves the others be), all handed to
//! the store at once so that they share its commits, and the answer says,
//! report by report and in order, `{"jobID": N}` or `{"jobID": N, "error":
//! {"status", "code", "message"}}` as the report's own endpoint would have
//! answered. One difference, as the API document says: a retry's `delay`
//! of more than 99,999,999 seconds is refused here even beside a `nextRun`
//! (which its own endpoint would follow instead).

use std::collections::HashSet;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::BatchBody;
use super::error::ApiError;
use super::requests::{FailJobRequest, FinishJobRequest, RetryJobRequest};
use crate::protocol::{FailJob, FinishJob, JobError, JobId, RetryJob, check_job_id};
use crate::server::queue::{MAX_RETRY_DELAY_SECS, Queue};

/// The most reports one batch may carry.
pub const MAX_BATCH_REPORTS: usize = 256;

/// The most reports a dequeue may carry.
pub const MAX_DEQUEUE_REPORTS: usize = 64;

/// The request: its reports.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportsRequest {
    reports: Vec<Map<String, Value>>,
}

/// One report, read and checked.
pub struct ReadReport(Outcome);

/// What a report says.
enum Outcome {
    Finish(FinishJob),
    Retry(RetryJob),
    Fail(FailJob),
}

/// Reads the `index`-th report as its own endpoint would.
fn read(index: usize, mut report: Map<String, Value>) -> Result<(JobId, Outcome), ApiError> {
    let refuse = |what: String| ApiError::bad_request(format!("reports[{index}]: {what}"));
    let id = match report.remove("jobID") {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or(JobError::Malformed("jobID"))
            .and_then(|n| check_job_id("jobID", n))
            .map_err(|e| refuse(e.to_string()))?,
        Some(_) => return Err(refuse("jobID must be a job id, a positive integer".into())),
        None => return Err(refuse("jobID is missing".into())),
    };
    let outcome = match report.remove("outcome") {
        Some(Value::String(outcome)) => outcome,
        Some(_) => return Err(refuse("outcome must be finish, retry or fail".into())),
        None => return Err(refuse("outcome is missing (finish, retry or fail)".into())),
    };
    let rest = Value::Object(report);
    let unreadable = |e: serde_json::Error| refuse(e.to_string());
    let checked = |e: JobError| refuse(e.to_string());
    let outcome = match outcome.as_str() {
        "finish" => Outcome::Finish(
            serde_json::from_value::<FinishJobRequest>(rest)
                .map_err(unreadable)?
                .into_command(id)
                .map_err(checked)?,
        ),
        "retry" => {
            let retry = serde_json::from_value::<RetryJobRequest>(rest)
                .map_err(unreadable)?
                .into_command(id)
                .map_err(checked)?;
            // What the document promises is refused at once, not in the
            // report's own result (its endpoint refuses it when it applies
            // the delay, and only without a nextRun).
            if retry.delay_secs > MAX_RETRY_DELAY_SECS {
                return Err(refuse(format!(
                    "delay is more than {MAX_RETRY_DELAY_SECS} seconds"
                )));
            }
            Outcome::Retry(retry)
        }
        "fail" => Outcome::Fail(
            serde_json::from_value::<FailJobRequest>(rest)
                .map_err(unreadable)?
                .into_command(id)
                .map_err(checked)?,
        ),
        other => {
            let shown: String = other.chars().take(32).collect();
            return Err(refuse(format!(
                "outcome {shown:?} is not finish, retry or fail"
            )));
        }
    };
    Ok((id, outcome))
}

/// Reads the reports of a batch, or of a dequeue that carries them: each as
/// its own endpoint would, at most `max`, one per job; the first that
/// cannot be read refuses them all.
pub fn read_all(
    reports: Vec<Map<String, Value>>,
    max: usize,
) -> Result<Vec<(JobId, ReadReport)>, ApiError> {
    if reports.len() > max {
        return Err(ApiError::bad_request(format!(
            "{} reports in one request; send at most {max}",
            reports.len()
        )));
    }
    let mut seen = HashSet::new();
    let mut read_all = Vec::with_capacity(reports.len());
    for (index, report) in reports.into_iter().enumerate() {
        let (id, outcome) = read(index, report)?;
        if !seen.insert(id) {
            return Err(ApiError::bad_request(format!(
                "reports[{index}]: job {id} is reported twice in one batch; send one report per job"
            )));
        }
        read_all.push((id, ReadReport(outcome)));
    }
    Ok(read_all)
}

/// Applies reports read by [`read_all`], each its own write, all submitted
/// before any is awaited (the store commits them together): each one's
/// result, in order, `{"jobID": N}` or with the `error` its own endpoint
/// would have answered.
pub async fn apply(queue: &Queue, reports: Vec<(JobId, ReadReport)>) -> Vec<Value> {
    let writes = reports.into_iter().map(|(id, ReadReport(outcome))| {
        let queue = queue.clone();
        async move {
            let done = match outcome {
                Outcome::Finish(cmd) => queue.finish(cmd).await,
                Outcome::Retry(cmd) => queue.retry(cmd).await,
                Outcome::Fail(cmd) => queue.fail(cmd).await,
            };
            match done {
                Ok(()) => json!({"jobID": id}),
                Err(error) => {
                    let error = ApiError::from(error);
                    json!({"jobID": id, "error": {
                        "status": error.status.as_u16(),
                        "code": error.code,
                        "message": error.message,
                    }})
                }
            }
        }
    });
    futures_util::future::join_all(writes).await
}

/// `POST /reports`.
pub async fn reports(
    State(queue): State<Queue>,
    BatchBody(req): BatchBody<ReportsRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.reports.is_empty() {
        return Err(ApiError::bad_request("reports is empty: send at least one"));
    }
    let read = read_all(req.reports, MAX_BATCH_REPORTS)?;
    let results = apply(&queue, read).await;
    Ok(Json(json!({ "results": results })))
}
