//! The Jobs commands as checked, typed values, and the parameter checks both
//! wire front-ends share. A command that exists has passed its syntax checks;
//! the rules that depend on stored jobs are the queue's.

use serde_json::{Map, Value};

use super::{
    JobError, JobId, MAX_DATA_BYTES, MAX_NAME_BYTES, MAX_NUM_RESULTS, Modifier, NamePattern,
    Priority, Repeat, Timestamp,
};

/// A job's data: always a JSON object.
pub type Data = Map<String, Value>;

/// A `retryAfter` value: one or more SQLite date modifiers, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryAfter {
    /// The modifiers, in order.
    pub modifiers: Vec<Modifier>,
    /// The text as given, trimmed.
    pub text: String,
}

impl RetryAfter {
    /// Reads a `retryAfter`; `402 Malformed retryAfter` unless every
    /// comma-separated part is a valid modifier.
    pub fn parse(text: &str) -> Result<Self, JobError> {
        let trimmed = text.trim();
        if trimmed.len() > 256 {
            return Err(JobError::MalformedRetryAfter);
        }
        let modifiers = Modifier::parse_list(trimmed).ok_or(JobError::MalformedRetryAfter)?;
        Ok(RetryAfter {
            modifiers,
            text: trimmed.to_string(),
        })
    }
}

/// How long a hand-out is leased for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseTerm {
    /// Bedrock's meaning for a job without `retryAfter`: held until
    /// reported, with no expiry. A `retryAfter` still applies.
    UntilReported,
    /// Held for this many milliseconds unless renewed; a `retryAfter`, when
    /// the job has one, takes its place.
    Millis(i64),
}

/// CreateJob, and each element of CreateJobs.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateJob {
    /// The job's name, 1 to 255 bytes.
    pub name: String,
    /// Its data, `{}` when not given.
    pub data: Data,
    /// When it may first run; now when not given.
    pub first_run: Option<Timestamp>,
    /// How it repeats.
    pub repeat: Option<Repeat>,
    /// Its priority; 500 when not given.
    pub priority: Option<Priority>,
    /// Return the existing job of this exact name instead of creating one.
    pub unique: bool,
    /// With `unique`, merge new data into the existing job (the default).
    pub overwrite: bool,
    /// The parent, for a child job.
    pub parent_id: Option<JobId>,
    /// Re-issue the job this long after a hand-out that was not reported.
    pub retry_after: Option<RetryAfter>,
    /// Its tags, checked and deduplicated (see [`super::tags`]); added to
    /// the existing job by a `unique` create that overwrites.
    pub tags: Vec<String>,
    /// Jobs that must finish before this one is handed out (checked by
    /// [`check_depends`](super::check_depends): distinct, at most
    /// [`MAX_DEPENDS`](super::MAX_DEPENDS)); empty for none.
    pub depends: Vec<JobId>,
}

impl CreateJob {
    /// A job with this name and every option at its default.
    pub fn named(name: impl Into<String>) -> Self {
        CreateJob {
            name: name.into(),
            data: Data::new(),
            first_run: None,
            repeat: None,
            priority: None,
            unique: false,
            overwrite: true,
            parent_id: None,
            retry_after: None,
            tags: Vec::new(),
            depends: Vec::new(),
        }
    }
}

/// GetJob and GetJobs.
#[derive(Debug, Clone, PartialEq)]
pub struct GetJobs {
    /// Which names.
    pub pattern: NamePattern,
    /// At most this many jobs, 1 to [`MAX_NUM_RESULTS`].
    pub num_results: usize,
    /// Only this priority.
    pub priority: Option<Priority>,
    /// The lease the hand-out carries.
    pub lease: LeaseTerm,
    /// The supervisor asking, when it says who it is.
    pub worker: Option<super::WorkerInfo>,
}

/// UpdateJob.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateJob {
    /// Which job.
    pub id: JobId,
    /// The new data, replacing the old.
    pub data: Data,
    /// A new repeat; recomputes `nextRun` unless `next_run` is given.
    pub repeat: Option<Repeat>,
    /// Remove the repeat.
    pub clear_repeat: bool,
    /// A new priority.
    pub priority: Option<Priority>,
    /// An explicit next run.
    pub next_run: Option<Timestamp>,
    /// The lease token of a holder reporting progress; a stale one is
    /// refused, so a holder that lost its job cannot overwrite the new run's
    /// data.
    pub lease: Option<String>,
}

/// FinishJob.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishJob {
    /// Which job.
    pub id: JobId,
    /// New data for the job (and its next run, if it repeats).
    pub data: Option<Data>,
    /// The lease token from the hand-out; a stale one is refused.
    pub lease: Option<String>,
    /// What the supervisor saw of the run, for the job's history.
    pub run: Option<super::RunFacts>,
}

/// RetryJob.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryJob {
    /// Which job.
    pub id: JobId,
    /// New data.
    pub data: Option<Data>,
    /// Seconds to wait before the retry; must not be negative.
    pub delay_secs: i64,
    /// An explicit time for the retry.
    pub next_run: Option<Timestamp>,
    /// A new name (moves the job to another queue).
    pub name: Option<String>,
    /// A new priority.
    pub priority: Option<Priority>,
    /// Retry at `next_run`/`delay` even if the job repeats.
    pub ignore_repeat: bool,
    /// The lease token from the hand-out.
    pub lease: Option<String>,
    /// What the supervisor saw of the run, for the job's history.
    pub run: Option<super::RunFacts>,
}

impl RetryJob {
    /// A retry of `id` now, with nothing else changed.
    pub fn now(id: JobId) -> Self {
        RetryJob {
            id,
            data: None,
            delay_secs: 0,
            next_run: None,
            name: None,
            priority: None,
            ignore_repeat: false,
            lease: None,
            run: None,
        }
    }
}

/// FailJob.
#[derive(Debug, Clone, PartialEq)]
pub struct FailJob {
    /// Which job.
    pub id: JobId,
    /// New data.
    pub data: Option<Data>,
    /// The lease token from the hand-out.
    pub lease: Option<String>,
    /// What the supervisor saw of the run, for the job's history.
    pub run: Option<super::RunFacts>,
}

/// RequeueJobs.
#[derive(Debug, Clone, PartialEq)]
pub struct RequeueJobs {
    /// The jobs to put back.
    pub ids: Vec<JobId>,
    /// A new name for all of them.
    pub name: Option<String>,
}

/// Checks a job id given as text: exact decimal, positive, fits in 64 bits.
pub fn parse_job_id(param: &'static str, text: &str) -> Result<JobId, JobError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(JobError::Missing(param));
    }
    match text.parse::<i64>() {
        Ok(id) if id > 0 && id.to_string() == text => Ok(id),
        _ => Err(JobError::Malformed(param)),
    }
}

/// Checks a job id given as a number.
pub fn check_job_id(param: &'static str, id: i64) -> Result<JobId, JobError> {
    if id > 0 {
        Ok(id)
    } else {
        Err(JobError::Malformed(param))
    }
}

/// Checks a job name: 1 to 255 bytes, no control characters (NUL, newline,
/// tab, escape, …: see [`super::text::is_control`]).
pub fn check_name(name: &str) -> Result<(), JobError> {
    if name.is_empty() {
        Err(JobError::Missing("name"))
    } else if name.len() > MAX_NAME_BYTES {
        Err(JobError::Malformed("name"))
    } else if super::text::has_control(name) {
        Err(JobError::ControlCharacter("name"))
    } else {
        Ok(())
    }
}

/// Checks data given as JSON text: a JSON object of at most 1 MiB.
pub fn parse_data(text: &str) -> Result<Data, JobError> {
    if text.len() > MAX_DATA_BYTES {
        return Err(JobError::DataTooLarge);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(JobError::DataNotObject),
    }
}

/// Checks data given as a JSON value: an object of at most 1 MiB when written.
pub fn check_data(value: Value) -> Result<Data, JobError> {
    match value {
        Value::Object(map) => {
            if data_len(&map) > MAX_DATA_BYTES {
                Err(JobError::DataTooLarge)
            } else {
                Ok(map)
            }
        }
        _ => Err(JobError::DataNotObject),
    }
}

/// The length of the data's JSON text.
pub fn data_len(data: &Data) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a Map to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, data);
    counter.0
}

/// Checks a `numResults` given as text: 1 or more; values over
/// [`MAX_NUM_RESULTS`] are capped.
pub fn parse_num_results(text: &str) -> Result<usize, JobError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(JobError::Missing("numResults"));
    }
    match text.parse::<u64>() {
        Ok(n) => Ok((n.max(1) as usize).min(MAX_NUM_RESULTS)),
        Err(_) => Err(JobError::Malformed("numResults")),
    }
}

/// Checks a time given as text (`firstRun`, `nextRun`).
pub fn parse_time(param: &'static str, text: &str) -> Result<Timestamp, JobError> {
    Timestamp::parse(text).ok_or(JobError::Malformed(param))
}

/// Reads a boolean flag as Bedrock does: `true`/`1` are true, `false`/`0`/``
/// false, case-insensitively.
pub fn parse_flag(param: &'static str, text: &str) -> Result<bool, JobError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(JobError::Malformed(param)),
    }
}

/// Reads a comma-separated list of job ids.
pub fn parse_job_ids(param: &'static str, text: &str) -> Result<Vec<JobId>, JobError> {
    let ids: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.is_empty() {
        return Err(JobError::Missing(param));
    }
    ids.into_iter()
        .map(|id| parse_job_id(param, id).map_err(|_| JobError::Malformed(param)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_must_be_exact_positive_int64() {
        assert_eq!(parse_job_id("jobID", "42"), Ok(42));
        assert_eq!(parse_job_id("jobID", ""), Err(JobError::Missing("jobID")));
        for bad in [
            "042",
            "+42",
            "4.2",
            "abc",
            "0",
            "-1",
            "9223372036854775808",
            "1e3",
        ] {
            assert_eq!(
                parse_job_id("jobID", bad),
                Err(JobError::Malformed("jobID")),
                "{bad}"
            );
        }
    }

    #[test]
    fn data_must_be_a_small_object() {
        assert!(parse_data("{}").unwrap().is_empty());
        assert_eq!(parse_data("[]"), Err(JobError::DataNotObject));
        assert_eq!(parse_data("{\"a\":"), Err(JobError::DataNotObject));
        assert_eq!(parse_data("\"x\""), Err(JobError::DataNotObject));
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_DATA_BYTES));
        assert_eq!(parse_data(&big), Err(JobError::DataTooLarge));
        let value: Value = serde_json::from_str(&big).unwrap();
        assert_eq!(check_data(value), Err(JobError::DataTooLarge));
    }

    #[test]
    fn names_are_bounded() {
        assert!(check_name("SendEmail").is_ok());
        assert_eq!(check_name(""), Err(JobError::Missing("name")));
        assert_eq!(
            check_name(&"n".repeat(256)),
            Err(JobError::Malformed("name"))
        );
        for bad in [
            "a\0b",
            "a\nb",
            "a\rb",
            "a\tb",
            "a\u{1b}[31mb",
            "a\u{2028}b",
            "a\u{85}b",
        ] {
            assert_eq!(
                check_name(bad),
                Err(JobError::ControlCharacter("name")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn num_results_and_lists() {
        assert_eq!(parse_num_results("0"), Ok(1));
        assert_eq!(parse_num_results("5000"), Ok(MAX_NUM_RESULTS));
        assert_eq!(
            parse_num_results("x"),
            Err(JobError::Malformed("numResults"))
        );
        assert_eq!(parse_job_ids("jobIDs", "1, 2,3"), Ok(vec![1, 2, 3]));
        assert_eq!(
            parse_job_ids("jobIDs", "1,x"),
            Err(JobError::Malformed("jobIDs"))
        );
        assert_eq!(
            parse_job_ids("jobIDs", ""),
            Err(JobError::Missing("jobIDs"))
        );
    }
}
