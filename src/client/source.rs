//! "A job source": what the supervisor needs from a job server, whatever it
//! speaks. Take due jobs (waiting for them), renew leases, forward progress,
//! and report outcomes. Implemented over HTTP ([`super::HttpSource`]), over
//! Bedrock's protocol ([`super::BedrockSource`]), and in-process
//! ([`super::LocalSource`]) for the embedded server.

use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

use crate::future::BoxFuture;
use crate::protocol::{CreateJob, Data, JobId, RunFacts, WorkerInfo};

/// A job handed to this supervisor.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedJob {
    /// Its id.
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its data.
    pub data: Data,
    /// The whole object the server handed out: what the worker reads on
    /// stdin.
    pub handout: Map<String, Value>,
    /// The lease token, when the server gives one.
    pub lease: Option<String>,
    /// The term the server granted the lease for (each renewal extends it
    /// by this much), when it says.
    pub lease_term: Option<std::time::Duration>,
    /// Which hand-out of the job this is, from 1.
    pub attempt: i64,
}

impl LeasedJob {
    /// Reads a hand-out object (GetJob's answer, with or without the lease
    /// fields of the HTTP dequeue).
    pub fn from_handout(handout: Map<String, Value>) -> Result<Self, SourceError> {
        let id = handout
            .get("jobID")
            .and_then(|v| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
            .filter(|&id| id > 0)
            .ok_or_else(|| {
                SourceError::Protocol(format!(
                    "hand-out without a jobID: {}",
                    Value::Object(handout.clone())
                ))
            })?;
        let name = handout
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // Data the worker cannot be given whole is refused rather than run
        // as empty: a report would then replace the job's real data.
        let data = match handout.get("data") {
            Some(Value::Object(data)) => data.clone(),
            Some(Value::String(text)) if text.trim().is_empty() => Data::new(),
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| {
                SourceError::Protocol(format!("job {id}'s data is not a JSON object: {text:?}"))
            })?,
            None | Some(Value::Null) => Data::new(),
            Some(other) => {
                return Err(SourceError::Protocol(format!(
                    "job {id}'s data is not a JSON object: {other}"
                )));
            }
        };
        let lease = handout
            .get("lease")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        let attempt = handout.get("attempt").and_then(Value::as_i64).unwrap_or(1);
        let lease_term = handout
            .get("leaseMs")
            .and_then(Value::as_u64)
            .filter(|&ms| ms > 0)
            .map(std::time::Duration::from_millis);
        Ok(LeasedJob {
            id,
            name,
            data,
            handout,
            lease,
            lease_term,
            attempt,
        })
    }
}

/// A hand-out this client could not read.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    /// Its job, when the hand-out names one.
    pub id: Option<JobId>,
    /// Its lease token, when it has one.
    pub lease: Option<String>,
    /// What is wrong with it.
    pub reason: String,
}

/// Reads each hand-out of a batch on its own, so that one the client
/// cannot read does not cost the others: the readable ones, and the rest
/// with the reason (see [`refuse_unreadable`]).
pub fn read_handouts(
    handouts: impl IntoIterator<Item = Value>,
) -> (Vec<LeasedJob>, Vec<Unreadable>) {
    let mut jobs = Vec::new();
    let mut unreadable = Vec::new();
    for handout in handouts {
        let Value::Object(map) = handout else {
            unreadable.push(Unreadable {
                id: None,
                lease: None,
                reason: format!("a hand-out is not a JSON object: {handout}"),
            });
            continue;
        };
        let id = map.get("jobID").and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        });
        let lease = map
            .get("lease")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        match LeasedJob::from_handout(map) {
            Ok(job) => jobs.push(job),
            Err(error) => unreadable.push(Unreadable {
                id: id.filter(|&id| id > 0),
                lease,
                reason: error.to_string(),
            }),
        }
    }
    (jobs, unreadable)
}

/// Reports FAILED, under its lease, each hand-out the client could not
/// read (handing it back would only hand it out again), with the reason in
/// the log and in the run's history. One that names no job cannot be
/// reported; it returns when its lease lapses.
pub async fn refuse_unreadable<S: JobSource + ?Sized>(source: &S, unreadable: Vec<Unreadable>) {
    for bad in unreadable {
        let Some(id) = bad.id else {
            tracing::error!(reason = %bad.reason, "the job server handed out something this supervisor cannot read, naming no job; it returns when its lease lapses");
            continue;
        };
        tracing::error!(job_id = id, reason = %bad.reason, "cannot read this hand-out; reporting the job FAILED");
        let run = RunFacts {
            exit_code: None,
            signal: None,
            stdout: None,
            stderr: Some(format!(
                "not run: the supervisor cannot read its hand-out: {}",
                bad.reason
            )),
            ..RunFacts::default()
        };
        let report = Report::Fail { data: None };
        if let Err(error) = source
            .report_run(id, bad.lease.as_deref(), &report, Some(&run))
            .await
        {
            tracing::warn!(job_id = id, %error, "could not report an unreadable hand-out FAILED; it returns when its lease lapses");
        }
    }
}

/// Hands a job back with RetryJob at once under its lease, its repeat
/// ignored: the put-back where the server has no exact one. Unlike a
/// hand-back, it counts the attempt, and a resumed parent's finished
/// children are deleted with it.
pub async fn hand_back_by_retry<S: JobSource + ?Sized>(
    source: &S,
    job: &LeasedJob,
) -> Result<(), SourceError> {
    let back = Report::Retry {
        delay_secs: 0,
        ignore_repeat: true,
        data: None,
        name: None,
        next_run: None,
    };
    source.report(job.id, job.lease.as_deref(), &back).await
}

/// How a job ended, as reported to the server.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Report {
    /// FinishJob, with new data when the worker gave some.
    Finish {
        /// The new data.
        data: Option<Data>,
    },
    /// RetryJob after `delay_secs`.
    Retry {
        /// Seconds to wait.
        delay_secs: i64,
        /// Retry after the delay even if the job repeats (otherwise a
        /// repeating job moves on to its next occurrence).
        #[serde(default)]
        ignore_repeat: bool,
        /// The new data.
        data: Option<Data>,
        /// A new name (the worker asked for it, as BWM's
        /// `RetryableException` can).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// An explicit time for the retry, as the protocol writes it; it
        /// wins over the delay.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_run: Option<String>,
    },
    /// FailJob.
    Fail {
        /// The new data.
        data: Option<Data>,
    },
}

impl Report {
    /// `finish`, `retry` or `fail`.
    pub fn kind(&self) -> &'static str {
        match self {
            Report::Finish { .. } => "finish",
            Report::Retry { .. } => "retry",
            Report::Fail { .. } => "fail",
        }
    }
}

/// Why a call to the job source did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceError {
    /// The server could not be reached or failed; worth trying again later.
    #[error("job server unavailable: {0}")]
    Unavailable(String),
    /// The lease was lost: the job is no longer ours. Stop and discard.
    #[error("lease lost on job {0}")]
    LeaseLost(JobId),
    /// The job does not exist (any more).
    #[error("no such job on the job server: {0}")]
    NotFound(String),
    /// The server refused the call for good (the job is not held, a bad
    /// parameter, …).
    #[error("job server refused: {0}")]
    Refused(String),
    /// The server answered something this client cannot read.
    #[error("job server answered something unreadable: {0}")]
    Protocol(String),
}

impl SourceError {
    /// Whether trying the same call again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Unavailable(_))
    }
}

/// Whether a source waits for jobs or has to be polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchMode {
    /// The server holds the request until a job is due.
    Blocking,
    /// The server answers at once; the caller polls with backoff.
    Polling,
}

/// A job server as the supervisor sees it.
pub trait JobSource: Send + Sync {
    /// Takes up to `count` due jobs matching `pattern`, waiting up to `wait`
    /// for one, each leased for `lease` where the server supports leases.
    /// Dropping the future before it resolves must not strand jobs.
    fn get_jobs<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>>;

    /// As [`JobSource::get_jobs`], saying which supervisor asks, so that
    /// the server can keep its worker registry. Servers that keep none
    /// (Bedrock) are asked as by `get_jobs`.
    fn get_jobs_as<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: &'a WorkerInfo,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        let _ = worker;
        self.get_jobs(pattern, count, wait, lease)
    }

    /// Tells the server the supervisor is alive without asking for jobs
    /// (while its gate is closed). Does nothing where the server keeps no
    /// worker registry.
    fn announce<'a>(&'a self, worker: &'a WorkerInfo) -> BoxFuture<'a, Result<(), SourceError>> {
        let _ = worker;
        Box::pin(async { Ok(()) })
    }

    /// Renews a job's lease. `Ok(())` also when the server has no leases.
    fn heartbeat<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>>;

    /// Replaces a running job's data (progress).
    fn update<'a>(
        &'a self,
        job: &'a LeasedJob,
        data: &'a Data,
    ) -> BoxFuture<'a, Result<(), SourceError>>;

    /// Reports how a job ended, under the lease it was handed out with.
    fn report<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), SourceError>>;

    /// As [`JobSource::report`], with what the supervisor saw of the run
    /// (exit code or signal, output tails) for the server's history.
    /// Servers that keep no history are told as by `report`.
    fn report_run<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
        run: Option<&'a RunFacts>,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        let _ = run;
        self.report(id, lease, report)
    }

    /// Offers, before the job's slot is freed, the report that
    /// [`JobSource::report_run`] will then be asked to send, so that it may
    /// go with the next fetch. Sources that cannot carry reports on a
    /// fetch ignore it.
    fn offer_report(
        &self,
        id: JobId,
        lease: Option<&str>,
        report: &Report,
        run: Option<&RunFacts>,
    ) {
        let _ = (id, lease, report, run);
    }

    /// No fetch follows for now (the gate closed for anything but a full
    /// pool or its ramp's ceiling, the supervisor is quiet, backs off or
    /// drains): reports offered by [`JobSource::offer_report`], and those
    /// offered until the next fetch, go by themselves.
    fn withdraw_offers(&self) {}

    /// Hands back, under its lease, a job this supervisor never started (it
    /// arrived after the supervisor stopped taking jobs): the server puts it
    /// back exactly as it was before the hand-out, counting no attempt. A
    /// server without that command (a real Bedrock, an older jobmgr) is
    /// sent [`hand_back_by_retry`] instead.
    fn hand_back<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(hand_back_by_retry(self, job))
    }

    /// Creates a job (used to declare recurring jobs from configuration).
    fn create<'a>(&'a self, job: &'a CreateJob) -> BoxFuture<'a, Result<JobId, SourceError>> {
        let _ = job;
        Box::pin(async {
            Err(SourceError::Refused(
                "this job source cannot create jobs".into(),
            ))
        })
    }

    /// Whether a job exists.
    fn exists<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<bool, SourceError>> {
        let _ = id;
        Box::pin(async {
            Err(SourceError::Refused(
                "this job source cannot query jobs".into(),
            ))
        })
    }

    /// Deletes a job.
    fn delete<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<(), SourceError>> {
        let _ = id;
        Box::pin(async {
            Err(SourceError::Refused(
                "this job source cannot delete jobs".into(),
            ))
        })
    }

    /// Whether [`JobSource::hand_back`] puts a job back exactly, counting
    /// no attempt, so that jobs may be held ahead (`--fetch-ahead`): true
    /// for jobmgr's HTTP API and in-process, false over Bedrock's protocol,
    /// where a real Bedrock is sent RetryJob (which deletes a resumed
    /// parent's finished children).
    fn hands_back_exactly(&self) -> bool {
        false
    }

    /// Whether a fetch in flight can be cancelled without stranding jobs:
    /// true where cancelling it puts back whatever it had taken (in-process,
    /// where the queue does). Over a network it is false: an answer already
    /// on the wire would be lost with the fetch, so the supervisor lets an
    /// abandoned fetch end and hands its jobs back.
    fn fetch_is_cancel_safe(&self) -> bool {
        false
    }

    /// Whether the last [`JobSource::get_jobs`] showed the server blocking or
    /// answering at once.
    fn fetch_mode(&self) -> FetchMode {
        FetchMode::Blocking
    }

    /// A short description for logs, e.g. `http://127.0.0.1:8889`.
    fn describe(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_unreadable_handout_leaves_the_rest_of_its_batch_readable() {
        let batch = vec![
            json!({"jobID": 1, "name": "A", "data": {"n": 1}, "lease": "t1"}),
            json!({"jobID": 2, "name": "B", "data": [1, 2], "lease": "t2"}),
            json!({"jobID": "x", "name": "C", "data": {}}),
            json!("not an object"),
            json!({"jobID": "4", "name": "D", "data": "{\"n\":4}"}),
            json!({"jobID": 5, "name": "E", "data": "{not json"}),
        ];
        let (jobs, unreadable) = read_handouts(batch);
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids, vec![1, 4]);
        assert_eq!(jobs[1].data["n"], 4);
        let named: Vec<(Option<JobId>, Option<&str>)> = unreadable
            .iter()
            .map(|u| (u.id, u.lease.as_deref()))
            .collect();
        assert_eq!(
            named,
            vec![
                (Some(2), Some("t2")),
                (None, None),
                (None, None),
                (Some(5), None)
            ]
        );
        assert!(
            unreadable[0].reason.contains("not a JSON object"),
            "{unreadable:?}"
        );
    }
}
