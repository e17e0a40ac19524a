//! One cgroup per job, where the machine allows it. With cgroup v2 (the
//! unified hierarchy with its controllers), a job's cgroup gets `memory.max`,
//! `pids.max` and `cpu.max`, and is killed whole with `cgroup.kill`. On
//! hybrid machines (v1 controllers beside a controller-less v2 tree) the v1
//! `memory`, `pids` and `cpu` hierarchies carry the limits and the v2 tree
//! still provides `cgroup.kill`. Either way the kill also catches processes
//! that left the worker's process group, and an out-of-memory kill is seen.
//!
//! A worker is in its job's cgroups from before its exec: the spawner
//! clones it into the v2 one where the kernel can, and it writes itself
//! into the rest (see [`JobCgroup::v1_tasks`]).
//!
//! Cgroups live under the supervisor's own cgroup, in a directory of its
//! own named `jobmgr-` and sixteen random letters: unique across PID
//! namespaces (supervisors in containers, nspawn machines or `unshare
//! --pid` may share the cgroup tree and have the same pid), and never read
//! as a pid. The supervisor holds an exclusive `flock` on that directory
//! while it lives, which the kernel drops with its last descriptor however
//! it dies; the lock, not `/proc/PID` (which shows one PID namespace
//! only), is what tells a starting supervisor whether a directory's owner
//! is gone. A directory whose lock is free is left by a supervisor that
//! died: its processes are killed and it is removed. A directory removed
//! under a running supervisor (an `rmdir` of the empty directory) is made
//! again at its next job.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg, OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::proc_stat::ProcStat;
use super::yielding::{JOBS_CPU_SHARES, JOBS_CPU_WEIGHT, JOBS_IO_WEIGHT, ParentYield};

/// The limits a job's cgroup gets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupLimits {
    /// `memory.max` (v1 `memory.limit_in_bytes`), in bytes.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// CPUs' worth of time, e.g. 0.5 or 2.
    pub cpu_max: Option<f64>,
}

impl CgroupLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.memory_max.is_some() || self.pids_max.is_some() || self.cpu_max.is_some()
    }
}

/// A cgroup directory of ours, held open (and locked: see the module's
/// doc): a job's cgroups are made, written and removed relative to it, so
/// that no call walks the whole path from `/sys/fs/cgroup` again (each
/// component a kernfs lookup).
#[derive(Debug, Clone)]
struct Base {
    path: PathBuf,
    dir: Arc<Flock<OwnedFd>>,
}

/// How many times a supervisor makes its directory when another
/// supervisor's clean-up removes it as it is made.
const CLAIM_TRIES: usize = 5;

impl Base {
    /// Makes the directory `name` in `parent` (or takes the one there),
    /// opens it and locks it. The lock is waited for: a starting
    /// supervisor may hold it for a moment, having found the directory
    /// unlocked between its making and its locking here, and removes it if
    /// it can; then it is made again.
    fn claim(parent: &Path, name: &str) -> io::Result<Self> {
        let path = parent.join(name);
        for _ in 0..CLAIM_TRIES {
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(naming(&path, e)),
            }
            let dir = match fs::File::open(&path) {
                Ok(dir) => OwnedFd::from(dir),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(naming(&path, e)),
            };
            let dir = Flock::lock(dir, FlockArg::LockExclusive)
                .map_err(|(_, errno)| naming(&path, errno))?;
            let locked = fs::File::from(dir.try_clone().map_err(|e| naming(&path, e))?);
            let same = match (fs::metadata(&path), locked.metadata()) {
                (Ok(there), Ok(ours)) => there.ino() == ours.ino() && there.dev() == ours.dev(),
                _ => false,
            };
            if same {
                return Ok(Base {
                    path,
                    dir: Arc::new(dir),
                });
            }
        }
        Err(io::Error::other(format!(
            "{}: removed again each of the {CLAIM_TRIES} times it was made",
            path.display()
        )))
    }

    /// Makes the job directory `name` in it.
    fn make(&self, name: &str) -> io::Result<PathBuf> {
        let path = self.path.join(name);
        mkdirat(&**self.dir, name, Mode::from_bits_truncate(0o755))
            .map_err(|e| naming(&path, e))?;
        Ok(path)
    }

    /// Writes `value` to the file `name/file` in it.
    fn write(&self, name: &str, file: &str, value: &str) -> io::Result<()> {
        let relative = format!("{name}/{file}");
        let context = |e: io::Error| naming(&self.path.join(&relative), e);
        let fd = openat(
            &**self.dir,
            relative.as_str(),
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| context(e.into()))?;
        io::Write::write_all(&mut fs::File::from(fd), value.as_bytes()).map_err(context)
    }

    /// Removes the job directory `name` from it; true if it is gone (also
    /// when it was already), false while the kernel refuses (a process is
    /// still in it).
    fn remove(&self, name: &str) -> bool {
        match unlinkat(&**self.dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => true,
            Err(errno) => errno == nix::errno::Errno::ENOENT,
        }
    }
}

/// One hierarchy's directory of ours, made again when it is found removed.
#[derive(Debug)]
struct Hierarchy {
    /// The supervisor's own cgroup in the hierarchy, where `base` is.
    own: PathBuf,
    /// The controllers job directories get (`cgroup.subtree_control`; v2
    /// only).
    subtree: Vec<String>,
    /// What the directory itself gets for the jobs to yield (file, value),
    /// written again when it is made again.
    parent_files: Vec<ParentFile>,
    base: RwLock<Base>,
}

impl Hierarchy {
    fn new(own: PathBuf, subtree: Vec<String>, base: Base) -> Self {
        Hierarchy {
            own,
            subtree,
            parent_files: Vec::new(),
            base: RwLock::new(base),
        }
    }

    /// Writes `files` into the directory (each the first of its
    /// alternatives that the kernel takes: `cpu.idle`, else a weight), keeps
    /// the ones written for a directory made again, and says what was done.
    fn yield_with(&mut self, files: Vec<Vec<ParentFile>>) -> Vec<String> {
        let base = self.base();
        let mut done = Vec::new();
        for alternatives in files {
            let mut errors = Vec::new();
            for (file, value) in alternatives {
                match write(&base.path.join(file), &value) {
                    Ok(()) => {
                        done.push(format!("{file} {value}"));
                        self.parent_files.push((file, value));
                        errors.clear();
                        break;
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            if !errors.is_empty() {
                done.push(format!("not set: {}", errors.join("; ")));
            }
        }
        done
    }

    /// The directory as it is now.
    fn base(&self) -> Base {
        self.base.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes the job directory `job` in the supervisor's directory `name`,
    /// making that again first if it was removed; returns the directory it
    /// was made in, and its path.
    fn make(&self, name: &str, job: &str) -> io::Result<(Base, PathBuf)> {
        let base = self.base();
        match base.make(job) {
            Ok(path) => Ok((base, path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let base = self.make_again(&base, name)?;
                let path = base.make(job)?;
                Ok((base, path))
            }
            Err(e) => Err(e),
        }
    }

    /// Makes the supervisor's directory `name` again in place of `gone`,
    /// unless another job did meanwhile.
    fn make_again(&self, gone: &Base, name: &str) -> io::Result<Base> {
        let mut current = self.base.write().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&current.dir, &gone.dir) {
            return Ok(current.clone());
        }
        tracing::warn!(dir = %gone.path.display(), "the supervisor's cgroup directory was removed; making it again");
        let base = Base::claim(&self.own, name)?;
        if !self.subtree.is_empty() {
            let enable: Vec<String> = self.subtree.iter().map(|c| format!("+{c}")).collect();
            write(&base.path.join("cgroup.subtree_control"), &enable.join(" "))?;
        }
        for (file, value) in &self.parent_files {
            write(&base.path.join(file), value)?;
        }
        *current = base.clone();
        Ok(base)
    }
}

/// Where job cgroups are made.
#[derive(Debug)]
pub struct Cgroups {
    /// The name of this supervisor's directory in each hierarchy.
    name: String,
    /// A v2 directory of ours (with `cgroup.kill`), if any.
    unified: Option<Hierarchy>,
    /// Whether the v2 directory has the memory, pids and cpu controllers.
    unified_controllers: Vec<String>,
    /// v1 directories of ours, by controller.
    v1: Vec<(&'static str, Hierarchy)>,
    /// What the directories got for the jobs to yield, for the start-up
    /// log.
    yielded: Vec<String>,
}

/// What every supervisor's directory is named after.
const PREFIX: &str = "jobmgr-";

/// What the leaf a supervisor moves itself into is named after, following
/// its directory's name (v2 with controllers: processes only in leaves).
const LEAF_SUFFIX: &str = "-supervisor";

/// How many letters a supervisor's id has.
const ID_LETTERS: usize = 16;

/// A fresh name for a supervisor's directories: [`PREFIX`] and
/// [`ID_LETTERS`] random lowercase letters (75 bits).
fn fresh_name() -> String {
    let id: String = (0..ID_LETTERS)
        .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
        .collect();
    format!("{PREFIX}{id}")
}

/// What a directory beside ours is, by its name.
#[derive(Debug, PartialEq, Eq)]
enum Named<'a> {
    /// A supervisor's directory (`jobmgr-ID`).
    Supervisor,
    /// The leaf of the supervisor's directory named here.
    Leaf(&'a str),
    /// Anything else, an older version's directory named after a pid
    /// included: never touched.
    Other,
}

fn named(name: &str) -> Named<'_> {
    let is_id = |id: &str| id.len() == ID_LETTERS && id.bytes().all(|b| b.is_ascii_lowercase());
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return Named::Other;
    };
    if is_id(rest) {
        return Named::Supervisor;
    }
    match rest.strip_suffix(LEAF_SUFFIX) {
        Some(id) if is_id(id) => Named::Leaf(&name[..PREFIX.len() + id.len()]),
        _ => Named::Other,
    }
}

/// A job's cgroups.
#[derive(Debug)]
pub struct JobCgroup {
    dirs: Vec<PathBuf>,
    /// The name of the job's directory in each of `bases`, open
    /// directories that parallel `dirs`: the usual end removes them there.
    name: String,
    bases: Vec<Base>,
    /// Set once every directory is removed: nothing is left to kill.
    removed: std::sync::atomic::AtomicBool,
    /// The v1 `tasks` files the worker writes itself into (see
    /// [`JobCgroup::v1_tasks`]).
    tasks: Vec<PathBuf>,
    /// The v2 directory, which the worker is cloned into or joins.
    unified: Option<PathBuf>,
    /// Whether the v2 directory has the memory controller (and so a
    /// `memory.events` to read for an out-of-memory kill).
    memory_v2: bool,
    memory_v1: Option<PathBuf>,
    /// The job's CPU starvation in microseconds, read before its v2
    /// directory goes ([`NOT_READ`] until then).
    starved_us: std::sync::atomic::AtomicU64,
}

/// [`JobCgroup::starved`] not read yet.
const NOT_READ: u64 = u64::MAX;

const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The cgroup path of this process in a hierarchy: `0::/a/b` for v2, or the
/// v1 line naming `controller`.
fn own_path(controller: Option<&str>) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            None => controllers.is_empty(),
            Some(name) => controllers.split(',').any(|c| c == name),
        };
        matches.then(|| path.to_string())
    })
}

/// The v2 tree's mount: `/sys/fs/cgroup` itself (pure v2) or
/// `/sys/fs/cgroup/unified` (hybrid).
pub fn unified_mount() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|m| m.join("cgroup.procs").exists() && m.join("cgroup.controllers").exists())
}

/// `error`, its message led by the `path` it concerns.
fn naming(path: &Path, error: impl Into<io::Error>) -> io::Error {
    let error = error.into();
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| naming(path, e))
}

/// Our v2 directory as [`Cgroups::prepare_v2`] left it.
struct PreparedV2 {
    base: Base,
    /// The controllers each job's directory gets.
    for_jobs: Vec<String>,
    /// The controllers our directory has for the jobs to yield.
    for_parent: Vec<String>,
    /// What the start-up log should say of it.
    notes: Vec<String>,
}

/// A file of ours to write: its name and value.
type ParentFile = (&'static str, String);

/// The files our v2 directory gets for the jobs to yield, each a list of
/// alternatives, for the `controllers` it has.
fn v2_parent_files(controllers: &[String], parent: &ParentYield) -> Vec<Vec<ParentFile>> {
    let has = |c: &str| controllers.iter().any(|h| h == c);
    let mut files = Vec::new();
    if parent.cpu && has("cpu") {
        files.push(vec![
            ("cpu.idle", "1".to_string()),
            ("cpu.weight", JOBS_CPU_WEIGHT.to_string()),
        ]);
    }
    if parent.io && has("io") {
        files.push(vec![("io.weight", format!("default {JOBS_IO_WEIGHT}"))]);
    }
    if let Some((bytes, _)) = parent.memory_high.filter(|_| has("memory")) {
        files.push(vec![("memory.high", bytes.to_string())]);
    }
    files
}

/// The files our v1 directory of `controller` gets for the jobs to yield.
/// v1 has no `memory.high`: its soft limit is what the kernel reclaims
/// first when memory runs short.
fn v1_parent_files(controller: &str, parent: &ParentYield) -> Vec<Vec<ParentFile>> {
    match controller {
        "cpu" if parent.cpu => vec![vec![
            ("cpu.idle", "1".to_string()),
            ("cpu.shares", JOBS_CPU_SHARES.to_string()),
        ]],
        "memory" => parent
            .memory_high
            .map(|(bytes, _)| vec![vec![("memory.soft_limit_in_bytes", bytes.to_string())]])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

impl Cgroups {
    /// Finds what this machine offers and prepares a directory of this
    /// supervisor's own (see the module's doc) under its own cgroups, which
    /// gets `parent`'s settings for the jobs to yield. `Err` explains why
    /// there are none.
    pub fn detect(limits: &CgroupLimits, parent: &ParentYield) -> Result<Self, String> {
        let name = fresh_name();
        let mut found = Cgroups {
            name: name.clone(),
            unified: None,
            unified_controllers: Vec::new(),
            v1: Vec::new(),
            yielded: Vec::new(),
        };
        let mut reasons = Vec::new();
        // Controllers our v2 directory has (for itself, not its jobs).
        let mut v2_own = Vec::new();

        // The v2 tree: /sys/fs/cgroup itself (pure v2) or /sys/fs/cgroup/unified (hybrid).
        match (unified_mount(), own_path(None)) {
            (Some(mount), Some(own)) => {
                let own_dir = mount.join(own.trim_start_matches('/'));
                match Self::prepare_v2(&own_dir, &name, limits, parent) {
                    Ok(prepared) => {
                        let mut hierarchy =
                            Hierarchy::new(own_dir, prepared.for_jobs.clone(), prepared.base);
                        let done =
                            hierarchy.yield_with(v2_parent_files(&prepared.for_parent, parent));
                        found
                            .yielded
                            .extend(done.into_iter().map(|d| format!("v2 {d}")));
                        found.yielded.extend(prepared.notes);
                        found.unified = Some(hierarchy);
                        found.unified_controllers = prepared.for_jobs;
                        v2_own = prepared.for_parent;
                    }
                    Err(e) => reasons.push(format!("cgroup v2: {e}")),
                }
            }
            _ => reasons.push("no cgroup v2 tree".into()),
        }
        // v1 controllers the v2 tree lacks.
        for controller in V1_CONTROLLERS {
            let (for_jobs, for_parent) = match controller {
                "memory" => (limits.memory_max.is_some(), parent.memory_high.is_some()),
                "pids" => (limits.pids_max.is_some(), false),
                _ => (limits.cpu_max.is_some(), parent.cpu),
            };
            let in_v2 = |list: &[String]| list.iter().any(|c| c == controller);
            let for_jobs = for_jobs && !in_v2(&found.unified_controllers);
            let for_parent = for_parent && !in_v2(&v2_own);
            if !for_jobs && !for_parent {
                continue;
            }
            let mount = PathBuf::from("/sys/fs/cgroup").join(controller);
            let Some(own) = own_path(Some(controller)) else {
                continue;
            };
            // A v1 hierarchy (workers join it through its `tasks`).
            if !mount.join("tasks").exists() {
                continue;
            }
            let own_dir = mount.join(own.trim_start_matches('/'));
            match Base::claim(&own_dir, &name) {
                Ok(base) => {
                    let mut hierarchy = Hierarchy::new(own_dir, Vec::new(), base);
                    if for_parent {
                        let done = hierarchy.yield_with(v1_parent_files(controller, parent));
                        found
                            .yielded
                            .extend(done.into_iter().map(|d| format!("v1 {d}")));
                    }
                    found.v1.push((controller, hierarchy));
                }
                Err(e) => reasons.push(format!("cgroup v1 {controller}: {e}")),
            }
        }
        if found.unified.is_none() && found.v1.is_empty() {
            return Err(reasons.join("; "));
        }
        if parent.io && !v2_own.iter().any(|c| c == "io") {
            found
                .yielded
                .push("no io.weight (no cgroup v2 io controller here)".into());
        }
        found.clean_stale();
        Ok(found)
    }

    /// Makes our v2 directory; enables the controllers the limits and
    /// `parent` need when the tree offers them (moving the supervisor and
    /// its helper process into a leaf first, as v2 wants processes only in
    /// leaves).
    fn prepare_v2(
        own: &Path,
        name: &str,
        limits: &CgroupLimits,
        parent: &ParentYield,
    ) -> io::Result<PreparedV2> {
        let available = fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
        let offered = |c: &str| available.split_whitespace().any(|a| a == c);
        let pick = |wanted: [(&str, bool); 3]| -> Vec<String> {
            wanted
                .into_iter()
                .filter(|(c, want)| *want && offered(c))
                .map(|(c, _)| c.to_string())
                .collect()
        };
        let for_jobs = pick([
            ("memory", limits.memory_max.is_some()),
            ("pids", limits.pids_max.is_some()),
            ("cpu", limits.cpu_max.is_some()),
        ]);
        let mut notes = Vec::new();
        let mut for_parent = pick([
            ("memory", parent.memory_high.is_some()),
            ("io", parent.io),
            ("cpu", parent.cpu),
        ]);
        let mut own_enable = for_parent.clone();
        own_enable.extend(for_jobs.iter().filter(|c| !for_parent.contains(c)).cloned());
        let base = Base::claim(own, name)?;
        let dir = base.path.clone();
        if !own_enable.is_empty() {
            // Processes may not sit in a cgroup that hands controllers down.
            let leaf = own.join(format!("{name}-supervisor"));
            fs::create_dir_all(&leaf)?;
            // This process and its helper (the spawner, or the job guard,
            // forked before any worker) move; if others share the cgroup,
            // handing controllers down fails and the v1 hierarchies are
            // used instead.
            let me = std::process::id();
            let helpers = children_in(own, me);
            write(&leaf.join("cgroup.procs"), &me.to_string())?;
            for helper in helpers {
                write(&leaf.join("cgroup.procs"), &helper.to_string())?;
            }
            let plus = |list: &[String]| {
                list.iter()
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if !for_jobs.is_empty() {
                write(&own.join("cgroup.subtree_control"), &plus(&for_jobs))?;
                write(&dir.join("cgroup.subtree_control"), &plus(&for_jobs))?;
            }
            // The jobs' yielding is not worth the limits: a controller the
            // kernel will not hand down here is said, and done without.
            for controller in own_enable.iter().filter(|c| !for_jobs.contains(c)) {
                if let Err(e) = write(
                    &own.join("cgroup.subtree_control"),
                    &format!("+{controller}"),
                ) {
                    for_parent.retain(|c| c != controller);
                    notes.push(format!(
                        "no {controller} controller for the jobs' cgroup: {e}"
                    ));
                }
            }
        }
        if !dir.join("cgroup.kill").exists() {
            return Err(io::Error::other("this kernel has no cgroup.kill"));
        }
        if let Some((_, false)) = parent.memory_high
            && let Ok(high) = fs::read_to_string(own.join("memory.high"))
            && high.trim() != "max"
        {
            // A service manager's MemoryHigh= above: it, not a default, rules.
            for_parent.retain(|c| c != "memory");
            notes.push(format!(
                "memory.high left to {} ({}), as the service manager set it",
                own.display(),
                high.trim()
            ));
        }
        if parent.cpu
            && fs::read_to_string(own.join("cpu.idle")).is_ok_and(|idle| idle.trim() != "1")
            && let Ok(weight) = fs::read_to_string(own.join("cpu.weight"))
            && weight
                .trim()
                .parse::<u32>()
                .is_ok_and(|w| w > JOBS_CPU_WEIGHT)
        {
            notes.push(format!(
                "the supervisor's own cgroup {} has cpu.weight {}: jobs yield within it, but it competes with the site at that weight; give its unit CPUWeight=idle (the packaged units do)",
                own.display(),
                weight.trim()
            ));
        }
        Ok(PreparedV2 {
            base,
            for_jobs,
            for_parent,
            notes,
        })
    }

    /// Every hierarchy of ours.
    fn hierarchies(&self) -> impl Iterator<Item = &Hierarchy> {
        self.unified.iter().chain(self.v1.iter().map(|(_, h)| h))
    }

    /// Kills and removes the directories of supervisors that are gone
    /// beside ours: those whose lock no one holds (see the module's doc),
    /// with their leaves; and leaves whose directory is gone, once empty.
    fn clean_stale(&self) {
        for hierarchy in self.hierarchies() {
            let Ok(entries) = fs::read_dir(&hierarchy.own) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else {
                    continue;
                };
                match named(name) {
                    Named::Supervisor if name != self.name => {
                        let path = entry.path();
                        // Held while its directories go, so that no one else
                        // takes it for theirs meanwhile.
                        let Some(_lock) = unlocked(&path) else {
                            continue;
                        };
                        tracing::warn!(dir = %path.display(), "removing the job cgroups of a supervisor that is gone, and what still runs in them");
                        remove_tree(&path);
                        let leaf = hierarchy.own.join(format!("{name}{LEAF_SUFFIX}"));
                        if leaf.exists() {
                            remove_tree(&leaf);
                        }
                    }
                    // A live supervisor is in its leaf: the kernel refuses
                    // to remove it then.
                    Named::Leaf(owner) if !hierarchy.own.join(owner).exists() => {
                        let _ = fs::remove_dir(entry.path());
                    }
                    _ => {}
                }
            }
        }
    }

    /// A description for the start-up log.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(hierarchy) = &self.unified {
            let controllers = if self.unified_controllers.is_empty() {
                "kill only".to_string()
            } else {
                self.unified_controllers.join(", ")
            };
            let path = hierarchy.base().path;
            parts.push(format!("v2 at {} ({controllers})", path.display()));
        }
        for (controller, hierarchy) in &self.v1 {
            let path = hierarchy.base().path;
            parts.push(format!("v1 {controller} at {}", path.display()));
        }
        parts.join("; ")
    }

    /// What our directories got for the jobs to yield, and what could not
    /// be set, for the start-up log.
    pub fn yielded(&self) -> &[String] {
        &self.yielded
    }

    /// Makes a job's cgroups with `limits`. Each directory is made, and
    /// its limits written, relative to its base's open directory; a base
    /// found removed is made again first.
    pub fn job(&self, job_id: i64, limits: &CgroupLimits) -> io::Result<JobCgroup> {
        let name = format!("job-{job_id}-{:08x}", rand::random::<u32>());
        let mut job = JobCgroup {
            dirs: Vec::new(),
            name: name.clone(),
            bases: Vec::new(),
            removed: std::sync::atomic::AtomicBool::new(false),
            tasks: Vec::new(),
            unified: None,
            memory_v2: false,
            memory_v1: None,
            starved_us: std::sync::atomic::AtomicU64::new(NOT_READ),
        };
        if let Some(hierarchy) = &self.unified {
            let (base, dir) = hierarchy.make(&self.name, &name)?;
            job.dirs.push(dir.clone());
            job.bases.push(base.clone());
            for controller in &self.unified_controllers {
                match controller.as_str() {
                    "memory" => {
                        if let Some(max) = limits.memory_max {
                            base.write(&name, "memory.max", &max.to_string())?;
                            let _ = base.write(&name, "memory.swap.max", "0");
                        }
                        job.memory_v2 = true;
                    }
                    "pids" => {
                        if let Some(max) = limits.pids_max {
                            base.write(&name, "pids.max", &max.to_string())?;
                        }
                    }
                    "cpu" => {
                        if let Some(cpus) = limits.cpu_max {
                            let period = 100_000u64;
                            let quota = ((cpus * period as f64) as u64).max(1000);
                            base.write(&name, "cpu.max", &format!("{quota} {period}"))?;
                        }
                    }
                    _ => {}
                }
            }
            job.unified = Some(dir);
        }
        for (controller, hierarchy) in &self.v1 {
            let needs_dir = match *controller {
                "memory" => limits.memory_max.is_some(),
                "pids" => limits.pids_max.is_some(),
                _ => limits.cpu_max.is_some(),
            };
            if !needs_dir {
                // No limit of its own here: the job joins our directory,
                // which is all it needs (cpu.idle, the soft limit).
                let mut base = hierarchy.base();
                if !base.path.exists() {
                    base = hierarchy.make_again(&base, &self.name)?;
                }
                job.tasks.push(base.path.join("tasks"));
                continue;
            }
            let (base, dir) = hierarchy.make(&self.name, &name)?;
            job.dirs.push(dir.clone());
            job.bases.push(base.clone());
            match *controller {
                "memory" => {
                    if let Some(max) = limits.memory_max {
                        base.write(&name, "memory.limit_in_bytes", &max.to_string())?;
                        let _ = base.write(&name, "memory.memsw.limit_in_bytes", &max.to_string());
                    }
                    job.memory_v1 = Some(dir.clone());
                }
                "pids" => {
                    if let Some(max) = limits.pids_max {
                        base.write(&name, "pids.max", &max.to_string())?;
                    }
                }
                "cpu" => {
                    if let Some(cpus) = limits.cpu_max {
                        let period = 100_000u64;
                        base.write(&name, "cpu.cfs_period_us", &period.to_string())?;
                        base.write(
                            &name,
                            "cpu.cfs_quota_us",
                            &((cpus * period as f64) as u64).max(1000).to_string(),
                        )?;
                    }
                }
                _ => {}
            }
            job.tasks.push(dir.join("tasks"));
        }
        Ok(job)
    }
}

impl JobCgroup {
    /// How long the job had a process ready to run but waiting for a CPU
    /// (its v2 directory's `cpu.pressure`, `some total`): the time the
    /// site, or other jobs, kept it from running. `None` without a v2
    /// directory or PSI. Read while the directory lasts, and kept.
    pub fn starved(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering;
        let kept = self.starved_us.load(Ordering::SeqCst);
        if kept != NOT_READ {
            return Some(Duration::from_micros(kept));
        }
        let total = self.starved_now()?;
        self.starved_us
            .store(total.as_micros() as u64, Ordering::SeqCst);
        Some(total)
    }

    /// As [`JobCgroup::starved`], read now and not kept (for a job that
    /// runs).
    pub fn starved_now(&self) -> Option<Duration> {
        let text = fs::read_to_string(self.unified.as_ref()?.join("cpu.pressure")).ok()?;
        let total = text
            .lines()
            .find(|l| l.starts_with("some "))?
            .split_whitespace()
            .find_map(|field| field.strip_prefix("total="))?
            .parse::<u64>()
            .ok()?;
        Some(Duration::from_micros(total))
    }

    /// The job's v2 directory: the spawner clones the worker into it
    /// (`CLONE_INTO_CGROUP`), or the worker writes itself into its
    /// `cgroup.procs` before its exec where the kernel cannot.
    pub fn unified_dir(&self) -> Option<&Path> {
        self.unified.as_deref()
    }

    /// The v1 `tasks` files the worker writes itself (`0`) into before its
    /// exec. It has one thread then, so moving that thread moves all of it;
    /// and a thread that moves itself is moved without the kernel's global
    /// lock on every process's cgroups (`cgroup.procs` takes it for
    /// writing, which can wait for an RCU grace period, 10 to 30 ms).
    pub fn v1_tasks(&self) -> &[PathBuf] {
        &self.tasks
    }

    /// Kills everything in the job's cgroups, including processes that left
    /// the worker's process group or session.
    pub fn kill(&self) {
        kill_dirs(&self.dirs);
    }

    /// Kills everything in the job's cgroups and says whether every one of
    /// them is then seen empty (false if any cannot be read; one already
    /// removed is empty).
    pub fn emptied(&self) -> bool {
        self.kill();
        self.dirs
            .iter()
            .all(|dir| match fs::read_to_string(dir.join("cgroup.procs")) {
                Ok(pids) => pids.split_whitespace().next().is_none(),
                Err(e) => e.kind() == io::ErrorKind::NotFound && !dir.exists(),
            })
    }

    /// Whether the job's cgroups hold no process now, read without
    /// blocking; false if it cannot be read. With a v2 directory, its
    /// `cgroup.events` saying `populated 0` is enough: every process of the
    /// job is in it as in the v1 ones (the worker joins them all before its
    /// exec, its children are born in them, and none can move itself out),
    /// and it counts a process until its exit, where a v1 `cgroup.procs`
    /// leaves out tasks that are exiting. Without one, every v1
    /// `cgroup.procs` must be empty.
    pub fn seen_empty(&self) -> bool {
        if let Some(dir) = &self.unified {
            return fs::read_to_string(dir.join("cgroup.events"))
                .is_ok_and(|events| events.lines().any(|l| l == "populated 0"));
        }
        self.dirs.iter().all(|dir| {
            fs::read_to_string(dir.join("cgroup.procs"))
                .is_ok_and(|pids| pids.split_whitespace().next().is_none())
        })
    }

    /// Whether the job's cgroups hold no process now, without blocking. A
    /// job whose cgroups keep no memory accounting (read for an
    /// out-of-memory kill after this) has them simply removed, which the
    /// kernel refuses while a process is in one: proof enough, and one
    /// read of `cgroup.events` fewer per job. Otherwise they are read (see
    /// [`JobCgroup::seen_empty`]) and removed later.
    pub fn empty_now(&self) -> bool {
        if self.memory_v2 || self.memory_v1.is_some() {
            self.seen_empty()
        } else {
            self.removed_if_empty()
        }
    }

    /// Removes the job's cgroups if the kernel finds every one empty (it
    /// refuses to remove a cgroup with a process in it): the usual end of
    /// a job, with no kill and no wait. True when all are gone,
    /// which proves no process of the job is left; false leaves the rest
    /// to [`JobCgroup::emptied`] and the drop.
    pub fn removed_if_empty(&self) -> bool {
        if self.removed.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        // Read before the directory goes (kept for the job's report).
        let _ = self.starved();
        let all = self.bases.iter().all(|base| base.remove(&self.name));
        if all {
            self.removed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        all
    }

    /// The job's cgroup directories (for the job guard, which kills them
    /// if the supervisor dies first).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Whether the kernel killed something in the job for lack of memory.
    pub fn oom_killed(&self) -> bool {
        let count = |path: PathBuf, key: &str| {
            fs::read_to_string(path).ok().and_then(|text| {
                text.lines().find_map(|l| {
                    l.strip_prefix(key)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
            })
        };
        if let Some(dir) = self.unified.as_ref().filter(|_| self.memory_v2)
            && count(dir.join("memory.events"), "oom_kill ").is_some_and(|n| n > 0)
        {
            return true;
        }
        if let Some(dir) = &self.memory_v1 {
            if count(dir.join("memory.oom_control"), "oom_kill ").is_some_and(|n| n > 0) {
                return true;
            }
            if count(dir.join("memory.failcnt"), "").is_some_and(|n| n > 0) {
                return true;
            }
        }
        false
    }

    /// Freezes the job's v2 cgroup (`cgroup.freeze`, in every non-root v2
    /// cgroup since Linux 5.2, controllers or not): every process of the
    /// job stops where it is, those that left its process group included.
    /// False when the job has no v2 cgroup, or it has no `cgroup.freeze`
    /// (an older kernel): the caller stops its process group instead. Only
    /// the job's own directory is frozen, never the parent: a worker being
    /// started into a frozen cgroup would stop the spawner with it.
    pub fn freeze(&self) -> io::Result<bool> {
        self.write_freeze("1")
    }

    /// Thaws the job's v2 cgroup; false when it has none to thaw.
    pub fn thaw(&self) -> io::Result<bool> {
        self.write_freeze("0")
    }

    fn write_freeze(&self, value: &str) -> io::Result<bool> {
        let Some(dir) = &self.unified else {
            return Ok(false);
        };
        let file = dir.join("cgroup.freeze");
        match fs::OpenOptions::new().write(true).open(&file) {
            Ok(mut open) => io::Write::write_all(&mut open, value.as_bytes())
                .map(|()| true)
                .map_err(|e| naming(&file, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(naming(&file, e)),
        }
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        if self.removed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.kill();
        for dir in self.dirs.iter().rev() {
            remove_dir_when_empty(dir);
        }
    }
}

/// The processes in the v2 cgroup `dir` whose parent is `parent`.
fn children_in(dir: &Path, parent: u32) -> Vec<u32> {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    procs
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter(|&pid| ProcStat::read(pid as i32).is_some_and(|stat| stat.ppid as u32 == parent))
        .collect()
}

/// Kills everything in the cgroup directories `dirs`: `cgroup.kill` where
/// the kernel has it, then each listed pid (v1).
pub fn kill_dirs(dirs: &[PathBuf]) {
    for dir in dirs {
        let kill = dir.join("cgroup.kill");
        if kill.exists() {
            let _ = write(&kill, "1");
        }
    }
    for dir in dirs {
        kill_procs(dir);
    }
}

/// SIGKILLs the pids listed in a cgroup until it is empty (v1 has no
/// `cgroup.kill`), for at most a second. A process outside this process's
/// PID namespace is listed as 0, which `kill` would take for this
/// process's own group: only pids above 0 are signalled (such a process is
/// left to the v2 `cgroup.kill`).
fn kill_procs(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let pids = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&pid| pid > 0)
            .collect();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes a cgroup directory once its processes are gone (they may take a
/// moment to die), trying for at most two seconds.
fn remove_dir_when_empty(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a job cgroup");
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Kills and removes a cgroup directory and everything under it.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    if dir.join("cgroup.kill").exists() {
        let _ = write(&dir.join("cgroup.kill"), "1");
    }
    kill_procs(dir);
    remove_dir_when_empty(dir);
}

/// The lock of the supervisor's directory `dir`, if no one holds it (its
/// supervisor is gone); `None` also when it cannot be opened.
fn unlocked(dir: &Path) -> Option<Flock<OwnedFd>> {
    let dir = OwnedFd::from(fs::File::open(dir).ok()?);
    Flock::lock(dir, FlockArg::LockExclusiveNonblock).ok()
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for hierarchy in self.hierarchies() {
            remove_tree(&hierarchy.base().path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supervisors_directories_are_told_by_their_names_and_nothing_else_is() {
        let name = fresh_name();
        assert_eq!(named(&name), Named::Supervisor, "{name}");
        assert_ne!(fresh_name(), name);
        let leaf = format!("{name}{LEAF_SUFFIX}");
        assert_eq!(named(&leaf), Named::Leaf(&name));
        for other in [
            // Older versions', named after a pid, and their leaves.
            "jobmgr-1",
            "jobmgr-4242",
            "jobmgr-4242-supervisor",
            "jobmgr-",
            "jobmgr-abcdefghijklmnop-",
            "jobmgr-abcdefghijklmno",
            "jobmgr-abcdefghijklmnopq",
            "jobmgr-ABCDEFGHIJKLMNOP",
            "jobmgr-abcdefghijklmn0p",
            "jobmgr-abcdefghijklmnop-leaf",
            "job-7-0123abcd",
            "system.slice",
        ] {
            assert_eq!(named(other), Named::Other, "{other}");
        }
    }

    /// The lock of a supervisor's directory is what tells others it
    /// lives: free once the supervisor lets go of it, and a claim waits
    /// for a clean-up holding it, then makes the directory again.
    #[test]
    fn a_directory_is_locked_while_its_supervisor_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh_name();
        let base = Base::claim(dir.path(), &name).unwrap();
        assert!(unlocked(&base.path).is_none(), "locked while held");
        drop(base);
        let cleaning = unlocked(&dir.path().join(&name)).expect("free once let go");
        // A claim made while a clean-up holds the lock, which removes the
        // directory: the claim makes it again, and holds that.
        let claiming = {
            let parent = dir.path().to_path_buf();
            let name = name.clone();
            std::thread::spawn(move || Base::claim(&parent, &name))
        };
        // Waiting for the lock: /proc/locks lists it (`->`) on the inode.
        let inode = fs::metadata(dir.path().join(&name)).unwrap().ino();
        let waiting = format!(":{inode} 0 EOF");
        let since = Instant::now();
        while !fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| l.contains("->") && l.ends_with(&waiting))
        {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "the claim never waited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        fs::remove_dir(dir.path().join(&name)).unwrap();
        drop(cleaning);
        let base = claiming.join().unwrap().unwrap();
        assert!(base.path.is_dir());
        assert!(unlocked(&base.path).is_none());
    }
}
