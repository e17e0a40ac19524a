//! `jobmgr job …`: a client of a running server for people and scripts.

use std::time::Duration;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Map, Value, json};

use super::CliError;
use super::output::{Format, print_job, print_jobs, print_value};
use crate::client::HttpClient;
use crate::server::DEFAULT_HTTP_ADDR;

/// Where the server is and how to print.
#[derive(Debug, Args, Clone)]
pub struct Connection {
    /// The server's HTTP URL.
    #[arg(long, env = "JOBMGR_SERVER", value_name = "URL", default_value_t = format!("http://{DEFAULT_HTTP_ADDR}"), global = true)]
    pub server: String,
    /// The server's API token [default: the one in --token-file, if readable]
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
    /// The file holding the server's token [default: token beside the default database (/var/lib/jobmgr/token as root), then, as root, /var/lib/jobmgr-server/token]
    #[arg(long, env = "JOBMGR_TOKEN_FILE", value_name = "PATH", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// Also trust this CA certificate (PEM) for an https:// server.
    #[arg(long, env = "JOBMGR_CA_CERT", value_name = "PEM", global = true)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Output format [default: text on a terminal, json when piped].
    #[arg(long, value_enum, global = true)]
    pub format: Option<Format>,
}

/// `jobmgr job`: the connection options and what to do.
#[derive(Debug, Args)]
pub struct JobArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: JobCommand,
}

/// The `job` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Create a job; prints its jobID.
    Create {
        /// The job's name (the worker that runs it is named after its last `/` part).
        name: String,
        /// Data for the job, a JSON object.
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
        /// How it repeats, e.g. "FINISHED, +1 HOUR" or DAILY.
        #[arg(long, value_name = "REPEAT")]
        repeat: Option<String>,
        /// When it first runs, "YYYY-MM-DD HH:MM:SS" UTC.
        #[arg(long, value_name = "TIME")]
        first_run: Option<String>,
        /// One of 0, 250, 500, 750, 850, 1000.
        #[arg(long, value_name = "P")]
        priority: Option<i64>,
        /// Return the existing job of this name instead of creating another.
        #[arg(long)]
        unique: bool,
        /// With --unique, leave the existing job's data as it is.
        #[arg(long, requires = "unique")]
        no_overwrite: bool,
        /// Hand the job out again this long after an unreported hand-out, e.g. "+5 MINUTES".
        #[arg(long, value_name = "MODIFIER")]
        retry_after: Option<String>,
        /// Make it a child of this running job.
        #[arg(long, value_name = "ID")]
        parent: Option<i64>,
        /// Tag the job (repeat for more tags).
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// Hand it out only once these jobs have finished (jobIDs, comma-separated; each created before it).
        #[arg(long, value_name = "ID,ID,...", value_delimiter = ',')]
        depends: Vec<i64>,
    },
    /// Add or drop dependencies of a QUEUED or DEPENDS job; prints the job.
    Depends {
        /// The jobID.
        id: String,
        /// Also wait for these jobs (comma-separated; each created before it).
        #[arg(long, value_name = "ID,ID,...", value_delimiter = ',')]
        add: Vec<i64>,
        /// No longer wait for these jobs (comma-separated).
        #[arg(long, value_name = "ID,ID,...", value_delimiter = ',')]
        remove: Vec<i64>,
    },
    /// Take (lease) due jobs matching a GLOB (or comma list), waiting for one if asked; each must then be finished, failed or retried before its lease runs out.
    #[command(after_help = super::take::AFTER_HELP)]
    Take(super::take::TakeArgs),
    /// Deprecated: the old name of `take` (it leases the job).
    #[command(hide = true)]
    Get(super::take::TakeArgs),
    /// Follow job events as they happen (a job, names matching a GLOB, tracked jobs, or all); with one job id, until it ends.
    #[command(after_help = super::watch::AFTER_HELP)]
    Watch(super::watch::WatchArgs),
    /// Show a job, with its tags and whether it is tracked; one that ended
    /// and left the queue is shown from the archive (marked archived), with
    /// a pointer to `job history`.
    #[command(visible_alias = "show")]
    Query {
        /// The jobID.
        id: String,
    },
    /// Show a job's history: every attempt (worker, times, outcome, exit
    /// code or signal, output tail), and the job as it ended if it did.
    History {
        /// The jobID.
        id: String,
        /// Show at most this many of its latest attempts (at most 1000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// Skip this many of its latest attempts (to page to older ones).
        #[arg(long, value_name = "N", default_value_t = 0)]
        skip: usize,
    },
    /// Replace a job's data, and optionally its repeat, priority or next run.
    Update {
        /// The jobID.
        id: String,
        /// The new data, a JSON object.
        #[arg(long, value_name = "JSON")]
        data: String,
        /// A new repeat.
        #[arg(long, value_name = "REPEAT")]
        repeat: Option<String>,
        /// Remove the repeat.
        #[arg(long, conflicts_with = "repeat")]
        clear_repeat: bool,
        /// A new priority.
        #[arg(long, value_name = "P")]
        priority: Option<i64>,
        /// When it runs next, "YYYY-MM-DD HH:MM:SS" UTC.
        #[arg(long, value_name = "TIME")]
        next_run: Option<String>,
    },
    /// Report a held job finished (a repeating job is scheduled again).
    Finish {
        /// The jobID.
        id: String,
        /// New data for the job.
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
        /// The lease token from `job take`.
        #[arg(long, value_name = "TOKEN")]
        lease: Option<String>,
    },
    /// Put a held job back to run again later.
    Retry {
        /// The jobID.
        id: String,
        /// Wait this long before the retry, e.g. 30s.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        delay: Option<Duration>,
        /// Retry at this time instead, "YYYY-MM-DD HH:MM:SS" UTC.
        #[arg(long, value_name = "TIME")]
        next_run: Option<String>,
        /// Rename the job (move it to another queue).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// A new priority.
        #[arg(long, value_name = "P")]
        priority: Option<i64>,
        /// Use --delay or --next-run even if the job repeats.
        #[arg(long)]
        ignore_repeat: bool,
        /// New data for the job.
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
        /// The lease token from `job take`.
        #[arg(long, value_name = "TOKEN")]
        lease: Option<String>,
    },
    /// Report a held job failed.
    Fail {
        /// The jobID.
        id: String,
        /// New data for the job.
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
        /// The lease token from `job take`.
        #[arg(long, value_name = "TOKEN")]
        lease: Option<String>,
    },
    /// Renew the lease of a held job.
    Heartbeat {
        /// The jobID.
        id: String,
        /// The lease token from `job take`.
        #[arg(long, value_name = "TOKEN")]
        lease: String,
    },
    /// Delete a job that is not running.
    Delete {
        /// The jobID.
        id: String,
    },
    /// Cancel a child job that has not run.
    Cancel {
        /// The jobID.
        id: String,
    },
    /// Put jobs back in the queue, due at their creation time (refused for a job a worker holds).
    Requeue {
        /// The jobIDs.
        #[arg(required = true)]
        ids: Vec<i64>,
        /// Rename them.
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
    },
    /// Add tags to a job in the queue and remove others; prints its tags.
    Tag {
        /// The jobID.
        id: String,
        /// A tag to add (repeat for more).
        #[arg(long, value_name = "TAG", required_unless_present = "remove")]
        add: Vec<String>,
        /// A tag to remove (repeat for more).
        #[arg(long, value_name = "TAG")]
        remove: Vec<String>,
    },
    /// The tags on most jobs, with how many jobs each is on.
    Tags {
        /// Show at most this many tags (at most 1000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Track a job: `job tracked` lists it, and shows it as it ends.
    Track {
        /// The jobID.
        id: String,
    },
    /// Stop tracking a job.
    Untrack {
        /// The jobID.
        id: String,
    },
    /// List the tracked jobs and their states: a job that ended is shown
    /// from the archive (marked archived) while retention keeps it, and one
    /// that was deleted as GONE, until untracked.
    Tracked {
        /// At most this many (at most 1000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// Only jobs with an id above this.
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
    },
    /// List jobs in id order: the queue's, or with --archived (implied by
    /// --state FINISHED, --since and --until) the ones that ended.
    List {
        /// Only names matching this GLOB (or comma list).
        #[arg(long, value_name = "GLOB")]
        name: Option<String>,
        /// Only jobs with this tag (jobs in the queue; the archive keeps no tags).
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
        /// Only jobs in this state (FINISHED reads the archive; so does FAILED with --archived).
        #[arg(long, value_name = "STATE")]
        state: Option<String>,
        /// At most this many (the archive answers at most 1000 a page).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// Only jobs with an id above this.
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
        /// List jobs that ended (FINISHED or FAILED) from the archive, as long as retention keeps them.
        #[arg(long)]
        archived: bool,
        /// Only jobs that ended at or after this: "YYYY-MM-DD HH:MM:SS" UTC, or a duration ago such as 2h [implies --archived].
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only jobs that ended before this (as --since) [implies --archived].
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
    },
}

/// A job's tags as one line: comma-separated, or `(no tags)`.
fn tag_line(tags: &Value) -> String {
    let tags: Vec<&str> = tags
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if tags.is_empty() {
        "(no tags)".to_string()
    } else {
        tags.join(", ")
    }
}

fn json_arg(flag: &str, text: &str) -> Result<Value, CliError> {
    serde_json::from_str(text)
        .map_err(|e| CliError::Usage(format!("--{flag} is not valid JSON: {e}")))
}

pub(super) fn id_arg(id: &str) -> Result<i64, CliError> {
    match id.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CliError::Usage(format!(
            "{id:?} is not a jobID (a positive whole number)"
        ))),
    }
}

/// Builds a JSON object from the options that were given.
pub(super) fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
    Value::Object(map)
}

fn data_field(data: Option<String>) -> Result<Option<Value>, CliError> {
    data.map(|d| json_arg("data", &d)).transpose()
}

pub(super) fn client(connection: &Connection) -> Result<(HttpClient, Format), CliError> {
    let token = crate::auth::for_client(
        connection.token.as_deref(),
        connection.token_file.as_deref(),
        &crate::auth::default_client_files(),
        &connection.server,
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    Ok((
        HttpClient::trusting(
            &connection.server,
            token.token,
            connection.ca_cert.as_deref(),
        )?
        .with_hint(token.hint),
        Format::choose(connection.format),
    ))
}

/// Runs one `job` subcommand.
pub async fn run(args: JobArgs) -> Result<(), CliError> {
    let connection = &args.connection;
    match args.command {
        JobCommand::Create {
            name,
            data,
            repeat,
            first_run,
            priority,
            unique,
            no_overwrite,
            retry_after,
            parent,
            tags,
            depends,
        } => {
            let (client, format) = client(connection)?;
            let body = object(vec![
                ("name", Some(json!(name))),
                ("data", data_field(data)?),
                ("repeat", repeat.map(Value::from)),
                ("firstRun", first_run.map(Value::from)),
                ("priority", priority.map(Value::from)),
                ("unique", unique.then_some(json!(true))),
                ("overwrite", no_overwrite.then_some(json!(false))),
                ("retryAfter", retry_after.map(Value::from)),
                ("parentJobID", parent.map(Value::from)),
                ("tags", (!tags.is_empty()).then(|| json!(tags))),
                ("depends", (!depends.is_empty()).then(|| json!(depends))),
            ]);
            let answer = client.quick(Method::POST, "/jobs", Some(&body)).await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!("{}", answer["jobID"]),
            }
        }
        JobCommand::Depends { id, add, remove } => {
            let (client, format) = client(connection)?;
            if add.is_empty() && remove.is_empty() {
                return Err(CliError::Usage(
                    "give --add, --remove or both (jobIDs, comma-separated)".into(),
                ));
            }
            let body = json!({"add": add, "remove": remove});
            let answer = client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/depends", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => print_job(&answer),
            }
        }
        JobCommand::Take(take) => super::take::run(connection, take, false).await?,
        JobCommand::Get(take) => super::take::run(connection, take, true).await?,
        JobCommand::Watch(watch) => super::watch::run(connection, watch).await?,
        JobCommand::Query { id } => {
            let (client, format) = client(connection)?;
            let id = id_arg(&id)?;
            let answer = match client
                .quick(Method::GET, &format!("/jobs/{id}"), None)
                .await
            {
                Err(error) if error.is_not_found() => {
                    return super::archive::query(&client, format, id).await;
                }
                answer => answer?,
            };
            match format {
                Format::Json => print_value(&answer),
                Format::Text => print_job(&answer),
            }
        }
        JobCommand::History { id, limit, skip } => {
            let (client, format) = client(connection)?;
            let answer = client
                .quick(
                    Method::GET,
                    &format!("/jobs/{}/history?limit={limit}&skip={skip}", id_arg(&id)?),
                    None,
                )
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => super::reports::print_history(&answer),
            }
        }
        JobCommand::Update {
            id,
            data,
            repeat,
            clear_repeat,
            priority,
            next_run,
        } => {
            let (client, _) = client(connection)?;
            let body = object(vec![
                ("data", Some(json_arg("data", &data)?)),
                ("repeat", repeat.map(Value::from)),
                ("clearRepeat", clear_repeat.then_some(json!(true))),
                ("priority", priority.map(Value::from)),
                ("nextRun", next_run.map(Value::from)),
            ]);
            client
                .quick(
                    Method::PATCH,
                    &format!("/jobs/{}", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
        }
        JobCommand::Finish { id, data, lease } => {
            let (client, _) = client(connection)?;
            let body = object(vec![
                ("data", data_field(data)?),
                ("lease", lease.map(Value::from)),
            ]);
            client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/finish", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
        }
        JobCommand::Retry {
            id,
            delay,
            next_run,
            name,
            priority,
            ignore_repeat,
            data,
            lease,
        } => {
            let (client, _) = client(connection)?;
            let body = object(vec![
                ("delay", delay.map(|d| json!(d.as_secs()))),
                ("nextRun", next_run.map(Value::from)),
                ("name", name.map(Value::from)),
                ("priority", priority.map(Value::from)),
                ("ignoreRepeat", ignore_repeat.then_some(json!(true))),
                ("data", data_field(data)?),
                ("lease", lease.map(Value::from)),
            ]);
            client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/retry", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
        }
        JobCommand::Fail { id, data, lease } => {
            let (client, _) = client(connection)?;
            let body = object(vec![
                ("data", data_field(data)?),
                ("lease", lease.map(Value::from)),
            ]);
            client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/fail", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
        }
        JobCommand::Heartbeat { id, lease } => {
            let (client, format) = client(connection)?;
            let body = json!({"lease": lease});
            let answer = client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/heartbeat", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!(
                    "lease renewed until {}",
                    answer["leaseExpires"].as_str().unwrap_or("")
                ),
            }
        }
        JobCommand::Delete { id } => {
            let (client, _) = client(connection)?;
            client
                .quick(Method::DELETE, &format!("/jobs/{}", id_arg(&id)?), None)
                .await?;
        }
        JobCommand::Cancel { id } => {
            let (client, _) = client(connection)?;
            client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/cancel", id_arg(&id)?),
                    None,
                )
                .await?;
        }
        JobCommand::Requeue { ids, name } => {
            let (client, format) = client(connection)?;
            let body = object(vec![
                ("jobIDs", Some(json!(ids))),
                ("name", name.map(Value::from)),
            ]);
            let answer = client
                .quick(Method::POST, "/jobs/requeue", Some(&body))
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!("requeued {}", answer["requeued"]),
            }
        }
        JobCommand::Tag { id, add, remove } => {
            let (client, format) = client(connection)?;
            let body = json!({"add": add, "remove": remove});
            let answer = client
                .quick(
                    Method::POST,
                    &format!("/jobs/{}/tags", id_arg(&id)?),
                    Some(&body),
                )
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!("{}", tag_line(&answer["tags"])),
            }
        }
        JobCommand::Tags { limit } => {
            let (client, format) = client(connection)?;
            let answer = client
                .quick(Method::GET, &format!("/tags?limit={limit}"), None)
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => {
                    println!("{:>8}  TAG", "JOBS");
                    for tag in answer["tags"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                        println!(
                            "{:>8}  {}",
                            tag["jobs"].to_string(),
                            tag["tag"].as_str().unwrap_or("")
                        );
                    }
                }
            }
        }
        JobCommand::Track { id } => {
            let (client, _) = client(connection)?;
            client
                .quick(Method::POST, &format!("/jobs/{}/track", id_arg(&id)?), None)
                .await?;
        }
        JobCommand::Untrack { id } => {
            let (client, _) = client(connection)?;
            client
                .quick(
                    Method::DELETE,
                    &format!("/jobs/{}/track", id_arg(&id)?),
                    None,
                )
                .await?;
        }
        JobCommand::Tracked { limit, after } => {
            let (client, format) = client(connection)?;
            let mut path = format!("/tracked?limit={limit}");
            if let Some(after) = after {
                path.push_str(&format!("&after={after}"));
            }
            let answer = client.quick(Method::GET, &path, None).await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => {
                    print_jobs(answer["jobs"].as_array().map(Vec::as_slice).unwrap_or(&[]));
                    // A page cut short to keep it small: say how to go on.
                    if let Some(next) = answer["nextAfter"].as_i64() {
                        eprintln!("more jobs follow: add --after {next}");
                    }
                }
            }
        }
        JobCommand::List {
            name,
            tag,
            state,
            limit,
            after,
            archived,
            since,
            until,
        } => {
            let (client, format) = client(connection)?;
            let archive = super::archive::wanted(
                archived,
                state.as_deref(),
                since.is_some(),
                until.is_some(),
            );
            if archive && tag.is_some() {
                return Err(CliError::Usage(
                    "--tag lists jobs in the queue, and the archive keeps no tags: leave out \
                     --tag, or --archived, --since, --until and --state FINISHED"
                        .into(),
                ));
            }
            if archive {
                let listing = super::archive::ArchiveListing {
                    name,
                    state,
                    since,
                    until,
                    limit,
                    after,
                };
                return super::archive::list(&client, format, listing).await;
            }
            let mut query: Vec<(&str, String)> = vec![("limit", limit.to_string())];
            if let Some(name) = name {
                query.push(("name", name));
            }
            if let Some(tag) = tag {
                query.push(("tag", tag));
            }
            if let Some(state) = state {
                query.push(("state", state));
            }
            if let Some(after) = after {
                query.push(("after", after.to_string()));
            }
            let query =
                serde_urlencoded::to_string(&query).map_err(|e| CliError::Usage(e.to_string()))?;
            let answer = client
                .quick(Method::GET, &format!("/jobs?{query}"), None)
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => {
                    print_jobs(answer["jobs"].as_array().map(Vec::as_slice).unwrap_or(&[]));
                    // A page cut short to keep it small: say how to go on.
                    if let Some(next) = answer["nextAfter"].as_i64() {
                        eprintln!("more jobs follow: add --after {next}");
                    }
                }
            }
        }
    }
    Ok(())
}
