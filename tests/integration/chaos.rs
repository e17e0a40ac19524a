//! The chaos soaks: jobs go through job servers and supervisors (each a real
//! `jobmgr --server …` process with its own spool and scratch directories)
//! while a killer sends `kill -9` to all of them at random moments, a
//! bounded number of times, and starts each again on the same store or
//! spool. Everything is on 127.0.0.1, and only processes this test started
//! are ever killed, by pid. Two shapes of [`Fleet`] share the machinery:
//!
//! - the chaos soak: one `jobmgr server` on an SQLite file and two
//!   supervisors (the second, as every other supervisor of both shapes,
//!   holding up to eight jobs ahead of its four slots with
//!   `--fetch-ahead 8`);
//! - the fleet soak: three servers on one PostgreSQL database, all serving
//!   at once, and four supervisors, each given the three servers' URLs in
//!   an order of its own so that they are spread over the servers (and
//!   fail over between them). Servers are killed, and restarted on the same
//!   database and port, with outages that may overlap but never take all
//!   three down at once.
//!
//! The worker appends one line per completed run (job id, attempt, and which
//! supervisor instance ran it) to a shared file with one short `O_APPEND`
//! write, after sleeping a little. At the end:
//!
//! - every job is finished: none is left on the servers in any state (a
//!   finished job that does not repeat is deleted), each ran at least once,
//!   and each is in the archive as FINISHED. None was lost;
//! - duplicate runs happen only in the documented at-least-once window, a
//!   lapsed lease: no job ran more times than one plus the attempts its
//!   history records as `lease_lost` (the store's own record, written in
//!   the lapse's transaction; the lapses the servers logged are counted
//!   beside it). They are counted and reported on stdout;
//! - no worker outlived its supervisor, and no process carrying this run's
//!   marker (in its environment, or the worker's path in its command line)
//!   remains;
//! - no scratch directory remains, and the spools are empty;
//! - the resident memory of the last supervisor's last, longest-lived
//!   instance stays flat within a generous bound.
//!
//! The fleet soak then measures cross-server wake-up latency (reported,
//! never asserted): with every process up and each supervisor holding a
//! GetJob on the server it uses, a job only one supervisor takes is created
//! through another server, and the time from the create's acknowledgement
//! to the job's hand-out is read ([`wake_probes`]).
//!
//! The short modes run with the other tests. The long modes:
//! `cargo test --test integration chaos_soak_long -- --ignored --nocapture`
//! (2,000 jobs) and
//! `cargo test --test integration fleet_soak_long -- --ignored --nocapture`
//! (5,000 jobs); `JOBMGR_SOAK_JOBS`, `JOBMGR_SOAK_KILLS` (kills per process),
//! `JOBMGR_SOAK_PROBES` (rounds of wake-up probes) and `JOBMGR_SOAK_SEED`
//! change the size, the kills and the random choices; `JOBMGR_SOAK_KEEP=1`
//! keeps the directory with the logs.

use crate::common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// How long the soak may go without progress (a new run, a job finished)
/// before it fails. Long, since a job whose holder was killed comes back
/// only when its lease lapses, and a supervisor whose fetches failed backs
/// off for up to 30 seconds.
const STALL: Duration = Duration::from_secs(90);

/// The lease the supervisors ask for: short, so that the jobs of a killed
/// supervisor come back quickly.
const LEASE: &str = "3s";

/// The worker: sleeps a little (now and then a second, so that kills find
/// workers running), then appends one line saying which job ran, which
/// attempt it was and which supervisor instance ran it. `printf` is a shell
/// builtin, so the line is one short write to a file opened with O_APPEND.
const WORKER: &str = r#"#!/bin/sh
# The chaos soak's worker.
case $((JOBMGR_JOB_ID % 25)) in
  0) sleep 1 ;;
  *) sleep 0.0$((JOBMGR_JOB_ID % 10)) ;;
esac
printf '%s %s %s\n' "$JOBMGR_JOB_ID" "$JOBMGR_ATTEMPT" "$CHAOS_SUP" >> "$CHAOS_OUT"
"#;

/// The soak's jobs are named `Chaos/_` (any supervisor takes them; the
/// worker is the file `_`); a wake-up probe for supervisor `a` is named
/// `Chaos/a` (the worker `a`), and only `a` takes it: in the fleet soak,
/// supervisor `a` takes the GLOB `Chaos/[_a]`.
const SOAK_JOB: &str = "Chaos/_";

/// A wake-up probe's worker: says when it started (the wall clock, in ns)
/// and which supervisor instance ran it.
const PROBE_WORKER: &str = r#"#!/bin/sh
# The fleet soak's wake-up probe.
printf '%s %s %s\n' "$JOBMGR_JOB_ID" "$(date +%s%N)" "$CHAOS_SUP" >> "$CHAOS_PROBES"
"#;

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Starts `command` (a `jobmgr` that prints one ready line on stdout), its
/// stderr appended to `stderr`, and waits for the ready line. `Err` if it
/// exited first (a port still taken, say); panics if it neither gets ready
/// nor exits in time.
fn spawn_ready(mut command: Command, stderr: &Path) -> Result<(Child, String), String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr)
        .expect("stderr file");
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    command
        .env("JOBMGR_LOG", "info")
        // Servers and supervisors alike use the fixtures' token.
        .env("JOBMGR_TOKEN", token())
        .stdout(Stdio::piped())
        .stderr(log)
        .stdin(Stdio::null());
    let mut child = command.spawn().expect("spawn jobmgr");
    match ready_line(&mut child) {
        Ok(line) => Ok((child, line)),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // Its stdout closed: it is exiting, or (if not by the deadline)
            // killed here, so that nothing is left running.
            let status = wait_child(&mut child, DEADLINE)
                .or_else(|| kill_and_reap(&mut child, "a jobmgr that closed its stdout"));
            Err(format!(
                "exited ({status:?}) before its ready line; stderr ends:\n{}",
                tail(stderr)
            ))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            kill_and_reap(&mut child, "a jobmgr that did not become ready");
            panic!(
                "jobmgr did not become ready in {DEADLINE:?}; stderr ends:\n{}",
                tail(stderr)
            );
        }
    }
}

/// The last few kilobytes of a log file.
fn tail(path: &Path) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(6000)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    text
}

/// `kill -9` a child of ours and reap it.
fn kill9(child: &mut Child) {
    kill_and_reap(child, "a jobmgr of the soak");
}

/// SIGTERM a child of ours and wait for it to exit.
fn terminate(child: &mut Child, what: &str, log: &Path) -> std::process::ExitStatus {
    sigterm(child);
    exited(child, what, log)
}

/// SIGTERM a child of ours.
fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .expect("SIGTERM");
}

/// Waits for a child of ours that was sent SIGTERM to exit.
fn exited(child: &mut Child, what: &str, log: &Path) -> std::process::ExitStatus {
    wait_child(child, Duration::from_secs(60)).unwrap_or_else(|| {
        kill9(child);
        panic!(
            "{what} did not exit after SIGTERM; its log ends:\n{}",
            tail(log)
        )
    })
}

/// Where a soak's servers keep their jobs.
#[derive(Clone)]
enum SoakStore {
    /// An SQLite file, served by one server at a time.
    Sqlite(PathBuf),
    /// A PostgreSQL database that every server of the soak serves at once
    /// (dropped after the last of them), and the token file they read: a
    /// URL has no "beside".
    Postgres(Arc<TestDatabase>, PathBuf),
}

/// A job server, restarted on the same store and port. The first start
/// takes a port from the OS; later ones bind that port again.
struct SoakServer {
    child: Option<Child>,
    store: SoakStore,
    log: PathBuf,
    port: u16,
}

impl SoakServer {
    /// A server on the SQLite file `dir/jobs.db`.
    fn start(dir: &Path) -> SoakServer {
        SoakServer::start_on(
            SoakStore::Sqlite(dir.join("jobs.db")),
            dir.join("server.log"),
        )
    }

    /// A server on `store`, its log in `log`.
    fn start_on(store: SoakStore, log: PathBuf) -> SoakServer {
        let mut server = SoakServer {
            child: None,
            store,
            log,
            port: 0,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let started = Instant::now();
        loop {
            let mut command = Command::new(bin());
            command.args(["server", "--log-format", "json", "--db"]);
            match &self.store {
                SoakStore::Sqlite(db) => {
                    command.arg(db);
                }
                SoakStore::Postgres(database, token_file) => {
                    command
                        .arg(database.url())
                        .arg("--token-file")
                        .arg(token_file);
                }
            }
            command
                .arg("--http")
                .arg(format!("127.0.0.1:{}", self.port))
                .args(["--bedrock", "none"]);
            match spawn_ready(command, &self.log) {
                Ok((child, line)) => {
                    let http = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("http="))
                        .unwrap_or_else(|| panic!("no http= in the ready line {line:?}"));
                    self.port = http
                        .trim_start_matches("http://")
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .unwrap_or_else(|| panic!("no port in {http:?}"));
                    self.child = Some(child);
                    return;
                }
                // The port may be held for a moment by a connection of the
                // server that was just killed.
                Err(_) if started.elapsed() < DEADLINE => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(why) => panic!("the server did not start again on its port: {why}"),
            }
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill9(&mut child);
        }
    }
}

impl Drop for SoakServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A supervisor started again, after each kill, on the same spool, scratch
/// directory and status file. Each start is an instance (`a1`, `a2`, …) that
/// its workers carry in `CHAOS_SUP`.
struct SoakSupervisor {
    name: &'static str,
    dir: PathBuf,
    args: Vec<OsString>,
    child: Option<Child>,
    instance: u32,
    /// Where the running instance's part of the log begins.
    log_from: u64,
}

impl SoakSupervisor {
    /// A supervisor in `dir` (made here) with these arguments besides its
    /// own directories; not started.
    fn new(name: &'static str, parent: &Path, args: Vec<OsString>) -> SoakSupervisor {
        let dir = parent.join(format!("supervisor-{name}"));
        std::fs::create_dir_all(&dir).expect("supervisor dir");
        SoakSupervisor {
            name,
            dir,
            args,
            child: None,
            instance: 0,
            log_from: 0,
        }
    }

    fn start(&mut self) {
        self.instance += 1;
        self.log_from = std::fs::metadata(self.log()).map_or(0, |m| m.len());
        let mut command = Command::new(bin());
        command
            .args(&self.args)
            .arg("--spool-dir")
            .arg(self.spool())
            .arg("--scratch-dir")
            .arg(self.scratch())
            .arg("--status-file")
            .arg(self.dir.join("status.json"))
            .arg("--env")
            .arg(format!("CHAOS_SUP={}", self.tag()));
        let (child, _) = spawn_ready(command, &self.log())
            .unwrap_or_else(|why| panic!("supervisor {} did not start: {why}", self.tag()));
        self.child = Some(child);
    }

    /// The running instance.
    fn tag(&self) -> String {
        format!("{}{}", self.name, self.instance)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn spool(&self) -> PathBuf {
        self.dir.join("spool")
    }

    fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("stderr")
    }

    /// What the running instance has logged.
    fn instance_log(&self) -> String {
        let Ok(mut file) = std::fs::File::open(self.log()) else {
            return String::new();
        };
        let _ = file.seek(SeekFrom::Start(self.log_from));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill9(&mut child);
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        terminate(
            &mut child,
            &format!("supervisor {}", self.tag()),
            &self.log(),
        )
    }

    /// SIGTERM: asks the running instance to stop; [`SoakSupervisor::stopped`]
    /// waits for it.
    fn ask_to_stop(&self) {
        sigterm(self.child.as_ref().expect("running"));
    }

    /// Waits for the instance asked to stop to exit.
    fn stopped(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        exited(
            &mut child,
            &format!("supervisor {}", self.tag()),
            &self.log(),
        )
    }
}

impl Drop for SoakSupervisor {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The arguments every supervisor of a test shares.
fn supervisor_args(server: &str, dir: &Path, extra: &[&str]) -> Vec<OsString> {
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").expect("empty config");
    // The machine's real load never gates the soak.
    std::fs::write(dir.join("loadavg"), "0.00 0.00 0.00 1/100 1\n").expect("loadavg");
    std::fs::write(
        dir.join("meminfo"),
        "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n",
    )
    .expect("meminfo");
    let mut args: Vec<OsString> = vec![
        "--config".into(),
        empty.into(),
        "--server".into(),
        server.into(),
        "--worker-path".into(),
        dir.join("workers").into(),
        "--loadavg-path".into(),
        dir.join("loadavg").into(),
        "--meminfo-path".into(),
        dir.join("meminfo").into(),
    ];
    // As root, workers would run as an unprivileged user who cannot write
    // into this test's private directories.
    if nix::unistd::geteuid().is_root() {
        args.extend(["--user".into(), "root".into()]);
    }
    args.extend(extra.iter().map(OsString::from));
    args
}

/// Writes an executable worker script.
fn executable(path: &Path, script: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("worker dir");
    std::fs::write(path, script).expect("worker script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

// ---------------------------------------------------------------------------
// Looking at processes and files
// ---------------------------------------------------------------------------

/// Live processes (not zombies) whose environment has `var` or whose
/// command line has `arg` as one of its words, with their command lines.
fn processes_with(var: &str, arg: Option<&Path>) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let base = entry.path();
        let zombie = std::fs::read_to_string(base.join("stat"))
            .ok()
            .is_none_or(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with(['Z', 'X']))
            });
        if zombie {
            continue;
        }
        let environ = std::fs::read(base.join("environ")).unwrap_or_default();
        let cmdline = std::fs::read(base.join("cmdline")).unwrap_or_default();
        let in_env = environ.split(|&b| b == 0).any(|e| e == var.as_bytes());
        let in_cmd = arg.is_some_and(|arg| {
            let arg = arg.as_os_str().as_encoded_bytes();
            cmdline.split(|&b| b == 0).any(|word| word == arg)
        });
        if in_env || in_cmd {
            let words: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            found.push((pid, words.join(" ")));
        }
    }
    found
}

/// Polls `check` until it returns `Ok`, or panics after [`DEADLINE`] with
/// `what` and what the last check found.
fn eventually(what: &str, check: impl FnMut() -> Result<(), String>) {
    within(what, check)
}

/// Polls `check` until it returns `Ok`, and returns what it holds; panics
/// after [`DEADLINE`] with `what` and what the last check found.
fn within<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(found) if start.elapsed() > DEADLINE => {
                panic!("timed out after {DEADLINE:?} waiting for {what}; found: {found}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `Ok` if nothing alive carries `var` in its environment (or `arg` in its
/// command line), else the processes that do.
fn none_with(var: &str, arg: Option<&Path>) -> Result<(), String> {
    let found = processes_with(var, arg);
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!("{found:?}"))
    }
}

/// The entries of a directory, if it exists.
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A process's resident memory, in kB.
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The completed runs the worker recorded: `(job id, attempt, instance)`.
fn runs(out: &Path) -> Vec<(i64, i64, String)> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut words = line.split(' ');
            let id = words.next().and_then(|w| w.parse().ok());
            let attempt = words.next().and_then(|w| w.parse().ok());
            let instance = words.next().map(str::to_string);
            match (id, attempt, instance, words.next()) {
                (Some(id), Some(attempt), Some(instance), None) => (id, attempt, instance),
                _ => panic!("a torn or foreign line in the worker's file: {line:?}"),
            }
        })
        .collect()
}

/// How many lines a file has so far.
fn count_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|bytes| bytes.iter().filter(|&&b| b == b'\n').count())
        .unwrap_or(0)
}

/// The lapsed leases the server logged (JSON lines), by job id.
fn lapses(log: &Path) -> BTreeMap<i64, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut lapses = BTreeMap::new();
    for line in text.lines() {
        // A line torn by a kill is not one: the server died before the
        // commit that would have made its lapse count.
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let fields = &event["fields"];
        let lapsed = fields["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("lease lapsed"));
        if let (true, Some(id)) = (lapsed, fields["job_id"].as_i64()) {
            *lapses.entry(id).or_insert(0) += 1;
        }
    }
    lapses
}

/// Every job the server has, with its state, read page by page.
fn server_jobs(api: &Api) -> Vec<Value> {
    let mut jobs = Vec::new();
    let mut after = 0;
    loop {
        let (status, answer) = api.get(&format!("/jobs?limit=1000&after={after}"));
        assert_eq!(status, 200, "{answer}");
        let page = answer["jobs"].as_array().expect("jobs").clone();
        if page.is_empty() {
            return jobs;
        }
        after = page
            .iter()
            .filter_map(|j| j["jobID"].as_i64())
            .max()
            .unwrap_or(after);
        jobs.extend(page);
    }
}

// ---------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------

/// The shape of a soak: its servers and its supervisors.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    /// How it names itself on stdout.
    label: &'static str,
    /// Job servers: one on an SQLite file, or several on one PostgreSQL
    /// database, all serving at once.
    servers: usize,
    /// Supervisors (at most as many as [`NAMES`]). With several servers,
    /// each is given every server's URL in an order of its own
    /// ([`Fleet::server_order`]) and takes only the soak's jobs and its own
    /// wake-up probes.
    supervisors: usize,
    /// The longest outage of a killed server, in ms.
    server_outage_ms: u64,
    /// Rounds of wake-up probes after the chaos, each one probe for every
    /// supervisor through every server ([`wake_probes`]); several servers
    /// only.
    probe_rounds: usize,
}

/// The supervisors' names, in order.
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// The chaos soak: one server on an SQLite file, two supervisors.
const ONE_SERVER: Fleet = Fleet {
    label: "chaos soak",
    servers: 1,
    supervisors: 2,
    server_outage_ms: 1500,
    probe_rounds: 0,
};

/// The fleet soak: three servers on one PostgreSQL database, four
/// supervisors spread over them.
const THREE_SERVERS: Fleet = Fleet {
    label: "fleet soak",
    servers: 3,
    supervisors: 4,
    // Long enough for the outages of two servers to overlap now and then.
    server_outage_ms: 3000,
    probe_rounds: 0,
};

impl Fleet {
    /// The servers supervisor `i` is given, in its order: the list turned
    /// by `i`, so that the first ones (which the supervisors use until they
    /// fail) are spread over the servers; past one turn per server, the
    /// rest reversed, so that no two orders are the same.
    fn server_order(&self, i: usize) -> Vec<usize> {
        let n = self.servers;
        let mut order: Vec<usize> = (0..n).map(|j| (i + j) % n).collect();
        if (i / n) % 2 == 1 {
            order[1..].reverse();
        }
        order
    }

    /// Server `i` in what the soak prints.
    fn server_name(&self, i: usize) -> String {
        if self.servers == 1 {
            "server".to_string()
        } else {
            format!("server {}", i + 1)
        }
    }
}

/// What is killed: a server or a supervisor, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Server(usize),
    Supervisor(usize),
}

/// One kill: once the worker has recorded `at` runs, wait `delay`, `kill -9`
/// the target, and start it again after `outage`.
#[derive(Debug)]
struct Kill {
    at: usize,
    target: Target,
    delay: Duration,
    outage: Duration,
}

/// The kills, in order. The servers and every supervisor but the last are
/// killed throughout; the last supervisor only in the first half, so that
/// its last instance lives long enough for its memory to be watched.
fn plan(rng: &mut StdRng, fleet: &Fleet, jobs: usize, per_process: usize) -> Vec<Kill> {
    let last = fleet.supervisors - 1;
    let spans = (0..fleet.servers)
        .map(|i| (Target::Server(i), per_process, 0.9))
        .chain((0..fleet.supervisors).map(|i| {
            if i == last {
                (Target::Supervisor(i), per_process.div_ceil(2), 0.45)
            } else {
                (Target::Supervisor(i), per_process, 0.9)
            }
        }));
    let mut kills = Vec::new();
    for (target, count, to) in spans {
        for _ in 0..count {
            let at = (jobs as f64 * rng.random_range(0.05..to)) as usize;
            // Half of the kills right as a run is recorded (between a
            // worker's exit and its report), half a little later.
            let delay = if rng.random_bool(0.5) {
                Duration::ZERO
            } else {
                Duration::from_millis(rng.random_range(0..500))
            };
            let outage = Duration::from_millis(match target {
                Target::Server(_) => rng.random_range(0..fleet.server_outage_ms),
                Target::Supervisor(_) => rng.random_range(0..1000),
            });
            kills.push(Kill {
                at,
                target,
                delay,
                outage,
            });
        }
    }
    kills.sort_by_key(|k| (k.at, k.target));
    kills
}

/// A number from the environment, or `default`.
fn setting(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: expected a number")),
        Err(_) => default,
    }
}

/// Resident memory samples of one supervisor instance: `(runs recorded so
/// far, kB)`.
type RssSamples = BTreeMap<String, Vec<(usize, u64)>>;

/// Samples the resident memory of every running supervisor.
fn sample(rss: &mut RssSamples, sups: &[SoakSupervisor], done: usize) {
    for sup in sups {
        if let Some(kb) = sup.child.as_ref().and_then(|c| rss_kb(c.id())) {
            rss.entry(sup.tag()).or_default().push((done, kb));
        }
    }
}

/// The soak's directory: removed at the end, unless `JOBMGR_SOAK_KEEP` is
/// set (its logs then stay for a look, also after a failure).
struct Keep(Option<tempfile::TempDir>);

impl Keep {
    fn path(&self) -> &Path {
        self.0.as_ref().expect("the soak's directory").path()
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        if std::env::var_os("JOBMGR_SOAK_KEEP").is_some()
            && let Some(dir) = self.0.take()
        {
            println!("chaos soak: kept {}", dir.keep().display());
        }
    }
}

/// A process killed and not started again yet.
struct Outage {
    /// When it is to be started again.
    until: Instant,
    /// A supervisor's: the `CHAOS_SUP=…` of the instance killed, whose
    /// workers must die with it.
    killed: Option<String>,
}

/// The soak's processes, and those that are down until when.
struct Running {
    servers: Vec<SoakServer>,
    sups: Vec<SoakSupervisor>,
    down: BTreeMap<Target, Outage>,
    /// The kills made, by target.
    kills: BTreeMap<Target, usize>,
    /// Server kills made while another server was down.
    overlapping: usize,
    /// The most servers down at once.
    most_down: usize,
}

impl Running {
    fn new(servers: Vec<SoakServer>, sups: Vec<SoakSupervisor>) -> Running {
        Running {
            servers,
            sups,
            down: BTreeMap::new(),
            kills: BTreeMap::new(),
            overlapping: 0,
            most_down: 0,
        }
    }

    fn servers_down(&self) -> usize {
        self.down
            .keys()
            .filter(|t| matches!(t, Target::Server(_)))
            .count()
    }

    /// `kill -9` of `target`, to be started again after `outage`. A target
    /// that is down is started again first, so that the kill finds it
    /// running; with several servers, the last one up is killed only once
    /// the first one down is back: never all of them at once.
    fn kill(&mut self, target: Target, outage: Duration) {
        self.start_again(target);
        if let Target::Server(_) = target {
            if self.servers.len() > 1 && self.servers_down() + 1 == self.servers.len() {
                let first = self
                    .down
                    .iter()
                    .filter(|(t, _)| matches!(t, Target::Server(_)))
                    .min_by_key(|(_, o)| o.until)
                    .map(|(t, _)| *t);
                if let Some(first) = first {
                    self.start_again(first);
                }
            }
            if self.servers_down() > 0 {
                self.overlapping += 1;
            }
        }
        let killed = match target {
            Target::Server(i) => {
                self.servers[i].kill9();
                None
            }
            Target::Supervisor(i) => {
                let sup = &mut self.sups[i];
                let killed = format!("CHAOS_SUP={}", sup.tag());
                sup.kill9();
                Some(killed)
            }
        };
        *self.kills.entry(target).or_default() += 1;
        self.down.insert(
            target,
            Outage {
                until: Instant::now() + outage,
                killed,
            },
        );
        self.most_down = self.most_down.max(self.servers_down());
    }

    /// Starts `target` again, if it is down.
    fn start_again(&mut self, target: Target) {
        let Some(outage) = self.down.remove(&target) else {
            return;
        };
        match target {
            Target::Server(i) => self.servers[i].spawn(),
            Target::Supervisor(i) => {
                self.sups[i].start();
                // Its workers died with it (parent-death signal); what they
                // started ends by itself within a second.
                if let Some(killed) = outage.killed {
                    eventually(&format!("the workers of {killed} to die"), || {
                        none_with(&killed, None)
                    });
                }
            }
        }
    }

    /// Starts again what is due.
    fn start_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Target> = self
            .down
            .iter()
            .filter(|(_, o)| o.until <= now)
            .map(|(t, _)| *t)
            .collect();
        for target in due {
            self.start_again(target);
        }
    }

    /// Starts again everything that is down.
    fn start_all(&mut self) {
        let down: Vec<Target> = self.down.keys().copied().collect();
        for target in down {
            self.start_again(target);
        }
    }

    /// The end of every log.
    fn logs(&self, fleet: &Fleet) -> String {
        let mut text = String::new();
        for (i, server) in self.servers.iter().enumerate() {
            text += &format!(
                "{} log ends:\n{}\n",
                fleet.server_name(i),
                tail(&server.log)
            );
        }
        for sup in &self.sups {
            text += &format!("supervisor {} log ends:\n{}\n", sup.name, tail(&sup.log()));
        }
        text
    }
}

/// What the store keeps of a job that ended.
struct Ended {
    /// `FINISHED` or `FAILED` (or that it is not in the archive).
    state: String,
    /// Its attempts whose lease lapsed (outcome `lease_lost`).
    lapsed: usize,
}

/// Each job's [`Ended`], read from its history, asking the servers in turn
/// (on a few threads at once).
fn ended(apis: &[Api], ids: &BTreeSet<i64>) -> BTreeMap<i64, Ended> {
    const THREADS: usize = 4;
    let ids: Vec<i64> = ids.iter().copied().collect();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..THREADS)
            .map(|t| {
                let ids = &ids;
                scope.spawn(move || {
                    ids.iter()
                        .skip(t)
                        .step_by(THREADS)
                        .enumerate()
                        .map(|(n, &id)| {
                            let api = &apis[(t + n) % apis.len()];
                            let (status, history) =
                                api.get(&format!("/jobs/{id}/history?limit=1000"));
                            assert_eq!(status, 200, "the history of job {id}: {history}");
                            let lapsed = history["attempts"]
                                .as_array()
                                .expect("attempts")
                                .iter()
                                .filter(|a| a["outcome"] == "lease_lost")
                                .count();
                            let state = history["archived"]["state"]
                                .as_str()
                                .unwrap_or("not in the archive")
                                .to_string();
                            (id, Ended { state, lapsed })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        readers
            .into_iter()
            .flat_map(|r| r.join().expect("a history reader"))
            .collect()
    })
}

/// Runs the soak of `fleet` with `jobs` jobs and `per_process` kills of each
/// server and of each supervisor but the last (half as many of it), and
/// checks the promises.
fn soak(fleet: Fleet, jobs: usize, per_process: usize) {
    assert!(fleet.supervisors >= 1 && fleet.supervisors <= NAMES.len());
    let label = fleet.label;
    let seed = std::env::var("JOBMGR_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();
    println!(
        "{label}: {jobs} jobs, {} servers, {} supervisors, {per_process} kills per process, seed {seed}",
        fleet.servers, fleet.supervisors
    );

    let dir = Keep(Some(tempfile::tempdir().expect("temp dir")));
    let d = dir.path();
    let worker = d
        .join("workers")
        .join(SOAK_JOB.rsplit('/').next().expect("a worker name"));
    executable(&worker, WORKER);
    let out = d.join("runs");
    let probes_out = d.join("probes");
    let marker = format!("CHAOS_RUN={:032x}", rand::random::<u128>());

    let servers: Vec<SoakServer> = if fleet.servers == 1 {
        vec![SoakServer::start(d)]
    } else {
        let database = Arc::new(TestDatabase::create());
        let token_file = write_token_file(d);
        (0..fleet.servers)
            .map(|i| {
                SoakServer::start_on(
                    SoakStore::Postgres(Arc::clone(&database), token_file.clone()),
                    d.join(format!("server-{}.log", i + 1)),
                )
            })
            .collect()
    };
    let urls: Vec<String> = servers.iter().map(SoakServer::url).collect();
    let apis: Vec<Api> = urls.iter().map(|url| Api::new(url)).collect();

    let mut shared: Vec<String> = [
        "--lease",
        LEASE,
        "--kill-grace",
        "1s",
        "--max-workers",
        "4",
        "--ramp",
        "8",
        "--poll-wait",
        "5s",
        "--backoff",
        "1s",
        "--max-backoff",
        "2s",
        "--env",
        &marker,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    shared.extend(["--env".into(), format!("CHAOS_OUT={}", out.display())]);
    if fleet.servers > 1 {
        shared.extend([
            "--env".into(),
            format!("CHAOS_PROBES={}", probes_out.display()),
        ]);
    }
    let sups: Vec<SoakSupervisor> = (0..fleet.supervisors)
        .map(|i| {
            let name = NAMES[i];
            let list: Vec<&str> = fleet
                .server_order(i)
                .into_iter()
                .map(|j| urls[j].as_str())
                .collect();
            let mut extra = shared.clone();
            // Every other supervisor holds jobs ahead (`--fetch-ahead`):
            // its held jobs go back, and die with it, through the kills.
            if i % 2 == 1 {
                extra.extend(["--fetch-ahead".into(), "8".into()]);
            }
            if fleet.servers > 1 {
                executable(&d.join("workers").join(name), PROBE_WORKER);
                extra.extend(["--job-name".into(), format!("Chaos/[_{name}]")]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            SoakSupervisor::new(name, d, supervisor_args(&list.join(","), d, &extra))
        })
        .collect();
    let mut run = Running::new(servers, sups);
    for sup in &mut run.sups {
        sup.start();
    }

    // Every job, created while the supervisors already wait for work (each
    // batch through the next server).
    let mut ids = BTreeSet::new();
    let numbers: Vec<usize> = (0..jobs).collect();
    for (batch, chunk) in numbers.chunks(200).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .map(|n| json!({"name": SOAK_JOB, "data": {"n": n}}))
            .collect();
        let api = &apis[batch % apis.len()];
        let (status, answer) = api.post("/jobs/batch", json!({"jobs": body}));
        assert_eq!(status, 200, "{answer}");
        for id in answer["jobIDs"].as_array().expect("jobIDs") {
            assert!(ids.insert(id.as_i64().expect("id")), "id {id} twice");
        }
    }
    assert_eq!(ids.len(), jobs);

    // The killer.
    let mut rss: RssSamples = BTreeMap::new();
    let mut progress = (0, Instant::now());
    let mut last_sample = Instant::now();
    for kill in plan(&mut rng, &fleet, jobs, per_process) {
        loop {
            run.start_due();
            let done = count_lines(&out);
            if done > progress.0 {
                progress = (done, Instant::now());
            }
            if last_sample.elapsed() > Duration::from_millis(200) {
                sample(&mut rss, &run.sups, done);
                last_sample = Instant::now();
            }
            if done >= kill.at {
                break;
            }
            if progress.1.elapsed() > STALL {
                panic!(
                    "no run recorded for {STALL:?} ({done} so far, next kill at {}); {}",
                    kill.at,
                    run.logs(&fleet)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let fire = Instant::now() + kill.delay;
        loop {
            run.start_due();
            let now = Instant::now();
            if now >= fire {
                break;
            }
            std::thread::sleep((fire - now).min(Duration::from_millis(5)));
        }
        run.kill(kill.target, kill.outage);
    }
    // Everything up again, and left alone.
    run.start_all();

    // Every job finished: none left on the servers in any state.
    let mut remaining = (usize::MAX, Instant::now());
    loop {
        sample(&mut rss, &run.sups, count_lines(&out));
        let left = server_jobs(&apis[0]);
        if left.is_empty() {
            break;
        }
        if left.len() < remaining.0 {
            remaining = (left.len(), Instant::now());
        }
        if remaining.1.elapsed() > STALL {
            let shown: Vec<String> = left
                .iter()
                .take(20)
                .map(|j| {
                    format!(
                        "{} {} attempts={} lapses={}",
                        j["jobID"], j["state"], j["attempts"], j["lapses"]
                    )
                })
                .collect();
            panic!(
                "{} jobs never finished (lost): {shown:#?}; {}",
                left.len(),
                run.logs(&fleet)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let wall = began.elapsed();

    // Each ran, each is archived FINISHED, and none ran more often than its
    // lapsed leases explain.
    let recorded = runs(&out);
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for (id, _, _) in &recorded {
        assert!(ids.contains(id), "job {id} ran, but was never created");
        *times.entry(*id).or_insert(0) += 1;
    }
    let never: Vec<&i64> = ids.iter().filter(|id| !times.contains_key(id)).collect();
    assert!(
        never.is_empty(),
        "{} jobs finished without running (lost): {never:?}",
        never.len()
    );
    let history = ended(&apis, &ids);
    let unfinished: Vec<String> = history
        .iter()
        .filter(|(_, e)| e.state != "FINISHED")
        .map(|(id, e)| format!("job {id}: {}", e.state))
        .collect();
    assert!(
        unfinished.is_empty(),
        "{} jobs did not end FINISHED: {unfinished:?}",
        unfinished.len()
    );
    let mut logged: BTreeMap<i64, usize> = BTreeMap::new();
    for server in &run.servers {
        for (id, n) in lapses(&server.log) {
            *logged.entry(id).or_default() += n;
        }
    }
    let mut unexplained = Vec::new();
    for (id, &n) in &times {
        let lapsed = history[id].lapsed;
        if n > 1 + lapsed {
            let how: Vec<String> = recorded
                .iter()
                .filter(|(i, _, _)| i == id)
                .map(|(_, attempt, instance)| format!("attempt {attempt} by {instance}"))
                .collect();
            unexplained.push(format!(
                "job {id} ran {n} times ({how:?}) with {lapsed} lapsed attempts in its history \
                 ({} lapses logged)",
                logged.get(id).copied().unwrap_or(0)
            ));
        }
    }
    assert!(
        unexplained.is_empty(),
        "duplicate runs outside a lapsed lease:\n{}",
        unexplained.join("\n")
    );
    let duplicates = recorded.len() - ids.len();
    let duplicated = times.values().filter(|&&n| n > 1).count();
    let total_lapses: usize = history.values().map(|e| e.lapsed).sum();
    let lapsed_jobs = history.values().filter(|e| e.lapsed > 0).count();
    let total_logged: usize = logged.values().sum();

    // The spools empty, and no scratch directory left.
    for sup in &run.sups {
        eventually(&format!("supervisor {}'s spool to empty", sup.name), || {
            let waiting: Vec<String> = entries(&sup.spool())
                .into_iter()
                .filter(|n| n.ends_with(".json"))
                .collect();
            if waiting.is_empty() {
                Ok(())
            } else {
                Err(format!("{waiting:?}"))
            }
        });
        eventually(
            &format!("no scratch directory left by supervisor {}", sup.name),
            || match entries(&sup.scratch()) {
                left if left.is_empty() => Ok(()),
                left => Err(format!("{left:?}")),
            },
        );
    }

    // No worker, nor anything a worker started, is left.
    eventually("no process of this run to be left", || {
        none_with(&marker, Some(&worker))
    });

    // The memory of the last supervisor's last instance, watched from a
    // tenth of the jobs after its start to the end, is flat.
    sample(&mut rss, &run.sups, count_lines(&out));
    let watched = run.sups.last().expect("a supervisor").tag();
    let samples = rss.get(&watched).cloned().unwrap_or_default();
    let since = samples.first().map_or(0, |s| s.0) + jobs / 10;
    let warm = samples
        .iter()
        .position(|s| s.0 >= since)
        .unwrap_or(0)
        .min(samples.len().saturating_sub(1));
    let (before, after) = match samples.get(warm) {
        Some(&(_, before)) => (
            before,
            samples[warm..].iter().map(|s| s.1).max().unwrap_or(before),
        ),
        None => panic!("no memory sample of supervisor {}", watched),
    };
    let bound = before + (before / 2).max(16 * 1024);
    assert!(
        after <= bound,
        "supervisor {}'s resident memory grew from {before} kB to {after} kB (bound {bound} kB) over {} runs",
        watched,
        samples.last().map_or(0, |s| s.0) - samples[warm].0
    );

    // Counted in the supervisors' logs, for the report.
    let mut said: BTreeMap<&str, usize> = BTreeMap::new();
    for sup in &run.sups {
        let log = std::fs::read_to_string(sup.log()).unwrap_or_default();
        for (key, text) in [
            ("reports spooled", "report spooled for later delivery"),
            ("spooled reports delivered", "spooled report delivered"),
            (
                "reports refused (lease lost)",
                "server refused the report: the lease was lost",
            ),
            ("spooled reports refused", "server refused a spooled report"),
            (
                "workers stopped (lease not renewed)",
                "lease could not be renewed",
            ),
            (
                "scratch sweeps at start",
                "left by a supervisor that was killed",
            ),
        ] {
            *said.entry(key).or_default() += log.matches(text).count();
        }
        if fleet.servers > 1 {
            *said.entry("switches to another server").or_default() +=
                log.matches("job server switched").count();
        }
    }

    // Cross-server wake-ups, with everything up and idle.
    let probes = (fleet.probe_rounds > 0).then(|| wake_probes(&fleet, &run, &mut rng, &probes_out));

    // A clean stop, all at once (each waits for its fetch to end), and
    // nothing left after it.
    for sup in &run.sups {
        sup.ask_to_stop();
    }
    for sup in &mut run.sups {
        let status = sup.stopped();
        assert!(status.success(), "supervisor {}: {status:?}", sup.name);
    }
    for server in &mut run.servers {
        server.kill9();
    }
    eventually("no process of this run to be left after the stop", || {
        none_with(&marker, Some(&worker))
    });

    let kills: Vec<String> = (0..fleet.servers)
        .map(|i| {
            let n = run.kills.get(&Target::Server(i)).copied().unwrap_or(0);
            format!("{} {n}", fleet.server_name(i))
        })
        .chain((0..fleet.supervisors).map(|i| {
            let n = run.kills.get(&Target::Supervisor(i)).copied().unwrap_or(0);
            format!("supervisor {} {n}", NAMES[i])
        }))
        .collect();
    println!(
        "{label}: {jobs} jobs finished in {:.1} s; kills: {}",
        wall.as_secs_f64(),
        kills.join(", ")
    );
    if fleet.servers > 1 {
        assert!(
            run.most_down < fleet.servers,
            "all {} servers were down at once",
            fleet.servers
        );
        println!(
            "{label}: servers down at once: at most {} of {}; {} server kills while another server was down",
            run.most_down, fleet.servers, run.overlapping
        );
    }
    println!(
        "{label}: {} runs, {duplicates} duplicates (in {duplicated} jobs), 0 lost; {total_lapses} lapsed leases (in {lapsed_jobs} jobs) in the jobs' histories, {total_logged} logged by the servers",
        recorded.len(),
    );
    let mut by_supervisor: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, instance) in &recorded {
        let name = NAMES
            .iter()
            .find(|n| {
                instance
                    .strip_prefix(**n)
                    .is_some_and(|rest| rest.parse::<u32>().is_ok())
            })
            .unwrap_or(&"?");
        *by_supervisor.entry(name).or_default() += 1;
    }
    println!(
        "{label}: runs by supervisor: {}",
        by_supervisor
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{label}: supervisor {} resident memory {before} kB after warm-up, {after} kB at most after (bound {bound} kB)",
        watched
    );
    for (key, count) in said {
        println!("{label}: {key}: {count}");
    }
    if let Some((probes, dropped)) = probes {
        report_wake_ups(label, &probes, dropped);
    }
}

// ---------------------------------------------------------------------------
// Wake-up probes
// ---------------------------------------------------------------------------

/// One wake-up probe's measures, in ms from the create's acknowledgement.
struct Probe {
    /// Created through another server than the one its supervisor uses.
    cross: bool,
    /// To the hand-out, by the store's clock (the attempt's `started`:
    /// whole ms of the database's clock as the server reads it, the
    /// offset measured to about a millisecond).
    handout: f64,
    /// To the supervisor's "starting worker" (its log's µs timestamp):
    /// the job received, its scratch directory made, just before the spawn.
    supervisor: f64,
    /// To the worker's start, by the worker's clock (`date +%s%N`).
    worker: f64,
}

/// The wall clock, in ms since the epoch.
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
        * 1000.0
}

/// A time of the API (`YYYY-MM-DD HH:MM:SS.mmm`, UTC) in ms since the
/// epoch.
fn api_ms(text: &str) -> f64 {
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .unwrap_or_else(|e| panic!("{text:?} is not a time: {e}"))
        .and_utc()
        .timestamp_millis() as f64
}

/// The server a supervisor's running instance uses: the first of its list,
/// or the last it logged a switch to (`job server switched … to=URL`).
fn server_in_use(sup: &SoakSupervisor, order: &[usize], urls: &[String]) -> usize {
    let mut current = order[0];
    for line in sup
        .instance_log()
        .lines()
        .filter(|l| l.contains("job server switched"))
    {
        let to = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("to="))
            .unwrap_or_else(|| panic!("no to= in {line:?}"));
        current = urls
            .iter()
            .position(|u| u == to)
            .unwrap_or_else(|| panic!("{to} is none of {urls:?}"));
    }
    current
}

/// When supervisor `sup`'s running instance logged that it starts the
/// worker of job `id`, in ms since the epoch.
fn starting_logged(sup: &SoakSupervisor, id: i64) -> Result<f64, String> {
    let job = format!("job{{job_id={id} ");
    let line = sup
        .instance_log()
        .lines()
        .find(|l| l.contains(&job) && l.contains("starting worker"))
        .map(str::to_string)
        .ok_or_else(|| format!("no \"starting worker\" of job {id} logged yet"))?;
    let stamp = line.split_whitespace().next().unwrap_or_default();
    let at = chrono::DateTime::parse_from_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("{stamp:?} in {line:?} is not a time: {e}"));
    Ok(at.timestamp_micros() as f64 / 1000.0)
}

/// How many GetJob requests a server holds (from `/healthz`).
fn waiting(api: &Api) -> i64 {
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 200, "{health}");
    health["waiting"].as_i64().unwrap_or(0)
}

/// The probe worker's line for job `id`: when it started (ns since the
/// epoch) and which supervisor instance ran it.
fn probe_line(path: &Path, id: i64) -> Result<(i64, String), String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let prefix = format!("{id} ");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .ok_or_else(|| format!("no line for job {id} yet"))?;
    let mut words = line.split(' ').skip(1);
    match (words.next().and_then(|w| w.parse().ok()), words.next()) {
        (Some(ns), Some(tag)) => Ok((ns, tag.to_string())),
        _ => panic!("a torn probe line {line:?}"),
    }
}

/// Cross-server wake-up latency: with every server and supervisor up and
/// idle, each supervisor holding a GetJob on the server it uses, a job only
/// supervisor `k` takes (`Chaos/k`) is created through server `x`, one at a
/// time, for every `k` and `x` in each round (in a random order). The time
/// from the create's acknowledgement to the job's hand-out is a cross-server
/// wake-up when `x` is not the server `k` uses (the commit on `x` reaches
/// `k`'s server by LISTEN/NOTIFY), a same-server one otherwise, shown for
/// comparison. A probe during which its supervisor switched servers tells
/// neither, and is dropped (counted). Returns the probes and the dropped.
fn wake_probes(
    fleet: &Fleet,
    run: &Running,
    rng: &mut StdRng,
    probes_out: &Path,
) -> (Vec<Probe>, usize) {
    use rand::seq::SliceRandom;
    let urls: Vec<String> = run.servers.iter().map(SoakServer::url).collect();
    let apis: Vec<Api> = urls.iter().map(|url| Api::new(url)).collect();
    let orders: Vec<Vec<usize>> = (0..fleet.supervisors)
        .map(|i| fleet.server_order(i))
        .collect();
    let in_use = |k: usize| server_in_use(&run.sups[k], &orders[k], &urls);
    let mut plan = Vec::new();
    for _ in 0..fleet.probe_rounds {
        let mut round: Vec<(usize, usize)> = (0..fleet.supervisors)
            .flat_map(|k| (0..fleet.servers).map(move |x| (k, x)))
            .collect();
        round.shuffle(rng);
        plan.extend(round);
    }
    let mut probes = Vec::new();
    let mut dropped = 0;
    for (k, x) in plan {
        // Every supervisor waits for a job on the server it uses.
        eventually(
            "every supervisor to hold a GetJob on the server it uses",
            || {
                let uses: Vec<usize> = (0..fleet.supervisors).map(in_use).collect();
                let want: Vec<i64> = (0..fleet.servers)
                    .map(|j| uses.iter().filter(|&&u| u == j).count() as i64)
                    .collect();
                let held: Vec<i64> = apis.iter().map(waiting).collect();
                if held == want {
                    Ok(())
                } else {
                    Err(format!(
                        "held {held:?}, want {want:?} (the servers in use: {uses:?})"
                    ))
                }
            },
        );
        let y = in_use(k);
        let sup = &run.sups[k];
        let id = apis[x].create(json!({"name": format!("Chaos/{}", sup.name)}));
        let acked = wall_ms();
        let (started_ns, tag) =
            within(&format!("probe {id} to run"), || probe_line(probes_out, id));
        assert_eq!(
            tag,
            sup.tag(),
            "probe {id} for supervisor {} ran elsewhere",
            sup.tag()
        );
        let logged = within(
            &format!("supervisor {} to log probe {id}", sup.tag()),
            || starting_logged(sup, id),
        );
        let history = within(&format!("probe {id} to end"), || {
            let (status, history) = apis[x].get(&format!("/jobs/{id}/history"));
            if status == 200 && history["archived"]["state"] == "FINISHED" {
                Ok(history)
            } else {
                Err(format!("{status} {history}"))
            }
        });
        let started = history["attempts"][0]["started"]
            .as_str()
            .unwrap_or_else(|| panic!("no start in {history}"));
        if in_use(k) != y {
            dropped += 1;
            continue;
        }
        probes.push(Probe {
            cross: x != y,
            handout: api_ms(started) - acked,
            supervisor: logged - acked,
            worker: started_ns as f64 / 1e6 - acked,
        });
    }
    (probes, dropped)
}

/// The `p` quantile (nearest rank) of `values`.
fn quantile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Prints the wake-up latencies, cross-server and same-server.
fn report_wake_ups(label: &str, probes: &[Probe], dropped: usize) {
    for (cross, what) in [
        (
            true,
            "cross-server wake-up (created through one server, taken by a supervisor on another)",
        ),
        (false, "same-server wake-up (for comparison)"),
    ] {
        let these: Vec<&Probe> = probes.iter().filter(|p| p.cross == cross).collect();
        println!("{label}: {what}: {} probes", these.len());
        if these.is_empty() {
            continue;
        }
        for (to, measure) in [
            (
                "the hand-out (store clock, 1 ms resolution)",
                (|p: &Probe| p.handout) as fn(&Probe) -> f64,
            ),
            (
                "the supervisor starting the worker (its log)",
                |p: &Probe| p.supervisor,
            ),
            ("the worker running (its clock)", |p: &Probe| p.worker),
        ] {
            let values: Vec<f64> = these.iter().map(|p| measure(p)).collect();
            println!(
                "{label}:   create acknowledged to {to}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                quantile(&values, 0.5),
                quantile(&values, 0.99),
                quantile(&values, 1.0),
            );
        }
    }
    if dropped > 0 {
        println!("{label}: wake-up probes dropped (their supervisor switched servers): {dropped}");
    }
}

// ---------------------------------------------------------------------------
// The soaks' tests
// ---------------------------------------------------------------------------

/// The short soak, with the other tests: a few hundred jobs, a few kills.
#[test]
fn chaos_soak_short() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 200);
    soak(ONE_SERVER, jobs, setting("JOBMGR_SOAK_KILLS", 2));
}

/// The long soak: 2,000 jobs and ten times the kills. Run it with
/// `cargo test --test integration chaos_soak_long -- --ignored --nocapture`.
#[test]
#[ignore = "the long soak takes minutes; run it with --ignored"]
fn chaos_soak_long() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 2000);
    soak(
        ONE_SERVER,
        jobs,
        setting("JOBMGR_SOAK_KILLS", (jobs / 100).max(2)),
    );
}

/// The short fleet soak, with the other tests: three servers on one
/// PostgreSQL database, four supervisors, 300 jobs, a few kills of each,
/// a few wake-up probes.
#[test]
fn fleet_soak_short() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 300);
    let fleet = Fleet {
        probe_rounds: setting("JOBMGR_SOAK_PROBES", 2),
        ..THREE_SERVERS
    };
    soak(fleet, jobs, setting("JOBMGR_SOAK_KILLS", 2));
}

/// The long fleet soak: 5,000 jobs, a kill of each server and supervisor
/// per hundred jobs, and 40 rounds of wake-up probes. Run it with
/// `cargo test --test integration fleet_soak_long -- --ignored --nocapture`.
#[test]
#[ignore = "the long fleet soak takes many minutes; run it with --ignored"]
fn fleet_soak_long() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 5000);
    let fleet = Fleet {
        probe_rounds: setting("JOBMGR_SOAK_PROBES", 40),
        ..THREE_SERVERS
    };
    soak(
        fleet,
        jobs,
        setting("JOBMGR_SOAK_KILLS", (jobs / 100).max(2)),
    );
}

// ---------------------------------------------------------------------------
// Regressions the soak found
// ---------------------------------------------------------------------------

/// A supervisor killed with `kill -9` cannot remove the scratch directory of
/// the job it was running; the next one on the same scratch directory does,
/// at start.
#[test]
fn a_killed_supervisors_scratch_directories_are_removed_by_the_next_start() {
    let server = Server::start();
    let api = server.api();
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let o = d.display();
    // The first run leaves its scratch directory's path and hangs; a later
    // one succeeds.
    executable(
        &d.join("workers").join("Hold"),
        &format!(
            "#!/bin/sh\nif [ \"$JOBMGR_ATTEMPT\" = 1 ]; then\n  echo \"$PWD\" > '{o}/cwd.tmp' && mv '{o}/cwd.tmp' '{o}/cwd'\n  exec sleep 1000\nfi\n"
        ),
    );
    let args = supervisor_args(&server.url, d, &["--lease", "2s", "--kill-grace", "1s"]);
    let mut sup = SoakSupervisor::new("s", d, args);
    sup.start();
    let id = api.create(json!({"name": "Hold"}));
    let cwd = poll("the worker to start", || {
        std::fs::read_to_string(d.join("cwd")).ok()
    });
    let scratch = PathBuf::from(cwd.trim());
    assert!(
        scratch.starts_with(sup.scratch()),
        "{} is not in {}",
        scratch.display(),
        sup.scratch().display()
    );

    let pid = sup.pid();
    sup.kill9();
    eventually("the killed supervisor's worker to die", || {
        none_with("CHAOS_SUP=s1", None)
    });
    assert!(
        scratch.is_dir(),
        "the scratch directory of supervisor {pid}'s job went with it, so this test shows nothing"
    );

    sup.start();
    poll("the leftover scratch directory to be removed", || {
        (!scratch.exists()).then_some(())
    });
    // The job comes back when its lease lapses, and runs to the end.
    poll("the job to run again and finish", || {
        api.state(id).is_none().then_some(())
    });
    assert!(
        entries(&sup.scratch()).is_empty(),
        "{:?}",
        entries(&sup.scratch())
    );
    let status = sup.terminate();
    assert!(status.success(), "{status:?}; {}", tail(&sup.log()));
}

/// Reports spooled while the server is down are delivered, once it is back,
/// before their leases lapse, however many were spooled: each job runs once.
/// (The courier used to double its backoff on every report spooled during
/// the outage, up to 30 seconds, so that reports reached the restarted
/// server after the one term it extends held leases by, and their jobs ran
/// again.)
#[test]
fn reports_spooled_during_an_outage_land_before_their_leases_lapse() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let o = d.display();
    executable(
        &d.join("workers").join("Wait"),
        &format!(
            "#!/bin/sh\ntouch '{o}/started-'\"$JOBMGR_JOB_ID\"\nwhile [ ! -e '{o}/go' ]; do sleep 0.02; done\nprintf '%s\\n' \"$JOBMGR_JOB_ID\" >> '{o}/runs'\n"
        ),
    );
    let mut server = SoakServer::start(d);
    let args = supervisor_args(
        &server.url(),
        d,
        &[
            "--lease",
            "6s",
            "--kill-grace",
            "1s",
            "--max-workers",
            "8",
            "--ramp",
            "8",
        ],
    );
    let mut sup = SoakSupervisor::new("c", d, args);
    sup.start();
    let api = Api::new(&server.url());
    let jobs: Vec<Value> = (0..8).map(|_| json!({"name": "Wait"})).collect();
    let (status, answer) = api.post("/jobs/batch", json!({"jobs": jobs}));
    assert_eq!(status, 200, "{answer}");
    let ids: BTreeSet<i64> = answer["jobIDs"]
        .as_array()
        .expect("jobIDs")
        .iter()
        .map(|id| id.as_i64().expect("id"))
        .collect();
    eventually("all eight workers to start", || {
        let started = entries(d)
            .into_iter()
            .filter(|n| n.starts_with("started-"))
            .count();
        if started == ids.len() {
            Ok(())
        } else {
            Err(format!("{started} started"))
        }
    });

    server.kill9();
    std::fs::write(d.join("go"), "").expect("go");
    eventually("every report to be spooled", || {
        let spooled = entries(&sup.spool())
            .into_iter()
            .filter(|n| n.ends_with(".json"))
            .count();
        if spooled == ids.len() {
            Ok(())
        } else {
            Err(format!("{spooled} spooled; {}", tail(&sup.log())))
        }
    });
    server.spawn();

    eventually("every job to be finished", || {
        let left = server_jobs(&api);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let ran: Vec<i64> = std::fs::read_to_string(d.join("runs"))
        .expect("runs")
        .lines()
        .map(|l| l.parse().expect("job id"))
        .collect();
    let lapsed = lapses(&server.log);
    assert!(
        lapsed.is_empty()
            && ran.len() == ids.len()
            && ran.iter().copied().collect::<BTreeSet<_>>() == ids,
        "leases lapsed {lapsed:?} and jobs ran {ran:?}, not once each of {ids:?}; supervisor log ends:\n{}",
        tail(&sup.log())
    );
    assert!(
        entries(&sup.spool()).iter().all(|n| !n.ends_with(".json")),
        "{:?}",
        entries(&sup.spool())
    );
    let status = sup.terminate();
    assert!(status.success(), "{status:?}; {}", tail(&sup.log()));
}
