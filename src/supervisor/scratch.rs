//! Scratch directories. Each job gets a private directory of its own (mode
//! 0700; its working directory, `HOME` and `TMPDIR`), made in the scratch
//! parent (`--scratch-dir`) and removed when the job ends.
//!
//! A supervisor that is killed (`kill -9`, a crash, a power cut) cannot
//! remove the directories of the jobs it was running. The next supervisor
//! to start on the same parent removes them, unless another supervisor is
//! using that parent at the time: their directories cannot be told apart
//! from its live ones, so they wait for a start with the parent to itself.
//! Who uses a parent is known by an advisory lock on the parent directory
//! itself: every supervisor holds a shared `flock` on it while it runs, and
//! one that can take it exclusively at start is alone, so every job
//! directory in it is a leftover. Only directories named as this module
//! names job directories are ever removed.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The scratch parent, held (under a shared lock) for as long as this value
/// lives.
#[derive(Debug)]
pub struct ScratchParent {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl ScratchParent {
    /// Prepares `dir` as the scratch parent: creates it and the directories
    /// above it that are missing (mode 0711 whatever the umask: workers of
    /// another user may pass through to their own directory, not list it),
    /// refuses one that someone else could tamper with (it must be ours
    /// and writable by nobody else, or another user could swap a job's
    /// directory under it), removes the job directories a killed supervisor
    /// left in it if no other supervisor uses it, and holds it until
    /// dropped.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let fail = |what: String| format!("scratch directory {}: {what}", dir.display());
        super::dirs::make(dir, super::dirs::PASS_THROUGH, super::dirs::PASS_THROUGH)
            .map_err(|e| fail(format!("cannot create it: {e}")))?;
        let metadata = std::fs::symlink_metadata(dir).map_err(|e| fail(e.to_string()))?;
        if !metadata.is_dir() {
            return Err(fail("is not a directory".into()));
        }
        if metadata.uid() != nix::unistd::geteuid().as_raw() {
            return Err(fail(
                "belongs to another user; use a directory of the supervisor's own (--scratch-dir)"
                    .into(),
            ));
        }
        if metadata.mode() & 0o022 != 0 {
            return Err(fail(
                "is writable by other users; chmod 700 it or pick another --scratch-dir".into(),
            ));
        }
        let handle = File::open(dir).map_err(|e| fail(format!("cannot open it: {e}")))?;
        let cannot_lock = |e: nix::errno::Errno| {
            fail(format!(
                "cannot lock it ({e}); check that its file system supports flock"
            ))
        };
        let lock = match Flock::lock(handle, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                // Alone on it: whatever job directory is there was left by a
                // supervisor that did not get to remove it.
                sweep(dir);
                lock.relock(FlockArg::LockShared).map_err(cannot_lock)?;
                lock
            }
            Err((handle, nix::errno::Errno::EWOULDBLOCK)) => {
                tracing::debug!(
                    dir = %dir.display(),
                    "the scratch directory is in use by another supervisor; leftovers in it are removed at a start that has it to itself"
                );
                // Waits only while a starting supervisor sweeps it.
                Flock::lock(handle, FlockArg::LockShared).map_err(|(_, e)| cannot_lock(e))?
            }
            Err((_, e)) => return Err(cannot_lock(e)),
        };
        Ok(ScratchParent {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Removes the job directories in `dir`; returns how many.
fn sweep(dir: &Path) -> usize {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot list the scratch directory to remove what a killed supervisor left in it");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !is_job_dir_name(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot remove a job's scratch directory left by a killed supervisor; remove it by hand")
            }
        }
    }
    if removed > 0 {
        tracing::info!(
            dir = %dir.display(),
            removed,
            "removed job scratch directories left by a supervisor that was killed"
        );
    }
    removed
}

/// The name of a job's directory: `job-ID-RANDOM`.
fn job_dir_name(job_id: i64) -> String {
    format!("job-{job_id}-{:016x}", rand::random::<u64>())
}

/// Whether `name` is one [`job_dir_name`] makes.
fn is_job_dir_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("job-") else {
        return false;
    };
    let Some((id, random)) = rest.rsplit_once('-') else {
        return false;
    };
    !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A job's scratch directory: mode 0700, removed by [`JobScratch::remove`]
/// or, failing that, when dropped. Removal runs on the blocking pool when
/// there is a runtime: a worker may leave a large tree, and removing it must
/// not hold up an async worker thread.
#[derive(Debug)]
pub struct JobScratch {
    /// Empty once the removal has been started.
    path: PathBuf,
}

impl JobScratch {
    /// Makes a fresh directory for job `job_id` in `parent`.
    pub fn create(parent: &Path, job_id: i64) -> std::io::Result<Self> {
        let path = parent.join(job_dir_name(job_id));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(JobScratch { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes it with its contents (on the blocking pool unless it is
    /// empty), and waits for that; a failure is logged.
    pub async fn remove(mut self) {
        let path = std::mem::take(&mut self.path);
        // Empty (the usual end of a short job): one system call, here.
        if std::fs::remove_dir(&path).is_ok() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || remove_logged(&path)).await;
    }
}

impl Drop for JobScratch {
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.path);
        if path.as_os_str().is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || remove_logged(&path))),
            Err(_) => remove_logged(&path),
        }
    }
}

/// Removes a job's scratch directory, logging a failure.
fn remove_logged(path: &Path) {
    if let Err(error) = std::fs::remove_dir_all(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), %error, "cannot remove the job's scratch directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn job_directory_names_are_recognised_and_nothing_else_is() {
        for id in [1, 42, i64::MAX] {
            let name = job_dir_name(id);
            assert!(is_job_dir_name(&name), "{name}");
        }
        for name in [
            "job-",
            "job-1",
            "job-1-",
            "job--0123456789abcdef",
            "job-x-0123456789abcdef",
            "job-1-0123456789abcde",
            "job-1-0123456789abcdefg",
            "job-1-0123456789abcdeg",
            "jobs-1-0123456789abcdef",
            "keep",
            ".lock",
        ] {
            assert!(!is_job_dir_name(name), "{name}");
        }
    }

    #[test]
    fn a_job_directory_is_private_and_removed_with_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let parent = ScratchParent::open(&dir.path().join("scratch")).unwrap();
        let scratch = JobScratch::create(parent.dir(), 7).unwrap();
        let mode = std::fs::metadata(scratch.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::create_dir(scratch.path().join("sub")).unwrap();
        std::fs::write(scratch.path().join("sub/file"), "x").unwrap();
        let path = scratch.path().to_path_buf();
        drop(scratch);
        assert!(!path.exists());
    }

    /// Removing a scratch directory must leave the async thread free: on a
    /// single-threaded runtime, another task runs while a tree is removed
    /// (a removal done in place would finish before it could run once).
    #[tokio::test(flavor = "current_thread")]
    async fn a_job_scratch_directory_is_removed_off_the_async_threads() {
        let dir = tempfile::tempdir().unwrap();
        let parent = ScratchParent::open(&dir.path().join("scratch")).unwrap();
        let scratch = JobScratch::create(parent.dir(), 9).unwrap();
        for i in 0..500 {
            std::fs::write(scratch.path().join(format!("f{i}")), "x").unwrap();
        }
        let path = scratch.path().to_path_buf();
        let turns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&turns);
        let other = tokio::spawn(async move {
            loop {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
        scratch.remove().await;
        let during = turns.load(std::sync::atomic::Ordering::SeqCst);
        other.abort();
        assert!(!path.exists(), "the scratch directory was not removed");
        assert!(
            during > 0,
            "no other task ran while the scratch directory was removed: the removal blocked the async thread"
        );
    }

    #[test]
    fn leftovers_are_removed_by_a_start_that_has_the_directory_to_itself() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        let first = ScratchParent::open(&scratch).unwrap();
        // A job directory of a killed supervisor (never dropped), a file
        // and a directory of someone else's, and a symlink named like a job
        // directory.
        let left = JobScratch::create(first.dir(), 3).unwrap();
        std::fs::write(left.path().join("output"), "x").unwrap();
        let left_path = left.path().to_path_buf();
        std::mem::forget(left);
        std::fs::write(scratch.join("notes"), "x").unwrap();
        std::fs::create_dir(scratch.join("job-keep")).unwrap();
        std::os::unix::fs::symlink(dir.path(), scratch.join("job-9-0123456789abcdef")).unwrap();

        // While another supervisor holds it, its directories may be live.
        let second = ScratchParent::open(&scratch).unwrap();
        assert!(
            left_path.exists(),
            "removed while another supervisor holds it"
        );
        drop(first);
        drop(second);

        let third = ScratchParent::open(&scratch).unwrap();
        assert!(!left_path.exists(), "the leftover was not removed");
        assert_eq!(
            names(third.dir()),
            ["job-9-0123456789abcdef", "job-keep", "notes"],
        );
        assert!(dir.path().exists(), "followed a symlink");

        // It holds the directory shared: a later start neither sweeps its
        // live directories nor waits.
        let live = JobScratch::create(third.dir(), 4).unwrap();
        let fourth = ScratchParent::open(&scratch).unwrap();
        assert!(live.path().exists());
        drop(fourth);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = ScratchParent::open(&scratch).unwrap_err();
        assert!(error.contains("writable by other users"), "{error}");
    }
}
