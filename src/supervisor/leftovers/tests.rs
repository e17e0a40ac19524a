//! The removal of a uid's leftovers, against hostile trees made by hand
//! (as root: files are given to the uids with `lchown`).

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// The uid whose leftovers are removed, and another's.
const UID: u32 = 70_810;
const OTHER: u32 = 70_811;

/// A place (mode 1777, as `/tmp`) in a fresh directory; `None` (the skip
/// said) unless root, which giving files to other uids needs.
fn place() -> Option<(tempfile::TempDir, PathBuf)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: giving files to other uids needs root");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let place = dir.path().join("place");
    std::fs::create_dir(&place).unwrap();
    chmod(&place, 0o1777);
    Some((dir, place))
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Gives `path` (not what a symlink names) to `uid`.
fn give(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

fn file_of(path: &Path, uid: u32, mode: u32) {
    std::fs::write(path, "secret").unwrap();
    chmod(path, mode);
    give(path, uid);
}

fn dir_of(path: &Path, uid: u32, mode: u32) {
    std::fs::create_dir(path).unwrap();
    chmod(path, mode);
    give(path, uid);
}

/// Every path under `dir` owned by `uid` (not following symlinks).
fn owned_by(dir: &Path, uid: u32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let meta = entry.path().symlink_metadata().unwrap();
            if meta.uid() == uid {
                found.push(entry.path());
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    found
}

fn remove(place: &Path, budget: Budget) -> Removal {
    Leftovers::only(&[place]).remove(UID, UID, budget)
}

#[test]
fn a_uids_files_are_removed_and_nobody_elses() {
    let Some((_dir, place)) = place() else {
        return;
    };
    file_of(&place.join("secret"), UID, 0o600);
    dir_of(&place.join("tree"), UID, 0o700);
    dir_of(&place.join("tree/sub"), UID, 0o755);
    file_of(&place.join("tree/sub/file"), UID, 0o644);
    std::os::unix::net::UnixListener::bind(place.join("socket")).unwrap();
    give(&place.join("socket"), UID);
    nix::unistd::mkfifo(&place.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    give(&place.join("fifo"), UID);
    // Another's file, and another's directory the uid could write (sticky,
    // as /tmp/.X11-unix) with one of the uid's and one of its own in it;
    // and another's directory the uid could not write.
    file_of(&place.join("theirs"), OTHER, 0o600);
    dir_of(&place.join("shared"), OTHER, 0o1777);
    file_of(&place.join("shared/mine"), UID, 0o600);
    file_of(&place.join("shared/theirs"), OTHER, 0o600);
    dir_of(&place.join("closed"), OTHER, 0o755);

    let removal = remove(&place, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
    for kept in ["theirs", "shared", "shared/theirs", "closed"] {
        assert!(place.join(kept).exists(), "{kept} was removed");
    }
    assert_eq!(removal.removed, 7, "{removal:?}");
}

/// Symlinks of the uid's are removed, never followed: what they name
/// (outside the place, or inside another's directory) stays.
#[test]
fn a_symlink_is_removed_and_never_followed() {
    let Some((dir, place)) = place() else {
        return;
    };
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    file_of(&outside.join("of_the_uid"), UID, 0o600);
    file_of(&outside.join("of_another"), OTHER, 0o600);
    for (link, target) in [
        ("to_dir", outside.clone()),
        ("to_file", outside.join("of_the_uid")),
        ("to_root", PathBuf::from("/")),
    ] {
        std::os::unix::fs::symlink(&target, place.join(link)).unwrap();
        give(&place.join(link), UID);
    }
    // A directory of the uid's holding a symlink out, and another's
    // symlink, named like a directory, pointing out too.
    dir_of(&place.join("tree"), UID, 0o700);
    std::os::unix::fs::symlink(&outside, place.join("tree/out")).unwrap();
    give(&place.join("tree/out"), UID);
    std::os::unix::fs::symlink(&outside, place.join("theirs")).unwrap();
    give(&place.join("theirs"), OTHER);

    let removal = remove(&place, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
    assert!(
        outside.join("of_the_uid").exists(),
        "followed a symlink out"
    );
    assert!(
        outside.join("of_another").exists(),
        "followed a symlink out"
    );
    assert!(place.join("theirs").symlink_metadata().is_ok());
}

#[test]
fn files_with_hostile_names_are_removed() {
    let Some((_dir, place)) = place() else {
        return;
    };
    let names: Vec<Vec<u8>> = vec![
        b"-rf".to_vec(),
        b"line\nbreak".to_vec(),
        b"...".to_vec(),
        b"not utf-8 \xff\xfe".to_vec(),
        b" ".to_vec(),
        vec![b'x'; 255],
        b"*".to_vec(),
    ];
    for name in &names {
        let path = place.join(OsStr::from_bytes(name));
        file_of(&path, UID, 0o600);
    }
    dir_of(
        &place.join(OsStr::from_bytes(b"dir\nwith \xff")),
        UID,
        0o700,
    );
    file_of(
        &place.join(OsStr::from_bytes(b"dir\nwith \xff/..\n")),
        UID,
        0o600,
    );
    let removal = remove(&place, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
}

/// A directory of the uid's with another's file in it keeps that file:
/// the directory stays, given to root, and the uid owns nothing.
#[test]
fn another_uids_file_in_a_directory_of_the_uid_is_kept() {
    let Some((_dir, place)) = place() else {
        return;
    };
    dir_of(&place.join("open"), UID, 0o777);
    file_of(&place.join("open/mine"), UID, 0o600);
    file_of(&place.join("open/theirs"), OTHER, 0o640);
    dir_of(&place.join("open/their_dir"), OTHER, 0o777);
    file_of(&place.join("open/their_dir/mine"), UID, 0o600);

    let removal = remove(&place, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
    let theirs = place.join("open/theirs").symlink_metadata().unwrap();
    assert_eq!(
        (theirs.uid(), theirs.mode() & 0o7777),
        (OTHER, 0o640),
        "another's file was changed"
    );
    assert!(place.join("open/their_dir").exists());
    let kept = place.join("open").symlink_metadata().unwrap();
    assert_eq!((kept.uid(), kept.gid()), (0, 0));
    assert_eq!(removal.given_to_root, 1, "{removal:?}");
}

/// A tree deeper than the directories a pass holds open is removed all
/// the same (moved up a level at a time), within the budget.
#[test]
fn a_deep_tree_of_the_uid_is_removed() {
    let Some((_dir, place)) = place() else {
        return;
    };
    let mut at = place.join("deep");
    dir_of(&at, UID, 0o700);
    for level in 0..(MAX_DEPTH * 12) {
        at = at.join(format!("d{level}"));
        dir_of(&at, UID, 0o700);
    }
    file_of(&at.join("bottom"), UID, 0o600);
    let removal = remove(&place, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
    assert!(!place.join("deep").exists());
}

/// Another's writable directories nested deeper than a pass goes are not
/// gone into: the pass says it did not finish, and removes nothing else.
#[test]
fn writable_directories_of_another_nested_too_deep_leave_the_pass_unfinished() {
    let Some((_dir, place)) = place() else {
        return;
    };
    let mut at = place.clone();
    for level in 0..(MAX_DEPTH + 2) {
        at = at.join(format!("o{level}"));
        dir_of(&at, OTHER, 0o777);
    }
    file_of(&at.join("mine"), UID, 0o600);
    let removal = remove(&place, Budget::RELEASE);
    assert!(!removal.finished(), "{removal:?}");
    assert!(
        removal.unfinished.as_deref().unwrap().contains("deeper"),
        "{removal:?}"
    );
}

/// Many files: a pass stops at its budget and says so; passes after it
/// remove the rest.
#[test]
fn a_pass_is_bounded_and_later_passes_finish() {
    let Some((_dir, place)) = place() else {
        return;
    };
    dir_of(&place.join("many"), UID, 0o700);
    for i in 0..3_000 {
        file_of(&place.join(format!("many/f{i}")), UID, 0o600);
    }
    let budget = Budget {
        entries: 1_000,
        time: Duration::from_secs(60),
    };
    let first = remove(&place, budget);
    assert!(!first.finished(), "{first:?}");
    assert!(first.removed <= 1_000, "{first:?}");
    let mut passes = 1;
    while !remove(&place, budget).finished() {
        passes += 1;
        assert!(passes < 10, "passes never finished");
    }
    assert_eq!(owned_by(&place, UID), Vec::<PathBuf>::new());
    // Out of time: a pass with none stops at once.
    file_of(&place.join("late"), UID, 0o600);
    let none = remove(
        &place,
        Budget {
            entries: 1_000,
            time: Duration::ZERO,
        },
    );
    assert!(!none.finished() && place.join("late").exists(), "{none:?}");
}

#[test]
fn the_ipc_listings_name_the_objects_the_uid_owns_or_made() {
    let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
    729204          4   600                    56  2275  2303      5   101   104   101   104 1796155357 1796155357 1796155354                  4096                     0
         0          7   600                    56  2275  2303      0     0     0 70810   104          0          0 1796155354                  4096                     0
         0          9   666                    56  2275  2303      0 70810   104     0   104          0          0 1796155354                  4096                     0
";
    assert_eq!(owned_ipc(shm, "shmid", 70_810), vec![7, 9]);
    assert_eq!(owned_ipc(shm, "shmid", 101), vec![4]);
    assert_eq!(owned_ipc(shm, "semid", 101), Vec::<i32>::new());
    assert_eq!(owned_ipc("", "shmid", 101), Vec::<i32>::new());
    assert_eq!(owned_ipc("garbage\n1 2 3\n", "shmid", 1), Vec::<i32>::new());
}

/// A shared memory segment, a semaphore set and a message queue made by a
/// process of the uid are removed by a pass.
#[test]
fn the_uids_system_v_ipc_objects_are_removed() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: making IPC objects as another uid needs root");
        return;
    }
    // SAFETY: the child makes only system calls and ends itself.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            if libc::setresgid(UID, UID, UID) != 0 || libc::setresuid(UID, UID, UID) != 0 {
                libc::_exit(1);
            }
            let made = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) >= 0
                && libc::semget(libc::IPC_PRIVATE, 1, libc::IPC_CREAT | 0o600) >= 0
                && libc::msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600) >= 0;
            libc::_exit(if made { 0 } else { 2 });
        }
    }
    let mut status = 0;
    // SAFETY: waits on our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let listed = |file: &str, column: &str| {
        let text = std::fs::read_to_string(format!("/proc/sysvipc/{file}")).unwrap();
        owned_ipc(&text, column, UID)
    };
    assert_eq!(listed("shm", "shmid").len(), 1);
    let removal = Leftovers {
        places: Vec::new(),
        sysvipc: PathBuf::from("/proc/sysvipc"),
    }
    .remove(UID, UID, Budget::RELEASE);
    assert!(removal.finished(), "{removal:?}");
    assert_eq!(removal.removed, 3, "{removal:?}");
    for (file, column) in [("shm", "shmid"), ("sem", "semid"), ("msg", "msqid")] {
        assert_eq!(listed(file, column), Vec::<i32>::new(), "{file}");
    }
}
