//! `jobmgr check-config`: loads the configuration as the supervisor would
//! (files, `JOBMGR_*` variables, flags), makes every check the supervisor's
//! start makes (the same code: [`super::start_checks`]), verifies the
//! server unless `--offline`, and prints the effective settings with where
//! each value came from.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory};

use super::{CliError, start_checks};
use crate::config::{self, Layer, SupervisorOptions};
use crate::supervisor::Settings;

/// Options of `jobmgr check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The main configuration file [default: /etc/jobmgr/jobmgr.toml, if it exists]; conf.d/*.toml beside it follow.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Skip the server check (no connection is made; with the embedded server, its store's directory and ports are not checked): for a package build or an image where no server runs.
    #[arg(long)]
    pub offline: bool,
    /// The API token to verify the server with [default: the one in --token-file]
    #[arg(
        long,
        env = "JOBMGR_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Also trust this CA certificate (PEM) for an https:// --server.
    #[arg(long, env = "JOBMGR_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
    /// Supervisor options, as they would be given to the supervisor.
    #[command(flatten)]
    pub options: SupervisorOptions,
}

/// The options set on the command line or by `JOBMGR_*` variables, with
/// which, by configuration key.
fn command_line_sources() -> Vec<(String, String)> {
    let matches = super::Cli::command().ignore_errors(true).get_matches();
    let Some(sub) = matches.subcommand_matches("check-config") else {
        return Vec::new();
    };
    sources(sub)
}

fn sources(matches: &ArgMatches) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for id in matches.ids() {
        let key = id.as_str().replace('_', "-");
        match matches.value_source(id.as_str()) {
            Some(ValueSource::CommandLine) => out.push((key.clone(), format!("flag --{key}"))),
            Some(ValueSource::EnvVariable) => out.push((
                key.clone(),
                format!("environment JOBMGR_{}", id.as_str().to_ascii_uppercase()),
            )),
            _ => {}
        }
    }
    out
}

/// Where a key's value came from: the command line, the last file that
/// sets it, or the default.
fn source_of(key: &str, cli: &[(String, String)], layers: &[Layer]) -> String {
    if let Some((_, source)) = cli.iter().find(|(k, _)| k == key) {
        return source.clone();
    }
    for layer in layers.iter().rev() {
        if config::set_keys(&layer.options).contains_key(key) {
            return format!("file {}", layer.path.display());
        }
    }
    "default".into()
}

/// Checks and prints the configuration. Exit 0 when valid (and the server
/// verified); a bad file or value, or anything else the supervisor's start
/// would refuse, is a usage error (exit 2) with the file, line and key; a
/// server that cannot be reached or refuses the token (or, for the
/// embedded server, a store directory that is not writable or a port that
/// is taken) is exit 1.
pub async fn run(args: CheckConfigArgs) -> Result<(), CliError> {
    let layers =
        config::load_layers(args.config.as_deref()).map_err(|e| CliError::Usage(e.to_string()))?;
    let options = args.options.clone().over(config::merge_layers(&layers));
    let plan = start_checks::check(options)?;
    let verified = if args.offline {
        "skipped (--offline)".to_string()
    } else {
        start_checks::verify(&plan, args.token.as_deref(), args.ca_cert.as_deref()).await?
    };
    let options = plan.options.clone();
    let (db, state_dir) = (plan.db.clone(), plan.state_dir.clone());
    let settings =
        Settings::resolve(&options, &state_dir).map_err(|e| CliError::Usage(e.to_string()))?;
    let cli = command_line_sources();

    println!("# jobmgr: effective supervisor configuration");
    if layers.is_empty() {
        println!(
            "# files: none (no {} and no --config)",
            config::DEFAULT_CONFIG
        );
    }
    for layer in &layers {
        println!("# file: {}", layer.path.display());
    }
    let mut rows: Vec<(String, String, String)> = settings
        .effective()
        .into_iter()
        .map(|(key, value)| (key.to_string(), value, source_of(key, &cli, &layers)))
        .collect();
    let embedded = options.server.is_none();
    let value = |v: Option<String>, default: &str| {
        v.map_or_else(|| default.to_string(), |v| format!("{v:?}"))
    };
    for (key, text) in [
        (
            "server",
            value(options.server.clone(), "\"\" # embedded server"),
        ),
        (
            "load-per-cpu",
            options.load_per_cpu.unwrap_or(false).to_string(),
        ),
        (
            "db",
            if embedded {
                format!("{:?}", crate::server::StoreLocation::of(&db).describe())
            } else {
                "# not used".into()
            },
        ),
        (
            "http",
            value(
                options.http.clone(),
                &format!("{:?}", crate::server::DEFAULT_HTTP_ADDR),
            ),
        ),
        (
            "bedrock",
            value(
                options.bedrock.clone(),
                &format!("{:?}", crate::server::bedrock::DEFAULT_BEDROCK_ADDR),
            ),
        ),
        (
            "metrics",
            value(options.metrics.map(|m| m.to_string()), "\"\" # off"),
        ),
        (
            "token-file",
            format!(
                "{:?}",
                options
                    .token_file
                    .clone()
                    .unwrap_or_else(|| crate::auth::default_token_file(&db))
                    .display()
                    .to_string()
            ),
        ),
        (
            "bedrock-trust-loopback",
            options.bedrock_trust_loopback.unwrap_or(false).to_string(),
        ),
    ] {
        rows.push((key.to_string(), text, source_of(key, &cli, &layers)));
    }
    let width = rows
        .iter()
        .map(|(k, v, _)| k.len() + v.len())
        .max()
        .unwrap_or(0)
        + 3;
    for (key, value, source) in rows {
        let line = match value.strip_prefix('#') {
            Some(unset) => format!("# {key} ={unset}"),
            None => format!("{key} = {value}"),
        };
        println!("{line:width$} # {source}");
    }
    for entry in settings.schedule.iter().flatten() {
        let source = table_source(&layers, |o| {
            o.schedule.iter().flatten().any(|s| s.name == entry.name)
        });
        println!(
            "[[schedule]] name = {:?}, repeat = {:?}  # {source}",
            entry.name,
            entry
                .repeat
                .as_ref()
                .map(|r| r.text.clone())
                .unwrap_or_default()
        );
    }
    for rule in options.job.iter().flatten() {
        let source = table_source(&layers, |o| {
            o.job.iter().flatten().any(|j| j.name == rule.name)
        });
        println!("[[job]] {}  # {source}", inline(rule));
    }
    for pool in options.pool.iter().flatten() {
        let source = table_source(&layers, |o| {
            o.pool.iter().flatten().any(|p| p.name == pool.name)
        });
        println!("[[pool]] {}  # {source}", inline(pool));
    }
    println!("# server check: {verified}");
    println!("# ok: the configuration is valid");
    Ok(())
}

/// The last file with a table that `declares` it.
fn table_source(layers: &[Layer], declares: impl Fn(&SupervisorOptions) -> bool) -> String {
    layers
        .iter()
        .rev()
        .find(|l| declares(&l.options))
        .map_or("command line".to_string(), |l| {
            format!("file {}", l.path.display())
        })
}

/// A table on one line.
fn inline(table: &impl serde::Serialize) -> String {
    let text = toml::Table::try_from(table)
        .map(|t| t.to_string())
        .unwrap_or_default();
    text.trim_end().replace('\n', ", ")
}
