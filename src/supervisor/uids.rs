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
//! until it is gone. At the end of a job every process of its uid is killed
//! (`kill(-1)` from a helper that has become that uid, which the kernel does
//! atomically with respect to forks) before the lock is let go.
//!
//! Uids that name a user or a group in the user database, or that lie in a
//! subordinate id range (`/etc/subuid`, `/etc/subgid`), are never used; a
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
}

/// Why no uid could be claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortage {
    /// Uids claimed by running jobs (of this or another supervisor).
    pub held: u64,
    /// Uids that are free but for processes still alive.
    pub lingering: Vec<u32>,
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} held by running jobs", self.held)?;
        if !self.lingering.is_empty() {
            write!(
                f,
                ", {:?} kept out of use by processes that outlived their job",
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
        })
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
            if !processes_of(uid).is_empty() {
                shortage.lingering.push(uid);
                continue;
            }
            return Ok(Ok(ClaimedUid { uid, _lock: lock }));
        }
        Ok(Err(shortage))
    }
}

/// Makes the claims directory (mode 0700, its parent 0755) and checks that
/// nobody else could tamper with it: both must be the supervisor's user's,
/// neither writable by everyone, the claims directory by no one else.
fn prepare_lock_dir(dir: &Path) -> Result<(), String> {
    let fail = |what: String| format!("uid claims directory {}: {what}", dir.display());
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
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
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let mut alive = true;
        let mut has = false;
        for line in status.lines() {
            if let Some(state) = line.strip_prefix("State:") {
                alive = !matches!(state.trim_start().chars().next(), Some('Z' | 'X'));
            } else if let Some(uids) = line.strip_prefix("Uid:") {
                has = uids.split_whitespace().any(|u| u.parse::<u32>() == Ok(uid));
            }
        }
        if alive && has {
            pids.push(pid);
        }
    }
    pids
}

/// A uid claimed for one job; the claim ends when this is dropped (use
/// [`ClaimedUid::release`] once processes of it may have run).
#[derive(Debug)]
pub struct ClaimedUid {
    uid: u32,
    _lock: Flock<File>,
}

impl ClaimedUid {
    /// The uid.
    pub fn uid(&self) -> u32 {
        self.uid
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
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Claims a uid from `pool` for a job, waiting while every one is taken,
/// until `stop` is cancelled (then `None`).
pub async fn claim(
    pool: &Arc<UidPool>,
    stop: &CancellationToken,
) -> io::Result<Option<ClaimedUid>> {
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

    /// A process of a uid keeps it out of use; once it is gone the uid is
    /// handed out; a release kills what the uid left behind.
    #[tokio::test]
    async fn a_uid_with_a_live_process_is_not_handed_out_and_a_release_kills_its_processes() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: running a process as another uid needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let uid = 70301;
        let pool = pool_in(dir.path(), "70301");
        let mut stray = std::process::Command::new("sleep")
            .arg("1000")
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        let waited = Instant::now();
        while processes_of(uid).is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the stray never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
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
        let mut left = std::process::Command::new("setsid")
            .args(["sleep", "1000"])
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        let waited = Instant::now();
        while processes_of(uid).is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the leftover never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
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
}
