//! `jobmgr job watch`: follows the server's event stream (`GET /events`)
//! in the terminal, one line per job state change, reconnecting (and
//! resuming with `Last-Event-ID`) when the server goes away; with one job
//! id, until that job ends.

use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::Value;

use super::CliError;
use super::job::{Connection, client, id_arg};
use super::output::Format;
use crate::client::{ClientError, HttpClient};

/// Options of `jobmgr job watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Follow this job only, and stop when it ends (FINISHED, FAILED, CANCELLED or deleted).
    #[arg(conflicts_with = "name")]
    pub id: Option<String>,
    /// Only jobs whose name matches this GLOB (or comma list).
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only tracked jobs.
    #[arg(long)]
    pub tracked: bool,
}

/// What `watch --help` says after the options.
pub const AFTER_HELP: &str = "Prints one line per event: time (UTC), job id, name, what happened, the state it left the job in, and details (holder, exit code, …); with --format json, each event's JSON object. A server shows the changes made through it (see README, Events). When the server goes away, watch reconnects (0.5 s, doubling to 10 s) and resumes where it was if the server still has those events, else says how many it missed. Ctrl-C ends it (exit 0).";

/// The longest pause between reconnections.
const MOST_BACKOFF: Duration = Duration::from_secs(10);

/// Silence after which the stream counts as gone (the server sends a
/// comment every 15 s).
const SILENCE: Duration = Duration::from_secs(45);

/// Follows events until Ctrl-C, or until the one job watched ends.
pub async fn run(connection: &Connection, args: WatchArgs) -> Result<(), CliError> {
    let (client, format) = client(connection)?;
    let id = args.id.as_deref().map(id_arg).transpose()?;
    let mut query = Vec::new();
    if let Some(id) = id {
        query.push(("job", id.to_string()));
    }
    if let Some(name) = &args.name {
        query.push(("name", name.clone()));
    }
    if args.tracked {
        query.push(("tracked", "true".to_string()));
    }
    let path = match serde_urlencoded::to_string(&query) {
        Ok(q) if !q.is_empty() => format!("/events?{q}"),
        _ => "/events".to_string(),
    };
    let mut watch = Watch {
        client,
        format,
        path,
        job: id,
        last_id: None,
    };
    tokio::select! {
        result = watch.follow() => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// How a stream ended.
enum Ended {
    /// The job watched ended.
    JobEnded,
    /// The connection ended or went silent; reconnect.
    Gone(String),
}

struct Watch {
    client: HttpClient,
    format: Format,
    path: String,
    /// The one job watched.
    job: Option<i64>,
    /// The last event's id, to resume after.
    last_id: Option<String>,
}

impl Watch {
    async fn follow(&mut self) -> Result<(), CliError> {
        let mut backoff = Duration::from_millis(500);
        let mut first = true;
        loop {
            let why = match self
                .client
                .open_stream(&self.path, self.last_id.as_deref())
                .await
            {
                Ok(response) => {
                    backoff = Duration::from_millis(500);
                    if first && let Some(job) = self.job {
                        // Open before looking, so that no change falls between.
                        if let Some(done) = self.ended_already(job).await? {
                            eprintln!("{done}");
                            return Ok(());
                        }
                    }
                    first = false;
                    match self.read(response).await {
                        Ended::JobEnded => return Ok(()),
                        Ended::Gone(why) => why,
                    }
                }
                Err(ClientError::Api { status, .. }) if status == 503 || status >= 500 => {
                    format!("the server is busy or failing (HTTP {status})")
                }
                Err(error @ ClientError::Transport { .. }) => error.to_string(),
                Err(error) => return Err(error.into()),
            };
            eprintln!(
                "jobmgr job watch: {why}; reconnecting in {}",
                humantime::format_duration(backoff)
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MOST_BACKOFF);
        }
    }

    /// Whether the job watched has ended before the stream opened: then
    /// what to say.
    async fn ended_already(&self, job: i64) -> Result<Option<String>, CliError> {
        match self
            .client
            .quick(Method::GET, &format!("/jobs/{job}"), None)
            .await
        {
            Ok(found) => {
                let state = found["state"].as_str().unwrap_or("");
                Ok(["FINISHED", "FAILED", "CANCELLED"]
                    .contains(&state)
                    .then(|| format!("job {job} is {state} already")))
            }
            Err(error) if error.is_not_found() => Err(CliError::NotFound(format!(
                "job {job} is not in the queue: it ended already or never existed \
                 (`jobmgr job query {job}` says which)"
            ))),
            Err(error) => Err(error.into()),
        }
    }

    /// Reads events from `response` until it ends.
    async fn read(&mut self, mut response: reqwest::Response) -> Ended {
        let mut buffer: Vec<u8> = Vec::new();
        loop {
            let chunk = match tokio::time::timeout(SILENCE, response.chunk()).await {
                Err(_) => return Ended::Gone("the stream went silent".into()),
                Ok(Err(error)) => return Ended::Gone(format!("the stream broke: {error}")),
                Ok(Ok(None)) => return Ended::Gone("the server ended the stream".into()),
                Ok(Ok(Some(chunk))) => chunk,
            };
            buffer.extend_from_slice(&chunk);
            while let Some(end) = find_blank_line(&buffer) {
                let block: Vec<u8> = buffer.drain(..end + 2).collect();
                let block = String::from_utf8_lossy(&block);
                if self.on_block(&block) {
                    return Ended::JobEnded;
                }
            }
        }
    }

    /// Handles one event block; true when the job watched ended.
    fn on_block(&mut self, block: &str) -> bool {
        let (mut kind, mut data, mut id) = (None, String::new(), None);
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => kind = Some(value.to_string()),
                "data" => data.push_str(value),
                "id" => id = Some(value.to_string()),
                _ => {}
            }
        }
        let Some(kind) = kind else { return false };
        let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        match kind.as_str() {
            "dropped" | "gap" => {
                eprintln!(
                    "jobmgr job watch: {} ({kind}: {} events missed)",
                    data["message"].as_str().unwrap_or(""),
                    data["missed"]
                );
                return false;
            }
            _ => {}
        }
        if id.is_some() {
            self.last_id = id;
        }
        match self.format {
            Format::Json => println!("{data}"),
            Format::Text => println!("{}", line(&data)),
        }
        let state = data["state"].as_str().unwrap_or("");
        self.job.is_some() && ["FINISHED", "FAILED", "CANCELLED", "DELETED"].contains(&state)
    }
}

/// Where the first blank line (`\n\n`) in `buffer` starts.
fn find_blank_line(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\n\n")
}

/// An event as one line: time, job id, name, kind, state, details.
fn line(data: &Value) -> String {
    let text = |key: &str| data[key].as_str().unwrap_or("").to_string();
    let mut details = Vec::new();
    if let Some(map) = data.as_object() {
        for (key, value) in map {
            if matches!(
                key.as_str(),
                "id" | "kind" | "jobID" | "name" | "state" | "time" | "attempt" | "priority"
            ) {
                continue;
            }
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            details.push(format!("{key}={shown}"));
        }
    }
    if data["kind"] == "handed_out" {
        details.insert(0, format!("attempt={}", data["attempt"]));
    }
    format!(
        "{}  {:>8}  {}  {}  {}  {}",
        text("time"),
        data["jobID"].to_string(),
        text("name"),
        text("kind"),
        text("state"),
        details.join(" ")
    )
    .trim_end()
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_with_its_details() {
        let data = serde_json::json!({
            "id": "1-2", "kind": "failed", "jobID": 7, "name": "Send", "state": "FAILED",
            "time": "2026-01-01 00:00:00.000", "attempt": 1, "outcome": "failed", "exitCode": 3
        });
        assert_eq!(
            line(&data),
            "2026-01-01 00:00:00.000         7  Send  failed  FAILED  exitCode=3 outcome=failed"
        );
        assert_eq!(find_blank_line(b"a\n\nb"), Some(1));
        assert_eq!(find_blank_line(b"a\nb"), None);
    }
}
