//! The errors a job command can answer with. Each carries Bedrock's status
//! number and exact message, and a stable machine-readable code for the HTTP
//! API.

use thiserror::Error;

use super::job::{JobId, JobState};

/// Why a job command was refused. The `Display` text is Bedrock's message,
/// without the status number.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JobError {
    /// A required parameter is absent or empty.
    #[error("Missing {0}")]
    Missing(&'static str),
    /// A parameter is present but not in the form required.
    #[error("Malformed {0}")]
    Malformed(&'static str),
    /// A parameter holds a control character (a newline, tab, escape, …;
    /// see [`super::text::is_control`]), which could forge log lines.
    #[error("Malformed {0}: control characters (newline, tab, escape, ...) are not allowed")]
    ControlCharacter(&'static str),
    /// A tag list with a bad tag, or too many (the text says which and
    /// what a tag may be; see [`super::tags`]).
    #[error("Malformed tags: {0}")]
    BadTags(String),
    /// A change of tags of a job that has ended: only the archive has it,
    /// and it keeps no tags.
    #[error("Job {0} has ended and is only in the archive, which keeps no tags or tracking")]
    JobEnded(JobId),
    /// A priority outside 0, 250, 500, 750, 850, 1000.
    #[error("Invalid priority value")]
    InvalidPriority,
    /// `data` is not a JSON object.
    #[error("Data is not a valid JSON Object")]
    DataNotObject,
    /// `data` is larger than the limit.
    #[error("Data is larger than 1 MiB")]
    DataTooLarge,
    /// `repeat` is not a valid repeat description.
    #[error("Malformed repeat")]
    MalformedRepeat,
    /// `retryAfter` is not a valid SQLite date modifier.
    #[error("Malformed retryAfter")]
    MalformedRetryAfter,
    /// GetJob was sent with `numResults`.
    #[error("Cannot use numResults with GetJob; try GetJobs")]
    NumResultsWithGetJob,
    /// RetryJob with a negative delay.
    #[error("Must specify a non-negative delay when retrying")]
    NegativeDelay,
    /// CreateJobs with a `jobs` value that is not a JSON array of objects.
    #[error("Invalid JSON")]
    InvalidJson,
    /// Nothing due matches the request.
    #[error("No job found")]
    NoJobFound,
    /// No job has this id.
    #[error("No job with this jobID")]
    NoSuchJob,
    /// CreateJob with a `parentJobID` that does not exist.
    #[error("parentJobID does not exist")]
    ParentMissing,
    /// A unique child job already exists under another parent.
    #[error("Trying to create a child that already exists, but it is tied to a different parent")]
    ChildOfOtherParent,
    /// CancelJob on a job that has children.
    #[error("Invalid jobID - Cannot cancel a job with children")]
    CancelParent,
    /// CancelJob on a job that has no parent.
    #[error("Invalid jobID - Cannot cancel a job without a parent")]
    CancelOrphan,
    /// CreateJob with a parent that is not running or paused.
    #[error("Can only create child job when parent is RUNNING, RUNQUEUED or PAUSED")]
    ParentNotRunning,
    /// CreateJob with a parent that is itself a child.
    #[error("Cannot create grandchildren")]
    Grandchild,
    /// FinishJob or RetryJob on a job that is not held.
    #[error("Can only retry/finish RUNNING and RUNQUEUED jobs")]
    NotHeldForFinish,
    /// FinishJob or RetryJob on a child whose parent is not paused.
    #[error("Can only retry/finish child job when parent is PAUSED")]
    ParentNotPaused,
    /// FailJob on a job that is not held.
    #[error("Can only fail RUNNING or RUNQUEUED jobs")]
    NotHeldForFail,
    /// HandBackJob on a job that is not held.
    #[error("Can only hand back RUNNING or RUNQUEUED jobs")]
    NotHeldForHandBack,
    /// HandBackJob on a hand-out the server kept no copy of the job from
    /// before (one made before an upgrade to a server that keeps it).
    #[error(
        "Cannot hand back job {0}: the server kept no copy of it from before this hand-out; retry it instead"
    )]
    HandOutNotKept(JobId),
    /// RequeueJobs naming jobs that are held (see
    /// [`super::Job::is_held_at`]): queued again, each would run twice at
    /// once. Nothing was requeued.
    #[error(
        "Cannot requeue {}: a worker holds it under a lease that still holds, so it would run twice at once; nothing was requeued: wait for its report, or end it first (FailJob; a jobmgr supervisor stops the worker when it next renews the lease), then requeue it",
        held_jobs(.0)
    )]
    RequeueHeld(Vec<JobId>),
    /// UpdateJob moving a held `retryAfter` job's nextRun (or the repeat
    /// that sets it) earlier than when its holder's hand-out ends: the job
    /// would be handed out again while it runs.
    #[error(
        "Cannot move job {0}'s nextRun earlier: a worker holds it (a retryAfter hand-out) until then, so it would run twice at once; nothing was updated: set a later nextRun, or wait for its report"
    )]
    NextRunHeld(JobId),
    /// DeleteJob on a running job.
    #[error("Can't delete a RUNNING job")]
    DeleteRunning,
    /// DeleteJob on a parent waiting for its children.
    #[error("Can't delete a parent jobs with children running")]
    DeletePaused,
    /// FinishJob on a parent that still has children that neither finished
    /// nor were cancelled (a FAILED child must be cancelled first).
    #[error("Failed to delete a job with outstanding children")]
    OutstandingChildren,
    /// A report or heartbeat carrying a lease token that is no longer the
    /// job's: the lease lapsed and the job was put back or handed to someone
    /// else. The holder must stop and discard its result.
    #[error(
        "Lease lost: job {0} is no longer held under this lease; stop the worker and discard its result"
    )]
    LeaseLost(JobId),
    /// A create with an idempotency key first used for a different
    /// request.
    #[error(
        "Idempotency key {0} was first used with a different request; send a new key with a new request"
    )]
    IdempotencyKeyReused(String),
    /// A list of dependencies naming more than [`super::MAX_DEPENDS`]
    /// distinct jobs (duplicates count once).
    #[error(
        "Malformed {0}: at most 100 jobs; a job that must wait for more can wait for one job that waits for them"
    )]
    TooManyDepends(&'static str),
    /// A dependency that is neither a job nor a finished job in the archive.
    #[error(
        "No job with jobID {0} to depend on: a job can only depend on jobs that exist (or that finished and are still in the archive)"
    )]
    DependencyMissing(JobId),
    /// A dependency that ended without finishing and was deleted: it can
    /// never finish.
    #[error("Job {0} ended {1} and was deleted: it can never finish, so nothing can depend on it")]
    DependencyEnded(JobId, String),
    /// A dependency on the job itself or on a job created after it.
    #[error(
        "Job {job} cannot depend on job {on}: a job may only depend on jobs created before it (a lower jobID), so that dependencies never form a cycle"
    )]
    DependencyNotEarlier {
        /// The dependent job.
        job: JobId,
        /// The job it was to depend on.
        on: JobId,
    },
    /// A change of dependencies in a state that does not allow it.
    #[error("Can only change the dependencies of QUEUED or DEPENDS jobs; job {0} is {1}")]
    DependsNotAllowed(JobId, JobState),
    /// Dependencies for a child job.
    #[error(
        "A child job cannot have dependencies: its parent orders it; give the parent the dependencies instead"
    )]
    ChildDepends,
    /// A Bedrock method this server does not know.
    #[error("Unrecognized command")]
    UnrecognizedCommand,
    /// The store failed; nothing was changed.
    #[error("Job store failed: {0}")]
    Store(String),
    /// The store cannot be reached (its database is down or cut off);
    /// nothing was changed.
    #[error(
        "Job store unavailable: {0}; nothing was changed: retry shortly or against another server"
    )]
    StoreUnavailable(String),
    /// The store's transaction met another server's in a cycle of row
    /// locks (a deadlock) or a serialization failure, and was rolled back:
    /// nothing was changed. The queue runs the command again by itself a
    /// few times before it answers this.
    #[error("Job store conflict with another server: {0}; nothing was changed: retry shortly")]
    StoreConflict(String),
    /// The store's connection was lost while it committed: the command may
    /// or may not have been done.
    #[error(
        "Job store outcome unknown: the connection to the job store was lost while committing; the command may have been done: look before sending it again (a create with an idempotency key is safe to resend)"
    )]
    StoreOutcomeUnknown,
    /// A new throttle past the most a store keeps.
    #[error(
        "There are {0} throttles already, the most a server keeps; delete one (jobmgr throttle list) or widen an existing GLOB"
    )]
    TooManyThrottles(usize),
    /// A throttle's GLOB or cap that cannot be taken, and why.
    #[error("Malformed throttle: {0}")]
    BadThrottle(String),
    /// No throttle has this GLOB.
    #[error("No such throttle; GetThrottles lists those there are")]
    NoSuchThrottle,
    /// The server holds as many bytes for its clients as its byte budget
    /// allows, and not even one job's answer fits; nothing was handed out.
    #[error(
        "Server busy: it holds as many answer bytes as its budget allows (--http-body-budget); nothing was handed out, retry shortly"
    )]
    ServerBusy,
    /// The server is shutting down and takes no more commands.
    #[error("Server is shutting down; retry against another server or after restart")]
    ShuttingDown,
}

impl JobError {
    /// Bedrock's status number for this error.
    pub fn status(&self) -> u16 {
        use JobError::*;
        match self {
            InvalidJson => 401,
            Missing(_)
            | Malformed(_)
            | ControlCharacter(_)
            | BadTags(_)
            | InvalidPriority
            | DataNotObject
            | DataTooLarge
            | MalformedRepeat
            | MalformedRetryAfter
            | NumResultsWithGetJob
            | NegativeDelay
            | TooManyThrottles(_)
            | BadThrottle(_)
            | TooManyDepends(_)
            | DependencyNotEarlier { .. } => 402,
            NoJobFound | NoSuchJob | JobEnded(_) | ParentMissing | ChildOfOtherParent
            | CancelParent | CancelOrphan | DependencyMissing(_) | DependencyEnded(..)
            | NoSuchThrottle => 404,
            ParentNotRunning
            | Grandchild
            | NotHeldForFinish
            | ParentNotPaused
            | NotHeldForFail
            | NotHeldForHandBack
            | HandOutNotKept(_)
            | RequeueHeld(_)
            | NextRunHeld(_)
            | DeleteRunning
            | DeletePaused
            | OutstandingChildren
            | DependsNotAllowed(..)
            | ChildDepends => 405,
            LeaseLost(_) | IdempotencyKeyReused(_) => 409,
            UnrecognizedCommand => 430,
            Store(_) | StoreOutcomeUnknown => 502,
            StoreUnavailable(_) | StoreConflict(_) | ServerBusy | ShuttingDown => 503,
        }
    }

    /// A stable snake_case code for this error, for programs to match on.
    pub fn code(&self) -> String {
        use JobError::*;
        match self {
            Missing(param) => format!("missing_{}", snake(param)),
            Malformed(param) | ControlCharacter(param) => format!("malformed_{}", snake(param)),
            other => {
                let code = match other {
                    BadTags(_) => "malformed_tags",
                    JobEnded(_) => "job_ended",
                    InvalidPriority => "invalid_priority",
                    DataNotObject => "data_not_object",
                    DataTooLarge => "data_too_large",
                    MalformedRepeat => "malformed_repeat",
                    MalformedRetryAfter => "malformed_retry_after",
                    NumResultsWithGetJob => "num_results_with_get_job",
                    NegativeDelay => "negative_delay",
                    InvalidJson => "invalid_json",
                    NoJobFound => "no_job_found",
                    NoSuchJob => "no_such_job",
                    ParentMissing => "parent_missing",
                    ChildOfOtherParent => "child_of_other_parent",
                    CancelParent => "cancel_parent",
                    CancelOrphan => "cancel_orphan",
                    ParentNotRunning => "parent_not_running",
                    Grandchild => "grandchild",
                    NotHeldForFinish => "not_held_for_finish",
                    ParentNotPaused => "parent_not_paused",
                    NotHeldForFail => "not_held_for_fail",
                    NotHeldForHandBack => "not_held_for_hand_back",
                    HandOutNotKept(_) => "hand_out_not_kept",
                    RequeueHeld(_) => "requeue_held",
                    NextRunHeld(_) => "next_run_held",
                    DeleteRunning => "delete_running",
                    DeletePaused => "delete_paused",
                    OutstandingChildren => "outstanding_children",
                    LeaseLost(_) => "lease_lost",
                    IdempotencyKeyReused(_) => "idempotency_key_reused",
                    TooManyDepends(_) => "too_many_depends",
                    DependencyMissing(_) => "dependency_missing",
                    DependencyEnded(..) => "dependency_ended",
                    DependencyNotEarlier { .. } => "dependency_not_earlier",
                    DependsNotAllowed(..) => "depends_not_allowed",
                    ChildDepends => "child_depends",
                    UnrecognizedCommand => "unrecognized_command",
                    Store(_) => "store_failed",
                    StoreUnavailable(_) | StoreConflict(_) => "store_unavailable",
                    StoreOutcomeUnknown => "store_outcome_unknown",
                    ShuttingDown => "shutting_down",
                    ServerBusy => "server_busy",
                    TooManyThrottles(_) => "too_many_throttles",
                    BadThrottle(_) => "malformed_throttle",
                    NoSuchThrottle => "no_such_throttle",
                    Missing(_) | Malformed(_) | ControlCharacter(_) => {
                        unreachable!("handled above")
                    }
                };
                code.to_string()
            }
        }
    }

    /// The Bedrock status line without the line ending, e.g. `402 Missing name`.
    pub fn status_line(&self) -> String {
        format!("{} {}", self.status(), self)
    }
}

/// The most held jobs a refused RequeueJobs names.
const HELD_NAMED: usize = 20;

/// `job 12`, `jobs 12, 13`, or the first [`HELD_NAMED`] and how many more.
fn held_jobs(ids: &[JobId]) -> String {
    let named: Vec<String> = ids.iter().take(HELD_NAMED).map(JobId::to_string).collect();
    let mut text = match ids.len() {
        1 => format!("job {}", named.join(", ")),
        _ => format!("jobs {}", named.join(", ")),
    };
    if ids.len() > HELD_NAMED {
        text.push_str(&format!(" and {} more", ids.len() - HELD_NAMED));
    }
    text
}

/// `parentJobID` → `parent_job_id`, `jobIDs` → `job_ids`: a word starts
/// wherever a capital follows a small letter.
fn snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_match_bedrock() {
        assert_eq!(JobError::Missing("name").status_line(), "402 Missing name");
        assert_eq!(
            JobError::Malformed("jobID").status_line(),
            "402 Malformed jobID"
        );
        assert_eq!(JobError::NoJobFound.status_line(), "404 No job found");
        assert_eq!(
            JobError::ControlCharacter("name").status_line(),
            "402 Malformed name: control characters (newline, tab, escape, ...) are not allowed"
        );
        assert_eq!(JobError::ControlCharacter("name").code(), "malformed_name");
        assert_eq!(
            JobError::NotHeldForFinish.status_line(),
            "405 Can only retry/finish RUNNING and RUNQUEUED jobs"
        );
        assert_eq!(JobError::InvalidJson.status_line(), "401 Invalid JSON");
        assert_eq!(
            JobError::UnrecognizedCommand.status_line(),
            "430 Unrecognized command"
        );
    }

    #[test]
    fn a_refused_requeue_names_the_held_jobs() {
        assert!(
            JobError::RequeueHeld(vec![7])
                .status_line()
                .starts_with("405 Cannot requeue job 7: a worker holds it")
        );
        let many: Vec<JobId> = (1..=25).collect();
        let line = JobError::RequeueHeld(many).to_string();
        assert!(line.starts_with("Cannot requeue jobs 1, 2, "), "{line}");
        assert!(line.contains(", 20 and 5 more: a worker"), "{line}");
        assert_eq!(JobError::RequeueHeld(vec![1]).code(), "requeue_held");
    }

    #[test]
    fn codes_are_snake_case() {
        assert_eq!(JobError::Missing("jobID").code(), "missing_job_id");
        assert_eq!(
            JobError::Malformed("parentJobID").code(),
            "malformed_parent_job_id"
        );
        assert_eq!(
            JobError::Missing("numResults").code(),
            "missing_num_results"
        );
        assert_eq!(JobError::Missing("name").code(), "missing_name");
        assert_eq!(JobError::LeaseLost(3).code(), "lease_lost");
        assert_eq!(JobError::Malformed("jobIDs").code(), "malformed_job_ids");
        assert_eq!(JobError::Missing("leaseMs").code(), "missing_lease_ms");
    }
}
