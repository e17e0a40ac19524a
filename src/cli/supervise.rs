//! `jobmgr [OPTIONS]` without a subcommand: the supervisor, with an embedded
//! job server unless `--server` names one.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio::sync::mpsc;

use super::CliError;
use super::signals::Signals;
use crate::auth::ClientToken;
use crate::client::{HttpSource, JobSource, LocalSource};
use crate::config::{self, SupervisorOptions};
use crate::server::bedrock::{self, DEFAULT_BEDROCK_ADDR};
use crate::server::queue::QueueConfig;
use crate::server::{self, DEFAULT_HTTP_ADDR, Listeners, ServerConfig};
use crate::supervisor::gate::{LoadSource, RecentLoad};
use crate::supervisor::{Settings, Supervisor};

/// The supervisor's command line.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// The main configuration file [default: /etc/jobmgr/jobmgr.toml, if it exists]; conf.d/*.toml beside it follow; flags and JOBMGR_* variables win; re-read on SIGHUP.
    #[arg(long, value_name = "PATH", help_heading = "Config")]
    pub config: Option<PathBuf>,
    /// The API token: sent to the job server, or required by the embedded server [default: the one in --token-file]
    #[arg(help_heading = "Server")]
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Also trust this CA certificate (PEM) for an https:// --server.
    #[arg(
        long,
        env = "JOBMGR_CA_CERT",
        value_name = "PEM",
        help_heading = "Server"
    )]
    pub ca_cert: Option<PathBuf>,
    /// The options.
    #[command(flatten)]
    pub options: SupervisorOptions,
    /// BWM's options given and ignored, said at start.
    #[arg(skip)]
    pub bwm_ignored: Vec<super::bwm_options::Ignored>,
}

fn effective(args: &SuperviseArgs) -> Result<SupervisorOptions, config::ConfigError> {
    let layers = config::load_layers(args.config.as_deref())?;
    Ok(args.options.clone().over(config::merge_layers(&layers)))
}

/// Runs the supervisor until it drains.
pub async fn run(args: SuperviseArgs) -> Result<(), CliError> {
    let signals =
        Signals::register().map_err(|e| CliError::Usage(format!("cannot watch signals: {e}")))?;
    super::warn_if_token_in_argv();
    super::bwm_options::warn(&args.bwm_ignored);
    let options = effective(&args).map_err(|e| CliError::Usage(e.to_string()))?;
    // The very checks `jobmgr check-config` makes.
    let plan = super::start_checks::check(options)?;
    let options = plan.options.clone();
    let (db, token_file, state_dir) = (
        plan.db.clone(),
        plan.token_file.clone(),
        plan.state_dir.clone(),
    );
    let pools = plan.pools.clone();
    warn_if_no_cpu_pressure(&pools);

    let mut embedded = None;
    let mut access = crate::supervisor::bwm_php::Access::default();
    let source: Arc<dyn JobSource> = match options.server.as_deref() {
        None => {
            // The embedded server makes its token file, so that the CLI,
            // run as this user, works with no flag; its own source needs none.
            let token = crate::auth::for_server(args.token.as_deref(), &token_file)
                .map_err(server::ServerError::from)?;
            let metrics = super::serve_metrics(options.metrics, Some(token.clone())).await?;
            access.token = Some(token.clone());
            let config = ServerConfig {
                db: db.clone(),
                token,
                bedrock_trust_loopback: options.bedrock_trust_loopback.unwrap_or(false),
                queue: QueueConfig::default(),
                bedrock_limits: bedrock::Limits::default(),
                http_limits: server::http::Limits::default(),
                tls: None,
                clock_file: None,
                browser: plan.browser.clone(),
            };
            let http_addr = options
                .http
                .clone()
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.into());
            let bedrock_addr = options
                .bedrock
                .clone()
                .unwrap_or_else(|| DEFAULT_BEDROCK_ADDR.into());
            // A taken port most likely means a local Bedrock: say so.
            let probed = match bedrock_addr.as_str() {
                "none" | "" => DEFAULT_BEDROCK_ADDR,
                addr => addr,
            };
            let http = super::embedded_ports::bind(&http_addr, "HTTP", probed).await?;
            let bedrock = match bedrock_addr.as_str() {
                "none" | "" => None,
                addr => Some(super::embedded_ports::bind(addr, "Bedrock", probed).await?),
            };
            let http_local = http.local_addr().map_err(server::ServerError::Serve)?;
            let bedrock_local = bedrock.as_ref().and_then(|l| l.local_addr().ok());
            access.bedrock = bedrock_local.map(crate::supervisor::bwm_php::Access::connect_to);
            let started = server::Server::start(&config).await?;
            let queue = started.queue.clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(started.serve(Listeners { http, bedrock }, async move {
                let _ = stopped.await;
            }));
            println!(
                "jobmgr supervisor ready: server=embedded http=http://{http_local} bedrock={} db={}{metrics}",
                bedrock_local.map_or("none".to_string(), |a| a.to_string()),
                server::StoreLocation::of(&db).describe()
            );
            embedded = Some((stop, task));
            Arc::new(LocalSource::new(queue))
        }
        Some(url) => {
            let token = super::start_checks::client_token(&plan, args.token.as_deref(), url)?;
            let metrics = super::serve_metrics(options.metrics, token.token.clone()).await?;
            let reach = reach(url, &token, args.ca_cert.as_deref()).await;
            access.token = token.token.clone();
            access.bedrock = url
                .strip_prefix("bedrock://")
                .map(|rest| rest.trim_end_matches('/').to_string());
            let source = connect(url, token, args.ca_cert.as_deref())?;
            match reach {
                Ok(()) => println!(
                    "jobmgr supervisor ready: server={}{metrics}",
                    source.describe()
                ),
                // Not "ready" while the server cannot be reached; the
                // supervisor keeps asking, and spools its reports.
                Err(error) => {
                    println!(
                        "jobmgr supervisor waiting for server at {}: {error}{metrics}",
                        source.describe()
                    );
                    tracing::warn!(server = %source.describe(), %error, "waiting for the job server");
                }
            }
            source
        }
    };

    super::service::ready(&format!("supervising: {}", source.describe()));
    super::service::keep_watchdog();
    let (control, controls) = mpsc::unbounded_channel();
    let stop_pools = control.clone();
    let signals = tokio::spawn(signals.forward(control));
    // Each pool is a supervisor of its own; signals go to all of them.
    let mut running = tokio::task::JoinSet::new();
    let mut fan_out = Vec::new();
    let host = Arc::new(crate::supervisor::Host::new(&source.describe()));
    let status_path = config::status_file(&options, &state_dir);
    let status_writer = host.status.keep_written(status_path.clone());
    for settings in pools {
        let load: Arc<dyn LoadSource> = Arc::new(RecentLoad::new(
            settings.load.clone(),
            crate::supervisor::gate::READING_REUSED_FOR,
        ));
        let reload_args = SuperviseArgs {
            config: args.config.clone(),
            token: None,
            ca_cert: None,
            options: args.options.clone(),
            bwm_ignored: Vec::new(),
        };
        let reload_state = state_dir.clone();
        let pool = settings.pool.clone();
        let supervisor = Supervisor::new(settings, Arc::clone(&source), load)
            .on_host(Arc::clone(&host))
            .with_access(access.clone())
            .with_reload(Box::new(move || {
                let options = effective(&reload_args)?;
                let pools = Settings::resolve_pools(&options, &reload_state)?;
                pools.into_iter().find(|p| p.pool == pool).ok_or_else(|| {
                config::ConfigError::Setting(format!(
                    "pool {:?} is no longer in the configuration; restart jobmgr to remove a pool",
                    pool.as_deref().unwrap_or("main")
                ))
            })
            }));
        let (tx, rx) = mpsc::unbounded_channel();
        fan_out.push(tx);
        running.spawn(supervisor.run(rx));
    }
    let mut controls = controls;
    let forward = tokio::spawn(async move {
        while let Some(message) = controls.recv().await {
            for pool in &fan_out {
                let _ = pool.send(message);
            }
        }
    });
    let mut outcome = Ok(());
    let mut pools_stopped = false;
    while let Some(ended) = running.join_next().await {
        match ended {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => outcome = Err(CliError::Usage(error.to_string())),
            Err(error) => {
                outcome = Err(CliError::Usage(format!(
                    "a pool stopped unexpectedly: {error}"
                )))
            }
        }
        if outcome.is_err() && !pools_stopped {
            // One pool cannot run: drain the others rather than run half.
            pools_stopped = true;
            let _ = stop_pools.send(crate::supervisor::Control::Drain);
        }
    }
    forward.abort();
    status_writer.abort();
    let _ = std::fs::remove_file(&status_path);
    signals.abort();
    if let Some((stop, task)) = embedded {
        let _ = stop.send(());
        if let Ok(Err(error)) = task.await {
            tracing::error!(%error, "embedded server stopped with an error");
        }
    }
    outcome
}

/// Says once, at start, that the CPU pressure gate is off where the
/// kernel has no pressure file (no PSI, or a container without it).
fn warn_if_no_cpu_pressure(pools: &[Settings]) {
    let absent = pools.iter().find_map(|settings| {
        let path = settings.load.cpu_pressure.as_ref()?;
        (!path.exists()).then_some(path)
    });
    if let Some(path) = absent {
        tracing::warn!(
            path = %path.display(),
            "max-cpu-pressure is set but {} does not exist (a kernel without PSI, or booted with psi=0): the CPU pressure gate is off",
            path.display()
        );
    }
}

/// Whether the server at `url` answers at all (any HTTP answer counts,
/// a refusal included; for `bedrock://`, a TCP connection); why not.
async fn reach(
    url: &str,
    token: &ClientToken,
    ca_cert: Option<&std::path::Path>,
) -> Result<(), String> {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
    if let Some(addr) = url.strip_prefix("bedrock://") {
        let addr = addr.trim_end_matches('/');
        return match tokio::time::timeout(WITHIN, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(crate::client::with_sources(&error)),
            Err(_) => Err(format!("no connection within {}s", WITHIN.as_secs())),
        };
    }
    let client = crate::client::HttpClient::trusting(url, token.token.clone(), ca_cert)
        .map_err(|e| e.to_string())?
        .probe();
    match client
        .call(reqwest::Method::GET, "/healthz", None, WITHIN)
        .await
    {
        Err(crate::client::ClientError::Transport { detail, .. }) => Err(detail),
        _ => Ok(()),
    }
}

/// A job source for a server URL, showing `token`, trusting `ca_cert` too
/// for an `https://` one.
pub fn connect(
    url: &str,
    token: ClientToken,
    ca_cert: Option<&std::path::Path>,
) -> Result<Arc<dyn JobSource>, CliError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Arc::new(
            HttpSource::trusting(url, token.token, ca_cert)?.with_hint(token.hint),
        ));
    }
    if let Some(addr) = url.strip_prefix("bedrock://") {
        let source = crate::client::BedrockSource::new(addr.trim_end_matches('/'))
            .map_err(|e| CliError::Usage(format!("bad --server {url:?}: {e}")))?
            .with_token(token.token);
        // At start-up, say once if the server gives no leases (a real
        // Bedrock); the first hand-out tells it too, if it cannot be asked now.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let probe = source.clone();
            runtime.spawn(async move { probe.probe_leases().await });
        }
        return Ok(Arc::new(source));
    }
    Err(CliError::Usage(format!(
        "bad --server {url:?}: expected http://HOST:PORT, https://HOST:PORT or bedrock://HOST:PORT"
    )))
}
