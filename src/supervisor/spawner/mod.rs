//! The spawner: a small single-threaded process, forked from the supervisor
//! before the async runtime (or any thread) exists, that starts every
//! worker and holds every job's processes.
//!
//! Why a process of its own:
//! - **Cost.** `fork()` of the supervisor, a multi-threaded runtime, copies
//!   its page tables, takes copy-on-write faults in the parent afterwards
//!   and sends TLB shootdowns to the runtime's other threads. The spawner
//!   is a few MiB with one thread: forking it is most of the way to
//!   `posix_spawn`.
//! - **Nothing of a job outlives its supervisor.** The spawner is the
//!   workers' parent and a child subreaper, so every process a job starts,
//!   in its process group or out of it (`setsid`, double forks), stays
//!   below it. When the supervisor dies, however it dies, the spawner learns
//!   it twice (its parent-death signal and the end of the socket), kills
//!   every job's process group and cgroups, then every process still below
//!   it, and exits: with or without cgroups.
//!
//! The supervisor sends spawn requests over a `SOCK_SEQPACKET` socket pair
//! ([`protocol`]), with the worker's stdin, stdout, stderr and progress
//! pipes (and its Landlock ruleset) as `SCM_RIGHTS`; the spawner answers
//! with the worker's pid, then its wait status when it ends. A task of the
//! supervisor's runtime reads the answers and hands them to the waiting
//! jobs. A job's end, which lets the spawner forget it, goes just after
//! the next request (see `Spawner::forget`).
//! Signals (timeouts, kills) still go straight from the supervisor to the
//! worker's process group and cgroup.

mod clone;
pub mod protocol;
mod serve;

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::libc;
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, sendmsg, setsockopt, socketpair,
    sockopt,
};
use nix::unistd::{ForkResult, fork};
use tokio::sync::oneshot;

use protocol::{MAX_RECORD, Reply, Request, SpawnRequest};

/// The supervisor's spawner, once forked.
static SPAWNER: OnceLock<Spawner> = OnceLock::new();

/// Forks the spawner. Call it while this process has one thread (before
/// the async runtime starts): the supervisor's process alone.
pub fn start() -> io::Result<()> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    // Room for the largest record (root may go past the system's default).
    for end in [&ours, &theirs] {
        if setsockopt(end, sockopt::SndBufForce, &(2 * MAX_RECORD)).is_err() {
            let _ = setsockopt(end, sockopt::SndBuf, &(2 * MAX_RECORD));
        }
    }
    let supervisor = nix::unistd::getpid().as_raw();
    // SAFETY: called while this process has one thread, so the child may
    // do anything; it never returns into the caller.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            drop(ours);
            serve::serve(theirs, supervisor)
        }
        ForkResult::Parent { child } => {
            drop(theirs);
            let spawner = Spawner {
                sock: ours,
                pid: child.as_raw(),
                next: AtomicU64::new(1),
                pending: Mutex::new(HashMap::new()),
                ended: Mutex::new(Vec::new()),
                gone: AtomicBool::new(false),
                reader: std::sync::Once::new(),
            };
            if SPAWNER.set(spawner).is_err() {
                return Err(io::Error::other("the spawner was started twice"));
            }
            Ok(())
        }
    }
}

/// The spawner, if it was started and still runs. Called within the
/// async runtime, it starts the reading of the spawner's replies there
/// (once).
pub fn get() -> Option<&'static Spawner> {
    let spawner = SPAWNER.get()?;
    spawner.read_replies_once();
    (!spawner.gone.load(Ordering::SeqCst)).then_some(spawner)
}

/// At most this many ended jobs wait to be told to the spawner: past it,
/// they are told at once (a supervisor whose jobs end with none starting).
const ENDED_HELD: usize = 64;

/// Someone waiting on the spawner.
enum Pending {
    Worker {
        started: Option<oneshot::Sender<Result<i32, i32>>>,
        exited: Option<oneshot::Sender<i32>>,
    },
    Uid(oneshot::Sender<i32>),
}

/// The supervisor's side of the spawner.
pub struct Spawner {
    sock: OwnedFd,
    pid: i32,
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Jobs whose processes are gone, for the spawner to forget: told
    /// with the next request rather than each by itself, so that the
    /// spawner wakes once a job fewer (see `Spawner::forget`).
    ended: Mutex<Vec<u64>>,
    gone: AtomicBool,
    /// Starts the reply reader, a task of the async runtime: a reply wakes
    /// its job's task on the runtime's own threads, with no hand-off from
    /// a thread of its own.
    reader: std::sync::Once,
}

/// Fails every waiter on the spawner when the reply reader ends, however
/// it ends.
struct Reading(&'static Spawner);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::SeqCst);
        self.0.lock().clear();
    }
}

/// The supervisor's end of the socket pair, for the runtime's reactor
/// (which never closes it).
struct ReplySocket(&'static OwnedFd);

impl AsRawFd for ReplySocket {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").field("pid", &self.pid).finish()
    }
}

fn gone() -> io::Error {
    io::Error::other(
        "the spawner process is gone (see the log for why); restart the supervisor to get it back",
    )
}

impl Spawner {
    /// The spawner's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Starts a worker as `request` says, with `fds`: stdin, stdout,
    /// stderr and the progress fd, then the Landlock ruleset if the
    /// request has one. Its id is set here.
    pub async fn spawn(
        &'static self,
        mut request: SpawnRequest,
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<SpawnedWorker> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let (started, started_rx) = oneshot::channel();
        let (exited, exited_rx) = oneshot::channel();
        self.lock().insert(
            id,
            Pending::Worker {
                started: Some(started),
                exited: Some(exited),
            },
        );
        if let Err(error) = self.send(&Request::Spawn(Box::new(request)), fds) {
            self.lock().remove(&id);
            return Err(error);
        }
        self.tell_ended();
        match started_rx.await {
            Ok(Ok(pid)) => Ok(SpawnedWorker {
                spawner: self,
                id,
                pid,
                exited: exited_rx,
                status: None,
            }),
            Ok(Err(errno)) => Err(io::Error::from_raw_os_error(errno)),
            Err(_) => Err(gone()),
        }
    }

    /// Kills every process of `uid` (never root's), as
    /// [`Launcher::kill_uid`](super::launcher::Launcher::kill_uid) does, from
    /// the spawner. Blocking.
    pub fn kill_uid(&'static self, uid: u32) -> io::Result<()> {
        self.read_replies_once();
        if uid == 0 {
            return Err(io::Error::other("refusing to kill every process of root"));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (done, done_rx) = oneshot::channel();
        self.lock().insert(id, Pending::Uid(done));
        if let Err(error) = self.send(&Request::KillUid { id, uid }, &[]) {
            self.lock().remove(&id);
            return Err(error);
        }
        self.tell_ended();
        let status = done_rx.blocking_recv().map_err(|_| gone())?;
        if status < 0 {
            return Err(io::Error::from_raw_os_error(-status));
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(io::Error::other(format!(
                "the helper that kills the processes of uid {uid} could not become that uid (wait status {status})"
            )));
        }
        Ok(())
    }

    /// The job `id`'s processes are gone, or killed: the spawner may forget
    /// it. It is told just after the next request, which the spawner is
    /// still busy with when it arrives, so that one wake of the spawner
    /// reads both. Told by itself, a job's end woke the spawner a fourth
    /// time a job (its request, its clone's wait for the exec and its
    /// worker's exit are the other three); told just before the request,
    /// it often woke the spawner before the request came. Until it is told,
    /// the spawner still holds the job: should the supervisor die, it kills
    /// the job's process group if its worker is not yet reaped, and its
    /// cgroups if they are still there, as it would for a running job.
    fn forget(&self, id: u64) {
        let held = {
            let mut ended = self.ended();
            ended.push(id);
            ended.len()
        };
        if held >= ENDED_HELD {
            self.tell_ended();
        }
    }

    /// Tells the spawner every job it may forget.
    fn tell_ended(&self) {
        let ended = std::mem::take(&mut *self.ended());
        for id in ended {
            let _ = self.send(&Request::Ended { id }, &[]);
        }
    }

    fn ended(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one record (records are atomic: no lock needed).
    fn send(&self, request: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let record = request.encode();
        if record.len() > MAX_RECORD {
            return Err(io::Error::other(format!(
                "the worker's command line and environment take {} bytes, more than the {MAX_RECORD} a spawn request may hold; pass large values on stdin or in files",
                record.len()
            )));
        }
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        loop {
            match sendmsg::<()>(
                self.sock.as_raw_fd(),
                &[IoSlice::new(&record)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EMSGSIZE) => {
                    return Err(io::Error::other(format!(
                        "the worker's command line and environment take {} bytes, more than the spawner's socket takes in one message; pass large values on stdin or in files",
                        record.len()
                    )));
                }
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    self.gone.store(true, Ordering::SeqCst);
                    return Err(gone());
                }
                Err(error) => return Err(io::Error::from(error)),
            }
        }
    }

    /// Starts [`Spawner::read_replies`] on the current runtime, once; out
    /// of one (a test's plain thread), on a thread of its own.
    fn read_replies_once(&'static self) {
        self.reader
            .call_once(|| match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(self.read_replies())),
                Err(_) => {
                    let spawned = std::thread::Builder::new()
                        .name("jobmgr-spawner-replies".into())
                        .spawn(move || {
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .enable_io()
                                .build();
                            match runtime {
                                Ok(runtime) => runtime.block_on(self.read_replies()),
                                Err(_) => self.lost(),
                            }
                        });
                    if spawned.is_err() {
                        self.lost();
                    }
                }
            });
    }

    /// The reply reader's life: hand each reply to whoever waits for it;
    /// when the spawner is gone, fail them all.
    async fn read_replies(&'static self) {
        // Ended early (the runtime shut down), it still fails every waiter,
        // so that none waits for ever.
        let _reading = Reading(self);
        // SAFETY: the descriptor is the 'static spawner's own, open for the
        // life of the process.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                ReplySocket(&self.sock),
                tokio::io::Interest::READABLE,
            )
        };
        let socket = match registered {
            Ok(socket) => socket,
            Err(error) => {
                tracing::error!(%error, "cannot watch the spawner's answers");
                return self.lost();
            }
        };
        let mut record = [0u8; 64];
        'reading: loop {
            let Ok(mut ready) = socket.readable().await else {
                break;
            };
            loop {
                // SAFETY: reads one record into `record`, without blocking.
                let read = unsafe {
                    libc::recv(
                        self.sock.as_raw_fd(),
                        record.as_mut_ptr().cast(),
                        record.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if read < 0 {
                    match io::Error::last_os_error().kind() {
                        io::ErrorKind::Interrupted => continue,
                        io::ErrorKind::WouldBlock => {
                            ready.clear_ready();
                            continue 'reading;
                        }
                        _ => break 'reading,
                    }
                }
                if read == 0 {
                    break 'reading;
                }
                match Reply::decode(&record[..read as usize]) {
                    Ok(reply) => self.dispatch(reply),
                    Err(error) => tracing::error!(%error, "unreadable answer from the spawner"),
                }
            }
        }
        self.lost();
    }

    /// The spawner is gone: everyone waiting on it is told.
    fn lost(&self) {
        self.gone.store(true, Ordering::SeqCst);
        self.lock().clear();
        tracing::error!(
            pid = self.pid,
            "the spawner process is gone: no more workers can start, and its running workers got their parent-death signal (what they started outside their cgroups and process group may still run); restart the supervisor"
        );
    }

    fn dispatch(&self, reply: Reply) {
        let mut pending = self.lock();
        match reply {
            Reply::Started { id, pid } => {
                let told = match pending.get_mut(&id) {
                    Some(Pending::Worker { started, .. }) => {
                        started.take().is_some_and(|s| s.send(Ok(pid)).is_ok())
                    }
                    _ => false,
                };
                if !told {
                    // Nobody waits for it any more: it must not run.
                    pending.remove(&id);
                    drop(pending);
                    super::process::kill_group(pid as u32, nix::sys::signal::Signal::SIGKILL);
                    self.forget(id);
                }
            }
            Reply::NotStarted { id, errno } => {
                if let Some(Pending::Worker {
                    started: Some(started),
                    ..
                }) = pending.remove(&id)
                {
                    let _ = started.send(Err(errno));
                }
            }
            Reply::Exited { id, status } => {
                if let Some(Pending::Worker {
                    exited: Some(exited),
                    ..
                }) = pending.remove(&id)
                {
                    let _ = exited.send(status);
                }
            }
            Reply::UidKilled { id, status } => {
                if let Some(Pending::Uid(done)) = pending.remove(&id) {
                    let _ = done.send(status);
                }
            }
        }
    }
}

/// A worker the spawner started. Dropped before it was seen to end, its
/// process group is killed; either way the spawner then forgets the job.
#[derive(Debug)]
pub struct SpawnedWorker {
    spawner: &'static Spawner,
    id: u64,
    pid: i32,
    exited: oneshot::Receiver<i32>,
    status: Option<ExitStatus>,
}

impl SpawnedWorker {
    /// Its pid (also its process group and session).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for it to end (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        match (&mut self.exited).await {
            Ok(raw) => {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                Ok(status)
            }
            Err(_) => Err(gone()),
        }
    }
}

impl Drop for SpawnedWorker {
    fn drop(&mut self) {
        if self.status.is_none() {
            super::process::kill_group(self.pid as u32, nix::sys::signal::Signal::SIGKILL);
        }
        self.spawner.lock().remove(&self.id);
        self.spawner.forget(self.id);
    }
}
