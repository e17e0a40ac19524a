//! `jobmgr server`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::CliError;
use crate::server::queue::QueueConfig;
use crate::server::{self, DEFAULT_HTTP_ADDR, ServerConfig};

/// Options of `jobmgr server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The SQLite file [default: $STATE_DIRECTORY/jobs.db, /var/lib/jobmgr/jobs.db as root, else ~/.local/state/jobmgr/jobs.db]
    #[arg(long, env = "JOBMGR_DB", value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Where the HTTP API listens. Beyond loopback it needs --token.
    #[arg(long, env = "JOBMGR_HTTP", value_name = "ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http: String,
    /// Bearer token every API request must carry.
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Lease of a hand-out whose requester names none (and whose job has no retryAfter).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Lapsed leases after which a job is FAILED instead of queued again.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_lapses: i64,
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(args: ServerArgs) -> Result<(), CliError> {
    let lease_ms = i64::try_from(args.lease.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let config = ServerConfig {
        db: args.db.unwrap_or_else(server::default_db_path),
        token: args.token.filter(|t| !t.is_empty()),
        queue: QueueConfig {
            default_lease_ms: lease_ms,
            max_lapses: args.max_lapses,
        },
    };
    let listener = server::bind(&args.http).await?;
    let local = listener.local_addr().map_err(server::ServerError::Serve)?;
    server::check_exposure(local, config.token.as_deref())?;
    let started = server::Server::start(&config)?;
    // One line on stdout when ready, for scripts and tests to wait on.
    println!(
        "jobmgr server ready: http=http://{local} db={}",
        config.db.display()
    );
    tracing::info!(http = %local, "job server listening");
    started
        .serve_http(listener, config.token, shutdown_signal())
        .await?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::error!(%error, "cannot watch SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
