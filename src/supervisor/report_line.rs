//! The worker's report line: a line on fd 3 holding one JSON object whose
//! only key is [`REPORT_KEY`]. It says how the job is to be reported where
//! the exit code alone cannot: finished whatever the process does after (a
//! shutdown function that throws), a retry with the worker's own delay,
//! time, name and repeat handling (with exit 75), or a failure that skips
//! the retry policy (with any other exit code); with the job's new data
//! (up to 1 MiB), which stdout's last line would cut at the output cap.
//! BWM's PHP runner writes one for every outcome of a worker class; any
//! worker may.
//!
//! ```text
//! {"jobmgr.report":{"outcome":"finish","data":{"count":3}}}
//! {"jobmgr.report":{"outcome":"retry","delay":60,"nextRun":"2026-01-01 00:00:00","name":"a/B","ignoreRepeat":true,"data":{}}}
//! {"jobmgr.report":{"outcome":"fail","reason":"RuntimeException: boom"}}
//! ```
//!
//! Such a line is never progress. The last one written counts; a line that
//! does not read is named in the job's summary and the exit code decides
//! alone.

use serde_json::{Map, Value};

use crate::protocol::{Data, MAX_DATA_BYTES, Timestamp, check_name, data_len};

/// The key of a report line's only member.
pub const REPORT_KEY: &str = "jobmgr.report";

/// The longest delay a report line may ask for: ten years.
const MAX_DELAY_SECS: i64 = 10 * 366 * 86_400;

/// The most characters of a failure's reason kept.
const MAX_REASON_CHARS: usize = 500;

/// The longest report line read: one holding the largest data, and room
/// for the rest.
pub const MAX_REPORT_LINE: usize = MAX_DATA_BYTES + 64 * 1024;

/// How the worker asked its job to be reported.
#[derive(Debug, Clone, PartialEq)]
pub enum Requested {
    /// FinishJob, whatever the process's ending.
    Finish {
        /// The job's new data.
        data: Option<Data>,
    },
    /// RetryJob with these values (with exit 75).
    Retry {
        /// Seconds to wait.
        delay_secs: i64,
        /// An explicit time (wins over the delay), as the protocol writes it.
        next_run: Option<String>,
        /// A new name.
        name: Option<String>,
        /// Retry at the delay or time even if the job repeats.
        ignore_repeat: bool,
        /// The job's new data.
        data: Option<Data>,
    },
    /// FailJob now, whatever attempts are left (with an exit code other
    /// than 0 and 75).
    Fail {
        /// What went wrong, in the worker's words.
        reason: String,
    },
}

/// Whether an object written to fd 3 is a report line rather than progress.
pub fn is_report_line(object: &Map<String, Value>) -> bool {
    object.len() == 1 && object.contains_key(REPORT_KEY)
}

/// Reads a report line's value; the error says what is wrong with it.
pub fn parse(value: &Value) -> Result<Requested, String> {
    let Value::Object(fields) = value else {
        return Err(format!("{REPORT_KEY} must be an object"));
    };
    match fields.get("outcome").and_then(Value::as_str) {
        Some("finish") => Ok(Requested::Finish {
            data: data(fields)?,
        }),
        Some("retry") => retry(fields),
        Some("fail") => {
            let reason = match fields.get("reason") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(text)) => text.chars().take(MAX_REASON_CHARS).collect(),
                Some(_) => return Err("reason must be a string".into()),
            };
            Ok(Requested::Fail { reason })
        }
        Some(other) => Err(format!(
            "outcome {:?} is unknown: use \"finish\", \"retry\" or \"fail\"",
            other.chars().take(40).collect::<String>()
        )),
        None => Err("outcome (\"finish\", \"retry\" or \"fail\") is missing".into()),
    }
}

/// A line's `data`: an object within the data limit.
fn data(fields: &Map<String, Value>) -> Result<Option<Data>, String> {
    match fields.get("data") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) if data_len(map) <= MAX_DATA_BYTES => Ok(Some(map.clone())),
        Some(Value::Object(_)) => Err("data is over 1 MiB".into()),
        Some(_) => Err("data must be a JSON object".into()),
    }
}

fn retry(fields: &Map<String, Value>) -> Result<Requested, String> {
    let delay_secs = match fields.get("delay") {
        None | Some(Value::Null) => 0,
        Some(delay) => delay
            .as_i64()
            .filter(|d| (0..=MAX_DELAY_SECS).contains(d))
            .ok_or("delay must be a whole number of seconds, from 0 to ten years")?,
    };
    let text = |key: &str| -> Result<Option<&str>, String> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.is_empty() => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(format!("{key} must be a string")),
        }
    };
    let next_run = text("nextRun")?
        .map(|t| {
            Timestamp::parse(t)
                .map(|time| time.to_string())
                .ok_or("nextRun must be a time such as \"2026-01-31 23:59:00\" (UTC)")
        })
        .transpose()?;
    let name = text("name")?
        .map(|name| {
            check_name(name)
                .map(|_| name.to_string())
                .map_err(|e| format!("name: {e}"))
        })
        .transpose()?;
    let ignore_repeat = match fields.get("ignoreRepeat") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Err("ignoreRepeat must be true or false".into()),
    };
    Ok(Requested::Retry {
        delay_secs,
        next_run,
        name,
        ignore_repeat,
        data: data(fields)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_an_object_with_the_one_key_is_a_report_line() {
        let object = |v: Value| v.as_object().unwrap().clone();
        assert!(is_report_line(&object(json!({"jobmgr.report": {}}))));
        assert!(!is_report_line(&object(
            json!({"jobmgr.report": {}, "done": 1})
        )));
        assert!(!is_report_line(&object(json!({"done": 1}))));
    }

    #[test]
    fn a_retry_keeps_its_delay_time_name_and_repeat_handling() {
        let got = parse(
            &json!({"outcome": "retry", "delay": 120, "nextRun": "2030-01-02 03:04:05",
            "name": "www/Renamed", "ignoreRepeat": true}),
        );
        assert_eq!(
            got,
            Ok(Requested::Retry {
                delay_secs: 120,
                next_run: Some("2030-01-02 03:04:05".into()),
                name: Some("www/Renamed".into()),
                ignore_repeat: true,
                data: None,
            })
        );
        // BWM's defaults: '' means "no change".
        let got = parse(&json!({"outcome": "retry", "delay": 0, "nextRun": "", "name": ""}));
        assert_eq!(
            got,
            Ok(Requested::Retry {
                delay_secs: 0,
                next_run: None,
                name: None,
                ignore_repeat: false,
                data: None,
            })
        );
    }

    #[test]
    fn a_finish_or_retry_carries_the_data() {
        assert_eq!(
            parse(&json!({"outcome": "finish", "data": {"n": 1}})),
            Ok(Requested::Finish {
                data: Some(json!({"n": 1}).as_object().unwrap().clone())
            })
        );
        let Ok(Requested::Retry {
            data: Some(data), ..
        }) = parse(&json!({"outcome": "retry", "data": {"n": 2}}))
        else {
            panic!()
        };
        assert_eq!(data["n"], 2);
    }

    #[test]
    fn a_fail_keeps_a_bounded_reason() {
        let long = "x".repeat(5_000);
        let Ok(Requested::Fail { reason }) = parse(&json!({"outcome": "fail", "reason": long}))
        else {
            panic!()
        };
        assert_eq!(reason.len(), MAX_REASON_CHARS);
        assert_eq!(
            parse(&json!({"outcome": "fail"})),
            Ok(Requested::Fail {
                reason: String::new()
            })
        );
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (line, says) in [
            (json!("retry"), "must be an object"),
            (json!({}), "outcome"),
            (json!({"outcome": "done"}), "unknown"),
            (json!({"outcome": "retry", "delay": -1}), "delay"),
            (json!({"outcome": "retry", "delay": 1.5}), "delay"),
            (json!({"outcome": "retry", "delay": i64::MAX}), "delay"),
            (json!({"outcome": "retry", "nextRun": "soon"}), "nextRun"),
            (json!({"outcome": "retry", "nextRun": 5}), "nextRun"),
            (json!({"outcome": "retry", "name": "a\nb"}), "name"),
            (
                json!({"outcome": "retry", "name": "x".repeat(100_000)}),
                "name",
            ),
            (
                json!({"outcome": "retry", "ignoreRepeat": "yes"}),
                "ignoreRepeat",
            ),
            (json!({"outcome": "fail", "reason": 3}), "reason"),
            (json!({"outcome": "finish", "data": [1]}), "data"),
            (
                json!({"outcome": "finish", "data": {"x": "y".repeat(MAX_DATA_BYTES)}}),
                "1 MiB",
            ),
        ] {
            let error = parse(&line).unwrap_err();
            assert!(error.contains(says), "{line}: {error}");
        }
    }
}
