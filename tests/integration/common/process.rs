//! Child processes of a test, waited for with a deadline. A command that
//! should end (a refused start, a client command) is run by
//! [`RunBounded::run_bounded`]: in a process group of its own, its output
//! captured; if it has not ended by the deadline it is killed (its group,
//! which is still ours because the leader is not reaped yet) and the test
//! fails naming what it waited for, with the output so far. A child that
//! runs until the test stops it is stopped by [`kill_and_reap`].

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::DEADLINE;

/// How long to wait for a finished command's output pipes to close (a
/// process it left behind may hold them open).
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Running a command to its end, with a deadline.
pub trait RunBounded {
    /// Runs the command (stdin empty, stdout and stderr captured) and
    /// returns its output once it exits, within [`DEADLINE`]; otherwise
    /// kills it and panics, saying it waited for `what`.
    fn run_bounded(&mut self, what: &str) -> Output;

    /// As [`RunBounded::run_bounded`], with a deadline of `deadline`.
    fn run_within(&mut self, deadline: Duration, what: &str) -> Output;
}

impl RunBounded for Command {
    fn run_bounded(&mut self, what: &str) -> Output {
        self.run_within(DEADLINE, what)
    }

    fn run_within(&mut self, deadline: Duration, what: &str) -> Output {
        self.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so that a timeout kills what it started too.
            .process_group(0);
        let mut child = self
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = Capture::start(child.stdout.take().expect("stdout piped"));
        let stderr = Capture::start(child.stderr.take().expect("stderr piped"));
        match wait_child(&mut child, deadline) {
            Some(status) => Output {
                status,
                stdout: stdout.finish(),
                stderr: stderr.finish(),
            },
            None => {
                // Not reaped, so the pid and its group are still ours.
                kill_group(&child);
                let reaped = kill_and_reap(&mut child, what);
                panic!(
                    "timed out after {deadline:?} waiting for {what} (pid {}); killed it: {}.\n\
                     stdout:\n{}\nstderr:\n{}",
                    child.id(),
                    match reaped {
                        Some(status) => format!("it ended with {status}"),
                        None => "it could not be reaped".to_string(),
                    },
                    String::from_utf8_lossy(&stdout.so_far()),
                    String::from_utf8_lossy(&stderr.so_far()),
                );
            }
        }
    }
}

/// Waits up to `deadline` for a child of ours to exit and reaps it; `None`
/// if it is still running (and so not reaped: its pid is still ours) or
/// cannot be waited for.
pub fn wait_child(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if start.elapsed() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILLs a child of ours through its handle (a no-op if it has exited:
/// an unreaped child's pid cannot have been reused) and reaps it, waiting
/// up to [`DEADLINE`]. Returns its exit status, or `None` (and says so on
/// stderr) if it could not be reaped. For drops and clean-ups: it never
/// panics.
pub fn kill_and_reap(child: &mut Child, what: &str) -> Option<ExitStatus> {
    let _ = child.kill();
    let status = wait_child(child, DEADLINE);
    if status.is_none() {
        eprintln!(
            "{what} (pid {}) was not reaped {DEADLINE:?} after SIGKILL",
            child.id()
        );
    }
    status
}

/// SIGKILLs the process group a child leads (a [`RunBounded`] one, or a
/// fixture started in a group of its own). Only for a child that is not
/// reaped yet.
pub fn kill_group(child: &Child) {
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::SIGKILL);
}

/// A pipe read to its end on a thread, its bytes so far readable at any
/// time.
struct Capture {
    bytes: Arc<Mutex<Vec<u8>>>,
    closed: mpsc::Receiver<()>,
}

impl Capture {
    fn start(mut pipe: impl Read + Send + 'static) -> Capture {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (tx, closed) = mpsc::channel();
        let sink = Arc::clone(&bytes);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("capture").extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(());
        });
        Capture { bytes, closed }
    }

    /// Everything, once the pipe closes (or what came within
    /// [`PIPE_GRACE`], if something left behind holds it open).
    fn finish(&self) -> Vec<u8> {
        let _ = self.closed.recv_timeout(PIPE_GRACE);
        self.so_far()
    }

    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().expect("capture").clone()
    }
}

/// A child of the test that runs until the test ends: SIGKILLed through
/// its handle and reaped when dropped, also when the test fails first.
pub struct ChildGuard {
    child: Option<Child>,
    what: String,
}

impl ChildGuard {
    /// Guards `child`, described as `what` in messages.
    pub fn new(child: Child, what: &str) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            what: what.to_string(),
        }
    }

    /// The child, while it is guarded.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("guarded child")
    }

    /// Kills and reaps it now.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, &self.what);
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether process `pid` is alive (not gone, not a zombie) and its command
/// line contains `marker`, a string unique to the test (a path in its
/// directory): a pid that was reused by another process does not count.
/// For processes that are not the test's children, which it only watches.
pub fn alive_with(pid: i32, marker: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains(marker) {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !(stat.is_empty() || matches!(state, Some('Z' | 'X')))
}

/// Whether some process holds the lock a supervisor takes on its spool
/// (`.lock` in it). Taking the lock to find out releases it at once.
pub fn spool_is_locked(spool: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::open(spool.join(".lock")) else {
        return false;
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(_free) => false,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => true,
        Err((_, e)) => panic!("cannot test the lock on {}: {e}", spool.display()),
    }
}

/// Sends `signal` to process `pid`, a pid the test read (from `/proc`, a
/// cgroup's `cgroup.procs`) rather than holds, only if `is_it(pid)` says it
/// is the process the test means; returns whether it was sent. The process
/// is pinned by a pidfd first, and `is_it` (which reads `/proc` or the
/// cgroup again) counts only if the pinned process is still alive after
/// it: then the pid was the pinned process's throughout the read. A pidfd
/// signals no other process than the one it opened, however the pid was
/// reused.
pub fn signal_if(pid: i32, signal: nix::sys::signal::Signal, is_it: impl Fn(i32) -> bool) -> bool {
    use nix::libc;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: a descriptor the call above just opened, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let send = |signal: i32| {
        // SAFETY: pidfd_send_signal on a pidfd we own, with no siginfo.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        sent == 0
    };
    is_it(pid) && send(0) && send(signal as i32)
}
