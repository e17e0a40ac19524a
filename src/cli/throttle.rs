//! `jobmgr throttle …`: fleet-wide throttles of a running server, set,
//! listed and deleted over its HTTP API.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use super::CliError;
use super::job::{Connection, client};
use super::output::{Format, print_value};

/// `jobmgr throttle`: the connection options and what to do.
#[derive(Debug, Args)]
pub struct ThrottleArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ThrottleCommand,
}

/// The `throttle` subcommands.
#[derive(Debug, Subcommand)]
pub enum ThrottleCommand {
    /// Cap how many jobs whose name matches NAME-GLOB run at once, across every supervisor and every server sharing the store (0 pauses them; lowering stops new hand-outs until the running ones drain).
    Set {
        /// The GLOB of job names, as GetJobs matches them (quote it: 'api/*').
        #[arg(value_name = "NAME-GLOB")]
        glob: String,
        /// How many may run at once (0 to 1000000).
        #[arg(value_name = "N")]
        max: i64,
    },
    /// List the throttles, each with its cap and how many matching jobs run now.
    List,
    /// Remove a throttle; the jobs it held back are handed out as usual.
    Delete {
        /// The throttle's GLOB, exactly as it was set.
        #[arg(value_name = "NAME-GLOB")]
        glob: String,
    },
}

/// A GLOB as one path segment: every byte but letters, digits and `-_.~`
/// percent-encoded (a `/` too, so the GLOB stays one segment).
pub(super) fn glob_path(glob: &str) -> String {
    glob.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Runs one `throttle` subcommand.
pub async fn run(args: ThrottleArgs) -> Result<(), CliError> {
    let (client, format) = client(&args.connection)?;
    match args.command {
        ThrottleCommand::Set { glob, max } => {
            let path = format!("/throttles/{}", glob_path(&glob));
            let answer = client
                .quick(Method::PUT, &path, Some(&json!({"max": max})))
                .await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!("{glob}: at most {max} at once"),
            }
        }
        ThrottleCommand::List => {
            let answer = client.quick(Method::GET, "/throttles", None).await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => print_table(&answer),
            }
        }
        ThrottleCommand::Delete { glob } => {
            let path = format!("/throttles/{}", glob_path(&glob));
            let answer = client.quick(Method::DELETE, &path, None).await?;
            match format {
                Format::Json => print_value(&answer),
                Format::Text => println!("{glob}: no longer throttled"),
            }
        }
    }
    Ok(())
}

fn print_table(answer: &Value) {
    let empty = Vec::new();
    let throttles = answer["throttles"].as_array().unwrap_or(&empty);
    if throttles.is_empty() {
        println!("no throttles (set one: jobmgr throttle set 'NAME-GLOB' N)");
        return;
    }
    println!("{:>7} {:>7}  GLOB", "RUNNING", "MAX");
    for throttle in throttles {
        println!(
            "{:>7} {:>7}  {}",
            throttle["running"],
            throttle["max"],
            throttle["glob"].as_str().unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_is_one_path_segment() {
        assert_eq!(glob_path("api/*"), "api%2F%2A");
        assert_eq!(glob_path("a b?[x]"), "a%20b%3F%5Bx%5D");
        assert_eq!(glob_path("é"), "%C3%A9");
    }
}
