//! A job's identity, state and priority.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::error::JobError;

/// A job's identifier: a positive 64-bit integer.
pub type JobId = i64;

/// The eight states of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Waiting for its `nextRun`; handed out once due.
    Queued,
    /// Handed out to a worker and not yet reported.
    Running,
    /// Handed out with a `retryAfter`: it is handed out again if no report
    /// arrives before its `nextRun`.
    Runqueued,
    /// A parent waiting for its children, or a child waiting for its parent.
    Paused,
    /// A child job that finished; kept until its parent finishes.
    Finished,
    /// Failed; kept until deleted.
    Failed,
    /// A child job that was cancelled; kept until its parent finishes.
    Cancelled,
    /// Waiting for the jobs it depends on to finish; never handed out until
    /// the last of them has (then QUEUED).
    Depends,
}

impl JobState {
    /// Every state, in the order the spec lists them.
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Running,
        JobState::Runqueued,
        JobState::Paused,
        JobState::Finished,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Depends,
    ];

    /// The state's name as stored and shown: `QUEUED`, `RUNNING`, …
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "QUEUED",
            JobState::Running => "RUNNING",
            JobState::Runqueued => "RUNQUEUED",
            JobState::Paused => "PAUSED",
            JobState::Finished => "FINISHED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Depends => "DEPENDS",
        }
    }

    /// Whether a job in this state may be handed out once due.
    pub fn is_ready_state(self) -> bool {
        matches!(self, JobState::Queued | JobState::Runqueued)
    }

    /// Whether a job in this state is held by a worker (may be finished,
    /// retried or failed).
    pub fn is_held(self) -> bool {
        matches!(self, JobState::Running | JobState::Runqueued)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown job state {s:?}: expected one of QUEUED, RUNNING, RUNQUEUED, PAUSED, FINISHED, FAILED, CANCELLED, DEPENDS")
            })
    }
}

/// One of the six priorities Bedrock allows; higher runs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Priority(i64);

impl Priority {
    /// The allowed values, highest first.
    pub const ALL: [i64; 6] = [1000, 850, 750, 500, 250, 0];

    /// The priority a job gets when none is given.
    pub const DEFAULT: Priority = Priority(500);

    /// A priority from its number, refused unless it is one of [`Priority::ALL`].
    pub fn new(value: i64) -> Result<Self, JobError> {
        if Self::ALL.contains(&value) {
            Ok(Priority(value))
        } else {
            Err(JobError::InvalidPriority)
        }
    }

    /// A priority from text as it arrives in a header or flag.
    pub fn parse(text: &str) -> Result<Self, JobError> {
        text.trim()
            .parse::<i64>()
            .map_err(|_| JobError::InvalidPriority)
            .and_then(Self::new)
    }

    /// The number.
    pub fn value(self) -> i64 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::DEFAULT
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = i64::deserialize(deserializer)?;
        Priority::new(value).map_err(|_| {
            serde::de::Error::custom(format!(
                "invalid priority {value}: expected one of 0, 250, 500, 750, 850, 1000"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_six_priorities_are_accepted() {
        for p in Priority::ALL {
            assert_eq!(Priority::new(p).unwrap().value(), p);
        }
        for bad in [-1, 1, 100, 501, 999, 1001, i64::MAX] {
            assert_eq!(Priority::new(bad), Err(JobError::InvalidPriority));
        }
        assert_eq!(Priority::parse("abc"), Err(JobError::InvalidPriority));
        assert_eq!(Priority::parse(" 850 ").unwrap().value(), 850);
    }

    #[test]
    fn states_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!("DONE".parse::<JobState>().is_err());
    }
}

/// A job as the server holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Its name.
    pub name: String,
    /// Its state.
    pub state: JobState,
    /// Its data, a JSON object.
    pub data: super::Data,
    /// Its priority.
    pub priority: Priority,
    /// When it was created (whole seconds).
    pub created: super::Timestamp,
    /// When it may next be handed out.
    pub next_run: super::Timestamp,
    /// When it was last handed out.
    pub last_run: Option<super::Timestamp>,
    /// Its repeat description, upper-cased; empty when it does not repeat.
    pub repeat: String,
    /// Its `retryAfter` modifiers as given; empty when none.
    pub retry_after: String,
    /// Its parent, or 0.
    pub parent_id: JobId,
    /// `nextRun` as it was at the last hand-out: the base of a `SCHEDULED`
    /// repeat even after a `retryAfter` moved `nextRun`.
    pub scheduled_run: Option<super::Timestamp>,
    /// The current lease, while the job is held.
    pub lease: Option<Lease>,
    /// How many times it has been handed out.
    pub attempts: i64,
    /// How many leases on it have lapsed.
    pub lapses: i64,
}

/// The lease of a held job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The token a holder shows with its reports and heartbeats.
    pub token: String,
    /// When the lease lapses unless renewed; `None` for a Bedrock hand-out
    /// that is held until reported.
    pub expires: Option<super::Timestamp>,
    /// How long each renewal extends it by, in milliseconds.
    pub term_ms: Option<i64>,
}

impl Job {
    /// Whether the job is a child of another.
    pub fn is_child(&self) -> bool {
        self.parent_id != 0
    }

    /// Whether a holder has the job at `now`: RUNNING or RUNQUEUED under a
    /// lease that has not lapsed (one held until reported never does).
    /// Such a job must not be handed out again: it would run twice at once.
    pub fn is_held_at(&self, now: super::Timestamp) -> bool {
        self.state.is_held()
            && self
                .lease
                .as_ref()
                .is_none_or(|lease| lease.expires.is_none_or(|expires| expires > now))
    }
}
