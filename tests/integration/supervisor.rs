//! The supervisor end to end: the real `jobmgr` supervisor against a real
//! `jobmgr server`, running real worker scripts as real processes. Every
//! outcome is checked on the server (or in files the workers write), and
//! every wait polls with a generous deadline.

use crate::common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Several arguments at once.
trait ManyArgs {
    fn args(self, args: &[&str]) -> Self;
}

impl ManyArgs for SupervisorBuilder {
    fn args(self, args: &[&str]) -> Self {
        args.iter().fold(self, |builder, arg| builder.arg(arg))
    }
}

impl Logs for RawSupervisor {
    fn logs(&self) -> String {
        format!(
            "supervisor stderr:\n{}",
            std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
        )
    }
}

/// Waits until the job is gone from the server (finished and deleted).
fn wait_gone(api: &Api, logs: &dyn Logs, id: i64) {
    wait_for(
        &format!("job {id} to be finished and deleted"),
        logs,
        || api.state(id).is_none().then_some(()),
    );
}

/// Waits until a file exists (workers write theirs with `mv`, so it is
/// whole) and returns its text.
fn wait_file(logs: &dyn Logs, path: &Path) -> String {
    wait_for(&format!("{} to exist", path.display()), logs, || {
        std::fs::read_to_string(path).ok()
    })
}

/// Whether a process is gone: no `/proc/PID`, or a zombie (an orphan whose
/// reaper has not reaped it yet is dead all the same).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            matches!(state, Some(Some('Z' | 'X')))
        }
    }
}

/// Waits until the process `pid` is dead.
fn wait_dead(logs: &dyn Logs, pid: u32, what: &str) {
    wait_for(&format!("{what} (pid {pid}) to die"), logs, || {
        dead(pid).then_some(())
    });
}

/// A pid written by a worker.
fn pid_in(text: &str) -> u32 {
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {text:?}"))
}

/// Milliseconds since the epoch of a server timestamp.
fn ms(text: &Value) -> i64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {text}"));
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .unwrap_or_else(|e| panic!("bad timestamp {text:?}: {e}"))
        .and_utc()
        .timestamp_millis()
}

/// The failure details the supervisor keeps in a job's data.
fn details(job: &Value) -> &Value {
    &job["data"]["_jobmgr"]
}

/// Every job on the server.
fn all_jobs(api: &Api) -> Vec<Value> {
    let (status, answer) = api.get("/jobs?limit=1000");
    assert_eq!(status, 200, "{answer}");
    answer["jobs"].as_array().expect("jobs").clone()
}

/// The `*.json` reports waiting in a spool directory.
fn spooled(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect()
        })
        .unwrap_or_default()
}

/// An executable script at `path`.
fn executable(path: &Path, script: &str) {
    std::fs::write(path, script).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Runs `command` (a `jobmgr` process printing one ready line on stdout,
/// its stderr going to `stderr`) and waits for the ready line.
fn spawn_ready(mut command: Command, stderr: &Path) -> (Child, String) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr)
        .expect("stderr file");
    command
        .env("JOBMGR_LOG", "info,jobmgr=debug")
        // Servers and supervisors alike use the fixtures' token.
        .env("JOBMGR_TOKEN", token())
        .stdout(Stdio::piped())
        .stderr(log)
        .stdin(Stdio::null());
    let mut child = command.spawn().expect("spawn jobmgr");
    match ready_line(&mut child) {
        Ok(line) => (child, line),
        Err(_) => {
            kill_and_reap(&mut child, "a jobmgr that did not become ready");
            panic!(
                "jobmgr did not become ready; stderr:\n{}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
    }
}

/// A `jobmgr server` on a port fixed for its whole life, so that a restart
/// comes back at the same URL (the common fixture's restart changes the
/// port). Killed by pid when dropped.
struct PortServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl PortServer {
    fn start() -> PortServer {
        let mut server = PortServer {
            child: None,
            port: Self::free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.spawn();
        server
    }

    /// A free port below the ephemeral range, so that no outgoing
    /// connection takes it while the server is down.
    fn free_port() -> u16 {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768);
        let start = 10_000 + (std::process::id() as u16 % 1000) * 7;
        (start..low.max(start + 1))
            .chain(10_000..start)
            .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
            .expect("a free port below the ephemeral range")
    }

    fn spawn(&mut self) {
        let mut command = Command::new(bin());
        command
            .arg("server")
            .arg("--db")
            .arg(self.dir.path().join("jobs.db"))
            .arg("--http")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--bedrock")
            .arg("none");
        let (child, _) = spawn_ready(command, &self.dir.path().join("stderr"));
        self.child = Some(child);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, "the server on a fixed port");
        }
    }
}

impl Drop for PortServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A supervisor started with arguments of the test's choosing (the common
/// builder always passes its own `--worker-path`, and clap refuses a flag
/// given twice). Load 0 and plenty of memory, like the builder's. Killed by
/// pid when dropped.
struct RawSupervisor {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RawSupervisor {
    fn start(server_url: &str, worker_path: &Path, extra: &[&str]) -> RawSupervisor {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        std::fs::write(d.join("loadavg"), "0.00 0.00 0.00 1/100 1\n").expect("loadavg");
        std::fs::write(
            d.join("meminfo"),
            "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n",
        )
        .expect("meminfo");
        let mut command = Command::new(bin());
        command
            .arg("--server")
            .arg(server_url)
            .arg("--worker-path")
            .arg(worker_path)
            .arg("--scratch-dir")
            .arg(d.join("scratch"))
            .arg("--spool-dir")
            .arg(d.join("spool"))
            .arg("--loadavg-path")
            .arg(d.join("loadavg"))
            .arg("--meminfo-path")
            .arg(d.join("meminfo"))
            .args(["--poll-wait", "5s"])
            .args(extra);
        let (child, _) = spawn_ready(command, &d.join("stderr"));
        RawSupervisor {
            child: Some(child),
            dir,
        }
    }
}

impl Drop for RawSupervisor {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, "a supervisor started by hand");
        }
    }
}

// ---------------------------------------------------------------------------
// The payload round trip
// ---------------------------------------------------------------------------

#[test]
fn the_worker_gets_the_job_on_stdin_a_scrubbed_environment_and_a_fresh_private_scratch_dir() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"o='{o}'
cat > "$o/stdin.tmp" && mv "$o/stdin.tmp" "$o/stdin"
tr '\0' '\n' < /proc/$$/environ > "$o/env"
pwd -P > "$o/cwd"
stat -c %a . > "$o/mode"
ls -A . > "$o/listing"
echo scribble > left-behind
mkdir -p sub/dir && echo x > sub/dir/file
echo ok > "$o/done.tmp" && mv "$o/done.tmp" "$o/done""#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("RoundTrip", &script)
        .arg("--env")
        .arg("FOO=bar")
        .start();
    let data = json!({"greeting": "héllo\n\"quoted\" \\ ☃", "n": [1, 2, {"deep": null}]});
    let id = api.create(json!({"name": "RoundTrip", "data": data, "priority": 750}));
    wait_gone(&api, &sup, id);
    assert_eq!(wait_file(&sup, &out.path().join("done")).trim(), "ok");

    // stdin: the hand-out object, whole, then EOF; no lease in it.
    let stdin = std::fs::read_to_string(out.path().join("stdin")).unwrap();
    let handout: Value = serde_json::from_str(&stdin)
        .unwrap_or_else(|e| panic!("stdin is not one JSON object ({e}): {stdin:?}"));
    assert_eq!(handout["jobID"], id, "{handout}");
    assert_eq!(handout["name"], "RoundTrip", "{handout}");
    assert_eq!(handout["data"], data, "{handout}");
    assert_eq!(handout["priority"], 750, "{handout}");
    for key in ["nextRun", "lastRun", "created", "repeat"] {
        assert!(
            handout.get(key).is_some(),
            "hand-out without {key}: {handout}"
        );
    }
    assert!(
        handout.get("lease").is_none(),
        "the lease token reached the worker: {handout}"
    );
    assert!(handout.get("leaseExpires").is_none(), "{handout}");

    // The environment: the allow-list, the extras, the job's.
    let env_text = std::fs::read_to_string(out.path().join("env")).unwrap();
    let env: BTreeMap<&str, &str> = env_text.lines().filter_map(|l| l.split_once('=')).collect();
    let cwd = std::fs::read_to_string(out.path().join("cwd"))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        env.get("JOBMGR_JOB_ID"),
        Some(&id.to_string().as_str()),
        "{env:?}"
    );
    assert_eq!(env.get("JOBMGR_JOB_NAME"), Some(&"RoundTrip"), "{env:?}");
    assert_eq!(env.get("JOBMGR_ATTEMPT"), Some(&"1"), "{env:?}");
    assert_eq!(env.get("JOBMGR_PROGRESS_FD"), Some(&"3"), "{env:?}");
    assert_eq!(env.get("FOO"), Some(&"bar"), "--env extra missing: {env:?}");
    assert_eq!(env.get("HOME"), Some(&cwd.as_str()), "{env:?}");
    assert_eq!(env.get("TMPDIR"), Some(&cwd.as_str()), "{env:?}");
    assert!(env.contains_key("PATH"), "{env:?}");
    // The harness sets JOBMGR_LOG on the supervisor; it is not on the list.
    assert!(
        !env.contains_key("JOBMGR_LOG"),
        "supervisor env leaked: {env:?}"
    );
    for leaked in [
        "CARGO_MANIFEST_DIR",
        "CARGO_PKG_NAME",
        "RUST_TEST_THREADS",
        "USER",
        "SHELL",
    ] {
        if std::env::var_os(leaked).is_some() {
            assert!(
                !env.contains_key(leaked),
                "{leaked} leaked from the supervisor: {env:?}"
            );
        }
    }
    let allowed: BTreeSet<&str> = [
        "PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "HOME",
        "TMPDIR",
        "FOO",
        "JOBMGR_JOB_ID",
        "JOBMGR_JOB_NAME",
        "JOBMGR_ATTEMPT",
        "JOBMGR_PROGRESS_FD",
    ]
    .into();
    for key in env.keys() {
        assert!(
            allowed.contains(key),
            "{key} is not on the allow-list: {env:?}"
        );
    }

    // The working directory: fresh, private, inside the scratch dir, gone.
    let scratch = sup.scratch().canonicalize().unwrap();
    assert_eq!(
        Path::new(&cwd).parent(),
        Some(scratch.as_path()),
        "cwd {cwd} not in {}",
        scratch.display()
    );
    assert_eq!(
        std::fs::read_to_string(out.path().join("mode"))
            .unwrap()
            .trim(),
        "700"
    );
    assert_eq!(
        std::fs::read_to_string(out.path().join("listing")).unwrap(),
        "",
        "scratch dir not fresh"
    );
    // Removed when the job ends, which may come just after its report.
    wait_for(
        &format!("the scratch dir {cwd} to be removed"),
        &sup,
        || {
            let left: Vec<_> = std::fs::read_dir(&scratch)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            (!Path::new(&cwd).exists() && left.is_empty()).then_some(())
        },
    );
}

// ---------------------------------------------------------------------------
// Exit paths
// ---------------------------------------------------------------------------

#[test]
fn exit_0_finishes_the_job() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Done",
            &sh(&format!(
                "echo ran >> '{o}/runs'\necho 'not json at the end'\nexit 0"
            )),
        )
        .start();
    let id = api.create(json!({"name": "Done", "data": {"a": 1}}));
    wait_gone(&api, &sup, id);
    assert_eq!(
        std::fs::read_to_string(out.path().join("runs")).unwrap(),
        "ran\n"
    );
}

#[test]
fn a_json_object_on_stdouts_last_line_is_the_next_runs_data() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"o='{o}'
n=$(cat "$o/count" 2>/dev/null || echo 0)
n=$((n + 1))
echo $n > "$o/count"
cat > "$o/stdin.tmp" && mv "$o/stdin.tmp" "$o/stdin-$n"
echo "run $n says hello"
echo '{{"not":"last"}}'
echo "{{\"run\":$n,\"state\":\"handed on\"}}""#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Chain", &script)
        .start();
    let id =
        api.create(json!({"name": "Chain", "data": {"run": 0}, "repeat": "FINISHED, +1 SECONDS"}));

    let second: Value =
        serde_json::from_str(&wait_file(&sup, &out.path().join("stdin-2"))).unwrap();
    assert_eq!(
        second["data"],
        json!({"run": 1, "state": "handed on"}),
        "{second}"
    );
    let first: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("stdin-1")).unwrap())
            .unwrap();
    assert_eq!(first["data"], json!({"run": 0}), "{first}");
    // And the server keeps the latest between runs.
    let job = api.job(id);
    assert!(job["data"]["run"].as_i64().unwrap_or(0) >= 1, "{job}");
    assert_eq!(job["data"]["state"], "handed on", "{job}");
}

#[test]
fn exit_75_retries_the_job_later_with_the_details() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    // The first run asks for a retry; the second reads, on stdin, what the
    // retry left: the details, and a nextRun after the first run.
    let script = sh(&format!(
        r#"f="{o}/$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT"
cat > "$f.tmp" && mv "$f.tmp" "$f"
if [ "$JOBMGR_ATTEMPT" = 1 ]; then echo 'try me later' >&2; exit 75; fi
exit 0"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Busy", &script)
        .start();
    // Several jobs, so that a retry that is not later shows up reliably.
    let ids: Vec<i64> = (0..6)
        .map(|i| api.create(json!({"name": "Busy", "data": {"i": i}})))
        .collect();
    for &id in &ids {
        wait_gone(&api, &sup, id);
        let text = std::fs::read_to_string(out.path().join(format!("{id}-2")))
            .unwrap_or_else(|e| panic!("job {id} was not run a second time: {e}"));
        let second: Value = serde_json::from_str(&text).unwrap();
        let d = &second["data"]["_jobmgr"];
        assert_eq!(d["outcome"], "tempfail", "{second}");
        assert_eq!(d["exitCode"], 75, "{second}");
        assert_eq!(d["attempt"], 1, "{second}");
        assert_eq!(d["stderr"], "try me later\n", "{second}");
        // A hand-out shows nextRun and lastRun as they were before it: the
        // retry's time and the first run's.
        assert!(
            ms(&second["nextRun"]) > ms(&second["lastRun"]),
            "exit 75 must retry LATER, but the retry's nextRun {} is not after the first run at {}",
            second["nextRun"],
            second["lastRun"]
        );
        assert!(!out.path().join(format!("{id}-3")).exists());
    }
}

#[test]
fn a_failing_worker_is_retried_with_the_details_then_failed() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"cat > '{o}/stdin.tmp' && mv '{o}/stdin.tmp' "{o}/stdin-$JOBMGR_ATTEMPT"
echo "partial output $JOBMGR_ATTEMPT"
echo "boom on attempt $JOBMGR_ATTEMPT" >&2
exit 3"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Flaky", &script)
        .arg("--max-attempts")
        .arg("2")
        .start();
    let id = api.create(json!({"name": "Flaky", "data": {"keep": "me"}}));
    let job = wait_state(&api, &sup, id, "FAILED");

    // The retry carried the first failure's details to the second run.
    let second: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("stdin-2")).unwrap())
            .unwrap();
    let first_failure = &second["data"]["_jobmgr"];
    assert_eq!(second["data"]["keep"], "me", "{second}");
    assert_eq!(first_failure["outcome"], "exit", "{second}");
    assert_eq!(first_failure["exitCode"], 3, "{second}");
    assert_eq!(first_failure["attempt"], 1, "{second}");
    assert_eq!(first_failure["stderr"], "boom on attempt 1\n", "{second}");
    assert_eq!(first_failure["stdout"], "partial output 1\n", "{second}");

    // The second failure FAILED it, with its own details.
    let d = details(&job);
    assert_eq!(job["data"]["keep"], "me", "{job}");
    assert_eq!(d["outcome"], "exit", "{job}");
    assert_eq!(d["exitCode"], 3, "{job}");
    assert_eq!(d["attempt"], 2, "{job}");
    assert_eq!(d["stderr"], "boom on attempt 2\n", "{job}");
    assert_eq!(d["outputTruncated"], false, "{job}");
    assert!(
        !out.path().join("stdin-3").exists(),
        "ran a third time with --max-attempts 2"
    );
}

#[test]
fn death_by_a_signal_is_reported_with_the_signals_name() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Segv",
            &sh("echo about to crash >&2\nkill -SEGV $$\nexit 0"),
        )
        .worker("Killed", &sh("kill -KILL $$\nexit 0"))
        .arg("--max-attempts")
        .arg("1")
        .start();
    let segv = api.create(json!({"name": "Segv"}));
    let killed = api.create(json!({"name": "Killed"}));
    let job = wait_state(&api, &sup, segv, "FAILED");
    assert_eq!(details(&job)["outcome"], "signal", "{job}");
    assert_eq!(details(&job)["signal"], "SIGSEGV", "{job}");
    assert_eq!(details(&job)["stderr"], "about to crash\n", "{job}");
    assert!(details(&job).get("exitCode").is_none(), "{job}");
    let job = wait_state(&api, &sup, killed, "FAILED");
    assert_eq!(details(&job)["outcome"], "signal", "{job}");
    assert_eq!(details(&job)["signal"], "SIGKILL", "{job}");
}

#[test]
fn a_job_without_a_worker_fails_at_once_with_no_worker_timeout_zero() {
    let server = Server::start();
    let api = server.api();
    // Five attempts allowed: a missing worker must not use them.
    let sup = Supervisor::builder(&server.url)
        .arg("--max-attempts")
        .arg("5")
        .arg("--no-worker-timeout")
        .arg("0")
        .start();
    let id = api.create(json!({"name": "www-prod/NoSuchWorker?x=1", "data": {"a": 1}}));
    let job = wait_state(&api, &sup, id, "FAILED");
    assert_eq!(details(&job)["outcome"], "no_worker", "{job}");
    assert_eq!(details(&job)["attempt"], 1, "{job}");
    assert!(
        details(&job)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("NoSuchWorker"),
        "{job}"
    );
    assert_eq!(job["data"]["a"], 1, "{job}");
}

// ---------------------------------------------------------------------------
// Output and payload sizes
// ---------------------------------------------------------------------------

#[test]
fn output_over_the_cap_keeps_head_and_tail_and_says_so() {
    let server = Server::start();
    let api = server.api();
    let script = sh(
        "printf 'BEGIN-'\nhead -c 5000000 /dev/zero | tr '\\0' x\nprintf -- '-END\\n'\necho small >&2\nexit 3",
    );
    let sup = Supervisor::builder(&server.url)
        .worker("Chatty", &script)
        .args(&["--output-cap", "1KiB", "--max-attempts", "1"])
        .start();
    let id = api.create(json!({"name": "Chatty"}));
    let job = wait_state(&api, &sup, id, "FAILED");
    let d = details(&job);
    let total = 5_000_000 + "BEGIN-".len() + "-END\n".len();
    let stdout = d["stdout"].as_str().expect("stdout text");
    assert!(
        stdout.starts_with("BEGIN-xxx"),
        "head lost: {:?}",
        &stdout[..stdout.len().min(100)]
    );
    assert!(
        stdout.ends_with("xxx-END\n"),
        "tail lost: {:?}",
        &stdout[stdout.len().saturating_sub(100)..]
    );
    assert!(
        stdout.contains(&format!("{} bytes of output dropped", total - 1024)),
        "no marker with the count dropped: {stdout:?}"
    );
    assert!(
        stdout.len() < 1024 + 200,
        "cap not applied: {} bytes kept",
        stdout.len()
    );
    assert_eq!(d["outputTruncated"], true, "{d}");
    assert_eq!(d["outputBytes"]["stdout"], total, "{d}");
    assert_eq!(d["stderr"], "small\n", "{d}");
}

#[test]
fn a_gigabyte_of_output_does_not_deadlock() {
    let server = Server::start();
    let api = server.api();
    // 10 MB to stderr first (a reader of stdout alone would deadlock here),
    // then 1 GB to stdout.
    let script = sh(
        "head -c 10000000 /dev/zero >&2\nhead -c 1000000000 /dev/zero\necho\necho '{\"end\":1}'\nexit 3",
    );
    let sup = Supervisor::builder(&server.url)
        .worker("Firehose", &script)
        .worker("Next", &sh("cat > /dev/null"))
        .args(&["--output-cap", "1KiB", "--max-attempts", "1"])
        .start();
    let baseline = status_kib(sup.pid(), "VmHWM");
    let id = api.create(json!({"name": "Firehose"}));
    let job = wait_for("the 1 GB job to fail", &sup, || {
        let job = api.job(id);
        (job["state"] == "FAILED").then_some(job)
    });
    let d = details(&job);
    let summary = json!({"outcome": d["outcome"], "outputBytes": d["outputBytes"], "outputTruncated": d["outputTruncated"]});
    assert_eq!(d["outcome"], "exit", "{summary}");
    assert_eq!(
        d["outputBytes"]["stdout"],
        1_000_000_000u64 + 1 + 10,
        "{summary}"
    );
    assert_eq!(d["outputBytes"]["stderr"], 10_000_000, "{summary}");
    assert_eq!(d["outputTruncated"], true, "{summary}");
    let stdout = d["stdout"].as_str().unwrap();
    assert!(
        stdout.ends_with("{\"end\":1}\n"),
        "tail lost: {:?}",
        &stdout[stdout.len().saturating_sub(50)..]
    );
    // Read through a 1 KiB cap, a gigabyte costs the supervisor no memory.
    assert_peak_rss_within(sup.pid(), baseline, 64, "1 GB of output");
    // And it goes on serving.
    let next = api.create(json!({"name": "Next"}));
    wait_gone(&api, &sup, next);
}

#[test]
fn a_big_payload_reaches_a_reader_whole_and_does_not_block_a_worker_that_never_reads() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    // The server caps a job's data at 1 MiB, so this is as big as a payload
    // gets: still 16 times a pipe buffer.
    let fill = "x".repeat(1_000_000);
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Reader",
            &sh(&format!(
                "cat > '{o}/stdin.tmp' && mv '{o}/stdin.tmp' '{o}/stdin'"
            )),
        )
        .worker(
            "Ignorer",
            &sh(&format!(
                "echo 'never read my stdin'\nsleep 1\necho done > '{o}/ignored'"
            )),
        )
        .start();
    let reader = api.create(json!({"name": "Reader", "data": {"fill": fill}}));
    let ignorer = api.create(json!({"name": "Ignorer", "data": {"fill": fill}}));
    wait_gone(&api, &sup, ignorer);
    assert_eq!(
        std::fs::read_to_string(out.path().join("ignored")).unwrap(),
        "done\n"
    );
    wait_gone(&api, &sup, reader);
    let stdin: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("stdin")).unwrap()).unwrap();
    assert_eq!(
        stdin["data"]["fill"].as_str().map(str::len),
        Some(1_000_000)
    );
    assert_eq!(stdin["jobID"], reader);
}

// ---------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------

#[test]
fn progress_lines_on_fd_3_reach_the_server_while_the_job_runs() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"echo '{{"step":1,"phase":"start"}}' >&3
echo 'this is not json' >&3
echo '{{"pct":50,"phase":"middle"}}' >&"$JOBMGR_PROGRESS_FD"
while [ ! -e '{o}/go' ]; do sleep 0.02; done"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Steps", &script)
        .start();
    let id = api.create(json!({"name": "Steps", "data": {"orig": true}}));
    let job = wait_for("the merged progress on the server", &sup, || {
        let job = api.job(id);
        (job["data"]["pct"] == 50).then_some(job)
    });
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(
        job["data"],
        json!({"orig": true, "step": 1, "pct": 50, "phase": "middle"}),
        "{job}"
    );
    std::fs::write(out.path().join("go"), "").unwrap();
    wait_gone(&api, &sup, id);
}

// ---------------------------------------------------------------------------
// The gate
// ---------------------------------------------------------------------------

#[test]
fn the_load_gate_holds_jobs_until_the_load_drops() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url)
        .worker("Light", &sh("exit 0"))
        .arg("--max-load")
        .arg("2");
    // High load from the start, so no fetch is ever made before it.
    std::fs::write(builder.path().join("loadavg"), "9.00 9.00 9.00 1/100 1\n").unwrap();
    let sup = builder.start();
    let ids: Vec<i64> = (0..3)
        .map(|_| api.create(json!({"name": "Light"})))
        .collect();
    wait_for("the gate to say the load closed it", &sup, || {
        let log = sup.stderr();
        log.lines()
            .any(|l| l.contains("gate closed") && l.contains("load 9.00"))
            .then_some(())
    });
    // The one bounded wait: nothing is taken over ~2 s of checks.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for &id in &ids {
            assert_eq!(
                api.state(id).as_deref(),
                Some("QUEUED"),
                "job {id} taken above max load; {}",
                sup.logs()
            );
        }
        let (_, health) = api.get("/healthz");
        assert_eq!(
            health["waiting"], 0,
            "a closed gate still asks for jobs: {health}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sup.set_load(0.1);
    for id in ids {
        wait_gone(&api, &sup, id);
    }
}

/// A directory for the cap tests' workers, with `running/`, where each
/// worker keeps a marker while it runs.
fn running_markers() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    std::fs::create_dir(out.path().join("running")).unwrap();
    out
}

/// The numbers a file holds, one per line.
fn numbers_in(path: &Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[test]
fn the_concurrency_cap_holds_under_a_burst_of_100_jobs() {
    let server = Server::start();
    let api = server.api();
    let out = running_markers();
    let o = out.path().display();
    // Each worker leaves a marker while it runs and records how many it
    // sees. The first ones wait until three run at once (so the cap is
    // reached for sure); after that, all just linger a little.
    let script = sh(&format!(
        r#"d='{o}'
mkdir "$d/running/$JOBMGR_JOB_ID"
n=$(ls "$d/running" | wc -l)
echo $n >> "$d/counts"
if [ "$n" -ge 3 ]; then touch "$d/released"; fi
while [ ! -e "$d/released" ]; do sleep 0.01; done
sleep 0.05
rmdir "$d/running/$JOBMGR_JOB_ID""#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Burst", &script)
        .arg("--max-workers")
        .arg("3")
        .start();
    let jobs: Vec<Value> = (0..100)
        .map(|i| json!({"name": "Burst", "data": {"i": i}}))
        .collect();
    let (status, answer) = api.post("/jobs/batch", json!({"jobs": jobs}));
    assert_eq!(status, 200, "{answer}");
    wait_for("all 100 jobs to finish", &sup, || {
        all_jobs(&api).is_empty().then_some(())
    });
    let counts = numbers_in(&out.path().join("counts"));
    assert_eq!(counts.len(), 100, "{counts:?}");
    let max = counts.iter().copied().max().unwrap();
    assert!(
        max <= 3,
        "{max} workers ran at once with --max-workers 3: {counts:?}"
    );
    assert_eq!(max, 3, "{counts:?}");
}

/// The cap and the promises under randomized worker lengths, so that slots
/// free at every moment of a fetch and its answer: every job is counted.
/// Violations: a moment with more workers than the cap, a job run twice, a
/// job not run.
#[test]
fn the_cap_holds_and_each_job_runs_once_under_random_worker_lengths() {
    let server = Server::start();
    let api = server.api();
    let out = running_markers();
    let o = out.path().display();
    // Each worker marks itself running, records how many run, lingers for
    // the time its job says, and records its id.
    let script = sh(&format!(
        r#"d='{o}'
mkdir "$d/running/$JOBMGR_JOB_ID"
echo "$(ls "$d/running" | wc -l)" >> "$d/counts"
linger=$(sed -n 's/.*"ms": *\([0-9]*\).*/\1/p')
sleep "$(printf '0.%03d' "$linger")"
echo "$JOBMGR_JOB_ID" >> "$d/ran"
rmdir "$d/running/$JOBMGR_JOB_ID""#
    ));
    let cap = 4;
    let sup = Supervisor::builder(&server.url)
        .worker("Overlap", &script)
        .arg("--max-workers")
        .arg(&cap.to_string())
        .start();
    let count = 300;
    let jobs: Vec<Value> = (0..count)
        .map(|_| json!({"name": "Overlap", "data": {"ms": rand::random_range(0..30)}}))
        .collect();
    let ids = api.create_batch(jobs);
    wait_for("every job to finish", &sup, || {
        all_jobs(&api).is_empty().then_some(())
    });
    let over_cap = numbers_in(&out.path().join("counts"))
        .into_iter()
        .filter(|n| *n > cap)
        .count();
    let mut ran = numbers_in(&out.path().join("ran"));
    ran.sort_unstable();
    let twice = ran.windows(2).filter(|w| w[0] == w[1]).count();
    ran.dedup();
    let missing = ids
        .iter()
        .filter(|id| ran.binary_search(id).is_err())
        .count();
    assert_eq!(
        (over_cap, twice, missing),
        (0, 0, 0),
        "moments over the cap of {cap}, jobs run twice, jobs not run"
    );
}

// ---------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------

#[test]
fn a_timeout_kills_the_worker_and_its_grandchild() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"sleep 1000 &
echo $! > '{o}/gc.tmp' && mv '{o}/gc.tmp' '{o}/grandchild'
echo $$ > '{o}/pid.tmp' && mv '{o}/pid.tmp' '{o}/pid'
sleep 1000"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Hang", &script)
        .args(&["--timeout", "1s", "--max-attempts", "1"])
        .start();
    let id = api.create(json!({"name": "Hang"}));
    let worker = pid_in(&wait_file(&sup, &out.path().join("pid")));
    let grandchild = pid_in(&wait_file(&sup, &out.path().join("grandchild")));
    let job = wait_state(&api, &sup, id, "FAILED");
    assert_eq!(details(&job)["outcome"], "timeout", "{job}");
    assert_eq!(details(&job)["killed"], false, "SIGTERM was enough: {job}");
    wait_dead(&sup, worker, "the worker");
    wait_dead(&sup, grandchild, "the worker's grandchild");
}

#[test]
fn a_worker_ignoring_sigterm_is_killed_after_the_grace() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"trap '' TERM
echo $$ > '{o}/pid.tmp' && mv '{o}/pid.tmp' '{o}/pid'
while :; do sleep 0.1; done"#
    ));
    // The harness passes --kill-grace 2s.
    let sup = Supervisor::builder(&server.url)
        .worker("Stubborn", &script)
        .args(&["--timeout", "1s", "--max-attempts", "1"])
        .start();
    let id = api.create(json!({"name": "Stubborn"}));
    let worker = pid_in(&wait_file(&sup, &out.path().join("pid")));
    let job = wait_state(&api, &sup, id, "FAILED");
    assert_eq!(details(&job)["outcome"], "timeout", "{job}");
    assert_eq!(details(&job)["killed"], true, "SIGKILL was needed: {job}");
    wait_dead(&sup, worker, "the worker");
}

// ---------------------------------------------------------------------------
// Lifecycle
// ---------------------------------------------------------------------------

#[test]
fn kill_9_of_the_supervisor_kills_its_workers_and_their_jobs_run_again() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    // The first run of each job hangs; a later one succeeds.
    let script = sh(&format!(
        r#"echo $$ > "{o}/$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT.tmp" && mv "{o}/$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT.tmp" "{o}/$JOBMGR_JOB_ID-$JOBMGR_ATTEMPT"
if [ "$JOBMGR_ATTEMPT" = 1 ]; then exec sleep 1000; fi
exit 0"#
    ));
    let mut first = Supervisor::builder(&server.url)
        .worker("Survivor", &script)
        .args(&["--lease", "2s"])
        .start();
    let ids: Vec<i64> = (0..2)
        .map(|_| api.create(json!({"name": "Survivor"})))
        .collect();
    let workers: Vec<u32> = ids
        .iter()
        .map(|id| pid_in(&wait_file(&first, &out.path().join(format!("{id}-1")))))
        .collect();
    first.kill9();
    for &pid in &workers {
        wait_dead(&first, pid, "a worker of the killed supervisor");
    }
    let second = Supervisor::builder(&server.url)
        .worker("Survivor", &script)
        .args(&["--lease", "2s"])
        .start();
    for &id in &ids {
        wait_gone(&api, &second, id);
        assert!(
            out.path().join(format!("{id}-2")).exists(),
            "job {id} did not run a second time"
        );
    }
}

#[test]
fn sigterm_lets_the_running_job_finish_and_takes_no_new_one() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"touch "{o}/started-$JOBMGR_JOB_ID"
while [ ! -e '{o}/go' ]; do sleep 0.02; done
echo '{{"finished":true}}'"#
    ));
    let mut sup = Supervisor::builder(&server.url)
        .worker("Slow", &script)
        .start();
    let running = api.create(json!({"name": "Slow"}));
    wait_file(&sup, &out.path().join(format!("started-{running}")));
    sup.signal(Signal::SIGTERM);
    wait_for("the supervisor to start draining", &sup, || {
        sup.stderr().contains("draining").then_some(())
    });
    let late = api.create(json!({"name": "Slow"}));
    std::fs::write(out.path().join("go"), "").unwrap();
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}; {}", sup.logs());
    assert_eq!(
        api.state(running),
        None,
        "the running job was not reported finished"
    );
    // The fetch in flight at SIGTERM may still have been handed the late
    // job; if so, it was handed back before the supervisor exited (see
    // handback.rs). Either way it is queued, and was not run.
    let late_job = api.job(late);
    assert_eq!(
        late_job["state"], "QUEUED",
        "a job created after SIGTERM was taken: {late_job}"
    );
    assert!(!out.path().join(format!("started-{late}")).exists());
}

#[test]
fn a_job_still_running_at_the_drain_timeout_is_handed_back_for_an_immediate_retry() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"echo $$ > '{o}/pid.tmp' && mv '{o}/pid.tmp' '{o}/pid'
while [ ! -e '{o}/never' ]; do sleep 0.02; done"#
    ));
    let mut sup = Supervisor::builder(&server.url)
        .worker("Endless", &script)
        .args(&["--drain-timeout", "1s"])
        .start();
    let id = api.create(json!({"name": "Endless", "data": {"keep": 1}}));
    let worker = pid_in(&wait_file(&sup, &out.path().join("pid")));
    sup.signal(Signal::SIGTERM);
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}; {}", sup.logs());
    wait_dead(&sup, worker, "the worker stopped by the drain");
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert_eq!(
        job["data"],
        json!({"keep": 1}),
        "a hand-back is not a failure: {job}"
    );
    assert!(
        ms(&job["nextRun"]) <= chrono::Utc::now().timestamp_millis(),
        "not due at once: {job}"
    );
    let again = api.dequeue(json!({"name": "Endless"}));
    assert_eq!(again.len(), 1, "the handed-back job is not due now");
    assert_eq!(again[0]["jobID"], id);
}

#[test]
fn sigtstp_stops_taking_jobs_but_keeps_the_running_one() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"touch "{o}/started-$JOBMGR_JOB_ID"
while [ ! -e '{o}/go' ]; do sleep 0.02; done"#
    ));
    let mut sup = Supervisor::builder(&server.url)
        .worker("Quiet", &script)
        .start();
    let running = api.create(json!({"name": "Quiet"}));
    wait_file(&sup, &out.path().join(format!("started-{running}")));
    sup.signal(Signal::SIGTSTP);
    wait_for("the supervisor to go quiet", &sup, || {
        sup.stderr().contains("quiet: no more jobs").then_some(())
    });
    let late = api.create(json!({"name": "Quiet"}));
    std::fs::write(out.path().join("go"), "").unwrap();
    wait_gone(&api, &sup, running);
    // Still up (not stopped by SIGTSTP's default action): it drains on SIGTERM.
    sup.signal(Signal::SIGTERM);
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}; {}", sup.logs());
    let late_job = api.job(late);
    assert_eq!(
        late_job["state"], "QUEUED",
        "a quiet supervisor took a job: {late_job}"
    );
    assert!(!out.path().join(format!("started-{late}")).exists());
}

#[test]
fn sigterm_right_after_the_ready_line_drains_and_exits_0() {
    let server = Server::start();
    // A service manager may signal as soon as the ready line is out; the
    // signal must drain, not kill. A few rounds, since it is a race.
    for round in 0..5 {
        let mut sup = Supervisor::builder(&server.url).start();
        sup.signal(Signal::SIGTERM);
        let status = sup.wait_exit();
        assert!(
            status.success(),
            "round {round}: SIGTERM just after the ready line ended the supervisor with {status:?}; {}",
            sup.logs()
        );
    }
}

// ---------------------------------------------------------------------------
// The server down while a job runs
// ---------------------------------------------------------------------------

/// A worker that counts its runs and waits for `go`.
fn count_and_wait(out: &Path) -> String {
    let o = out.display();
    sh(&format!(
        r#"echo run >> '{o}/runs'
touch '{o}/started'
while [ ! -e '{o}/go' ]; do sleep 0.02; done"#
    ))
}

#[test]
fn a_report_made_while_the_server_is_down_is_delivered_when_it_is_back() {
    let mut server = PortServer::start();
    let api = Api::new(&server.url());
    let out = tempfile::tempdir().unwrap();
    let sup = Supervisor::builder(&server.url())
        .worker("Outage", &count_and_wait(out.path()))
        .start();
    let id = api.create(json!({"name": "Outage"}));
    wait_file(&sup, &out.path().join("started"));
    server.kill9();
    std::fs::write(out.path().join("go"), "").unwrap();
    let files = wait_for("the report to be spooled", &sup, || {
        let files = spooled(&sup.spool());
        (!files.is_empty()).then_some(files)
    });
    assert_eq!(files.len(), 1, "{files:?}");
    server.spawn();
    wait_gone(&api, &sup, id);
    wait_for("the spool to empty", &sup, || {
        spooled(&sup.spool()).is_empty().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(out.path().join("runs")).unwrap(),
        "run\n",
        "ran more than once"
    );
}

#[test]
fn a_spooled_report_is_delivered_by_the_next_supervisor() {
    let mut server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let mut first = Supervisor::builder(&server.url)
        .worker("Outage", &count_and_wait(out.path()))
        .start();
    let id = api.create(json!({"name": "Outage"}));
    wait_file(&first, &out.path().join("started"));
    server.kill9();
    std::fs::write(out.path().join("go"), "").unwrap();
    let files = wait_for("the report to be spooled", &first, || {
        let files = spooled(&first.spool());
        (!files.is_empty()).then_some(files)
    });
    first.signal(Signal::SIGTERM);
    let status = first.wait_exit();
    assert!(status.success(), "{status:?}; {}", first.logs());
    assert_eq!(
        spooled(&first.spool()),
        files,
        "the spool lost the report on exit"
    );

    // The server comes back on a new port; the next supervisor starts with
    // the same spool (moved, since the builder picks the directory).
    server.restart();
    let api = Api::new(&server.url);
    let builder = Supervisor::builder(&server.url).worker("Outage", &count_and_wait(out.path()));
    let spool = builder.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    for file in &files {
        std::fs::copy(file, spool.join(file.file_name().unwrap())).unwrap();
    }
    let second = builder.start();
    wait_gone(&api, &second, id);
    wait_for("the spool to empty", &second, || {
        spooled(&second.spool()).is_empty().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(out.path().join("runs")).unwrap(),
        "run\n",
        "ran more than once"
    );
}

// ---------------------------------------------------------------------------
// Hostile job names
// ---------------------------------------------------------------------------

#[test]
fn hostile_job_names_never_run_anything_outside_the_worker_path() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let builder = Supervisor::builder(&server.url);
    let root = builder.path().to_path_buf();
    let workers = root.join("workers");
    // Executables right outside the worker path, each leaving a marker.
    for name in ["x", "b", "sh", "xyz"] {
        executable(&root.join(name), &sh(&format!("touch '{o}/ran-{name}'")));
    }
    // Inside: a symlink out, and a file that is not executable.
    std::os::unix::fs::symlink(root.join("x"), workers.join("Escape")).unwrap();
    std::fs::write(workers.join("Plain"), sh(&format!("touch '{o}/ran-Plain'"))).unwrap();
    std::fs::set_permissions(
        workers.join("Plain"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // Refused for good at once rather than handed back for another host.
    let sup = builder.arg("--no-worker-timeout").arg("0").start();

    // Refused by the server, so they never reach a supervisor.
    let (status, answer) = api.post("/jobs", json!({"name": ""}));
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("missing_name")),
        "{answer}"
    );
    let (status, answer) = api.post("/jobs", json!({"name": "a\u{0}b"}));
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("malformed_name")),
        "{answer}"
    );
    let (status, answer) = api.post("/jobs", json!({"name": "../".repeat(3400) + "x"}));
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("malformed_name")),
        "10 KB name: {answer}"
    );
    // Non-UTF-8 cannot be written in JSON: a lone surrogate escape and raw
    // invalid bytes are both refused.
    let (status, answer) = api.send("POST", "/jobs", Some(r#"{"name":"\ud800x"}"#.into()));
    assert_eq!(status, 400, "{answer}");
    let body = b"{\"name\":\"\xff\xfex\"}";
    let mut request = format!(
        "POST /jobs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        server.addr(),
        token(),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let answer = raw_exchange(&server.addr(), &request);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // Accepted by the server, refused by the supervisor.
    let longest = "../".repeat(84) + "xyz";
    assert_eq!(longest.len(), 255);
    let names = [
        "../x",
        "/bin/sh",
        "a/../../b",
        "../../x",
        "x/",
        "..",
        "x/..",
        ".",
        "-rf",
        "a b",
        "é",
        "x?/../../b",
        "Escape",
        "Plain",
        longest.as_str(),
        &"a".repeat(255),
    ];
    let ids: Vec<(i64, &str)> = names
        .iter()
        .map(|&n| (api.create(json!({"name": n})), n))
        .collect();
    for (id, name) in ids {
        let job = wait_state(&api, &sup, id, "FAILED");
        assert_eq!(
            details(&job)["outcome"],
            "no_worker",
            "name {name:?}: {job}"
        );
    }
    let ran: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        ran.is_empty(),
        "something outside the worker path ran: {ran:?}"
    );
}

// ---------------------------------------------------------------------------
// The example workers
// ---------------------------------------------------------------------------

#[test]
fn the_example_workers_run_and_hand_on_their_data() {
    let server = Server::start();
    let api = server.api();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("workers");
    let sup = RawSupervisor::start(&server.url, &examples, &[]);
    let hello = api.create(json!({"name": "Hello", "repeat": "FINISHED, +1 HOUR"}));
    let url = format!("{}/healthz", server.url);
    let check = api.create(
        json!({"name": "CheckLiveness", "data": {"url": url}, "repeat": "FINISHED, +1 HOUR"}),
    );
    let ran = |id: i64| {
        wait_for(&format!("example job {id} to finish a run"), &sup, || {
            let job = api.job(id);
            (job["state"] == "QUEUED" && job["lastRun"] != "").then_some(job)
        })
    };
    let job = ran(hello);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(job["data"]["greetedBy"], host.trim(), "{job}");
    assert!(
        job["data"]["greetedAt"]
            .as_str()
            .is_some_and(|t| t.len() == 19),
        "{job}"
    );
    let job = ran(check);
    assert_eq!(job["data"]["runs"], 1, "{job}");
    assert_eq!(job["data"]["lastStatus"], "HTTP 200", "{job}");
    assert_eq!(job["data"]["url"], url.as_str(), "{job}");
    assert!(job["data"].get("failCount").is_none(), "{job}");
}

// ---------------------------------------------------------------------------
// Over Bedrock's protocol
// ---------------------------------------------------------------------------

#[test]
fn the_supervisor_runs_jobs_over_bedrock_and_keeps_failure_details_in_the_data() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&format!("bedrock://{}", server.bedrock))
        .worker("Good", &sh("cat > /dev/null\necho '{\"done\":true}'"))
        .worker("Bad", &sh("echo \"oops $JOBMGR_ATTEMPT\" >&2\nexit 3"))
        .args(&["--max-attempts", "2"])
        .start();
    assert!(sup.ready.contains("bedrock"), "{}", sup.ready);
    let once = api.create(json!({"name": "Good"}));
    let repeating =
        api.create(json!({"name": "Good", "data": {"n": 1}, "repeat": "FINISHED, +1 HOUR"}));
    let bad = api.create(json!({"name": "Bad", "data": {"keep": 1}}));
    wait_gone(&api, &sup, once);
    let job = wait_for("the repeating job to finish a run", &sup, || {
        let job = api.job(repeating);
        (job["state"] == "QUEUED" && job["lastRun"] != "").then_some(job)
    });
    assert_eq!(job["data"], json!({"done": true}), "{job}");
    let job = wait_state(&api, &sup, bad, "FAILED");
    let d = details(&job);
    assert_eq!(job["data"]["keep"], 1, "{job}");
    assert_eq!(d["outcome"], "exit", "{job}");
    assert_eq!(d["exitCode"], 3, "{job}");
    assert_eq!(d["attempt"], 2, "{job}");
    assert_eq!(d["stderr"], "oops 2\n", "{job}");
}
