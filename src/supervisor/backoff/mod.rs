//! The back-off: jobs yield to the site when it is pressed. Once a second
//! the pressure signal ([`pressure`]) is read; at or above the pause
//! threshold the gate takes no new job (see [`Backoff::over`]), at or above
//! the freeze threshold every running job is frozen (its v2 cgroup's
//! `cgroup.freeze`, else SIGSTOP to its process group), and frozen jobs
//! thaw once the signal falls below the pause threshold ([`policy`]). A job
//! frozen `max-freeze` in one stretch is thawed anyway and spared for as
//! long again. A frozen job keeps its lease (its renewals are the
//! supervisor's, not the worker's), its timeout is extended by the time it
//! spent frozen, it is thawed before it is stopped, and a drain thaws every
//! job of its pool.

pub mod policy;
pub mod pressure;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal as Sig;
use tokio_util::sync::CancellationToken;

use super::cgroup::JobCgroup;
use super::gate::{LoadSample, LoadSource};
use super::status::{BackoffStatus, OnBoard, StatusBoard};
use policy::{FreezeClock, Hysteresis, Step, Thresholds};
use pressure::Signal;

/// How often the signal is read (the kernel moves `avg10` every 2 s).
pub const TICK: Duration = Duration::from_secs(1);

/// The back-off's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffSettings {
    /// What is read, or why nothing is (no PSI).
    pub signal: Result<Signal, String>,
    /// When to pause and freeze.
    pub thresholds: Thresholds,
    /// The longest one freeze of a job lasts.
    pub max_freeze: Duration,
    /// Where pressure is read instead of the kernel's places (tests,
    /// containers).
    pub pressure_dir: Option<std::path::PathBuf>,
}

impl BackoffSettings {
    /// The signal, when there is one and a threshold to compare it with.
    fn active(&self) -> Option<&Signal> {
        let any = self.thresholds.pause.is_some() || self.thresholds.freeze.is_some();
        self.signal.as_ref().ok().filter(|_| any)
    }

    /// What the back-off does, for the start-up line.
    pub fn describe(&self) -> String {
        let pct = |p: Option<f64>| p.map_or("off".to_string(), |p| format!("{p:.2}%"));
        match (&self.signal, self.active()) {
            (Err(why), _) => format!("off: {why}"),
            (Ok(_), None) => "off: pause-pressure and freeze-pressure are both off".into(),
            (Ok(_), Some(signal)) => format!(
                "following {}: pause at {}, freeze at {} (thaw below {}), max-freeze {}",
                signal.describe(),
                pct(self.thresholds.pause),
                pct(self.thresholds.freeze),
                pct(self.thresholds.thaw_below()),
                crate::config::HumanDuration(self.max_freeze)
            ),
        }
    }
}

/// The back-off of one process, shared by its pools.
#[derive(Clone)]
pub struct Backoff {
    inner: Arc<Inner>,
}

struct Inner {
    settings: RwLock<BackoffSettings>,
    jobs: Mutex<Vec<Arc<JobFreeze>>>,
    state: Mutex<State>,
    board: StatusBoard,
    /// Milliseconds that jobs no longer under the back-off spent frozen.
    thawed_ms: AtomicU64,
    /// The most milliseconds frozen reported so far (the counter's value).
    reported_ms: AtomicU64,
}

#[derive(Default)]
struct State {
    hysteresis: Hysteresis,
    /// The last reading, percent.
    percent: Option<f64>,
    /// The last error, said once until the signal reads again.
    error: Option<String>,
}

impl Backoff {
    /// The back-off with these settings, its first reading taken (so that
    /// the gate's first check knows it), and its ticks started.
    pub fn start(settings: BackoffSettings, board: StatusBoard) -> Self {
        let thresholds = settings.thresholds;
        if settings.signal.is_err() && (thresholds.pause.is_some() || thresholds.freeze.is_some()) {
            tracing::warn!("back-off {}", settings.describe());
        } else {
            tracing::info!("back-off {}", settings.describe());
        }
        let backoff = Backoff {
            inner: Arc::new(Inner {
                settings: RwLock::new(settings),
                jobs: Mutex::default(),
                state: Mutex::default(),
                board,
                thawed_ms: AtomicU64::new(0),
                reported_ms: AtomicU64::new(0),
            }),
        };
        backoff.tick();
        let weak = Arc::downgrade(&backoff.inner);
        tokio::spawn(keep_ticking(weak));
        backoff
    }

    /// New settings (after a reload), applied at once.
    pub fn configure(&self, settings: BackoffSettings) {
        let changed = {
            let mut current = self
                .inner
                .settings
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let changed = *current != settings;
            *current = settings;
            changed
        };
        if changed {
            tracing::info!(
                "back-off {}",
                self.inner
                    .settings
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .describe()
            );
            self.tick();
        }
    }

    /// `load` with the site's pressure in its readings, for the gate.
    pub fn over(&self, load: Arc<dyn LoadSource>) -> Arc<dyn LoadSource> {
        Arc::new(Pressed {
            load,
            backoff: self.clone(),
        })
    }

    /// The last reading, percent, while the back-off is on.
    pub fn percent(&self) -> Option<f64> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .percent
    }

    /// Puts a job under the back-off until the returned guard is dropped.
    /// `drained` thaws it for good (its pool's drain).
    pub fn register(&self, job: JobFacts, drained: CancellationToken) -> Registered {
        let freeze = Arc::new(JobFreeze {
            job_id: job.id,
            name: job.name,
            tree: job.tree,
            on_board: job.on_board,
            drained,
            pid: AtomicU32::new(0),
            clock: Mutex::default(),
            way: Mutex::new(None),
        });
        self.inner
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&freeze));
        Registered {
            backoff: self.clone(),
            freeze,
        }
    }

    /// Reads the signal and freezes or thaws jobs accordingly; the ticker
    /// calls it every [`TICK`], a drain at once.
    pub fn tick(&self) {
        let now = Instant::now();
        let settings = self
            .inner
            .settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let reading = settings.active().map(Signal::read);
        let (percent, freezing, was) = {
            let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            let percent = match reading {
                Some(Ok(reading)) => {
                    if state.error.take().is_some() {
                        tracing::info!(pressure = reading.percent, "site pressure readable again");
                    }
                    Some(reading.percent)
                }
                Some(Err(error)) => {
                    let error = error.to_string();
                    if state.error.as_ref() != Some(&error) {
                        tracing::warn!(%error, "cannot read the pressure; not pausing or freezing jobs until it can be read");
                    }
                    state.error = Some(error);
                    None
                }
                None => None,
            };
            let was = state.hysteresis.freezing();
            let freezing = state.hysteresis.update(percent, &settings.thresholds);
            state.percent = percent;
            (percent, freezing, was)
        };
        let jobs: Vec<Arc<JobFreeze>> = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if freezing != was {
            let pressure = percent.map_or("unknown".to_string(), |p| format!("{p:.2}%"));
            if freezing {
                tracing::warn!(
                    running = jobs.len(),
                    "site pressure {pressure} is at or above freeze-pressure: freezing running jobs"
                );
            } else {
                tracing::info!(
                    running = jobs.len(),
                    "site pressure {pressure} fell below the thaw threshold: thawing jobs"
                );
            }
        }
        for job in &jobs {
            job.tick(freezing, now, settings.max_freeze);
        }
        self.report(&settings, &jobs, percent, freezing, now);
    }

    /// Metrics and the status board.
    fn report(
        &self,
        settings: &BackoffSettings,
        jobs: &[Arc<JobFreeze>],
        percent: Option<f64>,
        freezing: bool,
        now: Instant,
    ) {
        let mut frozen = 0;
        let mut total_ms = self.inner.thawed_ms.load(Ordering::SeqCst);
        for job in jobs {
            let clock = *job.clock.lock().unwrap_or_else(|e| e.into_inner());
            frozen += usize::from(clock.frozen());
            total_ms += clock.frozen_for(now).as_millis() as u64;
            job.on_board.frozen(clock.frozen(), clock.frozen_for(now));
            if let Some(starved) = job.tree.as_ref().and_then(|t| t.starved_now()) {
                job.on_board.starved(starved);
            }
        }
        // A job that ends between the two reads above may count twice for
        // a moment: the total only ever grows.
        let total_ms = self
            .inner
            .reported_ms
            .fetch_max(total_ms, Ordering::SeqCst)
            .max(total_ms);
        crate::metrics::backoff(percent, frozen, total_ms);
        let active = settings.active().is_some();
        let state = match () {
            _ if !active => "off",
            _ if percent.is_none() => "unreadable",
            _ if freezing => "freezing",
            _ if percent.is_some_and(|p| settings.thresholds.pauses(p)) => "paused",
            _ => "calm",
        };
        self.inner.board.backoff(BackoffStatus {
            state: state.into(),
            signal: match &settings.signal {
                Ok(signal) => signal.describe(),
                Err(why) => format!("none: {why}"),
            },
            pressure: percent,
            pause: settings.thresholds.pause,
            freeze: settings.thresholds.freeze,
            thaw_below: settings.thresholds.thaw_below(),
            max_freeze_ms: settings.max_freeze.as_millis() as u64,
            frozen,
        });
    }
}

/// Ticks while the back-off lives.
async fn keep_ticking(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let backoff = Backoff { inner };
        // Small files of /proc and the cgroup tree: read in place, as the
        // gate reads its own.
        backoff.tick();
    }
}

/// What the back-off knows of a job.
pub struct JobFacts {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its cgroups, when it has them.
    pub tree: Option<Arc<JobCgroup>>,
    /// Its place on the status board.
    pub on_board: Arc<OnBoard>,
}

/// How a job was frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Its v2 cgroup's `cgroup.freeze`.
    Cgroup,
    /// SIGSTOP to its process group.
    Stop,
}

/// A job under the back-off.
pub struct JobFreeze {
    job_id: i64,
    name: String,
    tree: Option<Arc<JobCgroup>>,
    on_board: Arc<OnBoard>,
    drained: CancellationToken,
    /// The worker's pid (its process group), once it is started; 0 before.
    pid: AtomicU32,
    clock: Mutex<FreezeClock>,
    way: Mutex<Option<Way>>,
}

impl std::fmt::Debug for JobFreeze {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobFreeze")
            .field("job_id", &self.job_id)
            .field("pid", &self.pid)
            .field("clock", &self.clock)
            .finish()
    }
}

impl JobFreeze {
    /// Records the worker's pid: from now on it may be frozen (never
    /// before, so that no worker is frozen while the spawner starts it).
    pub fn started(&self, pid: u32) {
        self.pid.store(pid, Ordering::SeqCst);
    }

    /// The time the job spent frozen so far: its timeout is extended by it.
    pub fn frozen_for(&self) -> Duration {
        self.clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .frozen_for(Instant::now())
    }

    /// The job ends (it exited, or is about to be stopped): it is thawed
    /// now if frozen, so that a SIGTERM reaches it, and never frozen again.
    pub fn end(&self) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.end();
        if clock.frozen() {
            self.thaw(&mut clock, Instant::now(), None);
        }
    }

    fn tick(&self, freezing: bool, now: Instant, max_freeze: Duration) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        if self.drained.is_cancelled() {
            clock.end();
        }
        let started = self.pid.load(Ordering::SeqCst) != 0;
        match clock.step(freezing && started, now, max_freeze) {
            Step::Stay => {}
            Step::Freeze => match self.freeze() {
                Ok(way) => {
                    *self.way.lock().unwrap_or_else(|e| e.into_inner()) = Some(way);
                    clock.froze(now);
                    tracing::info!(job_id = self.job_id, job_name = %self.name, how = ?way, "job frozen");
                }
                Err(error) => {
                    tracing::warn!(job_id = self.job_id, job_name = %self.name, %error, "cannot freeze the job")
                }
            },
            Step::Thaw => self.thaw(&mut clock, now, None),
            Step::ThawOverdue => {
                tracing::warn!(
                    job_id = self.job_id,
                    job_name = %self.name,
                    max_freeze = %crate::config::HumanDuration(max_freeze),
                    "job frozen for max-freeze although the site is still pressed: thawed, and not frozen again for as long"
                );
                crate::metrics::thawed_overdue();
                self.thaw(&mut clock, now, Some(max_freeze));
            }
        }
    }

    /// Freezes the worker: its v2 cgroup where it has one, else its process
    /// group. Never the parent directory: a worker being started into a
    /// frozen parent would stop the spawner with it.
    fn freeze(&self) -> std::io::Result<Way> {
        if let Some(tree) = &self.tree
            && tree.freeze()?
        {
            return Ok(Way::Cgroup);
        }
        let pid = self.pid.load(Ordering::SeqCst);
        signal_group(pid, Sig::SIGSTOP)?;
        Ok(Way::Stop)
    }

    fn thaw(&self, clock: &mut FreezeClock, now: Instant, spare: Option<Duration>) {
        let way = self.way.lock().unwrap_or_else(|e| e.into_inner()).take();
        let thawed = match way {
            Some(Way::Cgroup) => self
                .tree
                .as_ref()
                .map_or(Ok(false), |t| t.thaw())
                .map(|_| ()),
            Some(Way::Stop) | None => signal_group(self.pid.load(Ordering::SeqCst), Sig::SIGCONT),
        };
        if let Err(error) = thawed {
            tracing::warn!(job_id = self.job_id, job_name = %self.name, %error, "cannot thaw the job");
        }
        let stretch = clock.thawed(now, spare);
        self.on_board.frozen(false, clock.frozen_for(now));
        tracing::info!(job_id = self.job_id, job_name = %self.name, frozen = ?stretch, "job thawed");
    }
}

/// Signals a worker's process group (its pgid is its pid).
fn signal_group(pid: u32, signal: Sig) -> std::io::Result<()> {
    if pid == 0 {
        return Err(std::io::Error::other("the worker is not started"));
    }
    match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// A job under the back-off; dropped, it is thawed and forgotten.
pub struct Registered {
    backoff: Backoff,
    freeze: Arc<JobFreeze>,
}

impl Registered {
    /// The job's freezes, for its run (the timeout, the stop).
    pub fn freeze(&self) -> Arc<JobFreeze> {
        Arc::clone(&self.freeze)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.freeze.end();
        let frozen = self.freeze.frozen_for();
        let inner = &self.backoff.inner;
        let mut jobs = inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.retain(|j| !Arc::ptr_eq(j, &self.freeze));
        inner
            .thawed_ms
            .fetch_add(frozen.as_millis() as u64, Ordering::SeqCst);
    }
}

/// The machine's readings with the site's pressure in them.
struct Pressed {
    load: Arc<dyn LoadSource>,
    backoff: Backoff,
}

impl LoadSource for Pressed {
    fn sample(&self) -> std::io::Result<LoadSample> {
        let mut sample = self.load.sample()?;
        sample.site_pressure = self.backoff.percent();
        Ok(sample)
    }

    fn forget(&self) {
        self.load.forget();
    }
}
