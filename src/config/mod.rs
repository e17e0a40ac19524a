//! Supervisor configuration: the same options as command-line flags and as
//! keys of a TOML file (`--config PATH`), flags winning over the file, and
//! the file re-read on SIGHUP. Unknown keys and bad values are refused with
//! the file, line and key.

mod values;

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;
use thiserror::Error;

pub use values::{ByteSize, EnvPair, HumanDuration, check_env_name, env_table};

/// The supervisor's options. Every field is optional: unset means "from the
/// file, else the default".
#[derive(Debug, Clone, Default, Args, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SupervisorOptions {
    /// Job names to take: a GLOB such as '*' or 'www-prod/*' [default: *]
    #[arg(long, alias = "jobName", value_name = "GLOB")]
    pub job_name: Option<String>,
    /// Directory holding one executable per job name.
    #[arg(long, alias = "workerPath", value_name = "DIR")]
    pub worker_path: Option<PathBuf>,
    /// Start no job while the 1-minute load average is at or above this [default: the CPU count]
    #[arg(long, alias = "maxLoad", value_name = "LOAD")]
    pub max_load: Option<f64>,
    /// Multiply --max-load by the number of CPUs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub load_per_cpu: Option<bool>,
    /// Start no job while available memory is below this [default: 128MiB]
    #[arg(long, value_name = "SIZE")]
    pub min_memory: Option<ByteSize>,
    /// The most workers at once [default: twice the CPU count]
    #[arg(long, value_name = "N")]
    pub max_workers: Option<usize>,
    /// Concurrency may grow by this many workers per second [default: the CPU count]
    #[arg(long, value_name = "N")]
    pub ramp: Option<usize>,
    /// A worker running longer is stopped (SIGTERM, grace, SIGKILL) [default: 30m]
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<HumanDuration>,
    /// Time between SIGTERM and SIGKILL [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pub kill_grace: Option<HumanDuration>,
    /// On SIGTERM, how long running jobs may take to finish before they are stopped and handed back [default: 2m]
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<HumanDuration>,
    /// Lease asked for each job, renewed every third of it while the worker runs [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub lease: Option<HumanDuration>,
    /// How long one fetch waits for a job before asking again [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub poll_wait: Option<HumanDuration>,
    /// Runs in all before a failing job is FAILED [default: 5]
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<i64>,
    /// Delay before the first retry of a failed job; doubles each time, with jitter [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pub backoff: Option<HumanDuration>,
    /// The longest retry delay [default: 1h]
    #[arg(long, value_name = "DURATION")]
    pub max_backoff: Option<HumanDuration>,
    /// Bytes of each of stdout and stderr kept per job, half from the start and half from the end [default: 64KiB]
    #[arg(long, value_name = "SIZE")]
    pub output_cap: Option<ByteSize>,
    /// Environment variables passed through to workers (repeatable) [default: PATH LANG LC_ALL TZ]
    #[arg(long = "env-allow", value_name = "NAME")]
    pub env_allow: Option<Vec<String>>,
    /// Extra environment for workers, NAME=VALUE (repeatable)
    #[arg(long = "env", value_name = "NAME=VALUE")]
    #[serde(default, deserialize_with = "env_table")]
    pub env: Option<Vec<EnvPair>>,
    /// Start this many jobs, then drain and exit (for a service manager to restart)
    #[arg(long, alias = "maxIterations", value_name = "N")]
    pub max_iterations: Option<u64>,
    /// When this file changes (a deploy), drain and exit for the service manager to restart
    #[arg(long, alias = "versionWatchFile", value_name = "PATH")]
    pub version_watch_file: Option<PathBuf>,
    /// The job server: http://HOST:PORT or bedrock://HOST:PORT [default: an embedded server]
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Where reports wait while the server is unreachable [default: next to the embedded store]
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Where each job's scratch directory is made [default: $TMPDIR/jobmgr]
    #[arg(long, value_name = "DIR")]
    pub scratch_dir: Option<PathBuf>,
    /// A file in /proc/loadavg format to read the load from [default: /proc/loadavg]
    #[arg(long, value_name = "PATH")]
    pub loadavg_path: Option<PathBuf>,
    /// A file in /proc/meminfo format to read available memory from [default: /proc/meminfo]
    #[arg(long, value_name = "PATH")]
    pub meminfo_path: Option<PathBuf>,
    /// Embedded server: its SQLite file [default: as for `jobmgr server`]
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Embedded server: where its HTTP API listens [default: 127.0.0.1:8889]
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// Embedded server: where its Bedrock port listens, or "none" [default: 127.0.0.1:8888]
    #[arg(long, value_name = "ADDR")]
    pub bedrock: Option<String>,
    /// When running as root: the user workers run as [default: jobmgr, else nobody]; "root" must be said explicitly; "self" means the supervisor's own user
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// The group workers run as [default: the user's]
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// The umask workers start with, octal [default: 027]
    #[arg(long, value_name = "MASK")]
    pub umask: Option<String>,
    /// rlimit: address space per worker process
    #[arg(long, value_name = "SIZE")]
    pub limit_as: Option<ByteSize>,
    /// rlimit: CPU time per worker process
    #[arg(long, value_name = "DURATION")]
    pub limit_cpu: Option<HumanDuration>,
    /// rlimit: open files per worker process
    #[arg(long, value_name = "N")]
    pub limit_nofile: Option<u64>,
    /// rlimit: processes of the worker's user
    #[arg(long, value_name = "N")]
    pub limit_nproc: Option<u64>,
    /// rlimit: largest file a worker may write
    #[arg(long, value_name = "SIZE")]
    pub limit_fsize: Option<ByteSize>,
    /// rlimit: core dump size [default: 0, no core dumps]
    #[arg(long, value_name = "SIZE")]
    pub limit_core: Option<ByteSize>,
    /// cgroup: memory of a job's whole process tree (needs cgroups)
    #[arg(long, value_name = "SIZE")]
    pub memory_max: Option<ByteSize>,
    /// cgroup: processes of a job's whole tree [default: 4096 where cgroups exist]
    #[arg(long, value_name = "N")]
    pub pids_max: Option<u64>,
    /// cgroup: CPUs' worth of time for a job's whole tree, e.g. 0.5 or 2 (needs cgroups)
    #[arg(long, value_name = "CPUS")]
    pub cpu_max: Option<f64>,
    /// Give workers no network (needs root)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub no_network: Option<bool>,
    /// Make the filesystem read-only for workers except their scratch directory (Landlock)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub read_only_fs: Option<bool>,
    /// Give workers a /tmp of their own (needs root)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub private_tmp: Option<bool>,
    /// Serve Prometheus metrics on this address (at /metrics) [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Recurring jobs declared in the file (`[[schedule]]` tables).
    #[arg(skip)]
    pub schedule: Option<Vec<ScheduleEntry>>,
    /// Settings for job names matching a GLOB (`[[job]]` tables); the first
    /// matching table applies.
    #[arg(skip)]
    pub job: Option<Vec<JobRule>>,
}

/// Settings for the jobs whose names match `name` (a GLOB, or an exact
/// name). Unset keys keep the supervisor-wide value.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct JobRule {
    /// Which job names: a GLOB such as "batch/*".
    pub name: String,
    /// How long one of these jobs may run.
    pub timeout: Option<HumanDuration>,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Option<HumanDuration>,
    /// Runs before a failing job is FAILED.
    pub max_attempts: Option<i64>,
    /// First retry delay.
    pub backoff: Option<HumanDuration>,
    /// Longest retry delay.
    pub max_backoff: Option<HumanDuration>,
    /// Extra environment, added to the supervisor-wide one.
    #[serde(default, deserialize_with = "env_table")]
    pub env: Option<Vec<EnvPair>>,
    /// The most of these jobs running at once on this supervisor.
    pub max_concurrency: Option<usize>,
    /// The user they run as.
    pub user: Option<String>,
    /// The group they run as.
    pub group: Option<String>,
    /// Their umask, octal.
    pub umask: Option<String>,
    /// rlimit: address space.
    pub limit_as: Option<ByteSize>,
    /// rlimit: CPU time.
    pub limit_cpu: Option<HumanDuration>,
    /// rlimit: open files.
    pub limit_nofile: Option<u64>,
    /// rlimit: processes of the user.
    pub limit_nproc: Option<u64>,
    /// rlimit: file size.
    pub limit_fsize: Option<ByteSize>,
    /// rlimit: core size.
    pub limit_core: Option<ByteSize>,
    /// cgroup: memory of the job's tree.
    pub memory_max: Option<ByteSize>,
    /// cgroup: processes of the job's tree.
    pub pids_max: Option<u64>,
    /// cgroup: CPUs' worth of time.
    pub cpu_max: Option<f64>,
    /// No network.
    pub no_network: Option<bool>,
    /// Read-only filesystem but the scratch directory.
    pub read_only_fs: Option<bool>,
    /// A /tmp of their own.
    pub private_tmp: Option<bool>,
}

impl JobRule {
    /// The supervisor-wide options with this rule's on top.
    pub fn over(&self, base: &SupervisorOptions) -> SupervisorOptions {
        let mut merged = base.clone();
        macro_rules! take {
            ($($field:ident),*) => { $( if self.$field.is_some() { merged.$field = self.$field.clone(); } )* };
        }
        take!(
            timeout,
            kill_grace,
            max_attempts,
            backoff,
            max_backoff,
            user,
            group,
            umask,
            limit_as,
            limit_cpu,
            limit_nofile,
            limit_nproc,
            limit_fsize,
            limit_core,
            memory_max,
            pids_max,
            cpu_max,
            no_network,
            read_only_fs,
            private_tmp
        );
        if let Some(extra) = &self.env {
            let mut env = base.env.clone().unwrap_or_default();
            env.extend(extra.iter().cloned());
            merged.env = Some(env);
        }
        merged
    }
}

/// A recurring job declared in a configuration file. On start and on
/// reload it is created as a unique job; when its entry changes the job is
/// updated, and when the entry goes the job is deleted.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ScheduleEntry {
    /// The job's name (its worker is named after the last `/` part).
    pub name: String,
    /// How it repeats, e.g. "FINISHED, +1 HOUR" or DAILY.
    pub repeat: String,
    /// Its data when first created, a table.
    #[serde(default)]
    pub data: serde_json::Map<String, serde_json::Value>,
    /// Its priority: 0, 250, 500, 750, 850 or 1000.
    pub priority: Option<i64>,
}

impl SupervisorOptions {
    /// These options, with `file`'s filling the ones not set here.
    pub fn over(self, file: SupervisorOptions) -> SupervisorOptions {
        macro_rules! pick {
            ($($field:ident),*) => {
                SupervisorOptions { $($field: self.$field.or(file.$field)),* }
            };
        }
        pick!(
            job_name,
            worker_path,
            max_load,
            load_per_cpu,
            min_memory,
            max_workers,
            ramp,
            timeout,
            kill_grace,
            drain_timeout,
            lease,
            poll_wait,
            max_attempts,
            backoff,
            max_backoff,
            output_cap,
            env_allow,
            env,
            max_iterations,
            version_watch_file,
            server,
            spool_dir,
            scratch_dir,
            loadavg_path,
            meminfo_path,
            db,
            http,
            bedrock,
            metrics,
            user,
            group,
            umask,
            limit_as,
            limit_cpu,
            limit_nofile,
            limit_nproc,
            limit_fsize,
            limit_core,
            memory_max,
            pids_max,
            cpu_max,
            no_network,
            read_only_fs,
            private_tmp,
            schedule,
            job
        )
    }
}

/// Why a configuration file was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid: unknown key, bad value, bad TOML.
    #[error("configuration file {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// TOML's description, with line, column and key.
        message: String,
    },
    /// A setting has a value that cannot work.
    #[error("{0}")]
    Setting(String),
}

/// Reads a supervisor configuration file.
pub fn load_file(path: &Path) -> Result<SupervisorOptions, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &text)
}

/// Parses the text of a supervisor configuration file.
pub fn parse_file(path: &Path, text: &str) -> Result<SupervisorOptions, ConfigError> {
    toml::from_str(text).map_err(|error| ConfigError::Invalid {
        path: path.to_path_buf(),
        message: error.to_string().trim_end().replace('\n', "\n  "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_every_kind_of_value() {
        let text = r#"
job-name = "www-prod/*"
worker-path = "/code"
max-load = 5.0
load-per-cpu = true
min-memory = "256MiB"
timeout = "10m"
env-allow = ["PATH", "HOME"]
env = { APP_ENV = "prod" }
"#;
        let options = parse_file(Path::new("x.toml"), text).unwrap();
        assert_eq!(options.job_name.as_deref(), Some("www-prod/*"));
        assert_eq!(options.min_memory, Some(ByteSize(256 << 20)));
        assert_eq!(options.timeout.unwrap().0.as_secs(), 600);
        assert_eq!(
            options.env,
            Some(vec![EnvPair("APP_ENV".into(), "prod".into())])
        );
        assert_eq!(options.load_per_cpu, Some(true));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_file_line_and_key() {
        let error = parse_file(
            Path::new("/etc/jobmgr/x.toml"),
            "job-name = \"*\"\nmax-lod = 3\n",
        )
        .unwrap_err();
        let message = error.to_string();
        assert!(message.contains("/etc/jobmgr/x.toml"), "{message}");
        assert!(message.contains("line 2"), "{message}");
        assert!(message.contains("max-lod"), "{message}");
        let message = parse_file(Path::new("y.toml"), "timeout = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("line 1") && message.contains("soon"),
            "{message}"
        );
        let message = parse_file(Path::new("y.toml"), "env = { \"1X\" = \"a\" }\n")
            .unwrap_err()
            .to_string();
        assert!(message.contains("1X"), "{message}");
    }

    #[test]
    fn flags_win_over_the_file() {
        let flags = SupervisorOptions {
            max_load: Some(2.0),
            ..Default::default()
        };
        let file = SupervisorOptions {
            max_load: Some(9.0),
            job_name: Some("a".into()),
            ..Default::default()
        };
        let merged = flags.over(file);
        assert_eq!(merged.max_load, Some(2.0));
        assert_eq!(merged.job_name.as_deref(), Some("a"));
    }
}
