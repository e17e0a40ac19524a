//! A cgroup of a test's own, in the v2 tree and in each v1 hierarchy a
//! supervisor uses (`pids`, `memory`, `cpu`), below the test process's
//! own cgroup in each: supervisors started in it
//! ([`SupervisorBuilder::in_cgroup`](super::SupervisorBuilder::in_cgroup))
//! make their directories in it and see only each other's beside theirs,
//! never those of supervisors the machine runs for anyone else. When
//! dropped, whatever is still in it is killed and it is removed.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The v1 hierarchies a supervisor may use.
const V1: [&str; 3] = ["pids", "memory", "cpu"];

/// A test's cgroup; see the module's doc.
pub struct TestCgroup {
    /// Its directory in the v2 tree.
    v2: PathBuf,
    /// Its directories in the v1 hierarchies.
    v1: Vec<PathBuf>,
}

/// The cgroup path of this process in a hierarchy: the v2 line for `None`,
/// else the v1 line naming `controller`.
fn own_path(controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            None => controllers.is_empty(),
            Some(name) => controllers.split(',').any(|c| c == name),
        };
        matches.then(|| path.trim_start_matches('/').to_string())
    })
}

impl TestCgroup {
    /// Makes one; `None` (the skip said, naming `test`) unless root and a
    /// cgroup v2 tree with `cgroup.kill`.
    pub fn new(test: &str) -> Option<TestCgroup> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED {test}: making cgroups needs root");
            return None;
        }
        let mount = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(PathBuf::from)
            .find(|m| m.join("cgroup.controllers").exists());
        let (Some(mount), Some(own)) = (mount, own_path(None)) else {
            eprintln!("SKIPPED {test}: no cgroup v2 tree here");
            return None;
        };
        let name = format!("jobmgrtest-{:016x}", rand::random::<u64>());
        let v2 = mount.join(own).join(&name);
        std::fs::create_dir(&v2).expect("the test's v2 cgroup");
        if !v2.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&v2);
            eprintln!("SKIPPED {test}: this kernel has no cgroup.kill");
            return None;
        }
        let mut v1 = Vec::new();
        for controller in V1 {
            let mount = Path::new("/sys/fs/cgroup").join(controller);
            let Some(own) = own_path(Some(controller)) else {
                continue;
            };
            if !mount.join("tasks").exists() {
                continue;
            }
            let dir = mount.join(own).join(&name);
            std::fs::create_dir(&dir).expect("the test's v1 cgroup");
            v1.push(dir);
        }
        Some(TestCgroup { v2, v1 })
    }

    /// The `cgroup.procs` file of each of its directories.
    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs()
            .map(|d| {
                CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                    .expect("a path without NUL")
            })
            .collect()
    }

    /// Its directory in the v2 tree.
    pub fn v2(&self) -> &Path {
        &self.v2
    }

    /// Its directories, the v2 one first.
    pub fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.v2).chain(&self.v1)
    }

    /// The directories made in it (in every hierarchy) whose names start
    /// with `prefix`.
    pub fn children(&self, prefix: &str) -> Vec<PathBuf> {
        self.dirs()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .collect()
    }
}

/// The pids in the cgroup `dir` and every cgroup below it.
pub fn pids_below(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(pids_below(&entry.path()));
        }
    }
    pids
}

/// Kills what is in `dir` and below it, and removes them, deepest first.
fn remove(dir: &Path, deadline: Instant) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove(&entry.path(), deadline);
        }
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    loop {
        for pid in pids_below(dir) {
            super::signal_if(pid, nix::sys::signal::SIGKILL, |pid| {
                pids_below(dir).contains(&pid)
            });
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!("cannot remove the test's cgroup {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for dir in self.dirs() {
            remove(dir, deadline);
        }
    }
}
