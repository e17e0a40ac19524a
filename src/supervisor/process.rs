//! Running one worker process: its own session and process group, a
//! parent-death signal, the job on stdin while stdout and stderr are drained
//! (so no payload or output size can deadlock it), progress lines read from
//! fd 3 (and the worker's report line among them, see
//! [`super::report_line`]), a timeout with SIGTERM, grace and SIGKILL to the whole group, and
//! the group killed when the worker ends, so nothing it started outlives it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{MaybeDone, maybe_done};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backoff::JobFreeze;
use super::cgroup::JobCgroup;
use super::launcher::Launcher;
use super::output::{Capture, Captured};
use super::report_line::MAX_REPORT_LINE;
use super::sandbox::ChildSetup;

/// The fd a worker writes progress lines to.
pub const PROGRESS_FD: i32 = 3;

/// The longest progress line read; longer ones are skipped.
const MAX_PROGRESS_LINE: usize = 64 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<std::ffi::OsString>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// What it reads on stdin.
    pub stdin: Vec<u8>,
    /// How long it may run.
    pub timeout: Duration,
    /// How long it has between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Bytes kept of each of stdout and stderr.
    pub output_cap: usize,
    /// Told the worker's pid once it is started.
    pub on_spawn: Option<SpawnHook>,
    /// The back-off's hold on the worker: told its pid, it may freeze it;
    /// the timeout is extended by the time it was frozen, and it is
    /// thawed before it is stopped.
    pub freeze: Option<Arc<JobFreeze>>,
}

/// Called with a worker's pid once it is started.
#[derive(Clone)]
pub struct SpawnHook(pub Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for SpawnHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnHook")
    }
}

/// How the worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// It died of this signal.
    Signaled(i32),
    /// It ran past its timeout and was stopped.
    TimedOut,
    /// It was stopped on request (lease lost, drain).
    Stopped,
}

/// A finished worker.
#[derive(Debug, Clone)]
pub struct Finished {
    /// How it ended.
    pub ending: Ending,
    /// Its pid.
    pub pid: u32,
    /// Its stdout.
    pub stdout: Captured,
    /// Its stderr.
    pub stderr: Captured,
    /// Whether SIGKILL was needed after SIGTERM.
    pub killed: bool,
    /// Whether the kernel killed part of the job for lack of memory (known
    /// where the job had a memory cgroup; set by the caller).
    pub oom: bool,
    /// The last report line the worker wrote to fd 3, unread.
    pub report_line: Option<serde_json::Value>,
}

/// Runs a worker to its end. `stop` stops it early (SIGTERM, grace,
/// SIGKILL); progress objects written to fd 3 go to `progress`.
pub async fn run(
    launcher: &Launcher,
    spec: WorkerSpec,
    stop: CancellationToken,
    progress: Option<mpsc::Sender<serde_json::Map<String, serde_json::Value>>>,
    setup: ChildSetup,
    tree: Option<Arc<JobCgroup>>,
) -> std::io::Result<Finished> {
    let (progress_read, progress_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    fcntl(&progress_read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(std::io::Error::from)?;

    let started = match super::spawner::get() {
        Some(spawner) => spawn_by(spawner, &spec, &setup, tree.as_ref(), progress_write).await?,
        None => spawn_here(launcher, &spec, setup, tree.as_ref(), progress_write).await?,
    };
    let Started {
        mut child,
        stdin,
        stdin_sent,
        stdout,
        stderr,
    } = started;
    let pid = child.pid();
    if let Some(hook) = &spec.on_spawn {
        (hook.0)(pid);
    }
    let freeze = spec.freeze.as_deref();
    if let Some(freeze) = freeze {
        freeze.started(pid);
    }

    // The pipes are read and written by futures of this task, not by tasks
    // of their own: no spawn and no hand-off between threads per pipe.
    let stdout_capture = Mutex::new(Capture::new(spec.output_cap));
    let stderr_capture = Mutex::new(Capture::new(spec.output_cap));
    let mut writer = pin!(maybe_done(feed(stdin, &spec.stdin[stdin_sent..])));
    let mut stdout = pin!(maybe_done(drain(stdout, &stdout_capture)));
    let mut stderr = pin!(maybe_done(drain(stderr, &stderr_capture)));
    let report_line = Mutex::new(None);
    let mut progress = pin!(maybe_done(read_progress(
        progress_read,
        progress,
        &report_line
    )));

    let mut killed = false;
    let waiting = async {
        tokio::select! {
            status = child.wait() => status.map(status_ending),
            () = timeout_passes(spec.timeout, freeze) => {
                let frozen = freeze.map(JobFreeze::frozen_for).unwrap_or_default();
                tracing::warn!(pid, timeout = ?spec.timeout, ?frozen, "worker timed out; stopping its process group");
                killed = terminate(&mut child, pid, spec.grace, tree.as_ref(), freeze).await;
                Ok(Ending::TimedOut)
            }
            _ = stop.cancelled() => {
                killed = terminate(&mut child, pid, spec.grace, tree.as_ref(), freeze).await;
                Ok(Ending::Stopped)
            }
        }
    };
    // `join!` starts from a different one at each poll, so that a stream
    // that is always ready (a flood on stdout) cannot spend the task's
    // budget before the others are read; each keeps its output for
    // `MaybeDone::take_output`.
    let pipes = async {
        tokio::join!(
            writer.as_mut(),
            stdout.as_mut(),
            stderr.as_mut(),
            progress.as_mut()
        );
    };
    let ending = alongside(waiting, pipes).await;
    // Never frozen again; thawed if it was (its group is killed next).
    if let Some(freeze) = freeze {
        freeze.end();
    }
    // On every path, a failed wait included: the worker is the reaper's
    // to reap if the runtime could not, and whatever is left of its process
    // group, and of its cgroup (which also holds what left the group), dies
    // with it.
    launcher.reaped(pid);
    kill_group(pid, Signal::SIGKILL);
    // Nothing left in the cgroups (the usual end): no kill, no hand-off.
    if !tree.as_ref().is_some_and(|tree| tree.empty_now()) {
        kill_tree(tree.as_ref()).await;
    }
    super::job_guard::ended(pid);
    // The spawner may forget the job now.
    drop(child);
    // What is not written to stdin now never will be: its end is closed.
    writer.set(MaybeDone::Gone);
    // Output and progress written just before the end still count: read
    // them to their end (the group is dead), for at most 2 s, since a
    // process that left the group may hold them open.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        tokio::join!(stdout.as_mut(), stderr.as_mut(), progress.as_mut());
    })
    .await;
    let report_line = report_line.lock().unwrap_or_else(|e| e.into_inner()).take();
    let stdout = collect(stdout.as_mut().take_output().is_some(), &stdout_capture);
    let stderr = collect(stderr.as_mut().take_output().is_some(), &stderr_capture);
    let ending = ending.inspect_err(|error| {
        tracing::error!(pid, %error, "cannot wait for the worker; its process group was killed");
    })?;
    Ok(Finished {
        ending,
        pid,
        stdout,
        stderr,
        killed,
        oom: false,
        report_line,
    })
}

/// A started worker: the spawner's, or the runtime's when there is no
/// spawner (tests, or a spawner that could not start).
enum Child {
    Runtime(tokio::process::Child),
    Spawned(super::spawner::SpawnedWorker),
}

impl Child {
    fn pid(&self) -> u32 {
        match self {
            Child::Runtime(child) => child.id().unwrap_or(0),
            Child::Spawned(worker) => worker.pid(),
        }
    }

    /// Waits for the worker to end (cancel-safe).
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Child::Runtime(child) => child.wait().await,
            Child::Spawned(worker) => worker.wait().await,
        }
    }
}

type Input = Box<dyn AsyncWrite + Send + Unpin>;
type Output = Box<dyn AsyncRead + Send + Unpin>;

/// A worker just started, with the supervisor's ends of its stdio.
struct Started {
    child: Child,
    stdin: Option<Input>,
    /// How much of the job was written to stdin before the worker started
    /// (all of it, and stdin closed, when it fitted in the pipe).
    stdin_sent: usize,
    stdout: Option<Output>,
    stderr: Option<Output>,
}

/// Starts the worker in the spawner process: the pipes are made here and
/// the worker's ends sent along with the request.
async fn spawn_by(
    spawner: &'static super::spawner::Spawner,
    spec: &WorkerSpec,
    setup: &ChildSetup,
    tree: Option<&Arc<JobCgroup>>,
    progress_write: OwnedFd,
) -> std::io::Result<Started> {
    use std::os::unix::ffi::OsStrExt;
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from);
    let (stdin_read, stdin_write) = pipe()?;
    let nonblocking = |fd: &OwnedFd| {
        fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(std::io::Error::from)
    };
    // The job goes into the empty pipe now, as much of it as fits (all of
    // a usual job: a pipe holds 64 KiB), so that a job that fits needs no
    // writer waiting on the worker: its end is closed once the worker has
    // its own, and the worker reads the job, then its end.
    nonblocking(&stdin_write)?;
    // A full pipe (`EAGAIN`) leaves all of it to the writer.
    let stdin_sent: usize = nix::unistd::write(&stdin_write, &spec.stdin).unwrap_or_default();
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let program = resolve_program(&spec.program, &spec.env);
    let bytes = |s: &std::ffi::OsStr| s.as_bytes().to_vec();
    let request = super::spawner::protocol::SpawnRequest {
        id: 0,
        program: bytes(program.as_os_str()),
        args: spec.args.iter().map(|a| bytes(a)).collect(),
        env: spec
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect(),
        cwd: bytes(spec.cwd.as_os_str()),
        cgroups: tree.map_or_else(Vec::new, |t| {
            t.dirs().iter().map(|d| bytes(d.as_os_str())).collect()
        }),
        unified: setup.unified.as_ref().map(|u| u.dir.as_bytes().to_vec()),
        tasks: setup.tasks.iter().map(|p| p.as_bytes().to_vec()).collect(),
        rlimits: setup.rlimits.clone(),
        priority: setup.priority,
        umask: setup.umask,
        credentials: setup.credentials.as_ref().map(|c| {
            super::spawner::protocol::WireCredentials {
                uid: c.uid,
                gid: c.gid,
                groups: c.groups.clone(),
            }
        }),
        own_keyrings: setup.own_keyrings,
        no_network: setup.no_network,
        private_tmp: setup.private_tmp,
        landlock: setup.landlock.is_some(),
    };
    let mut fds = vec![
        stdin_read.as_fd(),
        stdout_write.as_fd(),
        stderr_write.as_fd(),
        progress_write.as_fd(),
    ];
    // SAFETY: the ruleset's descriptor is held open by the job's sandbox
    // for the whole run.
    let landlock = setup
        .landlock
        .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
    fds.extend(landlock);
    let worker = spawner.spawn(request, &fds).await?;
    drop(fds);
    drop((stdin_read, stdout_write, stderr_write, progress_write));
    nonblocking(&stdout_read)?;
    nonblocking(&stderr_read)?;
    // Pipe ends made just above, in the right mode and now non-blocking:
    // tokio's checks (an `fstat` and an `F_GETFL` each) would only repeat
    // what is known.
    let stdin = if stdin_sent == spec.stdin.len() {
        drop(stdin_write);
        None
    } else {
        let stdin = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(stdin_write)?;
        Some(Box::new(stdin) as Input)
    };
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(stdout_read)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(stderr_read)?;
    Ok(Started {
        child: Child::Spawned(worker),
        stdin,
        stdin_sent,
        stdout: Some(Box::new(stdout)),
        stderr: Some(Box::new(stderr)),
    })
}

/// `program` as `execvp` would find it: itself if it names a path, else
/// the first executable file of that name on the worker's `PATH`.
fn resolve_program(program: &std::path::Path, env: &[(String, String)]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    if program.as_os_str().as_bytes().contains(&b'/') {
        return program.to_path_buf();
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = std::path::Path::new(dir).join(program);
        if nix::unistd::access(&candidate, nix::unistd::AccessFlags::X_OK).is_ok()
            && candidate.is_file()
        {
            return candidate;
        }
    }
    program.to_path_buf()
}

/// Starts the worker from the supervisor's own launcher thread, with the
/// job guard told of it (when there is no spawner).
async fn spawn_here(
    launcher: &Launcher,
    spec: &WorkerSpec,
    setup: ChildSetup,
    tree: Option<&Arc<JobCgroup>>,
    progress_write: OwnedFd,
) -> std::io::Result<Started> {
    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let write_fd = progress_write.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on data prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            use nix::libc;
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let moved = if write_fd == PROGRESS_FD {
                libc::fcntl(PROGRESS_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(write_fd, PROGRESS_FD)
            };
            if moved < 0 {
                return Err(std::io::Error::last_os_error());
            }
            setup.apply(false)
        });
    }
    let mut child = launcher.spawn(command).await?;
    drop(progress_write);
    let pid = child.id().unwrap_or(0);
    // Should the supervisor die before the job ends, the job guard ends
    // the job's process group and cgroups.
    super::job_guard::started(pid, tree.map_or(&[][..], |t| t.dirs()));
    let stdin = child.stdin.take().map(|s| Box::new(s) as Input);
    let stdout = child.stdout.take().map(|s| Box::new(s) as Output);
    let stderr = child.stderr.take().map(|s| Box::new(s) as Output);
    Ok(Started {
        child: Child::Runtime(child),
        stdin,
        stdin_sent: 0,
        stdout,
        stderr,
    })
}

fn status_ending(status: std::process::ExitStatus) -> Ending {
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Exited(code),
        (None, Some(signal)) => Ending::Signaled(signal),
        (None, None) => Ending::Exited(-1),
    }
}

/// Resolves once the worker has run `timeout`, not counting the time the
/// back-off kept it frozen.
async fn timeout_passes(timeout: Duration, freeze: Option<&JobFreeze>) {
    let start = tokio::time::Instant::now();
    loop {
        let frozen = freeze.map(JobFreeze::frozen_for).unwrap_or_default();
        let deadline = start + timeout + frozen;
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// SIGTERM to the group, then SIGKILL (to the group and the cgroup) after
/// `grace`. A frozen worker is thawed first, so that it can act on the
/// SIGTERM. Returns whether SIGKILL was needed.
async fn terminate(
    child: &mut Child,
    pid: u32,
    grace: Duration,
    tree: Option<&Arc<JobCgroup>>,
    freeze: Option<&JobFreeze>,
) -> bool {
    if let Some(freeze) = freeze {
        freeze.end();
    }
    kill_group(pid, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_ok() {
        return false;
    }
    tracing::warn!(
        pid,
        ?grace,
        "worker ignored SIGTERM; sending SIGKILL to its process group"
    );
    kill_group(pid, Signal::SIGKILL);
    kill_tree(tree).await;
    let _ = child.wait().await;
    true
}

/// Kills everything in a job's cgroup (off the async threads: v1 has to
/// kill pid by pid).
async fn kill_tree(tree: Option<&Arc<JobCgroup>>) {
    if let Some(tree) = tree {
        let tree = Arc::clone(tree);
        let _ = tokio::task::spawn_blocking(move || tree.kill()).await;
    }
}

/// Signals a worker's process group (its pgid is its pid, from `setsid`).
pub fn kill_group(pid: u32, signal: Signal) {
    if pid == 0 {
        return;
    }
    match killpg(Pid::from_raw(pid as i32), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => tracing::warn!(pid, %error, "cannot signal the worker's process group"),
    }
}

/// Writes the job to the worker's stdin and closes it. A worker that
/// never reads its stdin or closes it early is its own business: the error
/// ends only this writer.
async fn feed(stdin: Option<Input>, payload: &[u8]) {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(payload).await;
        let _ = stdin.shutdown().await;
    }
}

/// Reads a stream to its end into `capture`: 4 KiB at a time at first (most
/// workers write little or nothing), up to a pipe's 64 KiB once a read
/// fills the buffer.
async fn drain(stream: Option<impl AsyncRead + Unpin>, capture: &Mutex<Capture>) {
    let Some(mut stream) = stream else { return };
    let mut buf = vec![0u8; 4 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                capture
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(&buf[..n]);
                if n == buf.len() && n < 64 * 1024 {
                    buf.resize(64 * 1024, 0);
                }
            }
        }
    }
}

/// What was read of a stream. A stream that did not end (`ended` false)
/// was held open by a process that escaped the group: what was read is
/// kept, and the cut-off capture says so.
fn collect(ended: bool, capture: &Mutex<Capture>) -> Captured {
    if !ended {
        tracing::warn!(
            "a process outside the worker's group still holds its output open; reporting what was read"
        );
    }
    let mut captured = capture.lock().unwrap_or_else(|e| e.into_inner()).finish();
    if !ended {
        captured.truncated = true;
        captured
            .text
            .push_str("\n[… output cut: a process that left the worker's group held it open …]\n");
    }
    captured
}

/// Runs `main` to its end, polling `side` too until `side` ends.
async fn alongside<T>(main: impl Future<Output = T>, side: impl Future<Output = ()>) -> T {
    let mut main = pin!(main);
    tokio::select! {
        biased;
        out = &mut main => return out,
        () = side => {}
    }
    main.await
}

/// Skips the rest of an overlong line without keeping it, however long it
/// is. False when the stream ended (or failed) first.
async fn skip_line(reader: &mut (impl AsyncBufRead + Unpin)) -> bool {
    loop {
        let buffered = match reader.fill_buf().await {
            Ok([]) | Err(_) => return false,
            Ok(buffered) => buffered,
        };
        let (used, found) = match buffered.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buffered.len(), false),
        };
        reader.consume(used);
        if found {
            return true;
        }
    }
}

/// Queues a progress object for the forwarder without ever waiting on it
/// (the worker must not block on fd 3 while an update is on its way to
/// the server). The forwarder is polled by the same task: when its queue
/// is full, it is given a few turns to take what is queued before this
/// object is given up.
async fn forward(
    sink: &mpsc::Sender<serde_json::Map<String, serde_json::Value>>,
    mut object: serde_json::Map<String, serde_json::Value>,
) {
    for _ in 0..3 {
        match sink.try_send(object) {
            Err(mpsc::error::TrySendError::Full(back)) => object = back,
            _ => return,
        }
        tokio::task::yield_now().await;
    }
    let _ = sink.try_send(object);
}

/// Reads fd 3 to its end: progress objects go to `sink`; the last report
/// line goes to `report_line` as soon as it is read, so that it counts even
/// if fd 3 never ends (held open by a process that left the group). `fd` is
/// the read end of a pipe, already non-blocking.
async fn read_progress(
    fd: OwnedFd,
    sink: Option<mpsc::Sender<serde_json::Map<String, serde_json::Value>>>,
    report_line: &Mutex<Option<serde_json::Value>>,
) {
    let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd) else {
        return;
    };
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    let mut warned = false;
    let mut warned_long = false;
    loop {
        line.clear();
        // Report lines may hold the job's data: read up to their limit.
        let read = (&mut reader)
            .take(MAX_REPORT_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => return,
            // No newline within the limit: skip the rest of the line.
            Ok(_) if line.len() > MAX_REPORT_LINE && line.last() != Some(&b'\n') => {
                if !skip_line(&mut reader).await {
                    return;
                }
                if !warned_long {
                    tracing::warn!(
                        "worker wrote a progress line over {MAX_PROGRESS_LINE} bytes; ignoring such lines"
                    );
                    warned_long = true;
                }
            }
            Ok(_) => match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(serde_json::Value::Object(mut object))
                    if super::report_line::is_report_line(&object) =>
                {
                    *report_line.lock().unwrap_or_else(|e| e.into_inner()) =
                        object.remove(super::report_line::REPORT_KEY);
                }
                // Longer than a progress line may be (its newline aside).
                _ if line.len() - usize::from(line.last() == Some(&b'\n')) > MAX_PROGRESS_LINE => {
                    if !warned_long {
                        tracing::warn!(
                            "worker wrote a progress line over {MAX_PROGRESS_LINE} bytes; ignoring such lines"
                        );
                        warned_long = true;
                    }
                }
                Ok(serde_json::Value::Object(object)) => {
                    if let Some(sink) = &sink {
                        forward(sink, object).await;
                    }
                }
                _ if line.iter().all(u8::is_ascii_whitespace) => {}
                _ => {
                    if !warned {
                        tracing::warn!(
                            "worker wrote a progress line that is not a JSON object; ignoring such lines"
                        );
                        warned = true;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// Whether a process is gone (no `/proc/PID`, or a zombie).
    fn dead(pid: i32) -> bool {
        crate::supervisor::proc_stat::ProcStat::read(pid).is_none_or(|stat| stat.ended())
    }

    /// The runtime's wait on a worker fails when someone else reaped it
    /// (ECHILD). Here the spawn hook reaps it, on the runtime's only thread,
    /// before the runtime can: the wait then fails for real, and the
    /// worker's process group must still be killed.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_wait_on_a_child_still_kills_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().display();
        let program = dir.path().join("worker");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\nsleep 1000 </dev/null >/dev/null 2>&1 &\necho $! > '{o}/left.tmp' && mv '{o}/left.tmp' '{o}/left'\nexit 0\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let launcher = Launcher::spawning_only(tokio::runtime::Handle::current()).unwrap();
        let worker = Arc::new(Mutex::new(None::<u32>));
        let seen = Arc::clone(&worker);
        let spec = WorkerSpec {
            program,
            args: Vec::new(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: dir.path().to_path_buf(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(1),
            output_cap: 1024,
            freeze: None,
            on_spawn: Some(SpawnHook(Arc::new(move |pid| {
                *seen.lock().unwrap() = Some(pid);
                // Bounded by the worker, which exits at once.
                let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
            }))),
        };
        let setup = crate::supervisor::sandbox::ChildSetup::plain();
        let ran = run(&launcher, spec, CancellationToken::new(), None, setup, None).await;
        assert!(
            ran.is_err(),
            "the wait was meant to fail (the worker was reaped by the test): {ran:?}"
        );
        let left: i32 = std::fs::read_to_string(dir.path().join("left"))
            .expect("the worker wrote its background process's pid before exiting")
            .trim()
            .parse()
            .unwrap();
        let start = std::time::Instant::now();
        while !dead(left) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !dead(left) {
            // Still in the worker's group, which outlives its leader: end it
            // by the group this test started.
            let group = worker.lock().unwrap().expect("the worker's pid");
            let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
            panic!(
                "the worker's background process {left} outlived a failed wait: its group was not killed"
            );
        }
    }

    /// A shell worker running `script` in `dir`, with `stdin`.
    fn shell_worker(dir: &std::path::Path, script: &str, stdin: &[u8]) -> WorkerSpec {
        let program = dir.join("worker");
        std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        WorkerSpec {
            program,
            args: Vec::new(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: dir.to_path_buf(),
            stdin: stdin.to_vec(),
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(1),
            output_cap: 1024 * 1024,
            on_spawn: None,
            freeze: None,
        }
    }

    /// The job goes in on stdin, and output many pipes long comes out
    /// whole, both streams at once.
    #[tokio::test(flavor = "current_thread")]
    async fn stdin_goes_in_and_output_longer_than_a_pipe_comes_out_whole() {
        let dir = tempfile::tempdir().unwrap();
        let spec = shell_worker(
            dir.path(),
            "cat\nhead -c 300000 /dev/zero | tr '\\0' x\nhead -c 200000 /dev/zero | tr '\\0' y >&2",
            b"{\"job\":1}\n",
        );
        let launcher = Launcher::spawning_only(tokio::runtime::Handle::current()).unwrap();
        let setup = crate::supervisor::sandbox::ChildSetup::plain();
        let ran = run(&launcher, spec, CancellationToken::new(), None, setup, None)
            .await
            .expect("the worker ran");
        assert_eq!(ran.ending, Ending::Exited(0));
        assert_eq!(ran.stdout.total, 10 + 300_000);
        assert!(!ran.stdout.truncated, "{:?}", ran.stdout.total);
        assert!(ran.stdout.text.starts_with("{\"job\":1}\nxxx"));
        assert_eq!(ran.stdout.text.len(), 10 + 300_000);
        assert_eq!(ran.stderr.total, 200_000);
        assert!(ran.stderr.text.bytes().all(|b| b == b'y'));
    }

    /// A process that left the worker's group and holds its stdout open
    /// does not hold the worker's end up for long: what was read is kept,
    /// and the capture says it was cut.
    #[tokio::test(flavor = "current_thread")]
    async fn output_held_open_by_a_process_that_left_the_group_is_cut_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().display();
        let spec = shell_worker(
            dir.path(),
            &format!(
                "echo before\necho '{{\"jobmgr.report\": {{\"outcome\": \"finish\"}}}}' >&3\nsetsid sh -c 'echo $$ > {o}/escaped.tmp && mv {o}/escaped.tmp {o}/escaped; exec sleep 60' &\nwhile [ ! -e {o}/escaped ]; do sleep 0.01; done\nexit 0"
            ),
            b"",
        );
        let launcher = Launcher::spawning_only(tokio::runtime::Handle::current()).unwrap();
        let setup = crate::supervisor::sandbox::ChildSetup::plain();
        let ran = run(&launcher, spec, CancellationToken::new(), None, setup, None).await;
        let escaped: i32 = std::fs::read_to_string(dir.path().join("escaped"))
            .expect("the worker's escaped process wrote its pid")
            .trim()
            .parse()
            .unwrap();
        // Started by this test's worker, in a session of its own.
        let _ = nix::sys::signal::kill(Pid::from_raw(escaped), Signal::SIGKILL);
        let ran = ran.expect("the worker ran");
        assert_eq!(ran.ending, Ending::Exited(0));
        assert!(ran.stdout.truncated, "{:?}", ran.stdout);
        assert!(ran.stdout.text.starts_with("before\n"), "{:?}", ran.stdout);
        assert!(ran.stdout.text.contains("output cut"), "{:?}", ran.stdout);
        // It holds stderr open too.
        assert!(ran.stderr.truncated, "{:?}", ran.stderr);
        // And fd 3: the report line read before it counts all the same.
        assert_eq!(
            ran.report_line,
            Some(serde_json::json!({"outcome": "finish"})),
            "the worker's report line was lost with the cut"
        );
    }

    /// The forwarder of progress runs in the worker's task: a burst of
    /// more updates than its queue holds waits for it to take them,
    /// rather than losing the latest.
    #[tokio::test(flavor = "current_thread")]
    async fn a_burst_of_progress_longer_than_the_queue_reaches_a_forwarder_in_the_same_task() {
        let (tx, mut rx) = mpsc::channel(64);
        let send = async move {
            for i in 0..1000 {
                let mut object = serde_json::Map::new();
                object.insert("i".into(), i.into());
                forward(&tx, object).await;
            }
        };
        let take = async {
            let mut got = Vec::new();
            while let Some(object) = rx.recv().await {
                got.push(object["i"].as_i64().unwrap());
            }
            got
        };
        let ((), got) = tokio::join!(send, take);
        assert_eq!(got, (0..1000).collect::<Vec<i64>>());
    }

    /// What `read_progress` forwards of `bytes` written to its pipe.
    async fn progress_of(bytes: Vec<u8>) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let writer = std::thread::spawn(move || {
            let _ = std::fs::File::from(write).write_all(&bytes);
        });
        let (tx, mut rx) = mpsc::channel(64);
        read_progress(read, Some(tx), &Mutex::new(None)).await;
        writer.join().unwrap();
        let mut got = Vec::new();
        while let Ok(object) = rx.try_recv() {
            got.push(object);
        }
        got
    }

    #[tokio::test]
    async fn an_overlong_line_is_skipped_whole_and_the_next_one_read() {
        let mut bytes = vec![b'x'; 20 * MAX_PROGRESS_LINE];
        bytes.extend_from_slice(b"\n{\"after\":1}\n");
        let got = progress_of(bytes).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["after"], 1);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_does_not_swallow_the_next() {
        // MAX_PROGRESS_LINE bytes and its newline: read whole, and the
        // line after it too.
        let mut bytes = b"{\"fill\":\"".to_vec();
        bytes.resize(MAX_PROGRESS_LINE - 2, b'x');
        bytes.extend_from_slice(b"\"}\n{\"next\":2}\n");
        let got = progress_of(bytes).await;
        assert_eq!(
            got.len(),
            2,
            "{:?}",
            got.iter().map(|o| o.len()).collect::<Vec<_>>()
        );
        assert_eq!(
            got[0]["fill"].as_str().map(str::len),
            Some(MAX_PROGRESS_LINE - 11)
        );
        assert_eq!(got[1]["next"], 2);
    }

    #[tokio::test]
    async fn garbage_and_non_objects_are_ignored() {
        let mut bytes = b"\xff\xfe\x00garbage\n[1]\nnull\n\"s\"\n{\"a\":\n".to_vec();
        bytes.extend_from_slice(b"{\"ok\":true}\n");
        let got = progress_of(bytes).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["ok"], true);
    }
}
