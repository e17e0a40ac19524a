//! The command line: `jobmgr server` runs the job server, `jobmgr job …`
//! talks to one. Errors are mapped to exit codes in one place, [`exit_code`].

mod archive;
mod bwm_options;
mod check_config;
mod embedded_ports;
pub mod environment;
mod job;
mod man;
mod output;
mod reports;
mod server;
mod service;
mod shell;
mod signals;
mod start_checks;
mod status;
mod supervise;
mod take;
mod throttle;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use thiserror::Error;

pub use job::{JobArgs, JobCommand};
pub use server::ServerArgs;
pub use supervise::SuperviseArgs;

use crate::client::ClientError;
use crate::server::ServerError;

/// jobmgr: a worker manager and job server with Bedrock::Jobs semantics.
///
/// Without a subcommand, runs the supervisor: `jobmgr --job-name='*'
/// --worker-path=/code --max-load=5.0`. Signals: SIGTERM/SIGINT drain
/// (twice: stop jobs now), SIGTSTP stops taking jobs, SIGHUP reloads --config.
#[derive(Debug, Parser)]
#[command(name = "jobmgr", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do; without one, run the supervisor.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The supervisor's options.
    #[command(flatten)]
    pub supervise: SuperviseArgs,
    /// How log lines are written: auto (journal under journald, else text), text, json, journal.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        help_heading = "Logs",
        default_value = "auto",
        env = "JOBMGR_LOG_FORMAT"
    )]
    pub log_format: crate::logging::LogFormat,
}

impl Cli {
    /// Parses a command line. With a subcommand, the supervisor's own
    /// options (flattened at the top) are not read from `JOBMGR_*`
    /// variables: a bad `JOBMGR_MAX_LOAD` in the environment is the
    /// supervisor's business, not `jobmgr job list`'s. (The subcommands
    /// that take the supervisor's settings, such as `check-config`, read
    /// them with their own arguments.)
    pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let subcommands: Vec<String> = <Cli as clap::CommandFactory>::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        let (args, ignored) = bwm_options::take(args, &subcommands);
        let mut cli = Self::parse_taken(args)?;
        cli.supervise.bwm_ignored = ignored;
        Ok(cli)
    }

    /// [`Cli::parse_args`] once BWM's no-effect options are taken off.
    fn parse_taken(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let probe = Cli::command()
            .ignore_errors(true)
            .try_get_matches_from(&args);
        let subcommand = probe
            .ok()
            .and_then(|m| m.subcommand_name().map(str::to_owned));
        if subcommand.is_none() {
            return <Cli as Parser>::try_parse_from(args);
        }
        let command = Cli::command().mut_args(|arg| {
            if arg.is_global_set() {
                arg
            } else {
                arg.env(None)
            }
        });
        let matches = command.try_get_matches_from(args)?;
        Cli::from_arg_matches(&matches)
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the job server (an SQLite file or a PostgreSQL database; HTTP API and Bedrock port).
    Server(Box<ServerArgs>),
    /// Create, take, inspect and report on jobs of a running server.
    Job(JobArgs),
    /// Show a server's statistics per job name: jobs added, started, finished, failed and retried, wait, run and service times, and queue depth; or per supervisor (--workers): runs, busy time, capacity and utilisation.
    Stats(reports::StatsArgs),
    /// List failure groups, the jobs in one, or retry or delete a whole group.
    Failures(reports::FailuresArgs),
    /// List the supervisors a server has seen, with their capacity, load, utilisation and jobs; those not seen lately are gone.
    Workers(reports::WorkersArgs),
    /// Purge now the history, statistics and workers that retention no longer keeps.
    Purge(reports::PurgeArgs),
    /// Set, list or delete fleet-wide throttles: how many jobs matching a name GLOB run at once across every supervisor.
    Throttle(throttle::ThrottleArgs),
    /// Check the supervisor's configuration and print it, with where each value came from.
    CheckConfig(Box<check_config::CheckConfigArgs>),
    /// Show what the running supervisor is doing: its gate, and each job with its worker's pid and elapsed time.
    Status(Box<status::StatusArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(shell::CompletionsArgs),
    /// Print the man page, jobmgr(1), in roff.
    Man,
    /// Print the PHP runner that runs BedrockWorkerManager worker classes (--worker-kind bwm-php).
    BwmPhpRunner,
}

/// Why a command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// The server could not start or failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// A call to the server failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// An argument is not usable.
    #[error("{0}")]
    Usage(String),
    /// Nothing matched (no job due, no such job).
    #[error("{0}")]
    NotFound(String),
}

/// The process exit code for an outcome: 0 success, 1 failure, 2 bad usage,
/// 3 nothing found (no job due, no such job).
pub fn exit_code(result: &Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(_)) => ExitCode::from(2),
        Err(CliError::NotFound(_)) => ExitCode::from(3),
        Err(CliError::Client(e)) if e.is_not_found() => ExitCode::from(3),
        Err(_) => ExitCode::FAILURE,
    }
}

/// Serves metrics when asked, behind `token`; returns the ` metrics=ADDR`
/// part of the ready line (empty when not serving).
async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    token: Option<crate::auth::ApiToken>,
) -> Result<String, CliError> {
    match addr {
        Some(addr) => {
            let local = crate::metrics::install(addr, token)
                .await
                .map_err(|e| CliError::Usage(e.to_string()))?;
            Ok(format!(" metrics={local}"))
        }
        None => Ok(String::new()),
    }
}

/// Warns when the token was given as `--token` on the command line, where
/// every local user, workers included, can read it.
fn warn_if_token_in_argv() {
    let given = std::env::args_os().any(|arg| {
        let arg = arg.as_encoded_bytes();
        arg == b"--token" || arg.starts_with(b"--token=")
    });
    if given {
        tracing::warn!(
            "the token was given with --token: every local user, workers included, can read it in /proc/PID/cmdline; give it with JOBMGR_TOKEN or --token-file instead"
        );
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Some(Command::Server(args)) => server::run(*args).await,
        Some(Command::Job(command)) => job::run(command).await,
        Some(Command::Stats(args)) => reports::stats(args).await,
        Some(Command::Failures(args)) => reports::failures(args).await,
        Some(Command::Workers(args)) => reports::workers(args).await,
        Some(Command::Purge(args)) => reports::purge(args).await,
        Some(Command::Throttle(args)) => throttle::run(args).await,
        Some(Command::CheckConfig(args)) => check_config::run(*args).await,
        Some(Command::Completions(args)) => shell::completions(args),
        Some(Command::Status(args)) => status::run(*args),
        Some(Command::Man) => shell::man(),
        Some(Command::BwmPhpRunner) => shell::print(crate::supervisor::bwm_php::RUNNER),
        None => supervise::run(cli.supervise).await,
    }
}
