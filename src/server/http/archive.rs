//! `GET /archive`: jobs that ended (FINISHED, or FAILED), found by name
//! GLOB, final state and the time they ended, paged by id. Finished jobs
//! leave the queue, so `GET /jobs` no longer has them; the archive keeps
//! them as long as retention does (`--history-max-age`, `--history-max-count`).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::Params;
use super::error::ApiError;
use crate::protocol::{JobState, NamePattern, Timestamp};
use crate::server::ledger::ArchivedJob;
use crate::server::queue::Queue;
use crate::server::store::ArchiveQuery;

/// The most entries one page holds.
pub const MAX_ARCHIVE_PAGE: usize = 1000;

/// `GET /archive` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveParams {
    /// A GLOB or comma list of names.
    name: Option<String>,
    /// `FINISHED` or `FAILED`.
    state: Option<String>,
    /// Only jobs that ended at or after this time.
    since: Option<String>,
    /// Only jobs that ended before this time.
    until: Option<String>,
    /// Only ids greater than this.
    after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

fn time(param: &str, text: Option<&str>) -> Result<Option<Timestamp>, ApiError> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(text) => Timestamp::parse(text).map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "{param} is not a time: give \"YYYY-MM-DD HH:MM:SS\" (UTC)"
            ))
        }),
    }
}

/// The name pattern, refusing a GLOB whose `[` set is never closed (it
/// would match nothing, which reads as "no such jobs").
fn pattern(text: Option<&str>) -> Result<Option<NamePattern>, ApiError> {
    let Some(text) = text.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let pattern = NamePattern::parse(text)?;
    if let NamePattern::Glob(glob) = &pattern
        && let Some(open) = glob.find('[')
        && !glob[open + 1..].chars().skip(1).any(|c| c == ']')
    {
        return Err(ApiError::bad_request(
            "name: the GLOB's '[' set is not closed with ']'",
        ));
    }
    Ok(Some(pattern))
}

impl ArchiveParams {
    /// The checked query.
    fn into_query(self) -> Result<ArchiveQuery, ApiError> {
        let state = match self.state.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => match text.parse::<JobState>() {
                Ok(state @ (JobState::Finished | JobState::Failed)) => Some(state),
                _ => {
                    return Err(ApiError::bad_request(
                        "state: the archive holds FINISHED and FAILED jobs; list the others with GET /jobs",
                    ));
                }
            },
        };
        let since = time("since", self.since.as_deref())?;
        let until = time("until", self.until.as_deref())?;
        if let (Some(since), Some(until)) = (since, until)
            && since >= until
        {
            return Err(ApiError::bad_request("since must be before until"));
        }
        let limit = match self.limit {
            None => 100,
            Some(n) if (1..=MAX_ARCHIVE_PAGE).contains(&n) => n,
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "limit must be 1 to {MAX_ARCHIVE_PAGE}; page on with after"
                )));
            }
        };
        if self.after.is_some_and(|a| a < 0) {
            return Err(ApiError::bad_request("after must be a jobID or 0"));
        }
        Ok(ArchiveQuery {
            pattern: pattern(self.name.as_deref())?,
            state,
            since,
            until,
            after_id: self.after,
            limit,
        })
    }
}

/// `GET /archive`: ended jobs in id order; `nextAfter` when there may be
/// more (a full page, or one cut to keep the answer small).
pub async fn list(
    State(queue): State<Queue>,
    Params(params): Params<ArchiveParams>,
) -> Result<Json<Value>, ApiError> {
    let query = params.into_query()?;
    let limit = query.limit;
    let (jobs, cut) = queue
        .archived_jobs(query, super::listen::MAX_PAGE_BYTES)
        .await?;
    let mut answer = Map::new();
    if (cut || jobs.len() == limit)
        && let Some(last) = jobs.last()
    {
        answer.insert("nextAfter".into(), json!(last.job_id));
    }
    let jobs: Vec<Value> = jobs.iter().map(ArchivedJob::to_json).collect();
    answer.insert("jobs".into(), Value::Array(jobs));
    Ok(Json(Value::Object(answer)))
}
