//! One job state change, as the queue records it and a stream sends it.

use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::protocol::{Job, JobId, JobState, Timestamp};

/// What happened to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// CreateJob made it.
    Created,
    /// A GetJob (or `POST /dequeue`) handed it out.
    HandedOut,
    /// UpdateJob changed its data (a worker's progress).
    Progress,
    /// FinishJob: finished for good, or queued for its next repeat.
    Finished,
    /// RetryJob: queued again.
    Retried,
    /// FailJob, or failed by the server (too many lapses, a `retryAfter`
    /// job handed out too often).
    Failed,
    /// Its lease lapsed (or it was held without a lease too long) and it
    /// was queued again or FAILED.
    Lapsed,
    /// CancelJob.
    Cancelled,
    /// DeleteJob, or gone with its parent.
    Deleted,
    /// A parent finished its run with children still pending: it waits.
    Paused,
    /// A paused parent's last pending child ended: it is queued again.
    Resumed,
    /// RequeueJobs, or a failure group retried.
    Requeued,
    /// A hand-out was put back as it was (never delivered, or handed back).
    Returned,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 13] = [
        EventKind::Created,
        EventKind::HandedOut,
        EventKind::Progress,
        EventKind::Finished,
        EventKind::Retried,
        EventKind::Failed,
        EventKind::Lapsed,
        EventKind::Cancelled,
        EventKind::Deleted,
        EventKind::Paused,
        EventKind::Resumed,
        EventKind::Requeued,
        EventKind::Returned,
    ];

    /// The name in a stream's `event:` line.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::HandedOut => "handed_out",
            EventKind::Progress => "progress",
            EventKind::Finished => "finished",
            EventKind::Retried => "retried",
            EventKind::Failed => "failed",
            EventKind::Lapsed => "lapsed",
            EventKind::Cancelled => "cancelled",
            EventKind::Deleted => "deleted",
            EventKind::Paused => "paused",
            EventKind::Resumed => "resumed",
            EventKind::Requeued => "requeued",
            EventKind::Returned => "returned",
        }
    }
}

/// A job state change, before the bus numbers it.
#[derive(Debug, Clone)]
pub struct JobEvent {
    /// What happened.
    pub kind: EventKind,
    /// The job.
    pub job_id: JobId,
    /// The job's name.
    pub name: String,
    /// The state it is in now: a [`JobState`]'s name, or `DELETED`.
    pub state: &'static str,
    /// When, by the queue's clock (the commit's transaction time).
    pub at: Timestamp,
    /// Its hand-outs so far in this occurrence (`attempt` of a hand-out).
    pub attempt: i64,
    /// Further fields: the holder of a hand-out, a report's exit code, …
    pub detail: Map<String, Value>,
    /// How long a handed-out job waited from when it was due, in
    /// milliseconds (for the last hour's counts; not sent on streams).
    pub waited_ms: Option<i64>,
}

impl JobEvent {
    /// `kind` happened to `job`, which is now as given, at `at`.
    pub fn of(kind: EventKind, job: &Job, at: Timestamp) -> Self {
        JobEvent {
            kind,
            job_id: job.id,
            name: job.name.clone(),
            state: job.state.as_str(),
            at,
            attempt: job.attempts,
            detail: Map::new(),
            waited_ms: None,
        }
    }

    /// `job` was deleted at `at`.
    pub fn deleted(job: &Job, at: Timestamp) -> Self {
        JobEvent {
            state: "DELETED",
            ..Self::of(EventKind::Deleted, job, at)
        }
    }

    /// Adds a detail field (a `null` value is left out).
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if !value.is_null() {
            self.detail.insert(key.to_string(), value);
        }
        self
    }

    /// Whether the job reached an end: FINISHED, FAILED, CANCELLED, or
    /// deleted.
    pub fn is_end(&self) -> bool {
        [
            JobState::Finished.as_str(),
            JobState::Failed.as_str(),
            JobState::Cancelled.as_str(),
            "DELETED",
        ]
        .contains(&self.state)
    }
}

/// An event as published: numbered, its stream text made once, by the
/// first stream that sends it.
#[derive(Debug)]
pub struct Published {
    /// The server's sequence number (1 for the server's first event).
    pub seq: u64,
    /// The event.
    pub event: JobEvent,
    /// `id:`, `event:` and `data:` lines, ending in the blank line.
    text: OnceLock<String>,
}

impl Published {
    /// Numbers `event`.
    pub fn new(seq: u64, event: JobEvent) -> Self {
        Published {
            seq,
            event,
            text: OnceLock::new(),
        }
    }

    /// The event's `data:` object.
    pub fn data(&self, id: &str) -> Value {
        let event = &self.event;
        let mut data = Map::new();
        data.insert("id".into(), json!(id));
        data.insert("kind".into(), json!(event.kind.as_str()));
        data.insert("jobID".into(), json!(event.job_id));
        data.insert("name".into(), json!(event.name));
        data.insert("state".into(), json!(event.state));
        data.insert("time".into(), json!(event.at.to_string()));
        data.insert("attempt".into(), json!(event.attempt));
        for (key, value) in &event.detail {
            data.entry(key.clone()).or_insert_with(|| value.clone());
        }
        Value::Object(data)
    }

    /// The event as a server-sent event, `id` being its stream id.
    pub fn text(&self, id: impl FnOnce() -> String) -> &str {
        self.text.get_or_init(|| {
            let id = id();
            // JSON on one line: a `data:` line holds no newline.
            format!(
                "id: {id}\nevent: {}\ndata: {}\n\n",
                self.event.kind.as_str(),
                self.data(&id)
            )
        })
    }
}
