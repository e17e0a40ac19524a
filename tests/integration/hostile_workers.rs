//! Hostile workers: each misbehaviour ends in a clear outcome on
//! its job, and the supervisor stays healthy, bounded in memory, and goes on
//! serving: after each hostile job, a normal job queued behind it finishes.
//!
//! Where each case of the issue is tested:
//!
//! | hostile worker                          | test                                                                      |
//! | --------------------------------------- | ------------------------------------------------------------------------- |
//! | ignores SIGTERM                         | supervisor.rs `a_worker_ignoring_sigterm_is_killed_after_the_grace`       |
//! | leaves a grandchild (timeout)           | supervisor.rs `a_timeout_kills_the_worker_and_its_grandchild`             |
//! | leaves a grandchild (exit)              | here, `a_grandchild_left_by_a_worker_that_exits_dies_with_its_job`        |
//! | grandchild calls setsid (timeout)       | sandbox.rs `a_grandchild_that_left_the_session_dies_with_its_job`         |
//! | grandchild calls setsid (exit)          | edges.rs `output_held_open_by_an_escaped_process_is_kept_and_the_job_reported` |
//! | writes 1 GB to stdout                   | supervisor.rs `a_gigabyte_of_output_does_not_deadlock` (with peak RSS)    |
//! | never reads a big stdin                 | supervisor.rs `a_big_payload_reaches_a_reader_whole_and_does_not_block_a_worker_that_never_reads` (1 MB: the server caps data at 1 MiB, so no stdin is bigger) |
//! | closes stdout early                     | here, `a_worker_that_closes_stdout_early_is_waited_for_and_its_data_kept` |
//! | dies by SIGSEGV or SIGKILL              | supervisor.rs `death_by_a_signal_is_reported_with_the_signals_name`       |
//! | sleeps forever                          | here, `a_worker_that_sleeps_forever_keeps_its_lease_until_its_timeout`    |
//! | exits 0 without output                  | here, `a_worker_that_exits_0_without_output_finishes_and_keeps_the_data`  |
//! | last line is invalid JSON               | here, `a_last_line_that_is_not_a_json_object_leaves_the_data_alone`       |
//! | garbage on fd 3                         | here, `garbage_on_fd_3_is_skipped_in_bounded_memory`                      |
//! | a fork bomb                             | sandbox.rs `a_fork_bomb_is_contained`                                     |
//! | worker file not executable              | supervisor.rs `hostile_job_names_never_run_anything_outside_the_worker_path` ("Plain") |
//! | worker file is a symlink out of the path | supervisor.rs `hostile_job_names_never_run_anything_outside_the_worker_path` ("Escape") |
//! | worker file is a directory (or a FIFO, a dangling link) | here, `a_worker_file_that_is_not_a_regular_file_is_refused` |
//! | a worker that cannot start              | edges.rs `a_worker_that_cannot_start_fails_with_the_reason`               |
//! | fails with data near the 1 MiB cap      | here, `a_failure_of_a_job_with_data_near_the_cap_is_still_reported`       |
//!
//! The sandbox.rs tests need root and cgroups (CI has both) and say SKIPPED
//! on stderr without them; without cgroups, edges.rs checks the report of a
//! setsid grandchild but cannot check its death.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::common::*;

/// The normal worker every test runs after its hostile one.
const NORMAL: &str = "#!/bin/sh\ncat > /dev/null\necho '{\"normal\":true}'\n";

/// Waits until a file exists (workers write theirs with `mv`, so it is
/// whole) and returns its text.
fn wait_file(sup: &Supervisor, path: &Path) -> String {
    wait_for(&format!("{} to exist", path.display()), sup, || {
        std::fs::read_to_string(path).ok()
    })
}

/// Whether a process is gone (or a zombie nobody reaped yet).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => matches!(
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next()),
            Some('Z' | 'X')
        ),
    }
}

/// The supervisor is alive and serves: a normal job queued now finishes.
fn still_serves(api: &Api, sup: &Supervisor) {
    assert!(!dead(sup.pid()), "the supervisor died: {}", sup.stderr());
    let id = api.create(json!({"name": "Normal"}));
    wait_for("a normal job after the hostile one to finish", sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// The failure details the supervisor keeps in a job's data.
fn details(job: &Value) -> &Value {
    &job["data"]["_jobmgr"]
}

/// A job that repeats an hour after it finishes, so that its data and
/// state stay to be looked at after its run.
fn repeating(api: &Api, name: &str, data: Value) -> i64 {
    api.create(json!({"name": name, "data": data, "repeat": "FINISHED, +1 HOUR"}))
}

/// Waits until a repeating job's run was reported: queued again, with a
/// `lastRun`.
fn wait_run_reported(api: &Api, sup: &Supervisor, id: i64) -> Value {
    wait_for(&format!("job {id}'s run to be reported"), sup, || {
        let job = api.job(id);
        let ran = job["lastRun"].as_str().is_some_and(|t| !t.is_empty());
        (job["state"] == "QUEUED" && ran).then_some(job)
    })
}

#[test]
fn a_worker_that_closes_stdout_early_is_waited_for_and_its_data_kept() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    // It says its data, closes stdout (the supervisor's reader sees EOF),
    // then goes on working until the test lets it finish.
    let script = sh(&format!(
        r#"cat > /dev/null
echo '{{"handed":"on"}}'
exec 1>&-
touch '{o}/closed'
while [ ! -e '{o}/go' ]; do sleep 0.02; done
echo 'still working after closing stdout' >&2
exit 0"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Closer", &script)
        .worker("Normal", NORMAL)
        .start();
    let id = repeating(&api, "Closer", json!({"handed": "not yet"}));
    wait_file(&sup, &out.path().join("closed"));
    // Its stdout ended, the worker did not: the job is still running.
    assert_eq!(api.job(id)["state"], "RUNNING", "{}", sup.stderr());
    std::fs::write(out.path().join("go"), "").unwrap();
    let job = wait_run_reported(&api, &sup, id);
    assert_eq!(job["data"], json!({"handed": "on"}), "{job}");
    still_serves(&api, &sup);
}

#[test]
fn a_worker_that_sleeps_forever_keeps_its_lease_until_its_timeout() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let script = sh(&format!(
        r#"echo $$ >> '{o}/runs'
exec sleep 2147483647"#
    ));
    // A lease of 2s, renewed while it sleeps: the timeout ends it, not a
    // lapsed lease (which would hand the job out again).
    let sup = Supervisor::builder(&server.url)
        .worker("Sleeper", &script)
        .worker("Normal", NORMAL)
        .args_of(&["--timeout", "5s", "--lease", "2s", "--max-attempts", "1"])
        .start();
    let id = api.create(json!({"name": "Sleeper"}));
    wait_file(&sup, &out.path().join("runs"));
    // It sleeps; the supervisor serves others meanwhile.
    still_serves(&api, &sup);
    let job = wait_state(&api, &sup, id, "FAILED");
    assert_eq!(details(&job)["outcome"], "timeout", "{job}");
    assert_eq!(details(&job)["killed"], false, "SIGTERM was enough: {job}");
    assert_eq!(details(&job)["attempt"], 1, "{job}");
    let runs = std::fs::read_to_string(out.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "run more than once: {runs}");
    let pid: u32 = runs.trim().parse().unwrap();
    wait_for("the sleeper to be dead", &sup, || dead(pid).then_some(()));
    still_serves(&api, &sup);
}

#[test]
fn a_worker_that_exits_0_without_output_finishes_and_keeps_the_data() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker("Mute", "#!/bin/sh\nexit 0\n")
        .worker("Normal", NORMAL)
        .start();
    let once = api.create(json!({"name": "Mute", "data": {"keep": 1}}));
    let again = repeating(&api, "Mute", json!({"keep": 2}));
    wait_for("the one-off job to be finished", &sup, || {
        api.state(once).is_none().then_some(())
    });
    let job = wait_run_reported(&api, &sup, again);
    assert_eq!(job["data"], json!({"keep": 2}), "{job}");
    still_serves(&api, &sup);
}

#[test]
fn a_last_line_that_is_not_a_json_object_leaves_the_data_alone() {
    let server = Server::start();
    let api = server.api();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let lines = [
        r#"{"run": 2, "state": "#.to_string(),
        r#"{"a":1}}"#.into(),
        r#"{"a":1} and more"#.into(),
        r#"{'a': 1}"#.into(),
        "[1, 2]".into(),
        "42".into(),
        "null".into(),
        r#""a string""#.into(),
        deep,
        // Not UTF-8, so not JSON.
        r#"{"a":"\0377\0376"}"#.into(),
    ];
    let mut builder = Supervisor::builder(&server.url).worker("Normal", NORMAL);
    for (i, line) in lines.iter().enumerate() {
        // printf '%b' turns \0377 into the byte; the rest is as written.
        let quoted = line.replace('\'', r"'\''");
        builder = builder.worker(
            &format!("Bad{i}"),
            &sh(&format!(
                "cat > /dev/null\necho 'some text first'\nprintf '%b\\n' '{quoted}'\nexit 0"
            )),
        );
    }
    let sup = builder.start();
    let ids: Vec<i64> = (0..lines.len())
        .map(|i| repeating(&api, &format!("Bad{i}"), json!({"run": 1})))
        .collect();
    for (id, line) in ids.iter().zip(&lines) {
        let job = wait_run_reported(&api, &sup, *id);
        assert_eq!(job["data"], json!({"run": 1}), "last line {line:?}: {job}");
    }
    still_serves(&api, &sup);
}

#[test]
fn garbage_on_fd_3_is_skipped_in_bounded_memory() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    let value = "x".repeat(60_000);
    // Random bytes; 200 MB without a newline; JSON that is not an object;
    // then a good line. Once that is through, 120 MB of objects of 60 KB
    // whose keys all differ: their merge could never be sent (the server
    // caps data at 1 MiB), so it must not be kept either.
    let script = sh(&format!(
        r#"cat > /dev/null
head -c 1000000 /dev/urandom >&3
head -c 200000000 /dev/zero >&3
printf '\n[1,2]\n"text"\nnull\n{{"unfinished":\n' >&3
echo '{{"phase":"garbage skipped"}}' >&3
while [ ! -e '{o}/go' ]; do sleep 0.02; done
seq 2000 | sed 's/.*/{{"k&":"{value}"}}/' >&3
exit 0"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Garbage", &script)
        .worker("Normal", NORMAL)
        .start();
    let pid = sup.pid();
    let baseline = status_kib(pid, "VmHWM");
    let id = repeating(&api, "Garbage", json!({"orig": true}));
    // The good line after the garbage reaches the server.
    let job = wait_for("the good progress line on the server", &sup, || {
        let job = api.job(id);
        (job["data"]["phase"] == "garbage skipped").then_some(job)
    });
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(job["data"]["orig"], true, "{job}");
    std::fs::write(out.path().join("go"), "").unwrap();
    let job = wait_run_reported(&api, &sup, id);
    assert_eq!(job["data"]["phase"], "garbage skipped", "{job}");
    assert_eq!(job["data"]["orig"], true, "{job}");
    assert_peak_rss_within(pid, baseline, 64, "320 MB of garbage on fd 3");
    still_serves(&api, &sup);
}

#[test]
fn a_grandchild_left_by_a_worker_that_exits_dies_with_its_job() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().display();
    // The grandchild holds none of the worker's pipes, so nothing waits on
    // it: only the end of the job's process group kills it.
    let script = sh(&format!(
        r#"cat > /dev/null
sleep 1000 < /dev/null > /dev/null 2>&1 3>&- &
echo $! > '{o}/gc.tmp' && mv '{o}/gc.tmp' '{o}/grandchild'
exit 0"#
    ));
    let sup = Supervisor::builder(&server.url)
        .worker("Leaver", &script)
        .worker("Normal", NORMAL)
        .start();
    let id = api.create(json!({"name": "Leaver"}));
    let grandchild: u32 = wait_file(&sup, &out.path().join("grandchild"))
        .trim()
        .parse()
        .unwrap();
    wait_for("the job to be finished", &sup, || {
        api.state(id).is_none().then_some(())
    });
    wait_for("the grandchild to be killed with its job", &sup, || {
        dead(grandchild).then_some(())
    });
    still_serves(&api, &sup);
}

#[test]
fn a_worker_file_that_is_not_a_regular_file_is_refused() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).worker("Normal", NORMAL);
    let root = builder.path().to_path_buf();
    let workers = root.join("workers");
    // A directory (with its x bits, as directories have), a symlink to a
    // directory inside and to one outside, a FIFO, a dangling symlink.
    std::fs::create_dir(workers.join("Dir")).unwrap();
    std::fs::set_permissions(workers.join("Dir"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(workers.join("Dir"), workers.join("DirLink")).unwrap();
    std::fs::create_dir(root.join("outside")).unwrap();
    std::os::unix::fs::symlink(root.join("outside"), workers.join("OutLink")).unwrap();
    nix::unistd::mkfifo(
        &workers.join("Fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink(workers.join("Gone"), workers.join("Dangling")).unwrap();
    // Failed at once, not handed back for another host (--no-worker-timeout 0).
    let sup = builder
        .arg("--max-attempts")
        .arg("5")
        .arg("--no-worker-timeout")
        .arg("0")
        .start();
    for (name, reason) in [
        ("Dir", "is not a regular file"),
        ("DirLink", "is not a regular file"),
        ("OutLink", "resolves outside the worker path"),
        ("Fifo", "is not a regular file"),
        ("Dangling", "no worker"),
    ] {
        let id = api.create(json!({"name": name}));
        let job = wait_state(&api, &sup, id, "FAILED");
        let d = details(&job);
        assert_eq!(d["outcome"], "no_worker", "{name}: {job}");
        // No attempts are spent on what cannot run.
        assert_eq!(d["attempt"], 1, "{name}: {job}");
        let text = d["reason"].as_str().unwrap_or("");
        assert!(
            text.contains(reason) && text.contains(name),
            "{name}: {reason:?} not in {text:?}"
        );
    }
    still_serves(&api, &sup);
}

#[test]
fn a_failure_of_a_job_with_data_near_the_cap_is_still_reported() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Fails",
            &sh("cat > /dev/null\necho 'it went wrong' >&2\nexit 3"),
        )
        .worker("Normal", NORMAL)
        .args_of(&["--max-attempts", "1"])
        .start();
    // Data with a little room left: the details shrink to their verdict.
    let fill = |room: usize| "x".repeat(1024 * 1024 - r#"{"fill":""}"#.len() - room);
    let near = api.create(json!({"name": "Fails", "data": {"fill": fill(200)}}));
    let job = wait_state(&api, &sup, near, "FAILED");
    let d = details(&job);
    assert_eq!(
        (&d["outcome"], &d["exitCode"]),
        (&json!("exit"), &json!(3)),
        "{d}"
    );
    assert_eq!(
        job["data"]["fill"].as_str().map(str::len),
        Some(fill(200).len())
    );
    // As big as the server takes: no room for details; FAILED all the same,
    // with the data as it was.
    let full = api.create(json!({"name": "Fails", "data": {"fill": fill(0)}}));
    let job = wait_state(&api, &sup, full, "FAILED");
    assert_eq!(
        job["data"],
        json!({"fill": fill(0)}),
        "details added to a full job"
    );
    still_serves(&api, &sup);
}

/// Several arguments at once.
trait ArgsOf {
    fn args_of(self, args: &[&str]) -> Self;
}

impl ArgsOf for SupervisorBuilder {
    fn args_of(self, args: &[&str]) -> Self {
        args.iter().fold(self, |builder, arg| builder.arg(arg))
    }
}
