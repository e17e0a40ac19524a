//! The job server: Bedrock::Jobs semantics on an SQLite file, served over
//! HTTP/JSON. [`run`] takes its listener from the caller, so tests and the
//! embedded supervisor start it on any address, and a shutdown future.

pub mod calendar;
pub mod http;
pub mod queue;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tokio::net::TcpListener;

use queue::{Queue, QueueConfig};
use store::SqliteStore;
pub use store::sqlite_error::StoreOpenError;

/// The HTTP address the server listens on unless told otherwise.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8889";

/// What the server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The SQLite file.
    pub db: PathBuf,
    /// The bearer token every API request must carry; required to listen
    /// beyond loopback.
    pub token: Option<String>,
    /// Lease and lapse settings.
    pub queue: QueueConfig,
}

/// Why the server could not start or stopped.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreOpenError),
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick another address or stop what holds it")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A non-loopback address without a token.
    #[error(
        "refusing to listen on {addr} without a token: set --token (or JOBMGR_TOKEN), or listen on 127.0.0.1"
    )]
    TokenRequired {
        /// The address.
        addr: SocketAddr,
    },
    /// Serving failed.
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
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

/// Refuses to expose the API beyond loopback without a token.
pub fn check_exposure(addr: SocketAddr, token: Option<&str>) -> Result<(), ServerError> {
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        return Err(ServerError::TokenRequired { addr });
    }
    Ok(())
}

/// Binds a TCP listener, with an error that names the address.
pub async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// A started server: its queue, for in-process use, and how to stop it.
pub struct Server {
    /// The queue every front-end serves.
    pub queue: Queue,
    store: Arc<SqliteStore>,
}

impl Server {
    /// Opens the store and starts the queue.
    pub fn start(config: &ServerConfig) -> Result<Self, ServerError> {
        let store = Arc::new(SqliteStore::open(&config.db)?);
        let queue = Queue::start(store.clone(), config.queue);
        tracing::info!(db = %config.db.display(), "job store open");
        Ok(Server { queue, store })
    }

    /// Serves the HTTP API on `listener` until `shutdown` resolves; then
    /// answers held requests, finishes in-flight ones and closes the store.
    pub async fn serve_http(
        self,
        listener: TcpListener,
        token: Option<String>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let local = listener.local_addr().map_err(ServerError::Serve)?;
        check_exposure(local, token.as_deref())?;
        let app = http::router(self.queue.clone(), token);
        let queue = self.queue.clone();
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                tracing::info!("shutting down: answering held requests");
                queue.shutdown();
            })
            .await
            .map_err(ServerError::Serve);
        self.queue.shutdown();
        self.store.close();
        result
    }
}

/// Runs the job server on `http` until `shutdown` resolves.
pub async fn run(
    config: ServerConfig,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let server = Server::start(&config)?;
    server
        .serve_http(http, config.token.clone(), shutdown)
        .await
}
