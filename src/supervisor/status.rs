//! What this supervisor is doing now, for `jobmgr status`: each pool's gate
//! state and the jobs it runs (id, name, worker pid, start time). Kept in
//! memory and written to a status file (atomically, at most once a second,
//! when something changed); removed when the supervisor exits. The file is
//! mode [`MODE`]: it names every running job, query string and all, and
//! its worker's pid, which is for the supervisor's user and group (the
//! operators who run `jobmgr status`), not for workers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::protocol::Timestamp;

/// The status file's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// The supervisor's pid.
    pub pid: u32,
    /// When it started (ms since the epoch).
    pub started: i64,
    /// When this was written (ms since the epoch).
    pub updated: i64,
    /// The job server it takes jobs from.
    pub server: String,
    /// Its pools (one, "main", without `[[pool]]` tables).
    pub pools: Vec<PoolStatus>,
    /// The back-off under site pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffStatus>,
}

/// The back-off's state: what it reads, the last reading and the
/// thresholds, and how many jobs it holds frozen.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BackoffStatus {
    /// "off", "calm", "paused", "freezing", or "unreadable".
    pub state: String,
    /// What it reads (or why nothing).
    pub signal: String,
    /// The last reading, percent.
    pub pressure: Option<f64>,
    /// The pause threshold, percent.
    pub pause: Option<f64>,
    /// The freeze threshold, percent.
    pub freeze: Option<f64>,
    /// Below what frozen jobs thaw, percent.
    pub thaw_below: Option<f64>,
    /// The longest one freeze of a job lasts, in milliseconds.
    pub max_freeze_ms: u64,
    /// Jobs frozen now.
    pub frozen: usize,
}

/// One pool's state.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PoolStatus {
    /// The pool's name.
    pub name: String,
    /// The job names it takes.
    pub job_name: String,
    /// Its gate: "open", or why it is closed ("load", "memory", "full",
    /// "ramp", "unreadable"), or "draining"/"quiet".
    pub gate: String,
    /// The last 1-minute load average read.
    pub load1: Option<f64>,
    /// Its load limit.
    pub max_load: f64,
    /// Its concurrency cap.
    pub max_workers: usize,
    /// The jobs it runs, by id.
    pub running: BTreeMap<i64, RunningJob>,
}

/// A job being run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunningJob {
    /// The job's name.
    pub name: String,
    /// The worker's pid, once started.
    pub pid: Option<u32>,
    /// When the supervisor took it (ms since the epoch).
    pub since: i64,
    /// Held ahead (`--fetch-ahead`): taken, waiting for a worker slot.
    #[serde(default)]
    pub held: bool,
    /// Frozen now by the back-off.
    #[serde(default)]
    pub frozen: bool,
    /// The time it spent frozen, in milliseconds.
    #[serde(default)]
    pub frozen_ms: u64,
    /// The time it waited for a CPU (its cgroup's CPU pressure), in
    /// milliseconds; `None` where its cgroup does not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starved_ms: Option<u64>,
}

/// The status of the whole process, shared by its pools.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    inner: Arc<Mutex<Board>>,
}

#[derive(Debug)]
struct Board {
    status: Status,
    dirty: bool,
}

/// One pool's part of the board.
#[derive(Debug, Clone)]
pub struct PoolBoard {
    board: StatusBoard,
    index: usize,
}

impl StatusBoard {
    /// An empty board for this process.
    pub fn new(server: &str) -> Self {
        let now = Timestamp::now().0;
        StatusBoard {
            inner: Arc::new(Mutex::new(Board {
                status: Status {
                    pid: std::process::id(),
                    started: now,
                    updated: now,
                    server: server.to_string(),
                    pools: Vec::new(),
                    backoff: None,
                },
                dirty: true,
            })),
        }
    }

    fn with<T>(&self, change: impl FnOnce(&mut Status) -> T) -> T {
        let mut board = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        board.dirty = true;
        change(&mut board.status)
    }

    /// Adds a pool (or finds the one of that name, after a reload).
    pub fn pool(&self, name: &str, job_name: &str, max_load: f64, max_workers: usize) -> PoolBoard {
        let index = self.with(|status| {
            if let Some(i) = status.pools.iter().position(|p| p.name == name) {
                return i;
            }
            status.pools.push(PoolStatus {
                name: name.to_string(),
                job_name: job_name.to_string(),
                gate: "open".into(),
                max_load,
                max_workers,
                ..PoolStatus::default()
            });
            status.pools.len() - 1
        });
        PoolBoard {
            board: self.clone(),
            index,
        }
    }

    /// Records the back-off's state.
    pub fn backoff(&self, state: BackoffStatus) {
        let mut board = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if board.status.backoff.as_ref() != Some(&state) {
            board.status.backoff = Some(state);
            board.dirty = true;
        }
    }

    /// A copy of the status now.
    pub fn snapshot(&self) -> Status {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .status
            .clone()
    }

    /// Writes the status to `path` whenever it changed, at most once a
    /// second, until the returned task is aborted.
    pub fn keep_written(&self, path: PathBuf) -> tokio::task::JoinHandle<()> {
        let board = self.clone();
        tokio::spawn(async move {
            let mut warned = false;
            loop {
                let changed = {
                    let mut inner = board.inner.lock().unwrap_or_else(|e| e.into_inner());
                    let dirty = std::mem::take(&mut inner.dirty);
                    inner.status.updated = Timestamp::now().0;
                    dirty.then(|| inner.status.clone())
                };
                if let Some(status) = changed {
                    let target = path.clone();
                    let written =
                        tokio::task::spawn_blocking(move || write(&target, &status)).await;
                    if let Ok(Err(error)) = written
                        && !warned
                    {
                        tracing::warn!(path = %path.display(), %error, "cannot write the status file; `jobmgr status` will not see this supervisor");
                        warned = true;
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }
}

impl PoolBoard {
    /// Records the gate's state and the last load read.
    pub fn gate(&self, state: &str, load1: Option<f64>) {
        let mut board = self.board.inner.lock().unwrap_or_else(|e| e.into_inner());
        let pool = &mut board.status.pools[self.index];
        if pool.gate != state || pool.load1 != load1 {
            pool.gate = state.to_string();
            pool.load1 = load1;
            board.dirty = true;
        }
    }

    /// How many of the pool's jobs are frozen now.
    pub fn frozen(&self) -> u32 {
        let board = self.board.inner.lock().unwrap_or_else(|e| e.into_inner());
        let frozen = board.status.pools[self.index]
            .running
            .values()
            .filter(|job| job.frozen)
            .count();
        u32::try_from(frozen).unwrap_or(u32::MAX)
    }

    /// Records the pool's limits (they change on reload).
    pub fn limits(&self, job_name: &str, max_load: f64, max_workers: usize) {
        let mut board = self.board.inner.lock().unwrap_or_else(|e| e.into_inner());
        let pool = &mut board.status.pools[self.index];
        if pool.job_name != job_name || pool.max_load != max_load || pool.max_workers != max_workers
        {
            pool.job_name = job_name.to_string();
            pool.max_load = max_load;
            pool.max_workers = max_workers;
            board.dirty = true;
        }
    }

    /// Records a job taken, held ahead or not; it stays on the board until
    /// the returned guard is dropped.
    pub fn running(&self, id: i64, name: &str, held: bool) -> OnBoard {
        self.board.with(|status| {
            status.pools[self.index].running.insert(
                id,
                RunningJob {
                    name: name.to_string(),
                    pid: None,
                    since: Timestamp::now().0,
                    held,
                    frozen: false,
                    frozen_ms: 0,
                    starved_ms: None,
                },
            )
        });
        OnBoard {
            pool: self.clone(),
            id,
        }
    }
}

/// A job on the board.
#[derive(Debug)]
pub struct OnBoard {
    pool: PoolBoard,
    id: i64,
}

impl OnBoard {
    /// Records that a held job got its worker slot.
    pub fn placed(&self) {
        self.pool.board.with(|status| {
            if let Some(job) = status.pools[self.pool.index].running.get_mut(&self.id) {
                job.held = false;
            }
        });
    }

    /// Records the worker's pid.
    pub fn started(&self, pid: u32) {
        self.pool.board.with(|status| {
            if let Some(job) = status.pools[self.pool.index].running.get_mut(&self.id) {
                job.pid = Some(pid);
            }
        });
    }
}

impl OnBoard {
    /// Applies `change` to the job's entry; the board is written again
    /// only when it says it changed something.
    fn update(&self, change: impl FnOnce(&mut RunningJob) -> bool) {
        let mut board = self
            .pool
            .board
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let pool = &mut board.status.pools[self.pool.index];
        if pool.running.get_mut(&self.id).is_some_and(change) {
            board.dirty = true;
        }
    }

    /// Records whether the job is frozen, and for how long it was in all
    /// (in whole seconds: the board is written when it changes).
    pub fn frozen(&self, frozen: bool, total: Duration) {
        let frozen_ms = total.as_secs() * 1000;
        self.update(|job| {
            let changed = job.frozen != frozen || job.frozen_ms != frozen_ms;
            job.frozen = frozen;
            job.frozen_ms = frozen_ms;
            changed
        });
    }

    /// Records how long the job has waited for a CPU so far (in whole
    /// seconds, as the time frozen).
    pub fn starved(&self, total: Duration) {
        let starved_ms = Some(total.as_secs() * 1000);
        self.update(|job| {
            let changed = job.starved_ms != starved_ms;
            job.starved_ms = starved_ms;
            changed
        });
    }
}

impl Drop for OnBoard {
    fn drop(&mut self) {
        self.pool.board.with(|status| {
            status.pools[self.pool.index].running.remove(&self.id);
        });
    }
}

/// The status file's mode: read and written by the supervisor's user, read
/// by its group, nothing for anyone else (whatever the umask).
pub const MODE: u32 = 0o640;

/// Writes `status` to `path` atomically (a temporary file, mode [`MODE`],
/// renamed over it).
pub fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let text = serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?;
    let temporary = path.with_extension(format!("tmp.{}", std::process::id()));
    // One left by a crash of a process of this pid.
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(MODE)
        .open(&temporary)?;
    file.set_permissions(std::fs::Permissions::from_mode(MODE))?;
    file.write_all(&text)?;
    drop(file);
    std::fs::rename(&temporary, path)
}

/// Reads a status file.
pub fn read(path: &Path) -> std::io::Result<Status> {
    let text = std::fs::read(path)?;
    serde_json::from_slice(&text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_on_the_board_while_its_guard_lives() {
        let board = StatusBoard::new("embedded");
        let pool = board.pool("main", "*", 4.0, 8);
        let on = pool.running(7, "www/Send", true);
        assert!(board.snapshot().pools[0].running[&7].held);
        on.placed();
        on.started(1234);
        let running = &board.snapshot().pools[0].running;
        assert!(!running[&7].held);
        assert_eq!(running[&7].pid, Some(1234));
        assert_eq!(running[&7].name, "www/Send");
        drop(on);
        assert!(board.snapshot().pools[0].running.is_empty());
        // A reloaded pool keeps its place.
        assert_eq!(board.pool("main", "*", 4.0, 8).index, 0);
    }

    /// The file is the supervisor's user's and group's only: it names
    /// every running job and its worker's pid. (The supervisor's umask
    /// plays no part: the integration test runs it under `umask 077`.)
    #[test]
    fn the_status_file_is_readable_by_the_supervisors_user_and_group_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let board = StatusBoard::new("embedded");
        let _on = board
            .pool("main", "*", 4.0, 8)
            .running(3, "www/Send?to=x", false);
        write(&path, &board.snapshot()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, MODE, "{mode:o}");
    }

    #[test]
    fn the_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let board = StatusBoard::new("http://127.0.0.1:1");
        let pool = board.pool("www", "www/*", 2.0, 4);
        pool.gate("load", Some(3.5));
        let _on = pool.running(1, "www/A", false);
        write(&path, &board.snapshot()).unwrap();
        assert_eq!(read(&path).unwrap(), board.snapshot());
        // Written again over itself, as every second.
        write(&path, &board.snapshot()).unwrap();
        assert_eq!(read(&path).unwrap(), board.snapshot());
        std::fs::write(&path, "{").unwrap();
        assert!(read(&path).is_err());
    }
}
