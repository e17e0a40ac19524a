//! `jobmgr [OPTIONS]` without a subcommand: the supervisor, with an embedded
//! job server unless `--server` names one.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio::sync::mpsc;

use super::CliError;
use super::signals::Signals;
use crate::client::{HttpSource, JobSource, LocalSource};
use crate::config::{self, SupervisorOptions};
use crate::server::bedrock::{self, DEFAULT_BEDROCK_ADDR};
use crate::server::queue::QueueConfig;
use crate::server::{self, DEFAULT_HTTP_ADDR, Listeners, ServerConfig};
use crate::supervisor::gate::LoadSource;
use crate::supervisor::{Settings, Supervisor};

/// The supervisor's command line.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// A TOML file with the same options as these flags (flags win); re-read on SIGHUP.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Bearer token for the job server (and for the embedded server's API).
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// The options.
    #[command(flatten)]
    pub options: SupervisorOptions,
}

fn effective(args: &SuperviseArgs) -> Result<SupervisorOptions, config::ConfigError> {
    let file = match &args.config {
        Some(path) => config::load_file(path)?,
        None => SupervisorOptions::default(),
    };
    Ok(args.options.clone().over(file))
}

/// Runs the supervisor until it drains.
pub async fn run(args: SuperviseArgs) -> Result<(), CliError> {
    let signals =
        Signals::register().map_err(|e| CliError::Usage(format!("cannot watch signals: {e}")))?;
    let options = effective(&args).map_err(|e| CliError::Usage(e.to_string()))?;
    let token = args.token.clone().filter(|t| !t.is_empty());
    let db = options.db.clone().unwrap_or_else(server::default_db_path);
    let state_dir = db
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let settings =
        Settings::resolve(&options, &state_dir).map_err(|e| CliError::Usage(e.to_string()))?;
    // Fail early and clearly on a missing worker path.
    crate::supervisor::worker_path::WorkerPath::new(&settings.worker_path).map_err(|e| {
        CliError::Usage(format!("{e}; pass an existing directory as --worker-path"))
    })?;

    let metrics = super::serve_metrics(options.metrics).await?;
    let mut embedded = None;
    let source: Arc<dyn JobSource> = match options.server.as_deref() {
        None => {
            let config = ServerConfig {
                db: db.clone(),
                token: token.clone(),
                queue: QueueConfig::default(),
                bedrock_limits: bedrock::Limits::default(),
            };
            let http_addr = options
                .http
                .clone()
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.into());
            let bedrock_addr = options
                .bedrock
                .clone()
                .unwrap_or_else(|| DEFAULT_BEDROCK_ADDR.into());
            let http = server::bind(&http_addr).await?;
            let bedrock = match bedrock_addr.as_str() {
                "none" | "" => None,
                addr => Some(server::bind(addr).await?),
            };
            let http_local = http.local_addr().map_err(server::ServerError::Serve)?;
            let bedrock_local = bedrock.as_ref().and_then(|l| l.local_addr().ok());
            let started = server::Server::start(&config)?;
            let queue = started.queue.clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(started.serve(
                Listeners { http, bedrock },
                token.clone(),
                async move {
                    let _ = stopped.await;
                },
            ));
            println!(
                "jobmgr supervisor ready: server=embedded http=http://{http_local} bedrock={} db={}{metrics}",
                bedrock_local.map_or("none".to_string(), |a| a.to_string()),
                db.display()
            );
            embedded = Some((stop, task));
            Arc::new(LocalSource::new(queue))
        }
        Some(url) => {
            let source = connect(url, token.clone())?;
            println!(
                "jobmgr supervisor ready: server={}{metrics}",
                source.describe()
            );
            source
        }
    };

    let load: Arc<dyn LoadSource> = Arc::new(settings.load.clone());
    let reload_args = SuperviseArgs {
        config: args.config.clone(),
        token: None,
        options: args.options.clone(),
    };
    let reload_state = state_dir.clone();
    let supervisor = Supervisor::new(settings, source, load).with_reload(Box::new(move || {
        let options = effective(&reload_args)?;
        Settings::resolve(&options, &reload_state)
    }));
    let (control, controls) = mpsc::unbounded_channel();
    let signals = tokio::spawn(signals.forward(control));
    let outcome = supervisor.run(controls).await;
    signals.abort();
    if let Some((stop, task)) = embedded {
        let _ = stop.send(());
        if let Ok(Err(error)) = task.await {
            tracing::error!(%error, "embedded server stopped with an error");
        }
    }
    outcome.map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(())
}

/// A job source for a server URL.
pub fn connect(url: &str, token: Option<String>) -> Result<Arc<dyn JobSource>, CliError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Arc::new(HttpSource::new(url, token)?));
    }
    if let Some(addr) = url.strip_prefix("bedrock://") {
        let source = crate::client::BedrockSource::new(addr.trim_end_matches('/'))
            .map_err(|e| CliError::Usage(format!("bad --server {url:?}: {e}")))?;
        return Ok(Arc::new(source));
    }
    Err(CliError::Usage(format!(
        "bad --server {url:?}: expected http://HOST:PORT or bedrock://HOST:PORT"
    )))
}
