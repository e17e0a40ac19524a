//! A job whose worker is missing on this host: handed back with a delay
//! for a supervisor that has the worker, counting no attempt, until no
//! supervisor has run it for the no-worker timeout since the first such
//! hand-back. The first hand-back's time and the count are kept in the
//! job's data (under the details key), so that every supervisor, on either
//! port, counts from the same time.

use std::time::Duration;

use serde_json::{Value, json};

use super::report::{DETAILS_KEY, Decision, JobFacts, RetryPolicy, fitted, whole_seconds};
use crate::client::Report;
use crate::protocol::Data;

/// The details key: when the job was first handed back for want of its
/// worker (kept in the job's data, so that every supervisor, on either
/// port, counts from the same time).
pub const NO_WORKER_SINCE: &str = "noWorkerSince";

/// The details key: how many times in a row the job was handed back for
/// want of its worker (a jobmgr server counts no attempt for them, and
/// keeps one history row for the streak).
pub const NO_WORKER_HAND_BACKS: &str = "noWorkerHandBacks";

/// How many no-worker hand-backs the job's data records.
pub fn no_worker_hand_backs(data: &Data) -> i64 {
    data.get(DETAILS_KEY)
        .and_then(|d| d.get(NO_WORKER_HAND_BACKS))
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .max(0)
}

/// No worker for the job here: hand it back with a delay for a supervisor
/// that has one, counting no attempt, until no supervisor has run it for
/// the no-worker timeout since the first such hand-back; then fail it (a
/// repeating job moves on to its next time instead).
pub fn decide(reason: &str, job: JobFacts<'_>, policy: &RetryPolicy) -> Decision {
    let now = crate::protocol::Timestamp::now();
    let since = job
        .data
        .get(DETAILS_KEY)
        .and_then(|d| d.get(NO_WORKER_SINCE))
        .and_then(Value::as_str)
        .and_then(crate::protocol::Timestamp::parse)
        // A time still to come (a hostile or skewed value) counts from now,
        // so that it cannot put the timeout off for ever.
        .filter(|since| since.0 <= now.0)
        .unwrap_or(now);
    let waited = Duration::from_millis(now.0.saturating_sub(since.0).max(0) as u64);
    let hand_backs = no_worker_hand_backs(job.data);
    if waited >= policy.no_worker_timeout {
        let timeout = crate::config::HumanDuration(policy.no_worker_timeout);
        let data = fitted(
            job.data,
            json!({"outcome": "no_worker", "reason": reason, "attempt": job.attempt,
                   NO_WORKER_HAND_BACKS: hand_backs}),
        );
        let what = format!(
            "{reason}; no supervisor ran it within the no-worker timeout ({timeout}) after {hand_backs} hand-back(s)"
        );
        if job.repeats {
            return Decision {
                report: Some(Report::Retry {
                    delay_secs: 0,
                    ignore_repeat: false,
                    data,
                    name: None,
                    next_run: None,
                }),
                summary: format!(
                    "failed: {what}; giving up on this run, the job repeats at its next time"
                ),
            };
        }
        return Decision {
            report: Some(Report::Fail { data }),
            summary: format!("FAILED: {what}"),
        };
    }
    let left = policy.no_worker_timeout - waited;
    let delay = policy
        .backoff
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
        .min(left)
        .max(Duration::from_secs(1));
    // A Bedrock server counts no attempts: the next run's number comes from
    // the details' `attempt`, so this hand-back leaves it where it was (a
    // jobmgr server takes the hand-back's hand-out off its count).
    let data = fitted(
        job.data,
        json!({"outcome": "no_worker", "reason": reason, "attempt": job.attempt.saturating_sub(1),
               NO_WORKER_SINCE: since.to_string(), NO_WORKER_HAND_BACKS: hand_backs.saturating_add(1)}),
    );
    Decision {
        report: Some(Report::Retry {
            delay_secs: whole_seconds(delay),
            ignore_repeat: true,
            data,
            name: None,
            next_run: None,
        }),
        summary: format!(
            "not run: {reason}; handed back for a supervisor that has the worker, retry in {}s (failed if none runs it by {})",
            whole_seconds(delay),
            since.plus_millis(policy.no_worker_timeout.as_millis().min(i64::MAX as u128) as i64)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::supervisor::output::Capture;
    use crate::supervisor::process::{Ending, Finished};
    use crate::supervisor::report::{NotRun, decide as decide_run, decide_not_run};

    fn exited(code: i32) -> Finished {
        let mut capture = Capture::new(1024);
        capture.push(b"out");
        Finished {
            ending: Ending::Exited(code),
            pid: 42,
            stdout: capture.finish(),
            stderr: Capture::new(1024).finish(),
            killed: false,
            oom: false,
            report_line: None,
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
            no_worker_timeout: Duration::from_secs(3600),
        }
    }

    fn job(data: &Data, attempt: i64, repeats: bool) -> JobFacts<'_> {
        JobFacts {
            data,
            progressed: false,
            attempt,
            repeats,
        }
    }

    #[test]
    fn a_missing_worker_hands_the_job_back_until_the_no_worker_timeout() {
        let policy = policy();
        let why = NotRun::NoWorker("no worker X".into());
        let first = decide_not_run(&why, job(&Data::new(), 1, false), &policy);
        let Some(Report::Retry {
            delay_secs,
            ignore_repeat: true,
            data: Some(data),
            ..
        }) = first.report
        else {
            panic!("{first:?}")
        };
        assert_eq!(delay_secs, 10, "the backoff, within 1s..=60s");
        assert_eq!(no_worker_hand_backs(&data), 1);
        let since = data[DETAILS_KEY][NO_WORKER_SINCE].clone();
        assert!(since.is_string(), "{data:?}");
        // A second hand-back keeps the first one's time.
        let second = decide_not_run(&why, job(&data, 2, false), &policy);
        let Some(Report::Retry {
            data: Some(data), ..
        }) = second.report
        else {
            panic!("{second:?}")
        };
        assert_eq!(data[DETAILS_KEY][NO_WORKER_SINCE], since);
        assert_eq!(no_worker_hand_backs(&data), 2);
        // Past the timeout: failed, or a repeating job moves on.
        let mut old = data.clone();
        old[DETAILS_KEY][NO_WORKER_SINCE] = json!("2000-01-01 00:00:00");
        let failed = decide_not_run(&why, job(&old, 3, false), &policy);
        let Some(Report::Fail { data: Some(sent) }) = failed.report else {
            panic!("{failed:?}")
        };
        assert_eq!(sent[DETAILS_KEY]["outcome"], "no_worker");
        let moved = decide_not_run(&why, job(&old, 3, true), &policy);
        let Some(Report::Retry {
            ignore_repeat: false,
            data: Some(sent),
            ..
        }) = moved.report
        else {
            panic!("{moved:?}")
        };
        assert!(
            sent[DETAILS_KEY].get(NO_WORKER_SINCE).is_none(),
            "the next run's clock starts afresh"
        );
        // A later run's details start afresh: the streak is over.
        let ran = decide_run(&exited(3), job(&data, 1, false), &policy, false, false);
        let Some(Report::Retry {
            data: Some(sent), ..
        }) = ran.report
        else {
            panic!("{ran:?}")
        };
        assert_eq!(no_worker_hand_backs(&sent), 0);
        assert!(sent[DETAILS_KEY].get(NO_WORKER_SINCE).is_none());
    }

    #[test]
    fn hostile_clock_and_count_in_the_data_cannot_put_the_timeout_off_or_overflow() {
        let policy = policy();
        let why = NotRun::NoWorker("no worker X".into());
        let mut data = Data::new();
        data.insert(
            DETAILS_KEY.into(),
            json!({NO_WORKER_SINCE: "2999-01-01 00:00:00", NO_WORKER_HAND_BACKS: i64::MAX}),
        );
        let decision = decide_not_run(&why, job(&data, i64::MIN, false), &policy);
        let Some(Report::Retry {
            data: Some(sent), ..
        }) = decision.report
        else {
            panic!("{decision:?}")
        };
        let since = sent[DETAILS_KEY][NO_WORKER_SINCE].as_str().unwrap();
        assert!(
            !since.starts_with("2999"),
            "a time to come was kept as the first hand-back's: {since}"
        );
        assert_eq!(
            no_worker_hand_backs(&sent),
            i64::MAX,
            "saturated, not wrapped"
        );
    }
}
