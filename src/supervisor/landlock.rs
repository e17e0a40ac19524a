//! Landlock rulesets for the opt-in read-only filesystem: everything
//! readable and executable, nothing writable but the job's scratch directory
//! (and the harmless device files). The ruleset is built in the supervisor
//! before the fork; the worker only calls `landlock_restrict_self` on it,
//! which is one system call and safe between fork and exec.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::libc;

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version the kernel offers, or `None` without Landlock.
pub fn abi() -> Option<i64> {
    // SAFETY: the version query takes no pointers.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then_some(version)
}

/// The filesystem rights the kernel's ABI knows.
fn handled(abi: i64) -> u64 {
    let mut rights = (1u64 << 13) - 1; // ABI 1: execute … make_sym
    if abi >= 2 {
        rights |= 1 << 13; // refer
    }
    if abi >= 3 {
        rights |= TRUNCATE;
    }
    if abi >= 5 {
        rights |= IOCTL_DEV;
    }
    rights
}

/// A ruleset: read and execute everywhere, everything beneath `writable`
/// directories, and reading and writing the device files `/dev/null`,
/// `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`.
pub fn read_only_except(writable: &[&Path]) -> io::Result<OwnedFd> {
    let abi = abi().ok_or_else(|| io::Error::other("this kernel has no Landlock"))?;
    let handled = handled(abi);
    let attr = RulesetAttr {
        handled_access_fs: handled,
        handled_access_net: 0,
        scoped: 0,
    };
    // Older kernels take a shorter attribute.
    let size = if abi >= 6 {
        std::mem::size_of::<RulesetAttr>()
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` outlives the call and `size` does not exceed it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    add_rule(
        &ruleset,
        Path::new("/"),
        (EXECUTE | READ_FILE | READ_DIR) & handled,
    )?;
    for dir in writable {
        add_rule(&ruleset, dir, handled)?;
    }
    for device in [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
    ] {
        let path = Path::new(device);
        if path.exists() {
            add_rule(
                &ruleset,
                path,
                (READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV) & handled,
            )?;
        }
    }
    Ok(ruleset)
}

fn add_rule(ruleset: &OwnedFd, path: &Path, access: u64) -> io::Result<()> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `name` is a valid C string.
    let fd = unsafe { libc::open(name.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::other(format!(
            "{}: {}",
            path.display(),
            io::Error::last_os_error()
        )));
    }
    // SAFETY: we own the descriptor just opened.
    let parent = unsafe { OwnedFd::from_raw_fd(fd) };
    let rule = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: `rule` outlives the call.
    let done = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &rule as *const PathBeneathAttr,
            0u32,
        )
    };
    if done < 0 {
        return Err(io::Error::other(format!(
            "{}: {}",
            path.display(),
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Applies a ruleset to the calling process. For use between fork and exec:
/// one system call, no allocation. `no_new_privs` must be set first.
pub fn restrict_self(ruleset: i32) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor number.
    let done = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    if done < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
