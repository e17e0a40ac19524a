//! The checks a supervisor's start makes before it takes a job, in one
//! place: `jobmgr` runs them before it starts, and `jobmgr check-config`
//! runs the very same ones, so that the two cannot disagree. Then, for
//! `check-config` only, [`verify`]: the configured server is asked an
//! authenticated question with the configured token (like `gitlab-runner
//! verify`), or, for the embedded server, its store's directory and its
//! ports are checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::CliError;
use crate::auth::ClientToken;
use crate::client::JobSource;
use crate::config::SupervisorOptions;
use crate::server::bedrock::DEFAULT_BEDROCK_ADDR;
use crate::server::http::BrowserPolicy;
use crate::server::{self, DEFAULT_HTTP_ADDR};
use crate::supervisor::Settings;
use crate::supervisor::worker_path::WorkerPath;

/// How long [`verify`] waits for the server's answer.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The start's plan: the effective options and what they resolve to.
#[derive(Debug)]
pub struct Plan {
    /// The effective options (files, `JOBMGR_*` variables, flags).
    pub options: SupervisorOptions,
    /// The embedded server's store.
    pub db: PathBuf,
    /// The token file: made by the embedded server, read with `--server`.
    pub token_file: PathBuf,
    /// Where the supervisor keeps its state: the store's directory.
    pub state_dir: PathBuf,
    /// Each pool's settings.
    pub pools: Vec<Settings>,
    /// The embedded server's browser policy (unused with `--server`).
    pub browser: BrowserPolicy,
}

/// Every check the start makes of the effective `options` before it
/// starts: the settings of each pool (and `[[job]]` table), each pool's
/// worker path, its sandbox (user, group, worker uids, namespaces,
/// Landlock; cgroup limits are probed at start only, since probing makes
/// cgroups), the server URL and the embedded server's browser policy. A
/// failure is a usage error (exit 2) that says what to change.
pub fn check(options: SupervisorOptions) -> Result<Plan, CliError> {
    let usage = |e: &dyn std::fmt::Display| CliError::Usage(e.to_string());
    let db = options.db.clone().unwrap_or_else(server::default_db_path);
    let state_dir = server::StoreLocation::of(&db).state_dir();
    let token_file = options
        .token_file
        .clone()
        .unwrap_or_else(|| state_dir.join(crate::auth::TOKEN_FILE_NAME));
    let pools = Settings::resolve_pools(&options, &state_dir).map_err(|e| usage(&e))?;
    for settings in &pools {
        let within = settings
            .pool
            .as_deref()
            .map_or(String::new(), |p| format!("[[pool]] {p:?}: "));
        WorkerPath::new(&settings.worker_path).map_err(|e| {
            CliError::Usage(format!(
                "{within}{e}; pass an existing directory as --worker-path"
            ))
        })?;
        crate::supervisor::check_sandboxes(settings)
            .map_err(|e| CliError::Usage(format!("{within}{e}")))?;
    }
    if let Some(url) = options.server.as_deref() {
        check_server_url(url)?;
    }
    let browser = BrowserPolicy::new(
        options.allowed_hosts.clone().unwrap_or_default(),
        options.allowed_origins.clone().unwrap_or_default(),
    )
    .map_err(|e| usage(&e))?;
    Ok(Plan {
        options,
        db,
        token_file,
        state_dir,
        pools,
        browser,
    })
}

/// Whether `url` is a server URL the supervisor can use: one URL, or a
/// comma-separated list of `http(s)://` URLs of servers that share a store.
pub fn check_server_url(url: &str) -> Result<(), CliError> {
    if url.contains(',') {
        if url.contains("bedrock://") {
            return Err(CliError::Usage(format!(
                "bad server {url:?}: a list of servers takes http:// and https:// URLs; bedrock:// takes one server"
            )));
        }
        crate::client::HttpClient::new(url, None)
            .map_err(|e| CliError::Usage(format!("bad server list: {e}")))?;
        for one in url.split(',') {
            check_server_url(one.trim())?;
        }
        return Ok(());
    }
    let bad = |why: String| {
        CliError::Usage(format!(
            "bad server {url:?}: {why}; expected http://HOST:PORT, https://HOST:PORT or bedrock://HOST:PORT"
        ))
    };
    if let Some(addr) = url.strip_prefix("bedrock://") {
        crate::client::BedrockSource::new(addr.trim_end_matches('/'))
            .map_err(|e| bad(e.to_string()))?;
        return Ok(());
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        let parsed = reqwest::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host".into()));
        }
        return Ok(());
    }
    Err(bad("no scheme".into()))
}

/// The token a supervisor shows the server at `url`: `given`, else
/// `--token-file`, else the default files.
pub fn client_token(plan: &Plan, given: Option<&str>, url: &str) -> Result<ClientToken, CliError> {
    let explicit = plan.options.token_file.as_deref();
    let mut defaults = vec![plan.token_file.clone()];
    defaults.extend(crate::auth::default_client_files());
    defaults.dedup();
    crate::auth::for_client(given, explicit, &defaults, url)
        .map_err(|e| CliError::Server(server::ServerError::from(e)))
}

/// What [`verify`] found, for `check-config`'s output.
pub type Verified = String;

/// Verifies that the plan can work here and now: with `--server`, asks
/// the server an authenticated question (QueryJob / `GET /jobs/1`) with
/// the configured token within [`VERIFY_TIMEOUT`]; with the embedded
/// server, checks that its store's directory is writable and its ports
/// are free. A failure is exit 1: `cannot reach …: why`.
pub async fn verify(
    plan: &Plan,
    token: Option<&str>,
    ca_cert: Option<&Path>,
) -> Result<Verified, CliError> {
    let failed = |what: String| CliError::Server(server::ServerError::Unverified(what));
    let Some(url) = plan.options.server.as_deref() else {
        let dir = writable_ancestor(&plan.state_dir).map_err(failed)?;
        let http = plan
            .options
            .http
            .clone()
            .unwrap_or_else(|| DEFAULT_HTTP_ADDR.into());
        let bedrock = plan
            .options
            .bedrock
            .clone()
            .unwrap_or_else(|| DEFAULT_BEDROCK_ADDR.into());
        let probed = match bedrock.as_str() {
            "none" | "" => DEFAULT_BEDROCK_ADDR,
            addr => addr,
        };
        let mut ports = vec![(http.as_str(), "HTTP")];
        if !matches!(bedrock.as_str(), "none" | "") {
            ports.push((bedrock.as_str(), "Bedrock"));
        }
        for (addr, port) in &ports {
            // Bound and let go at once: free now.
            super::embedded_ports::bind(addr, port, probed)
                .await
                .map_err(|e| failed(e.to_string()))?;
        }
        return Ok(format!(
            "embedded server: {} is writable; {} free",
            dir.display(),
            ports
                .iter()
                .map(|(a, _)| *a)
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    };
    // The list as the supervisor's start reads it (a bad list is refused
    // the same way), then each server of it on its own: a failover list
    // answers through its first live server, which would hide the dead.
    let servers: Vec<&str> = if url.contains(',') {
        if let Ok(whole) = client_token(plan, token, url) {
            super::supervise::connect(url, whole, ca_cert)?;
        }
        url.split(',')
            .map(|s| s.trim().trim_end_matches('/'))
            .collect()
    } else {
        vec![url]
    };
    let checks = servers
        .iter()
        .map(|server| verify_server(plan, token, ca_cert, server));
    let answers = futures_util::future::join_all(checks).await;
    let (reached, unreached): (Vec<_>, Vec<_>) = answers.into_iter().partition(Result::is_ok);
    let reached: Vec<String> = reached.into_iter().flatten().collect();
    let unreached: Vec<String> = unreached.into_iter().filter_map(Result::err).collect();
    if unreached.is_empty() {
        return Ok(reached.join("; "));
    }
    let mut why = unreached.join("; ");
    if !reached.is_empty() {
        why.push_str(&format!(
            " ({} of {} servers failed; {})",
            unreached.len(),
            servers.len(),
            reached.join("; ")
        ));
    }
    Err(failed(why))
}

/// Asks one server of `--server` an authenticated question: what it
/// answered, or `cannot reach URL: why`.
async fn verify_server(
    plan: &Plan,
    token: Option<&str>,
    ca_cert: Option<&Path>,
    url: &str,
) -> Result<String, String> {
    let cannot = |why: String| format!("cannot reach {url}: {why}");
    let token = client_token(plan, token, url).map_err(|e| cannot(e.to_string()))?;
    let source: Arc<dyn JobSource> =
        super::supervise::connect(url, token, ca_cert).map_err(|e| cannot(e.to_string()))?;
    match tokio::time::timeout(VERIFY_TIMEOUT, source.exists(1)).await {
        Err(_) => Err(cannot(format!(
            "no answer within {}s",
            VERIFY_TIMEOUT.as_secs()
        ))),
        Ok(Err(error)) => Err(cannot(error.to_string())),
        Ok(Ok(_)) => Ok(format!(
            "{}: reached, and it took the token",
            source.describe()
        )),
    }
}

/// The directory the store would be made in, or its nearest existing
/// ancestor (start makes the rest), if this user may write there.
fn writable_ancestor(dir: &Path) -> Result<PathBuf, String> {
    let mut at = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    loop {
        if at.exists() {
            return match nix::unistd::access(at, nix::unistd::AccessFlags::W_OK) {
                Ok(()) => Ok(at.to_path_buf()),
                Err(e) => Err(format!(
                    "the embedded server cannot make its store in {}: {} is not writable ({e}); set --db to a writable place",
                    dir.display(),
                    at.display()
                )),
            };
        }
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => return Ok(dir.to_path_buf()),
        }
    }
}
