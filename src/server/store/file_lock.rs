//! One server per SQLite file: an advisory lock (`flock`) on a sidecar file
//! `<db>.lock`, held for the store's life. Two servers on one file would
//! each miss the other's wake-ups and timers, so the second refuses to
//! start, naming the file and the pid that holds it. The kernel drops the
//! lock when its holder exits, however it exits, so a crash leaves no stale
//! lock behind (the pid in the file is only a hint for the message).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::sqlite::StoreOpenError;

/// The lock on a store's file, released when dropped.
#[derive(Debug)]
pub struct StoreLock {
    _lock: Flock<File>,
}

/// The sidecar lock file of the store at `db`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The path `db` resolves to: symlinks and `.`/`..` followed, for the file
/// itself when it exists, else for its directory.
fn resolved(db: &Path) -> PathBuf {
    if let Ok(path) = db.canonicalize() {
        return path;
    }
    let (Some(parent), Some(name)) = (db.parent(), db.file_name()) else {
        return db.to_path_buf();
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    parent
        .canonicalize()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|_| db.to_path_buf())
}

impl StoreLock {
    /// Takes the lock of the store at `db`, or says who holds it. The lock
    /// file sits beside the file `db` resolves to, so that two paths to one
    /// store (a symlink, `..`) share one lock.
    pub fn acquire(db: &Path) -> Result<Self, StoreOpenError> {
        let path = lock_path(&resolved(db));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StoreOpenError::File {
                path: path.clone(),
                source,
            })?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut text = String::new();
                let holder = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse::<u32>().ok());
                return Err(StoreOpenError::InUse {
                    path: db.to_path_buf(),
                    holder,
                });
            }
            Err((_, errno)) => {
                return Err(StoreOpenError::File {
                    path,
                    source: std::io::Error::from(errno),
                });
            }
        };
        // The pid is a hint for the message of a server refused later; the
        // lock does not depend on it.
        let _ = lock
            .set_len(0)
            .and_then(|_| lock.rewind())
            .and_then(|_| writeln!(*lock, "{}", std::process::id()));
        Ok(StoreLock { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_store_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("jobs.db");
        let first = StoreLock::acquire(&db).unwrap();
        match StoreLock::acquire(&db) {
            Err(StoreOpenError::InUse { path, holder }) => {
                assert_eq!(path, db);
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first);
        StoreLock::acquire(&db).expect("free again once the holder let go");
    }

    #[test]
    fn two_paths_to_one_store_share_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("data");
        std::fs::create_dir(&real).unwrap();
        let db = real.join("jobs.db");
        std::fs::write(&db, b"").unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let via_dir = dir.path().join("data/../data/jobs.db");
        let _first = StoreLock::acquire(&db).unwrap();
        for other in [&link, &via_dir] {
            assert!(
                matches!(StoreLock::acquire(other), Err(StoreOpenError::InUse { .. })),
                "{} reaches the same store",
                other.display()
            );
        }
    }
}
