//! The API's reports from the ledger: statistics shaped for charts (per
//! name and per supervisor), the worker registry, failure groups with
//! their bulk actions, job history, and purging. Every answer is JSON a
//! chart library can plot as it is.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::{Body, Params};
use super::error::ApiError;
use crate::protocol::view::query_json;
use crate::protocol::{JobError, NamePattern, Timestamp, WorkerInfo, parse_job_id, parse_time};
use crate::server::ledger::failure::valid_group;
use crate::server::queue::Queue;
use crate::server::queue::reports::Period;

type Answer = Result<Json<Value>, ApiError>;

/// The most jobs one bulk action or listing touches.
pub const MAX_BULK: usize = 10_000;

/// `GET /stats` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsParams {
    name: Option<String>,
    period: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

/// `GET /stats/workers` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStatsParams {
    worker: Option<String>,
    period: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

/// The period and the window `[from, to)` a statistics request asks for,
/// as of now.
fn window(
    queue: &Queue,
    period: Option<&str>,
    from: Option<String>,
    to: Option<String>,
) -> Result<(Period, (Timestamp, Timestamp)), ApiError> {
    let period = match period {
        None | Some("") => Period::Hour,
        Some(text) => Period::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!("period must be hour or day, not {text:?}"))
        })?,
    };
    let time = |name: &'static str, value: Option<String>| {
        value
            .filter(|v| !v.is_empty())
            .map(|v| parse_time(name, &v))
            .transpose()
    };
    let (from, to) = (time("from", from)?, time("to", to)?);
    let window = period
        .window(from, to, queue.now())
        .map_err(ApiError::bad_request)?;
    Ok((period, window))
}

/// A GLOB filter; empty means everything.
fn pattern(glob: Option<&str>) -> Result<Option<NamePattern>, ApiError> {
    Ok(glob
        .filter(|n| !n.is_empty())
        .map(NamePattern::parse)
        .transpose()?)
}

/// `GET /stats`: statistics per name and hour or day.
pub async fn stats(State(queue): State<Queue>, Params(params): Params<StatsParams>) -> Answer {
    let pattern = pattern(params.name.as_deref())?;
    let (period, window) = window(&queue, params.period.as_deref(), params.from, params.to)?;
    Ok(Json(queue.stats(pattern, period, window).await?))
}

/// `GET /stats/workers`: statistics per supervisor and hour or day.
pub async fn worker_stats(
    State(queue): State<Queue>,
    Params(params): Params<WorkerStatsParams>,
) -> Answer {
    let pattern = pattern(params.worker.as_deref())?;
    let (period, window) = window(&queue, params.period.as_deref(), params.from, params.to)?;
    Ok(Json(queue.worker_stats(pattern, period, window).await?))
}

/// `GET /workers`: the supervisors the server has seen.
pub async fn workers(State(queue): State<Queue>) -> Answer {
    let workers: Vec<Value> = queue.workers().await?.iter().map(|w| w.to_json()).collect();
    Ok(Json(json!({"workers": workers})))
}

/// `POST /workers` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnounceRequest {
    worker: Option<WorkerInfo>,
}

/// `POST /workers`: a supervisor says it is alive.
pub async fn announce(State(queue): State<Queue>, Body(req): Body<AnnounceRequest>) -> Answer {
    let worker = req.worker.ok_or(JobError::Missing("worker"))?;
    queue.see_worker(worker).await?;
    Ok(Json(json!({})))
}

/// `GET /failures`: failure groups of jobs still FAILED.
pub async fn failures(State(queue): State<Queue>) -> Answer {
    let groups: Vec<Value> = queue
        .failure_groups()
        .await?
        .iter()
        .map(|g| g.to_json())
        .collect();
    Ok(Json(json!({"groups": groups})))
}

fn group(text: String) -> Result<String, ApiError> {
    if valid_group(&text) {
        Ok(text)
    } else {
        Err(ApiError::bad_request(
            "a failure group is 1 to 64 letters, digits, '_', ':', '-' or '+'; see GET /failures",
        ))
    }
}

/// `GET /failures/{group}` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupParams {
    limit: Option<usize>,
}

/// `GET /failures/{group}`: the group's jobs, earliest failure first.
pub async fn failure_group(
    State(queue): State<Queue>,
    Path(name): Path<String>,
    Params(params): Params<GroupParams>,
) -> Answer {
    let name = group(name)?;
    let limit = params.limit.unwrap_or(100).clamp(1, MAX_BULK);
    let (jobs, truncated) = queue
        .failed_jobs(name.clone(), limit, super::listen::MAX_PAGE_BYTES)
        .await?;
    let jobs: Vec<Value> = jobs
        .iter()
        .map(|(job, error)| {
            let mut out = query_json(job);
            out.insert("error".into(), json!(error));
            Value::Object(out)
        })
        .collect();
    let mut answer = json!({"group": name, "jobs": jobs});
    if truncated {
        // Fewer jobs than asked, to keep the answer under 8 MiB of data.
        answer["truncated"] = json!(true);
    }
    Ok(Json(answer))
}

/// Body of the bulk actions on a failure group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    #[serde(default, deserialize_with = "super::requests::given")]
    count: Option<u64>,
}

impl BulkRequest {
    fn count(&self) -> Result<usize, ApiError> {
        match self.count {
            None => Ok(MAX_BULK),
            Some(n) if (1..=MAX_BULK as u64).contains(&n) => Ok(n as usize),
            Some(_) => Err(ApiError::bad_request(format!(
                "count must be 1 to {MAX_BULK}; repeat the action for more"
            ))),
        }
    }
}

/// `POST /failures/{group}/retry`: queues the first `count` jobs again.
pub async fn retry_group(
    State(queue): State<Queue>,
    Path(name): Path<String>,
    Body(req): Body<BulkRequest>,
) -> Answer {
    let count = req.count()?;
    let ids = queue.retry_failed(group(name)?, count).await?;
    Ok(Json(json!({"retried": ids.len(), "jobIDs": ids})))
}

/// `POST /failures/{group}/delete`: deletes the first `count` jobs.
pub async fn delete_group(
    State(queue): State<Queue>,
    Path(name): Path<String>,
    Body(req): Body<BulkRequest>,
) -> Answer {
    let count = req.count()?;
    let ids = queue.delete_failed(group(name)?, count).await?;
    Ok(Json(json!({"deleted": ids.len(), "jobIDs": ids})))
}

/// `GET /jobs/{id}/history`: the job, its archive entry and its attempts.
pub async fn history(
    State(queue): State<Queue>,
    Path(id): Path<String>,
    Params(params): Params<HistoryParams>,
) -> Answer {
    let id = parse_job_id("jobID", &id)?;
    let limit = match params.limit {
        None => DEFAULT_HISTORY_ATTEMPTS,
        Some(n) if (1..=MAX_HISTORY_ATTEMPTS).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "limit must be 1 to {MAX_HISTORY_ATTEMPTS}; page to older attempts with skip"
            )));
        }
    };
    let skip = params.skip.unwrap_or(0);
    Ok(Json(queue.history(id, skip, limit).await?.to_json(id)))
}

/// How many of a job's latest attempts a history shows unless asked.
pub const DEFAULT_HISTORY_ATTEMPTS: usize = 100;
/// The most attempts one history answer holds (each carries at most 4 KiB
/// of each stream): a job repeated every few seconds for weeks has tens of
/// thousands.
pub const MAX_HISTORY_ATTEMPTS: usize = 1000;

/// `GET /jobs/{id}/history` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// At most this many attempts (default 100, at most 1000).
    limit: Option<usize>,
    /// Skip this many of the latest attempts (to page to older ones).
    skip: Option<usize>,
}

/// `POST /purge` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {}

/// `POST /purge`: removes now what retention no longer keeps.
pub async fn purge(State(queue): State<Queue>, Body(_): Body<PurgeRequest>) -> Answer {
    Ok(Json(queue.purge().await?.to_json()))
}
