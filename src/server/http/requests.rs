//! The HTTP API's request bodies, and their conversion to checked commands.
//! Field names follow Bedrock's (`jobID`, `firstRun`, `retryAfter`, …);
//! `priority` is also accepted as `jobPriority`.

use serde::Deserialize;
use serde_json::Value;

use crate::protocol::tags::{check_tag, check_tags};
use crate::protocol::{
    ChangeDepends, CreateJob, Data, FailJob, FinishJob, GetJobs, JobError, JobId, LeaseTerm,
    MAX_NUM_RESULTS, NamePattern, Priority, Repeat, RequeueJobs, RetryAfter, RetryJob, RunFacts,
    TagChange, Timestamp, UpdateJob, WorkerInfo, check_data, check_depends, check_job_id,
    check_name, parse_time,
};

/// The longest a dequeue may wait: one hour.
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// The shortest lease a dequeue may ask for.
pub const MIN_LEASE_MS: u64 = 100;

/// The longest lease a dequeue may ask for: one day.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// Reads a field that is `Some` whenever it is present, even as `null`, so
/// that `"data": null` is refused rather than taken for "no data".
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// Reads an optional field that, when present, must hold a value: `null`
/// is refused rather than taken for "not given", as the API document says
/// (an optional field is left out, not sent as null).
pub(super) fn given<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<T>::deserialize(deserializer)? {
        Some(value) => Ok(Some(value)),
        None => Err(serde::de::Error::custom(
            "null where a value is expected; leave an optional field out instead",
        )),
    }
}

/// As [`given`], for a field whose value is an object: serde would also read
/// a struct from an array of its fields in order, which the API document
/// does not allow.
fn given_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match given::<D, Value>(deserializer)? {
        Some(value @ Value::Object(_)) => T::deserialize(value)
            .map(Some)
            .map_err(serde::de::Error::custom),
        Some(_) => Err(serde::de::Error::custom("an object is expected")),
        None => Ok(None),
    }
}

fn data(value: Option<Value>) -> Result<Option<Data>, JobError> {
    value.map(check_data).transpose()
}

fn run(value: Option<RunFacts>) -> Result<Option<RunFacts>, JobError> {
    value.map(|r| r.check().map(|()| r)).transpose()
}

fn priority(value: Option<i64>) -> Result<Option<Priority>, JobError> {
    value.map(Priority::new).transpose()
}

fn time(param: &'static str, value: Option<String>) -> Result<Option<Timestamp>, JobError> {
    value
        .filter(|t| !t.trim().is_empty())
        .map(|t| parse_time(param, &t))
        .transpose()
}

fn repeat(value: Option<String>) -> Result<Option<Repeat>, JobError> {
    value
        .filter(|r| !r.trim().is_empty())
        .map(|r| Repeat::parse(&r))
        .transpose()
}

/// `POST /jobs`, and each element of `POST /jobs/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateJobRequest {
    #[serde(default, deserialize_with = "given")]
    name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
    #[serde(default, deserialize_with = "given")]
    first_run: Option<String>,
    #[serde(default, deserialize_with = "given")]
    repeat: Option<String>,
    #[serde(alias = "jobPriority", default, deserialize_with = "given")]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    unique: Option<bool>,
    #[serde(default, deserialize_with = "given")]
    overwrite: Option<bool>,
    #[serde(rename = "parentJobID", default, deserialize_with = "given")]
    parent_job_id: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    retry_after: Option<String>,
    #[serde(default, deserialize_with = "given")]
    depends: Option<Vec<i64>>,
    /// The idempotency key of a single create (a batch has its own).
    #[serde(default, deserialize_with = "given")]
    idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "given")]
    tags: Option<Vec<String>>,
}

impl CreateJobRequest {
    /// Takes the idempotency key given in the body, if any.
    pub fn take_idempotency_key(&mut self) -> Option<String> {
        self.idempotency_key.take()
    }

    /// The checked command.
    pub fn into_command(self) -> Result<CreateJob, JobError> {
        let name = self.name.unwrap_or_default();
        check_name(&name)?;
        Ok(CreateJob {
            name,
            data: data(self.data)?.unwrap_or_default(),
            first_run: time("firstRun", self.first_run)?,
            repeat: repeat(self.repeat)?,
            priority: priority(self.priority)?,
            unique: self.unique.unwrap_or(false),
            overwrite: self.overwrite.unwrap_or(true),
            parent_id: self
                .parent_job_id
                .filter(|&id| id != 0)
                .map(|id| check_job_id("parentJobID", id))
                .transpose()?,
            retry_after: self
                .retry_after
                .filter(|r| !r.trim().is_empty())
                .map(|r| RetryAfter::parse(&r))
                .transpose()?,
            tags: check_tags("tags", self.tags.unwrap_or_default())?,
            depends: check_depends("depends", &self.depends.unwrap_or_default())?,
        })
    }
}

/// `POST /jobs/{id}/depends`: jobs to add to a job's dependencies and to
/// drop from them; either list may be left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeDependsRequest {
    #[serde(default, deserialize_with = "given")]
    add: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "given")]
    remove: Option<Vec<i64>>,
}

impl ChangeDependsRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<ChangeDepends, JobError> {
        Ok(ChangeDepends {
            id,
            add: check_depends("add", &self.add.unwrap_or_default())?,
            remove: check_depends("remove", &self.remove.unwrap_or_default())?,
        })
    }
}

/// `POST /jobs/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJobsRequest {
    /// The jobs.
    pub jobs: Vec<CreateJobRequest>,
    /// The batch's idempotency key.
    #[serde(rename = "idempotencyKey", default, deserialize_with = "given")]
    pub idempotency_key: Option<String>,
}

/// `POST /dequeue`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DequeueRequest {
    #[serde(default, deserialize_with = "given")]
    name: Option<String>,
    #[serde(default, deserialize_with = "given")]
    num_results: Option<u64>,
    #[serde(default, deserialize_with = "given")]
    wait_ms: Option<u64>,
    #[serde(default, deserialize_with = "given")]
    lease_ms: Option<u64>,
    #[serde(alias = "jobPriority", default, deserialize_with = "given")]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    worker: Option<WorkerInfo>,
    /// Reports of jobs that ended, as `POST /reports` takes them, applied
    /// before the claim.
    #[serde(default, deserialize_with = "given")]
    reports: Option<Vec<serde_json::Map<String, Value>>>,
}

impl DequeueRequest {
    /// Takes the reports the request carries (none if it carries none).
    pub fn take_reports(&mut self) -> Vec<serde_json::Map<String, Value>> {
        self.reports.take().unwrap_or_default()
    }

    /// The checked command and how long to wait.
    pub fn into_command(
        self,
        default_lease_ms: i64,
    ) -> Result<(GetJobs, Option<std::time::Duration>), JobError> {
        let pattern = NamePattern::parse(self.name.as_deref().unwrap_or(""))?;
        let num_results = self
            .num_results
            .unwrap_or(1)
            .clamp(1, MAX_NUM_RESULTS as u64) as usize;
        let lease_ms = match self.lease_ms {
            None => default_lease_ms,
            Some(ms) if (MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms) => ms as i64,
            Some(_) => return Err(JobError::Malformed("leaseMs")),
        };
        let wait = match self.wait_ms {
            None | Some(0) => None,
            Some(ms) if ms <= MAX_WAIT_MS => Some(std::time::Duration::from_millis(ms)),
            Some(_) => return Err(JobError::Malformed("waitMs")),
        };
        let cmd = GetJobs {
            pattern,
            num_results,
            priority: priority(self.priority)?,
            lease: LeaseTerm::Millis(lease_ms),
            worker: self.worker.map(|w| w.check().map(|()| w)).transpose()?,
        };
        Ok((cmd, wait))
    }
}

/// `PATCH /jobs/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateJobRequest {
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
    #[serde(default, deserialize_with = "given")]
    repeat: Option<String>,
    #[serde(alias = "jobPriority", default, deserialize_with = "given")]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    next_run: Option<String>,
    #[serde(default, deserialize_with = "given")]
    clear_repeat: Option<bool>,
    #[serde(default, deserialize_with = "given")]
    lease: Option<String>,
}

impl UpdateJobRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<UpdateJob, JobError> {
        Ok(UpdateJob {
            id,
            data: data(self.data)?.ok_or(JobError::Missing("data"))?,
            repeat: repeat(self.repeat)?,
            clear_repeat: self.clear_repeat.unwrap_or(false),
            priority: priority(self.priority)?,
            next_run: time("nextRun", self.next_run)?,
            lease: self.lease,
        })
    }
}

/// `POST /jobs/{id}/finish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishJobRequest {
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
    #[serde(default, deserialize_with = "given")]
    lease: Option<String>,
    #[serde(default, deserialize_with = "given_object")]
    run: Option<RunFacts>,
}

impl FinishJobRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<FinishJob, JobError> {
        Ok(FinishJob {
            id,
            data: data(self.data)?,
            lease: self.lease,
            run: run(self.run)?,
        })
    }
}

/// `POST /jobs/{id}/fail`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailJobRequest {
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
    #[serde(default, deserialize_with = "given")]
    lease: Option<String>,
    #[serde(default, deserialize_with = "given_object")]
    run: Option<RunFacts>,
}

impl FailJobRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<FailJob, JobError> {
        Ok(FailJob {
            id,
            data: data(self.data)?,
            lease: self.lease,
            run: run(self.run)?,
        })
    }
}

/// `POST /jobs/{id}/retry`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryJobRequest {
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
    #[serde(default, deserialize_with = "given")]
    delay: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    next_run: Option<String>,
    #[serde(default, deserialize_with = "given")]
    name: Option<String>,
    #[serde(alias = "jobPriority", default, deserialize_with = "given")]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "given")]
    ignore_repeat: Option<bool>,
    #[serde(default, deserialize_with = "given")]
    lease: Option<String>,
    #[serde(default, deserialize_with = "given_object")]
    run: Option<RunFacts>,
}

impl RetryJobRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<RetryJob, JobError> {
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        Ok(RetryJob {
            id,
            data: data(self.data)?,
            delay_secs: self.delay.unwrap_or(0),
            next_run: time("nextRun", self.next_run)?,
            name: self.name,
            priority: priority(self.priority)?,
            ignore_repeat: self.ignore_repeat.unwrap_or(false),
            lease: self.lease,
            run: run(self.run)?,
        })
    }
}

/// `POST /jobs/{id}/heartbeat` and `POST /jobs/{id}/handback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The lease token from the hand-out.
    #[serde(default, deserialize_with = "given")]
    pub lease: Option<String>,
}

/// An empty body, for actions without parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

/// `POST /jobs/requeue`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueRequest {
    #[serde(rename = "jobIDs", default, deserialize_with = "given")]
    job_ids: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "given")]
    name: Option<String>,
}

impl RequeueRequest {
    /// The checked command.
    pub fn into_command(self) -> Result<RequeueJobs, JobError> {
        let ids = self
            .job_ids
            .filter(|ids| !ids.is_empty())
            .ok_or(JobError::Missing("jobIDs"))?;
        let ids = ids
            .into_iter()
            .map(|id| check_job_id("jobIDs", id))
            .collect::<Result<_, _>>()?;
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        Ok(RequeueJobs {
            ids,
            name: self.name,
        })
    }
}

/// `POST /jobs/{id}/tags`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagsRequest {
    #[serde(default, deserialize_with = "given")]
    add: Option<Vec<String>>,
    #[serde(default, deserialize_with = "given")]
    remove: Option<Vec<String>>,
}

impl TagsRequest {
    /// The checked command.
    pub fn into_command(self, id: JobId) -> Result<TagChange, JobError> {
        Ok(TagChange {
            id,
            add: check_tags("add", self.add.unwrap_or_default())?,
            remove: check_tags("remove", self.remove.unwrap_or_default())?,
        })
    }
}

/// `GET /jobs` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// A GLOB or comma list of names.
    pub name: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only jobs with this tag.
    pub tag: Option<String>,
    /// Only ids greater than this.
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<usize>,
}

impl ListParams {
    /// The tag asked for, checked; an empty one counts as none.
    pub fn tag(&self) -> Result<Option<String>, JobError> {
        match self.tag.as_deref().filter(|t| !t.is_empty()) {
            Some(tag) => check_tag(tag, "tag").map(|()| Some(tag.to_string())),
            None => Ok(None),
        }
    }
}

/// `GET /tags` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagParams {
    /// At most this many tags (default 100, at most 1000).
    pub limit: Option<usize>,
}

/// `GET /tracked` query parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackedParams {
    /// Only ids greater than this.
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<usize>,
}
