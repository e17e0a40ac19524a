//! The JSON shapes of jobs in answers, shared by both wire front-ends:
//! Bedrock's key names, numbers as numbers, `data` inline, keys sorted.

use serde_json::{Map, Value, json};

use super::job::Job;
use super::{Data, JobId, Labels, Timestamp};

/// A job handed out by GetJob(s) or the dequeue endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOut {
    /// The job as it was selected (before the hand-out changed it, as Bedrock
    /// answers).
    pub job: Job,
    /// The parent's data, for a child job.
    pub parent_data: Option<Data>,
    /// Children that finished, for a parent resumed after them.
    pub finished_children: Vec<(JobId, Data)>,
    /// Children that were cancelled, for a parent resumed after them.
    pub cancelled_children: Vec<(JobId, Data)>,
    /// The lease token for reports and heartbeats.
    pub lease_token: String,
    /// When the lease lapses, unless renewed; `None` when held until reported.
    pub lease_expires: Option<Timestamp>,
    /// How long each renewal extends the lease, in milliseconds.
    pub lease_term_ms: Option<i64>,
    /// Which hand-out of this job this is, from 1.
    pub attempt: i64,
}

/// What one hand-out's answer holds besides its name and data (its other
/// fields, the lease), in bytes: a generous bound, so that many small jobs
/// are counted too.
const HANDOUT_FIELDS_BYTES: usize = 512;

/// What each child in a hand-out holds besides its data, in bytes.
const CHILD_FIELDS_BYTES: usize = 48;

impl HandOut {
    /// The bytes this hand-out takes in an answer: its name, its data, its
    /// parent's data and its children's, as JSON text, plus its other
    /// fields. What a GetJobs or dequeue answer is cut by (see
    /// [`super::MAX_PAGE_BYTES`]) and draws on the server's byte budget by.
    pub fn answer_bytes(&self) -> usize {
        let children = self
            .finished_children
            .iter()
            .chain(&self.cancelled_children)
            .map(|(_, data)| json_len(data) + CHILD_FIELDS_BYTES)
            .sum::<usize>();
        HANDOUT_FIELDS_BYTES
            + self.job.name.len()
            + json_len(&self.job.data)
            + self.parent_data.as_ref().map_or(0, json_len)
            + children
    }

    /// The object Bedrock's GetJob returns.
    pub fn bedrock_json(&self) -> Map<String, Value> {
        let job = &self.job;
        let mut out = Map::new();
        out.insert("jobID".into(), json!(job.id));
        out.insert("name".into(), json!(job.name));
        out.insert("data".into(), Value::Object(job.data.clone()));
        out.insert("priority".into(), json!(job.priority.value()));
        out.insert("repeat".into(), json!(job.repeat));
        out.insert("nextRun".into(), json!(job.next_run.to_string()));
        out.insert("lastRun".into(), json!(time_or_empty(job.last_run)));
        out.insert("created".into(), json!(job.created.to_string()));
        out.insert("retryAfter".into(), json!(job.retry_after));
        if job.is_child() {
            out.insert("parentJobID".into(), json!(job.parent_id));
            out.insert(
                "parentData".into(),
                Value::Object(self.parent_data.clone().unwrap_or_default()),
            );
        }
        if !self.finished_children.is_empty() || !self.cancelled_children.is_empty() {
            out.insert(
                "finishedChildJobs".into(),
                children(&self.finished_children),
            );
            out.insert(
                "cancelledChildJobs".into(),
                children(&self.cancelled_children),
            );
        }
        out
    }

    /// The Bedrock object plus the lease: `lease` (the token),
    /// `leaseExpires` (or `""` when held until reported), `leaseMs` (the
    /// term each renewal grants, which for a job with `retryAfter` is its
    /// `retryAfter`, not the term asked for) and `attempt`.
    pub fn leased_json(&self) -> Map<String, Value> {
        let mut out = self.bedrock_json();
        out.insert("lease".into(), json!(self.lease_token));
        out.insert(
            "leaseExpires".into(),
            json!(time_or_empty(self.lease_expires)),
        );
        if let Some(term) = self.lease_term_ms {
            out.insert("leaseMs".into(), json!(term));
        }
        out.insert("attempt".into(), json!(self.attempt));
        out
    }
}

/// The object QueryJob returns: the job with its `state`, plus `parentJobID`
/// and, while it is held, `leaseExpires`, `attempts` and `lapses`.
pub fn query_json(job: &Job) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("jobID".into(), json!(job.id));
    out.insert("name".into(), json!(job.name));
    out.insert("state".into(), json!(job.state.as_str()));
    out.insert("data".into(), Value::Object(job.data.clone()));
    out.insert("priority".into(), json!(job.priority.value()));
    out.insert("repeat".into(), json!(job.repeat));
    out.insert("nextRun".into(), json!(job.next_run.to_string()));
    out.insert("lastRun".into(), json!(time_or_empty(job.last_run)));
    out.insert("created".into(), json!(job.created.to_string()));
    out.insert("retryAfter".into(), json!(job.retry_after));
    out.insert("parentJobID".into(), json!(job.parent_id));
    out.insert("attempts".into(), json!(job.attempts));
    out.insert("lapses".into(), json!(job.lapses));
    out.insert(
        "leaseExpires".into(),
        json!(time_or_empty(job.lease.as_ref().and_then(|l| l.expires))),
    );
    out
}

/// QueryJob's object as the HTTP API shows a job: with its `tags` and
/// whether it is `tracked`, always.
pub fn labelled_json(job: &Job, labels: &Labels) -> Map<String, Value> {
    let mut out = query_json(job);
    out.insert("tags".into(), json!(labels.tags));
    out.insert("tracked".into(), json!(labels.tracked));
    out
}

/// Adds a job's labels to an object the Bedrock port answers with: `tags`
/// only when it has some and `tracked` only when it is, so that a Bedrock
/// client that uses neither sees Bedrock's answer unchanged.
pub fn add_bedrock_labels(out: &mut Map<String, Value>, labels: &Labels) {
    if !labels.tags.is_empty() {
        out.insert("tags".into(), json!(labels.tags));
    }
    if labels.tracked {
        out.insert("tracked".into(), json!(true));
    }
}

/// The length of `data`'s JSON text, counted without building it.
pub fn json_len<T: serde::Serialize + ?Sized>(data: &T) -> usize {
    /// A writer that only counts.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing JSON values to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, data);
    count.0
}

fn children(list: &[(JobId, Data)]) -> Value {
    Value::Array(
        list.iter()
            .map(|(id, data)| json!({"jobID": id, "data": Value::Object(data.clone())}))
            .collect(),
    )
}

fn time_or_empty(time: Option<Timestamp>) -> String {
    time.map(|t| t.to_string()).unwrap_or_default()
}
