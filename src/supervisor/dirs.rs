//! Directories the supervisor makes for itself (the state directory and
//! its parents, the spool, the scratch parent): each missing one is made
//! with the mode it needs, set as given whatever the umask. A service's
//! `UMask=0077` would otherwise leave every one 0700, and a state
//! directory made 0700 on the way to the spool is closed to the workers of
//! other uids that pass through it to their scratch directory and the PHP
//! runner. Directories that exist are left as they are.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, fchmod};

/// What every directory the supervisor makes on the way to one of its own
/// gets: workers of other uids may pass through, not list it.
pub const PASS_THROUGH: u32 = 0o711;

/// Makes `dir` with `mode`, and each missing directory above it with
/// `parents`. A directory another process makes meanwhile is taken as it
/// is.
pub fn make(dir: &Path, mode: u32, parents: u32) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    loop {
        match std::fs::symlink_metadata(at) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(at),
            Err(e) => return Err(naming(at, e)),
        }
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => break,
        }
    }
    for path in missing.into_iter().rev() {
        let wanted = if path == dir { mode } else { parents };
        match std::fs::DirBuilder::new().mode(wanted).create(path) {
            Ok(()) => set_mode(path, wanted)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(naming(path, e)),
        }
    }
    Ok(())
}

/// Sets the mode of the directory `path`, never through a symlink.
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    let dir: OwnedFd = open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| naming(path, e))?;
    fchmod(&dir, Mode::from_bits_truncate(mode)).map_err(|e| naming(path, e))
}

/// `error`, its message led by the `path` it concerns.
fn naming(path: &Path, error: impl Into<io::Error>) -> io::Error {
    let error = error.into();
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn each_missing_directory_gets_its_mode_and_existing_ones_keep_theirs() {
        let top = tempfile::tempdir().unwrap();
        let kept = top.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o750)).unwrap();
        let spool = kept.join("state/deeper/spool");
        make(&spool, 0o700, PASS_THROUGH).unwrap();
        assert_eq!(mode(&kept), 0o750);
        assert_eq!(mode(&kept.join("state")), 0o711);
        assert_eq!(mode(&kept.join("state/deeper")), 0o711);
        assert_eq!(mode(&spool), 0o700);
        // Again: all there, nothing changes.
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o755)).unwrap();
        make(&spool, 0o700, PASS_THROUGH).unwrap();
        assert_eq!(mode(&spool), 0o755);
        // A file in the way is an error naming it.
        let file = top.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let error = make(&file.join("spool"), 0o700, PASS_THROUGH).unwrap_err();
        assert!(error.to_string().contains("file"), "{error}");
    }
}
