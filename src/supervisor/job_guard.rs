//! What ends a job's processes when the supervisor dies first (`kill -9`,
//! an OOM kill, a crash) and there is no spawner process (see
//! [`spawner`](super::spawner), which does this job better when it runs:
//! it also catches what left the job's session without cgroups). The worker itself gets `PR_SET_PDEATHSIG`, but
//! what it started outlives it: its lease lapses, the job runs again, and
//! the first run's children still run beside the second.
//!
//! So the supervisor forks a job guard at start, before any thread exists:
//! a small process that holds the reading end of a pipe whose only writer
//! is the supervisor. As each job starts and ends, the supervisor writes
//! its process group and cgroup directories down the pipe. When the
//! supervisor dies, however it dies, the kernel closes its end; the
//! job guard reads the end of the pipe, kills every process group still
//! listed and empties their cgroups, and exits. It ignores the signals a
//! terminal or a service manager sends the supervisor's process group, so
//! that it outlives the supervisor's own drain.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{SigHandler, Signal, killpg, signal};
use nix::unistd::{ForkResult, Pid, fork, pipe2};

/// The supervisor's end of the pipe, once the job guard runs.
static GUARD: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// Forks the job guard. Call it before any thread starts (the child of a
/// multi-threaded fork may not allocate); the supervisor's process alone.
pub fn start() -> std::io::Result<()> {
    let (read, write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    // SAFETY: called while this process has one thread, so the child may do
    // anything; it never returns into the caller.
    match unsafe { fork() }.map_err(std::io::Error::from)? {
        ForkResult::Child => {
            drop(write);
            watch(read)
        }
        ForkResult::Parent { .. } => {
            drop(read);
            let _ = GUARD.set(Mutex::new(std::fs::File::from(write)));
            Ok(())
        }
    }
}

/// A job's process group (its worker's pid) and cgroup directories are to
/// be killed if the supervisor dies before [`ended`].
pub fn started(pgid: u32, cgroups: &[PathBuf]) {
    let mut line = format!("+{pgid}");
    for dir in cgroups {
        line.push('\t');
        line.push_str(&dir.to_string_lossy());
    }
    say(&line);
}

/// The job's processes are gone: forget its group.
pub fn ended(pgid: u32) {
    say(&format!("-{pgid}"));
}

fn say(line: &str) {
    if let Some(pipe) = GUARD.get() {
        let mut pipe = pipe.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(error) = writeln!(pipe, "{line}") {
            tracing::warn!(%error, "the job guard is gone: a job's children may outlive a crash of the supervisor");
        }
    }
}

/// The job guard's life: keep the list, and when the pipe ends, kill what
/// it lists and exit.
fn watch(read: OwnedFd) -> ! {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    // SAFETY: a plain prctl naming this process.
    unsafe {
        nix::libc::prctl(nix::libc::PR_SET_NAME, c"jobmgr-guard".as_ptr(), 0, 0, 0);
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
            unsafe { nix::libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut groups: HashMap<u32, Vec<PathBuf>> = HashMap::new();
    for line in BufReader::new(std::fs::File::from(read)).lines() {
        let Ok(line) = line else { break };
        apply(&mut groups, &line);
    }
    for (pgid, dirs) in &groups {
        if let Ok(pgid) = i32::try_from(*pgid) {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        super::cgroup::kill_dirs(dirs);
    }
    std::process::exit(0)
}

/// Applies one line of the supervisor's to the list.
fn apply(groups: &mut HashMap<u32, Vec<PathBuf>>, line: &str) {
    if let Some(rest) = line.strip_prefix('+') {
        let mut fields = rest.split('\t');
        if let Some(Ok(pgid)) = fields.next().map(str::parse::<u32>)
            && pgid > 1
        {
            groups.insert(pgid, fields.map(PathBuf::from).collect());
        }
    } else if let Some(Ok(pgid)) = line.strip_prefix('-').map(str::parse::<u32>) {
        groups.remove(&pgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_follows_the_supervisors_lines_and_refuses_nonsense() {
        let mut groups = HashMap::new();
        apply(&mut groups, "+41\t/sys/fs/cgroup/jobmgr-1/job-41");
        apply(&mut groups, "+42");
        apply(&mut groups, "+1");
        apply(&mut groups, "+0");
        apply(&mut groups, "+x");
        apply(&mut groups, "garbage");
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[&41],
            [PathBuf::from("/sys/fs/cgroup/jobmgr-1/job-41")]
        );
        apply(&mut groups, "-41");
        apply(&mut groups, "-99");
        assert_eq!(groups.keys().copied().collect::<Vec<_>>(), [42]);
    }
}
