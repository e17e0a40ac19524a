//! The worker sandbox, for real: the tests run as root in CI, so workers
//! really switch users, get rlimits and cgroups, and the opt-in namespaces
//! and Landlock. A test skips only when the facility is absent here, and
//! says so on stderr.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common::*;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips (returning true) unless running as root.
fn skip_unless_root(test: &str) -> bool {
    if !is_root() {
        eprintln!(
            "SKIPPED {test}: switching users needs root, and this test is not running as root"
        );
        return true;
    }
    false
}

/// Skips (returning true) unless the supervisor found cgroups.
fn skip_without_cgroups(test: &str, sup: &Supervisor) -> bool {
    let log = poll("the sandbox line", || {
        let log = sup.stderr();
        log.contains("sandbox:").then_some(log)
    });
    if log.contains("cgroups: none") {
        eprintln!("SKIPPED {test}: this machine offers no cgroups the supervisor can use");
        return true;
    }
    false
}

/// A supervisor builder whose directory workers of another user can reach.
fn open_builder(server: &Server) -> SupervisorBuilder {
    let builder = Supervisor::builder(&server.url).user(Some("nobody"));
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    builder
}

/// A directory anyone may write, inside `parent`.
fn drop_box(parent: &Path) -> PathBuf {
    let dir = parent.join("out");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Like `poll`, showing the supervisor's log on a time-out.
fn poll_with_log<T>(what: &str, sup: &Supervisor, mut check: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "timed out waiting for {what}; supervisor log:\n{}",
            sup.stderr()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn details(api: &Api, id: i64) -> Value {
    api.job(id)["data"]["_jobmgr"].clone()
}

const INSPECT: &str = r#"#!/usr/bin/env python3
import json, os, resource, sys
sys.stdin.read()
fds = [int(f) for f in os.listdir('/proc/self/fd')]
fds = [f for f in fds if os.path.exists('/proc/self/fd/%d' % f)]
limits = {name: resource.getrlimit(getattr(resource, 'RLIMIT_' + name))
          for name in ['AS', 'CPU', 'NOFILE', 'NPROC', 'FSIZE', 'CORE']}
status = dict(l.split(':\t', 1) for l in open('/proc/self/status') if ':\t' in l)
try:
    secret = open(os.environ['SECRET_FILE']).read()
except Exception as e:
    secret = 'refused: %s' % type(e).__name__
cwd = os.getcwd()
st = os.stat(cwd)
umask = os.umask(0)
report = dict(uid=os.getuid(), gid=os.getgid(), groups=sorted(os.getgroups()), limits=limits,
              fds=sorted(fds), env=dict(os.environ), cwd=cwd, cwd_mode=st.st_mode & 0o7777,
              cwd_uid=st.st_uid, umask=umask, no_new_privs=status['NoNewPrivs'].strip(),
              secret=secret)
open(os.path.join(os.environ['OUT'], 'report.json'), 'w').write(json.dumps(report))
"#;

#[test]
fn a_worker_runs_as_the_configured_user_with_its_limits_and_nothing_more() {
    if skip_unless_root("a_worker_runs_as_the_configured_user_with_its_limits_and_nothing_more") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let builder = open_builder(&server);
    let out = drop_box(builder.path());
    // A file only the supervisor's user may read.
    let secret = builder.path().join("secret");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Started by hand, to give the supervisor an inherited descriptor and a
    // secret in its environment that workers must not get.
    let inherited = std::fs::File::open("/dev/null").unwrap();
    let inherited_fd = std::os::fd::AsRawFd::as_raw_fd(&inherited);
    nix::fcntl::fcntl(
        &inherited,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let d = builder.path().to_path_buf();
    let workers = d.join("workers");
    std::fs::write(workers.join("Inspect"), INSPECT).unwrap();
    std::fs::set_permissions(
        workers.join("Inspect"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let stderr_path = d.join("stderr");
    let child = Command::new(bin())
        .args(["--server", &server.url, "--user", "nobody"])
        .env("JOBMGR_TOKEN", token())
        .arg("--worker-path")
        .arg(&workers)
        .arg("--scratch-dir")
        .arg(d.join("scratch"))
        .arg("--spool-dir")
        .arg(d.join("spool"))
        .arg("--loadavg-path")
        .arg(d.join("loadavg"))
        .arg("--meminfo-path")
        .arg(d.join("meminfo"))
        .args([
            "--limit-nofile",
            "200",
            "--limit-fsize",
            "10MiB",
            "--limit-cpu",
            "30s",
            "--umask",
            "027",
        ])
        .arg("--env")
        .arg(format!("OUT={}", out.display()))
        .arg("--env")
        .arg(format!("SECRET_FILE={}", secret.display()))
        .env("SUPERVISOR_SECRET", "do-not-leak")
        .env("JOBMGR_LOG", "info,jobmgr=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    // Killed and reaped also if the test fails before the end.
    let mut child = ChildGuard::new(child, "the supervisor of user nobody");
    let id = api.create(json!({"name": "Inspect"}));
    let report: Value = poll("the worker's report", || {
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).ok()?).ok()
    });
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    let cwd = PathBuf::from(report["cwd"].as_str().expect("cwd in the report"));
    poll("the job's scratch directory to be removed", || {
        (!cwd.exists()).then_some(())
    });
    child.stop();
    drop(inherited);

    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("nobody exists");
    assert_eq!(report["uid"], nobody.uid.as_raw(), "{report}");
    assert_eq!(report["gid"], nobody.gid.as_raw(), "{report}");
    let name = std::ffi::CString::new("nobody").unwrap();
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&name, nobody.gid)
        .unwrap()
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    assert_eq!(
        report["groups"],
        json!(groups),
        "supplementary groups are the user's: {report}"
    );
    assert_eq!(report["limits"]["NOFILE"], json!([200, 200]));
    assert_eq!(report["limits"]["FSIZE"], json!([10 << 20, 10 << 20]));
    assert_eq!(report["limits"]["CPU"], json!([30, 30]));
    assert_eq!(
        report["limits"]["CORE"],
        json!([0, 0]),
        "no core dumps by default"
    );
    assert_eq!(
        report["fds"],
        json!([0, 1, 2, 3]),
        "only stdio and the progress fd, not {inherited_fd}: {report}"
    );
    let env = report["env"].as_object().unwrap();
    assert!(!env.contains_key("SUPERVISOR_SECRET"), "{report}");
    for key in env.keys() {
        let allowed = [
            "PATH",
            "LANG",
            "LC_ALL",
            "TZ",
            "HOME",
            "TMPDIR",
            "OUT",
            "SECRET_FILE",
            "LC_CTYPE",
        ];
        assert!(
            allowed.contains(&key.as_str()) || key.starts_with("JOBMGR_"),
            "unexpected {key}: {report}"
        );
    }
    assert!(cwd.starts_with(d.join("scratch")), "{report}");
    assert_eq!(report["cwd_mode"], 0o700);
    assert_eq!(report["cwd_uid"], nobody.uid.as_raw());
    assert_eq!(report["umask"], 0o027);
    assert_eq!(report["no_new_privs"], "1");
    assert!(
        report["secret"]
            .as_str()
            .unwrap()
            .starts_with("refused: PermissionError"),
        "{report}"
    );
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        log.contains("workers run as user nobody"),
        "the log says what is in force: {log}"
    );
}

#[test]
fn without_a_user_setting_root_workers_run_unprivileged() {
    if skip_unless_root("without_a_user_setting_root_workers_run_unprivileged") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).user(None);
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = drop_box(builder.path());
    let sup = builder
        .worker(
            "Whoami",
            "#!/bin/sh\ncat > /dev/null\nid -u > \"$OUT/uid\"\n",
        )
        .arg("--env")
        .arg(&format!("OUT={}", out.display()))
        .start();
    let id = api.create(json!({"name": "Whoami"}));
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    let uid: u32 = std::fs::read_to_string(out.join("uid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(uid, 0, "not root unless configured: {}", sup.stderr());
}

#[test]
fn a_fork_bomb_is_contained() {
    if skip_unless_root("a_fork_bomb_is_contained") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let sup = open_builder(&server)
        .worker(
            "Bomb",
            "#!/bin/sh\ncat > /dev/null\nbomb() { bomb | bomb & }\nbomb\nsleep 3\n",
        )
        .worker("After", "#!/bin/sh\ncat > /dev/null\n")
        .args_for_bomb()
        .start();
    if skip_without_cgroups("a_fork_bomb_is_contained", &sup) {
        return;
    }
    let id = api.create(json!({"name": "Bomb"}));
    poll("the bomb job to be reported", || {
        (api.state(id).as_deref() != Some("RUNNING")).then_some(())
    });
    // The machine and the supervisor are fine: the next job runs.
    let after = api.create(json!({"name": "After"}));
    poll("the next job to run", || {
        api.state(after).is_none().then_some(())
    });
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    let left = poll("the bomb's processes to be gone", || {
        let count = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .chars()
                    .all(|c| c.is_ascii_digit())
            })
            .filter(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let zombie = stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next())
                    == Some("Z");
                !zombie && std::fs::metadata(e.path()).is_ok_and(|m| m.uid() == nobody)
            })
            .count();
        (count == 0).then_some(count)
    });
    assert_eq!(left, 0);
}

trait BombArgs {
    fn args_for_bomb(self) -> Self;
}

impl BombArgs for SupervisorBuilder {
    fn args_for_bomb(self) -> Self {
        self.arg("--pids-max")
            .arg("64")
            .arg("--limit-nproc")
            .arg("200")
            .arg("--timeout")
            .arg("5s")
    }
}

#[test]
fn a_grandchild_that_left_the_session_dies_with_its_job() {
    if skip_unless_root("a_grandchild_that_left_the_session_dies_with_its_job") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let builder = open_builder(&server);
    let out = drop_box(builder.path());
    let sup = builder
        .worker(
            "Escape",
            "#!/bin/sh\ncat > /dev/null\nsetsid sleep 300 < /dev/null > /dev/null 2>&1 &\necho $! > \"$OUT/pid\"\nsleep 300\n",
        )
        .arg("--timeout")
        .arg("1s")
        .arg("--env")
        .arg(&format!("OUT={}", out.display()))
        .start();
    if skip_without_cgroups("a_grandchild_that_left_the_session_dies_with_its_job", &sup) {
        return;
    }
    let id = api.create(json!({"name": "Escape"}));
    let pid: i32 = poll("the grandchild's pid", || {
        std::fs::read_to_string(out.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    poll("the timeout to be reported", || {
        (details(&api, id)["outcome"] == "timeout").then_some(())
    });
    poll("the escaped grandchild to be dead", || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        (stat.is_empty() || state == Some("Z")).then_some(())
    });
}

#[test]
fn a_memory_hog_is_killed_and_reported_out_of_memory() {
    if skip_unless_root("a_memory_hog_is_killed_and_reported_out_of_memory") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let sup = open_builder(&server)
        .worker(
            "Hog",
            "#!/usr/bin/env python3\nimport sys\nsys.stdin.read()\nchunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n",
        )
        .arg("--memory-max")
        .arg("64MiB")
        .arg("--max-attempts")
        .arg("1")
        .start();
    if skip_without_cgroups("a_memory_hog_is_killed_and_reported_out_of_memory", &sup) {
        return;
    }
    let id = api.create(json!({"name": "Hog"}));
    let job = poll("the hog to be reported", || {
        let job = api.job(id);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(job["data"]["_jobmgr"]["outcome"], "oom", "{job}");
    let (_, groups) = api.get("/failures");
    assert_eq!(groups["groups"][0]["group"], "oom", "{groups}");
}

#[test]
fn no_network_leaves_workers_without_a_network() {
    if skip_unless_root("no_network_leaves_workers_without_a_network") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    let script = format!(
        "#!/usr/bin/env python3\nimport os, socket, sys\nsys.stdin.read()\ntry:\n    socket.create_connection(('127.0.0.1', {}), timeout=5)\n    r = 'connected'\nexcept OSError as e:\n    r = 'refused: %s' % e\nopen(os.path.join(os.environ['OUT'], 'net'), 'w').write(r)\n",
        server.addr().rsplit(':').next().unwrap()
    );
    for (flag, expect_connected) in [(false, true), (true, false)] {
        let builder = open_builder(&server);
        let out = drop_box(builder.path());
        let mut builder = builder
            .worker("Net", &script)
            .arg("--env")
            .arg(&format!("OUT={}", out.display()));
        if flag {
            builder = builder.arg("--no-network");
        }
        let _sup = builder.start();
        let id = api.create(json!({"name": "Net"}));
        poll("the job to finish", || {
            api.state(id).is_none().then_some(())
        });
        let result = std::fs::read_to_string(out.join("net")).unwrap();
        assert_eq!(
            result == "connected",
            expect_connected,
            "--no-network {flag}: {result}"
        );
    }
}

#[test]
fn read_only_fs_allows_writing_only_the_scratch_directory() {
    if skip_unless_root("read_only_fs_allows_writing_only_the_scratch_directory") {
        return;
    }
    if jobmgr::supervisor::landlock::abi().is_none() {
        eprintln!(
            "SKIPPED read_only_fs_allows_writing_only_the_scratch_directory: this kernel has no Landlock"
        );
        return;
    }
    let server = Server::start();
    let api = server.api();
    let builder = open_builder(&server);
    let out = drop_box(builder.path());
    let elsewhere = drop_box(&builder.path().join("elsewhere"));
    let _sup = builder
        .worker(
            "Writer",
            "#!/bin/sh\ncat > /dev/null\n\
             if echo x > scratch-file; then s=ok; else s=refused; fi\n\
             if echo x > \"$ELSEWHERE/file\" 2>/dev/null; then e=ok; else e=refused; fi\n\
             echo \"{\\\"scratch\\\":\\\"$s\\\",\\\"elsewhere\\\":\\\"$e\\\",\\\"read\\\":\\\"$(head -c 4 /etc/hostname >/dev/null && echo ok)\\\"}\"\n",
        )
        .arg("--read-only-fs")
        .arg("--env")
        .arg(&format!("ELSEWHERE={}", elsewhere.display()))
        .arg("--env")
        .arg(&format!("OUT={}", out.display()))
        .start();
    let id = api.create(json!({"name": "Writer", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the job to finish", || {
        let job = api.job(id);
        job["data"]["scratch"].is_string().then_some(job)
    });
    assert_eq!(
        job["data"],
        json!({"scratch": "ok", "elsewhere": "refused", "read": "ok"}),
        "{job}"
    );
    assert!(!elsewhere.join("file").exists());
}

#[test]
fn private_tmp_gives_each_worker_its_own_tmp() {
    if skip_unless_root("private_tmp_gives_each_worker_its_own_tmp") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    // This test's own directory in the host's /tmp, open to the worker's
    // user: a worker that sees the host's /tmp finds `outside` in it and
    // leaves `inside` there.
    let host_tmp = tempfile::Builder::new()
        .prefix("jobmgr-private-tmp-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(host_tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = host_tmp.path().display().to_string();
    std::fs::write(host_tmp.path().join("outside"), "host").unwrap();
    // The supervisor's files must not live under /tmp, which workers no
    // longer see.
    // A checkout under /tmp has its target directory there too: then use
    // /var/tmp.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let parent = if target.starts_with("/tmp") {
        Path::new("/var/tmp")
    } else {
        target
    };
    let builder = Supervisor::builder_in(&server.url, parent).user(Some("nobody"));
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _sup = builder
        .worker(
            "Tmp",
            &format!(
                "#!/bin/sh\ncat > /dev/null\nmkdir -p {marker}\necho inside > {marker}/inside\n\
                 if [ -e {marker}/outside ]; then s=shared; else s=private; fi\necho \"{{\\\"tmp\\\":\\\"$s\\\"}}\"\n"
            ),
        )
        .arg("--private-tmp")
        .start();
    let id = api.create(json!({"name": "Tmp", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll_with_log("the job to finish", &_sup, || {
        let job = api.job(id);
        job["data"]["tmp"].is_string().then_some(job)
    });
    assert_eq!(job["data"]["tmp"], "private", "{job}");
    assert!(
        !host_tmp.path().join("inside").exists(),
        "the worker's /tmp is its own"
    );
}

#[test]
fn the_user_can_be_set_per_job_name() {
    if skip_unless_root("the_user_can_be_set_per_job_name") {
        return;
    }
    let server = Server::start();
    let api = server.api();
    // The harness runs workers as root; a table says otherwise for one name.
    let builder = Supervisor::builder(&server.url);
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = drop_box(builder.path());
    let config = builder.path().join("jobmgr.toml");
    std::fs::write(&config, "[[job]]\nname = \"AsNobody\"\nuser = \"nobody\"\n").unwrap();
    let script = "#!/bin/sh\ncat > /dev/null\nid -u > \"$OUT/$JOBMGR_JOB_NAME\"\n";
    let _sup = builder
        .worker("AsNobody", script)
        .worker("AsDefault", script)
        .arg("--config")
        .arg(config.to_str().unwrap())
        .arg("--env")
        .arg(&format!("OUT={}", out.display()))
        .start();
    let a = api.create(json!({"name": "AsNobody"}));
    let b = api.create(json!({"name": "AsDefault"}));
    poll("both jobs to finish", || {
        (api.state(a).is_none() && api.state(b).is_none()).then_some(())
    });
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    assert_eq!(
        std::fs::read_to_string(out.join("AsNobody"))
            .unwrap()
            .trim(),
        nobody.to_string()
    );
    assert_eq!(
        std::fs::read_to_string(out.join("AsDefault"))
            .unwrap()
            .trim(),
        "0"
    );
}

#[test]
fn user_self_means_the_supervisors_own_user() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url).user(Some("self"));
    let out = drop_box(builder.path());
    let _sup = builder
        .worker(
            "Whoami",
            "#!/bin/sh\ncat > /dev/null\nid -u > \"$OUT/uid\"\n",
        )
        .arg("--env")
        .arg(&format!("OUT={}", out.display()))
        .start();
    let id = api.create(json!({"name": "Whoami"}));
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    let uid: u32 = std::fs::read_to_string(out.join("uid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(uid, nix::unistd::geteuid().as_raw());
}
