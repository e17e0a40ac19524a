//! Failure groups, and what a report's data says about how a run ended.
//!
//! The supervisor puts a run's details under the data key `_jobmgr`
//! (`outcome`, `exitCode`, `signal`, `stdout`, `stderr`, …) on both ports,
//! since a Bedrock server keeps no other history; the server reads them from
//! there. Groups are keyed `exit:CODE`, `signal:NAME`, `timeout`, `oom`,
//! `no_worker`, `cannot_start`, `lease_lost`, `no_report` (a `retryAfter`
//! job handed out too often without a report), and `failed` for a FailJob
//! that says nothing more.

use serde_json::Value;

use super::AttemptEnd;
use crate::protocol::{Data, RunFacts};

/// The data key holding a run's details (the supervisor's `DETAILS_KEY`).
pub const DETAILS_KEY: &str = "_jobmgr";

/// The most output kept per stream and attempt, in bytes: the first and
/// the last half of it when there was more (see [`head_and_tail`]).
pub const OUTPUT_KEPT_BYTES: usize = 4096;

/// The group of a job the server failed because its lease lapsed too often.
pub const LEASE_LOST: &str = "lease_lost";

/// The group of a `retryAfter` job handed out too often without a report.
pub const NO_REPORT: &str = "no_report";

/// The outcome of a streak of hand-backs for want of the job's worker.
pub const HANDED_BACK: &str = "handed_back";

/// Whether a RetryJob's data says it hands the job back for want of its
/// worker (the supervisor's details: `outcome` `no_worker`, with the time
/// of the streak's first hand-back in `noWorkerSince`). Such a hand-out
/// was no run: it counts no attempt, and the history keeps one row for the
/// streak. A supervisor giving up on the run (past `--no-worker-timeout`)
/// says `no_worker` without `noWorkerSince`.
pub fn is_no_worker_hand_back(data: Option<&Data>) -> bool {
    let Some(details) = data
        .and_then(|d| d.get(DETAILS_KEY))
        .and_then(Value::as_object)
    else {
        return false;
    };
    details.get("outcome").and_then(Value::as_str) == Some("no_worker")
        && details.get("noWorkerSince").is_some_and(Value::is_string)
}

/// The longest group key accepted from outside.
pub const MAX_GROUP_BYTES: usize = 64;

/// Whether `group` is a well-formed group key: 1 to 64 bytes of letters,
/// digits, `_`, `:`, `-` and `+`.
pub fn valid_group(group: &str) -> bool {
    !group.is_empty()
        && group.len() <= MAX_GROUP_BYTES
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'-' | b'+'))
}

/// How a reported run ended: `outcome` is the report (`finished`,
/// `retried` or `failed`), `data` the report's data (its details, if any),
/// and `run` what the supervisor saw, which wins where both say something.
pub fn reported_end(outcome: &str, data: Option<&Data>, run: Option<&RunFacts>) -> AttemptEnd {
    let details = data
        .and_then(|d| d.get(DETAILS_KEY))
        .and_then(Value::as_object);
    let detail = |key: &str| {
        details
            .and_then(|d| d.get(key))
            .and_then(Value::as_str)
            .map(|s| head_and_tail(s, OUTPUT_KEPT_BYTES))
    };
    let exit_code = run.and_then(|r| r.exit_code.map(i64::from)).or_else(|| {
        details
            .and_then(|d| d.get("exitCode"))
            .and_then(Value::as_i64)
    });
    let signal = run
        .and_then(|r| r.signal.clone())
        .or_else(|| detail("signal"));
    let output = |stream: &str, given: Option<&String>| {
        given
            .map(|s| head_and_tail(s, OUTPUT_KEPT_BYTES))
            .or_else(|| detail(stream))
    };
    // The sizes the supervisor puts in its details (`outputBytes`).
    let output_bytes = |stream: &str| {
        details
            .and_then(|d| d.get("outputBytes"))
            .and_then(|sizes| sizes.get(stream))
            .and_then(Value::as_u64)
    };
    let stdout = output("stdout", run.and_then(|r| r.stdout.as_ref()));
    let stderr = output("stderr", run.and_then(|r| r.stderr.as_ref()));
    let kind = details
        .and_then(|d| d.get("outcome"))
        .and_then(Value::as_str)
        .unwrap_or(match (exit_code, &signal) {
            (_, Some(_)) => "signal",
            (Some(_), None) => "exit",
            (None, None) => "",
        });
    let failure = (outcome != "finished").then(|| group_of(kind, exit_code, signal.as_deref()));
    AttemptEnd {
        outcome: outcome.into(),
        failure,
        exit_code,
        signal,
        stdout_bytes: at_least_kept(
            run.and_then(|r| r.stdout_bytes)
                .or_else(|| output_bytes("stdout")),
            &stdout,
        ),
        stderr_bytes: at_least_kept(
            run.and_then(|r| r.stderr_bytes)
                .or_else(|| output_bytes("stderr")),
            &stderr,
        ),
        stdout,
        stderr,
        hand_backs: 0,
    }
}

/// A reported size, raised to the length of the output kept (a report
/// that claims less output than it carries is taken at what it carries).
fn at_least_kept(reported: Option<u64>, kept: &Option<String>) -> Option<u64> {
    let kept = kept.as_ref().map_or(0, |t| t.len() as u64);
    reported.map(|n| n.max(kept))
}

/// The group for a run's details.
fn group_of(kind: &str, exit_code: Option<i64>, signal: Option<&str>) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
            .take(MAX_GROUP_BYTES - 8)
            .collect()
    };
    match (kind, exit_code, signal) {
        ("exit", Some(code), _) => format!("exit:{code}"),
        ("signal", _, Some(signal)) if !clean(signal).is_empty() => {
            format!("signal:{}", clean(signal))
        }
        ("" | "exit" | "signal", _, _) => "failed".into(),
        (kind, _, _) => {
            let kind = clean(kind);
            if kind.is_empty() {
                "failed".into()
            } else {
                kind
            }
        }
    }
}

/// The longest error line [`error_line`] gives, in characters.
pub const ERROR_LINE_CHARS: usize = 200;

/// A failed job's error in one line, for a listing: the last non-empty
/// line of its last attempt's stderr, else the reason its details give
/// (`_jobmgr.reason`, as for a worker that never ran), else none. Control
/// characters are escaped and the line is cut (see [`last_line`]).
pub fn error_line(data: &Data, last: Option<&super::Attempt>) -> Option<String> {
    let stderr = last
        .and_then(|a| a.end.as_ref())
        .and_then(|end| end.stderr.as_deref());
    let reason = || {
        data.get(DETAILS_KEY)
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
    };
    last_line(stderr.filter(|s| !s.trim().is_empty()).or_else(reason)?)
}

/// The last non-empty line of `text` for a listing or a log line: control
/// characters and the invisible ones that reorder or hide text (bidi
/// overrides, zero-width, line and paragraph separators) escaped, so that a
/// worker cannot forge lines of a log, a terminal's colours or what a line
/// appears to say; cut to [`ERROR_LINE_CHARS`] characters with `…`.
pub fn last_line(text: &str) -> Option<String> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let line = line.trim_end_matches('\r');
    let mut out = String::new();
    for (count, c) in line.chars().enumerate() {
        if count == ERROR_LINE_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() || invisible(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// A character that changes how text around it shows without showing
/// itself: zero-width and direction marks, bidi embeddings, overrides and
/// isolates, line and paragraph separators, the byte order mark.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// `text` if it is at most `max` bytes, else its first and last bytes
/// with a marker between them saying how many were dropped
/// (`[… N bytes of output dropped …]`, as the supervisor writes it): about
/// half of what is left of `max` after the marker from the start, the rest
/// from the end, both cut on character boundaries. The result is never
/// longer than `max` bytes; with no room for the marker it is the tail.
pub fn head_and_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    // The marker with the most digits it can need; the count it carries
    // in the end is no longer, so the whole fits.
    let marker = |dropped: usize| format!("\n[… {dropped} bytes of output dropped …]\n");
    let Some(budget) = max.checked_sub(marker(text.len()).len()) else {
        return tail(text, max);
    };
    let mut head = budget / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut start = text.len() - (budget - budget / 2);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "{}{}{}",
        &text[..head],
        marker(start - head),
        &text[start..]
    )
}

/// The last `max` bytes of `text`, starting on a character boundary.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_last_line_is_escaped_and_bounded() {
        assert_eq!(
            last_line("first\nboom: disk full\r\n\n  \n").as_deref(),
            Some("boom: disk full")
        );
        assert_eq!(last_line(" \n\n"), None);
        assert_eq!(
            last_line("a\u{1b}[31mred\tx").as_deref(),
            Some("a\\u{1b}[31mred\\tx")
        );
        let long = last_line(&"é".repeat(1000)).unwrap();
        assert_eq!(long.chars().count(), ERROR_LINE_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_no_worker_hand_back_is_told_by_its_details() {
        let hand_back =
            data(json!({"outcome": "no_worker", "noWorkerSince": "2026-01-01 00:00:00"}));
        assert!(is_no_worker_hand_back(Some(&hand_back)));
        // Giving up on the run, another outcome, no details, no data.
        let given_up = data(json!({"outcome": "no_worker"}));
        let other = data(json!({"outcome": "exit", "noWorkerSince": "2026-01-01 00:00:00"}));
        let odd = data(json!({"outcome": "no_worker", "noWorkerSince": 1}));
        for not in [&given_up, &other, &odd, &Data::new()] {
            assert!(!is_no_worker_hand_back(Some(not)), "{not:?}");
        }
        assert!(!is_no_worker_hand_back(None));
    }

    #[test]
    fn a_failed_jobs_error_is_its_stderr_else_its_reason() {
        let reason = data(json!({"outcome": "no_worker", "reason": "no worker x"}));
        assert_eq!(error_line(&reason, None).as_deref(), Some("no worker x"));
        let attempt = crate::server::ledger::Attempt {
            job_id: 1,
            name: "n".into(),
            attempt: 1,
            worker: None,
            due: crate::protocol::Timestamp(0),
            started: crate::protocol::Timestamp(0),
            ended: None,
            end: Some(AttemptEnd {
                stderr: Some("x\nboom\n".into()),
                ..AttemptEnd::default()
            }),
        };
        assert_eq!(error_line(&reason, Some(&attempt)).as_deref(), Some("boom"));
        assert_eq!(error_line(&Data::new(), None), None);
    }

    fn data(details: Value) -> Data {
        let mut data = Data::new();
        data.insert(DETAILS_KEY.into(), details);
        data
    }

    #[test]
    fn groups_follow_the_supervisors_details() {
        let cases = [
            (json!({"outcome": "exit", "exitCode": 3}), "exit:3"),
            (
                json!({"outcome": "signal", "signal": "SIGKILL"}),
                "signal:SIGKILL",
            ),
            (json!({"outcome": "timeout", "killed": true}), "timeout"),
            (json!({"outcome": "oom"}), "oom"),
            (
                json!({"outcome": "no_worker", "reason": "no worker"}),
                "no_worker",
            ),
            (json!({"outcome": "cannot_start"}), "cannot_start"),
            (json!({"outcome": "exit"}), "failed"),
            (json!({"outcome": "a b\nc/../"}), "abc"),
            (json!("not an object"), "failed"),
        ];
        for (details, group) in cases {
            let end = reported_end("failed", Some(&data(details.clone())), None);
            assert_eq!(end.failure.as_deref(), Some(group), "{details}");
            assert!(valid_group(group));
        }
        assert_eq!(
            reported_end("failed", None, None).failure.as_deref(),
            Some("failed")
        );
        assert_eq!(reported_end("finished", None, None).failure, None);
    }

    #[test]
    fn what_the_supervisor_saw_wins_over_the_details() {
        let run = RunFacts {
            exit_code: Some(0),
            signal: None,
            stdout: Some("sent 3 mails\n".into()),
            stderr: Some(String::new()),
            ..RunFacts::default()
        };
        let finished = reported_end("finished", None, Some(&run));
        assert_eq!(finished.exit_code, Some(0));
        assert_eq!(finished.stdout.as_deref(), Some("sent 3 mails\n"));
        assert_eq!(finished.failure, None);
        // Without details (the data was at its cap), the run names the group.
        let killed = RunFacts {
            exit_code: None,
            signal: Some("SIGKILL".into()),
            ..run.clone()
        };
        assert_eq!(
            reported_end("failed", None, Some(&killed))
                .failure
                .as_deref(),
            Some("signal:SIGKILL")
        );
        let exited = RunFacts {
            exit_code: Some(4),
            ..run.clone()
        };
        assert_eq!(
            reported_end("retried", None, Some(&exited))
                .failure
                .as_deref(),
            Some("exit:4")
        );
        // With details, their kind names the group (a timeout ends by signal).
        let timeout = data(json!({"outcome": "timeout", "stdout": "old"}));
        let end = reported_end("failed", Some(&timeout), Some(&killed));
        assert_eq!(end.failure.as_deref(), Some("timeout"));
        assert_eq!(end.stdout.as_deref(), Some("sent 3 mails\n"));
    }

    #[test]
    fn output_keeps_its_head_and_tail_bounded_and_whole_characters() {
        let long = format!("{}é{}", "a".repeat(10_000), "b".repeat(4094));
        let end = reported_end(
            "retried",
            Some(&data(
                json!({"outcome": "exit", "exitCode": 1, "stdout": long, "stderr": "oops"}),
            )),
            None,
        );
        let stdout = end.stdout.unwrap();
        assert!(stdout.len() <= OUTPUT_KEPT_BYTES);
        assert!(stdout.len() > OUTPUT_KEPT_BYTES - 8, "the budget is used");
        assert!(stdout.starts_with("aaa"), "the head is kept");
        assert!(stdout.ends_with("bbb"), "the tail is kept");
        let (head, rest) = stdout.split_once("\n[… ").unwrap();
        let (count, tail) = rest.split_once(" bytes of output dropped …]\n").unwrap();
        assert_eq!(
            head.len() + count.parse::<usize>().unwrap() + tail.len(),
            long.len(),
            "the marker counts exactly what was dropped"
        );
        assert!(
            head.len().abs_diff(tail.len()) <= 1,
            "{} {}",
            head.len(),
            tail.len()
        );
        assert_eq!(end.stderr.as_deref(), Some("oops"));
        assert_eq!(end.exit_code, Some(1));
    }

    #[test]
    fn head_and_tail_cut_on_character_boundaries() {
        assert_eq!(head_and_tail("héllo", 4), "llo", "no room for a marker");
        for len in [1, 2, 3, 1000, 4097, 10_000] {
            let text = "é€😀".repeat(len);
            for max in [0, 3, 10, 40, 64, 100, 4096] {
                let kept = head_and_tail(&text, max);
                assert!(kept.len() <= max || text.len() <= max, "{len} {max}");
                if text.len() <= max {
                    assert_eq!(kept, text);
                }
            }
        }
        let text = "x".repeat(100);
        assert_eq!(head_and_tail(&text, 100), text);
        assert_eq!(
            head_and_tail(&text, 10),
            "x".repeat(10),
            "no room for a marker"
        );
        let kept = head_and_tail(&format!("{}{}", "a".repeat(50), "b".repeat(50)), 60);
        assert!(kept.starts_with('a') && kept.ends_with('b'), "{kept}");
        assert!(kept.contains("bytes of output dropped"), "{kept}");
    }

    #[test]
    fn a_last_line_cannot_forge_a_log_line_or_hide_what_it_says() {
        let line =
            last_line("ok\nevil\u{1b}[31mRED\r\u{2028}fake\u{202E}txt.exe\u{200B}\n").unwrap();
        assert_eq!(
            line,
            "evil\\u{1b}[31mRED\\r\\u{2028}fake\\u{202e}txt.exe\\u{200b}"
        );
        assert!(!line.chars().any(|c| c.is_control() || invisible(c)));
        let long = last_line(&"x".repeat(ERROR_LINE_CHARS + 5)).unwrap();
        assert_eq!(long.chars().count(), ERROR_LINE_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_reported_size_is_never_less_than_the_output_it_carries() {
        let run = RunFacts {
            stderr: Some("four".into()),
            stderr_bytes: Some(2),
            stdout_bytes: Some(10),
            ..RunFacts::default()
        };
        let end = reported_end("failed", None, Some(&run));
        assert_eq!(end.stderr_bytes, Some(4));
        assert_eq!(end.stdout_bytes, Some(10));
    }

    #[test]
    fn group_keys_from_outside_are_checked() {
        assert!(valid_group("exit:3"));
        assert!(valid_group("signal:SIGSEGV"));
        assert!(!valid_group(""));
        assert!(!valid_group("a/b"));
        assert!(!valid_group("x y"));
        assert!(!valid_group(&"x".repeat(65)));
    }
}
