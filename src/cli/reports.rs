//! `jobmgr stats`, `jobmgr failures`, `jobmgr workers`, `jobmgr purge` and
//! the text form of `jobmgr job history`: a running server's ledger, as
//! tables for people and JSON (the server's answer as it is) for programs.

use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::CliError;
use super::job::{Connection, client};
use super::output::{Format, print_value};

/// Options of `jobmgr stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only names matching this GLOB or comma list.
    #[arg(long, value_name = "GLOB")]
    name: Option<String>,
    /// Per supervisor instead of per name: runs reported, their executing
    /// time, busy time, capacity offered and utilisation.
    #[arg(long, conflicts_with = "name")]
    workers: bool,
    /// With --workers: only supervisors whose id matches this GLOB.
    #[arg(long, value_name = "GLOB", requires = "workers")]
    worker: Option<String>,
    /// One point per hour or per day (UTC).
    #[arg(long, value_name = "PERIOD", default_value = "hour", value_parser = ["hour", "day"])]
    period: String,
    /// From this time, "YYYY-MM-DD HH:MM:SS" UTC [default: a day of hours, or 30 days].
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// Up to this time [default: the end of the current period].
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
}

/// Options of `jobmgr failures`.
#[derive(Debug, Args)]
pub struct FailuresArgs {
    #[command(flatten)]
    connection: Connection,
    /// A failure group (such as exit:3, signal:SIGKILL, timeout, oom, no_worker, lease_lost) to list or act on.
    group: Option<String>,
    /// Queue the group's jobs again, earliest failure first, as new (attempts counted afresh).
    #[arg(long, requires = "group", conflicts_with = "delete")]
    retry: bool,
    /// Delete the group's jobs, earliest failure first.
    #[arg(long, requires = "group")]
    delete: bool,
    /// How many jobs to list, retry or delete [default: 100 listed; all, up to 10000, acted on].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    count: Option<u64>,
}

/// Options of `jobmgr workers`.
#[derive(Debug, Args)]
pub struct WorkersArgs {
    #[command(flatten)]
    connection: Connection,
}

/// Options of `jobmgr purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    connection: Connection,
}

fn query(pairs: &[(&str, Option<String>)]) -> Result<String, CliError> {
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (*k, v)))
        .collect();
    serde_urlencoded::to_string(pairs).map_err(|e| CliError::Usage(e.to_string()))
}

/// A group name as a path segment; the server checks the group's form.
fn group_path(group: &str) -> String {
    group
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b':' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A JSON value as a table cell: strings bare, `-` for null. (`Value`'s
/// own `Display` ignores width and alignment, so it cannot fill a column.)
fn cell(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Seconds for a table: `25ms`, `1.5s`, `2m03s`, `1h05m`, or `-`.
fn secs(value: &Value) -> String {
    let Some(secs) = value.as_f64() else {
        return "-".into();
    };
    if secs < 1.0 {
        format!("{:.0}ms", secs * 1000.0)
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else if secs < 3600.0 {
        format!("{}m{:02}s", (secs / 60.0) as u64, (secs % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (secs / 3600.0) as u64,
            ((secs % 3600.0) / 60.0) as u64
        )
    }
}

/// The heading of a statistics table: its window and period.
fn print_window(answer: &Value, what: &str) {
    println!(
        "{} to {}, per {}{what}",
        answer["from"].as_str().unwrap_or(""),
        answer["to"].as_str().unwrap_or(""),
        answer["period"].as_str().unwrap_or("")
    );
}

/// `jobmgr stats`.
pub async fn stats(args: StatsArgs) -> Result<(), CliError> {
    let (client, format) = client(&args.connection)?;
    let (path, filter) = if args.workers {
        ("/stats/workers", ("worker", args.worker))
    } else {
        ("/stats", ("name", args.name))
    };
    let query = query(&[
        filter,
        ("period", Some(args.period)),
        ("from", args.from),
        ("to", args.to),
    ])?;
    let answer = client
        .quick(Method::GET, &format!("{path}?{query}"), None)
        .await?;
    if format == Format::Json {
        print_value(&answer);
        return Ok(());
    }
    if args.workers {
        print_worker_stats(&answer);
        return Ok(());
    }
    print_window(&answer, "");
    println!(
        "{:>7} {:>7} {:>8} {:>6} {:>7}  {:>8} {:>8} {:>8} {:>8}  {:<24} NAME",
        "ADDED",
        "STARTED",
        "FINISHED",
        "FAILED",
        "RETRIED",
        "WAIT",
        "WAIT MAX",
        "RUN",
        "SERVICE",
        "QUEUED/RUNNING/FAILED"
    );
    let empty = Vec::new();
    let series = answer["series"].as_array().unwrap_or(&empty);
    let queue = &answer["queue"];
    let mut names: Vec<&str> = series.iter().filter_map(|s| s["name"].as_str()).collect();
    if let Some(depth) = queue.as_object() {
        names.extend(depth.keys().map(String::as_str));
    }
    names.sort_unstable();
    names.dedup();
    for name in names {
        let points = series
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["points"].as_array())
            .unwrap_or(&empty);
        let line = Totals::of(points);
        let depth = &queue[name];
        let count = |state: &str| depth[state].as_u64().unwrap_or(0);
        println!(
            "{:>7} {:>7} {:>8} {:>6} {:>7}  {:>8} {:>8} {:>8} {:>8}  {:<24} {name}",
            line.added,
            line.started,
            line.finished,
            line.failed,
            line.retried,
            secs(&line.wait_mean),
            secs(&line.wait_max),
            secs(&line.run_mean),
            secs(&line.service_mean),
            format!(
                "{}/{}/{}",
                count("QUEUED") + count("RUNQUEUED"),
                count("RUNNING"),
                count("FAILED")
            ),
        );
    }
    let total = &answer["total"];
    println!(
        "{:>7} {:>7} {:>8} {:>6} {:>7}  {:>8} {:>8} {:>8} {:>8}  {:<24} (all)",
        cell(&total["added"]),
        cell(&total["started"]),
        cell(&total["finished"]),
        cell(&total["failed"]),
        cell(&total["retried"]),
        secs(&total["wait"]["mean"]),
        secs(&total["wait"]["max"]),
        secs(&total["run"]["mean"]),
        secs(&total["service"]["mean"]),
        "",
    );
    Ok(())
}

/// The text form of `GET /stats/workers`: a row per supervisor, its
/// figures over the whole window.
fn print_worker_stats(answer: &Value) {
    print_window(answer, ", per supervisor");
    println!(
        "{:>7}  {:>8}  {:>8}  {:>8}  {:>8}  {:>5}  WORKER",
        "JOBS", "RUN", "RUN MAX", "BUSY", "CAPACITY", "UTIL"
    );
    for series in answer["series"].as_array().into_iter().flatten() {
        let total = &series["total"];
        println!(
            "{:>7}  {:>8}  {:>8}  {:>8}  {:>8}  {:>5}  {}",
            cell(&total["jobs"]),
            secs(&total["run"]["mean"]),
            secs(&total["run"]["max"]),
            secs(&total["busySecs"]),
            secs(&total["capacitySecs"]),
            percent(&total["utilisation"]),
            series["worker"].as_str().unwrap_or("")
        );
    }
}

/// A fraction as a percentage for a table, or `-`.
fn percent(value: &Value) -> String {
    value
        .as_f64()
        .map_or("-".into(), |u| format!("{:.0}%", u * 100.0))
}

/// A name's figures over all its points (counts add; means weigh by count).
struct Totals {
    added: u64,
    started: u64,
    finished: u64,
    failed: u64,
    retried: u64,
    wait_mean: Value,
    wait_max: Value,
    run_mean: Value,
    service_mean: Value,
}

impl Totals {
    fn of(points: &[Value]) -> Totals {
        let sum = |key: &str| points.iter().filter_map(|p| p[key].as_u64()).sum::<u64>();
        let mean = |key: &str| {
            let (count, total) = points.iter().fold((0u64, 0.0), |(n, t), p| {
                let c = p[key]["count"].as_u64().unwrap_or(0);
                (n + c, t + p[key]["mean"].as_f64().unwrap_or(0.0) * c as f64)
            });
            if count == 0 {
                Value::Null
            } else {
                json!(total / count as f64)
            }
        };
        let max = |key: &str| {
            points
                .iter()
                .filter_map(|p| p[key]["max"].as_f64())
                .reduce(f64::max)
                .map_or(Value::Null, |m| json!(m))
        };
        Totals {
            added: sum("added"),
            started: sum("started"),
            finished: sum("finished"),
            failed: sum("failed"),
            retried: sum("retried"),
            wait_mean: mean("wait"),
            wait_max: max("wait"),
            run_mean: mean("run"),
            service_mean: mean("service"),
        }
    }
}

/// Nothing found in a failure group: exit 3, saying where the groups are.
fn no_failed_jobs(group: &str) -> CliError {
    CliError::NotFound(format!(
        "no FAILED job in the failure group {group:?} (`jobmgr failures` lists the groups)"
    ))
}

/// `jobmgr failures`: the groups, or one group's jobs (exit 3 when it has
/// none), or its jobs retried or deleted (exit 3 when none was).
pub async fn failures(args: FailuresArgs) -> Result<(), CliError> {
    let (client, format) = client(&args.connection)?;
    let Some(group) = args.group else {
        let answer = client.quick(Method::GET, "/failures", None).await?;
        match format {
            Format::Json => print_value(&answer),
            Format::Text => {
                println!("{:>7}  {:<23}  {:<23}  GROUP", "JOBS", "FIRST", "LAST");
                for group in answer["groups"].as_array().into_iter().flatten() {
                    println!(
                        "{:>7}  {:<23}  {:<23}  {}",
                        cell(&group["count"]),
                        group["first"].as_str().unwrap_or(""),
                        group["last"].as_str().unwrap_or(""),
                        group["group"].as_str().unwrap_or("")
                    );
                }
            }
        }
        return Ok(());
    };
    let path = format!("/failures/{}", group_path(&group));
    let action = if args.retry {
        Some(("retry", "retried"))
    } else if args.delete {
        Some(("delete", "deleted"))
    } else {
        None
    };
    if let Some((verb, done)) = action {
        let body = match args.count {
            Some(count) => json!({"count": count}),
            None => json!({}),
        };
        let answer = client
            .call(
                Method::POST,
                &format!("{path}/{verb}"),
                Some(&body),
                Duration::from_secs(120),
            )
            .await?;
        let count = answer[done].as_u64().unwrap_or(0);
        match format {
            Format::Json => print_value(&answer),
            Format::Text => println!(
                "{done} {} of {group}",
                super::output::count(count, "job", "jobs")
            ),
        }
        return if count == 0 {
            Err(no_failed_jobs(&group))
        } else {
            Ok(())
        };
    }
    let limit = args.count.map(|c| c.to_string());
    let query = query(&[("limit", limit)])?;
    let answer = client
        .quick(Method::GET, &format!("{path}?{query}"), None)
        .await?;
    let jobs = answer["jobs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if jobs.is_empty() {
        return Err(no_failed_jobs(&group));
    }
    match format {
        Format::Json => print_value(&answer),
        Format::Text => print_failed(jobs),
    }
    Ok(())
}

/// `jobmgr workers`.
pub async fn workers(args: WorkersArgs) -> Result<(), CliError> {
    let (client, format) = client(&args.connection)?;
    let answer = client.quick(Method::GET, "/workers", None).await?;
    if format == Format::Json {
        print_value(&answer);
        return Ok(());
    }
    println!(
        "{:<6}  {:>8}  {:>7}  {:>5}  {:>5}  {:<23}  {:<40}  JOBS",
        "STATE", "CAPACITY", "RUNNING", "LOAD", "UTIL", "LAST SEEN", "WORKER"
    );
    for worker in answer["workers"].as_array().into_iter().flatten() {
        let jobs: Vec<String> = worker["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Value::to_string)
            .collect();
        println!(
            "{:<6}  {:>8}  {:>7}  {:>5}  {:>5}  {:<23}  {:<40}  {}",
            worker["state"].as_str().unwrap_or(""),
            cell(&worker["capacity"]),
            cell(&worker["running"]),
            worker["load"]
                .as_f64()
                .map_or("-".into(), |l| format!("{l:.2}")),
            percent(&worker["utilisation"]),
            worker["lastSeen"].as_str().unwrap_or(""),
            worker["id"].as_str().unwrap_or(""),
            jobs.join(",")
        );
    }
    Ok(())
}

/// `jobmgr purge`.
pub async fn purge(args: PurgeArgs) -> Result<(), CliError> {
    let (client, format) = client(&args.connection)?;
    let answer = client
        .call(
            Method::POST,
            "/purge",
            Some(&json!({})),
            Duration::from_secs(300),
        )
        .await?;
    match format {
        Format::Json => print_value(&answer),
        Format::Text => {
            for (what, count) in answer.as_object().into_iter().flatten() {
                println!("{what:>10}: {count}");
            }
        }
    }
    Ok(())
}

/// A failure group's jobs as a table: each with its error (the last line
/// of its stderr, or the reason it never ran).
fn print_failed(jobs: &[Value]) {
    println!(
        "{:>10}  {:<23}  {:<30}  ERROR",
        "JOBID", "FAILED RUN", "NAME"
    );
    for job in jobs {
        println!(
            "{:>10}  {:<23}  {:<30}  {}",
            job["jobID"].to_string(),
            job["lastRun"].as_str().unwrap_or("-"),
            job["name"].as_str().unwrap_or(""),
            job["error"].as_str().unwrap_or("-")
        );
    }
}

/// `10.0 MB`, `4.0 KiB`, `12 bytes`: a size for people.
fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.1} GiB", b / (KIB * KIB * KIB))
    }
}

/// The heading of a stream in a history: its size, and how much of it
/// the server kept when that is less than all of it.
fn stream_heading(stream: &str, kept: &str, total: Option<u64>, shown_lines: usize) -> String {
    let lines = kept.lines().count();
    let shown = if lines > shown_lines {
        format!("; the last {shown_lines} lines shown")
    } else {
        String::new()
    };
    match total {
        Some(total) if total > kept.len() as u64 => format!(
            "{stream} ({} in all, cut: the server kept its head and tail, {}{shown}):",
            size(total),
            size(kept.len() as u64)
        ),
        Some(total) => format!("{stream} ({}{shown}):", size(total)),
        None if lines > shown_lines => format!("{stream} (the last {shown_lines} lines):"),
        None => format!("{stream}:"),
    }
}

/// How an attempt ended, in a few words: `exit 3`, `SIGSEGV`, `timeout
/// (killed by SIGTERM after 30.0s)`, or its failure group.
fn ending(attempt: &Value) -> String {
    match (
        &attempt["exitCode"],
        &attempt["signal"],
        &attempt["failure"],
    ) {
        (_, signal, Value::String(failure)) if failure == "timeout" => match signal {
            Value::String(signal) => format!(
                "timeout (killed by {signal} after {})",
                secs(&attempt["runSecs"])
            ),
            _ => "timeout".into(),
        },
        (Value::Number(code), _, _) => format!("exit {code}"),
        (_, Value::String(signal), _) => signal.clone(),
        (_, _, Value::String(failure)) => failure.clone(),
        _ => "-".into(),
    }
}

/// The text form of a job's history.
pub fn print_history(history: &Value) {
    let id = &history["jobID"];
    match (&history["job"], &history["archived"]) {
        (Value::Object(job), _) => println!(
            "job {id} {}: {}",
            job.get("name").and_then(Value::as_str).unwrap_or(""),
            job.get("state").and_then(Value::as_str).unwrap_or("")
        ),
        (_, Value::Object(ended)) => println!(
            "job {id} {}: {} at {}{}",
            ended.get("name").and_then(Value::as_str).unwrap_or(""),
            ended.get("state").and_then(Value::as_str).unwrap_or(""),
            ended.get("ended").and_then(Value::as_str).unwrap_or(""),
            ended
                .get("failure")
                .and_then(Value::as_str)
                .map(|f| format!(" ({f})"))
                .unwrap_or_default()
        ),
        _ => println!("job {id}: no longer queued, and not archived"),
    }
    if let Some(next) = history["nextSkip"].as_u64() {
        println!(
            "({} of {} attempts shown; older ones: --skip {next})",
            history["attempts"].as_array().map_or(0, Vec::len),
            history["attemptsTotal"]
        );
    }
    println!(
        "{:>3}  {:<23}  {:>8}  {:>8}  {:<12}  {:<16}  WORKER",
        "#", "STARTED", "WAIT", "RUN", "OUTCOME", "EXIT"
    );
    for attempt in history["attempts"].as_array().into_iter().flatten() {
        // A streak of hand-backs for want of the worker: how many.
        let exit = match attempt["handBacks"].as_u64() {
            Some(times) => format!("{} ×{times}", ending(attempt)),
            None => ending(attempt),
        };
        println!(
            "{:>3}  {:<23}  {:>8}  {:>8}  {:<12}  {:<16}  {}",
            cell(&attempt["attempt"]),
            attempt["started"].as_str().unwrap_or(""),
            secs(&attempt["waitSecs"]),
            secs(&attempt["runSecs"]),
            attempt["outcome"].as_str().unwrap_or(""),
            exit,
            attempt["worker"].as_str().unwrap_or("-")
        );
        for stream in ["stdout", "stderr"] {
            let total = attempt[format!("{stream}Bytes")].as_u64();
            if let Some(text) = attempt[stream].as_str().filter(|t| !t.trim().is_empty()) {
                println!("     {}", stream_heading(stream, text, total, 10));
                for line in text
                    .lines()
                    .rev()
                    .take(10)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    println!("       {line}");
                }
            }
        }
    }
}
