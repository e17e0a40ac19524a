//! The site under a job storm: whether jobs run beside a real site (nginx
//! and php-fpm, [`crate::site_server`]) without slowing it. The site is
//! driven at half its capacity at a constant rate ([`crate::open_loop`]),
//! and its latency is measured with no jobs, beside a storm of jobs run by
//! a supervisor with every yielding step off, and beside the same storm
//! under the supervisor's defaults pointed at the site's cgroup; the jobs'
//! work is measured against what they do on a machine with no site load.
//! Three storms (CPU, I/O, memory), conditions interleaved over rounds.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, SupervisorProcess, field, percentile, post};
use crate::open_loop::{self, Window};
use crate::site_plot::{self, Panel};
use crate::site_server::{Binaries, FPM_CHILDREN, Site, SiteCgroup};

/// The page's CPU cost aimed at, in ms.
const PAGE_MS: f64 = 5.0;

/// Connections the open-loop load spreads over.
const CONNECTIONS: usize = 32;

/// Where the plot goes, from the package's root.
pub const PLOT: &str = "docs/site-under-storm.svg";

/// `--max-load` high enough never to hold a job: the load average counts
/// the site's runnable processes and the jobs alike and lags by a minute, so
/// a load gate would stop a storm at a point set by the machine's history,
/// not by the yielding measured here (or by whatever else the machine
/// runs).
const NO_LOAD_GATE: f64 = 1000.0;

/// How long each part runs.
struct Timing {
    rounds: usize,
    window: Duration,
    warm_up: Duration,
    settle: Duration,
    capacity: Duration,
    job_seconds: u64,
    memory_mib: u64,
    jobs: usize,
}

const FULL: Timing = Timing {
    rounds: 3,
    window: Duration::from_secs(12),
    warm_up: Duration::from_secs(4),
    settle: Duration::from_secs(2),
    capacity: Duration::from_secs(4),
    job_seconds: 3,
    memory_mib: 2048,
    jobs: 64,
};

const SMOKE: Timing = Timing {
    rounds: 1,
    window: Duration::from_secs(1),
    warm_up: Duration::from_millis(500),
    settle: Duration::from_millis(100),
    capacity: Duration::from_millis(500),
    job_seconds: 1,
    memory_mib: 64,
    jobs: 8,
};

/// A kind of job storm.
#[derive(Clone, Copy, PartialEq)]
enum Storm {
    Cpu,
    Io,
    Memory,
}

const STORMS: [Storm; 3] = [Storm::Cpu, Storm::Io, Storm::Memory];

impl Storm {
    /// The worker's file name (and the job's).
    fn worker(self) -> &'static str {
        match self {
            Storm::Cpu => "Cpu",
            Storm::Io => "Io",
            Storm::Memory => "Memory",
        }
    }

    fn define(self) -> &'static str {
        match self {
            Storm::Cpu => "-DSTORM_CPU",
            Storm::Io => "-DSTORM_IO",
            Storm::Memory => "-DSTORM_MEMORY",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Storm::Cpu => "CPU storm",
            Storm::Io => "I/O storm",
            Storm::Memory => "Memory storm",
        }
    }

    fn describe(self, timing: &Timing) -> String {
        let s = timing.job_seconds;
        match self {
            Storm::Cpu => format!("each job hashes integers for {s} s"),
            Storm::Io => format!(
                "each job writes 64 KiB blocks to a file in its scratch directory, `fdatasync` after each, for {s} s"
            ),
            Storm::Memory => format!(
                "each job grows to {} MiB 64 MiB at a time, writing every page, then writes it over again until {s} s have passed",
                timing.memory_mib
            ),
        }
    }
}

/// What runs beside the site.
#[derive(Clone, Copy, PartialEq)]
enum Condition {
    /// No jobs.
    Baseline,
    /// A storm with every yielding step off.
    Unyielding,
    /// A storm under the defaults, pointed at the site's cgroup.
    Yielding,
}

const CONDITIONS: [Condition; 3] = [
    Condition::Baseline,
    Condition::Unyielding,
    Condition::Yielding,
];

impl Condition {
    fn label(self, flags: &Flags) -> &'static str {
        match self {
            Condition::Baseline => "no jobs",
            Condition::Unyielding => "storm, yielding off",
            Condition::Yielding if flags.yielding.is_empty() => "storm, defaults",
            Condition::Yielding => "storm, defaults + `--site-cgroup`",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Condition::Baseline => "no jobs",
            Condition::Unyielding => "yielding off",
            Condition::Yielding => "defaults",
        }
    }
}

/// The flags that turn every yielding step off, as `jobmgr --help` names
/// them.
const YIELDING_OFF: [(&str, &str); 5] = [
    ("--yield-cpu", "false"),
    ("--yield-io", "false"),
    ("--jobs-memory-high", "off"),
    ("--pause-pressure", "off"),
    ("--freeze-pressure", "off"),
];

/// The supervisor flags of each condition, given what the binary has.
struct Flags {
    unyielding: Vec<String>,
    yielding: Vec<String>,
    /// The flags the binary measured lacks.
    missing: Vec<&'static str>,
}

impl Flags {
    fn new(site_cgroup: Option<&str>) -> Flags {
        let help = Command::new(common::bin())
            .arg("--help")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let has =
            |flag: &str| help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}="));
        let mut flags = Flags {
            unyielding: Vec::new(),
            yielding: Vec::new(),
            missing: Vec::new(),
        };
        for (flag, off) in YIELDING_OFF {
            if has(flag) {
                flags.unyielding.push(format!("{flag}={off}"));
            } else {
                flags.missing.push(flag);
            }
        }
        match site_cgroup {
            Some(cgroup) if has("--site-cgroup") => {
                flags.yielding.push(format!("--site-cgroup={cgroup}"));
            }
            Some(_) => flags.missing.push("--site-cgroup"),
            None => {}
        }
        flags
    }

    fn of(&self, condition: Condition) -> &[String] {
        match condition {
            Condition::Unyielding => &self.unyielding,
            _ => &self.yielding,
        }
    }
}

/// The storm workers, built from `storm_worker.c`.
struct Workers {
    dir: tempfile::TempDir,
}

impl Workers {
    fn build() -> Result<Workers, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod: {e}"))?;
        for storm in STORMS {
            common::compile_worker(
                dir.path(),
                storm.worker(),
                "storm_worker.c",
                &[&[storm.define()]],
            )
            .ok_or("the storm workers could not be built (they need `cc`)")?;
        }
        Ok(Workers { dir })
    }
}

/// A supervisor running a queue of one storm's jobs, stopped when dropped.
struct RunningStorm {
    supervisor: Option<SupervisorProcess>,
    units: PathBuf,
    workers: PathBuf,
    _dir: tempfile::TempDir,
}

impl RunningStorm {
    /// Starts a supervisor (its embedded server on a fresh store, the real
    /// load and memory gates) with `flags`, and queues
    /// the storm's jobs.
    fn start(storm: Storm, workers: &Workers, flags: &[String], timing: &Timing) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let units = dir.path().join("units");
        std::fs::write(&units, "").expect("units file");
        // Workers run as uids of their own.
        std::fs::set_permissions(&units, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let mut args: Vec<String> = [
            "--job-name=*",
            &format!("--max-load={NO_LOAD_GATE}"),
            &format!("--env=BENCH_UNITS={}", units.display()),
            &format!("--env=BENCH_JOB_SECONDS={}", timing.job_seconds),
            &format!("--env=BENCH_MEMORY_MIB={}", timing.memory_mib),
        ]
        .map(String::from)
        .to_vec();
        args.extend_from_slice(flags);
        let supervisor = SupervisorProcess::start_embedded(workers.dir.path(), &args);
        let base = field(&supervisor.ready, "http");
        let jobs: Vec<Value> = (0..timing.jobs)
            .map(|_| json!({ "name": format!("storm/{}", storm.worker()) }))
            .collect();
        post(
            &common::client(),
            &format!("{base}/jobs/batch"),
            &json!({ "jobs": jobs }),
        );
        RunningStorm {
            supervisor: Some(supervisor),
            units,
            workers: workers.dir.path().to_path_buf(),
            _dir: dir,
        }
    }

    /// Units of work done so far.
    fn units(&self) -> u64 {
        std::fs::metadata(&self.units).map_or(0, |m| m.len())
    }
}

impl Drop for RunningStorm {
    /// Stops the supervisor; a worker it left behind (none should be) is
    /// killed by its pid, and said.
    fn drop(&mut self) {
        self.supervisor.take();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = workers_running(&self.workers);
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "storm workers left running after their supervisor stopped: {left:?}; killing them"
                );
                for pid in left {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Processes running an executable from `dir`.
fn workers_running(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(dir))
        })
        .collect()
}

/// One window's figures.
struct Measure {
    window: Window,
    /// The jobs' units of work per second.
    units_per_s: f64,
    /// CPU the site and the load used, in cores.
    site_cores: f64,
    /// Share of the window some of the site's tasks stalled on CPU, in %.
    cpu_stall: f64,
    /// The machine's 1-minute load average as the window began.
    load: f64,
    /// CPU the whole machine used, in cores.
    machine_cores: f64,
}

/// What a measure is taken beside.
struct Setting<'a> {
    site: &'a Site,
    request: &'a [u8],
    rate: f64,
    timing: &'a Timing,
}

/// One window of load on the site beside `condition`.
fn measure(
    setting: &Setting<'_>,
    storm: Storm,
    condition: Condition,
    workers: &Workers,
    flags: &Flags,
) -> Measure {
    let timing = setting.timing;
    let running = (condition != Condition::Baseline)
        .then(|| RunningStorm::start(storm, workers, flags.of(condition), timing));
    if running.is_some() {
        std::thread::sleep(timing.warm_up);
    }
    let cgroup = &setting.site.cgroup;
    let units = running.as_ref().map_or(0, RunningStorm::units);
    let cpu = cgroup.cpu_usec() as f64 / 1e6 + common::cpu_seconds(std::process::id());
    let stall = cgroup.stalled_usec("cpu");
    let load = load_average();
    let busy = machine_busy_seconds();
    let started = Instant::now();
    let window = open_loop::open_loop(
        setting.site.addr,
        setting.request,
        setting.rate,
        timing.window,
        CONNECTIONS,
    );
    let took = started.elapsed().as_secs_f64();
    let measure = Measure {
        units_per_s: running
            .as_ref()
            .map_or(0.0, |r| (r.units() - units) as f64 / took),
        site_cores: (cgroup.cpu_usec() as f64 / 1e6 + common::cpu_seconds(std::process::id())
            - cpu)
            / took,
        cpu_stall: (cgroup.stalled_usec("cpu") - stall) as f64 / 1e4 / took,
        load,
        machine_cores: (machine_busy_seconds() - busy) / took,
        window,
    };
    drop(running);
    std::thread::sleep(timing.settle);
    measure
}

/// The jobs' units per second with no load on the site, yielding off.
fn idle_throughput(storm: Storm, workers: &Workers, flags: &Flags, timing: &Timing) -> f64 {
    let running = RunningStorm::start(storm, workers, &flags.unyielding, timing);
    std::thread::sleep(timing.warm_up);
    let units = running.units();
    let started = Instant::now();
    std::thread::sleep(timing.window);
    let rate = (running.units() - units) as f64 / started.elapsed().as_secs_f64();
    drop(running);
    std::thread::sleep(timing.settle);
    rate
}

/// The machine's 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// CPU seconds the machine has been busy (every core, every process,
/// interrupts and steal), from `/proc/stat`.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    busy / hz
}

/// The median latency in ms of requests one after another for `length`.
fn sequential_ms(site: &Site, path: &str, length: Duration) -> f64 {
    let window = open_loop::closed_loop(site.addr, &open_loop::request(path), length, 1);
    let mut latencies = window.latencies;
    assert!(!latencies.is_empty(), "{path}: no answer");
    latencies.sort_by(f64::total_cmp);
    percentile(&latencies, 0.5)
}

/// The page's rounds of MD5 for about [`PAGE_MS`] of CPU, and the median
/// time of the page alone then.
fn calibrate(site: &Site, length: Duration) -> (u64, f64) {
    const PROBE: u64 = 20_000;
    let empty = sequential_ms(site, "/burn.php?n=0", length);
    let probe = sequential_ms(site, &format!("/burn.php?n={PROBE}"), length);
    let per_round = ((probe - empty) / PROBE as f64).max(1e-6);
    let rounds = ((PAGE_MS / per_round).round() as u64).clamp(1_000, 2_000_000);
    (
        rounds,
        sequential_ms(site, &format!("/burn.php?n={rounds}"), length),
    )
}

/// Everything measured under one condition of one storm, over the rounds.
#[derive(Default)]
struct Figures {
    /// Each round's p50, p99 and p99.9.
    rounds: Vec<[f64; 3]>,
    round_p99: Vec<f64>,
    rates: Vec<f64>,
    errors: usize,
    units: Vec<f64>,
    site_cores: Vec<f64>,
    stall: Vec<f64>,
    loads: Vec<f64>,
    machine_cores: Vec<f64>,
}

impl Figures {
    fn add(&mut self, measure: Measure) {
        let mut latencies = measure.window.latencies;
        latencies.sort_by(f64::total_cmp);
        if !latencies.is_empty() {
            self.round_p99.push(percentile(&latencies, 0.99));
            self.rounds
                .push([0.5, 0.99, 0.999].map(|p| percentile(&latencies, p)));
        }
        self.rates.push(measure.window.rate);
        self.errors += measure.window.errors;
        self.units.push(measure.units_per_s);
        self.site_cores.push(measure.site_cores);
        self.stall.push(measure.cpu_stall);
        self.loads.push(measure.load);
        self.machine_cores.push(measure.machine_cores);
    }

    /// p50, p99 and p99.9: each the median over the rounds of the
    /// round's own (so that a round that met outside load does not sway
    /// it when the others were quiet).
    fn quantiles(&mut self) -> [f64; 3] {
        if self.rounds.is_empty() {
            return [f64::NAN; 3];
        }
        [0, 1, 2].map(|q| {
            let mut values: Vec<f64> = self.rounds.iter().map(|r| r[q]).collect();
            values.sort_by(f64::total_cmp);
            percentile(&values, 0.5)
        })
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// One storm's figures: per condition, and the jobs' work with no site load.
struct StormFigures {
    storm: Storm,
    conditions: [Figures; 3],
    idle_units: f64,
}

/// What the section says of the site and its load.
struct SiteFacts {
    versions: String,
    rounds_md5: u64,
    page_ms: f64,
    capacity: f64,
    rate: f64,
    cores: f64,
}

/// The section: the site under each storm, or why it was skipped; the
/// plot's SVG beside it (`None` when skipped).
pub struct Section {
    pub markdown: String,
    pub svg: Option<String>,
}

/// Runs the measures (a few seconds in smoke mode, where a machine without
/// nginx runs only the storms, with no site).
pub fn report(smoke: bool) -> Section {
    let timing = if smoke { &SMOKE } else { &FULL };
    let workers = match Workers::build() {
        Ok(workers) => workers,
        Err(why) => return skipped(&why),
    };
    let binaries = match Binaries::find() {
        Ok(binaries) => binaries,
        Err(why) if smoke => return storms_alone(&workers, timing, &why),
        Err(why) => return skipped(&why),
    };
    let site = Site::start(&binaries).unwrap_or_else(|e| panic!("the site did not start: {e}"));
    let calibration = if smoke {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    let (rounds_md5, page_ms) = calibrate(&site, calibration);
    let request = open_loop::request(&format!("/burn.php?n={rounds_md5}"));
    let capacity =
        open_loop::closed_loop(site.addr, &request, timing.capacity, 2 * FPM_CHILDREN).rate;
    let facts = SiteFacts {
        versions: binaries.versions(),
        rounds_md5,
        page_ms,
        capacity,
        rate: capacity / 2.0,
        cores: std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64),
    };
    eprintln!(
        "site: page {page_ms:.1} ms alone ({rounds_md5} rounds), capacity {capacity:.0}/s, driven at {:.0}/s",
        facts.rate
    );
    let flags = Flags::new(Some(&site.cgroup.relative));
    let setting = Setting {
        site: &site,
        request: &request,
        rate: facts.rate,
        timing,
    };
    let mut figures: Vec<StormFigures> = STORMS
        .iter()
        .map(|&storm| StormFigures {
            storm,
            conditions: Default::default(),
            idle_units: idle_throughput(storm, &workers, &flags, timing),
        })
        .collect();
    for round in 0..timing.rounds {
        for (s, storm_figures) in figures.iter_mut().enumerate() {
            for k in 0..CONDITIONS.len() {
                let c = (k + round + s) % CONDITIONS.len();
                let m = measure(
                    &setting,
                    storm_figures.storm,
                    CONDITIONS[c],
                    &workers,
                    &flags,
                );
                let done = &mut storm_figures.conditions[c];
                done.add(m);
                eprintln!(
                    "round {round}, {}, {}: p99 {:.1} ms, {:.1} units/s",
                    storm_figures.storm.title(),
                    CONDITIONS[c].short(),
                    done.round_p99.last().copied().unwrap_or(f64::NAN),
                    done.units.last().copied().unwrap_or(0.0),
                );
            }
        }
    }
    write_up(&facts, &mut figures, &flags, timing)
}

/// The section when the site cannot be measured here.
fn skipped(why: &str) -> Section {
    eprintln!("the site section is skipped: {why}");
    Section {
        markdown: format!(
            "## The site under a job storm\n\nNot measured on this machine: {why}.\n"
        ),
        svg: None,
    }
}

/// Smoke mode without nginx: each storm alone under both conditions'
/// flags, to show the supervisor takes them and the workers work.
fn storms_alone(workers: &Workers, timing: &Timing, why: &str) -> Section {
    let cgroup = SiteCgroup::create().ok();
    let flags = Flags::new(cgroup.as_ref().map(|c| c.relative.as_str()));
    let mut lines = Vec::new();
    for storm in STORMS {
        for condition in [Condition::Unyielding, Condition::Yielding] {
            let running = RunningStorm::start(storm, workers, flags.of(condition), timing);
            std::thread::sleep(timing.warm_up + timing.window);
            let units = running.units();
            drop(running);
            // Yielding jobs may wait as long as a busy machine stays busy.
            assert!(
                units > 0 || condition == Condition::Yielding,
                "{}, {}: the jobs did no work",
                storm.title(),
                condition.short()
            );
            lines.push(format!(
                "{}, {}: {units} units",
                storm.title(),
                condition.short()
            ));
        }
    }
    let mut section = skipped(why);
    section
        .markdown
        .push_str(&format!("\nThe storms ran alone: {}.\n", lines.join("; ")));
    section
}

/// A latency in ms, to a tenth below 100.
fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The section's text and plot from the figures.
fn write_up(
    facts: &SiteFacts,
    figures: &mut [StormFigures],
    flags: &Flags,
    timing: &Timing,
) -> Section {
    let baseline_cores: Vec<f64> = figures
        .iter()
        .flat_map(|f| f.conditions[0].site_cores.iter().copied())
        .collect();
    let spare = (1.0 - mean(&baseline_cores) / facts.cores).max(0.01);
    let loads = figures
        .iter()
        .flat_map(|f| f.conditions.iter().flat_map(|c| c.loads.iter().copied()))
        .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
    let others: Vec<f64> = figures
        .iter()
        .flat_map(|f| {
            let c = &f.conditions[0];
            c.machine_cores
                .iter()
                .zip(&c.site_cores)
                .map(|(machine, site)| (machine - site).max(0.0))
        })
        .collect();
    let mut md = intro(facts, flags, timing, spare, loads, mean(&others));
    let mut panels = Vec::new();
    let mut verdict = String::new();
    for storm_figures in figures.iter_mut() {
        let storm = storm_figures.storm;
        md.push_str(&format!(
            "### {}\n\n{}.\n\n",
            storm.title(),
            capitalized(&storm.describe(timing))
        ));
        md.push_str(&format!(
            "| Condition | p50 (ms) | p99 (ms; rounds' range) | p99.9 (ms) | Site rate (req/s) | Site CPU stall | Jobs' work (of the idle machine's {:.0} units/s) | Of what the spare capacity allows |\n|---|---|---|---|---|---|---|---|\n",
            storm_figures.idle_units
        ));
        let quantiles: Vec<[f64; 3]> = storm_figures
            .conditions
            .iter_mut()
            .map(Figures::quantiles)
            .collect();
        for (c, condition) in CONDITIONS.iter().enumerate() {
            let f = &storm_figures.conditions[c];
            let [p50, p99, p999] = quantiles[c];
            let (low, high) = f
                .round_p99
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
            let share = mean(&f.units) / storm_figures.idle_units.max(1e-9);
            let (work, allowed) = if *condition == Condition::Baseline {
                ("—".to_string(), "—".to_string())
            } else {
                (
                    format!("{:.0} %", share * 100.0),
                    format!("{:.0} %", share / spare * 100.0),
                )
            };
            let errors = if f.errors > 0 {
                format!(" ({} failed)", f.errors)
            } else {
                String::new()
            };
            md.push_str(&format!(
                "| {} | {} | {} ({}–{}) | {} | {:.0}{errors} | {:.0} % | {work} | {allowed} |\n",
                condition.label(flags),
                ms(p50),
                ms(p99),
                ms(low),
                ms(high),
                ms(p999),
                mean(&f.rates),
                mean(&f.stall),
            ));
            if storm == Storm::Cpu && *condition == Condition::Yielding {
                let [_, b99, b999] = quantiles[0];
                let ok = p99 <= b99 * 1.10 && p999 <= b999 * 1.25 && share / spare >= 0.8;
                verdict = format!(
                    "**Goal** (CPU storm, defaults): the site's p99 within 10 % of its p99 with no jobs and its p99.9 within 25 %, while the jobs do at least 80 % of the work the site's spare capacity allows. **{}**: p99 {:+.0} %, p99.9 {:+.0} %, jobs at {:.0} % of what the spare capacity allows.\n\n",
                    if ok { "Met" } else { "Not met" },
                    (p99 / b99 - 1.0) * 100.0,
                    (p999 / b999 - 1.0) * 100.0,
                    share / spare * 100.0
                );
            }
        }
        md.push('\n');
        panels.push(Panel {
            title: storm.title().to_string(),
            groups: CONDITIONS
                .iter()
                .zip(&quantiles)
                .map(|(c, q)| (c.short().to_string(), *q))
                .collect(),
        });
    }
    md.push_str(&verdict);
    md.push_str(&format!(
        "![The site's latency under each storm: p50, p99 and p99.9 per condition, on a log scale]({PLOT})\n"
    ));
    Section {
        markdown: md,
        svg: Some(site_plot::svg(
            &format!(
                "The site's latency at {:.0} requests/s under job storms ({} ms)",
                facts.rate, "p50, p99, p99.9"
            ),
            &panels,
        )),
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The section's opening: what was run and how it was measured.
fn intro(
    facts: &SiteFacts,
    flags: &Flags,
    timing: &Timing,
    spare: f64,
    loads: (f64, f64),
    others: f64,
) -> String {
    let mut md = String::from("## The site under a job storm\n\n");
    md.push_str("The promise: jobs never slow the site they share a webserver with. This section measures it against a real site, with the release `jobmgr` supervisor running storms of jobs beside it. Command: `JOBMGR_BENCH_ONLY=site cargo bench --bench jobmgr` (about 10 minutes; it replaces only this section).\n\n");
    md.push_str(&format!(
        "- **The site.** {}: nginx (2 workers) in front of php-fpm (`pm = static`, {FPM_CHILDREN} children, over a unix socket), with configurations of their own, both in a cgroup v2 directory of their own. The page runs {} rounds of MD5: {:.1} ms alone, through nginx.\n",
        facts.versions, facts.rounds_md5, facts.page_ms
    ));
    md.push_str(&format!(
        "- **Its load.** Its capacity, as fast as {} connections get answers for {} s, is {:.0} requests/s. It is driven at half that, {:.0} requests/s, open loop: requests scheduled at a constant rate, each sent at its time on the first free one of {CONNECTIONS} keep-alive connections, its latency counted from its scheduled time (a stall counts in full for every request it delays). The load generator runs on the same machine.\n",
        2 * FPM_CHILDREN,
        timing.capacity.as_secs_f64(),
        facts.capacity,
        facts.rate
    ));
    md.push_str(&format!(
        "- **The storms.** A supervisor with its embedded server on a fresh SQLite file (`jobmgr --job-name='*' --max-load={:.0} --db … --http 127.0.0.1:0`: the default `--max-workers` (twice the cores), ramp, memory gate and sandbox, and no load gate, which would hold the storm at a point set by the last minute's load, the site's included, rather than by the yielding measured here) is given {} jobs at its start; each window starts {:.0} s later, with the storm in full swing, and lasts {:.0} s; the supervisor is stopped after it. Conditions: **no jobs**; **yielding off** ({}); **defaults** plus `--site-cgroup` at the site's cgroup{}. Each storm's conditions alternate in a rotating order over {} rounds; each latency figure is the median over the rounds of the round's own quantile (a round that met outside load does not sway it when the others were quiet), and the p99 column also gives the range of the rounds' p99.\n",
        NO_LOAD_GATE,
        timing.jobs,
        timing.warm_up.as_secs_f64(),
        timing.window.as_secs_f64(),
        if flags.unyielding.is_empty() {
            "none of its flags in the binary measured".to_string()
        } else {
            format!("`{}`", flags.unyielding.join(" "))
        },
        if flags.yielding.is_empty() { " (not given: the binary lacks it)" } else { "" },
        timing.rounds
    ));
    md.push_str(&format!(
        "- **The jobs' work.** Each worker counts its units of work; the figure is units per second in the window, as a share of what the same storm does with the site idle (yielding off). The site and its load use {:.0} % of the machine's {:.0} cores with no jobs, leaving {:.0} % spare: the last column is the jobs' share over that spare share. *Site CPU stall* is the share of the window in which some of the site's tasks waited for a CPU (its cgroup's `cpu.pressure`, `some`: its tasks waiting for each other included; the back-off watches the `full` line, the time none of them ran). The machine's 1-minute load average as the windows began: {:.1}–{:.1}; in the no-jobs windows, processes other than the site and its load used {:.2} cores.\n",
        (1.0 - spare) * 100.0,
        facts.cores,
        spare * 100.0,
        loads.0,
        loads.1,
        others
    ));
    if others > 0.1 {
        md.push_str(&format!(
            "- **The machine was not quiet:** processes other than the site, its load and the storm used {others:.2} cores on average in the no-jobs windows, and the load average reached {:.1}. A window that met them is slower whatever its condition: the medians over rounds set one such window aside, not two.\n",
            loads.1
        ));
    }
    if !flags.missing.is_empty() {
        md.push_str(&format!(
            "- **Not in this measure:** the binary measured has no `{}`; what they control is not part of it.\n",
            flags.missing.join("`, `")
        ));
    }
    md.push('\n');
    md
}
