//! How the spawner makes a worker's process: the way `posix_spawn` does,
//! a child that shares the spawner's memory and runs on a stack of its
//! own until its exec, while the spawner sleeps (`CLONE_VM | CLONE_VFORK`):
//! no page tables are copied.
//!
//! With `clone3`, the child is also born in the job's v2 cgroup
//! (`CLONE_INTO_CGROUP`). Joining it by a write to `cgroup.procs` instead
//! takes the kernel's global lock on every process's cgroups for writing,
//! which waits for an RCU grace period (10 to 30 ms) unless another write
//! came just before: a lone job paid that at its start. Being born in the
//! cgroup takes that lock only for reading, as every fork does (and the
//! cgroup mutex, behind which it can still queue while another process
//! of the machine moves one).
//!
//! `clone3` with a stack cannot be called through libc (glibc keeps its
//! wrapper to itself), so the system call and the child's first steps onto
//! its stack are a few lines of assembly, on x86-64. Elsewhere, and where
//! `clone3` is refused (a seccomp filter, as some container runtimes set,
//! answers `ENOSYS`), the spawner uses `clone` and the worker writes itself
//! into `cgroup.procs`.

use std::os::fd::RawFd;

use nix::libc;

/// A child's entry point: it runs on the stack given, and execs or exits.
pub(super) type ChildMain = extern "C" fn(*mut libc::c_void) -> libc::c_int;

/// The flags of every worker's clone.
const VFORK: u64 = (libc::CLONE_VM | libc::CLONE_VFORK) as u64;

/// `CLONE_INTO_CGROUP` (Linux 5.7).
const INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args` (its third version, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// The top of `stack`, aligned as a call wants it.
fn stack_top(stack: &mut [u8]) -> *mut u8 {
    let end = stack.as_mut_ptr_range().end as usize;
    (end & !15) as *mut u8
}

/// Starts `child(arg)` on `stack` with `clone`; returns its pid, or the
/// errno.
///
/// # Safety
/// This process must have one thread, or `child` must make only
/// async-signal-safe calls; `arg` must stay valid until the child execs or
/// exits (this call returns only then); `stack` must be big enough.
pub(super) unsafe fn clone_vfork(
    child: ChildMain,
    arg: *mut libc::c_void,
    stack: &mut [u8],
) -> Result<i32, i32> {
    let top = stack_top(stack).cast::<libc::c_void>();
    // SAFETY: as the caller promises.
    let pid = unsafe { libc::clone(child, top, VFORK as i32 | libc::SIGCHLD, arg) };
    if pid < 0 { Err(last_errno()) } else { Ok(pid) }
}

/// Starts `child(arg)` on `stack`, born in the v2 cgroup whose directory
/// `cgroup` is open; returns its pid, or the errno. On an error nothing was
/// started; `ENOSYS` and `E2BIG` say it never will be (see
/// [`clone3_refused`]).
///
/// # Safety
/// As for [`clone_vfork`].
pub(super) unsafe fn clone_vfork_into(
    child: ChildMain,
    arg: *mut libc::c_void,
    stack: &mut [u8],
    cgroup: RawFd,
) -> Result<i32, i32> {
    let base = stack.as_mut_ptr();
    let top = stack_top(stack);
    let args = CloneArgs {
        flags: VFORK | INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        stack: base as u64,
        stack_size: top as u64 - base as u64,
        cgroup: cgroup as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as the caller promises; `args` outlives the call.
    let result = unsafe { clone3(&args, child, arg) };
    if result < 0 {
        Err(-result as i32)
    } else {
        Ok(result as i32)
    }
}

/// Whether `errno`, from [`clone_vfork_into`], says that it never works
/// here: no `clone3` (or a seccomp filter refusing it), no
/// `CLONE_INTO_CGROUP` (`E2BIG` for the larger arguments), or not built for
/// this architecture.
pub(super) fn clone3_refused(errno: i32) -> bool {
    matches!(errno, libc::ENOSYS | libc::E2BIG)
}

/// The `clone3` system call. In the child, which starts on the stack in
/// `args` with the registers of this call, it calls `child(arg)` and exits
/// with what it returns (`child` should exec or exit itself).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3(args: &CloneArgs, child: ChildMain, arg: *mut libc::c_void) -> i64 {
    let result: i64;
    // SAFETY: the parent only makes the system call (rcx and r11 are the
    // ones it clobbers, rax its result). The child never comes back into
    // this function: it clears the frame pointer, calls `child` on its own
    // stack (16-byte aligned at the call) and exits.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => result,
            in("rdi") args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") child,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    result
}

/// Not built for this architecture: the caller falls back to `clone`.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3(_: &CloneArgs, _: ChildMain, _: *mut libc::c_void) -> i64 {
    -(libc::ENOSYS as i64)
}

/// The errno of the last failed call (`EIO` if there is none).
pub(super) fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_args_are_the_kernels_third_version() {
        // CLONE_ARGS_SIZE_VER2: the size that carries `cgroup`.
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }
}
