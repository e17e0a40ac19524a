//! The one thread workers are forked from when there is no spawner process
//! (see [`spawner`](super::spawner), which starts them otherwise), and the
//! reaper of whatever else ends up as the supervisor's child.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked a child exits, so
//! forking from a pool thread that retires when idle would kill workers at
//! random. Every spawn goes through this thread, which lives as long as the
//! supervisor.
//!
//! The supervisor is a child subreaper (`PR_SET_CHILD_SUBREAPER`): processes
//! orphaned by a worker become its children instead of init's, so they can
//! be reaped here rather than linger as zombies (many container inits never
//! reap). Workers themselves are reaped by the async runtime; the reaper
//! only touches children it did not spawn, and spawning and reaping share a
//! lock so that it never mistakes a worker being born for an orphan.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, mpsc};

use nix::libc;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

type Spawn = (Command, oneshot::Sender<std::io::Result<Child>>);

/// The spawning thread.
#[derive(Debug, Clone)]
pub struct Launcher {
    requests: mpsc::Sender<Spawn>,
    workers: Arc<Mutex<HashSet<i32>>>,
}

impl Launcher {
    /// Starts the thread; children it spawns belong to the runtime of
    /// `runtime`. Also makes this process a subreaper and starts reaping
    /// orphans on SIGCHLD.
    pub fn start(runtime: tokio::runtime::Handle) -> std::io::Result<Self> {
        let launcher = Self::spawning_only(runtime.clone())?;
        let workers = Arc::clone(&launcher.workers);
        // SAFETY: a plain prctl on this process.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become a subreaper; orphans of workers go to init");
        }
        let reaped = Arc::clone(&workers);
        runtime.spawn(async move {
            let Ok(mut children) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            else {
                return;
            };
            while children.recv().await.is_some() {
                let workers = Arc::clone(&reaped);
                let _ = tokio::task::spawn_blocking(move || reap_orphans(&workers)).await;
            }
        });
        Ok(launcher)
    }

    /// The spawning thread alone: no subreaper, no reaper of orphans (for
    /// tests, which share their process with other tests' children).
    pub(crate) fn spawning_only(runtime: tokio::runtime::Handle) -> std::io::Result<Self> {
        let workers: Arc<Mutex<HashSet<i32>>> = Arc::default();
        let (requests, incoming) = mpsc::channel::<Spawn>();
        let spawned = Arc::clone(&workers);
        let thread_runtime = runtime.clone();
        std::thread::Builder::new()
            .name("jobmgr-launcher".into())
            .spawn(move || {
                let _runtime = thread_runtime.enter();
                while let Ok((mut command, answer)) = incoming.recv() {
                    let mut workers = spawned.lock().unwrap_or_else(|e| e.into_inner());
                    let child = command.spawn();
                    if let Ok(child) = &child
                        && let Some(pid) = child.id()
                    {
                        workers.insert(pid as i32);
                    }
                    drop(workers);
                    let _ = answer.send(child);
                }
            })?;
        Ok(Launcher { requests, workers })
    }

    /// Spawns `command` on the launcher thread.
    pub async fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (answer, answered) = oneshot::channel();
        self.requests
            .send((command, answer))
            .map_err(|_| std::io::Error::other("the launcher thread is gone"))?;
        answered
            .await
            .map_err(|_| std::io::Error::other("the launcher thread is gone"))?
    }

    /// Kills every process of `uid` (never root's): a helper forked here
    /// becomes that uid, drops every capability and sends SIGKILL to every
    /// process it may signal (`kill(-1)`, which the kernel does atomically
    /// with respect to forks). While it lives it is counted as a worker, so
    /// that the orphan reaper leaves it to this wait. Blocking.
    pub fn kill_uid(&self, uid: u32) -> std::io::Result<()> {
        if uid == 0 {
            return Err(std::io::Error::other(
                "refusing to kill every process of root",
            ));
        }
        // The spawner's fork is the cheap one.
        if let Some(spawner) = super::spawner::get() {
            return spawner.kill_uid(uid);
        }
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the child makes only system calls and ends itself.
        let pid = match unsafe { libc::fork() } {
            -1 => return Err(std::io::Error::last_os_error()),
            0 => unsafe { super::uids::kill_every_process_as(uid) },
            pid => pid,
        };
        workers.insert(pid);
        drop(workers);
        let mut status = 0;
        let waited = loop {
            // SAFETY: waits on the helper, a child of ours.
            let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
            if waited == -1
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            break waited;
        };
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        if waited != pid {
            return Err(std::io::Error::last_os_error());
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(std::io::Error::other(format!(
                "the helper that kills the processes of uid {uid} could not become that uid (wait status {status})"
            )));
        }
        Ok(())
    }

    /// Forgets a worker the runtime has reaped.
    pub fn reaped(&self, pid: u32) {
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(pid as i32));
    }
}

/// Reaps every child that is not a worker and has ended.
fn reap_orphans(workers: &Mutex<HashSet<i32>>) {
    let workers = workers.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if workers.contains(&pid) {
                continue;
            }
            let mut status = 0;
            // SAFETY: waits on one specific child without blocking.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
}
