//! What a worker process can and cannot do. Always: its own session and
//! process group, a parent-death signal, no inherited descriptor but stdio
//! and the progress fd, a scrubbed environment (see the job module), a
//! umask, `no_new_privs`, and a private scratch directory. When the
//! supervisor runs as root: a uid of the job's own from `worker-uids` (see
//! the [`uids`](super::uids) module), its keyrings emptied and a session
//! keyring of its own, unless `user` names one user for all (never root
//! unless configured), with that user's supplementary groups. Limits: rlimits
//! and, where available, one cgroup per job. Opt-in: no network, a read-only
//! filesystem but for the scratch directory (Landlock), a private /tmp.
//!
//! Everything that allocates or reads files is done before the fork; the
//! steps between fork and exec ([`ChildSetup::apply`]) are plain system
//! calls, in an order that keeps each one possible: cgroups, namespaces and
//! limits while still root, then the groups, the gid and the uid, then
//! `no_new_privs` and Landlock, and the parent-death signal last (a change
//! of uid clears it).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use nix::libc;
use nix::unistd::{Gid, Group, Uid, User};

use super::cgroup::{CgroupLimits, Cgroups, JobCgroup};
use super::landlock;
use super::leftovers::Leftovers;
use super::uids::{ClaimedUid, UidPool, UidRange};
use super::yielding::{WorkerPriority, YieldSettings};

/// The sandbox's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSettings {
    /// The user workers run as (a name or a uid); `None` for the default
    /// (as root: a uid of each job's own).
    pub user: Option<String>,
    /// Where each job's own uid comes from.
    pub worker_uids: UidRange,
    /// The group, if not the user's own.
    pub group: Option<String>,
    /// The umask workers start with.
    pub umask: u32,
    /// rlimits.
    pub rlimits: Rlimits,
    /// Cgroup limits.
    pub cgroup: CgroupLimits,
    /// Give workers no network (a network namespace of their own).
    pub no_network: bool,
    /// Make the filesystem read-only except the scratch directory.
    pub read_only: bool,
    /// Give workers a /tmp of their own.
    pub private_tmp: bool,
    /// How workers yield the CPU and the disks (see [`super::yielding`]).
    pub priority: WorkerPriority,
}

/// Resource limits (`setrlimit`), each as both soft and hard limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// Address space, bytes.
    pub address_space: Option<u64>,
    /// CPU seconds.
    pub cpu_seconds: Option<u64>,
    /// Open files.
    pub open_files: Option<u64>,
    /// Processes of the worker's user.
    pub processes: Option<u64>,
    /// Largest file written, bytes.
    pub file_size: Option<u64>,
    /// Core dump size, bytes (0: none).
    pub core: Option<u64>,
}

/// Who workers run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user's name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// The `pids.max` of a job's cgroup unless configured.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

/// The `user` value that means "the supervisor's own user, whoever that
/// is" (root, when it runs as root: an explicit choice).
pub const SELF_USER: &str = "self";

/// The `user` value that means "a uid of each job's own, from
/// `worker-uids`" (the default as root).
pub const DYNAMIC_USER: &str = "dynamic";

/// Who workers run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerUser {
    /// The supervisor's own user.
    Own,
    /// One user for every job.
    Shared(Credentials),
    /// A uid of each job's own; the gid is the uid's number unless this
    /// says otherwise.
    Dynamic {
        /// The configured group's gid.
        gid: Option<u32>,
    },
}

/// The prepared sandbox of a supervisor.
#[derive(Debug)]
pub struct Sandbox {
    settings: SandboxSettings,
    user: WorkerUser,
    /// Where jobs' own uids come from, with [`WorkerUser::Dynamic`].
    uids: Option<Arc<UidPool>>,
    cgroups: Result<Arc<Cgroups>, String>,
}

fn lookup_user(spec: &str) -> io::Result<User> {
    let found = match spec.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(spec),
    };
    found.map_err(io::Error::from)?.ok_or_else(|| {
        io::Error::other(format!(
            "there is no user {spec:?}; create it or set user to an existing one"
        ))
    })
}

fn lookup_group(spec: &str) -> io::Result<Gid> {
    let found = match spec.parse::<u32>() {
        Ok(gid) => Group::from_gid(Gid::from_raw(gid)),
        Err(_) => Group::from_name(spec),
    };
    Ok(found
        .map_err(io::Error::from)?
        .ok_or_else(|| io::Error::other(format!("there is no group {spec:?}")))?
        .gid)
}

/// Works out who workers run as. As root: a uid of each job's own, unless
/// `user` names one. Otherwise: the supervisor's own user (switching needs
/// root).
pub fn worker_user(settings: &SandboxSettings) -> io::Result<WorkerUser> {
    let root = nix::unistd::geteuid().is_root();
    let user = match (settings.user.as_deref(), root) {
        (Some(SELF_USER), _) => return Ok(WorkerUser::Own),
        (None | Some(DYNAMIC_USER), true) => {
            let gid = settings.group.as_deref().map(lookup_group).transpose()?;
            return Ok(WorkerUser::Dynamic {
                gid: gid.map(Gid::as_raw),
            });
        }
        (Some(DYNAMIC_USER), false) => {
            return Err(io::Error::other(
                "workers cannot run under uids of their own: that needs the supervisor to run as root",
            ));
        }
        (Some(spec), true) => lookup_user(spec)?,
        (Some(spec), false) => {
            let user = lookup_user(spec)?;
            if user.uid != nix::unistd::geteuid() {
                return Err(io::Error::other(format!(
                    "workers cannot run as {spec:?}: switching users needs the supervisor to run as root"
                )));
            }
            return Ok(WorkerUser::Own);
        }
        (None, false) => return Ok(WorkerUser::Own),
    };
    let gid = match &settings.group {
        Some(spec) => lookup_group(spec)?,
        None => user.gid,
    };
    let name = CString::new(user.name.as_bytes()).map_err(io::Error::other)?;
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&name, gid)
        .map_err(io::Error::from)?
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    Ok(WorkerUser::Shared(Credentials {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: gid.as_raw(),
        groups,
    }))
}

impl Sandbox {
    /// Finds the cgroups for every set of settings in use (the union of
    /// their limits; `pids.max` is always set where cgroups exist, so that a
    /// fork bomb is contained by default). `Err` says why there are none.
    pub fn cgroups(
        all: &[&SandboxSettings],
        yielding: &YieldSettings,
    ) -> Result<Arc<Cgroups>, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not running as root".into());
        }
        let union = CgroupLimits {
            memory_max: all.iter().find_map(|s| s.cgroup.memory_max),
            pids_max: Some(DEFAULT_PIDS_MAX),
            cpu_max: all.iter().find_map(|s| s.cgroup.cpu_max),
        };
        let parent = yielding.parent(super::yielding::total_memory());
        Cgroups::detect(&union, &parent).map(Arc::new)
    }

    /// Resolves the user and checks what the settings need, with the
    /// supervisor's `cgroups`.
    pub fn prepare(
        settings: &SandboxSettings,
        cgroups: &Result<Arc<Cgroups>, String>,
    ) -> io::Result<Self> {
        Self::prepare_with_claims(
            settings,
            cgroups,
            std::path::Path::new(super::uids::LOCK_DIR),
        )
    }

    /// As [`Sandbox::prepare`], with the uid claims kept in `claims`.
    pub fn prepare_with_claims(
        settings: &SandboxSettings,
        cgroups: &Result<Arc<Cgroups>, String>,
        claims: &Path,
    ) -> io::Result<Self> {
        let user = worker_user(settings)?;
        let uids = match &user {
            WorkerUser::Dynamic { gid } => Some(Arc::new(
                UidPool::open(settings.worker_uids, claims, gid.is_none())
                    .map_err(io::Error::other)?
                    .leaving(
                        Leftovers::new(settings.private_tmp, settings.read_only),
                        *gid,
                    ),
            )),
            _ => None,
        };
        let root = nix::unistd::geteuid().is_root();
        if (settings.no_network || settings.private_tmp) && !root {
            return Err(io::Error::other(
                "no-network and private-tmp need the supervisor to run as root (they use namespaces)",
            ));
        }
        if settings.read_only && landlock::abi().is_none() {
            return Err(io::Error::other(
                "read-only-fs needs Landlock, which this kernel does not offer",
            ));
        }
        let mut settings = settings.clone();
        match cgroups {
            Ok(_) => {
                // Where cgroups exist, a fork bomb is contained by default.
                settings.cgroup.pids_max.get_or_insert(DEFAULT_PIDS_MAX);
            }
            Err(why) if settings.cgroup.any() => {
                return Err(io::Error::other(format!(
                    "memory-max, pids-max and cpu-max need cgroups, which are not available here: {why}"
                )));
            }
            Err(_) => {}
        }
        Ok(Sandbox {
            settings,
            user,
            uids,
            cgroups: cgroups.clone(),
        })
    }

    /// Where jobs' own uids come from, when each job has one.
    pub fn uids(&self) -> Option<&Arc<UidPool>> {
        self.uids.as_ref()
    }

    /// Who a job's worker runs as: the uid claimed for it, or the one user
    /// of every job; `None` for the supervisor's own user.
    pub fn credentials(&self, claimed: Option<&ClaimedUid>) -> Option<Credentials> {
        match (&self.user, claimed) {
            (WorkerUser::Dynamic { gid }, Some(claimed)) => Some(Credentials {
                name: format!("uid {}", claimed.uid()),
                uid: claimed.uid(),
                gid: gid.unwrap_or(claimed.uid()),
                groups: Vec::new(),
            }),
            (WorkerUser::Shared(credentials), _) => Some(credentials.clone()),
            _ => None,
        }
    }

    /// What jobs share with each other for lack of uids of their own (for
    /// a warning at start), or `None` when each job has its own.
    pub fn shared(&self) -> Option<String> {
        let supervisor = nix::unistd::geteuid();
        match &self.user {
            WorkerUser::Dynamic { .. } => None,
            WorkerUser::Shared(c) if c.uid == 0 => Some(
                "workers run as root: a job can read and signal anything, other jobs, the supervisor and the API token included".into(),
            ),
            WorkerUser::Shared(c) => Some(format!(
                "workers share uid {} ({}): a job can read another's scratch directory, stdin and environment, and signal it (leave user unset for a uid per job)",
                c.uid, c.name
            )),
            WorkerUser::Own if supervisor.is_root() => Some(
                "workers run as the supervisor's own user, root: a job can read and signal anything, other jobs, the supervisor and the API token included".into(),
            ),
            WorkerUser::Own => Some(format!(
                "workers share uid {supervisor}, the supervisor's own: a job can read another's scratch directory, stdin and environment, signal it and the supervisor, and read the API token the supervisor holds, and so read, change and delete every job (run the supervisor as root for a uid per job)"
            )),
        }
    }

    /// One line for the start-up log: how its jobs yield to the site.
    pub fn describe_yielding(&self) -> String {
        let workers = self.settings.priority.describe();
        let parent = match &self.cgroups {
            Ok(cgroups) if cgroups.yielded().is_empty() => {
                "the jobs' cgroup: nothing asked".to_string()
            }
            Ok(cgroups) => format!("the jobs' cgroup: {}", cgroups.yielded().join("; ")),
            Err(why) => format!(
                "no cgroup of the jobs' own ({why}), so only the workers' own priority is left: a job yields to the supervisor's group, not to the site's"
            ),
        };
        format!("workers: {workers}; {parent}")
    }

    /// One line for the start-up log: what is in force.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        let user = match (&self.user, &self.uids) {
            (WorkerUser::Shared(c), _) => format!(
                "user {} (uid {}, gid {}, groups {:?})",
                c.name, c.uid, c.gid, c.groups
            ),
            (WorkerUser::Dynamic { gid }, Some(pool)) => format!(
                "a uid of each job's own from {} ({} usable; gid {}; no supplementary groups)",
                pool.range(),
                pool.usable(),
                gid.map_or("the uid's number".to_string(), |g| g.to_string()),
            ),
            _ => format!("the supervisor's own user (uid {})", nix::unistd::geteuid()),
        };
        let cgroups = match &self.cgroups {
            Ok(cgroups) => format!("cgroups: {}", cgroups.describe()),
            Err(why) => format!("cgroups: none ({why})"),
        };
        let mut limits = Vec::new();
        let r = &s.rlimits;
        for (name, value) in [
            ("as", r.address_space),
            ("cpu", r.cpu_seconds),
            ("nofile", r.open_files),
            ("nproc", r.processes),
            ("fsize", r.file_size),
            ("core", r.core),
        ] {
            if let Some(value) = value {
                limits.push(format!("{name}={value}"));
            }
        }
        for (name, value) in [
            ("memory.max", s.cgroup.memory_max),
            ("pids.max", s.cgroup.pids_max),
        ] {
            if let Some(value) = value {
                limits.push(format!("{name}={value}"));
            }
        }
        if let Some(cpus) = s.cgroup.cpu_max {
            limits.push(format!("cpu.max={cpus} CPUs"));
        }
        format!(
            "workers run as {user}; umask {:03o}; no_new_privs; {cgroups}; limits: {}; network: {}; filesystem: {}; /tmp: {}",
            s.umask,
            if limits.is_empty() {
                "none".into()
            } else {
                limits.join(" ")
            },
            if s.no_network { "none" } else { "shared" },
            if s.read_only {
                "read-only except the scratch directory"
            } else {
                "as the user's permissions allow"
            },
            if s.private_tmp { "private" } else { "shared" },
        )
    }

    /// Prepares one job (running as `credentials`, from
    /// [`Sandbox::credentials`]): its cgroups, its Landlock ruleset, and
    /// the steps its worker takes between fork and exec.
    pub fn job(
        &self,
        job_id: i64,
        scratch: &Path,
        credentials: Option<Credentials>,
    ) -> io::Result<JobSandbox> {
        let cgroup = match &self.cgroups {
            Ok(cgroups) => Some(
                cgroups
                    .job(job_id, &self.settings.cgroup)
                    .map_err(|e| io::Error::new(e.kind(), CgroupsUnavailable(e)))?,
            ),
            Err(_) => None,
        };
        let landlock = if self.settings.read_only {
            let mut writable: Vec<&Path> = vec![scratch];
            if self.settings.private_tmp {
                writable.push(Path::new("/tmp"));
            }
            Some(landlock::read_only_except(&writable)?)
        } else {
            None
        };
        let cstring =
            |path: &Path| CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other);
        let (unified, tasks) = match &cgroup {
            Some(cgroup) => (
                cgroup
                    .unified_dir()
                    .map(|dir| cstring(dir).map(UnifiedJoin::new))
                    .transpose()?,
                cgroup
                    .v1_tasks()
                    .iter()
                    .map(|p| cstring(p))
                    .collect::<io::Result<Vec<_>>>()?,
            ),
            None => (None, Vec::new()),
        };
        let own_keyrings = matches!(self.user, WorkerUser::Dynamic { .. }) && credentials.is_some();
        let setup = ChildSetup {
            unified,
            tasks,
            rlimits: rlimit_list(&self.settings.rlimits),
            priority: self.settings.priority,
            umask: self.settings.umask,
            credentials,
            own_keyrings,
            no_network: self.settings.no_network,
            private_tmp: self.settings.private_tmp,
            landlock: landlock.as_ref().map(|fd| fd.as_raw_fd()),
            parent: nix::unistd::getpid().as_raw(),
            strings: MountStrings::new(),
        };
        Ok(JobSandbox {
            cgroup: cgroup.map(Arc::new),
            landlock,
            setup: Some(setup),
        })
    }
}

/// The job's cgroups cannot be made now (the supervisor's own directories
/// cannot be made again, say): the machine's fault, not the job's, so the
/// job goes back to the queue rather than count a failed run.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the job's cgroups, so the job goes back to the queue: {0}")]
pub struct CgroupsUnavailable(io::Error);

impl CgroupsUnavailable {
    /// Whether `error` is one.
    pub fn is(error: &io::Error) -> bool {
        error
            .get_ref()
            .is_some_and(|inner| inner.is::<CgroupsUnavailable>())
    }
}

/// A job's sandbox: its cgroups (killed and removed when dropped), and the
/// steps for its worker.
pub struct JobSandbox {
    cgroup: Option<Arc<JobCgroup>>,
    /// Kept open until the worker has applied it.
    #[allow(dead_code)]
    landlock: Option<OwnedFd>,
    setup: Option<ChildSetup>,
}

impl JobSandbox {
    /// The steps for the worker, once.
    pub fn take_setup(&mut self) -> ChildSetup {
        self.setup.take().unwrap_or_else(ChildSetup::plain)
    }

    /// The job's cgroups, to kill its whole tree with.
    pub fn tree(&self) -> Option<Arc<JobCgroup>> {
        self.cgroup.clone()
    }

    /// How long the job waited for a CPU (see [`JobCgroup::starved`]).
    pub fn starved(&self) -> Option<std::time::Duration> {
        self.cgroup.as_deref().and_then(JobCgroup::starved)
    }

    /// Whether the kernel killed part of the job for lack of memory.
    pub fn oom_killed(&self) -> bool {
        self.cgroup.as_deref().is_some_and(JobCgroup::oom_killed)
    }

    /// Kills what is left in the job's cgroups and removes them (blocking).
    /// True when the job had cgroups and they were seen empty: then no
    /// process of the job is left anywhere, since a job's processes cannot
    /// leave its cgroups when the supervisor runs as root and the job as
    /// another user (moving a process needs write access to the root-owned
    /// `cgroup.procs` of another cgroup); the uid pool, the one user of
    /// this proof, exists only then.
    pub fn end(self) -> bool {
        self.cgroup.as_deref().is_some_and(JobCgroup::emptied)
    }

    /// Removes the job's cgroups if they are empty already, without
    /// blocking (see [`JobCgroup::removed_if_empty`]): true means the same
    /// as [`JobSandbox::end`]'s true, and nothing is left to end.
    pub fn ended_empty(&self) -> bool {
        self.cgroup
            .as_deref()
            .is_some_and(JobCgroup::removed_if_empty)
    }
}

fn rlimit_list(limits: &Rlimits) -> Vec<(libc::__rlimit_resource_t, u64)> {
    let mut list = Vec::new();
    for (resource, value) in [
        (libc::RLIMIT_AS, limits.address_space),
        (libc::RLIMIT_CPU, limits.cpu_seconds),
        (libc::RLIMIT_NOFILE, limits.open_files),
        (libc::RLIMIT_NPROC, limits.processes),
        (libc::RLIMIT_FSIZE, limits.file_size),
        (libc::RLIMIT_CORE, limits.core),
        // No raising of its own CPU priority: leaving SCHED_IDLE or lowering
        // its nice level needs a nice limit above the level asked.
        (libc::RLIMIT_NICE, Some(0)),
    ] {
        if let Some(value) = value {
            // Never ask for more than the current hard limit: only root may
            // raise it, and the point is to lower it.
            let mut current = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `current` is a valid out-pointer.
            let hard = if unsafe { libc::getrlimit(resource, &mut current) } == 0 {
                current.rlim_max
            } else {
                u64::MAX
            };
            list.push((resource, value.min(hard)));
        }
    }
    list
}

/// C strings the namespace steps need, made before the fork.
#[derive(Debug)]
pub struct MountStrings {
    root: CString,
    tmp: CString,
    tmpfs: CString,
    options: CString,
}

impl MountStrings {
    /// The strings, made (allocated) now.
    pub(super) fn new() -> Self {
        MountStrings {
            root: c"/".to_owned(),
            tmp: c"/tmp".to_owned(),
            tmpfs: c"tmpfs".to_owned(),
            options: c"mode=1777".to_owned(),
        }
    }
}

/// How a worker enters its job's v2 cgroup.
#[derive(Debug, Clone)]
pub struct UnifiedJoin {
    /// The job's v2 directory.
    pub(super) dir: CString,
    /// Its `cgroup.procs`, which the worker writes itself into unless it
    /// was born in it.
    pub(super) procs: CString,
}

impl UnifiedJoin {
    /// The join of the v2 directory `dir`.
    pub(super) fn new(dir: CString) -> Self {
        let mut procs = dir.clone().into_bytes();
        procs.extend_from_slice(b"/cgroup.procs");
        UnifiedJoin {
            dir,
            procs: CString::new(procs).expect("a C string and a suffix without NUL hold no NUL"),
        }
    }
}

/// The steps a worker takes between fork and exec.
#[derive(Debug)]
pub struct ChildSetup {
    /// The job's v2 cgroup, if any.
    pub(super) unified: Option<UnifiedJoin>,
    /// The job's v1 `tasks` files (see [`JobCgroup::v1_tasks`]).
    pub(super) tasks: Vec<CString>,
    pub(super) rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub(super) priority: WorkerPriority,
    pub(super) umask: u32,
    pub(super) credentials: Option<Credentials>,
    /// The uid is the job's own: see [`own_keyrings`].
    pub(super) own_keyrings: bool,
    pub(super) no_network: bool,
    pub(super) private_tmp: bool,
    pub(super) landlock: Option<i32>,
    pub(super) parent: i32,
    pub(super) strings: MountStrings,
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl ChildSetup {
    /// No sandbox: only the umask, and the parent-death signal.
    pub fn plain() -> Self {
        ChildSetup {
            unified: None,
            tasks: Vec::new(),
            rlimits: Vec::new(),
            priority: WorkerPriority::default(),
            umask: 0o077,
            credentials: None,
            own_keyrings: false,
            no_network: false,
            private_tmp: false,
            landlock: None,
            parent: nix::unistd::getpid().as_raw(),
            strings: MountStrings::new(),
        }
    }

    /// Applies the steps. Runs in the forked child: only system calls, no
    /// allocation, no locks. `born_in_v2`: the child was cloned into the
    /// job's v2 cgroup (`CLONE_INTO_CGROUP`), and so need not join it.
    ///
    /// # Safety
    /// Call only between fork and exec.
    pub unsafe fn apply(&self, born_in_v2: bool) -> io::Result<()> {
        // SAFETY (for the whole body): plain system calls on values prepared
        // before the fork.
        unsafe {
            let joins = self
                .unified
                .iter()
                .filter(|_| !born_in_v2)
                .map(|u| &u.procs)
                .chain(&self.tasks);
            for path in joins {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                check(fd)?;
                let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if wrote != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if self.no_network {
                check(libc::unshare(libc::CLONE_NEWNET))?;
            }
            if self.private_tmp {
                let s = &self.strings;
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    std::ptr::null(),
                    s.root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    s.tmpfs.as_ptr(),
                    s.tmp.as_ptr(),
                    s.tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    s.options.as_ptr().cast(),
                ))?;
            }
            // Before the rlimits, which take RLIMIT_NICE to 0 so that the
            // worker cannot undo it.
            self.priority.apply()?;
            for &(resource, value) in &self.rlimits {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(resource, &limit))?;
            }
            libc::umask(self.umask as libc::mode_t);
            if let Some(c) = &self.credentials {
                check(libc::setgroups(c.groups.len(), c.groups.as_ptr()))?;
                check(libc::setresgid(c.gid, c.gid, c.gid))?;
                check(libc::setresuid(c.uid, c.uid, c.uid))?;
            }
            if self.own_keyrings {
                own_keyrings();
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if let Some(ruleset) = self.landlock {
                landlock::restrict_self(ruleset)?;
            }
            // Every descriptor above the progress fd closes at exec (std's
            // own error pipe already does, and must stay open until then).
            let marked = libc::syscall(
                libc::SYS_close_range,
                4u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if marked < 0 {
                for fd in 4..4096 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            // Last: a change of uid clears the parent-death signal.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
            if libc::getppid() != self.parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(())
    }

    /// Whether the worker changes user (its scratch directory must then be
    /// given to that user).
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.credentials.as_ref().map(|c| (c.uid, c.gid))
    }
}

/// Replaces the keyrings the kernel keeps for this process's uid past its
/// last process (its user and user-session keyrings, and its persistent
/// keyring), where a job before under the same uid may have left keys:
/// each is invalidated, so that the kernel makes a new one at its next use.
/// Emptying one would not do: it keeps the permissions a job before set on
/// it and the links another uid's job made to it, through which that job
/// would read the next one's keys. Where invalidating is refused (a job
/// before took the search permission away), the keyring is emptied. It also
/// gives the process an anonymous session keyring of its own in place of
/// the one it inherited (the supervisor's, which every worker would
/// otherwise share). Best effort: where keys are not offered (a kernel
/// without them, a seccomp filter refusing `keyctl`), no job can leave any
/// either. Only system calls: for between fork and exec, after the change
/// of uid.
///
/// # Safety
/// Call only between fork and exec.
unsafe fn own_keyrings() {
    const KEY_SPEC_THREAD_KEYRING: libc::c_long = -1;
    const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
    const KEY_SPEC_USER_SESSION_KEYRING: libc::c_long = -5;
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    const KEYCTL_CLEAR: libc::c_long = 7;
    const KEYCTL_INVALIDATE: libc::c_long = 21;
    const KEYCTL_GET_PERSISTENT: libc::c_long = 22;
    const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
    // SAFETY: keyctl calls with integer arguments (and a null name).
    let renew = |keyring: libc::c_long| unsafe {
        let invalidated = libc::syscall(libc::SYS_keyctl, KEYCTL_INVALIDATE, keyring) == 0;
        if !invalidated {
            libc::syscall(libc::SYS_keyctl, KEYCTL_CLEAR, keyring);
        }
        invalidated
    };
    // Until the kernel's collector has taken an invalidated user keyring
    // away (a few milliseconds at most), a lookup may fail (ENOKEY): the
    // new one is made before the exec, so that the job finds it.
    // SAFETY: keyctl and nanosleep with integer arguments and a local.
    let make_anew = |keyring: libc::c_long| unsafe {
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        for _ in 0..200 {
            if libc::syscall(libc::SYS_keyctl, KEYCTL_GET_KEYRING_ID, keyring, 1) > 0
                || *libc::__errno_location() != libc::ENOKEY
            {
                break;
            }
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
    };
    // SAFETY: keyctl calls with integer arguments (and a null name).
    unsafe {
        let renewed = [KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING].map(renew);
        for (keyring, renewed) in [KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING]
            .into_iter()
            .zip(renewed)
        {
            if renewed {
                make_anew(keyring);
            }
        }
        // Linked into a thread keyring, which the exec discards.
        let persistent = libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_GET_PERSISTENT,
            -1 as libc::c_long,
            KEY_SPEC_THREAD_KEYRING,
        );
        if persistent > 0 {
            renew(persistent);
        }
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        );
    }
}

/// Gives a scratch directory to the worker's user.
pub fn hand_over(dir: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Parses an octal umask such as "027".
pub fn parse_umask(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim(), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("umask {text:?} is not an octal mask like \"027\""))
}
