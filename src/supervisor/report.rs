//! What a finished worker means for its job: exit 0 finishes it (a JSON
//! object on stdout's last line becomes its data), 75 (EX_TEMPFAIL) retries
//! it later, and any other ending is retried with exponential backoff and
//! jitter until the attempts run out, then failed. Failure details travel in
//! the job's data under one reserved key, [`DETAILS_KEY`], since a Bedrock
//! server keeps no other history.

use std::time::Duration;

use serde_json::{Value, json};

use super::process::{Ending, Finished};
use crate::client::Report;
use crate::protocol::{Data, MAX_DATA_BYTES, data_len};

/// The data key holding the last outcome's details.
pub const DETAILS_KEY: &str = "_jobmgr";

/// The exit code that asks for a retry later (sysexits' EX_TEMPFAIL).
pub const EX_TEMPFAIL: i32 = 75;

/// How failures are retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Runs in all, the first included, before a failing job is FAILED.
    pub max_attempts: i64,
    /// The delay before the first retry; it doubles each time.
    pub backoff: Duration,
    /// The longest delay.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1 after the first run),
    /// with ±25 % jitter so that failing jobs do not retry in lockstep.
    pub fn delay(&self, attempt: i64) -> Duration {
        let exponent = attempt.clamp(1, 30) as u32 - 1;
        let base = self.backoff.as_secs_f64() * 2f64.powi(exponent as i32);
        let capped = base.min(self.max_backoff.as_secs_f64());
        let jitter = 0.75 + rand::random::<f64>() * 0.5;
        Duration::from_secs_f64(capped * jitter)
    }
}

/// Why the job did not run to an ending of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRun {
    /// There is no worker for its name.
    NoWorker(String),
    /// The worker could not be started (out of processes or memory, …).
    SpawnFailed(String),
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
    data: &Data,
    attempt: i64,
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
    match finished.ending {
        Ending::Exited(0) => {
            let new_data = finished
                .stdout
                .last_line
                .as_deref()
                .and_then(|line| serde_json::from_str::<Value>(line).ok())
                .and_then(|value| match value {
                    Value::Object(map) if data_len(&map) <= MAX_DATA_BYTES => Some(map),
                    _ => None,
                });
            let summary = if new_data.is_some() {
                "finished (exit 0); stdout's last line is the job's new data".to_string()
            } else {
                "finished (exit 0)".to_string()
            };
            Decision {
                report: Some(Report::Finish { data: new_data }),
                summary,
            }
        }
        Ending::Exited(EX_TEMPFAIL) => {
            let delay = policy.delay(attempt);
            Decision {
                report: Some(Report::Retry {
                    delay_secs: whole_seconds(delay),
                    data: Some(with_details(data, finished, "tempfail", attempt)),
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
                data: None,
            }),
            summary: "stopped by shutdown; handed back for an immediate retry".into(),
        },
        ending => {
            let (kind, what) = match ending {
                Ending::Exited(code) => ("exit", format!("exited with {code}")),
                Ending::Signaled(signal) => ("signal", format!("died of {}", signal_name(signal))),
                Ending::TimedOut => ("timeout", "timed out".to_string()),
                Ending::Stopped => ("stopped", "was stopped".to_string()),
            };
            let data = Some(with_details(data, finished, kind, attempt));
            if attempt < policy.max_attempts {
                let delay = policy.delay(attempt);
                Decision {
                    report: Some(Report::Retry {
                        delay_secs: whole_seconds(delay),
                        data,
                    }),
                    summary: format!(
                        "failed: worker {what} (attempt {attempt} of {}); retry in {}s",
                        policy.max_attempts,
                        whole_seconds(delay)
                    ),
                }
            } else {
                Decision {
                    report: Some(Report::Fail { data }),
                    summary: format!(
                        "FAILED: worker {what} (attempt {attempt} of {})",
                        policy.max_attempts
                    ),
                }
            }
        }
    }
}

/// Decides the report for a job whose worker never ran.
pub fn decide_not_run(why: &NotRun, data: &Data, attempt: i64, policy: &RetryPolicy) -> Decision {
    match why {
        NotRun::NoWorker(reason) => {
            let mut data = data.clone();
            data.insert(
                DETAILS_KEY.into(),
                json!({"outcome": "no_worker", "reason": reason, "attempt": attempt}),
            );
            Decision {
                report: Some(Report::Fail { data: Some(data) }),
                summary: format!("FAILED: {reason}"),
            }
        }
        NotRun::SpawnFailed(reason) => {
            // Out of processes or memory is back-pressure, not the job's
            // fault: retry soon without counting it against the job.
            let delay = policy.backoff.min(Duration::from_secs(5)).as_secs().max(1) as i64;
            Decision {
                report: Some(Report::Retry {
                    delay_secs: delay,
                    data: None,
                }),
                summary: format!("could not start the worker ({reason}); retry in {delay}s"),
            }
        }
    }
}

/// The job's data plus the details of this outcome under [`DETAILS_KEY`].
fn with_details(data: &Data, finished: &Finished, kind: &str, attempt: i64) -> Data {
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
    let mut data = data.clone();
    data.insert(DETAILS_KEY.into(), details);
    if data_len(&data) > MAX_DATA_BYTES {
        // Keep the report deliverable: drop the output, keep the verdict.
        if let Some(Value::Object(details)) = data.get_mut(DETAILS_KEY) {
            details.insert(
                "stdout".into(),
                json!("[dropped: the job's data would exceed 1 MiB]"),
            );
            details.insert(
                "stderr".into(),
                json!("[dropped: the job's data would exceed 1 MiB]"),
            );
        }
    }
    data
}

/// A delay in whole seconds, rounded up so that "later" is never "now".
fn whole_seconds(delay: Duration) -> i64 {
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
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
        }
    }

    #[test]
    fn exit_zero_finishes_with_the_last_line_as_data() {
        let d = decide(
            &finished(Ending::Exited(0), "log\n{\"n\":2}\n"),
            &Data::new(),
            1,
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
            &Data::new(),
            1,
            &policy(),
            false,
            false,
        );
        assert_eq!(d.report, Some(Report::Finish { data: None }));
    }

    #[test]
    fn failures_retry_until_the_attempts_run_out() {
        let d = decide(
            &finished(Ending::Exited(2), ""),
            &Data::new(),
            1,
            &policy(),
            false,
            false,
        );
        assert!(matches!(d.report, Some(Report::Retry { .. })), "{d:?}");
        let d = decide(
            &finished(Ending::Signaled(11), ""),
            &Data::new(),
            3,
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
    fn lease_loss_reports_nothing_and_drain_hands_back() {
        assert_eq!(
            decide(
                &finished(Ending::Exited(0), ""),
                &Data::new(),
                1,
                &policy(),
                true,
                false
            )
            .report,
            None
        );
        let d = decide(
            &finished(Ending::Stopped, ""),
            &Data::new(),
            1,
            &policy(),
            false,
            true,
        );
        assert_eq!(
            d.report,
            Some(Report::Retry {
                delay_secs: 0,
                data: None
            })
        );
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
