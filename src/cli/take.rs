//! `jobmgr job take`: leases due jobs to the caller, who must then finish,
//! fail or retry each before its lease runs out (`job get` is its old,
//! hidden name).

use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::CliError;
use super::job::{Connection, client, object};
use super::output::{Format, print_job, print_value};

/// Options of `jobmgr job take`.
#[derive(Debug, Args)]
pub struct TakeArgs {
    /// A GLOB such as '*' or 'www-prod/*', or a comma-separated list of names.
    pub pattern: String,
    /// How long to wait for a job, e.g. 30s.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
    /// How many jobs to take at most.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub count: u64,
    /// How long the jobs are leased for, e.g. 5m [default: the server's, 5m]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub lease: Option<Duration>,
    /// Only jobs of this priority.
    #[arg(long, value_name = "P")]
    pub priority: Option<i64>,
}

/// What `take --help` says after the options.
pub const AFTER_HELP: &str = "The jobs taken are RUNNING and leased to you: no one else gets them until the lease runs out (5m unless --lease says otherwise), then the server hands them out again. End each with `jobmgr job finish ID --lease TOKEN`, `jobmgr job fail ID --lease TOKEN`, or hand it back with `jobmgr job retry ID --lease TOKEN`; `jobmgr job heartbeat ID --lease TOKEN` renews the lease. To look at a job without taking it, use `jobmgr job query ID`.";

/// Takes jobs; `deprecated` when called by its old name `get`.
pub async fn run(
    connection: &Connection,
    args: TakeArgs,
    deprecated: bool,
) -> Result<(), CliError> {
    if deprecated {
        eprintln!(
            "warning: `jobmgr job get` is deprecated and takes (leases) the job: use `jobmgr job take` (or `jobmgr job query ID` to only look)"
        );
    }
    let (client, format) = client(connection)?;
    let wait_ms = args.wait.map(|w| w.as_millis() as u64);
    let body = object(vec![
        ("name", Some(json!(args.pattern))),
        ("numResults", Some(json!(args.count.max(1)))),
        ("waitMs", wait_ms.map(Value::from)),
        ("leaseMs", args.lease.map(|l| json!(l.as_millis() as u64))),
        ("priority", args.priority.map(Value::from)),
    ]);
    let timeout = Duration::from_millis(wait_ms.unwrap_or(0)) + Duration::from_secs(60);
    let answer = client
        .call(Method::POST, "/dequeue", Some(&body), timeout)
        .await?;
    let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        return Err(CliError::NotFound("No job found".into()));
    }
    match (format, jobs.len()) {
        (Format::Json, 1) if args.count <= 1 => print_value(&jobs[0]),
        (Format::Json, _) => print_value(&answer),
        (Format::Text, _) => jobs.iter().for_each(print_job),
    }
    // Scripts read stdout as JSON: the note goes there only as text.
    for job in &jobs {
        let note = lease_note(job);
        match format {
            Format::Text => println!("{note}"),
            Format::Json => eprintln!("{note}"),
        }
    }
    Ok(())
}

/// One line saying how long `job` is leased and how to end it.
pub fn lease_note(job: &Value) -> String {
    let id = &job["jobID"];
    let lease = job["lease"].as_str().unwrap_or("");
    let term = job["leaseMs"]
        .as_u64()
        .map(|ms| humantime::format_duration(Duration::from_secs(ms / 1000)).to_string());
    let until = match (job["leaseExpires"].as_str(), term) {
        (Some(""), _) | (None, None) => "until it is reported".to_string(),
        (Some(at), Some(term)) => format!("for {term} (until {at} UTC)"),
        (Some(at), None) => format!("until {at} UTC"),
        (None, Some(term)) => format!("for {term}"),
    };
    format!(
        "job {id} is leased to you {until}: finish it with `jobmgr job finish {id} --lease {lease}`, fail it with `jobmgr job fail {id} --lease {lease}`, or hand it back with `jobmgr job retry {id} --lease {lease}`"
    )
}
