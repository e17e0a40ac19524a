//! Reports the server could not take, kept on disk until it can. Each is one
//! file, written and synced before the worker's job is forgotten, and
//! removed only once the server has answered. A report delivered twice (a
//! crash between delivery and removal) carries the same lease token, so a
//! server that leases (jobmgr's) refuses the second: the job's outcome
//! counts exactly once. A Bedrock server has no lease tokens; there the
//! window between delivery and removal is the at-least-once window.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::client::Report;
use crate::protocol::JobId;

/// A report waiting for the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spooled {
    /// The job.
    pub job_id: JobId,
    /// Its name, for logs.
    pub job_name: String,
    /// The lease it was handed out under.
    pub lease: Option<String>,
    /// The report.
    pub report: Report,
    /// What the supervisor saw of the run (absent in reports spooled by
    /// older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<crate::protocol::RunFacts>,
}

/// The spool directory, held under an exclusive lock (`.lock` in it) so
/// that two supervisors never share one.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
    _lock: std::sync::Arc<nix::fcntl::Flock<std::fs::File>>,
}

impl Spool {
    /// Opens the spool at `dir`, making it (mode 0700) if missing, and the
    /// directories above it that are missing with mode 0711 (the state
    /// directory, which workers of other uids pass through to their scratch
    /// directory; see [`dirs`](super::dirs)).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        super::dirs::make(dir, 0o700, super::dirs::PASS_THROUGH).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot create the report spool {}: {e}", dir.display()),
            )
        })?;
        let lock_path = dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| {
                std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "the report spool {} is in use by another supervisor ({errno}); give each supervisor its own --spool-dir",
                        dir.display()
                    ),
                )
            })?;
        Ok(Spool {
            dir: dir.to_path_buf(),
            _lock: std::sync::Arc::new(lock),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a report durably.
    pub fn put(&self, report: &Spooled) -> std::io::Result<PathBuf> {
        let token = report.lease.as_deref().unwrap_or("none");
        let safe: String = token
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(64)
            .collect();
        let name = format!("{}-{}-{}.json", report.job_id, safe, report.report.kind());
        let path = self.dir.join(&name);
        let temporary = self.dir.join(format!(".{name}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(&serde_json::to_vec(report).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    /// Every report waiting, oldest first. Unreadable files are set aside
    /// with a `.bad` suffix and logged.
    pub fn pending(&self) -> std::io::Result<Vec<(PathBuf, Spooled)>> {
        let mut entries: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json") {
                let modified = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                entries.push((modified, path));
            }
        }
        entries.sort();
        let mut out = Vec::new();
        for (_, path) in entries {
            match std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Spooled>(&bytes).ok())
            {
                Some(report) => out.push((path, report)),
                None => {
                    tracing::error!(path = %path.display(), "unreadable spooled report; set aside as .bad");
                    let _ = std::fs::rename(&path, path.with_extension("bad"));
                }
            }
        }
        Ok(out)
    }

    /// Removes a delivered report.
    pub fn remove(&self, path: &Path) {
        if let Err(error) = std::fs::remove_file(path) {
            tracing::error!(path = %path.display(), %error, "cannot remove a delivered report; it will be sent again and refused");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_on_disk_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&dir.path().join("spool")).unwrap();
        let report = Spooled {
            job_id: 7,
            job_name: "SendEmail".into(),
            lease: Some("abc123".into()),
            report: Report::Retry {
                delay_secs: 5,
                ignore_repeat: true,
                data: None,
                name: None,
                next_run: None,
            },
            run: Some(crate::protocol::RunFacts {
                exit_code: Some(3),
                stderr: Some("oops".into()),
                ..Default::default()
            }),
        };
        let path = spool.put(&report).unwrap();
        let dir = spool.dir().to_path_buf();
        let held = Spool::open(&dir).unwrap_err();
        assert!(
            held.to_string().contains("in use by another supervisor"),
            "{held}"
        );
        drop(spool);
        let reopened = Spool::open(&dir).unwrap();
        let spool = &reopened;
        assert_eq!(reopened.pending().unwrap(), vec![(path.clone(), report)]);
        reopened.remove(&path);
        assert!(reopened.pending().unwrap().is_empty());
        // A report spooled by a version without run facts still reads.
        let old =
            r#"{"job_id":8,"job_name":"x","lease":null,"report":{"kind":"finish","data":null}}"#;
        std::fs::write(spool.dir().join("8-x-finish.json"), old).unwrap();
        let pending = reopened.pending().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].1.run, None);
        reopened.remove(&pending[0].0);
        std::fs::write(spool.dir().join("junk.json"), "{").unwrap();
        assert!(reopened.pending().unwrap().is_empty());
        assert!(spool.dir().join("junk.bad").exists());
    }
}
