//! The ledger's records: the rows the store keeps of what happened to
//! jobs (attempts, the archive of ended jobs, hourly statistics per job
//! name and per supervisor, the registry of supervisors, failure groups,
//! what a purge removed) and the summaries and histograms inside them.
//! [`crate::server::ledger`] decides what to record and
//! [`crate::server::store`] keeps it; both speak these types, and neither
//! imports them from the other.

pub mod histogram;
pub mod summary;

use serde_json::{Value, json};

use crate::protocol::{Data, JobId, Timestamp, WorkerInfo};
pub use histogram::Histogram;
pub use summary::Summary;

/// How an attempt ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptEnd {
    /// `finished`, `retried`, `failed`, `lease_lost`, `superseded` (handed
    /// out again without a report), `deleted`, or `handed_back` (a streak
    /// of hand-backs for want of the job's worker, see
    /// [`AttemptEnd::hand_backs`]).
    pub outcome: String,
    /// The failure group, for an attempt that did not finish.
    pub failure: Option<String>,
    /// The worker's exit code, when it reported one.
    pub exit_code: Option<i64>,
    /// The signal that ended the worker, when it reported one.
    pub signal: Option<String>,
    /// The tail of the worker's stdout.
    pub stdout: Option<String>,
    /// The tail of the worker's stderr.
    pub stderr: Option<String>,
    /// How many bytes the worker wrote to stdout in all, when reported.
    pub stdout_bytes: Option<u64>,
    /// How many bytes the worker wrote to stderr in all, when reported.
    pub stderr_bytes: Option<u64>,
    /// For `handed_back`: how many hand-backs in a row the row stands for
    /// (the last one ended it); 0 for a run.
    pub hand_backs: u64,
}

/// One hand-out of a job and what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// The job.
    pub job_id: JobId,
    /// Its name at the hand-out.
    pub name: String,
    /// Which run of the current occurrence, from 1.
    pub attempt: i64,
    /// The supervisor that took it, if it said.
    pub worker: Option<String>,
    /// When it was due.
    pub due: Timestamp,
    /// When it was handed out.
    pub started: Timestamp,
    /// When it ended, if it has.
    pub ended: Option<Timestamp>,
    /// How it ended.
    pub end: Option<AttemptEnd>,
}

impl Attempt {
    /// The attempt for the API.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "jobID": self.job_id,
            "name": self.name,
            "attempt": self.attempt,
            "worker": self.worker,
            "due": self.due.to_string(),
            "started": self.started.to_string(),
            "ended": self.ended.map(|t| t.to_string()),
            "waitSecs": (self.started.0 - self.due.0).max(0) as f64 / 1000.0,
            "runSecs": self.ended.map(|e| (e.0 - self.started.0).max(0) as f64 / 1000.0),
            "outcome": self.end.as_ref().map_or("running", |e| e.outcome.as_str()),
        });
        if let Some(end) = &self.end {
            out["failure"] = json!(end.failure);
            out["exitCode"] = json!(end.exit_code);
            out["signal"] = json!(end.signal);
            out["stdout"] = json!(end.stdout);
            out["stderr"] = json!(end.stderr);
            out["stdoutBytes"] = json!(end.stdout_bytes);
            out["stderrBytes"] = json!(end.stderr_bytes);
            if end.hand_backs > 0 {
                out["handBacks"] = json!(end.hand_backs);
            }
        }
        out
    }
}

/// An attempt as it was when it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAttempt {
    /// The job's name at the hand-out.
    pub name: String,
    /// When it was handed out.
    pub started: Timestamp,
    /// The supervisor that took it, if it said.
    pub worker: Option<String>,
}

/// What one event adds to an hour's statistics for a name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsDelta {
    /// Jobs created.
    pub added: u64,
    /// Jobs handed out.
    pub started: u64,
    /// Runs that finished.
    pub finished: u64,
    /// Jobs FAILED.
    pub failed: u64,
    /// Runs retried (a retry report, or a lapsed lease).
    pub retried: u64,
    /// A wait (due → handed out), in ms.
    pub wait_ms: Option<i64>,
    /// A run (handed out → finished), in ms.
    pub run_ms: Option<i64>,
    /// A service time (entered the queue → finished or failed), in ms.
    pub service_ms: Option<i64>,
}

/// An hour's statistics for one name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsRow {
    /// The job name.
    pub name: String,
    /// The hour's start, in ms.
    pub hour: i64,
    /// Jobs created.
    pub added: u64,
    /// Jobs handed out.
    pub started: u64,
    /// Runs that finished.
    pub finished: u64,
    /// Jobs FAILED.
    pub failed: u64,
    /// Runs retried.
    pub retried: u64,
    /// Wait times.
    pub wait: Summary,
    /// Run times.
    pub run: Summary,
    /// Service times.
    pub service: Summary,
    /// Wait-time histogram, until its retention ends.
    pub wait_histogram: Option<Histogram>,
    /// Run-time histogram, until its retention ends.
    pub run_histogram: Option<Histogram>,
}

impl StatsRow {
    /// Adds another row's figures (for longer periods, or several names).
    pub fn merge(&mut self, other: &StatsRow) {
        self.merge_figures(other);
        for (mine, theirs) in [
            (&mut self.wait_histogram, &other.wait_histogram),
            (&mut self.run_histogram, &other.run_histogram),
        ] {
            if let Some(theirs) = theirs {
                mine.get_or_insert_default().merge(theirs);
            }
        }
    }

    /// Adds one event: its counts, its durations to the summaries and
    /// the wait and run histograms.
    pub fn add(&mut self, delta: &StatsDelta) {
        self.added += delta.added;
        self.started += delta.started;
        self.finished += delta.finished;
        self.failed += delta.failed;
        self.retried += delta.retried;
        if let Some(ms) = delta.wait_ms {
            self.wait.add(ms.max(0) as f64);
            self.wait_histogram.get_or_insert_default().add(ms);
        }
        if let Some(ms) = delta.run_ms {
            self.run.add(ms.max(0) as f64);
            self.run_histogram.get_or_insert_default().add(ms);
        }
        if let Some(ms) = delta.service_ms {
            self.service.add(ms.max(0) as f64);
        }
    }

    /// Adds another row's counts and summaries, not its histograms.
    pub fn merge_figures(&mut self, other: &StatsRow) {
        self.added += other.added;
        self.started += other.started;
        self.finished += other.finished;
        self.failed += other.failed;
        self.retried += other.retried;
        self.wait.merge(&other.wait);
        self.run.merge(&other.run);
        self.service.merge(&other.service);
    }

    /// The row as one point of a chart series.
    pub fn to_json(&self) -> Value {
        let with_histogram = |summary: &Summary, histogram: &Option<Histogram>| {
            let mut out = summary.to_json_secs();
            out["histogram"] = histogram.as_ref().map_or(json!([]), Histogram::to_json);
            out
        };
        json!({
            "time": Timestamp(self.hour).to_string(),
            "added": self.added,
            "started": self.started,
            "finished": self.finished,
            "failed": self.failed,
            "retried": self.retried,
            "wait": with_histogram(&self.wait, &self.wait_histogram),
            "run": with_histogram(&self.run, &self.run_histogram),
            "service": self.service.to_json_secs(),
        })
    }
}

/// A job that ended, kept after it left the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedJob {
    /// Its id.
    pub job_id: JobId,
    /// Its name.
    pub name: String,
    /// `FINISHED` or `FAILED`.
    pub state: String,
    /// Its last data.
    pub data: Data,
    /// When it was created.
    pub created: Timestamp,
    /// When it ended.
    pub ended: Timestamp,
    /// Runs of its last occurrence.
    pub attempts: i64,
    /// Its failure group, if it failed.
    pub failure: Option<String>,
}

impl ArchivedJob {
    /// The archived job for the API.
    pub fn to_json(&self) -> Value {
        json!({
            "jobID": self.job_id,
            "name": self.name,
            "state": self.state,
            "data": self.data,
            "created": self.created.to_string(),
            "ended": self.ended.to_string(),
            "attempts": self.attempts,
            "failure": self.failure,
        })
    }
}

/// A supervisor in the registry.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    /// What it said last.
    pub info: WorkerInfo,
    /// When it was first seen.
    pub first_seen: Timestamp,
    /// When it was last seen (a dequeue, a heartbeat or a report).
    pub last_seen: Timestamp,
    /// The jobs it holds now.
    pub jobs: Vec<JobId>,
}

impl WorkerRow {
    /// Until when it was heard from, as of `now`: `now` while it is
    /// active, its last sighting once it is gone (not heard from for more
    /// than `gone_after_ms`); and whether it is gone.
    pub fn heard_until(&self, now: Timestamp, gone_after_ms: i64) -> (Timestamp, bool) {
        if now.0.saturating_sub(self.last_seen.0) > gone_after_ms {
            (self.last_seen.min(now), true)
        } else {
            (now, false)
        }
    }
}

/// A failure group: failed jobs that failed the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureGroup {
    /// Its key, such as `exit:3` or `timeout`.
    pub group: String,
    /// How many FAILED jobs are in it.
    pub count: u64,
    /// The earliest failure.
    pub first: Timestamp,
    /// The latest failure.
    pub last: Timestamp,
}

/// What one event adds to a supervisor's hour.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerDelta {
    /// A reported run's executing time, in ms.
    pub run_ms: Option<i64>,
    /// Busy time, in ms (slot-milliseconds).
    pub busy_ms: i64,
    /// Capacity offered, in ms (slot-milliseconds).
    pub capacity_ms: i64,
}

/// An hour (or a longer period) of one supervisor's statistics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerStatsRow {
    /// The supervisor's id (`HOST-PID`, `HOST-PID/POOL`).
    pub worker: String,
    /// The period's start, in ms.
    pub hour: i64,
    /// Executing times of the runs it reported.
    pub run: Summary,
    /// Busy slot-milliseconds.
    pub busy_ms: i64,
    /// Offered slot-milliseconds.
    pub capacity_ms: i64,
}

impl WorkerStatsRow {
    /// Adds another row's figures (for longer periods, or live additions).
    pub fn merge(&mut self, other: &WorkerStatsRow) {
        self.run.merge(&other.run);
        self.add(&WorkerDelta {
            run_ms: None,
            busy_ms: other.busy_ms,
            capacity_ms: other.capacity_ms,
        });
    }

    /// Adds one event.
    pub fn add(&mut self, delta: &WorkerDelta) {
        if let Some(ms) = delta.run_ms {
            self.run.add(ms.max(0) as f64);
        }
        self.busy_ms = self.busy_ms.saturating_add(delta.busy_ms.max(0));
        self.capacity_ms = self.capacity_ms.saturating_add(delta.capacity_ms.max(0));
    }

    /// Busy time over capacity; `None` when no capacity was offered.
    pub fn utilisation(&self) -> Option<f64> {
        (self.capacity_ms > 0).then(|| self.busy_ms as f64 / self.capacity_ms as f64)
    }

    /// The row as one point of a chart series (`time` is the period's start).
    pub fn to_json(&self) -> Value {
        json!({
            "time": Timestamp(self.hour).to_string(),
            "jobs": self.run.count,
            "run": self.run.to_json_secs(),
            "busySecs": self.busy_ms as f64 / 1000.0,
            "capacitySecs": self.capacity_ms as f64 / 1000.0,
            "utilisation": self.utilisation(),
        })
    }
}

/// What one purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeCounts {
    /// Archived jobs.
    pub archived: u64,
    /// FAILED jobs removed from the queue with their archive entry.
    pub failed: u64,
    /// Attempts.
    pub attempts: u64,
    /// Hourly statistics rows, per name and per supervisor.
    pub stats: u64,
    /// Histograms dropped from rows that stay.
    pub histograms: u64,
    /// Supervisors gone for longer than the history is kept.
    pub workers: u64,
}

impl PurgeCounts {
    /// The counts for the API.
    pub fn to_json(&self) -> Value {
        json!({
            "archived": self.archived,
            "failed": self.failed,
            "attempts": self.attempts,
            "stats": self.stats,
            "histograms": self.histograms,
            "workers": self.workers,
        })
    }

    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        *self == PurgeCounts::default()
    }
}
