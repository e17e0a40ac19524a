//! The supervisor: BWM's main loop, done right. It waits until the machine
//! has room (the [`gate`]), blocks on the job server for as many jobs as it
//! has free slots, runs each as a child process named after the job (the
//! [`process`] module), renews the job's lease while it runs, forwards its
//! progress, and reports how it ended ([`report`]), spooling reports the
//! server cannot take yet ([`spool`]). SIGTERM drains, a quiet signal stops
//! fetching, SIGHUP reloads the configuration, and a change of the version
//! watch file drains and exits for the service manager to restart it.

pub mod backoff;
pub mod bwm_php;
pub mod cgroup;
pub mod dirs;
pub mod gate;
pub mod job_guard;
pub mod landlock;
pub mod launcher;
pub mod leftovers;
pub mod no_worker;
pub mod output;
pub mod proc_stat;
pub mod process;
pub mod report;
pub mod report_line;
pub mod sandbox;
pub mod schedule;
pub mod scratch;
pub mod settings;
pub mod slots;
pub mod spawner;
pub mod spool;
pub mod status;
pub mod uids;
pub mod worker_path;
pub mod yielding;

mod held;
mod job;
mod quieter;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client::{JobSource, LeasedJob, SourceError};
use crate::config::ConfigError;
use crate::protocol::WorkerInfo;
use gate::{Gate, LoadSource};
use launcher::Launcher;
pub use settings::Settings;
use spool::Spool;

/// What the outside world asks of a running supervisor (signals, mostly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Stop fetching, let running jobs finish (up to the drain timeout),
    /// then stop the rest, hand their jobs back and exit. SIGTERM, SIGINT.
    Drain,
    /// A second drain request: stop running jobs now and hand them back.
    StopNow,
    /// Stop fetching; keep running jobs; stay up. SIGTSTP.
    Quiet,
    /// Re-read the configuration; it applies to the next job. SIGHUP.
    Reload,
}

/// Why the supervisor exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It was asked to drain.
    Drained,
    /// The version watch file changed.
    VersionChanged,
    /// It started `--max-iterations` jobs.
    MaxIterations,
}

/// Why the supervisor could not run.
#[derive(Debug, Error)]
pub enum SupervisorError {
    /// Its configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A directory it needs could not be prepared, or the launcher failed.
    #[error("{0}")]
    Io(String),
}

/// Re-reads the configuration (on SIGHUP).
pub type Reloader = Box<dyn Fn() -> Result<Settings, ConfigError> + Send + Sync>;

/// What the pools of one process share: the one thread workers are forked
/// from (with the orphan reaper, which must know every pool's workers), the
/// job cgroups, and the scratch directory (held, and cleared of a killed
/// supervisor's leftovers, once). Each is made by the first pool that
/// needs it.
pub struct Host {
    launcher: std::sync::Mutex<Option<Launcher>>,
    cgroups: std::sync::OnceLock<Result<Arc<cgroup::Cgroups>, String>>,
    scratch: std::sync::Mutex<Vec<Arc<scratch::ScratchParent>>>,
    /// The back-off under site pressure, started by the first pool.
    backoff: std::sync::OnceLock<backoff::Backoff>,
    /// What every pool is doing, for `jobmgr status`.
    pub status: status::StatusBoard,
}

impl Host {
    /// The shared parts of a process taking jobs from `server`.
    pub fn new(server: &str) -> Self {
        Host {
            launcher: std::sync::Mutex::default(),
            cgroups: std::sync::OnceLock::new(),
            scratch: std::sync::Mutex::default(),
            backoff: std::sync::OnceLock::new(),
            status: status::StatusBoard::new(server),
        }
    }

    /// The back-off, started with `settings` by the first pool that asks
    /// (every pool has the same: its settings are supervisor-wide).
    fn backoff(&self, settings: &backoff::BackoffSettings) -> backoff::Backoff {
        self.backoff
            .get_or_init(|| backoff::Backoff::start(settings.clone(), self.status.clone()))
            .clone()
    }

    /// The launcher, started on first use (under the lock, so that there is
    /// only ever one orphan reaper).
    fn launcher(&self) -> Result<Launcher, SupervisorError> {
        let mut slot = self.launcher.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(launcher) = slot.as_ref() {
            return Ok(launcher.clone());
        }
        let started = Launcher::start(tokio::runtime::Handle::current())
            .map_err(|e| SupervisorError::Io(format!("cannot start the launcher thread: {e}")))?;
        Ok(slot.insert(started).clone())
    }

    /// The scratch parent at `dir`, prepared (and cleared of what a killed
    /// supervisor left in it) by the first pool that uses it, and held for
    /// the life of the process.
    fn scratch(
        &self,
        dir: &std::path::Path,
    ) -> Result<Arc<scratch::ScratchParent>, SupervisorError> {
        let mut held = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(parent) = held.iter().find(|p| p.dir() == dir) {
            return Ok(Arc::clone(parent));
        }
        let parent = Arc::new(scratch::ScratchParent::open(dir).map_err(SupervisorError::Io)?);
        held.push(Arc::clone(&parent));
        Ok(parent)
    }
}

/// A supervisor, ready to run.
pub struct Supervisor {
    settings: Arc<RwLock<Arc<Settings>>>,
    generation: RwLock<Option<Arc<Generation>>>,
    host: Arc<Host>,
    source: Arc<dyn JobSource>,
    load: Arc<dyn LoadSource>,
    reload: Option<Reloader>,
    access: bwm_php::Access,
}

/// What every job task shares.
struct Shared {
    source: Arc<dyn JobSource>,
    launcher: Launcher,
    board: status::PoolBoard,
    spool: Spool,
    courier: Notify,
    draining: AtomicBool,
    busy_until: std::sync::Mutex<Option<Instant>>,
    /// No-worker hand-backs said once a minute per job name.
    no_worker_lines: quieter::Quieter,
    /// What PHP workers are told of the job server.
    access: bwm_php::Access,
    /// The pool's name, for the metrics.
    pool: String,
    /// The machine's readings, which a held job asks again when it gets
    /// its slot.
    load: Arc<dyn LoadSource>,
    /// The running workers' gauge.
    running: crate::metrics::PoolGauge,
    /// Cancelled when the drain starts: held jobs go back at once.
    release_held: CancellationToken,
    /// The back-off, which freezes and thaws running jobs.
    backoff: backoff::Backoff,
    /// Cancelled when the drain starts: the pool's jobs are thawed and not
    /// frozen again.
    drained: CancellationToken,
}

/// Settings and what is built from them, swapped whole on reload: the
/// sandboxes and the per-name concurrency limits of the defaults (index 0)
/// and of each `[[job]]` table (index `i + 1`).
pub(crate) struct Generation {
    settings: Arc<Settings>,
    sandboxes: Vec<Arc<sandbox::Sandbox>>,
    slots: Vec<Option<Arc<tokio::sync::Semaphore>>>,
    /// The PHP runner, where PHP workers run: installed by
    /// [`Generation::install_php_runner`].
    php_runner: Option<std::path::PathBuf>,
}

/// Checks the sandboxes `settings` ask for (user, group, worker uids,
/// namespaces, Landlock, private-tmp paths), as a pool's start does, for
/// `jobmgr check-config` and before the start. Cgroup limits are left to
/// the start: probing them makes cgroups.
pub fn check_sandboxes(settings: &Settings) -> Result<(), String> {
    let mut settings = settings.clone();
    settings.job.sandbox.cgroup = Default::default();
    for (_, job) in &mut settings.rules {
        job.sandbox.cgroup = Default::default();
    }
    Generation::build(Arc::new(settings), &Err("not probed".into())).map(|_| ())
}

impl Generation {
    /// The uid pools of its sandboxes (one per distinct pool).
    fn uid_pools(&self) -> Vec<Arc<uids::UidPool>> {
        let mut pools: Vec<Arc<uids::UidPool>> = Vec::new();
        for pool in self.sandboxes.iter().filter_map(|s| s.uids()) {
            if !pools.iter().any(|p| Arc::ptr_eq(p, pool)) {
                pools.push(Arc::clone(pool));
            }
        }
        pools
    }

    fn build(
        settings: Arc<Settings>,
        cgroups: &Result<Arc<cgroup::Cgroups>, String>,
    ) -> Result<Self, String> {
        let all: Vec<&settings::JobSettings> = std::iter::once(&settings.job)
            .chain(settings.rules.iter().map(|(_, job)| job))
            .collect();
        let mut sandboxes = Vec::new();
        for job in &all {
            if job.sandbox.private_tmp {
                for (what, path) in [
                    ("worker path", &settings.worker_path),
                    ("scratch directory", &settings.scratch_dir),
                ] {
                    let resolved = path.canonicalize().unwrap_or_else(|_| path.clone());
                    if resolved.starts_with("/tmp") {
                        return Err(format!(
                            "private-tmp hides /tmp from workers, but the {what} {} is under it; move it",
                            path.display()
                        ));
                    }
                }
            }
            let sandbox = sandbox::Sandbox::prepare(&job.sandbox, cgroups)
                .map_err(|e| format!("cannot set up the worker sandbox: {e}"))?;
            if let Some(pool) = sandbox.uids() {
                let usable = pool.usable();
                if usable < settings.gate.max_workers as u64 {
                    return Err(format!(
                        "worker-uids {} has {usable} uids free of users, groups and subordinate ranges, fewer than max-workers ({}): each running job needs one; widen worker-uids or lower max-workers",
                        pool.range(),
                        settings.gate.max_workers
                    ));
                }
            }
            sandboxes.push(Arc::new(sandbox));
        }
        let slots = all
            .iter()
            .map(|job| {
                job.max_concurrency
                    .map(|n| Arc::new(tokio::sync::Semaphore::new(n)))
            })
            .collect();
        Ok(Generation {
            settings,
            sandboxes,
            slots,
            php_runner: None,
        })
    }

    /// Where PHP workers run: the configured runner, else jobmgr's own
    /// written into the scratch directory. Says how PHP workers run, and
    /// warns when their `$bedrock` has no server to reach.
    fn install_php_runner(&mut self, access: &bwm_php::Access) -> Result<(), String> {
        let Some(php) = &self.settings.php else {
            return Ok(());
        };
        let runner = match &php.runner {
            Some(runner) => runner.clone(),
            None => bwm_php::install_runner(&self.settings.scratch_dir).map_err(|e| {
                format!(
                    "cannot write the PHP runner into {}: {e}",
                    self.settings.scratch_dir.display()
                )
            })?,
        };
        let bedrock = php.bedrock.as_ref().or(access.bedrock.as_ref());
        tracing::info!(
            php = %php.php.display(),
            php_version = %php.version,
            runner = %runner.display(),
            bedrock = bedrock.map_or("none", String::as_str),
            job_tokens = access.token.is_some(),
            "PHP workers (bwm-php) run through the runner; their $bedrock client reaches the job server's Bedrock port"
        );
        if bedrock.is_none() {
            tracing::warn!(
                "PHP workers' $bedrock client has no job server to reach: pass --php-bedrock HOST:PORT (the job server's Bedrock port) if workers create jobs"
            );
        }
        self.php_runner = Some(runner);
        Ok(())
    }

    fn describe(&self) {
        tracing::info!("sandbox: {}", self.sandboxes[0].describe());
        tracing::info!(
            "jobs yield to the site: {}",
            self.sandboxes[0].describe_yielding()
        );
        if let Some(shared) = self.sandboxes[0].shared() {
            tracing::warn!("{shared}");
        }
        for (i, (pattern, _)) in self.settings.rules.iter().enumerate() {
            let sandbox = &self.sandboxes[i + 1];
            tracing::info!(job = ?pattern, "sandbox for these jobs: {}", sandbox.describe());
            if let Some(shared) = sandbox.shared() {
                tracing::warn!(job = ?pattern, "for these jobs, {shared}");
            }
        }
    }
}

impl Shared {
    /// The machine could not start a worker (out of processes, memory or
    /// descriptors): take no jobs for a few seconds.
    fn back_off(&self, reason: &str) {
        let until = Instant::now() + jittered(Duration::from_secs(5));
        tracing::warn!(
            reason,
            "cannot start workers; taking no jobs for a few seconds"
        );
        *self.busy_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
    }

    /// Until when fetching waits after a failure to start a worker.
    fn busy_until(&self) -> Option<Instant> {
        let mut slot = self.busy_until.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some_and(|until| until <= Instant::now()) {
            *slot = None;
        }
        *slot
    }
}

impl Supervisor {
    /// A supervisor taking jobs from `source`, reading the machine from
    /// `load`.
    pub fn new(settings: Settings, source: Arc<dyn JobSource>, load: Arc<dyn LoadSource>) -> Self {
        Supervisor {
            settings: Arc::new(RwLock::new(Arc::new(settings))),
            generation: RwLock::new(None),
            host: Arc::new(Host::new(&source.describe())),
            source,
            load,
            reload: None,
            access: bwm_php::Access::default(),
        }
    }

    /// Tells PHP workers where the job server's Bedrock port is, and gives
    /// their job tokens a key.
    pub fn with_access(mut self, access: bwm_php::Access) -> Self {
        self.access = access;
        self
    }

    /// Shares the launcher thread and the cgroups with the other pools of
    /// this process.
    pub fn on_host(mut self, host: Arc<Host>) -> Self {
        self.host = host;
        self
    }

    /// Re-read the configuration with `reload` on [`Control::Reload`].
    pub fn with_reload(mut self, reload: Reloader) -> Self {
        self.reload = Some(reload);
        self
    }

    fn generation(&self) -> Arc<Generation> {
        let generation = self.generation.read().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            generation
                .as_ref()
                .expect("the generation is built when run starts"),
        )
    }

    fn settings(&self) -> Arc<Settings> {
        Arc::clone(&self.settings.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs until drained (by `control`, `--max-iterations` or the version
    /// watch file). Every job it took is reported or handed back before it
    /// returns, except reports the server could not take, which stay in the
    /// spool for the next start.
    pub async fn run(
        self,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) -> Result<Exit, SupervisorError> {
        let settings = self.settings();
        let spool =
            Spool::open(&settings.spool_dir).map_err(|e| SupervisorError::Io(e.to_string()))?;
        self.host.scratch(&settings.scratch_dir)?;
        let all: Vec<&sandbox::SandboxSettings> = std::iter::once(&settings.job.sandbox)
            .chain(settings.rules.iter().map(|(_, job)| &job.sandbox))
            .collect();
        let cgroups = self
            .host
            .cgroups
            .get_or_init(|| sandbox::Sandbox::cgroups(&all, &settings.yielding));
        let mut generation =
            Generation::build(Arc::clone(&settings), cgroups).map_err(SupervisorError::Io)?;
        generation
            .install_php_runner(&self.access)
            .map_err(SupervisorError::Io)?;
        generation.describe();
        *self.generation.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(generation));
        let launcher = self.host.launcher()?;
        let backoff = self.host.backoff(&settings.backoff);
        // The gate reads the site's pressure with the machine's load.
        let load = backoff.over(Arc::clone(&self.load));
        let board = self.host.status.pool(
            settings.pool.as_deref().unwrap_or("main"),
            &settings.job_name,
            settings.gate.max_load,
            settings.gate.max_workers,
        );
        let shared = Arc::new(Shared {
            source: Arc::clone(&self.source),
            launcher,
            board: board.clone(),
            spool,
            courier: Notify::new(),
            draining: AtomicBool::new(false),
            busy_until: std::sync::Mutex::new(None),
            no_worker_lines: quieter::Quieter::new(Duration::from_secs(60)),
            access: self.access.clone(),
            pool: settings.pool.as_deref().unwrap_or("main").to_string(),
            load: Arc::clone(&load),
            running: crate::metrics::PoolGauge::workers_running(
                settings.pool.as_deref().unwrap_or("main"),
            ),
            release_held: CancellationToken::new(),
            backoff: backoff.clone(),
            drained: CancellationToken::new(),
        });
        let courier_stop = CancellationToken::new();
        let courier = tokio::spawn(courier(
            Arc::clone(&shared),
            courier_stop.clone(),
            (settings.lease / 3).max(Duration::from_millis(100)),
        ));
        let version_changed = Arc::new(Notify::new());
        let watcher = settings
            .version_watch_file
            .clone()
            .map(|path| tokio::spawn(watch_version(path, Arc::clone(&version_changed))));

        tracing::info!(
            server = %self.source.describe(),
            pool = settings.pool.as_deref().unwrap_or("main"),
            job_name = %settings.job_name,
            worker_path = %settings.worker_path.display(),
            max_load = settings.gate.max_load,
            max_workers = settings.gate.max_workers,
            backoff = %settings.backoff.describe(),
            "supervisor started"
        );

        // Strays of the uid ranges are looked for before the first job, and
        // now and then after (see `uids::keep_swept`).
        let pools = self.generation().uid_pools();
        for pool in &pools {
            uids::sweep_now(pool).await;
        }
        let _sweepers: Vec<_> = pools
            .into_iter()
            .map(|pool| {
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(uids::keep_swept(pool)))
            })
            .collect();

        let mut scheduler = Some(tokio::spawn(keep_schedule(
            Arc::clone(&self.source),
            Arc::clone(&settings),
        )));

        let can_hold = self.source.hands_back_exactly();
        if settings.gate.fetch_ahead > 0 && !can_hold {
            tracing::warn!(
                server = %self.source.describe(),
                "fetch-ahead is off: over Bedrock's protocol a job held ahead could not go back to the queue exactly; give --server the HTTP API's address to use it"
            );
        } else if settings.gate.fetch_ahead > 0 && settings.max_iterations.is_some() {
            tracing::warn!("fetch-ahead is off: max-iterations counts the jobs taken");
        }
        let mut gate = Gate::new(settings.gate);
        // Jobs until reported; `slots`, until their workers are gone.
        let mut workers: JoinSet<()> = JoinSet::new();
        let worker_slots = slots::Slots::new(settings.gate.max_workers);
        let held_gauge = crate::metrics::PoolGauge::jobs_held(&shared.pool);
        // Fetches abandoned on a signal, each handing back what it brings.
        let mut abandoned: JoinSet<()> = JoinSet::new();
        let stop_workers = CancellationToken::new();
        let mut started: u64 = 0;
        let mut quiet = false;
        let mut last_closed: Option<&'static str> = None;
        let mut backoff = Duration::from_secs(1);
        let mut logged_mode = None;
        // Who this pool is, for the server's worker registry; the server
        // hears from it at every fetch, and once per poll-wait while the
        // gate is closed (so no more often than a fetch would).
        let mut presence = WorkerInfo::this_process(
            settings.pool.as_deref(),
            u32::try_from(settings.gate.max_workers).unwrap_or(u32::MAX),
        );
        let mut last_presence = Instant::now();

        let exit = 'fetching: loop {
            while workers.try_join_next().is_some() {}
            while abandoned.try_join_next().is_some() {}
            let settings = self.settings();
            if let Some(max) = settings.max_iterations
                && started >= max
            {
                tracing::info!(started, "max iterations reached; draining");
                break Exit::MaxIterations;
            }
            if quiet {
                // No fetch while quiet, nor while backing off (below): the
                // reports of jobs that end go by themselves. Jobs held ahead
                // go back.
                shared.release_held.cancel();
                self.source.withdraw_offers();
                board.gate("quiet", gate.last_sample().map(|s| s.load1));
                tokio::select! {
                    message = control.recv() => match message {
                        Some(Control::Drain) | Some(Control::StopNow) | None => break Exit::Drained,
                        Some(Control::Reload) => {
                            self.reload(&mut gate);
                            restart_schedule(&mut scheduler, &self.source, self.settings());
                        }
                        Some(Control::Quiet) => {}
                    },
                    Some(_) = workers.join_next(), if !workers.is_empty() => {}
                    _ = version_changed.notified() => break Exit::VersionChanged,
                }
                continue;
            }
            if let Some(until) = shared.busy_until() {
                self.source.withdraw_offers();
                tokio::select! {
                    _ = tokio::time::sleep_until(until.into()) => {}
                    Some(_) = workers.join_next(), if !workers.is_empty() => {}
                    message = control.recv() => {
                        if let Some(exit) = self.on_control(message, &mut quiet, &mut gate, &mut scheduler) {
                            break exit;
                        }
                    }
                }
                continue;
            }
            gate.set_limits(settings.gate);
            worker_slots.set_max(settings.gate.max_workers);
            board.limits(
                &settings.job_name,
                settings.gate.max_load,
                settings.gate.max_workers,
            );
            let busy = worker_slots.busy(workers.len(), settings.gate.max_workers);
            let checked = gate.check(busy, load.as_ref(), Instant::now());
            let sample = gate.last_sample();
            // Jobs are held ahead only where they go back exactly (see
            // `JobSource::hands_back_exactly`), and not to a count of jobs.
            let may_hold =
                settings.gate.fetch_ahead > 0 && can_hold && settings.max_iterations.is_none();
            // More reports on their way than workers: no fetch follows a
            // slot that frees until those are answered.
            let full_of_reports = worker_slots.full_of_reports(busy);
            let held_up_by_reports = may_hold && full_of_reports;
            // Every slot taken by a worker: jobs may be fetched ahead, held
            // for the slots that free next (the gate counts as open for
            // them).
            let ahead = match checked {
                Err(gate::Closed::Full { .. }) if may_hold && !held_up_by_reports => {
                    worker_slots.ahead_room(settings.gate.fetch_ahead)
                }
                _ => 0,
            };
            let state = match &checked {
                Err(closed) if ahead == 0 => closed.name(),
                _ => "open",
            };
            crate::metrics::gate(
                settings.pool.as_deref().unwrap_or("main"),
                state,
                sample.map(|s| s.load1),
                sample.map(|s| s.available_memory),
            );
            board.gate(state, sample.map(|s| s.load1));
            let slots = match checked {
                _ if ahead > 0 => ahead,
                Ok(slots) => {
                    if let Some(reason) = last_closed.take() {
                        if matches!(reason, "full" | "ramp") {
                            tracing::debug!(
                                was = reason,
                                running = worker_slots.taken(),
                                "gate open"
                            );
                        } else {
                            tracing::info!(
                                was = reason,
                                running = worker_slots.taken(),
                                "gate open: taking jobs again"
                            );
                        }
                    }
                    slots
                }
                Err(closed) => {
                    // No fetch until the machine allows: the reports of
                    // jobs that just ended go by themselves. (A pool full
                    // of workers, or at its ramp's ceiling, fetches as
                    // soon as a slot frees, with them. One full of reports
                    // on their way fetches only once those reports are
                    // answered: they must not wait for a fetch.)
                    let slot_brings_fetch = matches!(
                        closed,
                        gate::Closed::Full { .. } | gate::Closed::Ramp { .. }
                    );
                    if !slot_brings_fetch || full_of_reports {
                        self.source.withdraw_offers();
                    }
                    if last_closed != Some(closed.name()) {
                        // Full and ramping are the gate working as meant; the
                        // machine's state is news.
                        if matches!(
                            closed,
                            gate::Closed::Full { .. } | gate::Closed::Ramp { .. }
                        ) {
                            tracing::debug!(reason = %closed, running = worker_slots.taken(), "gate closed: not taking jobs");
                        } else {
                            tracing::info!(reason = %closed, running = worker_slots.taken(), "gate closed: not taking jobs");
                        }
                        last_closed = Some(closed.name());
                    }
                    if last_presence.elapsed() >= settings.poll_wait.max(Duration::from_secs(1)) {
                        last_presence = Instant::now();
                        presence.running = u32::try_from(worker_slots.taken()).unwrap_or(u32::MAX);
                        presence.frozen = board.frozen();
                        presence.capacity =
                            u32::try_from(settings.gate.max_workers).unwrap_or(u32::MAX);
                        presence.load = sample.map(|s| s.load1);
                        if let Err(error) = self.source.announce(&presence).await {
                            tracing::debug!(%error, "could not tell the server this supervisor is alive");
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = worker_slots.freed() => {}
                        Some(_) = workers.join_next(), if !workers.is_empty() => {}
                        message = control.recv() => {
                            if let Some(exit) = self.on_control(message, &mut quiet, &mut gate, &mut scheduler) {
                                break 'fetching exit;
                            }
                        }
                        _ = version_changed.notified() => break Exit::VersionChanged,
                    }
                    continue;
                }
            };
            let slots = match settings.max_iterations {
                Some(max) => slots.min((max - started) as usize),
                None => slots,
            };
            presence.running = u32::try_from(worker_slots.taken()).unwrap_or(u32::MAX);
            presence.frozen = board.frozen();
            presence.capacity = u32::try_from(settings.gate.max_workers).unwrap_or(u32::MAX);
            presence.load = sample.map(|s| s.load1);
            last_presence = Instant::now();
            // The fetch runs in a task of its own: a signal that stops the
            // taking of jobs abandons it rather than dropping it, so that
            // jobs whose answer was already on the wire are handed back
            // (see `hand_back_when_answered`) instead of staying leased to
            // nobody until their lease lapses.
            let mut fetch = {
                let source = Arc::clone(&self.source);
                let pattern = settings.job_name.clone();
                let worker = presence.clone();
                let (wait, lease) = (settings.poll_wait, settings.lease);
                tokio::spawn(async move {
                    source
                        .get_jobs_as(&pattern, slots, wait, lease, &worker)
                        .await
                })
            };
            let fetched = loop {
                tokio::select! {
                    joined = &mut fetch => break joined.unwrap_or_else(|error| {
                        Err(SourceError::Unavailable(format!("the fetch ended abnormally: {error}")))
                    }),
                    message = control.recv() => {
                        // A reload applies to the next fetch: this one goes on.
                        if message == Some(Control::Reload) {
                            self.reload(&mut gate);
                            restart_schedule(&mut scheduler, &self.source, self.settings());
                            continue;
                        }
                        abandoned.spawn(self.abandon(fetch));
                        if let Some(exit) = self.on_control(message, &mut quiet, &mut gate, &mut scheduler) {
                            break 'fetching exit;
                        }
                        continue 'fetching;
                    }
                    _ = version_changed.notified() => {
                        abandoned.spawn(self.abandon(fetch));
                        break 'fetching Exit::VersionChanged;
                    }
                }
            };
            let mode = self.source.fetch_mode();
            if logged_mode != Some(mode) {
                tracing::info!(mode = ?mode, server = %self.source.describe(), "fetch mode");
                logged_mode = Some(mode);
            }
            match fetched {
                Ok(jobs) => {
                    if backoff > Duration::from_secs(1) {
                        // The server answers again: spooled reports go now,
                        // while their leases hold.
                        shared.courier.notify_one();
                    }
                    backoff = Duration::from_secs(1);
                    for leased in jobs {
                        started += 1;
                        // A job is held only where holding is on; else it
                        // takes its slot, as the gate found room for it.
                        let place = match may_hold.then(|| worker_slots.take_or_hold()) {
                            Some(Err(hold)) => held::Place::Held(hold, held_gauge.enter()),
                            Some(Ok(slot)) => held::Place::Slot {
                                _slot: slot,
                                _running: shared.running.enter(),
                            },
                            None => held::Place::Slot {
                                _slot: worker_slots.take(),
                                _running: shared.running.enter(),
                            },
                        };
                        let task = job::JobTask {
                            place: std::sync::Mutex::new(place),
                            shared: Arc::clone(&shared),
                            generation: self.generation(),
                            job: leased,
                            stop: stop_workers.child_token(),
                        };
                        workers.spawn(task.run());
                    }
                }
                Err(error) => {
                    self.source.withdraw_offers();
                    let wait = jittered(backoff);
                    if matches!(error, SourceError::Unavailable(_)) {
                        tracing::warn!(%error, retry_in = ?wait, "cannot fetch jobs; trying again");
                    } else {
                        tracing::error!(%error, retry_in = ?wait, "job server refused the fetch; trying again");
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        message = control.recv() => {
                            if let Some(exit) = self.on_control(message, &mut quiet, &mut gate, &mut scheduler) {
                                break exit;
                            }
                        }
                        _ = version_changed.notified() => break Exit::VersionChanged,
                    }
                }
            }
        };

        // Drain: no more fetching. Jobs held ahead go back now; let running
        // jobs end, up to the drain timeout (a second drain request cuts it
        // short), then stop the rest and hand their jobs back.
        shared.release_held.cancel();
        // Frozen jobs could not finish: the drain thaws them now.
        shared.drained.cancel();
        shared.backoff.tick();
        self.source.withdraw_offers();
        let drain_timeout = self.settings().drain_timeout;
        tracing::info!(running = worker_slots.taken(), unreported = workers.len(), timeout = ?drain_timeout, reason = ?exit, "draining");
        board.gate("draining", gate.last_sample().map(|s| s.load1));
        // A sleep, not `now + timeout`: any configured length is fine.
        let deadline = tokio::time::sleep(drain_timeout);
        tokio::pin!(deadline);
        let mut control_open = true;
        let mut hurried = false;
        while !workers.is_empty() {
            tokio::select! {
                _ = workers.join_next() => {}
                _ = &mut deadline => break,
                message = control.recv(), if control_open => match message {
                    Some(Control::StopNow) | Some(Control::Drain) => {
                        tracing::info!("asked again: stopping running jobs now");
                        hurried = true;
                        break;
                    }
                    Some(_) => {}
                    None => control_open = false,
                },
            }
        }
        if !workers.is_empty() {
            tracing::warn!(
                running = worker_slots.taken(),
                unreported = workers.len(),
                "stopping jobs still running and handing them back"
            );
            shared.draining.store(true, Ordering::SeqCst);
            stop_workers.cancel();
            while workers.join_next().await.is_some() {}
        }
        // A fetch abandoned by the drain may still bring jobs: wait for its
        // answer (it lasts at most the poll wait) to hand them back, unless
        // asked again to stop now.
        if hurried && !abandoned.is_empty() {
            tracing::warn!(
                "asked again: not waiting for the fetch in flight; jobs it brings return when their lease lapses"
            );
            abandoned.abort_all();
        }
        if !abandoned.is_empty() {
            tracing::info!(
                "waiting for the fetch in flight to answer, to hand back any jobs it brings"
            );
        }
        // Bounded: an answer already on its way arrives within moments, so
        // the wait is short (an idle supervisor still stops promptly); a
        // fetch cut off then drops its connection, and the server puts back
        // whatever a claim takes for a requester that went away.
        let fetch_deadline =
            tokio::time::sleep((self.settings().poll_wait + FETCH_MARGIN).min(HANDBACK_GRACE));
        tokio::pin!(fetch_deadline);
        while !abandoned.is_empty() {
            tokio::select! {
                _ = abandoned.join_next() => {}
                _ = &mut fetch_deadline => {
                    tracing::warn!("the fetch in flight did not answer in time; jobs it brings return when their lease lapses");
                    abandoned.abort_all();
                    break;
                }
                message = control.recv(), if control_open => match message {
                    Some(Control::StopNow) | Some(Control::Drain) => {
                        tracing::warn!("asked again: not waiting for the fetch in flight; jobs it brings return when their lease lapses");
                        abandoned.abort_all();
                        break;
                    }
                    Some(_) => {}
                    None => control_open = false,
                },
            }
        }
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        if let Some(scheduler) = scheduler.take() {
            scheduler.abort();
        }
        // One last chance for spooled reports; what is left waits for the
        // next start.
        shared.courier.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        courier_stop.cancel();
        let _ = courier.await;
        tracing::info!(reason = ?exit, jobs_started = started, "supervisor stopped");
        Ok(exit)
    }

    /// Stops waiting for a fetch: cancels it where that strands nothing,
    /// and in any case hands back whatever jobs it still brings.
    fn abandon(
        &self,
        fetch: tokio::task::JoinHandle<Result<Vec<LeasedJob>, SourceError>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        if self.source.fetch_is_cancel_safe() {
            fetch.abort();
        }
        hand_back_when_answered(Arc::clone(&self.source), fetch)
    }

    /// Handles a control message while fetching; `Some` means "drain now".
    fn on_control(
        &self,
        message: Option<Control>,
        quiet: &mut bool,
        gate: &mut Gate,
        scheduler: &mut Option<tokio::task::JoinHandle<()>>,
    ) -> Option<Exit> {
        match message {
            Some(Control::Drain) | Some(Control::StopNow) | None => Some(Exit::Drained),
            Some(Control::Quiet) => {
                tracing::info!("quiet: no more jobs will be taken; running jobs continue");
                *quiet = true;
                None
            }
            Some(Control::Reload) => {
                self.reload(gate);
                restart_schedule(scheduler, &self.source, self.settings());
                None
            }
        }
    }

    fn reload(&self, gate: &mut Gate) {
        let Some(reload) = &self.reload else {
            tracing::info!("reload asked, but there is no configuration file to re-read");
            return;
        };
        let built = reload().map_err(|e| e.to_string()).and_then(|settings| {
            let settings = Arc::new(settings);
            let cgroups = self
                .host
                .cgroups
                .get()
                .cloned()
                .unwrap_or_else(|| Err("not prepared".into()));
            let mut generation = Generation::build(Arc::clone(&settings), &cgroups)?;
            generation.install_php_runner(&self.access)?;
            Ok((settings, generation))
        });
        match built {
            Ok((settings, generation)) => {
                gate.set_limits(settings.gate);
                if let Some(backoff) = self.host.backoff.get() {
                    backoff.configure(settings.backoff.clone());
                }
                tracing::info!(
                    job_name = %settings.job_name,
                    max_workers = settings.gate.max_workers,
                    timeout = ?settings.job.timeout,
                    "configuration reloaded; it applies to the next job"
                );
                generation.describe();
                *self.generation.write().unwrap_or_else(|e| e.into_inner()) =
                    Some(Arc::new(generation));
                *self.settings.write().unwrap_or_else(|e| e.into_inner()) = settings;
            }
            Err(error) => {
                tracing::error!(%error, "configuration not reloaded; keeping the current one")
            }
        }
    }
}

/// How long past its poll wait a drain waits for an abandoned fetch.
const FETCH_MARGIN: Duration = Duration::from_secs(5);

/// The longest a drain waits for an abandoned fetch to answer, whatever
/// the poll wait: long enough for an answer already sent to arrive on a
/// busy machine, short enough that stopping an idle supervisor is prompt.
const HANDBACK_GRACE: Duration = Duration::from_secs(5);

/// Waits for an abandoned fetch's answer and hands back every job it
/// brings ([`JobSource::hand_back`]: as it was before the hand-out, where
/// the server can), so that a fetch the supervisor stopped waiting for
/// never leaves jobs leased to nobody.
async fn hand_back_when_answered(
    source: Arc<dyn JobSource>,
    fetch: tokio::task::JoinHandle<Result<Vec<LeasedJob>, SourceError>>,
) {
    let Ok(Ok(jobs)) = fetch.await else {
        return;
    };
    for job in jobs {
        match source.hand_back(&job).await {
            Ok(()) => tracing::info!(
                job_id = job.id,
                job_name = %job.name,
                "handed back a job that arrived after the supervisor stopped taking jobs"
            ),
            Err(error) => tracing::warn!(
                job_id = job.id,
                job_name = %job.name,
                %error,
                "could not hand back a job that arrived after the supervisor stopped taking jobs; it returns when its lease lapses"
            ),
        }
    }
}

/// Starts syncing the declared jobs again (after a reload).
fn restart_schedule(
    task: &mut Option<tokio::task::JoinHandle<()>>,
    source: &Arc<dyn JobSource>,
    settings: Arc<Settings>,
) {
    if let Some(old) = task.take() {
        old.abort();
    }
    *task = Some(tokio::spawn(keep_schedule(Arc::clone(source), settings)));
}

/// Syncs the declared jobs, retrying while the server is unreachable.
async fn keep_schedule(source: Arc<dyn JobSource>, settings: Arc<Settings>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let Some(declared) = &settings.schedule else {
            return;
        };
        match schedule::sync(source.as_ref(), declared, &settings.state_dir).await {
            Ok(synced) => {
                if !(synced.declared.is_empty() && synced.removed.is_empty()) {
                    tracing::info!(declared = ?synced.declared, removed = ?synced.removed, unchanged = synced.unchanged.len(), "schedule synced");
                }
                if !synced.pending {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Err(error) => {
                let wait = jittered(backoff);
                tracing::warn!(%error, retry_in = ?wait, "cannot sync the declared jobs; trying again");
                backoff = (backoff * 2).min(Duration::from_secs(60));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// `base` ± 20 %.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.8 + rand::random::<f64>() * 0.4)
}

/// Delivers spooled reports whenever asked (a report was spooled, or the
/// server answered again), and on a backoff while any wait.
///
/// The backoff doubles with time, never with the number of reports spooled
/// meanwhile, and is at most a third of the lease (`retry_at_most`): a
/// spooled report's lease is no longer renewed, and a server that restarts
/// gives leases held before its crash one more term, so a report tried at
/// least three times a term lands before its lease lapses (which would
/// have its job run again).
async fn courier(shared: Arc<Shared>, stop: CancellationToken, retry_at_most: Duration) {
    let first = Duration::from_secs(1).min(retry_at_most);
    let mut backoff = first;
    loop {
        let blocked = deliver_spooled(&shared).await;
        if !blocked {
            backoff = first;
        }
        let wait = if blocked {
            jittered(backoff).min(retry_at_most)
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.courier.notified() => {}
            _ = tokio::time::sleep(wait) => {
                if blocked {
                    backoff = (backoff * 2).min(retry_at_most);
                }
            }
        }
    }
}

/// Tries every spooled report, oldest first; returns whether the server was
/// unreachable (the rest then wait).
async fn deliver_spooled(shared: &Shared) -> bool {
    let pending = match shared.spool.pending() {
        Ok(pending) => pending,
        Err(error) => {
            tracing::error!(%error, dir = %shared.spool.dir().display(), "cannot read the report spool");
            Vec::new()
        }
    };
    for (path, spooled) in &pending {
        match shared
            .source
            .report_run(
                spooled.job_id,
                spooled.lease.as_deref(),
                &spooled.report,
                spooled.run.as_ref(),
            )
            .await
        {
            Ok(()) => {
                tracing::info!(job_id = spooled.job_id, job_name = %spooled.job_name, report = spooled.report.kind(), "spooled report delivered");
                shared.spool.remove(path);
            }
            Err(SourceError::Unavailable(error)) => {
                tracing::debug!(%error, "server still unavailable; spooled reports wait");
                return true;
            }
            Err(error) => {
                tracing::warn!(job_id = spooled.job_id, job_name = %spooled.job_name, %error, "server refused a spooled report; dropping it");
                shared.spool.remove(path);
            }
        }
    }
    false
}

/// Notifies once the file at `path` changes (contents replaced, modified,
/// created or removed), checking every two seconds.
async fn watch_version(path: std::path::PathBuf, changed: Arc<Notify>) {
    let stamp = |path: &std::path::Path| {
        std::fs::metadata(path).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.ino(), m.len(), m.mtime(), m.mtime_nsec())
        })
    };
    let first = stamp(&path);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if stamp(&path) != first {
            tracing::info!(path = %path.display(), "version watch file changed; draining to restart");
            changed.notify_one();
            return;
        }
    }
}
