//! What a finished worker means for its job: exit 0 finishes it (a JSON
//! object on stdout's last line becomes its data), 75 (EX_TEMPFAIL) retries
//! it later, and any other ending is retried with exponential backoff and
//! jitter until the attempts run out, then failed; a worker's report line
//! (see [`super::report_line`]) sets a retry's terms or fails the job at
//! once. Failure details travel in
//! the job's data under one reserved key, [`DETAILS_KEY`], since a Bedrock
//! server keeps no other history.

use std::time::Duration;

use serde_json::{Value, json};

use super::no_worker::{NO_WORKER_HAND_BACKS, NO_WORKER_SINCE};
use super::process::{Ending, Finished};
use super::report_line::Requested;
use crate::client::Report;
use crate::protocol::{Data, MAX_DATA_BYTES, RunFacts, Timestamp, data_len};

/// The data key holding the last outcome's details.
pub const DETAILS_KEY: &str = "_jobmgr";

/// The exit code that asks for a retry later (sysexits' EX_TEMPFAIL).
pub const EX_TEMPFAIL: i32 = 75;

/// The least delay of a retry a worker's report line asks for: sooner (a
/// delay of 0, a time past) is made this. The server keeps whole seconds,
/// so at least one second passes.
pub const MIN_REQUESTED_DELAY_SECS: i64 = 2;

/// How failures are retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Runs in all, the first included, before a failing job is FAILED.
    pub max_attempts: i64,
    /// The delay before the first retry; it doubles each time.
    pub backoff: Duration,
    /// The longest delay.
    pub max_backoff: Duration,
    /// How long a job whose worker is missing is handed back for another
    /// supervisor before it is failed (`no_worker`); zero fails it at once.
    pub no_worker_timeout: Duration,
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1 after the first run),
    /// with ±25 % jitter so that failing jobs do not retry in lockstep.
    pub fn delay(&self, attempt: i64) -> Duration {
        let exponent = attempt.clamp(1, 30) as u32 - 1;
        let base = self.backoff.as_secs_f64() * 2f64.powi(exponent as i32);
        let capped = base.min(self.max_backoff.as_secs_f64());
        let jitter = 0.75 + rand::random::<f64>() * 0.5;
        // Saturating: a configured backoff may be as long as a Duration.
        Duration::try_from_secs_f64(capped * jitter).unwrap_or(Duration::MAX)
    }
}

/// Why the job did not run to an ending of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRun {
    /// There is no worker for its name here (another host may have one).
    NoWorker(String),
    /// Its name names no worker at all, on any host.
    BadName(String),
    /// The machine is out of processes, memory or file descriptors, or
    /// cannot make the job's cgroups: not the job's fault; the supervisor
    /// backs off.
    Busy(String),
    /// The worker could not be started for a reason of its own (a missing
    /// interpreter, no permission to execute, …); counts as a failed run.
    CannotStart(String),
}

/// What the report needs to know about the job.
#[derive(Debug, Clone, Copy)]
pub struct JobFacts<'a> {
    /// Its latest data: as handed out, with the progress the worker
    /// reported during the run merged in. Reports start from it, so that
    /// they never undo the worker's progress.
    pub data: &'a Data,
    /// Whether the worker reported progress, so that `data` differs from
    /// the data as handed out (and may hold progress not yet sent).
    pub progressed: bool,
    /// Which run of it this is, from 1.
    pub attempt: i64,
    /// Whether it repeats.
    pub repeats: bool,
}

/// The outcome of a job, in words and data.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What to tell the server, or `None` to tell it nothing (lease lost).
    pub report: Option<Report>,
    /// One line for the log.
    pub summary: String,
}

/// Decides the report for a worker that ran.
pub fn decide(
    finished: &Finished,
    job: JobFacts<'_>,
    policy: &RetryPolicy,
    lease_lost: bool,
    draining: bool,
) -> Decision {
    if lease_lost {
        return Decision {
            report: None,
            summary: "stopped: the lease was lost; the result is discarded".into(),
        };
    }
    match requested(finished, job) {
        Ok(decision) => decision,
        Err(note) => {
            let mut decision = decide_by_exit(finished, job, policy, draining);
            decision.summary.push_str(&note);
            decision
        }
    }
}

/// The worker's report line, where its exit code agrees with it: a retry
/// with exit 75, a failure with any other code. Otherwise the note for the
/// summary on why it was not followed (empty without a line).
fn requested(finished: &Finished, job: JobFacts<'_>) -> Result<Decision, String> {
    let Some(line) = &finished.report_line else {
        return Err(String::new());
    };
    let requested = super::report_line::parse(line)
        .map_err(|e| format!("; its report line was not followed: {e}"))?;
    match (requested, &finished.ending) {
        // The worker's work is done: whatever ends the process afterwards
        // (a shutdown function that throws, a destructor's exit()) does
        // not make it run again.
        (Requested::Finish { data }, _) => {
            let (new_data, note) = match data {
                Some(data) => (Some(data), "; its report line holds the job's new data"),
                None => stdout_data(finished),
            };
            Ok(Decision {
                report: Some(Report::Finish {
                    data: finished_data(new_data, job),
                }),
                summary: format!(
                    "finished, as the worker's report line says ({}){note}",
                    ending_words(finished).trim_start_matches("it ")
                ),
            })
        }
        (
            Requested::Retry {
                delay_secs,
                next_run,
                name,
                ignore_repeat,
                data,
            },
            Ending::Exited(EX_TEMPFAIL),
        ) if !finished.oom => {
            let (new_data, note) = match data {
                Some(data) => (Some(data), "; its report line holds the job's new data"),
                None => stdout_data(finished),
            };
            // The details of earlier runs are not the worker's to hand back.
            let new_data = new_data.map(|mut map| {
                map.remove(DETAILS_KEY);
                map
            });
            let base = new_data.as_ref().unwrap_or(job.data);
            // Never sooner than a second or two: a worker asking again and
            // again for a retry now must not spin.
            let soon = Timestamp::now().0 + MIN_REQUESTED_DELAY_SECS * 1000;
            let (next_run, delay_secs) = match next_run {
                Some(time) if Timestamp::parse(&time).is_some_and(|t| t.0 > soon) => {
                    (Some(time), delay_secs)
                }
                Some(_) => (None, MIN_REQUESTED_DELAY_SECS),
                None => (None, delay_secs.max(MIN_REQUESTED_DELAY_SECS)),
            };
            let when = match (&next_run, delay_secs) {
                (Some(time), _) => format!("at {time}"),
                (None, delay) => format!("in {delay}s"),
            };
            let renamed = name
                .as_deref()
                .map_or(String::new(), |n| format!(" as {n:?}"));
            Ok(Decision {
                report: Some(Report::Retry {
                    delay_secs,
                    ignore_repeat,
                    data: with_details(base, finished, "retry", job.attempt),
                    name,
                    next_run,
                }),
                summary: format!("retry {when}{renamed}, as the worker asked (exit 75){note}"),
            })
        }
        (Requested::Fail { reason }, Ending::Exited(code))
            if *code != 0 && *code != EX_TEMPFAIL && !finished.oom =>
        {
            let mut data = with_details(job.data, finished, "exit", job.attempt);
            if let Some(details) = data
                .as_mut()
                .and_then(|d| d.get_mut(DETAILS_KEY))
                .and_then(Value::as_object_mut)
                .filter(|_| !reason.is_empty())
            {
                details.insert("reason".into(), json!(reason));
            }
            Ok(Decision {
                report: Some(Report::Fail { data }),
                summary: format!(
                    "FAILED: the worker failed the job (exit {code}){}",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {reason}")
                    }
                ),
            })
        }
        (Requested::Retry { .. }, _) => Err(format!(
            "; its report line asked for a retry, which needs exit 75: {}",
            ending_words(finished)
        )),
        (Requested::Fail { .. }, _) => Err(format!(
            "; its report line asked for a failure, which needs an exit code other than 0 and 75: {}",
            ending_words(finished)
        )),
    }
}

/// How the worker ended, in a few words.
fn ending_words(finished: &Finished) -> String {
    match finished.ending {
        _ if finished.oom => "it ran out of memory".into(),
        Ending::Exited(code) => format!("it exited {code}"),
        Ending::Signaled(signal) => format!("it died of {}", signal_name(signal)),
        Ending::TimedOut => "it timed out".into(),
        Ending::Stopped => "it was stopped".into(),
    }
}

/// A JSON object on stdout's last line, as the job's new data, and a note
/// for the summary on what was made of the last line.
fn stdout_data(finished: &Finished) -> (Option<Data>, &'static str) {
    let last_line = finished.stdout.last_line.as_deref();
    let parsed = last_line.and_then(|line| serde_json::from_str::<Value>(line).ok());
    match parsed {
        Some(Value::Object(map)) if data_len(&map) <= MAX_DATA_BYTES => {
            (Some(map), "; stdout's last line is the job's new data")
        }
        Some(Value::Object(_)) => (
            None,
            "; stdout's last line is a JSON object over 1 MiB, so the data is unchanged",
        ),
        _ if finished.stdout.truncated && last_line.is_none() => (
            None,
            "; stdout was cut by the output cap, so its last line was not read as data",
        ),
        None if last_line.is_some_and(|l| l.trim_start().starts_with('{')) => (
            None,
            "; stdout's last line is not valid JSON, so the data is unchanged",
        ),
        _ => (None, ""),
    }
}

/// The data a finish sends: the worker's new data, else the data as it
/// stands when there was progress or details to drop. The details of
/// earlier failed runs do not outlive a success; the worker's progress does
/// (it may not all have been sent).
fn finished_data(new_data: Option<Data>, job: JobFacts<'_>) -> Option<Data> {
    match new_data {
        Some(mut map) => {
            map.remove(DETAILS_KEY);
            Some(map)
        }
        None if job.progressed || job.data.contains_key(DETAILS_KEY) => {
            let mut map = job.data.clone();
            map.remove(DETAILS_KEY);
            Some(map)
        }
        None => None,
    }
}

/// The report by the exit code alone.
fn decide_by_exit(
    finished: &Finished,
    job: JobFacts<'_>,
    policy: &RetryPolicy,
    draining: bool,
) -> Decision {
    match finished.ending {
        Ending::Exited(0) => {
            let (new_data, note) = stdout_data(finished);
            Decision {
                report: Some(Report::Finish {
                    data: finished_data(new_data, job),
                }),
                summary: format!("finished (exit 0){note}"),
            }
        }
        Ending::Exited(EX_TEMPFAIL) => {
            let delay = policy.delay(job.attempt);
            Decision {
                report: Some(Report::Retry {
                    delay_secs: whole_seconds(delay),
                    ignore_repeat: true,
                    data: with_details(job.data, finished, "tempfail", job.attempt),
                    name: None,
                    next_run: None,
                }),
                summary: format!(
                    "asked to be retried (exit 75); retry in {}s",
                    whole_seconds(delay)
                ),
            }
        }
        Ending::Stopped if draining => Decision {
            report: Some(Report::Retry {
                delay_secs: 0,
                ignore_repeat: true,
                data: job.progressed.then(|| job.data.clone()),
                name: None,
                next_run: None,
            }),
            summary: "stopped by shutdown; handed back for an immediate retry".into(),
        },
        _ if finished.oom => failure(
            job,
            policy,
            with_details(job.data, finished, "oom", job.attempt),
            "worker ran out of memory (memory-max) and was killed",
        ),
        ending => {
            let (kind, what) = match ending {
                Ending::Exited(code) => ("exit", format!("worker exited with {code}")),
                Ending::Signaled(signal) => {
                    ("signal", format!("worker died of {}", signal_name(signal)))
                }
                Ending::TimedOut => ("timeout", "worker timed out".to_string()),
                Ending::Stopped => ("stopped", "worker was stopped".to_string()),
            };
            failure(
                job,
                policy,
                with_details(job.data, finished, kind, job.attempt),
                &what,
            )
        }
    }
}

/// A failed run: retried with backoff until the attempts run out; then a
/// one-off job is FAILED, and a repeating one moves on to its next
/// occurrence (its schedule outlives one bad run) with the details in its
/// data.
fn failure(job: JobFacts<'_>, policy: &RetryPolicy, data: Option<Data>, what: &str) -> Decision {
    let attempt = job.attempt;
    if attempt < policy.max_attempts {
        let delay = policy.delay(attempt);
        return Decision {
            report: Some(Report::Retry {
                delay_secs: whole_seconds(delay),
                ignore_repeat: true,
                data,
                name: None,
                next_run: None,
            }),
            summary: format!(
                "failed: {what} (attempt {attempt} of {}); retry in {}s",
                policy.max_attempts,
                whole_seconds(delay)
            ),
        };
    }
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
                "failed: {what} (attempt {attempt} of {}); giving up on this run, the job repeats at its next time",
                policy.max_attempts
            ),
        };
    }
    Decision {
        report: Some(Report::Fail { data }),
        summary: format!(
            "FAILED: {what} (attempt {attempt} of {})",
            policy.max_attempts
        ),
    }
}

/// Decides the report for a job whose worker never ran.
pub fn decide_not_run(why: &NotRun, job: JobFacts<'_>, policy: &RetryPolicy) -> Decision {
    let details = |outcome: &str, reason: &str| {
        fitted(
            job.data,
            json!({"outcome": outcome, "reason": reason, "attempt": job.attempt}),
        )
    };
    match why {
        NotRun::NoWorker(reason) => super::no_worker::decide(reason, job, policy),
        NotRun::BadName(reason) => Decision {
            report: Some(Report::Fail {
                data: details("no_worker", reason),
            }),
            summary: format!("FAILED: {reason}"),
        },
        NotRun::Busy(reason) => {
            let delay = policy
                .backoff
                .clamp(Duration::from_secs(1), Duration::from_secs(5));
            Decision {
                report: Some(Report::Retry {
                    delay_secs: whole_seconds(delay),
                    ignore_repeat: true,
                    data: None,
                    name: None,
                    next_run: None,
                }),
                summary: format!(
                    "could not start the worker ({reason}); not the job's fault, retry in {}s",
                    whole_seconds(delay)
                ),
            }
        }
        NotRun::CannotStart(reason) => failure(
            job,
            policy,
            details("cannot_start", reason),
            &format!("the worker could not be started: {reason}"),
        ),
    }
}

/// The job's data plus the details of this outcome under [`DETAILS_KEY`]
/// (see [`fitted`] for data near the cap).
fn with_details(data: &Data, finished: &Finished, kind: &str, attempt: i64) -> Option<Data> {
    let mut details = json!({
        "outcome": kind,
        "attempt": attempt,
        "pid": finished.pid,
        "stdout": finished.stdout.text,
        "stderr": finished.stderr.text,
        "outputBytes": {"stdout": finished.stdout.total, "stderr": finished.stderr.total},
        "outputTruncated": finished.stdout.truncated || finished.stderr.truncated,
        "at": crate::protocol::Timestamp::now().to_string(),
    });
    match finished.ending {
        Ending::Exited(code) => details["exitCode"] = json!(code),
        Ending::Signaled(signal) => details["signal"] = json!(signal_name(signal)),
        Ending::TimedOut | Ending::Stopped => details["killed"] = json!(finished.killed),
    }
    fitted(data, details)
}

/// The details keys that say what happened, kept when nothing else fits.
const VERDICT: [&str; 8] = [
    "outcome",
    "attempt",
    "exitCode",
    "signal",
    "killed",
    "reason",
    NO_WORKER_SINCE,
    NO_WORKER_HAND_BACKS,
];

/// The job's data with `details` under [`DETAILS_KEY`], within the
/// server's 1 MiB cap so that the report is taken: the output goes first,
/// then everything but the verdict. `None` when not even the verdict fits
/// beside the job's own data; the data is then left as it is, and the
/// outcome is in the log.
pub(super) fn fitted(data: &Data, details: Value) -> Option<Data> {
    let mut data = data.clone();
    data.insert(DETAILS_KEY.into(), details);
    if data_len(&data) <= MAX_DATA_BYTES {
        return Some(data);
    }
    if let Some(Value::Object(details)) = data.get_mut(DETAILS_KEY) {
        for stream in ["stdout", "stderr"] {
            if details.contains_key(stream) {
                details.insert(
                    stream.into(),
                    json!("[dropped: the job's data would exceed 1 MiB]"),
                );
            }
        }
    }
    if data_len(&data) <= MAX_DATA_BYTES {
        return Some(data);
    }
    if let Some(Value::Object(details)) = data.get_mut(DETAILS_KEY) {
        details.retain(|key, _| VERDICT.contains(&key.as_str()));
    }
    if data_len(&data) <= MAX_DATA_BYTES {
        return Some(data);
    }
    tracing::warn!(
        "the job's data is at the 1 MiB cap, so this outcome's details are not stored in it"
    );
    None
}

/// What the server's history keeps of a run: how it ended and the head
/// and tail of each stream within 4 KiB (the server keeps no more).
pub fn run_facts(finished: &Finished) -> RunFacts {
    use crate::server::ledger::failure::{OUTPUT_KEPT_BYTES, head_and_tail};
    let kept = |text: &str| head_and_tail(text, OUTPUT_KEPT_BYTES);
    let (exit_code, signal) = match finished.ending {
        Ending::Exited(code) => (Some(code), None),
        Ending::Signaled(signal) => (None, Some(signal_name(signal))),
        Ending::TimedOut | Ending::Stopped => (
            None,
            Some(
                if finished.killed {
                    "SIGKILL"
                } else {
                    "SIGTERM"
                }
                .to_string(),
            ),
        ),
    };
    // The server takes letters, digits and `_` (`signal 42` becomes `signal42`).
    let signal = signal
        .map(|s| {
            s.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(32)
                .collect::<String>()
        })
        .filter(|s| !s.is_empty());
    RunFacts {
        exit_code,
        signal,
        stdout: Some(kept(&finished.stdout.text)),
        stderr: Some(kept(&finished.stderr.text)),
        stdout_bytes: Some(finished.stdout.total),
        stderr_bytes: Some(finished.stderr.total),
    }
}

/// A delay in whole seconds, rounded up so that "later" is never "now".
pub(super) fn whole_seconds(delay: Duration) -> i64 {
    delay.as_secs_f64().ceil() as i64
}

/// `SIGSEGV` for 11, and so on.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::output::Capture;

    fn finished(ending: Ending, stdout: &str) -> Finished {
        let mut capture = Capture::new(1024);
        capture.push(stdout.as_bytes());
        Finished {
            ending,
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
            no_worker_timeout: Duration::ZERO,
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

    fn with_line(mut finished: Finished, line: Value) -> Finished {
        finished.report_line = Some(line);
        finished
    }

    #[test]
    fn a_report_line_sets_the_terms_of_a_retry_with_exit_75() {
        let data = Data::new();
        let line = json!({"outcome": "retry", "delay": 120, "nextRun": "2030-01-02 03:04:05",
            "name": "a/Renamed", "ignoreRepeat": true});
        let d = decide(
            &with_line(
                finished(Ending::Exited(EX_TEMPFAIL), "{\"tried\":true}\n"),
                line,
            ),
            job(&data, 1, true),
            &policy(),
            false,
            false,
        );
        let Some(Report::Retry {
            delay_secs: 120,
            ignore_repeat: true,
            data: Some(sent),
            name: Some(name),
            next_run: Some(next_run),
        }) = d.report
        else {
            panic!("{d:?}")
        };
        assert_eq!(name, "a/Renamed");
        assert_eq!(next_run, "2030-01-02 03:04:05");
        assert_eq!(sent["tried"], true, "stdout's last line is the data");
        assert_eq!(sent[DETAILS_KEY]["outcome"], "retry");
        assert!(d.summary.contains("as the worker asked"), "{}", d.summary);
    }

    #[test]
    fn a_requested_retry_is_never_sooner_than_a_second_nor_nests_old_details() {
        let data = Data::new();
        for line in [
            json!({"outcome": "retry"}),
            json!({"outcome": "retry", "delay": 0}),
            json!({"outcome": "retry", "nextRun": "2001-01-01 00:00:00", "delay": 50}),
        ] {
            let stdout = "{\"n\":1,\"_jobmgr\":{\"outcome\":\"old\"}}\n";
            let d = decide(
                &with_line(finished(Ending::Exited(EX_TEMPFAIL), stdout), line.clone()),
                job(&data, 1, false),
                &policy(),
                false,
                false,
            );
            let Some(Report::Retry {
                delay_secs,
                next_run: None,
                data: Some(sent),
                ..
            }) = d.report
            else {
                panic!("{line}: {d:?}")
            };
            assert_eq!(delay_secs, MIN_REQUESTED_DELAY_SECS, "{line}");
            assert_eq!(sent["n"], 1);
            assert_eq!(
                sent[DETAILS_KEY]["outcome"], "retry",
                "not nested: {sent:?}"
            );
            assert!(sent[DETAILS_KEY].get(DETAILS_KEY).is_none());
        }
    }

    #[test]
    fn a_finish_line_finishes_whatever_the_process_did_after_it() {
        let data = Data::new();
        for ending in [
            Ending::Exited(255),
            Ending::Exited(EX_TEMPFAIL),
            Ending::Signaled(11),
            Ending::TimedOut,
        ] {
            let line = json!({"outcome": "finish", "data": {"sent": 1, "_jobmgr": {"old": 1}}});
            let d = decide(
                &with_line(finished(ending, "{\"not\": \"this\"}\n"), line),
                job(&data, 1, false),
                &policy(),
                false,
                false,
            );
            let Some(Report::Finish { data: Some(sent) }) = d.report else {
                panic!("{ending:?}: {d:?}")
            };
            assert_eq!(sent.get("sent"), Some(&json!(1)), "the line's data wins");
            assert!(sent.get(DETAILS_KEY).is_none(), "{sent:?}");
        }
        // A lost lease still wins over everything.
        let line = json!({"outcome": "finish"});
        let d = decide(
            &with_line(finished(Ending::Exited(0), ""), line),
            job(&data, 1, false),
            &policy(),
            true,
            false,
        );
        assert_eq!(d.report, None);
    }

    #[test]
    fn a_report_line_fails_the_job_at_once_with_another_exit_code() {
        let data = Data::new();
        let line = json!({"outcome": "fail", "reason": "RuntimeException: boom"});
        // Attempt 1 of 3: without the line it would be retried.
        let d = decide(
            &with_line(finished(Ending::Exited(1), ""), line),
            job(&data, 1, true),
            &policy(),
            false,
            false,
        );
        let Some(Report::Fail { data: Some(sent) }) = d.report else {
            panic!("{d:?}")
        };
        assert_eq!(sent[DETAILS_KEY]["reason"], "RuntimeException: boom");
        assert_eq!(sent[DETAILS_KEY]["exitCode"], 1);
        assert!(
            d.summary.contains("RuntimeException: boom"),
            "{}",
            d.summary
        );
    }

    #[test]
    fn a_report_line_the_ending_disagrees_with_or_that_does_not_read_is_not_followed() {
        let data = Data::new();
        let retry = json!({"outcome": "retry", "name": "a/Elsewhere"});
        let fail = json!({"outcome": "fail"});
        for (ending, line, kind, says) in [
            (Ending::Exited(0), retry.clone(), "finish", "needs exit 75"),
            (Ending::Exited(3), retry.clone(), "retry", "needs exit 75"),
            (
                Ending::Signaled(9),
                fail.clone(),
                "retry",
                "it died of SIGKILL",
            ),
            (Ending::TimedOut, fail.clone(), "retry", "it timed out"),
            (
                Ending::Exited(0),
                fail.clone(),
                "finish",
                "other than 0 and 75",
            ),
            (
                Ending::Exited(EX_TEMPFAIL),
                fail,
                "retry",
                "other than 0 and 75",
            ),
            (
                Ending::Exited(EX_TEMPFAIL),
                json!({"outcome": "retry", "nextRun": "soon"}),
                "retry",
                "nextRun",
            ),
        ] {
            let d = decide(
                &with_line(finished(ending, ""), line),
                job(&data, 1, false),
                &policy(),
                false,
                false,
            );
            let report = d.report.as_ref().expect("a report");
            assert_eq!(report.kind(), kind, "{ending:?}: {d:?}");
            if let Report::Retry { name, next_run, .. } = report {
                assert_eq!((name, next_run), (&None, &None), "{d:?}");
            }
            assert!(d.summary.contains(says), "{ending:?}: {}", d.summary);
        }
        // Out of memory, a fail line is not a verdict of the worker's own.
        let mut oom = with_line(finished(Ending::Exited(1), ""), json!({"outcome": "fail"}));
        oom.oom = true;
        let d = decide(&oom, job(&data, 1, false), &policy(), false, false);
        assert_eq!(d.report.as_ref().map(Report::kind), Some("retry"), "{d:?}");
    }

    #[test]
    fn exit_zero_finishes_with_the_last_line_as_data() {
        let empty = Data::new();
        let d = decide(
            &finished(Ending::Exited(0), "log\n{\"n\":2}\n"),
            job(&empty, 1, false),
            &policy(),
            false,
            false,
        );
        let Some(Report::Finish { data: Some(data) }) = d.report else {
            panic!("{d:?}")
        };
        assert_eq!(data["n"], 2);
        let d = decide(
            &finished(Ending::Exited(0), "{not json\n"),
            job(&empty, 1, false),
            &policy(),
            false,
            false,
        );
        assert_eq!(d.report, Some(Report::Finish { data: None }));
    }

    #[test]
    fn a_success_clears_the_details_of_earlier_failures() {
        let mut data = Data::new();
        data.insert("keep".into(), json!(1));
        data.insert(DETAILS_KEY.into(), json!({"attempt": 2}));
        let d = decide(
            &finished(Ending::Exited(0), ""),
            job(&data, 3, true),
            &policy(),
            false,
            false,
        );
        let Some(Report::Finish { data: Some(data) }) = d.report else {
            panic!("{d:?}")
        };
        assert_eq!(Value::Object(data), json!({"keep": 1}));
    }

    #[test]
    fn reports_start_from_the_workers_progress() {
        let mut data = Data::new();
        data.insert("step".into(), json!(2));
        let progressed = |data| JobFacts {
            data,
            progressed: true,
            attempt: 2,
            repeats: false,
        };
        // Progress not yet sent goes with the finish.
        let d = decide(
            &finished(Ending::Exited(0), ""),
            progressed(&data),
            &policy(),
            false,
            false,
        );
        assert_eq!(
            d.report,
            Some(Report::Finish {
                data: Some(data.clone())
            })
        );
        // After an earlier failure: the progress stays, the details go.
        let mut with_details = data.clone();
        with_details.insert(DETAILS_KEY.into(), json!({"attempt": 1}));
        let d = decide(
            &finished(Ending::Exited(0), ""),
            progressed(&with_details),
            &policy(),
            false,
            false,
        );
        assert_eq!(
            d.report,
            Some(Report::Finish {
                data: Some(data.clone())
            })
        );
        // Stdout's last line still wins.
        let d = decide(
            &finished(Ending::Exited(0), "{\"n\":1}\n"),
            progressed(&with_details),
            &policy(),
            false,
            false,
        );
        let Some(Report::Finish { data: Some(sent) }) = d.report else {
            panic!("{d:?}")
        };
        assert_eq!(Value::Object(sent), json!({"n": 1}));
        // A failure keeps the progress beside its details.
        let d = decide(
            &finished(Ending::Exited(3), ""),
            progressed(&with_details),
            &policy(),
            false,
            false,
        );
        let Some(Report::Retry {
            data: Some(sent), ..
        }) = d.report
        else {
            panic!("{d:?}")
        };
        assert_eq!(sent["step"], 2);
        assert_eq!(sent[DETAILS_KEY]["attempt"], 2);
        // So does a drain's hand-back.
        let d = decide(
            &finished(Ending::Stopped, ""),
            progressed(&data),
            &policy(),
            false,
            true,
        );
        let Some(Report::Retry {
            data: Some(sent), ..
        }) = d.report
        else {
            panic!("{d:?}")
        };
        assert_eq!(sent, data);
    }

    #[test]
    fn failures_retry_until_the_attempts_run_out() {
        let empty = Data::new();
        let d = decide(
            &finished(Ending::Exited(2), ""),
            job(&empty, 1, false),
            &policy(),
            false,
            false,
        );
        assert!(
            matches!(
                d.report,
                Some(Report::Retry {
                    ignore_repeat: true,
                    ..
                })
            ),
            "{d:?}"
        );
        let d = decide(
            &finished(Ending::Signaled(11), ""),
            job(&empty, 3, false),
            &policy(),
            false,
            false,
        );
        let Some(Report::Fail { data: Some(data) }) = d.report else {
            panic!("{d:?}")
        };
        assert_eq!(data[DETAILS_KEY]["signal"], "SIGSEGV");
        assert!(d.summary.contains("SIGSEGV"));
    }

    #[test]
    fn a_repeating_job_moves_on_after_its_last_attempt() {
        let empty = Data::new();
        let d = decide(
            &finished(Ending::Exited(2), ""),
            job(&empty, 3, true),
            &policy(),
            false,
            false,
        );
        let Some(Report::Retry {
            ignore_repeat: false,
            data: Some(data),
            ..
        }) = d.report
        else {
            panic!("{d:?}")
        };
        assert_eq!(data[DETAILS_KEY]["exitCode"], 2);
    }

    #[test]
    fn lease_loss_reports_nothing_and_drain_hands_back() {
        let empty = Data::new();
        assert_eq!(
            decide(
                &finished(Ending::Exited(0), ""),
                job(&empty, 1, false),
                &policy(),
                true,
                false
            )
            .report,
            None
        );
        let d = decide(
            &finished(Ending::Stopped, ""),
            job(&empty, 1, true),
            &policy(),
            false,
            true,
        );
        assert_eq!(
            d.report,
            Some(Report::Retry {
                delay_secs: 0,
                ignore_repeat: true,
                data: None,
                name: None,
                next_run: None,
            })
        );
    }

    #[test]
    fn spawn_failures_are_back_pressure_or_failures() {
        let empty = Data::new();
        let busy = decide_not_run(
            &NotRun::Busy("EAGAIN".into()),
            job(&empty, 1, false),
            &policy(),
        );
        assert!(
            matches!(busy.report, Some(Report::Retry { data: None, .. })),
            "{busy:?}"
        );
        let bad = decide_not_run(
            &NotRun::CannotStart("ENOENT".into()),
            job(&empty, 3, false),
            &policy(),
        );
        let Some(Report::Fail { data: Some(data) }) = bad.report else {
            panic!("{bad:?}")
        };
        assert_eq!(data[DETAILS_KEY]["outcome"], "cannot_start");
    }

    #[test]
    fn details_beside_data_near_the_cap_shrink_to_fit_or_are_left_out() {
        let filled = |room: usize| {
            let mut data = Data::new();
            data.insert("fill".into(), json!(""));
            let fill = "x".repeat(MAX_DATA_BYTES - data_len(&data) - room);
            data.insert("fill".into(), json!(fill));
            data
        };
        let output = "o".repeat(10_000);
        // Room for the verdict, not for the output: the output goes.
        let data = filled(300);
        let d = decide(
            &finished(Ending::Exited(3), &output),
            job(&data, 1, false),
            &policy(),
            false,
            false,
        );
        let Some(Report::Retry {
            data: Some(sent), ..
        }) = d.report
        else {
            panic!("{d:?}")
        };
        assert!(data_len(&sent) <= MAX_DATA_BYTES);
        assert_eq!(sent[DETAILS_KEY]["exitCode"], 3);
        assert_eq!(sent["fill"], data["fill"]);
        // No room at all: the data is left as it is; still a failure.
        let data = filled(0);
        let d = decide(
            &finished(Ending::Exited(3), &output),
            job(&data, 3, false),
            &policy(),
            false,
            false,
        );
        assert_eq!(d.report, Some(Report::Fail { data: None }), "{}", d.summary);
        let d = decide_not_run(
            &NotRun::NoWorker("no worker X in the worker path".into()),
            job(&data, 1, false),
            &policy(),
        );
        assert_eq!(d.report, Some(Report::Fail { data: None }));
    }

    #[test]
    fn the_longest_backoff_saturates() {
        let p = RetryPolicy {
            max_attempts: 3,
            backoff: Duration::MAX,
            max_backoff: Duration::MAX,
            no_worker_timeout: Duration::ZERO,
        };
        for attempt in [1, 2, 30, i64::MAX] {
            assert!(p.delay(attempt) >= Duration::from_secs(u64::MAX / 2));
        }
        assert_eq!(whole_seconds(Duration::MAX), i64::MAX);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = policy();
        for _ in 0..100 {
            let first = p.delay(1).as_secs_f64();
            assert!((7.5..=12.5).contains(&first), "{first}");
            let third = p.delay(3).as_secs_f64();
            assert!((30.0..=50.0).contains(&third), "{third}");
            assert!(p.delay(20).as_secs_f64() <= 75.0);
        }
    }
}
