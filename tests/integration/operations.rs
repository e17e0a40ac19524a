//! What operators live in: `jobmgr status`, systemd's notify protocol and
//! watchdog, the log formats, completions and the man page.

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::*;

/// Runs `jobmgr status` with `args`; returns (exit code, stdout, stderr).
fn status(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(bin())
        .arg("status")
        .args(args)
        .env_remove("JOBMGR_STATUS_FILE")
        .run_bounded(&format!("jobmgr status {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn status_shows_each_running_job_with_its_worker_pid_and_the_gate() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let release = builder.path().join("release");
    let mut sup = builder
        .worker(
            "Hold",
            &format!(
                "#!/bin/sh\ncat > /dev/null\nwhile [ ! -e '{}' ]; do sleep 0.1; done\n",
                release.display()
            ),
        )
        .start();
    let spool = sup.spool();
    let spool = spool.to_str().unwrap();
    let id = api.create(json!({"name": "Hold"}));
    let text = poll("the job to show in the status", || {
        let (code, out, _) = status(&["--spool-dir", spool]);
        (code == 0 && out.contains("Hold") && !out.contains("       -  ")).then_some(out)
    });
    assert!(
        text.starts_with(&format!("jobmgr supervisor pid {}:", sup.pid())),
        "{text}"
    );
    assert!(text.contains("gate open"), "{text}");
    let (_, out, _) = status(&["--spool-dir", spool, "--json"]);
    let parsed: Value = serde_json::from_str(&out).expect("status --json is JSON");
    let job = &parsed["pools"][0]["running"][id.to_string()];
    assert_eq!(job["name"], "Hold", "{parsed}");
    let pid = job["pid"].as_u64().expect("the worker's pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("Hold"),
        "pid {pid} is the worker: {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    assert!(
        text.contains(&format!("{id}")) && text.contains(&pid.to_string()),
        "{text}"
    );

    // Done: the job leaves the board.
    std::fs::write(&release, "").unwrap();
    poll("the job to leave the status", || {
        let (code, out, _) = status(&["--spool-dir", spool]);
        (code == 0 && !out.contains("Hold")).then_some(())
    });

    // Stopped: no supervisor there.
    sup.signal(Signal::SIGTERM);
    assert!(sup.wait_exit().success());
    let (code, _, err) = status(&["--spool-dir", spool]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("is jobmgr running?"), "{err}");
}

#[test]
fn status_refuses_a_file_left_by_a_dead_supervisor_or_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("status.json");
    // A pid no process can have: the kernel hands out pids below pid_max.
    let dead: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("/proc/sys/kernel/pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    std::fs::write(
        &path,
        json!({"pid": dead, "started": 0, "updated": 0, "server": "x", "pools": []}).to_string(),
    )
    .unwrap();
    let (code, _, err) = status(&["--status-file", path.to_str().unwrap()]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not running"), "{err}");
    std::fs::write(&path, "{\"pid\": ").unwrap();
    let (code, _, err) = status(&["--status-file", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read the status file"), "{err}");
}

/// A notify socket like systemd's; collects what is sent to it.
struct NotifySocket {
    socket: UnixDatagram,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
    seen: Vec<String>,
}

impl NotifySocket {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        NotifySocket {
            socket,
            path,
            _dir: dir,
            seen: Vec::new(),
        }
    }

    /// Waits until `count` messages contain `line`.
    fn wait_for(&mut self, line: &str, count: usize) {
        let deadline = Instant::now() + DEADLINE;
        let mut buf = [0u8; 4096];
        while self
            .seen
            .iter()
            .filter(|m| m.lines().any(|l| l == line))
            .count()
            < count
        {
            assert!(
                Instant::now() < deadline,
                "no {line} ({count}) from the service; got {:?}",
                self.seen
            );
            if let Ok(n) = self.socket.recv(&mut buf) {
                self.seen
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }
}

#[test]
fn the_server_tells_systemd_ready_keeps_the_watchdog_and_says_stopping() {
    let mut notify = NotifySocket::new();
    let mut server = Server::builder()
        .env("NOTIFY_SOCKET", notify.path.to_str().unwrap())
        .env("WATCHDOG_USEC", "400000")
        .start();
    notify.wait_for("READY=1", 1);
    notify.wait_for("WATCHDOG=1", 3);
    let status = server.terminate();
    assert!(status.success());
    notify.wait_for("STOPPING=1", 1);
}

#[test]
fn the_supervisor_tells_systemd_ready_keeps_the_watchdog_and_says_stopping() {
    let mut notify = NotifySocket::new();
    let server = Server::start();
    let mut sup = Supervisor::builder(&server.url)
        .env("NOTIFY_SOCKET", notify.path.to_str().unwrap())
        .env("WATCHDOG_USEC", "400000")
        .start();
    notify.wait_for("READY=1", 1);
    notify.wait_for("WATCHDOG=1", 3);
    sup.signal(Signal::SIGTERM);
    assert!(sup.wait_exit().success());
    notify.wait_for("STOPPING=1", 1);
    // The worker never sees the socket: workers get an allow-listed
    // environment (checked in the sandbox tests); the ready status names
    // the server.
    assert!(
        notify.seen.iter().any(|m| m.contains("STATUS=supervising")),
        "{:?}",
        notify.seen
    );
}

#[test]
fn json_logs_are_one_object_per_line_and_job_lines_carry_id_and_name() {
    let server = Server::start();
    let api = server.api();
    let mut sup = Supervisor::builder(&server.url)
        .worker("Echo", "#!/bin/sh\ncat > /dev/null\n")
        .arg("--log-format")
        .arg("json")
        .start();
    let id = api.create(json!({"name": "Echo"}));
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    sup.signal(Signal::SIGTERM);
    sup.wait_exit();
    let stderr = sup.stderr();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let starting = lines
        .iter()
        .find(|l| l["fields"]["message"] == "starting worker")
        .unwrap_or_else(|| panic!("no starting line:\n{stderr}"));
    assert_eq!(starting["span"]["job_id"], id, "{starting}");
    assert_eq!(starting["span"]["job_name"], "Echo", "{starting}");
    let finished = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("finished"))
        })
        .unwrap_or_else(|| panic!("no finished line:\n{stderr}"));
    assert_eq!(finished["span"]["job_id"], id, "{finished}");
}

#[test]
fn journal_logs_carry_syslog_priorities_and_no_timestamps_or_colours() {
    let server = Server::start();
    let mut sup = Supervisor::builder(&server.url)
        .arg("--log-format")
        .arg("journal")
        .start();
    sup.signal(Signal::SIGTERM);
    sup.wait_exit();
    let stderr = sup.stderr();
    assert!(!stderr.is_empty());
    for line in stderr.lines() {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| line.starts_with(p)),
            "{line:?}"
        );
        assert!(!line.contains('\u{1b}'), "no colour codes: {line:?}");
        assert!(
            !line.contains("2026-") && !line.contains("Z "),
            "no timestamp: {line:?}"
        );
    }
    let (code, _, err) = {
        let output = Command::new(bin())
            .args(["status", "--log-format", "yaml"])
            .run_bounded("jobmgr status --log-format yaml to be refused");
        (
            output.status.code(),
            (),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(2), "an unknown format is refused: {err}");
    assert!(err.contains("yaml") && err.contains("json"), "{err}");
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line_definition() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(bin())
            .args(["completions", shell])
            .run_bounded(&format!("jobmgr completions {shell}"));
        assert!(output.status.success());
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(
            script.contains("check-config") && script.contains("max-load"),
            "{shell}: {script}"
        );
    }
    let output = Command::new(bin()).arg("man").run_bounded("jobmgr man");
    assert!(output.status.success());
    let page = String::from_utf8_lossy(&output.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH jobmgr"),
        "{page}"
    );
    for option in [
        "max\\-load",
        "worker\\-path",
        "JOBMGR SERVER",
        "JOBMGR CHECK-CONFIG",
        "JOBMGR STATUS",
    ] {
        assert!(page.contains(option), "the man page has {option}");
    }
}

/// The status file names every running job, query string and all, and its
/// worker's pid: it is mode 0640 whatever the supervisor's umask (022 as
/// at a shell, 077 as under its systemd unit). A worker under a uid of its
/// own cannot read it; `jobmgr status` run by a member of the supervisor's
/// group can, and run by anyone else it says why it cannot.
#[test]
fn the_status_file_is_readable_by_the_supervisors_user_and_group_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let test = "the_status_file_is_readable_by_the_supervisors_user_and_group_only";
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: running as other uids needs root");
        return;
    }
    let server = Server::start();
    let api = server.api();
    for umask in ["022", "077"] {
        let builder = Supervisor::builder(&server.url).user(None).wrapped(&[
            "sh",
            "-c",
            &format!("umask {umask} && exec \"$@\""),
            "sh",
        ]);
        // Workers of any uid pass through the supervisor's directory (and
        // reach the status file beside its spool, if its mode lets them).
        std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = builder.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = builder.path().join("status.json");
        let peek = format!(
            "#!/bin/sh\ncat > /dev/null\nif cat '{}' > /dev/null 2>&1; then echo read; else echo denied; fi > '{out}/peek.tmp'\nmv '{out}/peek.tmp' '{out}/peek'\n",
            path.display(),
            out = out.display()
        );
        let sup = builder
            .worker("Peek", &peek)
            .arg("--worker-uids")
            .arg("70040")
            .arg("--max-workers")
            .arg("1")
            .start();
        let id = api.create(json!({"name": "Peek?secret=query"}));
        let said = wait_for("the worker's try", &sup, || {
            std::fs::read_to_string(out.join("peek")).ok()
        });
        assert_eq!(
            said.trim(),
            "denied",
            "umask {umask}: a worker read the status file"
        );
        wait_for("the job to finish", &sup, || {
            api.state(id).is_none().then_some(())
        });
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.mode() & 0o7777, 0o640, "umask {umask}");

        // An operator in the supervisor's group, and someone else.
        let run_as = |uid: u32, gid: u32| {
            let output = Command::new(bin())
                .arg("status")
                .arg("--status-file")
                .arg(&path)
                .env_remove("JOBMGR_STATUS_FILE")
                .uid(uid)
                .gid(gid)
                .run_bounded("jobmgr status as another user");
            (
                output.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        };
        let (code, out_text, err) = run_as(70041, metadata.gid());
        assert_eq!(code, 0, "umask {umask}: a member of the group: {err}");
        assert!(out_text.contains("jobmgr supervisor pid"), "{out_text}");
        let (code, _, err) = run_as(70042, 70042);
        assert_eq!(code, 2, "umask {umask}: someone else: {err}");
        assert!(err.contains("mode 640"), "{err}");
    }
}
