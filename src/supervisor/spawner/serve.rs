//! The spawner process itself: a single-threaded loop, forked from the
//! supervisor before any thread exists, that starts workers on request,
//! reaps them (and, as a subreaper, whatever they orphan), reports their
//! exits, and, when the supervisor dies, kills every job it holds and every
//! process descended from it before it exits.
//!
//! Starting a worker from this small process copies no page tables and
//! wakes no other thread, which is what makes a spawn here cheap
//! ([`super::clone`]); the steps between clone and exec are the sandbox's
//! own ([`ChildSetup::apply`]).

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::libc;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use super::clone::{clone_vfork, clone_vfork_into, clone3_refused, last_errno};
use super::protocol::{MAX_RECORD, Reply, Request, SpawnRequest};
use crate::supervisor::proc_stat::ProcStat;
use crate::supervisor::sandbox::{ChildSetup, Credentials, MountStrings, UnifiedJoin};

/// The signals a terminal or a service manager sends the supervisor's whole
/// process group: the spawner outlives them, so that the supervisor's
/// drain can let its jobs finish. Workers get them back at their default.
const IGNORED: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// How long the spawner tries, once the supervisor is gone, to see every
/// process it holds dead.
const DYING_WAIT: Duration = Duration::from_secs(10);

/// A job as the spawner holds it: what to kill should the supervisor die.
struct Held {
    /// The worker's pid (its process group), 0 until started.
    pgid: i32,
    cgroups: Vec<PathBuf>,
}

struct Spawner {
    sock: OwnedFd,
    signals: OwnedFd,
    death_signal: libc::c_int,
    me: i32,
    jobs: HashMap<u64, Held>,
    /// Live workers: pid → request id.
    workers: HashMap<i32, u64>,
    /// Live uid-killing helpers: pid → request id.
    killers: HashMap<i32, u64>,
    /// The workers' children's stack, until their exec.
    stack: Vec<u8>,
    /// Whether workers are cloned into their v2 cgroup (until the kernel
    /// says it cannot).
    clone_into: bool,
}

/// The spawner's life. `supervisor` is the pid of the process it serves,
/// `sock` its end of the socket pair. Never returns.
pub(super) fn serve(sock: OwnedFd, supervisor: i32) -> ! {
    // SAFETY (for the set-up): signal dispositions, masks and prctls of this
    // single-threaded process.
    let (signals, death_signal) = unsafe {
        for sig in IGNORED {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::prctl(libc::PR_SET_NAME, c"jobmgr-spawner".as_ptr(), 0, 0, 0);
        // Orphans of workers come here, to be reaped and, at the end, killed.
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        let death_signal = libc::SIGRTMIN();
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        libc::sigaddset(&mut mask, death_signal);
        libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &mask, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        libc::prctl(libc::PR_SET_PDEATHSIG, death_signal, 0, 0, 0);
        (fd, death_signal)
    };
    let mut spawner = Spawner {
        sock,
        // SAFETY: a descriptor just made and owned by nothing else (or -1,
        // checked below).
        signals: unsafe { OwnedFd::from_raw_fd(signals.max(0)) },
        death_signal,
        me: std::process::id() as i32,
        jobs: HashMap::new(),
        workers: HashMap::new(),
        killers: HashMap::new(),
        stack: vec![0; CHILD_STACK],
        clone_into: true,
    };
    if signals < 0 || nix::unistd::getppid().as_raw() != supervisor {
        // No way to learn of children or of the supervisor's death, or the
        // supervisor is gone already.
        spawner.die();
    }
    // Its stdin and stdout are the supervisor's: let go of them, so that
    // whoever reads the supervisor's stdout sees it end with it.
    if let Ok(null) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in [0, 1] {
            // SAFETY: dup2 onto the standard descriptors of this process.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    spawner.run()
}

impl Spawner {
    fn run(&mut self) -> ! {
        let mut record = vec![0u8; MAX_RECORD];
        loop {
            let mut polled = [
                libc::pollfd {
                    fd: self.sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.signals.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            let ready = unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                self.die();
            }
            if polled[1].revents != 0 && self.signalled() {
                self.die();
            }
            if polled[0].revents != 0 {
                match self.receive(&mut record) {
                    Some((request, fds)) => self.handle(request, fds),
                    None => self.die(),
                }
            }
        }
    }

    /// Reads the signals; reaps what ended. True when the supervisor died.
    fn signalled(&mut self) -> bool {
        let mut died = false;
        loop {
            // SAFETY: a zeroed siginfo is a valid buffer for signalfd.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reads into `info`, of its own size.
            let read = unsafe {
                libc::read(
                    self.signals.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if read != size as isize {
                break;
            }
            if info.ssi_signo as libc::c_int == self.death_signal {
                died = true;
            }
        }
        self.reap();
        died
    }

    /// Reaps every child that ended, reporting workers and helpers.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waits on any child without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if let Some(id) = self.workers.remove(&pid) {
                // Its pid may be another's soon: what is left of its group
                // is found below this subreaper, or in its cgroups.
                if let Some(held) = self.jobs.get_mut(&id) {
                    held.pgid = 0;
                }
                self.reply(Reply::Exited { id, status });
            } else if let Some(id) = self.killers.remove(&pid) {
                self.reply(Reply::UidKilled { id, status });
            }
        }
    }

    /// One request and its descriptors; `None` when the supervisor is gone
    /// (end of the socket) or the socket failed.
    fn receive(&mut self, record: &mut [u8]) -> Option<(std::io::Result<Request>, Vec<OwnedFd>)> {
        // Room for as many descriptors as one message may carry (the
        // kernel's SCM_MAX_FD), so that a sender can never leave some
        // installed here but cut from what this reads (a leak).
        let mut space = nix::cmsg_space!([RawFd; 253]);
        let mut iov = [IoSliceMut::new(record)];
        let (bytes, fds, cut) = loop {
            match recvmsg::<()>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    let mut fds = Vec::new();
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for cmsg in cmsgs {
                            if let ControlMessageOwned::ScmRights(received) = cmsg {
                                // SAFETY: the kernel just gave us these.
                                fds.extend(
                                    received
                                        .into_iter()
                                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                                );
                            }
                        }
                    }
                    let cut = msg
                        .flags
                        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
                    break (msg.bytes, fds, cut);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
        };
        if bytes == 0 {
            return None;
        }
        let request = if cut {
            Err(std::io::Error::other("a spawner request was cut short"))
        } else {
            Request::decode(&iov[0][..bytes])
        };
        Some((request, fds))
    }

    fn handle(&mut self, request: std::io::Result<Request>, fds: Vec<OwnedFd>) {
        match request {
            Ok(Request::Spawn(spawn)) => {
                let id = spawn.id;
                self.jobs.insert(
                    id,
                    Held {
                        pgid: 0,
                        cgroups: spawn
                            .cgroups
                            .iter()
                            .map(|c| PathBuf::from(std::ffi::OsStr::from_bytes(c)))
                            .collect(),
                    },
                );
                match spawn_worker(&spawn, &fds, self.me, &mut self.stack, &mut self.clone_into) {
                    Ok(pid) => {
                        if let Some(held) = self.jobs.get_mut(&id) {
                            held.pgid = pid;
                        }
                        self.workers.insert(pid, id);
                        self.reply(Reply::Started { id, pid });
                    }
                    Err(errno) => {
                        self.jobs.remove(&id);
                        self.reply(Reply::NotStarted { id, errno });
                    }
                }
            }
            Ok(Request::Ended { id }) => {
                self.jobs.remove(&id);
            }
            Ok(Request::KillUid { id, uid }) => match kill_uid(uid) {
                Ok(pid) => {
                    self.killers.insert(pid, id);
                }
                Err(errno) => self.reply(Reply::UidKilled { id, status: -errno }),
            },
            // A request this spawner cannot read: nothing to answer it by.
            Err(error) => eprintln!("jobmgr-spawner: {error}"),
        }
    }

    fn reply(&mut self, reply: Reply) {
        let record = reply.encode();
        loop {
            match sendmsg::<()>(
                self.sock.as_raw_fd(),
                &[IoSlice::new(&record)],
                &[],
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return,
                Err(nix::errno::Errno::EINTR) => continue,
                // The supervisor is gone.
                Err(_) => self.die(),
            }
        }
    }

    /// The supervisor is gone: kill every job's process group and cgroups,
    /// then every process still descended from this one (what left its
    /// group or session, with or without cgroups, is an orphan of a worker
    /// and so a child of this subreaper, or below one), and exit.
    fn die(&mut self) -> ! {
        for held in self.jobs.values() {
            if held.pgid > 1 {
                // SAFETY: a signal to a process group this spawner made.
                unsafe { libc::kill(-held.pgid, libc::SIGKILL) };
            }
        }
        // Every job's cgroups at once: one stuck process (in D state) must
        // not hold back the kill of the other jobs.
        let dirs: Vec<PathBuf> = self
            .jobs
            .values()
            .flat_map(|held| held.cgroups.iter().cloned())
            .collect();
        crate::supervisor::cgroup::kill_dirs(&dirs);
        kill_descendants(self.me, DYING_WAIT);
        std::process::exit(0)
    }
}

/// SIGKILLs every descendant of `me` and reaps them, until none is left or
/// `wait` has passed.
pub(super) fn kill_descendants(me: i32, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        loop {
            let mut status = 0;
            // SAFETY: reaps any ended child without blocking.
            if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
                break;
            }
        }
        let below = descendants(me);
        if below.is_empty() {
            return;
        }
        for pid in below {
            // SAFETY: a signal to a process below this one.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every live (not zombie) process below `me`, from `/proc`.
fn descendants(me: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<(i32, bool)>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some(stat) = ProcStat::read(pid) {
            children
                .entry(stat.ppid)
                .or_default()
                .push((pid, stat.ended()));
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![me];
    while let Some(parent) = queue.pop() {
        for &(pid, zombie) in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            if !zombie {
                found.push(pid);
            }
            queue.push(pid);
        }
    }
    found
}

fn c_string(bytes: &[u8]) -> Result<CString, i32> {
    CString::new(bytes).map_err(|_| libc::EINVAL)
}

/// The stack a worker's child runs on until its exec (see
/// [`spawn_worker`]): one at a time, since this process waits for each
/// exec, so one stack serves them all.
const CHILD_STACK: usize = 256 * 1024;

/// What the child of [`spawn_worker`] is given.
#[derive(Clone, Copy)]
struct ChildArgs<'a> {
    sources: &'a [RawFd; 4],
    cwd: &'a CString,
    setup: &'a ChildSetup,
    /// Whether the child is cloned into the job's v2 cgroup.
    born_in_v2: bool,
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    env: &'a [*const libc::c_char],
    /// Where the child leaves the errno of the step that failed (it shares
    /// this process's memory until its exec); 0 while none did.
    failed: &'a AtomicI32,
}

/// The child's entry point: the worker's steps, then its exec.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` that `spawn_worker` passed, alive
    // until the child execs or exits (the parent waits for that).
    unsafe { exec_worker(&*(arg as *const ChildArgs<'_>)) }
}

/// Starts one worker: everything allocated first, then a child that shares
/// this process's memory until its exec ([`super::clone`]: no page tables
/// are copied, and this process sleeps until the exec), born in the job's
/// v2 cgroup where the kernel can (`clone_into`, cleared for good once it
/// says it cannot); the child takes its descriptors, its own session, its
/// working directory and the sandbox's steps, then execs. Returns its pid,
/// or the errno of the step that failed (left by the child in memory they
/// share: no pipe to make, read and close per worker).
fn spawn_worker(
    spawn: &SpawnRequest,
    fds: &[OwnedFd],
    me: i32,
    stack: &mut [u8],
    clone_into: &mut bool,
) -> Result<i32, i32> {
    if fds.len() != 4 + usize::from(spawn.landlock) {
        return Err(libc::EBADF);
    }
    let program = c_string(&spawn.program)?;
    let mut argv = vec![program.clone()];
    for arg in &spawn.args {
        argv.push(c_string(arg)?);
    }
    let env = spawn
        .env
        .iter()
        .map(|e| c_string(e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    let cwd = c_string(&spawn.cwd)?;
    let unified = match &spawn.unified {
        Some(dir) => Some(UnifiedJoin::new(c_string(dir)?)),
        None => None,
    };
    // The v2 directory, open for the clone to be born in.
    let cgroup = match &unified {
        Some(join) if *clone_into => {
            // SAFETY: opens a path given as a C string.
            let fd = unsafe {
                libc::open(
                    join.dir.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(last_errno());
            }
            // SAFETY: a descriptor just opened and owned by nothing else.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        }
        _ => None,
    };
    let setup = ChildSetup {
        unified,
        tasks: spawn
            .tasks
            .iter()
            .map(|p| c_string(p))
            .collect::<Result<_, _>>()?,
        rlimits: spawn.rlimits.clone(),
        priority: spawn.priority,
        umask: spawn.umask,
        credentials: spawn.credentials.as_ref().map(|c| Credentials {
            name: String::new(),
            uid: c.uid,
            gid: c.gid,
            groups: c.groups.clone(),
        }),
        own_keyrings: spawn.own_keyrings,
        no_network: spawn.no_network,
        private_tmp: spawn.private_tmp,
        landlock: spawn.landlock.then(|| fds[4].as_raw_fd()),
        parent: me,
        strings: MountStrings::new(),
    };
    let sources = [
        fds[0].as_raw_fd(),
        fds[1].as_raw_fd(),
        fds[2].as_raw_fd(),
        fds[3].as_raw_fd(),
    ];
    let failed = AtomicI32::new(0);
    let mut args = ChildArgs {
        sources: &sources,
        cwd: &cwd,
        setup: &setup,
        born_in_v2: cgroup.is_some(),
        program: &program,
        argv: &argv_ptrs,
        env: &env_ptrs,
        failed: &failed,
    };
    let start = |args: &ChildArgs<'_>, stack: &mut [u8]| {
        let arg = (args as *const ChildArgs<'_>).cast_mut().cast();
        // SAFETY: this process has one thread and sleeps until the child
        // execs or exits; the child runs on its own stack and only makes
        // system calls on what was prepared above, allocating nothing.
        unsafe {
            match &cgroup {
                Some(cgroup) if args.born_in_v2 => {
                    clone_vfork_into(child_main, arg, stack, cgroup.as_raw_fd())
                }
                _ => clone_vfork(child_main, arg, stack),
            }
        }
    };
    let mut cloned = start(&args, stack);
    // Whatever `clone3` refused, `clone` and a write to `cgroup.procs` try
    // again: nothing was started, and the write fails for any reason of
    // the cgroup's own (one removed, say), so no worker runs outside it.
    if let (true, Err(errno)) = (args.born_in_v2, cloned) {
        if clone3_refused(errno) {
            *clone_into = false;
            eprintln!(
                "jobmgr-spawner: clone3 into a cgroup is refused here ({}): workers join their cgroup through cgroup.procs from now on, which can wait 10-30 ms for the kernel",
                std::io::Error::from_raw_os_error(errno)
            );
        }
        args.born_in_v2 = false;
        cloned = start(&args, stack);
    }
    // Back once the child execed or exited (CLONE_VFORK): what it left is
    // there to read.
    let pid = cloned?;
    match failed.load(Ordering::SeqCst) {
        0 => Ok(pid),
        errno => {
            let mut status = 0;
            // SAFETY: reaps the child that failed before its exec.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            Err(errno)
        }
    }
}

/// The child's side of [`spawn_worker`].
///
/// # Safety
/// Call only in the child of a `CLONE_VM | CLONE_VFORK` clone (`failed`
/// must be the parent's own memory); it never returns.
unsafe fn exec_worker(args: &ChildArgs<'_>) -> ! {
    let ChildArgs {
        sources,
        cwd,
        setup,
        born_in_v2,
        program,
        argv,
        env,
        failed,
    } = *args;
    // SAFETY: plain system calls on values prepared before the clone.
    unsafe {
        let fail = |errno: i32| -> ! {
            failed.store(if errno == 0 { libc::EIO } else { errno }, Ordering::SeqCst);
            libc::_exit(127)
        };
        // A session of its own first, while signals are still blocked: a
        // stop signal to the supervisor's terminal group (Ctrl-Z) must not
        // stop it before its exec, with the spawner waiting for that exec.
        if libc::setsid() < 0 {
            fail(last_errno());
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for sig in IGNORED {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // The sources are all above 2 (0, 1 and 2 are this process's own),
        // so only fd 3 can be both a source and a target, and it is the
        // last target.
        for (target, &source) in sources.iter().enumerate() {
            let target = target as RawFd;
            let done = if source == target {
                libc::fcntl(target, libc::F_SETFD, 0)
            } else {
                libc::dup2(source, target)
            };
            if done < 0 {
                fail(last_errno());
            }
        }
        if libc::chdir(cwd.as_ptr()) < 0 {
            fail(last_errno());
        }
        if let Err(error) = setup.apply(born_in_v2) {
            fail(error.raw_os_error().unwrap_or(libc::EPERM));
        }
        libc::execve(program.as_ptr(), argv.as_ptr(), env.as_ptr());
        fail(last_errno())
    }
}

/// Forks the helper that kills every process of `uid`; returns its pid.
fn kill_uid(uid: u32) -> Result<i32, i32> {
    if uid == 0 {
        return Err(libc::EPERM);
    }
    // SAFETY: the child makes only system calls and ends itself.
    match unsafe { libc::fork() } {
        -1 => Err(last_errno()),
        0 => unsafe { crate::supervisor::uids::kill_every_process_as(uid) },
        pid => Ok(pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::cgroup::{CgroupLimits, Cgroups, JobCgroup};
    use std::io::Read;
    use std::path::Path;

    /// Starts `cat /proc/self/cgroup` in `job`'s cgroups by [`spawn_worker`]
    /// and returns what it printed and whether cloning into the v2 cgroup
    /// was still on afterwards.
    fn cgroups_of_a_worker(job: &JobCgroup, clone_into: bool) -> (String, bool) {
        let bytes = |p: &Path| p.as_os_str().as_bytes().to_vec();
        let request = SpawnRequest {
            program: b"/bin/cat".to_vec(),
            args: vec![b"/proc/self/cgroup".to_vec()],
            cwd: b"/".to_vec(),
            cgroups: job.dirs().iter().map(|d| bytes(d)).collect(),
            unified: job.unified_dir().map(bytes),
            tasks: job.v1_tasks().iter().map(|t| bytes(t)).collect(),
            umask: 0o077,
            ..SpawnRequest::default()
        };
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let fds = [null(), write, null(), null()];
        let mut stack = vec![0; CHILD_STACK];
        let mut clone_into = clone_into;
        let me = std::process::id() as i32;
        let pid = spawn_worker(&request, &fds, me, &mut stack, &mut clone_into)
            .unwrap_or_else(|errno| panic!("the worker did not start: errno {errno}"));
        drop(fds);
        let mut printed = String::new();
        std::fs::File::from(read)
            .read_to_string(&mut printed)
            .unwrap();
        let mut status = 0;
        // SAFETY: reaps the worker this test started.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "cat /proc/self/cgroup failed: {printed}");
        (printed, clone_into)
    }

    /// The line of `/proc/self/cgroup` output for the hierarchy that `dir`
    /// belongs to, and the path `dir` has in it.
    fn line_and_path(printed: &str, dir: &Path) -> (String, String) {
        let below = |mount: &str| dir.strip_prefix(mount).ok().map(Path::to_path_buf);
        let (controller, path) = match below("/sys/fs/cgroup/unified") {
            Some(path) => (String::new(), path),
            None => {
                let rest = below("/sys/fs/cgroup").unwrap();
                let mut parts = rest.components();
                let controller = parts.next().unwrap().as_os_str().to_string_lossy();
                // On a v2-only machine the v2 tree is /sys/fs/cgroup itself.
                if dir.join("cgroup.controllers").exists() {
                    (String::new(), rest.clone())
                } else {
                    (controller.into_owned(), parts.as_path().to_path_buf())
                }
            }
        };
        let line = printed
            .lines()
            .find(|line| {
                line.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == controller))
            })
            .unwrap_or_else(|| panic!("no line for {controller:?} in {printed}"))
            .to_string();
        (line, format!("/{}", path.display()))
    }

    #[test]
    fn a_worker_is_in_its_jobs_cgroups_from_its_exec_cloned_into_them_or_not() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "SKIPPED a_worker_is_in_its_jobs_cgroups_from_its_exec_cloned_into_them_or_not: not root, so no cgroups of its own"
            );
            return;
        }
        // A v1 `pids` hierarchy where there is one (hybrid machines), to
        // see the worker join it through `tasks`; none asked of v2, which
        // would move this test's process (and fail where others share
        // its cgroup).
        let limits = CgroupLimits {
            pids_max: Path::new("/sys/fs/cgroup/pids/tasks")
                .exists()
                .then_some(64),
            ..CgroupLimits::default()
        };
        let cgroups = match Cgroups::detect(&limits, &Default::default()) {
            Ok(cgroups) => cgroups,
            Err(why) => {
                eprintln!(
                    "SKIPPED a_worker_is_in_its_jobs_cgroups_from_its_exec_cloned_into_them_or_not: no cgroups here: {why}"
                );
                return;
            }
        };
        for (n, clone_into) in [true, false].into_iter().enumerate() {
            let job = cgroups.job(n as i64, &limits).unwrap();
            let (printed, still) = cgroups_of_a_worker(&job, clone_into);
            for dir in job.dirs() {
                let (line, path) = line_and_path(&printed, dir);
                assert!(
                    line.ends_with(&format!(":{path}")),
                    "clone_into {clone_into}: {line} is not in {path}"
                );
            }
            if clone_into && job.unified_dir().is_some() && cfg!(target_arch = "x86_64") {
                assert!(
                    still,
                    "this kernel (5.7 or later) refused CLONE_INTO_CGROUP"
                );
            }
            assert!(job.emptied());
        }
    }
}
