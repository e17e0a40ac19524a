//! Jobs yield to the site, for real: a worker's scheduling policy, nice
//! level, I/O class and nice limit read back from `/proc` and
//! `ioprio_get`, the jobs' parent cgroup's `cpu.idle` and memory limit read
//! from the cgroup files, a worker's own try to raise its priority, and
//! each step turned off. The cgroup parts need root and a cpu controller
//! (v1 or v2); without them they say so and check the rest.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::common::*;

/// `SCHED_OTHER` and `SCHED_IDLE` as `/proc/PID/sched` shows them.
const SCHED_OTHER: u32 = 0;
const SCHED_IDLE: u32 = 5;
/// `ioprio_get`'s class for "none set" and for idle.
const IO_CLASS_NONE: i64 = 0;
const IO_CLASS_IDLE: i64 = 3;

/// A worker that records its pid, tries to raise its own CPU priority
/// (leave `SCHED_IDLE`, or lower its nice level to 0), records whether the
/// kernel let it, and waits for `$OUT/go`.
const HELD: &str = r#"#!/bin/sh
cat > /dev/null
if chrt -o -p 0 $$ > /dev/null 2>&1; then echo raised > "$OUT/chrt"; else echo refused > "$OUT/chrt"; fi
if renice -n 0 -p $$ > /dev/null 2>&1; then echo raised > "$OUT/renice"; else echo refused > "$OUT/renice"; fi
echo $$ > "$OUT/started.tmp" && mv "$OUT/started.tmp" "$OUT/started"
while [ ! -e "$OUT/go" ]; do sleep 0.05; done
"#;

/// What a held worker showed of itself.
#[derive(Debug)]
struct Seen {
    pid: i32,
    policy: u32,
    nice: i64,
    io_class: i64,
    nice_limit: String,
    cgroup: String,
    chrt: String,
    renice: String,
}

/// A supervisor with `args`, a directory its workers (of another uid when
/// run as root) may write, and the held worker.
fn start(server: &Server, args: &[&str]) -> (Supervisor, PathBuf) {
    // The default worker user (a uid of the job's own as root): a worker
    // running as root keeps CAP_SYS_NICE, and could raise its priority.
    let mut builder = Supervisor::builder(&server.url)
        .user(None)
        .yielding()
        .worker("Held", HELD);
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = builder.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    builder = builder.arg("--env").arg(&format!("OUT={}", out.display()));
    for arg in args {
        builder = builder.arg(arg);
    }
    (builder.start(), out)
}

/// Runs one held job and reads what it is, then lets it finish.
fn held_job(server: &Server, sup: &Supervisor, out: &Path) -> Seen {
    let api = server.api();
    let id = api.create(json!({"name": "Held"}));
    let pid: i32 = wait_for("the held worker", sup, || {
        std::fs::read_to_string(out.join("started"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let sched = std::fs::read_to_string(format!("/proc/{pid}/sched")).unwrap();
    let policy = sched
        .lines()
        .find(|l| l.starts_with("policy"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .expect("a policy line in /proc/PID/sched");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis: the nice level is
    // the 19th field of the line, the 17th after it.
    let nice = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(16))
        .and_then(|v| v.parse().ok())
        .expect("a nice level in /proc/PID/stat");
    let (io_class, _) = jobmgr::supervisor::yielding::io_class(pid).unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nice_limit = limits
        .lines()
        .find(|l| l.starts_with("Max nice priority"))
        .map(|l| {
            l.split_whitespace()
                .skip(3)
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .expect("a nice limit in /proc/PID/limits");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let read = |name: &str| {
        std::fs::read_to_string(out.join(name))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let seen = Seen {
        pid,
        policy,
        nice,
        io_class,
        nice_limit,
        cgroup,
        chrt: read("chrt"),
        renice: read("renice"),
    };
    std::fs::write(out.join("go"), "").unwrap();
    poll("the held job to finish", || {
        api.state(id).is_none().then_some(())
    });
    for name in ["started", "go", "chrt", "renice"] {
        let _ = std::fs::remove_file(out.join(name));
    }
    seen
}

/// The supervisor's directory (`jobmgr-…`) above a worker in the
/// hierarchy holding `controller` (v1), or in the v2 tree when no v1 line
/// names it; `None` when the worker is under no directory of ours there.
fn jobs_parent(cgroup: &str, controller: &str) -> Option<PathBuf> {
    let v1 = cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == controller).then(|| {
            Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(path.trim_start_matches('/'))
        })
    });
    let dir = match v1 {
        Some(dir) => dir,
        None => {
            let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            let mount = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                .into_iter()
                .find(|m| Path::new(m).join("cgroup.controllers").exists())?;
            Path::new(mount).join(path.trim_start_matches('/'))
        }
    };
    dir.ancestors()
        .find(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("jobmgr-") && !n.ends_with("-supervisor"))
        })
        .map(Path::to_path_buf)
}

/// The first of `files` that exists in `dir`, and its contents.
fn first_of(dir: &Path, files: &[&str]) -> Option<(String, String)> {
    files.iter().find_map(|file| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|v| (file.to_string(), v.trim().to_string()))
    })
}

/// The machine's memory, in bytes.
fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn by_default_workers_run_idle_in_an_idle_cgroup_and_cannot_leave_it() {
    let test = "by_default_workers_run_idle_in_an_idle_cgroup_and_cannot_leave_it";
    let server = Server::start();
    let (sup, out) = start(&server, &["--metrics", "127.0.0.1:0"]);
    let line = wait_for("the yielding line", &sup, || {
        sup.stderr()
            .lines()
            .find(|l| l.contains("jobs yield to the site: "))
            .map(str::to_string)
    });
    assert!(line.contains("SCHED_IDLE, idle I/O class"), "{line}");
    let seen = held_job(&server, &sup, &out);
    assert_eq!(seen.policy, SCHED_IDLE, "{seen:?}");
    assert_eq!(seen.io_class, IO_CLASS_IDLE, "{seen:?}");
    assert_eq!(seen.nice_limit, "0 0", "{seen:?}");
    assert_eq!(
        seen.chrt, "refused",
        "the worker left SCHED_IDLE by itself: {seen:?}"
    );
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test} (the cgroup part): cgroups of the jobs' own need root");
        return;
    }
    match jobs_parent(&seen.cgroup, "cpu")
        .and_then(|dir| first_of(&dir, &["cpu.idle", "cpu.weight", "cpu.shares"]).map(|f| (dir, f)))
    {
        Some((dir, (file, value))) => {
            let least = match file.as_str() {
                "cpu.idle" => "1",
                "cpu.weight" => "1",
                _ => "2",
            };
            assert_eq!(value, least, "{file} of {} ({line})", dir.display());
            assert!(line.contains(&format!("{file} {least}")), "{line}");
        }
        None => eprintln!(
            "SKIPPED {test} (cpu.idle): no cpu controller here for the jobs' cgroup: {line}"
        ),
    }
    match jobs_parent(&seen.cgroup, "memory").and_then(|dir| {
        first_of(&dir, &["memory.high", "memory.soft_limit_in_bytes"]).map(|f| (dir, f))
    }) {
        Some((dir, (file, value))) => {
            let bytes: u64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{file} of {}: {value}", dir.display()));
            let half = mem_total() / 2;
            // The kernel rounds to whole pages.
            assert!(
                bytes.abs_diff(half) <= 4096 * 2,
                "{file} {bytes}, not half of memory ({half})"
            );
        }
        None => eprintln!(
            "SKIPPED {test} (memory.high): no memory controller here for the jobs' cgroup"
        ),
    }
    // Where the job had a v2 cgroup, the time it waited for a CPU is
    // counted, per worker.
    if seen
        .cgroup
        .lines()
        .any(|l| l.starts_with("0::/") && l.contains("jobmgr-"))
    {
        let addr = sup.ready_field("metrics");
        let text = scrape_until(&addr, "the job's starved time", |text| {
            sample(
                text,
                "jobmgr_job_starved_seconds_count",
                &["worker=\"Held\""],
            )
            .is_some()
        });
        assert_eq!(
            sample(
                &text,
                "jobmgr_job_starved_seconds_count",
                &["worker=\"Held\""]
            ),
            Some(1.0),
            "{text}"
        );
    }
    let _ = seen.pid;
}

#[test]
fn a_nice_level_in_place_of_sched_idle_cannot_be_lowered_by_the_worker() {
    let server = Server::start();
    let (sup, out) = start(&server, &["--job-nice", "12"]);
    let seen = held_job(&server, &sup, &out);
    assert_eq!(seen.policy, SCHED_OTHER, "{seen:?}");
    assert_eq!(seen.nice, 12, "{seen:?}");
    assert_eq!(
        seen.renice, "refused",
        "the worker lowered its nice level: {seen:?}"
    );
    assert_eq!(seen.io_class, IO_CLASS_IDLE, "{seen:?}");
}

#[test]
fn every_step_turned_off_leaves_workers_at_normal_priority_outside_an_idle_cgroup() {
    let server = Server::start();
    let (sup, out) = start(
        &server,
        &[
            "--yield-cpu=false",
            "--yield-io=false",
            "--jobs-memory-high=off",
        ],
    );
    let seen = held_job(&server, &sup, &out);
    assert_eq!(seen.policy, SCHED_OTHER, "{seen:?}");
    assert_eq!(seen.nice, 0, "{seen:?}");
    assert_eq!(seen.io_class, IO_CLASS_NONE, "{seen:?}");
    if let Some(dir) = jobs_parent(&seen.cgroup, "cpu") {
        assert_ne!(
            first_of(&dir, &["cpu.idle"]).map(|(_, v)| v).as_deref(),
            Some("1"),
            "{} is idle though --yield-cpu=false",
            dir.display()
        );
    }
    if let Some(dir) = jobs_parent(&seen.cgroup, "memory") {
        for file in ["memory.high", "memory.soft_limit_in_bytes"] {
            if let Some((_, value)) = first_of(&dir, &[file]) {
                let limited = value.parse::<u64>().is_ok_and(|b| b < mem_total());
                assert!(
                    !limited,
                    "{file} {value} of {} with --jobs-memory-high=off",
                    dir.display()
                );
            }
        }
    }
}

/// Runs `jobmgr check-config --offline ARGS` with a worker path, and
/// returns its exit code and stderr.
fn check_config(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(bin());
    command
        .arg("check-config")
        .arg("--offline")
        .arg("--config")
        .arg(dir.path().join("none.toml"))
        .arg("--worker-path")
        .arg(dir.path())
        .args(args);
    std::fs::write(dir.path().join("none.toml"), "").unwrap();
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    let output = command.run_bounded(&format!("jobmgr check-config {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_yielding_settings_are_refused_with_what_to_write() {
    for (args, expected) in [
        (&["--job-nice", "0"][..], "job-nice must be from 1 to 19"),
        (&["--job-nice", "25"], "job-nice must be from 1 to 19"),
        (&["--job-nice=-5"], "job-nice must be from 1 to 19"),
        (
            &["--jobs-memory-high", "0%"],
            "a share must be a percentage",
        ),
        (
            &["--jobs-memory-high", "150%"],
            "a share must be a percentage",
        ),
        (&["--jobs-memory-high", "lots"], "expected a share"),
        (&["--yield-cpu", "maybe"], "yield-cpu"),
    ] {
        let (code, stderr) = check_config(args);
        assert_ne!(code, 0, "{args:?} was taken: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let (code, stderr) = check_config(&["--job-nice", "19", "--jobs-memory-high", "2G"]);
    assert_eq!(code, 0, "{stderr}");
}
