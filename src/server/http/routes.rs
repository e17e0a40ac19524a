//! The HTTP API's handlers: one per job action, each a thin translation from
//! a request body to a queue call and back.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use serde_json::{Map, Value, json};

use super::body::{BatchBody, Body, Params};
use super::error::ApiError;
use super::report_batch;
use super::requests::{
    ChangeDependsRequest, CreateJobRequest, CreateJobsRequest, DequeueRequest, EmptyRequest,
    FailJobRequest, FinishJobRequest, HeartbeatRequest, ListParams, RequeueRequest,
    RetryJobRequest, TagParams, TagsRequest, TrackedParams, UpdateJobRequest,
};
use crate::protocol::view::labelled_json;
use crate::protocol::{JobError, JobId, JobState, MAX_BATCH_JOBS, NamePattern, parse_job_id};
use crate::server::budget::AnswerShare;
use crate::server::queue::Queue;
use crate::server::store::ListQuery;

type Answer = Result<Json<Value>, ApiError>;

fn ok() -> Answer {
    Ok(Json(json!({})))
}

fn job_id(text: &str) -> Result<JobId, ApiError> {
    parse_job_id("jobID", text).map_err(ApiError::from)
}

/// `GET /healthz`: 200 while the store takes writes, 503 with the reason
/// while they fail (a full disk, an I/O error).
pub async fn health(State(queue): State<Queue>) -> (axum::http::StatusCode, Json<Value>) {
    match queue.write_failure() {
        None => (
            axum::http::StatusCode::OK,
            Json(json!({"status": "ok", "waiting": queue.waiting()})),
        ),
        Some(reason) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "failing",
                "reason": format!("the job store cannot write: {reason}"),
                "waiting": queue.waiting(),
            })),
        ),
    }
}

/// `GET /openapi.json`
pub async fn openapi() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
}

/// The idempotency key of a create: the `Idempotency-Key` header or the
/// body's `idempotencyKey` (the same, if both are given).
fn idempotency_key(headers: &HeaderMap, body: Option<String>) -> Result<Option<String>, ApiError> {
    let header = match headers.get("idempotency-key") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::from(JobError::Malformed("idempotencyKey")))?
                .to_string(),
        ),
        None => None,
    };
    match (header, body) {
        (Some(header), Some(body)) if header != body => Err(ApiError::bad_request(
            "the Idempotency-Key header and the body's idempotencyKey differ; send one",
        )),
        (header, body) => Ok(header.or(body)),
    }
}

/// `POST /jobs`: CreateJob.
pub async fn create(
    State(queue): State<Queue>,
    headers: HeaderMap,
    Body(mut req): Body<CreateJobRequest>,
) -> Answer {
    let key = idempotency_key(&headers, req.take_idempotency_key())?;
    let ids = queue
        .create_with_key(key, vec![req.into_command()?])
        .await?;
    Ok(Json(json!({"jobID": ids.first()})))
}

/// `POST /jobs/batch`: CreateJobs, all or nothing.
pub async fn create_many(
    State(queue): State<Queue>,
    headers: HeaderMap,
    BatchBody(mut req): BatchBody<CreateJobsRequest>,
) -> Answer {
    let key = idempotency_key(&headers, req.idempotency_key.take())?;
    if req
        .jobs
        .iter_mut()
        .any(|job| job.take_idempotency_key().is_some())
    {
        return Err(ApiError::bad_request(
            "idempotencyKey belongs to the batch, not to its jobs",
        ));
    }
    if req.jobs.is_empty() {
        return Err(JobError::InvalidJson.into());
    }
    if req.jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::bad_request(format!(
            "a batch holds at most {MAX_BATCH_JOBS} jobs; split it"
        )));
    }
    let cmds = req
        .jobs
        .into_iter()
        .map(CreateJobRequest::into_command)
        .collect::<Result<Vec<_>, _>>()?;
    let ids = queue.create_with_key(key, cmds).await?;
    Ok(Json(json!({"jobIDs": ids})))
}

/// `GET /jobs`: a listing, in id order.
pub async fn list(State(queue): State<Queue>, Params(params): Params<ListParams>) -> Answer {
    let pattern = params
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(NamePattern::parse)
        .transpose()?;
    let state = params
        .state
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<JobState>().map_err(ApiError::bad_request))
        .transpose()?;
    let query = ListQuery {
        pattern,
        state,
        tag: params.tag()?,
        after_id: params.after,
        limit: params.limit.unwrap_or(100).clamp(1, 1000),
        max_bytes: super::listen::MAX_PAGE_BYTES,
    };
    let (page, labels) = queue.list_labelled(query).await?;
    let mut answer = Map::new();
    if page.cut {
        // Fewer jobs than asked, to keep the answer small: go on from here.
        if let Some(last) = page.jobs.last() {
            answer.insert("nextAfter".into(), json!(last.id));
        }
    }
    let jobs: Vec<Value> = page
        .jobs
        .iter()
        .zip(&labels)
        .map(|(job, labels)| Value::Object(labelled_json(job, labels)))
        .collect();
    answer.insert("jobs".into(), Value::Array(jobs));
    Ok(Json(Value::Object(answer)))
}

/// `GET /jobs/{id}`: QueryJob, with the job's dependencies and dependents.
pub async fn query(State(queue): State<Queue>, Path(id): Path<String>) -> Answer {
    let (job, labels, dependencies) = queue.query_in_full(job_id(&id)?).await?;
    let mut answer = labelled_json(&job, &labels);
    dependencies.add_to(&mut answer);
    Ok(Json(Value::Object(answer)))
}

/// `POST /jobs/{id}/depends`: adds and drops dependencies; answers the job
/// as QueryJob does.
pub async fn change_depends(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<ChangeDependsRequest>,
) -> Answer {
    let id = job_id(&id)?;
    queue.change_depends(req.into_command(id)?, None).await?;
    query(State(queue), Path(id.to_string())).await
}

/// `POST /jobs/{id}/tags`: adds and removes tags; answers with the job's
/// tags.
pub async fn tags(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<TagsRequest>,
) -> Answer {
    let id = job_id(&id)?;
    let tags = queue.change_tags(req.into_command(id)?).await?;
    Ok(Json(json!({"jobID": id, "tags": tags})))
}

/// `POST /jobs/{id}/track`: tracks a job (idempotent).
pub async fn track(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(_): Body<EmptyRequest>,
) -> Answer {
    queue.track(job_id(&id)?).await?;
    ok()
}

/// `DELETE /jobs/{id}/track`: stops tracking a job (idempotent).
pub async fn untrack(State(queue): State<Queue>, Path(id): Path<String>) -> Answer {
    queue.untrack(job_id(&id)?).await?;
    ok()
}

/// `GET /tracked`: the tracked jobs, in id order, paged by `after` and by
/// size (`nextAfter` when a page was cut short).
pub async fn tracked(State(queue): State<Queue>, Params(params): Params<TrackedParams>) -> Answer {
    let limit = params.limit.unwrap_or(100);
    let page = queue
        .tracked(
            params.after.unwrap_or(0),
            limit,
            super::listen::MAX_PAGE_BYTES,
        )
        .await?;
    let mut answer = Map::new();
    if let Some(next) = page.next_after {
        answer.insert("nextAfter".into(), json!(next));
    }
    answer.insert("jobs".into(), Value::Array(page.jobs));
    Ok(Json(Value::Object(answer)))
}

/// `GET /tags`: the tags on most jobs, most first.
pub async fn top_tags(State(queue): State<Queue>, Params(params): Params<TagParams>) -> Answer {
    let tags = queue.top_tags(params.limit.unwrap_or(100)).await?;
    Ok(Json(json!({"tags": tags})))
}

/// `PATCH /jobs/{id}`: UpdateJob.
pub async fn update(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<UpdateJobRequest>,
) -> Answer {
    queue.update(req.into_command(job_id(&id)?)?).await?;
    ok()
}

/// `DELETE /jobs/{id}`: DeleteJob.
pub async fn delete(State(queue): State<Queue>, Path(id): Path<String>) -> Answer {
    queue.delete(job_id(&id)?).await?;
    ok()
}

/// `POST /jobs/{id}/finish`: FinishJob.
pub async fn finish(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<FinishJobRequest>,
) -> Answer {
    queue.finish(req.into_command(job_id(&id)?)?).await?;
    ok()
}

/// `POST /jobs/{id}/retry`: RetryJob.
pub async fn retry(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<RetryJobRequest>,
) -> Answer {
    queue.retry(req.into_command(job_id(&id)?)?).await?;
    ok()
}

/// `POST /jobs/{id}/fail`: FailJob.
pub async fn fail(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<FailJobRequest>,
) -> Answer {
    queue.fail(req.into_command(job_id(&id)?)?).await?;
    ok()
}

/// `POST /jobs/{id}/cancel`: CancelJob.
pub async fn cancel(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(_): Body<EmptyRequest>,
) -> Answer {
    queue.cancel(job_id(&id)?).await?;
    ok()
}

/// The lease token a heartbeat or hand-back names: `402 Missing lease`
/// without one.
fn lease_of(req: HeartbeatRequest) -> Result<String, JobError> {
    req.lease
        .filter(|t| !t.is_empty())
        .ok_or(JobError::Missing("lease"))
}

/// `POST /jobs/{id}/heartbeat`: renews a lease.
pub async fn heartbeat(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<HeartbeatRequest>,
) -> Answer {
    let expires = queue.heartbeat(job_id(&id)?, lease_of(req)?).await?;
    Ok(Json(
        json!({"leaseExpires": expires.map(|t| t.to_string()).unwrap_or_default()}),
    ))
}

/// `POST /jobs/{id}/handback`: HandBackJob, the job as it was before the
/// hand-out under the lease.
pub async fn hand_back(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Body(req): Body<HeartbeatRequest>,
) -> Answer {
    queue.hand_back(job_id(&id)?, lease_of(req)?).await?;
    ok()
}

/// `POST /jobs/requeue`: RequeueJobs.
pub async fn requeue(State(queue): State<Queue>, Body(req): Body<RequeueRequest>) -> Answer {
    let count = queue.requeue(req.into_command()?).await?;
    Ok(Json(json!({"requeued": count})))
}

/// `POST /dequeue`: GetJobs with a lease, optionally waiting. A dequeue may
/// carry up to 64 reports of jobs that ended (as `POST /reports` takes
/// them): they go to the store before the claim, which sees them, and their
/// results come back beside the jobs; such a dequeue does not wait, so that
/// the reports are answered at once.
pub async fn dequeue(
    State(queue): State<Queue>,
    Extension(share): Extension<AnswerShare>,
    Body(mut req): Body<DequeueRequest>,
) -> Answer {
    let reports = report_batch::read_all(req.take_reports(), report_batch::MAX_DEQUEUE_REPORTS)?;
    let (cmd, wait) = req.into_command(queue.config().default_lease_ms)?;
    let mut out = Map::new();
    let handouts = if reports.is_empty() {
        let handouts = queue.get_jobs(cmd, wait).await?;
        queue.within_budget(handouts, &share).await?
    } else {
        // The reports' writes are submitted when `apply` is first polled
        // (all of them: at most 64), before the claim's, and the store runs
        // writes in order: the claim sees them.
        let (results, handouts) = tokio::join!(
            report_batch::apply(&queue, reports),
            queue.get_jobs(cmd, None)
        );
        out.insert("results".into(), Value::Array(results));
        // The reports' results are the answer's news: a claim that failed
        // (the store, a shutdown, the budget) hands out nothing, and the
        // next dequeue, which carries none, hears why.
        let handouts = match handouts {
            Ok(handouts) => queue.within_budget(handouts, &share).await,
            Err(error) => Err(error),
        };
        handouts.unwrap_or_else(|error| {
            tracing::warn!(%error, "the claim of a dequeue that carried reports failed; answering with their results and no job");
            Vec::new()
        })
    };
    let jobs: Vec<Value> = handouts
        .iter()
        .map(|h| Value::Object(h.leased_json()))
        .collect();
    out.insert("jobs".into(), Value::Array(jobs));
    Ok(Json(Value::Object(out)))
}
