//! Supervisor configuration: the same options as command-line flags and as
//! keys of a TOML file (`--config PATH`), flags winning over the file, and
//! the file re-read on SIGHUP. Unknown keys and bad values are refused with
//! the file, line and key.

mod values;

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use values::{
    ByteSize, EnvPair, HumanDuration, Threshold, WorkerKind, check_env_name, env_table,
};

/// The supervisor's options. Every field is optional: unset means "from the
/// file, else the default".
#[derive(Debug, Clone, Default, Args, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SupervisorOptions {
    /// Job names to take: a GLOB such as '*' or 'www-prod/*' [default: *]
    #[arg(help_heading = "Workers")]
    #[arg(long, alias = "jobName", value_name = "GLOB", env = "JOBMGR_JOB_NAME")]
    pub job_name: Option<String>,
    /// Directory holding one executable per job name.
    #[arg(help_heading = "Workers")]
    #[arg(
        long,
        alias = "workerPath",
        value_name = "DIR",
        env = "JOBMGR_WORKER_PATH"
    )]
    pub worker_path: Option<PathBuf>,
    /// What a worker is: "exec", an executable named after the job, or "bwm-php", a BedrockWorkerManager PHP class in NAME.php run by jobmgr's PHP runner [default: exec]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "KIND", env = "JOBMGR_WORKER_KIND")]
    pub worker_kind: Option<WorkerKind>,
    /// bwm-php: a PHP file the runner loads before the worker class (the site's autoloader and configuration) [default: none]
    #[arg(help_heading = "PHP workers")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_PHP_BOOTSTRAP")]
    pub php_bootstrap: Option<PathBuf>,
    /// bwm-php: the PHP command-line interpreter [default: php on the supervisor's PATH]
    #[arg(help_heading = "PHP workers")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_PHP")]
    pub php: Option<PathBuf>,
    /// bwm-php: the runner script [default: jobmgr's own, written into the scratch directory at start; `jobmgr bwm-php-runner` prints it]
    #[arg(help_heading = "PHP workers")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_PHP_RUNNER")]
    pub php_runner: Option<PathBuf>,
    /// bwm-php: the job server's Bedrock port that workers' $bedrock client uses, HOST:PORT [default: the embedded server's Bedrock port, or the --server bedrock:// address]
    #[arg(help_heading = "PHP workers")]
    #[arg(long, value_name = "HOST:PORT", env = "JOBMGR_PHP_BEDROCK")]
    pub php_bedrock: Option<String>,
    /// Start no job while the 1-minute load average is at or above this [default: the CPU count]
    #[arg(help_heading = "Gate")]
    #[arg(long, alias = "maxLoad", value_name = "LOAD", env = "JOBMGR_MAX_LOAD")]
    pub max_load: Option<f64>,
    /// Multiply --max-load by the number of CPUs.
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_LOAD_PER_CPU")]
    pub load_per_cpu: Option<bool>,
    /// Start no job while available memory is below this [default: 128MiB]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_MIN_MEMORY")]
    pub min_memory: Option<ByteSize>,
    /// The most workers at once [default: twice the CPU count]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "N", env = "JOBMGR_MAX_WORKERS")]
    pub max_workers: Option<usize>,
    /// Concurrency may grow by this many workers per second [default: the CPU count]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "N", env = "JOBMGR_RAMP")]
    pub ramp: Option<usize>,
    /// While every worker slot is taken, hold up to N more jobs, fetched ahead, so that a freed slot starts its next job without a round trip to the server; at most 1000, a few times --max-workers for short jobs [default: 0, off]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "N", env = "JOBMGR_FETCH_AHEAD")]
    pub fetch_ahead: Option<usize>,
    /// A job held ahead that gets no slot within this time goes back to the queue as it was (10ms to 10m) [default: 1s]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_FETCH_AHEAD_HOLD")]
    pub fetch_ahead_hold: Option<HumanDuration>,
    /// A worker running longer is stopped (SIGTERM, grace, SIGKILL) [default: 30m]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_TIMEOUT")]
    pub timeout: Option<HumanDuration>,
    /// Time between SIGTERM and SIGKILL [default: 10s]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_KILL_GRACE")]
    pub kill_grace: Option<HumanDuration>,
    /// On SIGTERM, how long running jobs may take to finish before they are stopped and handed back [default: 2m]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<HumanDuration>,
    /// Lease asked for each job, renewed every third of it while the worker runs [default: 30s]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_LEASE")]
    pub lease: Option<HumanDuration>,
    /// How long one fetch waits for a job before asking again [default: 30s]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_POLL_WAIT")]
    pub poll_wait: Option<HumanDuration>,
    /// Runs in all before a failing job is FAILED [default: 5]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "N", env = "JOBMGR_MAX_ATTEMPTS")]
    pub max_attempts: Option<i64>,
    /// Delay before the first retry of a failed job; doubles each time, with jitter [default: 10s]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_BACKOFF")]
    pub backoff: Option<HumanDuration>,
    /// The longest retry delay [default: 1h]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_MAX_BACKOFF")]
    pub max_backoff: Option<HumanDuration>,
    /// A job whose worker is missing here is handed back for another supervisor; it is failed (no_worker) when none has run it this long after the first hand-back; 0 fails it at once [default: 1h]
    #[arg(
        long,
        value_name = "DURATION",
        env = "JOBMGR_NO_WORKER_TIMEOUT",
        help_heading = "Workers"
    )]
    pub no_worker_timeout: Option<HumanDuration>,
    /// Bytes of each of stdout and stderr kept per job, half from the start and half from the end [default: 64KiB]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_OUTPUT_CAP")]
    pub output_cap: Option<ByteSize>,
    /// Environment variables passed through to workers (repeatable) [default: PATH LANG LC_ALL TZ]
    #[arg(help_heading = "Workers")]
    #[arg(
        long = "env-allow",
        value_name = "NAME",
        env = "JOBMGR_ENV_ALLOW",
        value_delimiter = ','
    )]
    pub env_allow: Option<Vec<String>>,
    /// Extra environment for workers, NAME=VALUE (repeatable)
    #[arg(help_heading = "Workers")]
    #[arg(long = "env", value_name = "NAME=VALUE")]
    #[serde(
        default,
        deserialize_with = "env_table",
        serialize_with = "values::env_table_out",
        skip_serializing_if = "Option::is_none"
    )]
    pub env: Option<Vec<EnvPair>>,
    /// Start this many jobs, then drain and exit (for a service manager to restart)
    #[arg(help_heading = "Workers")]
    #[arg(
        long,
        alias = "maxIterations",
        value_name = "N",
        env = "JOBMGR_MAX_ITERATIONS"
    )]
    pub max_iterations: Option<u64>,
    /// When this file changes (a deploy), drain and exit for the service manager to restart
    #[arg(help_heading = "Workers")]
    #[arg(
        long,
        alias = "versionWatchFile",
        value_name = "PATH",
        env = "JOBMGR_VERSION_WATCH_FILE"
    )]
    pub version_watch_file: Option<PathBuf>,
    /// The job server: http://HOST:PORT or bedrock://HOST:PORT, or several http(s) URLs of servers sharing a store, comma-separated (the next is used when one does not answer) [default: an embedded server]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "URL[,URL…]", env = "JOBMGR_SERVER")]
    #[serde(default, deserialize_with = "values::server_list")]
    pub server: Option<String>,
    /// Where reports wait while the server is unreachable [default: spool/ beside the embedded store]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "DIR", env = "JOBMGR_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Where the supervisor says what it is running, for `jobmgr status` [default: status.json beside the spool directory]
    #[arg(help_heading = "Logs")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_STATUS_FILE")]
    pub status_file: Option<PathBuf>,
    /// Where each job's scratch directory is made [default: scratch/ beside the embedded store]
    #[arg(help_heading = "Workers")]
    #[arg(long, value_name = "DIR", env = "JOBMGR_SCRATCH_DIR")]
    pub scratch_dir: Option<PathBuf>,
    /// A file in /proc/loadavg format to read the load from [default: /proc/loadavg]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_LOADAVG_PATH")]
    pub loadavg_path: Option<PathBuf>,
    /// A file in /proc/meminfo format to read available memory from [default: /proc/meminfo]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_MEMINFO_PATH")]
    pub meminfo_path: Option<PathBuf>,
    /// Start no job while CPU pressure (PSI "some avg10", percent) is at or above this; off where the kernel has no /proc/pressure/cpu [default: off]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "PCT", env = "JOBMGR_MAX_CPU_PRESSURE")]
    pub max_cpu_pressure: Option<f64>,
    /// A file in /proc/pressure/cpu format to read CPU pressure from [default: /proc/pressure/cpu]
    #[arg(help_heading = "Gate")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_CPU_PRESSURE_PATH")]
    pub cpu_pressure_path: Option<PathBuf>,
    /// The site's cgroups, v2 paths as in /proc/PID/cgroup (e.g. /system.slice/php8.2-fpm.service), comma-separated: the back-off follows the highest "some avg10" of their cpu, memory and io pressure [default: none: the system-wide "full avg10" of memory and I/O]
    #[arg(help_heading = "Yielding")]
    #[arg(
        long,
        value_name = "PATH[,PATH…]",
        env = "JOBMGR_SITE_CGROUP",
        value_delimiter = ','
    )]
    #[serde(default, deserialize_with = "values::string_list")]
    pub site_cgroup: Option<Vec<String>>,
    /// Take no new job while the pressure the back-off follows is at or above this percentage, or off [default: 10]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "PCT|off", env = "JOBMGR_PAUSE_PRESSURE")]
    pub pause_pressure: Option<Threshold>,
    /// Freeze every running job while the pressure is at or above this percentage, or off; frozen jobs keep their leases and thaw below pause-pressure (below half this when pause-pressure is off) [default: 25]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "PCT|off", env = "JOBMGR_FREEZE_PRESSURE")]
    pub freeze_pressure: Option<Threshold>,
    /// A job frozen this long in one stretch is thawed anyway (with a warning) and not frozen again for as long [default: 5m]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_MAX_FREEZE")]
    pub max_freeze: Option<HumanDuration>,
    /// For tests and containers: read pressure under DIR instead of the kernel's, DIR/memory and DIR/io in place of /proc/pressure/*, and DIR/SITE-CGROUP/*.pressure in place of the cgroup v2 mount's [default: /proc/pressure and the v2 mount]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "DIR", env = "JOBMGR_PRESSURE_DIR")]
    pub pressure_dir: Option<PathBuf>,
    /// The file holding the API token: the embedded server makes it at first start (mode 0600); with --server, read from it [default: token beside --db]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Embedded server: let Bedrock-port clients on loopback skip the token (old Bedrock clients); any local user, workers included, can then read and change every job
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_BEDROCK_TRUST_LOOPBACK")]
    pub bedrock_trust_loopback: Option<bool>,
    /// Embedded server: its SQLite file [default: as for `jobmgr server`]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "PATH", env = "JOBMGR_DB")]
    pub db: Option<PathBuf>,
    /// Embedded server: where its HTTP API listens [default: 127.0.0.1:8889]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "ADDR", env = "JOBMGR_HTTP")]
    pub http: Option<String>,
    /// Embedded server: where its Bedrock port listens, or "none" [default: 127.0.0.1:8888]
    #[arg(help_heading = "Server")]
    #[arg(long, value_name = "ADDR", env = "JOBMGR_BEDROCK")]
    pub bedrock: Option<String>,
    /// Embedded server: further names its HTTP API answers to in the Host header, besides its address and localhost ("*" for any) [default: none]
    #[arg(help_heading = "Server")]
    #[arg(
        long = "allowed-host",
        value_name = "NAME",
        env = "JOBMGR_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Option<Vec<String>>,
    /// Embedded server: web origins (https://ops.example.com) whose pages may call its HTTP API ("*" for any) [default: none]
    #[arg(help_heading = "Server")]
    #[arg(
        long = "allowed-origin",
        value_name = "ORIGIN",
        env = "JOBMGR_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Option<Vec<String>>,
    /// When running as root: the one user every worker runs as [default: a uid of each job's own, from --worker-uids]; "root" must be said explicitly; "self" means the supervisor's own user; "dynamic" the default
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "USER", env = "JOBMGR_USER")]
    pub user: Option<String>,
    /// When running as root without --user: the uids jobs run under, one of its own per running job, shared by every supervisor on the host [default: 60706-61183]
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "FIRST-LAST", env = "JOBMGR_WORKER_UIDS")]
    pub worker_uids: Option<String>,
    /// The group workers run as [default: the user's]
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "GROUP", env = "JOBMGR_GROUP")]
    pub group: Option<String>,
    /// The umask workers start with, octal [default: 027]
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "MASK", env = "JOBMGR_UMASK")]
    pub umask: Option<String>,
    /// rlimit: address space per worker process
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_LIMIT_AS")]
    pub limit_as: Option<ByteSize>,
    /// rlimit: CPU time per worker process
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "DURATION", env = "JOBMGR_LIMIT_CPU")]
    pub limit_cpu: Option<HumanDuration>,
    /// rlimit: open files per worker process
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "N", env = "JOBMGR_LIMIT_NOFILE")]
    pub limit_nofile: Option<u64>,
    /// rlimit: processes of the worker's user
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "N", env = "JOBMGR_LIMIT_NPROC")]
    pub limit_nproc: Option<u64>,
    /// rlimit: largest file a worker may write
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_LIMIT_FSIZE")]
    pub limit_fsize: Option<ByteSize>,
    /// rlimit: core dump size [default: 0, no core dumps]
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_LIMIT_CORE")]
    pub limit_core: Option<ByteSize>,
    /// cgroup: memory of a job's whole process tree (needs cgroups)
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "SIZE", env = "JOBMGR_MEMORY_MAX")]
    pub memory_max: Option<ByteSize>,
    /// cgroup: processes of a job's whole tree [default: 4096 where cgroups exist]
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "N", env = "JOBMGR_PIDS_MAX")]
    pub pids_max: Option<u64>,
    /// cgroup: CPUs' worth of time for a job's whole tree, e.g. 0.5 or 2 (needs cgroups)
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "CPUS", env = "JOBMGR_CPU_MAX")]
    pub cpu_max: Option<f64>,
    /// Give workers no network (needs root)
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_NO_NETWORK")]
    pub no_network: Option<bool>,
    /// Make the filesystem read-only for workers except their scratch directory (Landlock)
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_READ_ONLY_FS")]
    pub read_only_fs: Option<bool>,
    /// Give workers a /tmp of their own (needs root)
    #[arg(help_heading = "Sandbox")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_PRIVATE_TMP")]
    pub private_tmp: Option<bool>,
    /// Jobs yield the CPU to the site: their cgroup is of idle priority (cpu.idle, else the least weight) and workers run under SCHED_IDLE (or --job-nice) [default: true]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_YIELD_CPU")]
    pub yield_cpu: Option<bool>,
    /// Workers run at this nice level (1-19) in place of SCHED_IDLE, which yields more [default: SCHED_IDLE]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "N", env = "JOBMGR_JOB_NICE")]
    pub job_nice: Option<i32>,
    /// Jobs yield the disks to the site: workers get the idle I/O class, their cgroup the least io.weight where the host has it [default: true]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", env = "JOBMGR_YIELD_IO")]
    pub yield_io: Option<bool>,
    /// Memory all jobs together may use before the kernel throttles and reclaims them (memory.high of their cgroup): a share of the machine (50%), a size (8G), or off [default: 50%; off when the service manager set MemoryHigh= on the supervisor's unit]
    #[arg(help_heading = "Yielding")]
    #[arg(long, value_name = "PCT%|SIZE|off", env = "JOBMGR_JOBS_MEMORY_HIGH")]
    pub jobs_memory_high: Option<String>,
    /// Serve Prometheus metrics on this address (at /metrics) [default: off]
    #[arg(help_heading = "Logs")]
    #[arg(long, value_name = "ADDR", env = "JOBMGR_METRICS")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Recurring jobs declared in the file (`[[schedule]]` tables).
    #[arg(skip)]
    pub schedule: Option<Vec<ScheduleEntry>>,
    /// Settings for job names matching a GLOB (`[[job]]` tables); the first
    /// matching table applies.
    #[arg(skip)]
    pub job: Option<Vec<JobRule>>,
    /// Several pools in one process (`[[pool]]` tables), each with its own
    /// job names, worker path, load limit and concurrency.
    #[arg(skip)]
    pub pool: Option<Vec<PoolOptions>>,
}

/// One pool of a supervisor that runs several: its own job-name GLOB,
/// worker path, load limit and concurrency. Everything else is shared
/// (the supervisor-wide settings and `[[job]]` tables).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PoolOptions {
    /// The pool's name, for logs and metrics.
    pub name: String,
    /// Job names this pool takes.
    pub job_name: String,
    /// Where its workers are.
    pub worker_path: Option<PathBuf>,
    /// What its workers are.
    pub worker_kind: Option<WorkerKind>,
    /// Its PHP workers' bootstrap file.
    pub php_bootstrap: Option<PathBuf>,
    /// Its load limit.
    pub max_load: Option<f64>,
    /// Scale its load limit by the CPU count.
    pub load_per_cpu: Option<bool>,
    /// Its memory floor.
    pub min_memory: Option<ByteSize>,
    /// Its concurrency cap.
    pub max_workers: Option<usize>,
    /// Its ramp.
    pub ramp: Option<usize>,
    /// How many jobs it holds ahead.
    pub fetch_ahead: Option<usize>,
    /// How long it holds one.
    pub fetch_ahead_hold: Option<HumanDuration>,
}

impl PoolOptions {
    /// The supervisor-wide options with this pool's on top (its own spool
    /// directory beneath the shared one).
    pub fn over(&self, base: &SupervisorOptions) -> SupervisorOptions {
        let mut merged = base.clone();
        merged.job_name = Some(self.job_name.clone());
        macro_rules! take {
            ($($field:ident),*) => { $( if self.$field.is_some() { merged.$field = self.$field.clone(); } )* };
        }
        take!(
            worker_path,
            worker_kind,
            php_bootstrap,
            max_load,
            load_per_cpu,
            min_memory,
            max_workers,
            ramp,
            fetch_ahead,
            fetch_ahead_hold
        );
        merged.pool = None;
        merged
    }
}

/// Settings for the jobs whose names match `name` (a GLOB, or an exact
/// name). Unset keys keep the supervisor-wide value.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
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
    #[serde(
        default,
        deserialize_with = "env_table",
        serialize_with = "values::env_table_out",
        skip_serializing_if = "Option::is_none"
    )]
    pub env: Option<Vec<EnvPair>>,
    /// The most of these jobs running at once on this supervisor.
    pub max_concurrency: Option<usize>,
    /// What their workers are.
    pub worker_kind: Option<WorkerKind>,
    /// Their PHP workers' bootstrap file.
    pub php_bootstrap: Option<PathBuf>,
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
            worker_kind,
            php_bootstrap,
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
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
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
            worker_kind,
            php_bootstrap,
            php,
            php_runner,
            php_bedrock,
            max_load,
            load_per_cpu,
            min_memory,
            max_workers,
            ramp,
            fetch_ahead,
            fetch_ahead_hold,
            timeout,
            kill_grace,
            drain_timeout,
            lease,
            poll_wait,
            max_attempts,
            backoff,
            max_backoff,
            no_worker_timeout,
            output_cap,
            env_allow,
            env,
            max_iterations,
            version_watch_file,
            server,
            spool_dir,
            status_file,
            scratch_dir,
            loadavg_path,
            meminfo_path,
            max_cpu_pressure,
            cpu_pressure_path,
            site_cgroup,
            pause_pressure,
            freeze_pressure,
            max_freeze,
            pressure_dir,
            token_file,
            bedrock_trust_loopback,
            db,
            http,
            bedrock,
            allowed_hosts,
            allowed_origins,
            metrics,
            user,
            worker_uids,
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
            yield_cpu,
            job_nice,
            yield_io,
            jobs_memory_high,
            schedule,
            job,
            pool
        )
    }
}

/// The main configuration file when `--config` names none.
pub const DEFAULT_CONFIG: &str = "/etc/jobmgr/jobmgr.toml";

/// One configuration file's options.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The file.
    pub path: PathBuf,
    /// What it sets.
    pub options: SupervisorOptions,
}

/// The directory of pool files (`/etc/jobmgr/pools/NAME.toml`, one per
/// `jobmgr@NAME` instance): a main file in a directory of this name is a
/// pool file, read after the site's drop-ins in `../conf.d`.
pub const POOLS_DIR: &str = "pools";

/// Reads the configuration files in order: the main file (`config`, else
/// [`DEFAULT_CONFIG`] if it exists), then `conf.d/*.toml` beside it in name
/// order. A pool file (a main file in a [`POOLS_DIR`] directory, such as
/// `/etc/jobmgr/pools/NAME.toml`) comes after the site's drop-ins in the
/// directory above (`/etc/jobmgr/conf.d/*.toml`), so that site-wide
/// settings reach every pool and a pool's own settings win over them. A
/// missing `config` given explicitly is an error.
pub fn load_layers(config: Option<&Path>) -> Result<Vec<Layer>, ConfigError> {
    let main = config.unwrap_or(Path::new(DEFAULT_CONFIG));
    let dir = main.parent().unwrap_or(Path::new("."));
    let mut layers = Vec::new();
    let site = dir
        .parent()
        .filter(|_| dir.file_name().is_some_and(|name| name == POOLS_DIR));
    if let Some(site) = site {
        layers.extend(drop_ins(&site.join("conf.d"))?);
    }
    if config.is_some() || main.exists() {
        layers.push(Layer {
            path: main.to_path_buf(),
            options: load_file(main)?,
        });
    }
    layers.extend(drop_ins(&dir.join("conf.d"))?);
    Ok(layers)
}

/// The drop-in files `*.toml` of `dir` in name order, read; none if `dir`
/// is not a directory.
fn drop_ins(dir: &Path) -> Result<Vec<Layer>, ConfigError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| ConfigError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let options = load_file(&path)?;
            Ok(Layer { path, options })
        })
        .collect()
}

/// The files' options merged: a later file's value wins; `[[schedule]]` and
/// `[[job]]` tables add up.
pub fn merge_layers(layers: &[Layer]) -> SupervisorOptions {
    layers
        .iter()
        .fold(SupervisorOptions::default(), |earlier, layer| {
            let mut merged = layer.options.clone().over(earlier.clone());
            merged.schedule = concat(&earlier.schedule, &layer.options.schedule);
            merged.job = concat(&earlier.job, &layer.options.job);
            merged.pool = concat(&earlier.pool, &layer.options.pool);
            merged
        })
}

fn concat<T: Clone>(a: &Option<Vec<T>>, b: &Option<Vec<T>>) -> Option<Vec<T>> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.iter().chain(b.iter()).flatten().cloned().collect()),
    }
}

/// The keys an options value sets, as TOML values.
pub fn set_keys(options: &SupervisorOptions) -> toml::Table {
    toml::Table::try_from(options).unwrap_or_default()
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

/// The status file of a supervisor with these options: `status-file`, else
/// `status.json` beside the spool directory (whose default is `spool/` in
/// `state_dir`).
pub fn status_file(options: &SupervisorOptions, state_dir: &Path) -> PathBuf {
    if let Some(path) = &options.status_file {
        return path.clone();
    }
    match &options.spool_dir {
        Some(spool) => spool.parent().unwrap_or(Path::new(".")).join("status.json"),
        None => state_dir.join("status.json"),
    }
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
