//! The chaos soaks: jobs go through job servers and supervisors (each a real
//! `jobmgr --server …` process with its own spool and scratch directories)
//! while a killer sends `kill -9` to all of them at random moments, a
//! bounded number of times, and starts each again on the same store or
//! spool. Everything is on 127.0.0.1, and only processes this test started
//! are ever killed, by pid. Two shapes of [`Fleet`] share the machinery:
//!
//! - the chaos soak: one `jobmgr server` on an SQLite file and two
//!   supervisors;
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
//!   history records as `lapsed` (the store's own record, written with the
//!   lapse; the lapses the servers logged are counted beside it). They are
//!   counted and reported on stdout;
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
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .expect("SIGTERM");
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
        SoakServer::start_on(SoakStore::Sqlite(dir.join("jobs.db")), dir.join("server.log"))
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
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        text
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
fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
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

/// What is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Server,
    SupervisorA,
    SupervisorB,
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

/// The kills, in order. The server and supervisor A are killed throughout;
/// supervisor B only in the first half, so that its last instance lives
/// long enough for its memory to be watched.
fn plan(rng: &mut StdRng, jobs: usize, per_process: usize) -> Vec<Kill> {
    let mut kills = Vec::new();
    let spans = [
        (Target::Server, per_process, 0.05, 0.9),
        (Target::SupervisorA, per_process, 0.05, 0.9),
        (Target::SupervisorB, per_process.div_ceil(2), 0.05, 0.45),
    ];
    for (target, count, from, to) in spans {
        for _ in 0..count {
            let at = (jobs as f64 * rng.random_range(from..to)) as usize;
            // Half of the kills right as a run is recorded (between a
            // worker's exit and its report), half a little later.
            let delay = if rng.random_bool(0.5) {
                Duration::ZERO
            } else {
                Duration::from_millis(rng.random_range(0..500))
            };
            let outage = Duration::from_millis(match target {
                Target::Server => rng.random_range(0..1500),
                _ => rng.random_range(0..1000),
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

/// Runs the soak with `jobs` jobs and `per_process` kills of the server and
/// of supervisor A (half as many of B), and checks the promises.
fn soak(jobs: usize, per_process: usize) {
    let seed = std::env::var("JOBMGR_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();
    println!("chaos soak: {jobs} jobs, {per_process} kills per process, seed {seed}");

    let dir = Keep(Some(tempfile::tempdir().expect("temp dir")));
    let d = dir.path();
    let worker = d.join("workers").join("Chaos");
    executable(&worker, WORKER);
    let out = d.join("runs");
    let marker = format!("CHAOS_RUN={:032x}", rand::random::<u128>());

    let mut server = SoakServer::start(d);
    let args = supervisor_args(
        &server.url(),
        d,
        &[
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
            "--env",
            &format!("CHAOS_OUT={}", out.display()),
        ],
    );
    let mut a = SoakSupervisor::new("a", d, args.clone());
    let mut b = SoakSupervisor::new("b", d, args);
    a.start();
    b.start();

    // Every job, created while the supervisors already wait for work.
    let api = Api::new(&server.url());
    let mut ids = BTreeSet::new();
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(200) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|n| json!({"name": "Chaos", "data": {"n": n}}))
            .collect();
        let (status, answer) = api.post("/jobs/batch", json!({"jobs": body}));
        assert_eq!(status, 200, "{answer}");
        for id in answer["jobIDs"].as_array().expect("jobIDs") {
            assert!(ids.insert(id.as_i64().expect("id")), "id {id} twice");
        }
    }
    assert_eq!(ids.len(), jobs);

    let logs = |a: &SoakSupervisor, b: &SoakSupervisor, server: &SoakServer| {
        format!(
            "server log ends:\n{}\nsupervisor a log ends:\n{}\nsupervisor b log ends:\n{}",
            tail(&server.log),
            tail(&a.log()),
            tail(&b.log())
        )
    };

    // The killer.
    let mut rss: RssSamples = BTreeMap::new();
    let mut sample = |a: &SoakSupervisor, b: &SoakSupervisor, done: usize| {
        for sup in [a, b] {
            if let Some(kb) = sup.child.as_ref().and_then(|c| rss_kb(c.id())) {
                rss.entry(sup.tag()).or_default().push((done, kb));
            }
        }
    };
    let mut kills: BTreeMap<Target, usize> = BTreeMap::new();
    let mut progress = (0, Instant::now());
    let mut last_sample = Instant::now();
    for kill in plan(&mut rng, jobs, per_process) {
        loop {
            let done = count_lines(&out);
            if done > progress.0 {
                progress = (done, Instant::now());
            }
            if last_sample.elapsed() > Duration::from_millis(200) {
                sample(&a, &b, done);
                last_sample = Instant::now();
            }
            if done >= kill.at {
                break;
            }
            if progress.1.elapsed() > STALL {
                panic!(
                    "no run recorded for {STALL:?} ({done} so far, next kill at {}); {}",
                    kill.at,
                    logs(&a, &b, &server)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(kill.delay);
        *kills.entry(kill.target).or_default() += 1;
        match kill.target {
            Target::Server => {
                server.kill9();
                std::thread::sleep(kill.outage);
                server.spawn();
            }
            Target::SupervisorA | Target::SupervisorB => {
                let sup = if kill.target == Target::SupervisorA {
                    &mut a
                } else {
                    &mut b
                };
                let killed = format!("CHAOS_SUP={}", sup.tag());
                sup.kill9();
                std::thread::sleep(kill.outage);
                sup.start();
                // Its workers died with it (parent-death signal); what they
                // started ends by itself within a second.
                eventually(&format!("the workers of {killed} to die"), || {
                    none_with(&killed, None)
                });
            }
        }
    }

    // Every job finished: none left on the server in any state.
    let mut remaining = (usize::MAX, Instant::now());
    loop {
        sample(&a, &b, count_lines(&out));
        let left = server_jobs(&api);
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
                logs(&a, &b, &server)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let wall = began.elapsed();

    // Each ran, and none more often than its lapses explain.
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
    let lapsed = lapses(&server.log);
    let mut unexplained = Vec::new();
    for (id, &n) in &times {
        let lapses = lapsed.get(id).copied().unwrap_or(0);
        if n > 1 + lapses {
            let how: Vec<String> = recorded
                .iter()
                .filter(|(i, _, _)| i == id)
                .map(|(_, attempt, instance)| format!("attempt {attempt} by {instance}"))
                .collect();
            unexplained.push(format!(
                "job {id} ran {n} times ({how:?}) with {lapses} lapsed leases"
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
    let total_lapses: usize = lapsed.values().sum();

    // The spools empty, and no scratch directory left.
    for sup in [&a, &b] {
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

    // The memory of B's last instance, watched from a tenth of the jobs
    // after its start to the end, is flat.
    sample(&a, &b, count_lines(&out));
    let samples = rss.get(&b.tag()).cloned().unwrap_or_default();
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
        None => panic!("no memory sample of supervisor {}", b.tag()),
    };
    let bound = before + (before / 2).max(16 * 1024);
    assert!(
        after <= bound,
        "supervisor {}'s resident memory grew from {before} kB to {after} kB (bound {bound} kB) over {} runs",
        b.tag(),
        samples.last().map_or(0, |s| s.0) - samples[warm].0
    );

    // Counted in the supervisors' logs, for the report.
    let mut said: BTreeMap<&str, usize> = BTreeMap::new();
    for sup in [&a, &b] {
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
    }

    // A clean stop, and nothing left after it.
    for sup in [&mut a, &mut b] {
        let status = sup.terminate();
        assert!(status.success(), "supervisor {}: {status:?}", sup.name);
    }
    server.kill9();
    eventually("no process of this run to be left after the stop", || {
        none_with(&marker, Some(&worker))
    });

    println!(
        "chaos soak: {jobs} jobs finished in {:.1} s; kills: server {}, supervisor a {}, supervisor b {}",
        wall.as_secs_f64(),
        kills.get(&Target::Server).unwrap_or(&0),
        kills.get(&Target::SupervisorA).unwrap_or(&0),
        kills.get(&Target::SupervisorB).unwrap_or(&0),
    );
    println!(
        "chaos soak: {} runs, {duplicates} duplicates (in {duplicated} jobs), 0 lost; {total_lapses} lapsed leases (in {} jobs)",
        recorded.len(),
        lapsed.len()
    );
    println!(
        "chaos soak: supervisor {} resident memory {before} kB after warm-up, {after} kB at most after (bound {bound} kB)",
        b.tag()
    );
    for (key, count) in said {
        println!("chaos soak: {key}: {count}");
    }
}

/// The short soak, with the other tests: a few hundred jobs, a few kills.
#[test]
fn chaos_soak_short() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 200);
    soak(jobs, setting("JOBMGR_SOAK_KILLS", 2));
}

/// The long soak: 2,000 jobs and ten times the kills. Run it with
/// `cargo test --test integration chaos_soak_long -- --ignored --nocapture`.
#[test]
#[ignore = "the long soak takes minutes; run it with --ignored"]
fn chaos_soak_long() {
    let jobs = setting("JOBMGR_SOAK_JOBS", 2000);
    soak(jobs, setting("JOBMGR_SOAK_KILLS", (jobs / 100).max(2)));
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
