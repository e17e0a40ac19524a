//! What a job's uid leaves outside its scratch directory, removed before
//! the uid is let go (see [`uids`](super::uids)), so that the next job
//! under the same uid cannot read it:
//!
//! - files, directories, sockets, fifos and symlinks it owns in the
//!   places every job may write ([`PLACES`]: `/tmp` unless each job has a
//!   `/tmp` of its own, `/var/tmp`, `/dev/shm` with POSIX shared memory and
//!   semaphores, `/dev/mqueue` with POSIX message queues where it is
//!   mounted, `/run/lock`), and in every directory in them it could write
//!   (writable by others, or by its group);
//! - its System V shared memory segments, semaphore sets and message
//!   queues (owned or created by it, as `/proc/sysvipc/*` list them).
//!
//! (The kernel keyrings it keeps for the uid are emptied by each worker
//! under a uid of its own before its exec: see the
//! [`sandbox`](super::sandbox).)
//!
//! The removal is hostile-proof. Each step is relative to an open
//! directory and opens the next with `O_NOFOLLOW`, so a symlink is removed,
//! never followed; it stays on its place's file system; it never removes
//! what another uid owns: a directory of the uid's that holds another's
//! file is kept, with that file, and given to root (the uid owns nothing in
//! it then), and a directory of the uid's is made 0700 before it is gone
//! over, so that no one else can swap entries in it meanwhile. It is
//! bounded: a pass looks at no more than its [`Budget`]'s entries and for
//! no longer than its time, and holds at most [`MAX_DEPTH`] directories
//! open (a tree of the uid's deeper than that is moved up, a level at a
//! time, into its top directory). What a pass leaves (a million files, a
//! deep tree of another's writable directories) keeps the uid out of use
//! until a later pass has removed it.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::libc;
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

/// The places a job may leave files in, besides its scratch directory.
pub const PLACES: [&str; 5] = ["/tmp", "/var/tmp", "/dev/shm", MQUEUE, "/run/lock"];

/// Where POSIX message queues are seen (where it is mounted).
const MQUEUE: &str = "/dev/mqueue";

/// The most directories a pass holds open at once, one per level.
pub const MAX_DEPTH: usize = 16;

/// How much one pass may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Entries looked at (each one costs a `stat` and maybe a removal).
    pub entries: usize,
    /// Time.
    pub time: Duration,
}

impl Budget {
    /// A pass at a job's end, off the async threads, while the uid waits:
    /// about a second's removals.
    pub const RELEASE: Budget = Budget {
        entries: 100_000,
        time: Duration::from_secs(2),
    };

    /// A pass at a claim, which a job waits for: a uid it does not finish
    /// is passed over, and left to the sweep.
    pub const CLAIM: Budget = Budget {
        entries: 5_000,
        time: Duration::from_millis(200),
    };
}

/// Where a uid's leftovers are looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftovers {
    places: Vec<PathBuf>,
    sysvipc: PathBuf,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// Entries and IPC objects removed.
    pub removed: usize,
    /// Directories of the uid's kept for another's files in them, given to
    /// root.
    pub given_to_root: usize,
    /// Why something of the uid's is still there, if it is.
    pub unfinished: Option<String>,
}

impl Removal {
    /// Whether nothing of the uid's is left in the places or as IPC.
    pub fn finished(&self) -> bool {
        self.unfinished.is_none()
    }
}

impl Leftovers {
    /// The places of [`PLACES`] a job can write: with a read-only file
    /// system (Landlock) only `/dev/mqueue` (`mq_open` makes a queue
    /// without a path Landlock sees), with a private `/tmp` all but `/tmp`.
    pub fn new(private_tmp: bool, read_only: bool) -> Self {
        let places = PLACES
            .iter()
            .filter(|p| !read_only || **p == MQUEUE)
            .filter(|p| !(private_tmp && **p == "/tmp"))
            .map(PathBuf::from)
            .collect();
        Leftovers {
            places,
            sysvipc: PathBuf::from("/proc/sysvipc"),
        }
    }

    /// These places, and no IPC (for tests).
    pub fn only(places: &[&Path]) -> Self {
        Leftovers {
            places: places.iter().map(|p| p.to_path_buf()).collect(),
            sysvipc: PathBuf::new(),
        }
    }

    /// Removes what `uid` (whose gid is `gid`) owns in the places, and its
    /// System V IPC objects, within `budget`. Blocking.
    pub fn remove(&self, uid: u32, gid: u32, budget: Budget) -> Removal {
        let mut pass = Pass {
            uid,
            gid,
            dev: 0,
            entries_left: budget.entries,
            deadline: Instant::now() + budget.time,
            moved_up: 0,
            done: Removal::default(),
        };
        for place in &self.places {
            pass.place(place);
        }
        if !self.sysvipc.as_os_str().is_empty() {
            pass.sysvipc(&self.sysvipc);
        }
        pass.done
    }
}

/// One pass over the places.
struct Pass {
    uid: u32,
    gid: u32,
    /// The file system of the place being gone over.
    dev: u64,
    entries_left: usize,
    deadline: Instant,
    /// Directories moved up into the top directory being removed.
    moved_up: usize,
    done: Removal,
}

/// What a directory entry is, read without following it.
struct Entry {
    name: CString,
    stat: FileStat,
}

impl Entry {
    fn is_dir(&self) -> bool {
        SFlag::from_bits_truncate(self.stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
    }
}

impl Pass {
    fn unfinished(&mut self, why: String) {
        if self.done.unfinished.is_none() {
            self.done.unfinished = Some(why);
        }
    }

    /// Takes one entry from the budget; false (and the pass unfinished)
    /// once it is spent.
    fn spend(&mut self) -> bool {
        if self.entries_left == 0 || Instant::now() > self.deadline {
            self.unfinished("the pass's budget was spent".into());
            return false;
        }
        self.entries_left -= 1;
        true
    }

    /// Goes over one place.
    fn place(&mut self, place: &Path) {
        let dir = match nix::fcntl::open(place, dir_flags(), Mode::empty()) {
            Ok(dir) => dir,
            // Not here (no /dev/mqueue mounted, say), or not a directory.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return,
            Err(e) => return self.unfinished(format!("{}: {e}", place.display())),
        };
        let stat = match fstat(&dir) {
            Ok(stat) => stat,
            Err(e) => return self.unfinished(format!("{}: {e}", place.display())),
        };
        if stat.st_uid == self.uid {
            return self.unfinished(format!("{} itself belongs to the uid", place.display()));
        }
        self.dev = stat.st_dev;
        self.others(&dir, place, 0);
    }

    /// The entries of `dir` (at most the budget's worth), names and stats,
    /// read before any is changed. The listing is of the open directory
    /// itself (through `/proc/self/fd`), never of a path.
    fn entries(&mut self, dir: &OwnedFd, path: &Path) -> Vec<Entry> {
        use std::os::fd::AsRawFd;
        let listing = match std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(listing) => listing,
            Err(e) => {
                self.unfinished(format!("{}: {e}", path.display()));
                return Vec::new();
            }
        };
        let mut entries = Vec::new();
        for entry in listing {
            let Ok(entry) = entry else {
                self.unfinished(format!("{}: cannot be listed", path.display()));
                break;
            };
            if !self.spend() {
                break;
            }
            let Ok(name) = CString::new(entry.file_name().as_bytes()) else {
                continue;
            };
            match fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => entries.push(Entry { name, stat }),
                Err(Errno::ENOENT) => {}
                Err(e) => self.unfinished(format!("{}: {e}", shown(path, &name).display())),
            }
        }
        entries
    }

    /// Whether the uid could make entries in a directory of another's
    /// (ACLs aside): it is writable and searchable by others, or by the
    /// uid's group.
    fn writable(&self, stat: &FileStat) -> bool {
        let mode = stat.st_mode;
        (mode & 0o003 == 0o003) || (stat.st_gid == self.gid && mode & 0o030 == 0o030)
    }

    /// Goes over `dir`, a directory of another's (or a place): removes the
    /// uid's entries, and goes into the directories the uid could write.
    fn others(&mut self, dir: &OwnedFd, path: &Path, depth: usize) {
        for entry in self.entries(dir, path) {
            // Another's file, the most of a place, is passed over at once.
            let ours = entry.stat.st_uid == self.uid;
            let writable_dir =
                entry.is_dir() && entry.stat.st_dev == self.dev && self.writable(&entry.stat);
            if !ours && !writable_dir {
                continue;
            }
            let at = shown(path, &entry.name);
            if ours {
                self.remove(dir, &entry, &at, depth + 1, None);
            } else {
                if depth + 1 >= MAX_DEPTH {
                    self.unfinished(format!(
                        "{}: writable directories of others nested deeper than {MAX_DEPTH}",
                        at.display()
                    ));
                    continue;
                }
                if let Some(sub) = self.open_as(dir, &entry, &at) {
                    self.others(&sub, &at, depth + 1);
                }
            }
        }
    }

    /// Opens the directory `entry` of `dir`, if it is still the one read
    /// (owner and inode); else the pass is unfinished.
    fn open_as(&mut self, dir: &OwnedFd, entry: &Entry, at: &Path) -> Option<OwnedFd> {
        let opened = openat(dir, entry.name.as_c_str(), dir_flags(), Mode::empty())
            .and_then(|sub| Ok((fstat(&sub)?, sub)));
        match opened {
            Ok((stat, sub))
                if stat.st_ino == entry.stat.st_ino
                    && stat.st_dev == entry.stat.st_dev
                    && stat.st_uid == entry.stat.st_uid =>
            {
                Some(sub)
            }
            Ok(_) => {
                self.unfinished(format!("{}: changed while it was looked at", at.display()));
                None
            }
            // Gone meanwhile: nothing of it to remove.
            Err(Errno::ENOENT) => None,
            Err(e) => {
                self.unfinished(format!("{}: {e}", at.display()));
                None
            }
        }
    }

    /// Removes the uid's entry `entry` of `dir`: a directory with what the
    /// uid has in it. `top`: the uid's outermost directory this one is in,
    /// and its depth.
    fn remove(
        &mut self,
        dir: &OwnedFd,
        entry: &Entry,
        at: &Path,
        depth: usize,
        top: Option<(&OwnedFd, usize)>,
    ) {
        if !entry.is_dir() {
            match unlinkat(dir, entry.name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => self.done.removed += 1,
                Err(e) => self.unfinished(format!("{}: {e}", at.display())),
            }
            return;
        }
        if entry.stat.st_dev != self.dev {
            return self.unfinished(format!("{}: on another file system", at.display()));
        }
        let Some(sub) = self.open_as(dir, entry, at) else {
            return;
        };
        // No one but root may change what is in it from now on.
        if let Err(e) = fchmod(&sub, Mode::from_bits_truncate(0o700)) {
            return self.unfinished(format!("{}: {e}", at.display()));
        }
        let kept = match top {
            Some(top) => self.inside(&sub, at, depth, top),
            None => {
                // The top: gone over again while trees too deep to open
                // were moved up into it.
                let outer = std::mem::take(&mut self.moved_up);
                let mut kept = false;
                loop {
                    self.moved_up = 0;
                    kept |= self.inside(&sub, at, depth, (&sub, depth));
                    if self.moved_up == 0 || self.done.unfinished.is_some() {
                        break;
                    }
                }
                self.moved_up = outer;
                kept
            }
        };
        match unlinkat(dir, entry.name.as_c_str(), UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => self.done.removed += 1,
            Err(Errno::ENOTEMPTY | Errno::EEXIST) if kept && self.done.unfinished.is_none() => {
                // Another's files in it stay; the uid keeps nothing.
                let mode = Mode::from_bits_truncate(entry.stat.st_mode & 0o1777);
                let given = fchown(&sub, Some(Uid::from_raw(0)), Some(Gid::from_raw(0)))
                    .and_then(|()| fchmod(&sub, mode));
                match given {
                    Ok(()) => self.done.given_to_root += 1,
                    Err(e) => self.unfinished(format!("{}: {e}", at.display())),
                }
            }
            Err(_) if self.done.unfinished.is_some() => {}
            Err(e) => self.unfinished(format!("{}: {e}", at.display())),
        }
    }

    /// Goes over `sub`, a directory of the uid's at `depth` (made 0700):
    /// removes the uid's entries, goes into others' directories the uid
    /// could write. Returns whether something of another's stays in it.
    fn inside(&mut self, sub: &OwnedFd, at: &Path, depth: usize, top: (&OwnedFd, usize)) -> bool {
        let mut kept = false;
        for inner in self.entries(sub, at) {
            let too_deep = depth + 1 >= MAX_DEPTH;
            if inner.stat.st_uid != self.uid {
                kept = true;
                if !(inner.is_dir() && inner.stat.st_dev == self.dev && self.writable(&inner.stat))
                {
                    continue;
                }
                let inner_at = shown(at, &inner.name);
                if too_deep {
                    self.unfinished(format!(
                        "{}: writable directories of others nested deeper than {MAX_DEPTH}",
                        inner_at.display()
                    ));
                } else if let Some(deeper) = self.open_as(sub, &inner, &inner_at) {
                    self.others(&deeper, &inner_at, depth + 1);
                }
                continue;
            }
            let inner_at = shown(at, &inner.name);
            if inner.is_dir() && too_deep {
                if top.1 < depth {
                    self.move_up(sub, &inner, &inner_at, top.0);
                } else {
                    self.unfinished(format!(
                        "{}: directories nested deeper than {MAX_DEPTH}",
                        inner_at.display()
                    ));
                }
            } else {
                self.remove(sub, &inner, &inner_at, depth + 1, Some(top));
            }
        }
        kept
    }

    /// Moves the uid's directory `entry` of `dir`, too deep to be opened,
    /// into the uid's top directory, to be gone over there.
    fn move_up(&mut self, dir: &OwnedFd, entry: &Entry, at: &Path, top: &OwnedFd) {
        let name = format!(".jobmgr-moved-{:016x}", rand::random::<u64>());
        match renameat(dir, entry.name.as_c_str(), top, name.as_str()) {
            Ok(()) => self.moved_up += 1,
            Err(Errno::ENOENT) => {}
            Err(e) => self.unfinished(format!("{}: {e}", at.display())),
        }
    }

    /// Removes the uid's System V IPC objects, as `dir` (`/proc/sysvipc`)
    /// lists them.
    fn sysvipc(&mut self, dir: &Path) {
        for (file, id_column, kind) in [
            ("shm", "shmid", Ipc::Shm),
            ("sem", "semid", Ipc::Sem),
            ("msg", "msqid", Ipc::Msg),
        ] {
            let path = dir.join(file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                // A kernel without System V IPC.
                continue;
            };
            for id in owned_ipc(&text, id_column, self.uid) {
                match kind.remove(id) {
                    Ok(()) | Err(Errno::EINVAL | Errno::EIDRM) => self.done.removed += 1,
                    Err(e) => self.unfinished(format!("{} {id}: {e}", path.display())),
                }
            }
        }
    }
}

/// The ids in a `/proc/sysvipc/*` listing (`text`, whose header names the
/// columns) of the objects `uid` owns or created.
fn owned_ipc(text: &str, id_column: &str, uid: u32) -> Vec<i32> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let columns: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| columns.iter().position(|c| *c == name);
    let (Some(id), Some(owner), Some(creator)) = (at(id_column), at("uid"), at("cuid")) else {
        return Vec::new();
    };
    let uid = uid.to_string();
    lines
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let ours = fields.get(owner) == Some(&uid.as_str())
                || fields.get(creator) == Some(&uid.as_str());
            ours.then(|| fields.get(id)?.parse().ok()).flatten()
        })
        .collect()
}

/// A kind of System V IPC object.
#[derive(Debug, Clone, Copy)]
enum Ipc {
    Shm,
    Sem,
    Msg,
}

impl Ipc {
    /// Removes the object `id` (`IPC_RMID`).
    fn remove(self, id: i32) -> Result<(), Errno> {
        // SAFETY: IPC_RMID takes no buffer (a null one is allowed).
        let result = unsafe {
            match self {
                Ipc::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                Ipc::Sem => libc::semctl(id, 0, libc::IPC_RMID),
                Ipc::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            }
        };
        Errno::result(result).map(drop)
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `dir/name` for messages (the removal never uses it as a path).
fn shown(dir: &Path, name: &CStr) -> PathBuf {
    dir.join(OsStr::from_bytes(name.to_bytes()))
}

#[cfg(test)]
mod tests;
