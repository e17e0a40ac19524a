//! One uid per running job (issue 19, item 2), for real: the tests run as
//! root in CI, so each job really gets a uid of its own from the range, and
//! a job really tries to read and signal its neighbour. A test skips only
//! when not running as root, and says so on stderr.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::common::*;

/// Skips (returning true) unless running as root.
fn skip_unless_root(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED {test}: running jobs under other uids needs root, and this test is not running as root"
        );
        return true;
    }
    false
}

/// A supervisor of `server` with `user` (`None`: the default, as root a
/// uid per job), whose directory workers of any uid can pass through, and
/// a drop box any of them may write to (`$OUT`): its own, or `shared`.
fn open_builder_sharing(
    server: &Server,
    user: Option<&str>,
    shared: Option<&Path>,
) -> (SupervisorBuilder, PathBuf) {
    let builder = Supervisor::builder(&server.url).user(user);
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = match shared {
        Some(out) => out.to_path_buf(),
        None => {
            let out = builder.path().join("out");
            std::fs::create_dir(&out).unwrap();
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
            out
        }
    };
    let env = format!("OUT={}", out.display());
    (builder.arg("--env").arg(&env), out)
}

fn open_builder(server: &Server, user: Option<&str>) -> (SupervisorBuilder, PathBuf) {
    open_builder_sharing(server, user, None)
}

/// Adds command-line arguments.
fn with_args(mut builder: SupervisorBuilder, args: &[&str]) -> SupervisorBuilder {
    for arg in args {
        builder = builder.arg(arg);
    }
    builder
}

/// Waits, inside a worker, for a file to appear (at most a minute).
const WAIT_FOR: &str = r#"wait_for() { i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.1; done; }"#;

/// The job that is attacked: it says who and where it is, keeps its stdin
/// unread until the prober is done, then finishes normally.
fn victim() -> String {
    sh(&format!(
        r#"{WAIT_FOR}
echo "secret of the victim" > "$HOME/secret"
echo "$$ $HOME $(id -u) $(id -G | tr ' ' ,) $(stat -c %u:%a "$HOME")" > "$OUT/victim.tmp"
chmod 644 "$OUT/victim.tmp"
mv "$OUT/victim.tmp" "$OUT/victim"
wait_for "$OUT/probed"
cat > /dev/null
id -u > "$OUT/victim-done.tmp"
mv "$OUT/victim-done.tmp" "$OUT/victim-done""#
    ))
}

/// The job that attacks: once the victim runs, it tries to list and read
/// its scratch directory, read its stdin and environment, and signal it,
/// and reports each attempt as allowed or denied.
fn prober() -> String {
    sh(&format!(
        r#"{WAIT_FOR}
cat > /dev/null
wait_for "$OUT/victim"
read pid home uid groups scratch < "$OUT/victim"
probe() {{ name=$1; shift; if "$@" > "$OUT/$name.out" 2>&1; then echo "$name=allowed"; else echo "$name=denied"; fi; }}
{{
  echo "uid=$(id -u)"
  echo "victim=$pid"
  probe scratch_list ls "$home"
  probe scratch_read cat "$home/secret"
  probe stdin cat "/proc/$pid/fd/0"
  probe environ cat "/proc/$pid/environ"
  probe signal0 kill -0 "$pid"
  probe signal kill -TERM "$pid"
}} > "$OUT/probe.tmp"
mv "$OUT/probe.tmp" "$OUT/probe"
touch "$OUT/probed""#
    ))
}

/// Runs the victim and the prober at once on a supervisor with `user`;
/// returns the probe's report (`name=allowed|denied`, `uid=N`), the
/// victim's line (pid, home, uid, groups, scratch owner:mode), the
/// supervisor and the server.
fn probe_neighbour(
    user: Option<&str>,
) -> (HashMap<String, String>, Vec<String>, Supervisor, Server) {
    let server = Server::start();
    let api = server.api();
    let (builder, out) = open_builder(&server, user);
    let sup = builder
        .worker("Victim", &victim())
        .worker("Prober", &prober())
        .arg("--max-workers")
        .arg("4")
        .start();
    let victim_id = api.create(json!({"name": "Victim"}));
    let prober_id = api.create(json!({"name": "Prober"}));
    let probe = wait_for("the prober's report", &sup, || {
        std::fs::read_to_string(out.join("probe")).ok()
    });
    let victim = std::fs::read_to_string(out.join("victim")).expect("the victim ran first");
    let mut report: HashMap<String, String> = probe
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    report.insert("victim_job".into(), victim_id.to_string());
    report.insert("prober_job".into(), prober_id.to_string());
    (
        report,
        victim.split_whitespace().map(str::to_string).collect(),
        sup,
        server,
    )
}

fn default_range() -> std::ops::RangeInclusive<u32> {
    60706..=61183
}

#[test]
fn a_job_cannot_read_its_neighbours_scratch_stdin_or_environment_nor_signal_it() {
    let test = "a_job_cannot_read_its_neighbours_scratch_stdin_or_environment_nor_signal_it";
    if skip_unless_root(test) {
        return;
    }
    let (report, victim, sup, server) = probe_neighbour(None);
    let api = server.api();
    let out = sup.dir.path().join("out");
    // Each job ran under a uid of its own from the default range, with the
    // gid of the same number and no supplementary groups, in a scratch
    // directory of its own (0700).
    let victim_uid: u32 = victim[2].parse().unwrap();
    let prober_uid: u32 = report["uid"].parse().unwrap();
    assert_ne!(victim_uid, prober_uid, "{report:?} {victim:?}");
    assert_eq!(
        report.get("victim").map(String::as_str),
        Some(victim[0].as_str()),
        "the prober knew its target"
    );
    for uid in [victim_uid, prober_uid] {
        assert!(
            default_range().contains(&uid),
            "uid {uid} is not from 60706-61183"
        );
    }
    assert_eq!(victim[3], victim_uid.to_string(), "groups: {victim:?}");
    assert_eq!(
        victim[4],
        format!("{victim_uid}:700"),
        "scratch: {victim:?}"
    );
    for attempt in [
        "scratch_list",
        "scratch_read",
        "stdin",
        "environ",
        "signal0",
        "signal",
    ] {
        let said = std::fs::read_to_string(out.join(format!("{attempt}.out"))).unwrap_or_default();
        assert_eq!(
            report.get(attempt).map(String::as_str),
            Some("denied"),
            "{attempt} was not denied: {said}\nreport {report:?}; {}",
            sup.logs()
        );
        assert!(
            said.contains("Permission denied") || said.contains("not permitted"),
            "{attempt} failed for another reason than a denial: {said}"
        );
    }
    // The victim was not disturbed: it read its stdin and finished.
    let done = wait_for("the victim to finish", &sup, || {
        std::fs::read_to_string(out.join("victim-done")).ok()
    });
    assert_eq!(done.trim(), victim_uid.to_string());
    for key in ["victim_job", "prober_job"] {
        let id: i64 = report[key].parse().unwrap();
        wait_for("both jobs to finish", &sup, || {
            api.state(id).is_none().then_some(())
        });
    }
    let log = sup.stderr();
    assert!(
        log.contains("a uid of each job's own from 60706-61183"),
        "the start-up log says how workers run: {log}"
    );
    assert!(!log.contains("workers share uid"), "{log}");
}

/// The same attack, under one user for every job: it succeeds (so the test
/// above would see a leak), and the start-up log says what is shared.
#[test]
fn with_one_user_for_every_job_the_log_says_what_they_share() {
    let test = "with_one_user_for_every_job_the_log_says_what_they_share";
    if skip_unless_root(test) {
        return;
    }
    let (report, victim, sup, _server) = probe_neighbour(Some("nobody"));
    assert_eq!(
        report.get("victim").map(String::as_str),
        Some(victim[0].as_str()),
        "the prober knew its target"
    );
    for attempt in ["scratch_list", "scratch_read", "environ", "signal0"] {
        assert_eq!(
            report.get(attempt).map(String::as_str),
            Some("allowed"),
            "{attempt}: under one shared user the neighbour is exposed; report {report:?}"
        );
    }
    let log = sup.stderr();
    assert!(
        log.contains("workers share uid 65534 (nobody): a job can read another's scratch directory, stdin and environment, and signal it"),
        "{log}"
    );

    let server = Server::start();
    let own = Supervisor::builder(&server.url).user(Some("self")).start();
    // The warning follows the sandbox line; "supervisor started" follows
    // both (waiting for the sandbox line alone could read the log between
    // the two).
    let log = wait_for("the start-up log", &own, || {
        let log = own.stderr();
        log.contains("supervisor started").then_some(log)
    });
    assert!(
        log.contains(
            "workers run as the supervisor's own user, root: a job can read and signal anything"
        ),
        "{log}"
    );
}

/// A record written by the `Record` worker: its uid, and when it started
/// and ended (ns since the epoch).
#[derive(Debug)]
struct Run {
    uid: u32,
    start: u128,
    end: u128,
    job: i64,
    supervisor: String,
}

const RECORD: &str = r#"cat > "$OUT/stdin.$JOBMGR_JOB_ID"
s=$(date +%s%N)
nap=$(sed -n 's/.*"nap":"\([0-9.]*\)".*/\1/p' "$OUT/stdin.$JOBMGR_JOB_ID")
sleep "${nap:-0}"
e=$(date +%s%N)
echo "$(id -u) $s $e $JOBMGR_JOB_ID $SUP" > "$OUT/run.$JOBMGR_JOB_ID.tmp"
mv "$OUT/run.$JOBMGR_JOB_ID.tmp" "$OUT/run.$JOBMGR_JOB_ID""#;

fn runs(out: &Path) -> Vec<Run> {
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("run.") || name.ends_with(".tmp") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let f: Vec<&str> = text.split_whitespace().collect();
        runs.push(Run {
            uid: f[0].parse().unwrap(),
            start: f[1].parse().unwrap(),
            end: f[2].parse().unwrap(),
            job: f[3].parse().unwrap(),
            supervisor: f.get(4).unwrap_or(&"").to_string(),
        });
    }
    runs
}

/// Two supervisors' logs.
struct Both<'a>(&'a Supervisor, &'a Supervisor);

impl Logs for Both<'_> {
    fn logs(&self) -> String {
        format!("{}\n{}", self.0.logs(), self.1.logs())
    }
}

/// Pairs of runs under one uid whose times overlap.
fn overlaps(runs: &[Run]) -> Vec<(i64, i64, u32)> {
    let mut found = Vec::new();
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.uid == b.uid && a.start < b.end && b.start < a.end {
                found.push((a.job, b.job, a.uid));
            }
        }
    }
    found
}

#[test]
fn two_supervisors_sharing_a_range_never_run_two_jobs_under_one_uid_at_once() {
    let test = "two_supervisors_sharing_a_range_never_run_two_jobs_under_one_uid_at_once";
    if skip_unless_root(test) {
        return;
    }
    let server = Server::start();
    let api = server.api();
    // Six slots over four uids: the supervisors contend for them.
    let start = |name: &str, shared: Option<&Path>| {
        let (builder, out) = open_builder_sharing(&server, None, shared);
        let builder = with_args(
            builder.worker("Record", &sh(RECORD)),
            &[
                "--worker-uids",
                "70000-70003",
                "--max-workers",
                "3",
                "--ramp",
                "3",
            ],
        );
        let sup = builder.arg("--env").arg(&format!("SUP={name}")).start();
        (sup, out)
    };
    let (first, out) = start("a", None);
    let (second, _) = start("b", Some(&out));
    let jobs = 60;
    for _ in 0..jobs {
        let nap = format!("0.{:02}", rand::random_range(0..8u32));
        api.create(json!({"name": "Record", "data": {"nap": nap}}));
    }
    let all = wait_for(
        &format!("{jobs} runs to be recorded"),
        &Both(&first, &second),
        || {
            let runs = runs(&out);
            (runs.len() >= jobs).then_some(runs)
        },
    );
    assert!(
        all.iter().all(|r| (70000..=70003).contains(&r.uid)),
        "every job ran under a uid of the range: {all:?}"
    );
    for name in ["a", "b"] {
        assert!(
            all.iter().any(|r| r.supervisor == name),
            "supervisor {name} ran none of the jobs, so nothing was shared: {all:?}"
        );
    }
    let found = overlaps(&all);
    assert!(
        found.is_empty(),
        "jobs ran at once under one uid (job, job, uid): {found:?}\n{}\n{}",
        first.logs(),
        second.logs()
    );
}

/// A stray process of a uid keeps the uid out of use; once it is gone, the
/// job gets it. What a job leaves behind is killed at its end, so the next
/// job under the same uid finds nothing of it.
#[test]
fn a_uid_is_not_handed_out_while_a_process_of_it_lives() {
    let test = "a_uid_is_not_handed_out_while_a_process_of_it_lives";
    if skip_unless_root(test) {
        return;
    }
    let uid = 70010;
    let server = Server::start();
    let api = server.api();
    // A process of the uid from before (a supervisor killed without
    // cgroups leaves such a thing).
    let stray = std::process::Command::new("sleep")
        .arg("1000")
        .uid(uid)
        .gid(uid)
        .spawn()
        .unwrap();
    let mut stray = ChildGuard::new(stray, "a process of uid 70010");
    let (builder, out) = open_builder(&server, None);
    let builder = builder.worker("Record", &sh(RECORD)).worker(
        "Leave",
        &sh(r#"cat > /dev/null
setsid sleep 1000 < /dev/null > /dev/null 2>&1 &
id -u > "$OUT/left""#),
    );
    let sup = with_args(builder, &["--worker-uids", "70010", "--max-workers", "1"]).start();
    let waiting = api.create(json!({"name": "Record"}));
    wait_for("the job to wait for a uid", &sup, || {
        sup.stderr()
            .contains("no free uid for the job")
            .then_some(())
    });
    assert!(
        runs(&out).is_empty(),
        "the job ran under the uid of a live process"
    );
    assert_eq!(api.state(waiting).as_deref(), Some("RUNNING"));
    stray.stop();
    wait_for("the job to run once the stray is gone", &sup, || {
        api.state(waiting).is_none().then_some(())
    });
    assert_eq!(runs(&out)[0].uid, uid);

    // A job that leaves a process of its uid behind, in a session of its own.
    let leaving = api.create(json!({"name": "Leave"}));
    wait_for("the leaving job to finish", &sup, || {
        api.state(leaving).is_none().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(out.join("left")).unwrap().trim(),
        uid.to_string()
    );
    wait_for("no process of the uid to be left", &sup, || {
        processes_of(uid).is_empty().then_some(())
    });
    let after = api.create(json!({"name": "Record"}));
    wait_for("the next job to run under the same uid", &sup, || {
        api.state(after).is_none().then_some(())
    });
    assert_eq!(runs(&out).len(), 2);
}

/// Live processes (not zombies) with `uid` as one of their uids.
fn processes_of(uid: u32) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            let ours = status.lines().any(|l| {
                l.strip_prefix("Uid:")
                    .is_some_and(|u| u.split_whitespace().any(|n| n == uid.to_string()))
            });
            (ours && !zombie).then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

#[test]
fn a_range_systemd_or_root_may_use_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (range, says) in [
        ("61100-61199", "overlaps systemd's dynamic users"),
        ("0-10", "root"),
        ("many", "not a range"),
    ] {
        let output = jobmgr_in(dir.path())
            .args([
                "check-config",
                "--offline",
                "--worker-path",
                "/tmp",
                "--worker-uids",
                range,
            ])
            .run_bounded("jobmgr check-config --worker-uids");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{range}: {stderr}");
        assert!(stderr.contains(says), "{range}: {stderr}");
    }
    let output = jobmgr_in(dir.path())
        .args([
            "check-config",
            "--offline",
            "--worker-path",
            "/tmp",
            "--worker-uids",
            "70000-70099",
        ])
        .run_bounded("jobmgr check-config --worker-uids");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("worker-uids = \"70000-70099\""),
        "check-config shows the setting: {stdout}"
    );
}

/// Removes, when dropped, what a test's jobs may have left under `uid`
/// outside their scratch directories (should the supervisor not have), and
/// the keys named `key` they may have left in this process's session
/// keyring (inherited by the supervisor and its workers).
struct LeftoversOf {
    uid: u32,
    paths: Vec<PathBuf>,
    key: String,
}

impl Drop for LeftoversOf {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!("{KEYCTL}\nunlink_all({:?})", self.key))
            .run_bounded("python3 unlink_all");
        let shm = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
        for line in shm.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let uid = self.uid.to_string();
            if fields.get(7) == Some(&uid.as_str()) || fields.get(9) == Some(&uid.as_str()) {
                let _ = std::process::Command::new("ipcrm")
                    .args(["-m", fields[1]])
                    .run_bounded("ipcrm");
            }
        }
    }
}

/// Python's way to the kernel's keys (`add_key`, `keyctl`), for workers:
/// `add(description, keyring)`, `found(description, keyring)`,
/// `unlink_all(description)` (from the session keyring); keyrings -3 (the
/// session's) and -4 (the user's).
const KEYCTL: &str = r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
def add(name, ring):
    return libc.syscall(ADD_KEY, b"user", name.encode(), b"secret", 6, ring)
def ring_id(ring):
    return libc.syscall(KEYCTL, 0, ring, 1)
def found(name, ring):
    return libc.syscall(KEYCTL, 10, ring, b"user", name.encode(), 0) > 0
def unlink_all(name):
    while True:
        key = libc.syscall(KEYCTL, 10, -3, b"user", name.encode(), 0)
        if key <= 0 or libc.syscall(KEYCTL, 9, key, -3) != 0:
            break"#;

/// A job under a uid of its own leaves a 0600 file in /dev/shm and one in
/// /var/tmp, a System V shared memory segment, a symlink out of /var/tmp,
/// and a key in its user keyring and in its session keyring; the next job
/// given the same uid (the range holds one) finds none of them, has a new
/// user keyring (not the last one emptied), and what the symlink named is
/// untouched.
#[test]
fn a_reused_uid_finds_nothing_its_previous_job_left() {
    let test = "a_reused_uid_finds_nothing_its_previous_job_left";
    if skip_unless_root(test) {
        return;
    }
    let uid = 70020;
    let tag = format!("jobmgr-test-{:016x}", rand::random::<u64>());
    let (shm, var_tmp, link) = (
        PathBuf::from(format!("/dev/shm/{tag}")),
        PathBuf::from(format!("/var/tmp/{tag}")),
        PathBuf::from(format!("/var/tmp/{tag}-link")),
    );
    let _cleanup = LeftoversOf {
        uid,
        paths: vec![shm.clone(), var_tmp.clone(), link.clone()],
        key: tag.clone(),
    };
    let server = Server::start();
    let api = server.api();
    let (builder, out) = open_builder(&server, None);
    let leave = sh(&format!(
        r#"cat > /dev/null
id -u > "$OUT/leave-uid"
(umask 077; echo secret > {shm}; echo secret > {var_tmp})
ln -s "$OUT" {link}
ipcmk -M 4096 > /dev/null && echo shm-segment-made >> "$OUT/made"
[ -e {shm} ] && echo dev-shm-made >> "$OUT/made"
[ -e {var_tmp} ] && echo var-tmp-made >> "$OUT/made"
[ -L {link} ] && echo link-made >> "$OUT/made"
python3 - >> "$OUT/made" <<'PY'
{KEYCTL}
for name, ring in (("user", -4), ("session", -3)):
    if add("{tag}", ring) > 0:
        print(name + "-key-made")
with open(os.environ["OUT"] + "/rings", "a") as rings:
    print(ring_id(-4), file=rings)
PY
exit 0"#,
        shm = shm.display(),
        var_tmp = var_tmp.display(),
        link = link.display(),
    ));
    let look = sh(&format!(
        r#"cat > /dev/null
id -u > "$OUT/look-uid"
{{
  cat {shm} 2>/dev/null && echo dev-shm-found
  cat {var_tmp} 2>/dev/null && echo var-tmp-found
  [ -L {link} ] && echo link-found
  awk -v me="$(id -u)" 'NR > 1 && ($8 == me || $10 == me) {{ print "shm-segment-found", $2 }}' /proc/sysvipc/shm
  python3 - <<'PY'
{KEYCTL}
for name, ring in (("user", -4), ("session", -3)):
    if found("{tag}", ring):
        print(name + "-key-found")
with open(os.environ["OUT"] + "/rings", "a") as rings:
    print(ring_id(-4), file=rings)
PY
}} > "$OUT/found"
exit 0"#,
        shm = shm.display(),
        var_tmp = var_tmp.display(),
        link = link.display(),
    ));
    let sup = with_args(
        builder.worker("Leave", &leave).worker("Look", &look),
        &["--worker-uids", "70020", "--max-workers", "1"],
    )
    .start();
    std::fs::write(out.join("keep"), "the drop box").unwrap();
    let left = api.create(json!({"name": "Leave"}));
    wait_for("the leaving job to finish", &sup, || {
        api.state(left).is_none().then_some(())
    });
    let made = std::fs::read_to_string(out.join("made")).unwrap_or_default();
    for what in [
        "shm-segment-made",
        "dev-shm-made",
        "var-tmp-made",
        "link-made",
        "user-key-made",
        "session-key-made",
    ] {
        assert!(made.contains(what), "the job did not leave {what}: {made}");
    }
    let looked = api.create(json!({"name": "Look"}));
    wait_for("the looking job to finish", &sup, || {
        api.state(looked).is_none().then_some(())
    });
    let uids: Vec<String> = ["leave-uid", "look-uid"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(out.join(f))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    assert_eq!(uids, [uid.to_string(), uid.to_string()]);
    let found = std::fs::read_to_string(out.join("found")).unwrap();
    assert_eq!(
        found.trim(),
        "",
        "the next job under the uid found what the last one left; {}",
        sup.logs()
    );
    assert!(
        out.join("keep").exists(),
        "the removal followed the symlink"
    );
    // Not the same keyring emptied, which keeps the permissions the last
    // job set on it and the links other uids' jobs made to it.
    let rings = std::fs::read_to_string(out.join("rings")).unwrap_or_default();
    let rings: Vec<&str> = rings.split_whitespace().collect();
    assert!(
        rings.len() == 2 && rings[0] != rings[1] && !rings.iter().any(|r| r.starts_with('-')),
        "the next job under the uid got its user keyring back rather than a new one: {rings:?}"
    );
}
