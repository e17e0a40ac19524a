//! The job server: Bedrock::Jobs semantics on an SQLite file, served over
//! HTTP/JSON. [`run`] takes its listener from the caller, so tests and the
//! embedded supervisor start it on any address, and a shutdown future.

pub mod admission;
pub mod bedrock;
pub mod budget;
pub mod calendar;
pub mod events;
pub mod http;
mod layers;
pub mod ledger;
pub mod queue;
pub mod records;
pub mod store;
pub mod tally;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::ApiToken;
pub use budget::{ByteBudget, byte_budget};
use queue::{Queue, QueueConfig};
pub use store::sqlite_error::StoreOpenError;
use store::{PgStore, SqliteStore};

/// The HTTP address the server listens on unless told otherwise.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8889";

/// What the server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The SQLite file, or a PostgreSQL URL (`postgres://…`, see
    /// [`StoreLocation`]).
    pub db: PathBuf,
    /// The bearer token every request must carry, on both ports and on
    /// every address (see [`crate::auth`]).
    pub token: ApiToken,
    /// Let Bedrock-port clients on loopback skip the token (for old Bedrock
    /// clients; any local user, workers included, can then use the queue).
    pub bedrock_trust_loopback: bool,
    /// Lease and lapse settings.
    pub queue: QueueConfig,
    /// Bounds on Bedrock-port clients.
    pub bedrock_limits: bedrock::Limits,
    /// Bounds on HTTP-port clients.
    pub http_limits: http::Limits,
    /// Serve the HTTP port over TLS with this certificate and key.
    pub tls: Option<http::TlsFiles>,
    /// Read the time from this file instead of the system clock (for tests
    /// that script timings; see [`queue::FileClock`]).
    pub clock_file: Option<PathBuf>,
    /// Which Host and Origin headers the HTTP API accepts.
    pub browser: http::BrowserPolicy,
}

/// Why the server could not start or stopped.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreOpenError),
    /// The PostgreSQL store could not be opened.
    #[error(transparent)]
    Postgres(#[from] store::PgOpenError),
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick another address or stop what holds it")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// An embedded server's address is in use, with what to do about it.
    #[error("cannot listen on {addr}: address already in use; {advice}")]
    PortTaken {
        /// The address.
        addr: String,
        /// What probably holds it, and which flags move the ports.
        advice: String,
    },
    /// `jobmgr check-config` could not verify the server (or the embedded
    /// server's store and ports).
    #[error("{0}")]
    Unverified(String),
    /// The API token could not be had.
    #[error(transparent)]
    Token(#[from] crate::auth::TokenError),
    /// Serving failed.
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    /// The TLS certificate or key could not be used.
    #[error(transparent)]
    Tls(#[from] http::listen::TlsError),
}

/// Where the jobs are kept, read from `--db`: a PostgreSQL URL
/// (`postgres://` or `postgresql://`), or else an SQLite file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by URL.
    Postgres(String),
}

impl StoreLocation {
    /// Reads a `--db` value.
    pub fn of(db: &std::path::Path) -> Self {
        let text = db.to_string_lossy();
        let scheme = text.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => StoreLocation::Postgres(text.into_owned()),
            _ => StoreLocation::Sqlite(db.to_path_buf()),
        }
    }

    /// The directory that holds the server's token file and the
    /// supervisor's state: the SQLite file's, or for a database URL the
    /// default state directory (that of [`default_db_path`]).
    pub fn state_dir(&self) -> PathBuf {
        let anchor = match self {
            StoreLocation::Sqlite(path) => path.clone(),
            StoreLocation::Postgres(_) => default_db_path(),
        };
        anchor
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from)
    }

    /// The location for messages: a PostgreSQL URL without its password.
    pub fn describe(&self) -> String {
        match self {
            StoreLocation::Sqlite(path) => path.display().to_string(),
            StoreLocation::Postgres(url) => store::postgres_url_redacted(url),
        }
    }
}

/// Sets its flag when dropped.
struct CancelOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An open store, of either kind.
enum OpenStore {
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PgStore>),
}

impl OpenStore {
    fn close(&self) {
        match self {
            OpenStore::Sqlite(store) => store.close(),
            OpenStore::Postgres(store) => store.close(),
        }
    }
}

/// The default SQLite file: `$STATE_DIRECTORY/jobs.db` under systemd,
/// `/var/lib/jobmgr/jobs.db` for root, else
/// `$XDG_STATE_HOME/jobmgr/jobs.db` (`~/.local/state/jobmgr/jobs.db`).
pub fn default_db_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        let first = std::env::split_paths(&dir).next().unwrap_or_default();
        return first.join("jobs.db");
    }
    if nix_is_root() {
        return PathBuf::from("/var/lib/jobmgr/jobs.db");
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    state.join("jobmgr/jobs.db")
}

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The warning logged at start when `--bedrock-trust-loopback` is on.
pub const TRUST_LOOPBACK_WARNING: &str = "--bedrock-trust-loopback: Bedrock-port requests from \
     loopback need no token, so ANY local user, workers included, can read, create, finish and \
     delete every job; use it only for old Bedrock clients, on a host that runs no workers";

/// Binds a TCP listener, with an error that names the address.
pub async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// The sockets a server answers on.
pub struct Listeners {
    /// The HTTP API.
    pub http: TcpListener,
    /// The Bedrock port, if served.
    pub bedrock: Option<TcpListener>,
}

/// A started server: its queue, for in-process use, and how to stop it.
pub struct Server {
    /// The queue every front-end serves.
    pub queue: Queue,
    store: OpenStore,
    bedrock_limits: bedrock::Limits,
    token: ApiToken,
    bedrock_trust_loopback: bool,
    browser: http::BrowserPolicy,
    http_limits: http::Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Server {
    /// Whether the HTTP port speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Opens the store and starts the queue. A PostgreSQL database that
    /// cannot be reached yet is waited for, with backoff, for as long as
    /// the caller waits.
    pub async fn start(config: &ServerConfig) -> Result<Self, ServerError> {
        let tls = config
            .tls
            .as_ref()
            .map(http::TlsFiles::acceptor)
            .transpose()?;
        let location = StoreLocation::of(&config.db);
        let (store, shared, database_clock): (OpenStore, Arc<dyn store::Store>, _) = match &location
        {
            StoreLocation::Sqlite(path) if path.to_string_lossy().contains("://") => {
                // A URL of another kind, not a file to make.
                return Err(store::PgOpenError::Url {
                    url: store::postgres_url_redacted(&path.to_string_lossy()),
                    reason: "jobs are kept in an SQLite file (a path) or in PostgreSQL".into(),
                }
                .into());
            }
            StoreLocation::Sqlite(path) => {
                let store = Arc::new(SqliteStore::open(path)?);
                (OpenStore::Sqlite(store.clone()), store, None)
            }
            StoreLocation::Postgres(url) => {
                let url = url.clone();
                // Stops the retries when the caller stops waiting.
                let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let _cancel = CancelOnDrop(Arc::clone(&cancelled));
                let store =
                    tokio::task::spawn_blocking(move || PgStore::open(&url, None, &cancelled))
                        .await
                        .map_err(|e| ServerError::Serve(std::io::Error::other(e.to_string())))??;
                let store = Arc::new(store);
                let clock = store.clock();
                (OpenStore::Postgres(store.clone()), store, Some(clock))
            }
        };
        let clock: Arc<dyn queue::Clock> = match (&config.clock_file, database_clock) {
            (Some(path), _) => {
                tracing::warn!(path = %path.display(), "reading the time from a file, not the system clock");
                Arc::new(queue::FileClock::new(path.clone()))
            }
            (None, Some(database)) => database,
            (None, None) => Arc::new(queue::SystemClock),
        };
        let queue = Queue::start_with_clock(shared, config.queue, clock);
        queue.load_tracked().await;
        tracing::info!(db = %location.describe(), "job store open");
        Ok(Server {
            queue,
            store,
            bedrock_limits: config.bedrock_limits,
            token: config.token.clone(),
            bedrock_trust_loopback: config.bedrock_trust_loopback,
            browser: config.browser.clone(),
            http_limits: config.http_limits,
            tls,
        })
    }

    /// Serves the HTTP API (and the Bedrock port, when given) until
    /// `shutdown` resolves; then answers held requests, finishes in-flight
    /// ones and closes the store. Every request on either port must carry
    /// the server's token (but see `bedrock_trust_loopback`).
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let local = listeners.http.local_addr().map_err(ServerError::Serve)?;
        self.queue.ready().await;
        let stop = CancellationToken::new();
        // One byte budget for what both ports buffer for their clients.
        let budget = byte_budget(self.http_limits.body_budget);
        let bedrock = match listeners.bedrock {
            Some(listener) => {
                let auth = bedrock::Auth {
                    token: self.token.clone(),
                    trust_loopback: self.bedrock_trust_loopback,
                };
                if auth.trust_loopback {
                    tracing::warn!("{TRUST_LOOPBACK_WARNING}");
                }
                Some(tokio::spawn(bedrock::serve(
                    listener,
                    self.queue.clone(),
                    self.bedrock_limits,
                    auth,
                    Arc::clone(&budget),
                    stop.clone(),
                )))
            }
            None => None,
        };
        report_queue(self.queue.clone(), stop.clone());
        let app = http::router(
            self.queue.clone(),
            self.token.clone(),
            self.browser.bound_to(local),
        )
        .layer(axum::Extension(http::EventStreams::new(&self.http_limits)));
        let queue = self.queue.clone();
        let signal = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down: answering held requests");
            queue.shutdown();
            signal.cancel();
        });
        if !local.ip().is_loopback() && self.tls.is_none() {
            tracing::warn!(
                http = %local,
                "the HTTP port listens beyond loopback without TLS: tokens and job data cross the \
                 network in clear; pass --tls-cert and --tls-key"
            );
        }
        let limits = self.http_limits;
        tracing::info!(
            max_connections = limits.max_connections,
            per_peer = limits.max_connections_per_peer,
            body_budget_mib = limits.body_budget >> 20,
            memory_bound_mib = (limits.memory_bound()
                + self.bedrock_limits.max_connections * bedrock::FREE_BUFFER)
                >> 20,
            tls = self.tls.is_some(),
            "port limits (the byte budget is shared by both ports)"
        );
        http::listen::serve(
            listeners.http,
            app,
            self.http_limits,
            self.tls.clone(),
            Arc::clone(&budget),
            stop.clone(),
        )
        .await;
        let result = Ok(());
        stop.cancel();
        self.queue.shutdown();
        if let Some(bedrock) = bedrock {
            let _ = bedrock.await;
        }
        // Put-backs of undelivered jobs still need the store.
        self.queue.settle().await;
        self.store.close();
        result
    }
}

/// Has the queue gauges (waiters, jobs by state and by name) counted on
/// every scrape, while this server runs and a metrics endpoint is installed.
fn report_queue(queue: Queue, stop: CancellationToken) {
    if !crate::metrics::installed() {
        return;
    }
    let gauges = Arc::new(std::sync::Mutex::new(crate::metrics::QueueGauges::default()));
    crate::metrics::collect_on_scrape(Arc::new(move || {
        let queue = queue.clone();
        let stop = stop.clone();
        let gauges = Arc::clone(&gauges);
        Box::pin(async move {
            if stop.is_cancelled() {
                return;
            }
            if let Ok(counts) = queue.count_by_name().await {
                gauges
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .report(queue.waiting(), &counts);
            }
        })
    }));
}

/// Runs the job server with only its HTTP API on `http` until `shutdown`
/// resolves.
pub async fn run(
    config: ServerConfig,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let server = Server::start(&config).await?;
    server
        .serve(
            Listeners {
                http,
                bedrock: None,
            },
            shutdown,
        )
        .await
}
