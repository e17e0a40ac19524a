//! Which executable runs a job: the last `/` segment of the job's name
//! (without any `?query`), found directly in the worker path (for PHP
//! workers, that name with `.php`, which must be a PHP class name). A name that is
//! not a plain file name, or whose file resolves outside the worker path, is
//! refused: nothing outside the worker path is ever executed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a job has no worker.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NoWorker {
    /// The name does not give a usable file name.
    #[error(
        "job name {0:?} does not name a worker: the part after the last '/' must match [A-Za-z0-9_][A-Za-z0-9_.-]*"
    )]
    BadName(String),
    /// No such file in the worker path.
    #[error("no worker {0} in the worker path")]
    NotFound(PathBuf),
    /// The file resolves outside the worker path (a symlink out of it).
    #[error("worker {0} resolves outside the worker path; refusing to run it")]
    Outside(PathBuf),
    /// The path is not a regular file.
    #[error("worker {0} is not a regular file")]
    NotAFile(PathBuf),
    /// The file is not executable.
    #[error("worker {0} is not executable; chmod +x it")]
    NotExecutable(PathBuf),
    /// For a PHP worker: the name is not a PHP class name.
    #[error(
        "job name {0:?} does not name a PHP worker class: the part after the last '/' must match [A-Za-z_][A-Za-z0-9_]*"
    )]
    NotAClass(String),
}

/// The directory workers are found in.
#[derive(Debug, Clone)]
pub struct WorkerPath {
    root: PathBuf,
}

impl WorkerPath {
    /// The worker path at `dir`, which must exist.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        let root = dir.canonicalize().map_err(|e| {
            std::io::Error::new(e.kind(), format!("worker path {}: {e}", dir.display()))
        })?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("worker path {} is not a directory", dir.display()),
            ));
        }
        Ok(WorkerPath { root })
    }

    /// The worker's file name for a job name: `www-prod/SendEmail?x=1` →
    /// `SendEmail`.
    pub fn worker_name(job_name: &str) -> Result<&str, NoWorker> {
        let without_query = job_name.split('?').next().unwrap_or("");
        let name = without_query.rsplit('/').next().unwrap_or("");
        let mut bytes = name.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if first_ok && rest_ok && name.len() <= 255 {
            Ok(name)
        } else {
            Err(NoWorker::BadName(job_name.chars().take(200).collect()))
        }
    }

    /// The executable for a job name.
    pub fn resolve(&self, job_name: &str) -> Result<PathBuf, NoWorker> {
        let (resolved, metadata) = self.file(Self::worker_name(job_name)?)?;
        if metadata.permissions().mode() & 0o111 == 0 {
            return Err(NoWorker::NotExecutable(
                self.root.join(Self::worker_name(job_name)?),
            ));
        }
        Ok(resolved)
    }

    /// The PHP class file for a job name: `www-prod/SendEmail?x=1` →
    /// `SendEmail.php`, which need not be executable.
    pub fn resolve_class(&self, job_name: &str) -> Result<PathBuf, NoWorker> {
        let name = Self::worker_name(job_name)?;
        if !super::bwm_php::is_class_name(name) {
            return Err(NoWorker::NotAClass(job_name.chars().take(200).collect()));
        }
        self.file(&format!("{name}.php")).map(|(path, _)| path)
    }

    /// A regular file of this name directly in the worker path, and what
    /// it is.
    fn file(&self, name: &str) -> Result<(PathBuf, std::fs::Metadata), NoWorker> {
        let candidate = self.root.join(name);
        // The root is a real path and `name` one component: a file that is
        // not a symlink is its own real path (one `lstat`, where resolving
        // it costs a `readlink` per component of the root).
        if let Ok(metadata) = std::fs::symlink_metadata(&candidate)
            && metadata.is_file()
        {
            return Ok((candidate, metadata));
        }
        let resolved = match candidate.canonicalize() {
            Ok(resolved) => resolved,
            Err(_) => return Err(NoWorker::NotFound(candidate)),
        };
        if !resolved.starts_with(&self.root) {
            return Err(NoWorker::Outside(candidate));
        }
        let metadata =
            std::fs::metadata(&resolved).map_err(|_| NoWorker::NotFound(candidate.clone()))?;
        if !metadata.is_file() {
            return Err(NoWorker::NotAFile(candidate));
        }
        Ok((resolved, metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn names_are_the_last_segment_without_query() {
        assert_eq!(
            WorkerPath::worker_name("www-prod/SendEmail?x=1"),
            Ok("SendEmail")
        );
        assert_eq!(WorkerPath::worker_name("Hello"), Ok("Hello"));
        assert_eq!(WorkerPath::worker_name("a/b/c.sh"), Ok("c.sh"));
        // Only the last segment counts, and it is looked up in the worker
        // path alone: "/bin/sh" means DIR/sh, "a/../../b" means DIR/b.
        assert_eq!(WorkerPath::worker_name("/bin/sh"), Ok("sh"));
        assert_eq!(WorkerPath::worker_name("a/../../b"), Ok("b"));
        assert_eq!(WorkerPath::worker_name("../x"), Ok("x"));
        for bad in [
            "", "..", "x/..", ".", "x/", ".hidden", "-rf", "a b", "a\0b", "é",
        ] {
            assert!(WorkerPath::worker_name(bad).is_err(), "{bad:?}");
        }
        assert!(WorkerPath::worker_name(&"a".repeat(10_000)).is_err());
    }

    #[test]
    fn only_executable_files_inside_the_path_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let workers = dir.path().join("workers");
        std::fs::create_dir(&workers).unwrap();
        let good = workers.join("Good");
        std::fs::write(&good, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = workers.join("Plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(workers.join("Dir")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink(&outside, workers.join("Escape")).unwrap();
        symlink(&good, workers.join("Alias")).unwrap();

        let path = WorkerPath::new(&workers).unwrap();
        assert_eq!(
            path.resolve("q/Good?x").unwrap(),
            good.canonicalize().unwrap()
        );
        assert_eq!(path.resolve("Alias").unwrap(), good.canonicalize().unwrap());
        // A worker path that is a symlink (a deploy's `current`) gives the
        // real path of the file it leads to.
        symlink(&workers, dir.path().join("current")).unwrap();
        let through = WorkerPath::new(&dir.path().join("current")).unwrap();
        assert_eq!(
            through.resolve("Good").unwrap(),
            good.canonicalize().unwrap()
        );
        assert!(matches!(
            through.resolve("Escape"),
            Err(NoWorker::Outside(_))
        ));
        assert!(matches!(
            path.resolve("Plain"),
            Err(NoWorker::NotExecutable(_))
        ));
        assert!(matches!(path.resolve("Dir"), Err(NoWorker::NotAFile(_))));
        assert!(matches!(path.resolve("Escape"), Err(NoWorker::Outside(_))));
        assert!(matches!(
            path.resolve("Missing"),
            Err(NoWorker::NotFound(_))
        ));
        // A PHP class file need not be executable; its name must be a class.
        std::fs::write(workers.join("SendEmail.php"), "<?php").unwrap();
        symlink(outside.with_extension("php"), workers.join("Out.php")).unwrap();
        std::fs::write(outside.with_extension("php"), "<?php").unwrap();
        assert_eq!(
            path.resolve_class("www/SendEmail?x=1").unwrap(),
            workers.join("SendEmail.php").canonicalize().unwrap()
        );
        assert!(matches!(
            path.resolve_class("Good"),
            Err(NoWorker::NotFound(_))
        ));
        assert!(matches!(
            path.resolve_class("a-b"),
            Err(NoWorker::NotAClass(_))
        ));
        assert!(matches!(
            path.resolve_class("x.php"),
            Err(NoWorker::NotAClass(_))
        ));
        assert!(matches!(
            path.resolve_class("Out"),
            Err(NoWorker::Outside(_))
        ));
        // "../outside" names DIR/outside, which does not exist: nothing outside runs.
        assert!(matches!(
            path.resolve("../outside"),
            Err(NoWorker::NotFound(_))
        ));
    }
}
