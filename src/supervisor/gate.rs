//! The gate in front of every fetch: is there room for more workers? It
//! looks at the 1-minute load average (optionally per CPU), the memory
//! available, optionally the CPU pressure (PSI `some avg10`, which does not
//! lag as the load average does), a hard cap on concurrent workers, and a
//! ramp that lets concurrency grow only step by step, because the load
//! average lags behind the work just started. The load is read through
//! `sysinfo` and memory from `/proc/meminfo`, or both from files in `/proc`
//! format when told (lxcfs in containers, tests). The supervisor reuses a
//! reading for [`READING_REUSED_FOR`] ([`RecentLoad`]) rather than reading
//! `/proc` before every fetch.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One reading of the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSample {
    /// The 1-minute load average.
    pub load1: f64,
    /// Memory available for new work, in bytes.
    pub available_memory: u64,
    /// CPU pressure, PSI `some avg10` (the share of the last 10 s in which
    /// some task waited for a CPU, in percent); `None` without a reading
    /// (no pressure gate, or a kernel without PSI).
    pub cpu_pressure: Option<f64>,
    /// The site's pressure, as the back-off last read it (percent); `None`
    /// while the back-off is off or cannot read it.
    pub site_pressure: Option<f64>,
}

/// Where readings come from. The real one reads `/proc`; tests point it at
/// files of their own.
pub trait LoadSource: Send + Sync {
    /// Takes a reading.
    fn sample(&self) -> std::io::Result<LoadSample>;

    /// Drops a reading kept for reuse, if any, so that the next
    /// [`LoadSource::sample`] reads the machine. The gate calls it when a
    /// reading closes it, so that it opens again as soon as the machine
    /// allows, not a reuse later.
    fn forget(&self) {}
}

/// The kernel's load average file, read through `sysinfo`.
pub const LOADAVG: &str = "/proc/loadavg";
/// The kernel's memory file.
pub const MEMINFO: &str = "/proc/meminfo";
/// The kernel's CPU pressure file (PSI), where the kernel has it.
pub const CPU_PRESSURE: &str = "/proc/pressure/cpu";

/// The machine's readings: the load through `sysinfo` (the same value as
/// `/proc/loadavg`) and `/proc/meminfo`'s `MemAvailable`, or from other
/// files in their format (as lxcfs provides
/// in containers, and tests write); CPU pressure from a file in
/// `/proc/pressure/cpu` format, when asked for.
#[derive(Debug, Clone)]
pub struct ProcLoad {
    /// A file in `/proc/loadavg` format; [`LOADAVG`] means "through sysinfo".
    pub loadavg: PathBuf,
    /// A file in `/proc/meminfo` format ([`MEMINFO`] by default).
    pub meminfo: PathBuf,
    /// A file in `/proc/pressure/cpu` format, read only when set (the
    /// pressure gate is on); missing, it gives no reading.
    pub cpu_pressure: Option<PathBuf>,
}

impl Default for ProcLoad {
    fn default() -> Self {
        ProcLoad {
            loadavg: LOADAVG.into(),
            meminfo: MEMINFO.into(),
            cpu_pressure: None,
        }
    }
}

impl LoadSource for ProcLoad {
    fn sample(&self) -> std::io::Result<LoadSample> {
        let (load1, available_memory) = (self.load1()?, self.available_memory()?);
        let cpu_pressure = match &self.cpu_pressure {
            Some(path) => read_cpu_pressure(path)?,
            None => None,
        };
        Ok(LoadSample {
            load1,
            available_memory,
            cpu_pressure,
            site_pressure: None,
        })
    }
}

impl ProcLoad {
    fn load1(&self) -> std::io::Result<f64> {
        if self.loadavg == Path::new(LOADAVG) {
            return Ok(sysinfo::System::load_average().one);
        }
        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let loadavg = read_small(&self.loadavg)?;
        let load1 = loadavg
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| invalid(format!("{} has no load average", self.loadavg.display())))?;
        Ok(load1)
    }

    fn available_memory(&self) -> std::io::Result<u64> {
        // Read directly, `/proc/meminfo` included: a `sysinfo::System` made
        // for each reading cost more than the rest of the gate's check.
        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let meminfo = read_small(&self.meminfo)?;
        let available_kib = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemAvailable:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                invalid(format!(
                    "{} has no MemAvailable line",
                    self.meminfo.display()
                ))
            })?;
        Ok(available_kib.saturating_mul(1024))
    }
}

/// How long a reading of the machine serves before it is taken again: far
/// below the kernel's own steps (the load average moves every 5 s, CPU
/// pressure's `avg10` every 2 s) and below the time a starting job takes to
/// grow, yet at hundreds of jobs a second it spares nearly every read of
/// `/proc/meminfo` and `/proc/loadavg`, about 7 % of the supervisor's CPU
/// per job when jobs come one at a time. (A fetch that then waits in its
/// long poll starts what it brings seconds after the reading anyway.) A
/// reading that closes the gate is not reused: see [`LoadSource::forget`].
pub const READING_REUSED_FOR: Duration = Duration::from_millis(100);

/// A [`LoadSource`] whose readings are reused while they are younger than
/// `fresh_for`; a failed reading is not kept, so the next check reads again.
#[derive(Debug)]
pub struct RecentLoad<S> {
    source: S,
    fresh_for: Duration,
    last: std::sync::Mutex<Option<(Instant, LoadSample)>>,
}

impl<S: LoadSource> RecentLoad<S> {
    /// Readings of `source`, each reused for `fresh_for`.
    pub fn new(source: S, fresh_for: Duration) -> Self {
        RecentLoad {
            source,
            fresh_for,
            last: std::sync::Mutex::new(None),
        }
    }
}

impl<S: LoadSource> RecentLoad<S> {
    /// The reading as of `now`: the kept one while it is younger than
    /// `fresh_for`, else a new one (kept if it succeeded).
    fn sample_at(&self, now: Instant) -> std::io::Result<LoadSample> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, sample)) = *last
            && now.saturating_duration_since(at) < self.fresh_for
        {
            return Ok(sample);
        }
        let sample = self.source.sample();
        *last = sample.as_ref().ok().map(|s| (now, *s));
        sample
    }
}

impl<S: LoadSource> LoadSource for RecentLoad<S> {
    fn sample(&self) -> std::io::Result<LoadSample> {
        self.sample_at(Instant::now())
    }

    fn forget(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A small file read whole, with room for 4 KiB from the start: `/proc`
/// files say they are empty, so `fs::read_to_string` asks the size
/// (`statx`, `lseek`) and then reads from 32 bytes up, a read per doubling
/// (seven for `/proc/meminfo`). Through `take`, which
/// gives no size hint, it is two reads. Bytes that are not UTF-8 are
/// `InvalidData`.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(4096);
    std::fs::File::open(path)?
        .take(u64::MAX)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The `some avg10` of a file in `/proc/pressure/cpu` format; `None` when
/// the file does not exist (a kernel without PSI).
pub fn read_cpu_pressure(path: &Path) -> std::io::Result<Option<f64>> {
    let text = match read_small(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    text.lines()
        .find_map(|line| line.strip_prefix("some "))
        .and_then(|rest| {
            rest.split_whitespace()
                .find_map(|field| field.strip_prefix("avg10="))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(Some)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} has no \"some avg10=\" reading", path.display()),
            )
        })
}

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateLimits {
    /// The highest 1-minute load average at which new work starts.
    pub max_load: f64,
    /// The least available memory, in bytes, at which new work starts.
    pub min_available_memory: u64,
    /// The CPU pressure (percent, `some avg10`) at or above which no new
    /// work starts; `None`: no pressure gate.
    pub max_cpu_pressure: Option<f64>,
    /// The site's pressure (the back-off's signal, percent) at or above
    /// which no new work starts; `None`: no pause.
    pub pause_pressure: Option<f64>,
    /// The most workers at once, whatever the load.
    pub max_workers: usize,
    /// How many more concurrent workers are allowed each second, starting
    /// from this many.
    pub ramp: usize,
    /// How many jobs may be held ahead while every slot is taken (see
    /// `slots`); 0: none.
    pub fetch_ahead: usize,
    /// How long a job may be held before it goes back to the queue.
    pub fetch_ahead_hold: Duration,
}

impl GateLimits {
    /// Whether the machine, as `sample` reads it, allows more work: the
    /// load, CPU pressure and memory limits, without the worker cap or the
    /// ramp. A job held ahead asks this again when it gets its slot.
    pub fn machine_allows(&self, sample: &LoadSample) -> Result<(), Closed> {
        if sample.load1 >= self.max_load {
            return Err(Closed::Load {
                load: sample.load1,
                max: self.max_load,
            });
        }
        if let (Some(pressure), Some(max)) = (sample.cpu_pressure, self.max_cpu_pressure)
            && pressure >= max
        {
            return Err(Closed::Pressure { pressure, max });
        }
        if let (Some(pressure), Some(pause)) = (sample.site_pressure, self.pause_pressure)
            && pressure >= pause
        {
            return Err(Closed::SitePressure { pressure, pause });
        }
        if sample.available_memory < self.min_available_memory {
            return Err(Closed::Memory {
                available: sample.available_memory,
                floor: self.min_available_memory,
            });
        }
        Ok(())
    }
}

/// Why no more work starts now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Closed {
    /// The load average is at or above the limit.
    Load {
        /// The reading.
        load: f64,
        /// The limit.
        max: f64,
    },
    /// CPU pressure is at or above the limit.
    Pressure {
        /// The reading, percent.
        pressure: f64,
        /// The limit, percent.
        max: f64,
    },
    /// The site's pressure is at or above the pause threshold.
    SitePressure {
        /// The reading, percent.
        pressure: f64,
        /// The threshold, percent.
        pause: f64,
    },
    /// Available memory is below the floor.
    Memory {
        /// The reading, in bytes.
        available: u64,
        /// The floor, in bytes.
        floor: u64,
    },
    /// Every worker slot is taken.
    Full {
        /// Workers running.
        running: usize,
    },
    /// Concurrency is still ramping up.
    Ramp {
        /// Workers running.
        running: usize,
        /// The current ceiling.
        ceiling: usize,
    },
    /// The machine could not be read; nothing starts until it can.
    Unreadable,
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Load { load, max } => {
                write!(f, "load {load:.2} is at or above max-load {max:.2}")
            }
            Closed::Pressure { pressure, max } => write!(
                f,
                "CPU pressure {pressure:.2}% is at or above max-cpu-pressure {max:.2}%"
            ),
            Closed::SitePressure { pressure, pause } => write!(
                f,
                "site pressure {pressure:.2}% is at or above pause-pressure {pause:.2}%"
            ),
            Closed::Memory { available, floor } => write!(
                f,
                "available memory {} MiB is below the floor of {} MiB",
                available / (1024 * 1024),
                floor / (1024 * 1024)
            ),
            Closed::Full { running } => write!(f, "all {running} worker slots are busy"),
            Closed::Ramp { running, ceiling } => {
                write!(
                    f,
                    "ramping up: {running} running, ceiling {ceiling} for now"
                )
            }
            Closed::Unreadable => write!(f, "cannot read the load or memory"),
        }
    }
}

impl Closed {
    /// A short name for logs and metrics: `load`, `pressure`,
    /// `site_pressure`, `memory`, `full`, `ramp`, `unreadable`.
    pub fn name(&self) -> &'static str {
        match self {
            Closed::Load { .. } => "load",
            Closed::Pressure { .. } => "pressure",
            Closed::SitePressure { .. } => "site_pressure",
            Closed::Memory { .. } => "memory",
            Closed::Full { .. } => "full",
            Closed::Ramp { .. } => "ramp",
            Closed::Unreadable => "unreadable",
        }
    }
}

/// The gate: decides how many jobs may start now.
#[derive(Debug, Clone)]
pub struct Gate {
    limits: GateLimits,
    ceiling: usize,
    last_raise: Instant,
    last_sample: Option<LoadSample>,
}

impl Gate {
    /// A gate with these limits; the ramp starts at `limits.ramp`.
    pub fn new(limits: GateLimits) -> Self {
        let ramp = limits.ramp.max(1);
        Gate {
            limits: GateLimits { ramp, ..limits },
            ceiling: ramp.min(limits.max_workers.max(1)),
            last_raise: Instant::now(),
            last_sample: None,
        }
    }

    /// Changes the limits (after a configuration reload).
    pub fn set_limits(&mut self, limits: GateLimits) {
        let ramp = limits.ramp.max(1);
        self.limits = GateLimits { ramp, ..limits };
        self.ceiling = self.ceiling.min(self.limits.max_workers.max(1));
    }

    /// The reading the last check judged by (taken then, or reused).
    pub fn last_sample(&self) -> Option<LoadSample> {
        self.last_sample
    }

    /// How many jobs may start with `running` workers busy, or why none.
    pub fn check(
        &mut self,
        running: usize,
        load: &dyn LoadSource,
        now: Instant,
    ) -> Result<usize, Closed> {
        let sample = match load.sample() {
            Ok(sample) => sample,
            Err(error) => {
                tracing::warn!(%error, "cannot read the machine's load");
                return Err(Closed::Unreadable);
            }
        };
        self.last_sample = Some(sample);
        let max_workers = self.limits.max_workers.max(1);
        if let Err(closed) = self.limits.machine_allows(&sample) {
            if matches!(
                closed,
                Closed::Load { .. } | Closed::Pressure { .. } | Closed::SitePressure { .. }
            ) {
                // The machine is busy: the ramp starts again from what runs now.
                self.ceiling = running.max(self.limits.ramp).min(max_workers);
                self.last_raise = now;
            }
            load.forget();
            return Err(closed);
        }
        if running >= max_workers {
            return Err(Closed::Full { running });
        }
        // Raise the ceiling by `ramp` for each whole second since the last
        // raise, while the load stays under the limit.
        let seconds = now.saturating_duration_since(self.last_raise).as_secs() as usize;
        if seconds > 0 {
            self.ceiling = self
                .ceiling
                .saturating_add(seconds.saturating_mul(self.limits.ramp))
                .min(max_workers);
            self.last_raise += Duration::from_secs(seconds as u64);
        }
        if running >= self.ceiling {
            return Err(Closed::Ramp {
                running,
                ceiling: self.ceiling,
            });
        }
        Ok(self.ceiling - running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Fixed(Mutex<LoadSample>);

    impl LoadSource for Fixed {
        fn sample(&self) -> std::io::Result<LoadSample> {
            Ok(*self.0.lock().unwrap())
        }
    }

    fn limits() -> GateLimits {
        GateLimits {
            max_load: 4.0,
            min_available_memory: 100,
            max_cpu_pressure: Some(50.0),
            pause_pressure: Some(10.0),
            max_workers: 10,
            ramp: 2,
            fetch_ahead: 0,
            fetch_ahead_hold: Duration::from_secs(1),
        }
    }

    /// A reading without CPU pressure.
    fn reading(load1: f64, available_memory: u64) -> LoadSample {
        LoadSample {
            load1,
            available_memory,
            cpu_pressure: None,
            site_pressure: None,
        }
    }

    fn machine(load1: f64, mem: u64) -> Fixed {
        Fixed(Mutex::new(reading(load1, mem)))
    }

    #[test]
    fn high_load_and_low_memory_close_the_gate() {
        let mut gate = Gate::new(limits());
        let now = Instant::now();
        assert!(matches!(
            gate.check(0, &machine(4.0, 1000), now),
            Err(Closed::Load { .. })
        ));
        assert!(matches!(
            gate.check(0, &machine(1.0, 99), now),
            Err(Closed::Memory { .. })
        ));
        assert_eq!(gate.check(0, &machine(1.0, 1000), now), Ok(2));
    }

    #[test]
    fn the_ramp_raises_the_ceiling_each_second_up_to_the_cap() {
        let mut gate = Gate::new(limits());
        let t0 = Instant::now();
        let idle = machine(0.1, 1000);
        assert_eq!(
            gate.check(2, &idle, t0),
            Err(Closed::Ramp {
                running: 2,
                ceiling: 2
            })
        );
        assert_eq!(
            gate.check(2, &idle, t0 + Duration::from_millis(1500)),
            Ok(2)
        );
        assert_eq!(gate.check(2, &idle, t0 + Duration::from_secs(30)), Ok(8));
        assert_eq!(
            gate.check(10, &idle, t0 + Duration::from_secs(31)),
            Err(Closed::Full { running: 10 })
        );
    }

    #[test]
    fn high_load_resets_the_ramp_to_what_runs() {
        let mut gate = Gate::new(limits());
        let t0 = Instant::now();
        assert_eq!(
            gate.check(0, &machine(0.1, 1000), t0 + Duration::from_secs(30)),
            Ok(10)
        );
        assert!(
            gate.check(5, &machine(9.0, 1000), t0 + Duration::from_secs(31))
                .is_err()
        );
        assert_eq!(
            gate.check(5, &machine(0.1, 1000), t0 + Duration::from_secs(31)),
            Err(Closed::Ramp {
                running: 5,
                ceiling: 5
            })
        );
    }

    /// A machine whose reading a test sets; it counts how often it is
    /// read, and fails while `failing` is set.
    struct Counted {
        now: Mutex<LoadSample>,
        reads: std::sync::atomic::AtomicUsize,
        failing: std::sync::atomic::AtomicBool,
    }

    impl LoadSource for Counted {
        fn sample(&self) -> std::io::Result<LoadSample> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::other("unreadable"));
            }
            Ok(*self.now.lock().unwrap())
        }
    }

    /// `Counted` behind a `RecentLoad` that keeps readings for `fresh_for`.
    fn reused(load1: f64, available_memory: u64, fresh_for: Duration) -> RecentLoad<Counted> {
        RecentLoad::new(
            Counted {
                now: Mutex::new(reading(load1, available_memory)),
                reads: Default::default(),
                failing: Default::default(),
            },
            fresh_for,
        )
    }

    impl RecentLoad<Counted> {
        fn set(&self, load1: f64, available_memory: u64) {
            *self.source.now.lock().unwrap() = reading(load1, available_memory);
        }

        fn set_failing(&self, failing: bool) {
            self.source
                .failing
                .store(failing, std::sync::atomic::Ordering::SeqCst);
        }

        fn reads(&self) -> usize {
            self.source.reads.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[test]
    fn a_recent_reading_is_reused_and_an_old_one_taken_again() {
        let load = reused(0.0, 1000, Duration::from_secs(3600));
        let first = load.sample().unwrap();
        load.set(1.0, 1000);
        assert_eq!(load.sample().unwrap(), first);
        assert_eq!(load.reads(), 1);

        let never = reused(0.0, 1000, Duration::ZERO);
        assert_eq!(never.sample().unwrap().load1, 0.0);
        never.set(1.0, 1000);
        assert_eq!(never.sample().unwrap().load1, 1.0);
        assert_eq!(never.reads(), 2);
    }

    #[test]
    fn a_reading_serves_until_it_is_fresh_for_old_then_the_new_one_does() {
        let load = reused(0.0, 1000, Duration::from_millis(100));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(load.sample_at(t0).unwrap().load1, 0.0);
        load.set(1.0, 1000);
        assert_eq!(load.sample_at(t0 + ms(99)).unwrap().load1, 0.0);
        assert_eq!(load.sample_at(t0 + ms(100)).unwrap().load1, 1.0);
        load.set(2.0, 1000);
        assert_eq!(load.sample_at(t0 + ms(150)).unwrap().load1, 1.0);
        assert_eq!(load.sample_at(t0 + ms(199)).unwrap().load1, 1.0);
        assert_eq!(load.sample_at(t0 + ms(200)).unwrap().load1, 2.0);
        assert_eq!(load.reads(), 3);
    }

    #[test]
    fn a_reading_that_closes_the_gate_is_not_reused_and_one_that_opens_it_is() {
        let t0 = Instant::now() + Duration::from_secs(30);

        // Closed by the load, then by memory: each next check reads again.
        let load = reused(9.0, 1000, Duration::from_secs(3600));
        let mut gate = Gate::new(limits());
        assert!(matches!(gate.check(0, &load, t0), Err(Closed::Load { .. })));
        load.set(1.0, 99);
        assert!(matches!(
            gate.check(0, &load, t0),
            Err(Closed::Memory { .. })
        ));
        load.set(1.0, 1000);
        assert!(gate.check(0, &load, t0).is_ok());
        assert_eq!(load.reads(), 3);

        // Open: the reading is reused, even when the machine changed since.
        load.set(9.0, 1000);
        assert!(gate.check(0, &load, t0).is_ok());
        assert_eq!(load.reads(), 3);
    }

    #[test]
    fn a_failed_reading_is_not_reused() {
        let load = reused(2.0, 1000, Duration::from_secs(3600));
        load.set_failing(true);
        assert!(load.sample().is_err());
        assert!(load.sample().is_err());
        load.set_failing(false);
        assert_eq!(load.sample().unwrap().load1, 2.0);
        load.set(3.0, 1000);
        assert_eq!(load.sample().unwrap().load1, 2.0);
        assert_eq!(load.reads(), 3);
    }

    #[test]
    fn proc_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let loadavg = dir.path().join("loadavg");
        let meminfo = dir.path().join("meminfo");
        std::fs::write(&loadavg, "1.50 0.80 0.40 2/300 1234\n").unwrap();
        std::fs::write(&meminfo, "MemTotal: 1000 kB\nMemAvailable:     512 kB\n").unwrap();
        let load = ProcLoad {
            loadavg: loadavg.clone(),
            meminfo,
            cpu_pressure: None,
        };
        assert_eq!(
            load.sample().unwrap(),
            LoadSample {
                load1: 1.5,
                available_memory: 512 * 1024,
                cpu_pressure: None,
                site_pressure: None,
            }
        );
        std::fs::write(&loadavg, "garbage").unwrap();
        assert!(load.sample().is_err());
    }

    /// A file longer than the first read's 4 KiB is read whole: a line
    /// past it still counts; bytes that are not UTF-8 are an error.
    #[test]
    fn a_file_longer_than_the_first_read_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meminfo");
        let mut text = "Padding:          0 kB\n".repeat(1000);
        text.push_str("MemAvailable:     77 kB\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_small(&path).unwrap(), text);
        std::fs::write(&path, b"MemAvailable: \xff\n").unwrap();
        let error = read_small(&path).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn cpu_pressure_closes_the_gate_and_is_read_from_psi_files() {
        let mut gate = Gate::new(limits());
        let now = Instant::now();
        let pressed = Fixed(Mutex::new(LoadSample {
            load1: 0.1,
            available_memory: 1000,
            cpu_pressure: Some(50.0),
            site_pressure: None,
        }));
        assert_eq!(
            gate.check(0, &pressed, now),
            Err(Closed::Pressure {
                pressure: 50.0,
                max: 50.0
            })
        );
        pressed.0.lock().unwrap().cpu_pressure = Some(49.9);
        assert_eq!(gate.check(0, &pressed, now), Ok(2));
        // The site's pressure pauses at its own threshold.
        pressed.0.lock().unwrap().site_pressure = Some(10.0);
        assert_eq!(
            gate.check(0, &pressed, now),
            Err(Closed::SitePressure {
                pressure: 10.0,
                pause: 10.0
            })
        );
        pressed.0.lock().unwrap().site_pressure = Some(9.99);
        assert_eq!(gate.check(0, &pressed, now), Ok(2));

        let dir = tempfile::tempdir().unwrap();
        let psi = dir.path().join("cpu");
        std::fs::write(
            &psi,
            "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        assert_eq!(read_cpu_pressure(&psi).unwrap(), Some(12.5));
        assert_eq!(read_cpu_pressure(&dir.path().join("absent")).unwrap(), None);
        std::fs::write(&psi, "full avg10=1.00\n").unwrap();
        assert!(read_cpu_pressure(&psi).is_err());
    }

    #[test]
    fn sysinfo_reads_what_proc_says() {
        // The same values through sysinfo as from the files by hand (the
        // load may move between the two reads: compare loosely).
        let through_sysinfo = ProcLoad::default().sample().unwrap();
        let text = std::fs::read_to_string(LOADAVG).unwrap();
        let by_hand: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            (through_sysinfo.load1 - by_hand).abs() < 2.0,
            "{through_sysinfo:?} vs {by_hand}"
        );
        let meminfo = std::fs::read_to_string(MEMINFO).unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap();
        let by_hand = kib * 1024;
        let off = through_sysinfo.available_memory.abs_diff(by_hand);
        assert!(off < by_hand / 10, "{through_sysinfo:?} vs {by_hand}");
    }
}
