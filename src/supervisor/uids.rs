//! One uid per running job, in the way of systemd's `DynamicUser=`. When
//! the supervisor runs as root and no `user` is set, each job runs under a
//! uid of its own taken from a configured range (`worker-uids`), with the
//! gid of the same number (unless `group` is set) and no supplementary
//! groups. Jobs then cannot read each other's scratch directory, stdin or
//! environment, nor signal each other.
//!
//! A uid is claimed with an exclusive `flock` on `/run/jobmgr/uids/UID.lock`,
//! held while its job runs: several supervisors on one host sharing a range
//! never hand out the same uid at once, and the lock goes with a supervisor
//! that dies. Under the lock the uid is checked for live processes: one that
//! outlived its job (or a killed supervisor's job) keeps the uid out of use
//! until it is gone. At the end of a job whose cgroups were seen empty,
//! no process of it is left; otherwise every process of its uid is killed
//! (`kill(-1)` from a helper that has become that uid, which the kernel does
//! atomically with respect to forks) before the lock is let go. Then what
//! the uid left outside its scratch directory (files in `/tmp`, `/var/tmp`,
//! `/dev/shm` and the like, System V IPC objects) is removed, a bounded
//! pass (see [`leftovers`](super::leftovers)). A uid let go with no process
//! and nothing of it left says so in its lock file ([`CLEAN`]), and the
//! next claim of it skips the search of `/proc`, the most costly step of a
//! short job. One whose pass did not finish says so ([`LEFT`]) and stays
//! out of use until a later pass (the sweep's, every [`SWEEP_EVERY`]) has
//! removed the rest. This process claims the uids it let go clean first,
//! oldest first, without blocking ([`UidPool::try_claim_recent`]).
//!
//! Uids that name a user or a group in the user database (asked at each
//! claim, or within the last 10 s for a uid claimed again), or that lie in
//! a subordinate id range (`/etc/subuid`, `/etc/subgid`), are never used; a
//! range that overlaps systemd's dynamic users, or holds root, `nobody` or
//! `(uid_t) -1`, is refused.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::libc;
use tokio_util::sync::CancellationToken;

use super::launcher::Launcher;
use super::leftovers::{Budget, Leftovers};

/// The range used unless `worker-uids` says otherwise: the gap systemd
/// documents as unused, between its greeter users (up to 60705) and its
/// dynamic users (from 61184), above every regular user (up to 60000) and
/// within 16 bits.
pub const DEFAULT_WORKER_UIDS: &str = "60706-61183";

/// Where the claims of every supervisor on the host are kept.
pub const LOCK_DIR: &str = "/run/jobmgr/uids";

/// systemd hands these out to `DynamicUser=` services without asking anyone.
const SYSTEMD_DYNAMIC: RangeInclusive<u32> = 61184..=65519;

/// The most uids a range may hold.
const MAX_RANGE: u64 = 65536;

/// What a lock file holds when its uid's last holder let it go with no
/// process of the uid alive (its job's cgroups seen empty, or a search of
/// `/proc` after killing them) and nothing of it left in the places its
/// leftovers are looked for: the next claim needs no search of `/proc`,
/// which is most of a short job's cost to the supervisor. A claim writes
/// [`HELD`] over it first, so a holder that dies (a `kill -9`, a crash)
/// leaves that, and the next claim searches. (Older versions wrote
/// `released clean`, which said nothing of leftovers: such a uid is
/// searched.)
const CLEAN: &[u8] = b"released empty\n";

/// What a lock file holds when its uid's last holder let it go with no
/// process alive but with leftovers its pass could not remove in its
/// budget: no claim takes it; a sweep removes the rest, then marks it
/// [`CLEAN`].
const LEFT: &[u8] = b"leftovers left\n";

/// What a claim writes over [`CLEAN`] (as long, so that the file is never
/// truncated: where `/run` is on a disk, ext4 writes a file truncated to
/// nothing back at its close).
const HELD: &[u8] = b"claimed       \n";

/// How long a release waits for the processes of a uid to be gone.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// An inclusive range of uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// The last uid.
    pub last: u32,
}

impl UidRange {
    /// Parses `"FIRST-LAST"` (or one uid), refusing a range that holds a
    /// uid no job may have.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!("worker-uids {text:?} is not a range of uids like \"{DEFAULT_WORKER_UIDS}\"")
        };
        let (first, last) = text.split_once('-').unwrap_or((text, text));
        let number = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
        let range = UidRange {
            first: number(first)?,
            last: number(last)?,
        };
        if range.first > range.last {
            return Err(bad());
        }
        if range.count() > MAX_RANGE {
            return Err(format!(
                "worker-uids {text:?} holds {} uids; at most {MAX_RANGE} may be used",
                range.count()
            ));
        }
        for (uid, what) in [
            (0, "root"),
            (65534, "nobody"),
            (65535, "(uid_t) -1 of 16-bit programs"),
            (u32::MAX, "(uid_t) -1"),
        ] {
            if range.contains(uid) {
                return Err(format!(
                    "worker-uids {text:?} holds {uid} ({what}); pick a range without it, such as {DEFAULT_WORKER_UIDS}"
                ));
            }
        }
        if range.first <= *SYSTEMD_DYNAMIC.end() && *SYSTEMD_DYNAMIC.start() <= range.last {
            return Err(format!(
                "worker-uids {text:?} overlaps systemd's dynamic users (61184-65519), which systemd hands out without asking jobmgr; pick a range outside it, such as {DEFAULT_WORKER_UIDS}"
            ));
        }
        Ok(range)
    }

    /// How many uids it holds.
    pub fn count(&self) -> u64 {
        u64::from(self.last) - u64::from(self.first) + 1
    }

    /// Whether it holds `uid`.
    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// The uids a supervisor may hand out, and the directory of claims.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    lock_dir: PathBuf,
    /// Whether the gid is the uid's number (so groups of that number are
    /// skipped too).
    same_gid: bool,
    /// Uids of the range the user database or a subordinate range has.
    excluded: Vec<RangeInclusive<u64>>,
    /// Uids this process let go clean, the oldest first, each with when the
    /// user database last said it has no such user or group.
    recent: Recent,
    /// Where what a job's uid leaves is looked for.
    leftovers: Arc<Leftovers>,
    /// The gid of jobs, when it is not their uid's number.
    gid: Option<u32>,
    /// Uids this process let go with leftovers ([`LEFT`]), for the sweep.
    left: Left,
}

/// See [`UidPool::tidy`].
type Left = Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>;

/// See [`UidPool::try_claim_recent`].
type Recent = Arc<std::sync::Mutex<std::collections::VecDeque<(u32, Instant)>>>;

/// How long the user database's word that it has no user (or group) of a
/// uid is taken without asking it again, for a claim that needs no search.
const DATABASE_FRESH: Duration = Duration::from_secs(10);

/// Why no uid could be claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortage {
    /// Uids claimed by running jobs (of this or another supervisor).
    pub held: u64,
    /// Uids that are free but for processes still alive, or for what an
    /// earlier job left that is not removed yet.
    pub lingering: Vec<u32>,
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} held by running jobs", self.held)?;
        if !self.lingering.is_empty() {
            write!(
                f,
                ", {:?} kept out of use by processes that outlived their job or by files they left",
                self.lingering
            )?;
        }
        Ok(())
    }
}

impl UidPool {
    /// Prepares the pool: the claims directory (made if missing, and
    /// refused if anyone but this user could write it), and the uids the
    /// user database and the subordinate id ranges already have.
    pub fn open(range: UidRange, lock_dir: &Path, same_gid: bool) -> Result<Self, String> {
        prepare_lock_dir(lock_dir)?;
        let mut excluded = Vec::new();
        let within = |id: u64| (u64::from(range.first)..=u64::from(range.last)).contains(&id);
        let mut files = vec![("/etc/passwd", 2)];
        if same_gid {
            files.push(("/etc/group", 2));
        }
        for (file, field) in files {
            for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
                if let Some(id) = line
                    .split(':')
                    .nth(field)
                    .and_then(|f| f.parse::<u64>().ok())
                    && within(id)
                {
                    excluded.push(id..=id);
                }
            }
        }
        for file in ["/etc/subuid", "/etc/subgid"] {
            for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
                let mut fields = line.split(':').skip(1);
                let start = fields.next().and_then(|f| f.trim().parse::<u64>().ok());
                let count = fields.next().and_then(|f| f.trim().parse::<u64>().ok());
                if let (Some(start), Some(count)) = (start, count)
                    && count > 0
                {
                    excluded.push(start..=start + count - 1);
                }
            }
        }
        Ok(UidPool {
            range,
            lock_dir: lock_dir.to_path_buf(),
            same_gid,
            excluded,
            recent: Recent::default(),
            leftovers: Arc::new(Leftovers::new(false, false)),
            gid: None,
            left: Left::default(),
        })
    }

    /// Looks for what a job's uid leaves in `leftovers`' places, for jobs
    /// whose gid is `gid` (`None`: their uid's number).
    pub fn leaving(mut self, leftovers: Leftovers, gid: Option<u32>) -> Self {
        self.leftovers = Arc::new(leftovers);
        self.gid = gid;
        self
    }

    /// The gid of a job under `uid`.
    fn gid_of(&self, uid: u32) -> u32 {
        self.gid.unwrap_or(uid)
    }

    /// A claim of `uid` under `lock`.
    fn claimed(&self, uid: u32, lock: Flock<File>, checked: Instant) -> ClaimedUid {
        ClaimedUid {
            uid,
            gid: self.gid_of(uid),
            lock,
            checked,
            recent: Arc::clone(&self.recent),
            leftovers: Arc::clone(&self.leftovers),
            left: Arc::clone(&self.left),
        }
    }

    /// The range.
    pub fn range(&self) -> UidRange {
        self.range
    }

    /// Whether the user database or a subordinate range has `uid`, as read
    /// at start.
    fn excluded(&self, uid: u32) -> bool {
        self.excluded.iter().any(|r| r.contains(&u64::from(uid)))
    }

    /// How many uids of the range may be handed out (those the user
    /// database and the subordinate ranges do not have).
    pub fn usable(&self) -> u64 {
        (self.range.first..=self.range.last)
            .filter(|uid| !self.excluded(*uid))
            .count() as u64
    }

    /// The lock of `uid`, if its lock file exists and no one holds it.
    fn lock_existing(&self, uid: u32) -> Option<Flock<File>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_dir.join(format!("{uid}.lock")))
            .ok()?;
        Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
    }

    /// Claims a uid this process let go clean lately, the one let go
    /// longest ago first (so that jobs go round the range, as random
    /// claims do, rather than one uid passing from job to job what a job
    /// may leave owned by it: files in a shared `/tmp`, IPC objects),
    /// without blocking for long: no search of `/proc` (its lock file says
    /// clean) and no question to the user database (asked within
    /// [`DATABASE_FRESH`]). Only lock files are opened, so the async
    /// threads may call it; `None` when no such uid is free (then
    /// [`UidPool::try_claim`] searches).
    pub fn try_claim_recent(&self) -> Option<ClaimedUid> {
        use std::os::unix::fs::FileExt;
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((uid, checked)) = recent.pop_front() {
            if checked.elapsed() > DATABASE_FRESH || self.excluded(uid) {
                continue;
            }
            let Some(lock) = self.lock_existing(uid) else {
                continue;
            };
            if !released_clean(&lock) || lock.write_all_at(HELD, 0).is_err() {
                continue;
            }
            return Some(self.claimed(uid, lock, checked));
        }
        None
    }

    /// Claims a free uid, starting at a random one so that supervisors
    /// sharing the range rarely try the same. Blocking: locks files and
    /// reads `/proc`.
    pub fn try_claim(&self) -> io::Result<Result<ClaimedUid, Shortage>> {
        let size = self.range.count();
        let start = rand::random_range(0..size);
        let mut shortage = Shortage {
            held: 0,
            lingering: Vec::new(),
        };
        for offset in 0..size {
            let uid = self.range.first + ((start + offset) % size) as u32;
            if self.excluded(uid) || in_user_database(uid, self.same_gid) {
                continue;
            }
            let checked = Instant::now();
            let path = self.lock_dir.join(format!("{uid}.lock"));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => lock,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    shortage.held += 1;
                    continue;
                }
                Err((_, error)) => {
                    return Err(io::Error::other(format!(
                        "cannot lock {}: {error}",
                        path.display()
                    )));
                }
            };
            // Checked under the lock: only a holder of the lock starts
            // processes of this uid, and a release lets go of it after
            // killing them, so what is alive now stays until it dies.
            if !released_clean(&lock) && !self.emptied(uid, &lock) {
                shortage.lingering.push(uid);
                continue;
            }
            // Until this claim ends clean, the uid is not known to be.
            {
                use std::os::unix::fs::FileExt;
                lock.write_all_at(HELD, 0)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            }
            return Ok(Ok(self.claimed(uid, lock, checked)));
        }
        Ok(Err(shortage))
    }

    /// Whether `uid`, whose lock file does not say it was let go clean, has
    /// no process alive and nothing left (a pass of [`Budget::CLAIM`]
    /// removes what an earlier job left, unless its lock says a pass
    /// already could not: that is the sweep's). Marks it [`LEFT`] when the
    /// pass does not finish.
    fn emptied(&self, uid: u32, lock: &File) -> bool {
        use std::os::unix::fs::FileExt;
        if left_behind(lock) || !processes_of(uid).is_empty() {
            return false;
        }
        let removal = self.leftovers.remove(uid, self.gid_of(uid), Budget::CLAIM);
        if removal.finished() {
            return true;
        }
        if lock.write_all_at(LEFT, 0).is_ok() {
            self.left
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid);
        }
        false
    }
}

/// Whether the lock file of a uid says its last holder let it go clean.
fn released_clean(lock: &File) -> bool {
    says(lock, CLEAN)
}

/// Whether the lock file of a uid says what its last holder left could not
/// all be removed.
fn left_behind(lock: &File) -> bool {
    says(lock, LEFT)
}

fn says(lock: &File, mark: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut bytes = [0u8; 32];
    matches!(lock.read_at(&mut bytes, 0), Ok(n) if &bytes[..n] == mark)
}

/// Makes the claims directory (mode 0700, its parent 0755) and checks that
/// nobody else could tamper with it: both must be the supervisor's user's,
/// neither writable by everyone, the claims directory by no one else.
fn prepare_lock_dir(dir: &Path) -> Result<(), String> {
    let fail = |what: String| format!("uid claims directory {}: {what}", dir.display());
    if let Some(parent) = dir.parent() {
        super::dirs::make(parent, 0o755, 0o755)
            .map_err(|e| fail(format!("cannot create {}: {e}", parent.display())))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create it: {e}"))),
    }
    let me = nix::unistd::geteuid().as_raw();
    // The parent may be shared with a group (a socket beside it, say), but
    // the claims themselves are the supervisor's user's alone.
    let parent = dir.parent().map(|p| (p, 0o002));
    for (path, others) in parent.into_iter().chain([(dir, 0o022)]) {
        let metadata = std::fs::symlink_metadata(path).map_err(|e| fail(e.to_string()))?;
        if !metadata.is_dir() {
            return Err(fail(format!("{} is not a directory", path.display())));
        }
        if metadata.uid() != me || metadata.mode() & others != 0 {
            return Err(fail(format!(
                "{} could be changed by another user; it must belong to the supervisor's user and be writable by nobody else",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Whether the user database (any NSS source) has `uid` as a user, or as
/// a group when the gid is the uid's number.
fn in_user_database(uid: u32, same_gid: bool) -> bool {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
    if !matches!(user, Ok(None)) {
        return true;
    }
    same_gid
        && !matches!(
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(uid)),
            Ok(None)
        )
}

/// The pids of live processes (not zombies) with `uid` as their real,
/// effective, saved or filesystem uid.
pub fn processes_of(uid: u32) -> Vec<i32> {
    live_processes()
        .filter(|(_, uids)| uids.contains(&uid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Every live process (not a zombie) in `/proc`, with its real, effective,
/// saved and filesystem uids.
fn live_processes() -> impl Iterator<Item = (i32, Vec<u32>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let mut alive = true;
            let mut uids = Vec::new();
            for line in status.lines() {
                if let Some(state) = line.strip_prefix("State:") {
                    alive = !matches!(state.trim_start().chars().next(), Some('Z' | 'X'));
                } else if let Some(ids) = line.strip_prefix("Uid:") {
                    uids = ids
                        .split_whitespace()
                        .filter_map(|u| u.parse().ok())
                        .collect();
                }
            }
            alive.then_some((pid, uids))
        })
}

/// A uid claimed for one job; the claim ends when this is dropped (use
/// [`ClaimedUid::release`] once processes of it may have run).
#[derive(Debug)]
pub struct ClaimedUid {
    uid: u32,
    /// The job's gid.
    gid: u32,
    lock: Flock<File>,
    /// When the user database last said it has no such user.
    checked: Instant,
    /// Where a clean release puts the uid for the next claim.
    recent: Recent,
    /// Where what the job leaves is looked for.
    leftovers: Arc<Leftovers>,
    /// Where a release with leftovers puts the uid for the sweep.
    left: Left,
}

impl ClaimedUid {
    /// The uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Lets the uid go without looking for its processes: for a job whose
    /// cgroups were seen empty at its end ([`JobSandbox::end`]), which
    /// holds every process the job started (a search of `/proc` per job
    /// is most of the supervisor's CPU for a short job). What the job left
    /// is removed first ([`ClaimedUid::tidy`]), off the async threads when
    /// there is a runtime: the uid stays claimed meanwhile, and the job
    /// need not wait.
    ///
    /// [`JobSandbox::end`]: super::sandbox::JobSandbox::end
    pub fn release_emptied(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || self.tidy())),
            Err(_) => self.tidy(),
        }
    }

    /// Removes what the job left outside its scratch directory (a pass of
    /// [`Budget::RELEASE`]) and lets the uid go: clean when nothing is
    /// left, [`LEFT`] otherwise. No process of the uid may be alive.
    /// Blocking.
    fn tidy(self) {
        use std::os::unix::fs::FileExt;
        let removal = self.leftovers.remove(self.uid, self.gid, Budget::RELEASE);
        if removal.finished() {
            return self.mark_clean();
        }
        tracing::warn!(
            uid = self.uid,
            removed = removal.removed,
            why = removal.unfinished.as_deref().unwrap_or_default(),
            "the job's uid left more than one pass removes; no job gets this uid until a later pass has removed the rest"
        );
        if self.lock.write_all_at(LEFT, 0).is_ok() {
            self.left
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.uid);
        }
    }

    /// Says in the lock file that no process of the uid is alive and
    /// nothing of it is left, and lets the uid go. A failed write leaves
    /// the file as the claim made it: the next claim searches.
    fn mark_clean(self) {
        use std::os::unix::fs::FileExt;
        if self.lock.write_all_at(CLEAN, 0).is_ok() {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.push_back((self.uid, self.checked));
        }
    }

    /// Kills every process of the uid, waits for them to be gone, and lets
    /// the uid go. Returns the pids still alive after a wait: the uid stays
    /// out of use (for every supervisor) until they are gone. Blocking.
    pub fn release(self, launcher: &Launcher) -> Vec<i32> {
        if let Err(error) = launcher.kill_uid(self.uid) {
            tracing::warn!(uid = self.uid, %error, "cannot kill the processes left by the job's uid");
        }
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            let left = processes_of(self.uid);
            if left.is_empty() {
                self.tidy();
                return left;
            }
            if Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How often a supervisor looks over `/proc` for processes of its range
/// that no job holds ([`UidPool::sweep`]).
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

impl UidPool {
    /// Looks over `/proc` once for live processes whose uid is in the range
    /// while no claim holds it (none of ours: something else runs as a uid
    /// of the range, or escaped its job), and marks each such uid's lock
    /// file held, so that its next claim searches `/proc` again and waits
    /// for them. Returns those uids. Blocking.
    pub fn sweep(&self) -> Vec<u32> {
        use std::os::unix::fs::FileExt;
        let mut found = Vec::new();
        for uid in uids_in_use(self.range) {
            // None: never claimed here (a claim of it searches anyway), or
            // a job holds it (its processes are its own).
            let Some(lock) = self.lock_existing(uid) else {
                continue;
            };
            if released_clean(&lock) && lock.write_all_at(HELD, 0).is_ok() {
                found.push(uid);
            }
        }
        found
    }
}

impl UidPool {
    /// Removes what jobs left under the uids marked [`LEFT`] that no claim
    /// holds and no process runs as (a pass of [`Budget::RELEASE`] each),
    /// marking each one finished [`CLEAN`]: those this process marked, or
    /// with `every`, every one of the range. Returns the uids made clean.
    /// Blocking.
    pub fn tidy(&self, every: bool) -> Vec<u32> {
        use std::os::unix::fs::FileExt;
        let uids: Vec<u32> = if every {
            (self.range.first..=self.range.last).collect()
        } else {
            let left = self.left.lock().unwrap_or_else(|e| e.into_inner());
            left.iter().copied().collect()
        };
        let mut cleaned = Vec::new();
        for uid in uids {
            let Some(lock) = self.lock_existing(uid) else {
                continue;
            };
            if !left_behind(&lock) {
                // Tidied by another supervisor's claim or sweep.
                self.left
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&uid);
                continue;
            }
            if !processes_of(uid).is_empty() {
                continue;
            }
            let removal = self
                .leftovers
                .remove(uid, self.gid_of(uid), Budget::RELEASE);
            let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
            if removal.finished() && lock.write_all_at(CLEAN, 0).is_ok() {
                left.remove(&uid);
                cleaned.push(uid);
            } else {
                left.insert(uid);
            }
        }
        cleaned
    }
}

/// Sweeps `pool` every [`SWEEP_EVERY`] for as long as the task runs.
pub async fn keep_swept(pool: Arc<UidPool>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        sweep(&pool, false).await;
    }
}

/// Sweeps `pool` once, off the async threads, logging what it finds, and
/// removes what jobs left under any uid of its range marked [`LEFT`].
pub async fn sweep_now(pool: &Arc<UidPool>) {
    sweep(pool, true).await;
}

/// Sweeps `pool` ([`UidPool::sweep`]) and tidies it ([`UidPool::tidy`],
/// every uid of the range with `every`).
async fn sweep(pool: &Arc<UidPool>, every: bool) {
    let sweeping = Arc::clone(pool);
    let swept = tokio::task::spawn_blocking(move || (sweeping.sweep(), sweeping.tidy(every))).await;
    let Ok((found, cleaned)) = swept else {
        return;
    };
    if !found.is_empty() {
        tracing::warn!(
            uids = ?found,
            "processes run as uids of worker-uids that no job of this supervisor holds; those uids are searched again before they are next handed out (is something else using this range?)"
        );
    }
    if !cleaned.is_empty() {
        tracing::info!(uids = ?cleaned, "removed the rest of what jobs left under these uids; they are handed out again");
    }
}

/// The uids of `range` that live processes (not zombies) have as their
/// real, effective, saved or filesystem uid, from one look over `/proc`.
fn uids_in_use(range: UidRange) -> std::collections::BTreeSet<u32> {
    live_processes()
        .flat_map(|(_, uids)| uids)
        .filter(|uid| (range.first..=range.last).contains(uid))
        .collect()
}

/// Claims a uid from `pool` for a job, waiting while every one is taken,
/// until `stop` is cancelled (then `None`).
pub async fn claim(
    pool: &Arc<UidPool>,
    stop: &CancellationToken,
) -> io::Result<Option<ClaimedUid>> {
    if let Some(claimed) = pool.try_claim_recent() {
        return Ok(Some(claimed));
    }
    let mut warned = false;
    loop {
        let trying = Arc::clone(pool);
        let claimed = tokio::task::spawn_blocking(move || trying.try_claim())
            .await
            .map_err(io::Error::other)??;
        let shortage = match claimed {
            Ok(claimed) => return Ok(Some(claimed)),
            Err(shortage) => shortage,
        };
        if !warned {
            tracing::warn!(
                worker_uids = %pool.range(),
                "no free uid for the job ({shortage}); waiting for one (widen worker-uids if supervisors on this host run more jobs at once than it holds)"
            );
            warned = true;
        }
        let wait = Duration::from_millis(50 + rand::random_range(0..100));
        tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Makes this (forked) process `uid` with no capabilities, then sends
/// SIGKILL to every process it may signal, which is every process of that
/// uid. Exits 0 when it did, 1 when it could not become `uid`.
///
/// # Safety
/// Call only in a child of `fork`, which it ends.
pub(crate) unsafe fn kill_every_process_as(uid: u32) -> ! {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    // SAFETY: plain system calls on values on this stack; no allocation.
    unsafe {
        if uid == 0 || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            libc::_exit(1);
        }
        // Whatever the securebits, nothing may be left to signal others
        // with.
        let header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &header as *const CapHeader, none.as_ptr()) != 0 {
            libc::_exit(1);
        }
        if libc::getuid() != uid || libc::geteuid() != uid {
            libc::_exit(1);
        }
        libc::kill(-1, libc::SIGKILL);
        libc::_exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_what_no_job_may_have() {
        assert_eq!(
            UidRange::parse(DEFAULT_WORKER_UIDS).unwrap(),
            UidRange {
                first: 60706,
                last: 61183
            }
        );
        assert_eq!(UidRange::parse(" 70000 ").unwrap().count(), 1);
        assert_eq!(
            UidRange::parse("70000-70009").unwrap().to_string(),
            "70000-70009"
        );
        for (text, says) in [
            ("", "not a range"),
            ("a-b", "not a range"),
            ("10-5", "not a range"),
            ("-5", "not a range"),
            ("0-100", "root"),
            ("65000-65100", "systemd"),
            ("61100-61199", "systemd"),
            ("65534", "nobody"),
            ("65535-65600", "16-bit"),
            ("100000-300000", "at most"),
            ("4294967200-4294967295", "(uid_t) -1"),
        ] {
            let error = UidRange::parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    fn pool_in(dir: &Path, range: &str) -> UidPool {
        UidPool::open(UidRange::parse(range).unwrap(), &dir.join("uids"), true).unwrap()
    }

    /// A pool of `range` in a fresh directory, for a test that runs
    /// processes as other uids; `None` (the skip said) unless root.
    fn pool_as_root(range: &str) -> Option<(tempfile::TempDir, UidPool)> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: running a process as another uid needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let pool = pool_in(dir.path(), range);
        Some((dir, pool))
    }

    #[test]
    fn a_claimed_uid_is_not_claimed_again_until_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        // Two pools on one directory: as two supervisors on one host.
        let one = pool_in(dir.path(), "70100-70101");
        let two = pool_in(dir.path(), "70100-70101");
        let a = one.try_claim().unwrap().unwrap();
        let b = two.try_claim().unwrap().unwrap();
        assert_ne!(a.uid(), b.uid());
        let none = one.try_claim().unwrap().unwrap_err();
        assert_eq!(none.held, 2, "{none}");
        let freed = a.uid();
        drop(a);
        assert_eq!(two.try_claim().unwrap().unwrap().uid(), freed);
    }

    #[test]
    fn uids_of_users_and_groups_are_never_handed_out() {
        let dir = tempfile::tempdir().unwrap();
        // Uid 0 cannot be in a range; the parse refuses it. A range holding
        // a user that exists everywhere: nobody is refused too, so look for
        // a real account in /etc/passwd above 0.
        let Some(uid) = std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(':').nth(2)?.parse::<u32>().ok())
            .find(|&u| u > 0 && UidRange::parse(&u.to_string()).is_ok())
        else {
            eprintln!("SKIPPED: no account in /etc/passwd to test with");
            return;
        };
        let pool = pool_in(dir.path(), &uid.to_string());
        assert_eq!(pool.usable(), 0);
        assert!(pool.try_claim().unwrap().is_err());
    }

    #[test]
    fn a_claims_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let claims = dir.path().join("uids");
        std::fs::create_dir(&claims).unwrap();
        std::fs::set_permissions(&claims, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = UidPool::open(UidRange::parse("70200").unwrap(), &claims, true).unwrap_err();
        assert!(error.contains("another user"), "{error}");
    }

    /// `sleep 1000` (after `prefix`, say `setsid`) as `uid`, once it is
    /// seen among the uid's processes.
    fn started_as(uid: u32, prefix: &[&str]) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut words: Vec<&str> = prefix.to_vec();
        words.extend(["sleep", "1000"]);
        let child = std::process::Command::new(words[0])
            .args(&words[1..])
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        let waited = Instant::now();
        while processes_of(uid).is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the process of uid {uid} never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// A process of a uid keeps it out of use; once it is gone the uid is
    /// handed out; a release kills what the uid left behind.
    #[tokio::test]
    async fn a_uid_with_a_live_process_is_not_handed_out_and_a_release_kills_its_processes() {
        let uid = 70301;
        let Some((_dir, pool)) = pool_as_root("70301") else {
            return;
        };
        let mut stray = started_as(uid, &[]);
        let shortage = pool.try_claim().unwrap().unwrap_err();
        assert_eq!(shortage.lingering, vec![uid]);
        let _ = stray.kill();
        let _ = stray.wait();
        let claimed = pool
            .try_claim()
            .unwrap()
            .expect("free once the stray is gone");
        assert_eq!(claimed.uid(), uid);

        // A process the job left behind, in a session of its own.
        let mut left = started_as(uid, &["setsid"]);
        let launcher = Launcher::spawning_only(tokio::runtime::Handle::current()).unwrap();
        let alive = tokio::task::spawn_blocking(move || claimed.release(&launcher))
            .await
            .unwrap();
        let survived = !processes_of(uid).is_empty();
        let _ = left.kill();
        let _ = left.wait();
        assert!(alive.is_empty() && !survived, "still alive: {alive:?}");
        assert!(pool.try_claim().unwrap().is_ok());
    }

    /// A process of a uid let go clean, which no claim holds, is found by
    /// the sweep, and the uid is searched again (and refused) at its next
    /// claim; a uid a claim holds is left to its job.
    #[test]
    fn the_sweep_has_a_uid_with_a_stray_process_searched_again() {
        let Some((_dir, pool)) = pool_as_root("70601-70602") else {
            return;
        };
        let (a, b) = (
            pool.try_claim().unwrap().unwrap(),
            pool.try_claim().unwrap().unwrap(),
        );
        let (stray_uid, held_uid) = (a.uid(), b.uid());
        a.release_emptied();
        let (mut stray, mut held) = (started_as(stray_uid, &[]), started_as(held_uid, &[]));
        let found = pool.sweep();
        let recent = pool.try_claim_recent().map(|c| c.uid());
        let claimed = pool.try_claim().unwrap().map(|c| c.uid());
        for child in [&mut stray, &mut held] {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(b);
        assert_eq!(found, vec![stray_uid]);
        assert_eq!(
            recent, None,
            "the swept uid was handed out without a search"
        );
        assert!(claimed.is_err(), "{claimed:?}");
    }

    /// Randomized: threads of two pools (two supervisors) on one claims
    /// directory claim uids, by a search or from their recent list, and let
    /// them go clean or drop them, at random. Counts violations: a uid held
    /// twice at once, or handed out from a recent list when its last claim
    /// did not end clean. None is allowed.
    #[test]
    fn randomized_claims_never_hold_a_uid_twice_nor_trust_a_claim_that_did_not_end_clean() {
        use rand::{Rng, SeedableRng};
        use std::collections::{HashMap, HashSet};
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let pools = [
            Arc::new(pool_in(dir.path(), "70700-70704")),
            Arc::new(pool_in(dir.path(), "70700-70704")),
        ];
        let held = Arc::new(Mutex::new(HashSet::new()));
        // Per uid: whether its last claim ended clean.
        let ended_clean = Arc::new(Mutex::new(HashMap::new()));
        let violations = Arc::new(AtomicUsize::new(0));
        let claims = Arc::new(AtomicUsize::new(0));
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let pools = pools.clone();
                let (held, ended_clean) = (Arc::clone(&held), Arc::clone(&ended_clean));
                let (violations, claims) = (Arc::clone(&violations), Arc::clone(&claims));
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t);
                    for _ in 0..300 {
                        let pool = &pools[rng.random_range(0..2)];
                        let from_recent = rng.random_bool(0.5);
                        let claimed = if from_recent {
                            pool.try_claim_recent()
                        } else {
                            pool.try_claim().unwrap().ok()
                        };
                        let Some(claimed) = claimed else {
                            continue;
                        };
                        claims.fetch_add(1, Ordering::SeqCst);
                        let uid = claimed.uid();
                        if !held.lock().unwrap().insert(uid) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        if from_recent && ended_clean.lock().unwrap().get(&uid) != Some(&true) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        if rng.random_bool(0.5) {
                            std::thread::yield_now();
                        }
                        let clean = rng.random_bool(0.5);
                        ended_clean.lock().unwrap().insert(uid, clean);
                        held.lock().unwrap().remove(&uid);
                        if clean {
                            claimed.release_emptied();
                        } else {
                            drop(claimed);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let claims = claims.load(Ordering::SeqCst);
        assert!(claims > 100, "only {claims} claims were made (seed {seed})");
        assert_eq!(
            violations.load(Ordering::SeqCst),
            0,
            "violations in {claims} claims (seed {seed})"
        );
    }

    /// What a job leaves outside its scratch directory goes before its uid
    /// is let go clean; what a pass cannot remove keeps the uid out of use
    /// (no claim takes it) until a sweep's pass has removed it.
    #[test]
    fn a_uid_is_let_go_clean_only_once_what_its_job_left_is_removed() {
        use std::os::unix::fs::PermissionsExt;
        let uid = 70821;
        let Some((dir, pool)) = pool_as_root("70821") else {
            return;
        };
        let place = dir.path().join("tmp");
        std::fs::create_dir(&place).unwrap();
        std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let pool = pool.leaving(Leftovers::only(&[&place]), None);
        let lock = dir.path().join("uids").join(format!("{uid}.lock"));
        let of_uid = |path: &Path| {
            std::fs::write(path, "secret").unwrap();
            std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
        };

        let claimed = pool.try_claim().unwrap().unwrap();
        of_uid(&place.join("secret"));
        claimed.release_emptied();
        assert!(!place.join("secret").exists(), "the job's file outlived it");
        assert_eq!(std::fs::read(&lock).unwrap(), CLEAN);

        // Another's writable directories, nested deeper than a pass goes,
        // with a file of the uid's at the bottom: the pass cannot finish.
        let claimed = pool.try_claim_recent().expect("let go clean");
        let mut deep = place.clone();
        for level in 0..=super::super::leftovers::MAX_DEPTH {
            deep = deep.join(format!("d{level}"));
            std::fs::create_dir(&deep).unwrap();
            std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        of_uid(&deep.join("secret"));
        claimed.release_emptied();
        assert_eq!(std::fs::read(&lock).unwrap(), LEFT);
        assert!(pool.try_claim_recent().is_none());
        let shortage = pool.try_claim().unwrap().unwrap_err();
        assert_eq!(shortage.lingering, vec![uid]);
        assert!(
            pool.tidy(false).is_empty(),
            "tidied with the file still there"
        );

        // Once the tree is gone (its owner moved the file out and removed
        // it), the sweep's pass removes the file and the uid is handed out
        // again.
        std::fs::rename(deep.join("secret"), place.join("moved")).unwrap();
        std::fs::remove_dir_all(place.join("d0")).unwrap();
        assert_eq!(pool.tidy(false), vec![uid]);
        assert!(!place.join("moved").exists());
        assert_eq!(std::fs::read(&lock).unwrap(), CLEAN);
        assert!(pool.try_claim().unwrap().is_ok());
    }

    /// A uid this process let go clean is claimed again first, without a
    /// search; one claimed elsewhere meanwhile, or let go any other way, is
    /// not.
    #[test]
    fn a_uid_let_go_clean_is_claimed_again_first_and_only_while_free_and_clean() {
        let dir = tempfile::tempdir().unwrap();
        let one = pool_in(dir.path(), "70500");
        let two = pool_in(dir.path(), "70500");
        let first = one.try_claim().unwrap().unwrap();
        let uid = first.uid();
        first.release_emptied();
        let again = one.try_claim_recent().expect("the uid let go clean");
        assert_eq!(again.uid(), uid);
        // Dropped without a clean release: not offered again.
        drop(again);
        assert!(one.try_claim_recent().is_none());
        // Let go clean, then held by another supervisor: not offered.
        let third = one.try_claim().unwrap().unwrap();
        let uid = third.uid();
        third.release_emptied();
        let other = two.try_claim().unwrap().expect("the uid is free");
        assert_eq!(other.uid(), uid);
        assert!(one.try_claim_recent().is_none());
        drop(other);
    }

    /// A uid let go clean is handed out again without a search of `/proc`
    /// (a process of it started afterwards, which no job of ours could
    /// have left, goes unseen); a claim that ended any other way (its
    /// holder dropped it, as a killed supervisor does) leaves the next
    /// claim to search.
    #[test]
    fn a_uid_let_go_clean_is_claimed_without_a_search_and_any_other_end_is_searched() {
        let uid = 70401;
        let Some((dir, pool)) = pool_as_root("70401") else {
            return;
        };
        let lock = dir.path().join("uids").join(format!("{uid}.lock"));
        pool.try_claim().unwrap().unwrap().release_emptied();
        assert_eq!(std::fs::read(&lock).unwrap(), CLEAN);
        let mut stray = started_as(uid, &[]);
        let trusted = pool.try_claim().unwrap();
        // The claim marks the file held: dropped (not let go clean), it
        // leaves the uid to be searched.
        let marked = std::fs::read(&lock).unwrap();
        let trusted = trusted.map(drop);
        let searched = pool.try_claim().unwrap();
        let _ = stray.kill();
        let _ = stray.wait();
        assert!(
            trusted.is_ok(),
            "a uid let go clean was searched for processes"
        );
        assert_eq!(marked, HELD);
        assert!(
            searched.is_err(),
            "a uid whose last claim was dropped was handed out with a process alive"
        );
        let claimed = pool
            .try_claim()
            .unwrap()
            .expect("free once the stray is gone");
        drop(claimed);
    }
}
