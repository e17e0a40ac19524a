//! `jobmgr server`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::CliError;
use crate::server::bedrock::{self, DEFAULT_BEDROCK_ADDR};
use crate::server::http::BrowserPolicy;
use crate::server::ledger::Retention;
use crate::server::queue::QueueConfig;
use crate::server::{self, DEFAULT_HTTP_ADDR, Listeners, ServerConfig, http};

/// Options of `jobmgr server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The SQLite file, or a PostgreSQL database's URL (postgres://USER@HOST:PORT/DATABASE) that several servers can share [default: $STATE_DIRECTORY/jobs.db, /var/lib/jobmgr/jobs.db as root, else ~/.local/state/jobmgr/jobs.db]
    #[arg(long, env = "JOBMGR_DB", value_name = "PATH|URL")]
    pub db: Option<PathBuf>,
    /// Where the HTTP API listens.
    #[arg(long, env = "JOBMGR_HTTP", value_name = "ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http: String,
    /// Where the Bedrock protocol port listens; "none" to not serve it.
    #[arg(long, env = "JOBMGR_BEDROCK", value_name = "ADDR", default_value = DEFAULT_BEDROCK_ADDR)]
    pub bedrock: String,
    /// The token every request must carry, on both ports [default: the one in --token-file]
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// The file holding the token, made (mode 0600, a random token) at first start [default: token beside --db]
    #[arg(long, env = "JOBMGR_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Let Bedrock-port clients on loopback skip the token, for old Bedrock clients. Any local user, workers included, can then read and change every job.
    #[arg(long)]
    pub bedrock_trust_loopback: bool,
    /// Serve Prometheus metrics on this address (at /metrics) [default: off]
    #[arg(long, env = "JOBMGR_METRICS", value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Bedrock-port connections served at once; more are refused with 503.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub bedrock_max_connections: usize,
    /// Bedrock-port connections served at once from one client address (an IPv6 /64); a newcomer from it closes its oldest connection that has not sent the token yet, or is refused with 503 if all have.
    #[arg(long, value_name = "N", default_value_t = bedrock::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub bedrock_max_connections_per_peer: usize,
    /// Bedrock-port connections served at once that one job's token proved (a worker's); more are refused with 503. Job tokens' connections do not count against --bedrock-max-connections-per-peer, and all jobs together hold at most half of --bedrock-max-connections.
    #[arg(long, value_name = "N", default_value_t = bedrock::DEFAULT_MAX_CONNECTIONS_PER_JOB)]
    pub bedrock_max_connections_per_job: usize,
    /// A Bedrock-port connection is closed this long after its last answer unless a new request has begun; blank lines do not keep it open.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub bedrock_idle_timeout: Duration,
    /// A Bedrock-port request must arrive whole within this of its first byte.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub bedrock_request_timeout: Duration,
    /// A Bedrock-port connection must send a request with the token within this of its accept; until then it has no idle time, and the oldest such connections are closed for newcomers.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_positive_duration_ms)]
    pub bedrock_unproven_timeout: Duration,
    /// A further name the HTTP API answers to in the Host header (besides the address it listens on and localhost); repeat for more. Requests naming any other host are refused (403), so a page that rebinds its own domain to this address cannot use the API.
    #[arg(
        long = "allowed-host",
        env = "JOBMGR_ALLOWED_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// A web origin (`https://ops.example.com`) whose pages may call the HTTP API; repeat for more. Requests with any other Origin header are refused (403): by default no browser page can drive the API.
    #[arg(
        long = "allowed-origin",
        env = "JOBMGR_ALLOWED_ORIGINS",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// HTTP-port connections served at once; more are answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub http_max_connections: usize,
    /// HTTP-port connections served at once from one IP address (an IPv6 /64); a newcomer from it closes its oldest connection that has not sent the token yet, or is refused with 503 if all have.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub http_max_connections_per_peer: usize,
    /// Event streams (`GET /events`) open at once; more are answered 503. Each holds a connection and 128 KiB of --http-body-budget.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub http_max_event_streams: usize,
    /// Event streams open at once from one IP address (an IPv6 /64); more are answered 503.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub http_max_event_streams_per_peer: usize,
    /// An HTTP request's headers must arrive whole within this (of the connection, or of their first byte); a connection must also send a request with the token within this of its accept.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_positive_duration_ms)]
    pub http_header_timeout: Duration,
    /// An HTTP request's body must arrive whole within this of its headers.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration_ms)]
    pub http_body_timeout: Duration,
    /// An HTTP connection with no request in flight (a held /dequeue is in flight) is closed after this.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration_ms)]
    pub http_idle_timeout: Duration,
    /// The server's one byte budget: request bytes both ports hold at once beyond each connection's free 64 KiB, and listing pages while built, across all clients (e.g. 256MiB); an HTTP request past it is answered 503, a Bedrock one 503 and closed.
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    pub http_body_budget: usize,
    /// Serve the HTTP port over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(
        long,
        env = "JOBMGR_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "JOBMGR_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Lease of a hand-out whose requester names none (and whose job has no retryAfter).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Lapsed leases after which a job is FAILED instead of queued again.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_lapses: i64,
    /// Queue again a RUNNING job held without a lease (by a plain Bedrock client that may have died) this long after its hand-out, counting a lapse; set it well above such jobs' longest run, since a client still working when it fires has its job run twice and its unfenced report still lands [default: off]
    #[arg(long, env = "JOBMGR_REQUEUE_UNLEASED_AFTER", value_name = "DURATION", value_parser = parse_positive_duration)]
    pub requeue_unleased_after: Option<Duration>,
    /// Ended jobs (archived, and FAILED ones still queued) and attempts are kept this long.
    #[arg(long, value_name = "DURATION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub history_max_age: Duration,
    /// At most this many ended jobs are kept; the oldest are purged first.
    #[arg(long, value_name = "N", default_value_t = 50_000)]
    pub history_max_count: u64,
    /// Hourly statistics, per job name and per supervisor, are kept this long.
    #[arg(long, value_name = "DURATION", default_value = "30days", value_parser = humantime::parse_duration)]
    pub stats_max_age: Duration,
    /// The wait and run histograms of hourly statistics are kept this long.
    #[arg(long, value_name = "DURATION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub histogram_max_age: Duration,
    /// A supervisor not seen (dequeue, heartbeat, report) for this long is shown as gone; a gap this long between sightings is not counted as capacity it offered.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = humantime::parse_duration)]
    pub worker_gone_after: Duration,
    /// How often history past its retention is purged.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_positive_duration)]
    pub purge_every: Duration,
    /// Read the time from this file (milliseconds since the epoch, or
    /// `YYYY-MM-DD HH:MM:SS`, or an offset from the system time such as
    /// `+3600000`) instead of the system clock. For tests.
    #[arg(long, value_name = "PATH", hide = true)]
    pub clock_file: Option<PathBuf>,
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d >= Duration::from_secs(1) => Ok(d),
        Ok(_) => Err("must be at least 1s".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_positive_duration_ms(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d >= Duration::from_millis(100) => Ok(d),
        Ok(_) => Err("must be at least 100ms".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A byte count: a number with an optional unit (`B`, `KiB`, `MiB`, `GiB`).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count such as 256MiB"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}: use B, KiB, MiB or GiB")),
    };
    let bytes = number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < 4 << 20 {
        return Err("must be at least 4MiB".into());
    }
    Ok(bytes)
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(args: ServerArgs) -> Result<(), CliError> {
    let lease_ms = i64::try_from(args.lease.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let http_limits = http::Limits {
        max_connections: args.http_max_connections.max(1),
        max_connections_per_peer: args.http_max_connections_per_peer.max(1),
        header_timeout: args.http_header_timeout,
        body_timeout: args.http_body_timeout,
        idle_timeout: args.http_idle_timeout,
        body_budget: args.http_body_budget,
        max_event_streams: args.http_max_event_streams,
        max_event_streams_per_peer: args.http_max_event_streams_per_peer,
    };
    if let Some(warning) = http_limits.check_budget().map_err(CliError::Usage)? {
        tracing::warn!("{warning}");
    }
    let db = args.db.unwrap_or_else(server::default_db_path);
    // A database URL has no directory: its token file is in the state
    // directory.
    let token_file = args.token_file.unwrap_or_else(|| {
        server::StoreLocation::of(&db)
            .state_dir()
            .join(crate::auth::TOKEN_FILE_NAME)
    });
    let token = crate::auth::for_server(args.token.as_deref(), &token_file)
        .map_err(server::ServerError::from)?;
    let config = ServerConfig {
        db,
        token,
        bedrock_trust_loopback: args.bedrock_trust_loopback,
        queue: QueueConfig {
            default_lease_ms: lease_ms,
            max_lapses: args.max_lapses,
            requeue_unleased_after: args.requeue_unleased_after,
            retention: Retention {
                history_max_age: args.history_max_age,
                history_max_count: args.history_max_count,
                stats_max_age: args.stats_max_age,
                histogram_max_age: args.histogram_max_age,
                worker_gone_after: args.worker_gone_after,
                purge_every: args.purge_every,
            },
        },
        bedrock_limits: bedrock::Limits {
            max_connections: args.bedrock_max_connections.max(1),
            max_connections_per_peer: args.bedrock_max_connections_per_peer.max(1),
            max_connections_per_job: args.bedrock_max_connections_per_job.max(1),
            idle_timeout: args.bedrock_idle_timeout,
            request_timeout: args.bedrock_request_timeout,
            unproven_timeout: args.bedrock_unproven_timeout,
            ..bedrock::Limits::default()
        },
        http_limits,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(http::TlsFiles { cert, key }),
            _ => None,
        },
        clock_file: args.clock_file,
        browser: BrowserPolicy::new(args.allowed_hosts, args.allowed_origins)
            .map_err(|e| CliError::Usage(e.to_string()))?,
    };
    http::listen::raise_fd_limit();
    super::warn_if_token_in_argv();
    let signals = super::signals::Signals::register().map_err(server::ServerError::Serve)?;
    use super::embedded_ports::{Role, bind_as};
    // What answers on the Bedrock address says what holds a taken port.
    let probed = match args.bedrock.as_str() {
        "none" | "" => crate::server::bedrock::DEFAULT_BEDROCK_ADDR,
        addr => addr,
    };
    let http = bind_as(Role::Standalone, &args.http, "HTTP", probed).await?;
    let local = http.local_addr().map_err(server::ServerError::Serve)?;
    if !local.ip().is_loopback() && config.browser.hosts().is_empty() {
        tracing::info!(
            http = %local,
            "the HTTP API answers only to its address and localhost in Host: clients that call it by a DNS name need --allowed-host NAME"
        );
    }
    let bedrock = match args.bedrock.as_str() {
        "none" | "" => None,
        addr => Some(bind_as(Role::Standalone, addr, "Bedrock", probed).await?),
    };
    let bedrock_addr = match &bedrock {
        Some(listener) => {
            let addr = listener.local_addr().map_err(server::ServerError::Serve)?;
            addr.to_string()
        }
        None => "none".to_string(),
    };
    let metrics = super::serve_metrics(args.metrics, Some(config.token.clone())).await?;
    let mut signals = signals;
    let started = tokio::select! {
        started = server::Server::start(&config) => started?,
        _ = signals.stop_requested() => return Ok(()),
    };
    let scheme = if started.tls() { "https" } else { "http" };
    // One line on stdout when ready, for scripts and tests to wait on.
    println!(
        "jobmgr server ready: http={scheme}://{local} bedrock={bedrock_addr} db={}{metrics}",
        server::StoreLocation::of(&config.db).describe()
    );
    tracing::info!(http = %local, bedrock = %bedrock_addr, "job server listening");
    super::service::ready(&format!("serving http={local} bedrock={bedrock_addr}"));
    super::service::keep_watchdog();
    let listeners = Listeners { http, bedrock };
    started.serve(listeners, signals.shutdown()).await?;
    Ok(())
}
