//! Finding jobs that ended: `jobmgr job list --archived` (or `--state
//! FINISHED`, `--since`, `--until`) over `GET /archive`, and the fall-back
//! of `jobmgr job query` to a job's archive entry once it left the queue.

use reqwest::Method;
use serde_json::Value;

use super::CliError;
use super::output::{Format, print_job, print_value};
use crate::client::HttpClient;
use crate::protocol::Timestamp;

/// What `job list` asks of the archive.
#[derive(Debug, Default)]
pub struct ArchiveListing {
    /// A GLOB or comma list of names.
    pub name: Option<String>,
    /// `FINISHED` or `FAILED`.
    pub state: Option<String>,
    /// Ended at or after this (a time, or a duration ago such as `2h`).
    pub since: Option<String>,
    /// Ended before this.
    pub until: Option<String>,
    /// At most this many.
    pub limit: usize,
    /// Ids above this.
    pub after: Option<i64>,
}

/// Whether `job list` reads the archive: asked to, or asked for FINISHED
/// jobs (which leave the queue when they end) or a time window.
pub fn wanted(archived: bool, state: Option<&str>, since: bool, until: bool) -> bool {
    archived || since || until || state.is_some_and(|s| s.trim().eq_ignore_ascii_case("FINISHED"))
}

/// A time for `--since`/`--until`: `YYYY-MM-DD HH:MM:SS` (UTC) as it is,
/// or a duration ago (`90m`, `2h`, `7days`) as the time it was then.
fn time_arg(flag: &str, text: &str) -> Result<String, CliError> {
    if Timestamp::parse(text).is_some() {
        return Ok(text.trim().to_string());
    }
    match humantime::parse_duration(text.trim()) {
        Ok(ago) => {
            let ms = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
            Ok(Timestamp(
                Timestamp::now()
                    .0
                    .saturating_sub(ms)
                    .max(Timestamp::EARLIEST.0),
            )
            .to_string())
        }
        Err(_) => Err(CliError::Usage(format!(
            "--{flag} {text:?} is not a time: give \"YYYY-MM-DD HH:MM:SS\" (UTC) or a duration ago such as 2h or 7days"
        ))),
    }
}

/// `job list` over the archive.
pub async fn list(
    client: &HttpClient,
    format: Format,
    listing: ArchiveListing,
) -> Result<(), CliError> {
    let mut query: Vec<(&str, String)> = vec![("limit", listing.limit.to_string())];
    if let Some(name) = listing.name {
        query.push(("name", name));
    }
    if let Some(state) = listing.state {
        query.push(("state", state.trim().to_ascii_uppercase()));
    }
    if let Some(since) = listing.since {
        query.push(("since", time_arg("since", &since)?));
    }
    if let Some(until) = listing.until {
        query.push(("until", time_arg("until", &until)?));
    }
    if let Some(after) = listing.after {
        query.push(("after", after.to_string()));
    }
    let query = serde_urlencoded::to_string(&query).map_err(|e| CliError::Usage(e.to_string()))?;
    let answer = client
        .quick(Method::GET, &format!("/archive?{query}"), None)
        .await?;
    match format {
        Format::Json => print_value(&answer),
        Format::Text => {
            println!(
                "{:>10}  {:<8}  {:<23}  {:>8}  {:<30}  FAILURE",
                "JOBID", "STATE", "ENDED", "ATTEMPTS", "NAME"
            );
            for job in answer["jobs"].as_array().into_iter().flatten() {
                println!(
                    "{:>10}  {:<8}  {:<23}  {:>8}  {:<30}  {}",
                    job["jobID"].to_string(),
                    job["state"].as_str().unwrap_or(""),
                    job["ended"].as_str().unwrap_or(""),
                    job["attempts"].to_string(),
                    job["name"].as_str().unwrap_or(""),
                    job["failure"].as_str().unwrap_or("-")
                );
            }
            if let Some(next) = answer["nextAfter"].as_i64() {
                eprintln!("more may follow: add --after {next}");
            }
        }
    }
    Ok(())
}

/// `job query ID` of a job the queue no longer has: its archive entry, if
/// kept, marked `"archived": true`, with a pointer to `job history ID`.
/// `NotFound` when the archive has nothing either.
pub async fn query(client: &HttpClient, format: Format, id: i64) -> Result<(), CliError> {
    let history = match client
        .quick(Method::GET, &format!("/jobs/{id}/history"), None)
        .await
    {
        Err(error) if error.is_not_found() => Value::Null,
        history => history?,
    };
    let Value::Object(mut ended) = history["archived"].clone() else {
        return Err(CliError::NotFound(format!(
            "No job with this jobID: {id} is neither queued nor in the archive (never created, deleted, or purged by retention)"
        )));
    };
    ended.insert("archived".into(), Value::Bool(true));
    match format {
        Format::Json => print_value(&Value::Object(ended)),
        Format::Text => print_job(&Value::Object(ended)),
    }
    eprintln!(
        "job {id} has ended and left the queue; this is its archive entry. Its runs: jobmgr job history {id}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_jobs_and_time_windows_are_read_from_the_archive() {
        assert!(wanted(false, Some("finished"), false, false));
        assert!(wanted(false, None, true, false));
        assert!(wanted(true, Some("FAILED"), false, false));
        assert!(!wanted(false, Some("FAILED"), false, false));
        assert!(!wanted(false, None, false, false));
    }

    #[test]
    fn times_are_absolute_or_a_duration_ago() {
        assert_eq!(
            time_arg("since", "2026-01-02 03:04:05").unwrap(),
            "2026-01-02 03:04:05"
        );
        let ago = Timestamp::parse(&time_arg("since", "2h").unwrap()).unwrap();
        let expected = Timestamp::now().0 - 7_200_000;
        assert!((ago.0 - expected).abs() < 60_000, "{ago:?}");
        let error = time_arg("until", "yesterday-ish").unwrap_err().to_string();
        assert!(
            error.contains("--until") && error.contains("YYYY-MM-DD"),
            "{error}"
        );
    }
}
