//! The supervisor's effective settings: options resolved against their
//! defaults and checked.

use std::path::PathBuf;
use std::time::Duration;

use super::backoff::BackoffSettings;
use super::backoff::policy::Thresholds;
use super::bwm_php::{self, PhpSettings};
use super::cgroup::CgroupLimits;
use super::gate::{GateLimits, ProcLoad};
use super::report::RetryPolicy;
use super::sandbox::{Rlimits, SandboxSettings, parse_umask};
use super::uids::UidRange;
use super::yielding::{MemoryHigh, YieldSettings};
use crate::config::{ConfigError, SupervisorOptions, WorkerKind};
use crate::protocol::{CreateJob, NamePattern, Priority, Repeat, check_data, check_name};

/// Environment variables workers get from the supervisor's own environment
/// unless configured otherwise.
pub const DEFAULT_ENV_ALLOW: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

/// Everything the supervisor needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Job names taken: a GLOB or comma list.
    pub job_name: String,
    /// Where workers are found.
    pub worker_path: PathBuf,
    /// The gate's limits.
    pub gate: GateLimits,
    /// How long a drain waits for running jobs.
    pub drain_timeout: Duration,
    /// The lease asked for each job.
    pub lease: Duration,
    /// How long one fetch waits.
    pub poll_wait: Duration,
    /// Bytes kept per output stream.
    pub output_cap: usize,
    /// Variables passed through from the supervisor's environment.
    pub env_allow: Vec<String>,
    /// Jobs to start before draining and exiting.
    pub max_iterations: Option<u64>,
    /// A file whose change means "drain and exit".
    pub version_watch_file: Option<PathBuf>,
    /// Where undeliverable reports wait.
    pub spool_dir: PathBuf,
    /// Where scratch directories are made.
    pub scratch_dir: PathBuf,
    /// Where the load and memory are read.
    pub load: ProcLoad,
    /// How jobs back off when the site is pressed.
    pub backoff: BackoffSettings,
    /// Settings of jobs no `[[job]]` table matches.
    pub job: JobSettings,
    /// `[[job]]` tables, in file order: the first whose pattern matches a
    /// job's name applies to it.
    pub rules: Vec<(NamePattern, JobSettings)>,
    /// Recurring jobs declared in the configuration; `None` when it
    /// declares none at all (then jobs declared earlier are left alone).
    pub schedule: Option<Vec<CreateJob>>,
    /// Where the supervisor keeps its own state (the declared-jobs record).
    pub state_dir: PathBuf,
    /// The pool's name, when the process runs several.
    pub pool: Option<String>,
    /// How PHP workers run, when any job's worker kind is `bwm-php`.
    pub php: Option<PhpSettings>,
    /// How jobs yield to the site.
    pub yielding: YieldSettings,
}

/// The settings that may differ by job name.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSettings {
    /// How long a worker may run.
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How failures are retried.
    pub retry: RetryPolicy,
    /// Extra variables set for workers.
    pub env: Vec<(String, String)>,
    /// What workers may do.
    pub sandbox: SandboxSettings,
    /// The most of these jobs at once (for a `[[job]]` table).
    pub max_concurrency: Option<usize>,
    /// What their workers are.
    pub kind: WorkerKind,
    /// For PHP workers: the site's bootstrap file, absolute.
    pub php_bootstrap: Option<PathBuf>,
}

fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl Settings {
    /// Resolves options against the defaults. `state_dir` is where the
    /// spool goes unless configured.
    pub fn resolve(
        options: &SupervisorOptions,
        state_dir: &std::path::Path,
    ) -> Result<Self, ConfigError> {
        let setting = |message: String| ConfigError::Setting(message);
        let worker_path = options.worker_path.clone().ok_or_else(|| {
            setting("no worker path: pass --worker-path DIR (or set worker-path in the configuration file)".into())
        })?;
        let cpus = cpus();
        let mut max_load = options.max_load.unwrap_or(cpus as f64);
        if !(max_load.is_finite() && max_load > 0.0) {
            return Err(setting(format!(
                "max-load must be a positive number, not {max_load}"
            )));
        }
        if options.load_per_cpu.unwrap_or(false) {
            max_load *= cpus as f64;
        }
        let max_workers = options.max_workers.unwrap_or((2 * cpus).max(2));
        let max_cpu_pressure = match options.max_cpu_pressure {
            Some(pct) if !(pct.is_finite() && pct > 0.0 && pct <= 100.0) => {
                return Err(setting(format!(
                    "max-cpu-pressure must be a percentage above 0 and at most 100, not {pct}"
                )));
            }
            other => other,
        };
        if max_workers == 0 {
            return Err(setting("max-workers must be at least 1".into()));
        }
        let fetch_ahead = options.fetch_ahead.unwrap_or(0);
        if fetch_ahead > crate::protocol::MAX_NUM_RESULTS {
            return Err(setting(format!(
                "fetch-ahead must be at most {} (the most jobs one fetch brings), not {fetch_ahead}; a few times max-workers is plenty for short jobs",
                crate::protocol::MAX_NUM_RESULTS
            )));
        }
        let fetch_ahead_hold = options
            .fetch_ahead_hold
            .map_or(Duration::from_secs(1), |d| d.0);
        if !(Duration::from_millis(10)..=Duration::from_secs(600)).contains(&fetch_ahead_hold) {
            return Err(setting(format!(
                "fetch-ahead-hold must be between 10ms and 10m, not {}: a held job that gets no slot by then goes back to the queue",
                crate::config::HumanDuration(fetch_ahead_hold)
            )));
        }
        let duration = |value: Option<crate::config::HumanDuration>, default: Duration| {
            value.map_or(default, |d| d.0)
        };
        let lease = duration(options.lease, Duration::from_secs(30));
        if !(Duration::from_millis(300)..=Duration::from_secs(86_400)).contains(&lease) {
            return Err(setting(
                "lease must be between 300ms (it is renewed every third of it) and 24h".into(),
            ));
        }
        let poll_wait = duration(options.poll_wait, Duration::from_secs(30));
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&poll_wait) {
            return Err(setting(
                "poll-wait must be between 1s and 1h: each fetch waits this long for a job".into(),
            ));
        }
        let mut env_allow: Vec<String> = match &options.env_allow {
            Some(names) => names.clone(),
            None => DEFAULT_ENV_ALLOW.iter().map(|s| s.to_string()).collect(),
        };
        for name in &env_allow {
            crate::config::check_env_name(name).map_err(setting)?;
        }
        env_allow.retain(|name| !name.starts_with("JOBMGR_"));
        let mut schedule: Vec<CreateJob> = Vec::new();
        for entry in options.schedule.iter().flatten() {
            let what = |e: crate::protocol::JobError| {
                setting(format!("[[schedule]] {:?}: {e}", entry.name))
            };
            check_name(&entry.name).map_err(what)?;
            if schedule.iter().any(|j| j.name == entry.name) {
                return Err(setting(format!(
                    "[[schedule]] {:?} is declared twice",
                    entry.name
                )));
            }
            let mut job = CreateJob::named(entry.name.clone());
            job.data = check_data(serde_json::Value::Object(entry.data.clone())).map_err(what)?;
            job.repeat = Some(Repeat::parse(&entry.repeat).map_err(what)?);
            job.priority = entry
                .priority
                .map(Priority::new)
                .transpose()
                .map_err(what)?;
            job.unique = true;
            schedule.push(job);
        }
        let mut rules = Vec::new();
        for rule in options.job.iter().flatten() {
            let pattern = NamePattern::parse(&rule.name)
                .map_err(|e| setting(format!("[[job]] {:?}: {e}", rule.name)))?;
            rules.push((pattern, job_settings(&rule.over(options), Some(rule))?));
        }
        let job = job_settings(options, None)?;
        let php = std::iter::once(&job)
            .chain(rules.iter().map(|(_, rule)| rule))
            .any(|job| job.kind == WorkerKind::BwmPhp)
            .then(|| {
                PhpSettings::resolve(
                    options.php.as_deref(),
                    options.php_runner.as_deref(),
                    options.php_bedrock.as_deref(),
                )
                .map_err(setting)
            })
            .transpose()?;
        let backoff = backoff_settings(options)?;
        let job_name = options.job_name.clone().unwrap_or_else(|| "*".into());
        NamePattern::parse(&job_name)
            .map_err(|e| setting(format!("job-name {job_name:?}: {e}")))?;
        Ok(Settings {
            job_name,
            worker_path,
            gate: GateLimits {
                max_load,
                min_available_memory: options.min_memory.map_or(128 << 20, |s| s.0),
                max_cpu_pressure,
                pause_pressure: backoff.signal.as_ref().ok().and(backoff.thresholds.pause),
                max_workers,
                ramp: options.ramp.unwrap_or(cpus).max(1),
                fetch_ahead,
                fetch_ahead_hold,
            },
            drain_timeout: duration(options.drain_timeout, Duration::from_secs(120)),
            lease,
            poll_wait,
            output_cap: options.output_cap.map_or(64 << 10, |s| s.0 as usize).max(2),
            env_allow,
            max_iterations: options.max_iterations,
            version_watch_file: options.version_watch_file.clone(),
            spool_dir: options
                .spool_dir
                .clone()
                .unwrap_or_else(|| state_dir.join("spool")),
            scratch_dir: options
                .scratch_dir
                .clone()
                .unwrap_or_else(|| state_dir.join("scratch")),
            load: ProcLoad {
                loadavg: options
                    .loadavg_path
                    .clone()
                    .unwrap_or_else(|| "/proc/loadavg".into()),
                meminfo: options
                    .meminfo_path
                    .clone()
                    .unwrap_or_else(|| "/proc/meminfo".into()),
                cpu_pressure: max_cpu_pressure.map(|_| cpu_pressure_path(options)),
            },
            backoff,
            job,
            rules,
            schedule: options.schedule.is_some().then_some(schedule),
            state_dir: state_dir.to_path_buf(),
            pool: None,
            php,
            yielding: yield_settings(options)?,
        })
    }
}

impl Settings {
    /// The settings of each pool: one, unnamed, without `[[pool]]` tables;
    /// otherwise one per table, each with its own spool, the declared
    /// schedule kept by the first.
    pub fn resolve_pools(
        options: &SupervisorOptions,
        state_dir: &std::path::Path,
    ) -> Result<Vec<Self>, ConfigError> {
        let tables = options.pool.clone().unwrap_or_default();
        if tables.is_empty() {
            return Ok(vec![Settings::resolve(options, state_dir)?]);
        }
        let mut all: Vec<Settings> = Vec::new();
        for (index, table) in tables.iter().enumerate() {
            let name = &table.name;
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return Err(ConfigError::Setting(format!(
                    "[[pool]] name {name:?}: use letters, digits, '_' and '-'"
                )));
            }
            if all.iter().any(|s| s.pool.as_deref() == Some(name)) {
                return Err(ConfigError::Setting(format!(
                    "[[pool]] {name:?} is declared twice"
                )));
            }
            let mut settings = Settings::resolve(&table.over(options), state_dir)
                .map_err(|e| ConfigError::Setting(format!("[[pool]] {name:?}: {e}")))?;
            settings.spool_dir = settings.spool_dir.join(name);
            if index > 0 {
                settings.schedule = None;
            }
            settings.pool = Some(name.clone());
            all.push(settings);
        }
        Ok(all)
    }

    /// The settings for a job of this name, and which they are (0 for the
    /// defaults, `i + 1` for the `i`-th `[[job]]` table).
    pub fn for_job(&self, name: &str) -> (usize, &JobSettings) {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, (pattern, _))| pattern.matches(name))
            .map_or((0, &self.job), |(i, (_, job))| (i + 1, job))
    }
}

/// The default pause threshold, percent.
pub const DEFAULT_PAUSE_PRESSURE: f64 = 10.0;
/// The default freeze threshold, percent.
pub const DEFAULT_FREEZE_PRESSURE: f64 = 25.0;
/// The default longest freeze.
pub const DEFAULT_MAX_FREEZE: Duration = Duration::from_secs(300);

/// Resolves the back-off: its thresholds, and the signal it follows (the
/// site cgroups must exist and every file read must be in PSI format).
fn backoff_settings(options: &SupervisorOptions) -> Result<BackoffSettings, ConfigError> {
    let setting = |message: String| ConfigError::Setting(message);
    let thresholds = Thresholds {
        pause: options
            .pause_pressure
            .map_or(Some(DEFAULT_PAUSE_PRESSURE), |t| t.0),
        freeze: options
            .freeze_pressure
            .map_or(Some(DEFAULT_FREEZE_PRESSURE), |t| t.0),
    };
    if let (Some(pause), Some(freeze)) = (thresholds.pause, thresholds.freeze)
        && pause >= freeze
    {
        return Err(setting(format!(
            "pause-pressure ({pause}) must be below freeze-pressure ({freeze}): frozen jobs thaw when the pressure falls below pause-pressure"
        )));
    }
    let max_freeze = options.max_freeze.map_or(DEFAULT_MAX_FREEZE, |d| d.0);
    if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&max_freeze) {
        return Err(setting(format!(
            "max-freeze must be between 1s and 24h, not {}",
            crate::config::HumanDuration(max_freeze)
        )));
    }
    let site = options.site_cgroup.clone().unwrap_or_default();
    let signal = if thresholds.pause.is_none() && thresholds.freeze.is_none() {
        Err("pause-pressure and freeze-pressure are both off".to_string())
    } else {
        super::backoff::pressure::resolve(&site, options.pressure_dir.as_deref())
            .map_err(|e| setting(e.to_string()))?
    };
    Ok(BackoffSettings {
        signal,
        thresholds,
        max_freeze,
        pressure_dir: options.pressure_dir.clone(),
    })
}

/// Resolves how jobs yield to the site.
fn yield_settings(options: &SupervisorOptions) -> Result<YieldSettings, ConfigError> {
    let setting = ConfigError::Setting;
    Ok(YieldSettings {
        cpu: options.yield_cpu.unwrap_or(true),
        nice: options
            .job_nice
            .map(YieldSettings::check_nice)
            .transpose()
            .map_err(setting)?,
        io: options.yield_io.unwrap_or(true),
        memory_high: options
            .jobs_memory_high
            .as_deref()
            .map(MemoryHigh::parse)
            .transpose()
            .map_err(setting)?,
    })
}

/// Resolves the per-job settings of `options` (the supervisor-wide ones, or
/// a `[[job]]` table's on top of them).
fn job_settings(
    options: &SupervisorOptions,
    rule: Option<&crate::config::JobRule>,
) -> Result<JobSettings, ConfigError> {
    let within = rule.map_or(String::new(), |r| format!("[[job]] {:?}: ", r.name));
    let setting = |message: String| ConfigError::Setting(format!("{within}{message}"));
    let duration = |value: Option<crate::config::HumanDuration>, default: Duration| {
        value.map_or(default, |d| d.0)
    };
    let max_attempts = options.max_attempts.unwrap_or(5);
    if max_attempts < 1 {
        return Err(setting("max-attempts must be at least 1".into()));
    }
    let timeout = duration(options.timeout, Duration::from_secs(30 * 60));
    if timeout.is_zero() {
        return Err(setting("timeout must be more than zero".into()));
    }
    let max_concurrency = rule.and_then(|r| r.max_concurrency);
    if max_concurrency == Some(0) {
        return Err(setting("max-concurrency must be at least 1".into()));
    }
    Ok(JobSettings {
        timeout,
        kill_grace: duration(options.kill_grace, Duration::from_secs(10)),
        retry: RetryPolicy {
            max_attempts,
            backoff: duration(options.backoff, Duration::from_secs(10)),
            max_backoff: duration(options.max_backoff, Duration::from_secs(3600)),
            no_worker_timeout: duration(options.no_worker_timeout, Duration::from_secs(3600)),
        },
        env: options
            .env
            .iter()
            .flatten()
            .map(|p| (p.0.clone(), p.1.clone()))
            .collect(),
        sandbox: SandboxSettings {
            user: options.user.clone(),
            worker_uids: UidRange::parse(
                options
                    .worker_uids
                    .as_deref()
                    .unwrap_or(super::uids::DEFAULT_WORKER_UIDS),
            )
            .map_err(setting)?,
            group: options.group.clone(),
            umask: parse_umask(options.umask.as_deref().unwrap_or("027")).map_err(setting)?,
            rlimits: Rlimits {
                address_space: options.limit_as.map(|s| s.0),
                cpu_seconds: options.limit_cpu.map(|d| d.0.as_secs().max(1)),
                open_files: options.limit_nofile,
                processes: options.limit_nproc,
                file_size: options.limit_fsize.map(|s| s.0),
                core: Some(options.limit_core.map_or(0, |s| s.0)),
            },
            cgroup: CgroupLimits {
                memory_max: options.memory_max.map(|s| s.0),
                pids_max: options.pids_max,
                cpu_max: match options.cpu_max {
                    Some(cpus) if !(cpus.is_finite() && cpus > 0.0) => {
                        return Err(setting(format!(
                            "cpu-max must be a positive number of CPUs, not {cpus}"
                        )));
                    }
                    other => other,
                },
            },
            no_network: options.no_network.unwrap_or(false),
            read_only: options.read_only_fs.unwrap_or(false),
            private_tmp: options.private_tmp.unwrap_or(false),
            priority: yield_settings(options)?.worker(),
        },
        max_concurrency,
        kind: options.worker_kind.unwrap_or_default(),
        php_bootstrap: options
            .php_bootstrap
            .as_deref()
            .map(bwm_php::bootstrap)
            .transpose()
            .map_err(setting)?,
    })
}

impl Settings {
    /// Every setting by its configuration key, with its effective value
    /// written as TOML, or as a `#` comment when unset (for `jobmgr
    /// check-config`). Keys the supervisor
    /// resolves into others (`load-per-cpu` into `max-load`) show the
    /// result.
    pub fn effective(&self) -> Vec<(&'static str, String)> {
        use crate::config::{ByteSize, HumanDuration};
        let text = |s: &str| format!("{s:?}");
        let path = |p: &std::path::Path| format!("{:?}", p.display().to_string());
        let duration = |d: Duration| format!("\"{}\"", HumanDuration(d));
        let size = |n: u64| format!("\"{}\"", ByteSize(n));
        let optional = |v: Option<String>| v.unwrap_or_else(|| "# not set".into());
        let job = &self.job;
        let sandbox = &job.sandbox;
        let limits = &sandbox.rlimits;
        vec![
            ("job-name", text(&self.job_name)),
            ("worker-path", path(&self.worker_path)),
            ("worker-kind", text(&job.kind.to_string())),
            (
                "php-bootstrap",
                optional(job.php_bootstrap.as_deref().map(path)),
            ),
            ("php", optional(self.php.as_ref().map(|p| path(&p.php)))),
            (
                "php-runner",
                optional(
                    self.php
                        .as_ref()
                        .and_then(|p| p.runner.as_deref())
                        .map(path),
                ),
            ),
            (
                "php-bedrock",
                optional(
                    self.php
                        .as_ref()
                        .and_then(|p| p.bedrock.as_deref())
                        .map(text),
                ),
            ),
            ("max-load", format!("{:.2}", self.gate.max_load)),
            ("min-memory", size(self.gate.min_available_memory)),
            ("max-workers", self.gate.max_workers.to_string()),
            ("ramp", self.gate.ramp.to_string()),
            ("fetch-ahead", self.gate.fetch_ahead.to_string()),
            ("fetch-ahead-hold", duration(self.gate.fetch_ahead_hold)),
            ("timeout", duration(job.timeout)),
            ("kill-grace", duration(job.kill_grace)),
            ("drain-timeout", duration(self.drain_timeout)),
            ("lease", duration(self.lease)),
            ("poll-wait", duration(self.poll_wait)),
            ("max-attempts", job.retry.max_attempts.to_string()),
            ("backoff", duration(job.retry.backoff)),
            ("max-backoff", duration(job.retry.max_backoff)),
            ("no-worker-timeout", duration(job.retry.no_worker_timeout)),
            ("output-cap", size(self.output_cap as u64)),
            ("env-allow", format!("{:?}", self.env_allow)),
            (
                "env",
                format!(
                    "{{ {} }}",
                    job.env
                        .iter()
                        .map(|(k, v)| format!("{k} = {v:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            (
                "max-iterations",
                optional(self.max_iterations.map(|n| n.to_string())),
            ),
            (
                "version-watch-file",
                optional(self.version_watch_file.as_deref().map(path)),
            ),
            ("spool-dir", path(&self.spool_dir)),
            ("scratch-dir", path(&self.scratch_dir)),
            ("loadavg-path", path(&self.load.loadavg)),
            (
                "site-cgroup",
                match &self.backoff.signal {
                    Ok(super::backoff::pressure::Signal::Site(cgroups)) => format!(
                        "{:?}",
                        cgroups.iter().map(|(given, _)| given).collect::<Vec<_>>()
                    ),
                    _ => "# not set: the system-wide pressure".into(),
                },
            ),
            (
                "pause-pressure",
                self.backoff
                    .thresholds
                    .pause
                    .map_or("\"off\"".into(), |p| format!("{p:.2}")),
            ),
            (
                "freeze-pressure",
                self.backoff
                    .thresholds
                    .freeze
                    .map_or("\"off\"".into(), |p| format!("{p:.2}")),
            ),
            ("max-freeze", duration(self.backoff.max_freeze)),
            (
                "pressure-dir",
                optional(self.backoff.pressure_dir.as_deref().map(path)),
            ),
            ("meminfo-path", path(&self.load.meminfo)),
            (
                "max-cpu-pressure",
                optional(self.gate.max_cpu_pressure.map(|p| format!("{p:.2}"))),
            ),
            (
                "cpu-pressure-path",
                path(
                    self.load
                        .cpu_pressure
                        .as_deref()
                        .unwrap_or(std::path::Path::new(super::gate::CPU_PRESSURE)),
                ),
            ),
            (
                "user",
                optional(sandbox.user.as_deref().map(text))
                    .replace("# not set", "# not set: as root, a uid of each job's own"),
            ),
            ("worker-uids", text(&sandbox.worker_uids.to_string())),
            ("group", optional(sandbox.group.as_deref().map(text))),
            ("umask", format!("\"{:03o}\"", sandbox.umask)),
            ("limit-as", optional(limits.address_space.map(size))),
            (
                "limit-cpu",
                optional(limits.cpu_seconds.map(|s| duration(Duration::from_secs(s)))),
            ),
            (
                "limit-nofile",
                optional(limits.open_files.map(|n| n.to_string())),
            ),
            (
                "limit-nproc",
                optional(limits.processes.map(|n| n.to_string())),
            ),
            ("limit-fsize", optional(limits.file_size.map(size))),
            ("limit-core", optional(limits.core.map(size))),
            ("memory-max", optional(sandbox.cgroup.memory_max.map(size))),
            (
                "pids-max",
                optional(sandbox.cgroup.pids_max.map(|n| n.to_string())),
            ),
            (
                "cpu-max",
                optional(sandbox.cgroup.cpu_max.map(|c| c.to_string())),
            ),
            ("no-network", sandbox.no_network.to_string()),
            ("read-only-fs", sandbox.read_only.to_string()),
            ("private-tmp", sandbox.private_tmp.to_string()),
            ("yield-cpu", self.yielding.cpu.to_string()),
            (
                "job-nice",
                optional(self.yielding.nice.map(|n| n.to_string())),
            ),
            ("yield-io", self.yielding.io.to_string()),
            (
                "jobs-memory-high",
                optional(self.yielding.memory_high.map(|m| text(&m.to_string()))),
            ),
        ]
    }
}

/// Where CPU pressure is read: `cpu-pressure-path`, else the kernel's file.
pub fn cpu_pressure_path(options: &SupervisorOptions) -> PathBuf {
    options
        .cpu_pressure_path
        .clone()
        .unwrap_or_else(|| super::gate::CPU_PRESSURE.into())
}
