//! How a supervisor identifies itself to the server: who it is (host and
//! pid, and its pool), how many jobs it can run, how many it runs (and how
//! many of those are frozen), and its load. The server keeps the latest of these as its worker registry.

use serde::{Deserialize, Serialize};

use super::JobError;

/// The longest worker id or host name accepted, in bytes.
pub const MAX_WORKER_TEXT: usize = 255;

/// A supervisor's identity and state, as it reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkerInfo {
    /// `HOST-PID`, or `HOST-PID/POOL` for a named pool; unique per process.
    pub id: String,
    /// The host name.
    pub host: String,
    /// The supervisor's process id.
    pub pid: u32,
    /// The most jobs it runs at once.
    pub capacity: u32,
    /// How many it runs now.
    pub running: u32,
    /// Its machine's one-minute load average, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// How many of the jobs it runs are frozen now, the site being
    /// pressed; left out when none (a server older than this field refuses
    /// it, and the supervisor then leaves it out).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl WorkerInfo {
    /// The identity of this process: `HOST-PID`, with `/POOL` for a named pool.
    pub fn this_process(pool: Option<&str>, capacity: u32) -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let pid = std::process::id();
        let id = match pool {
            Some(pool) => format!("{host}-{pid}/{pool}"),
            None => format!("{host}-{pid}"),
        };
        WorkerInfo {
            id,
            host,
            pid,
            capacity,
            running: 0,
            load: None,
            frozen: 0,
        }
    }

    /// Refuses ids and hosts that are empty, too long or hold control
    /// characters, and loads that are not finite numbers.
    pub fn check(&self) -> Result<(), JobError> {
        for (field, text) in [("worker.id", &self.id), ("worker.host", &self.host)] {
            if text.is_empty()
                || text.len() > MAX_WORKER_TEXT
                || text.chars().any(|c| c.is_control())
            {
                return Err(JobError::Malformed(field));
            }
        }
        if self.load.is_some_and(|l| !l.is_finite() || l < 0.0) {
            return Err(JobError::Malformed("worker.load"));
        }
        Ok(())
    }
}

/// The most output of one stream a run report carries, in bytes; the
/// server keeps its head and tail within 4 KiB.
pub const MAX_RUN_OUTPUT: usize = 64 * 1024;

/// What a supervisor saw of one run of a job, sent with its report so that
/// the server can record the attempt: how the worker ended and the tails of
/// its output. (The Bedrock port has no room for it; there the details
/// travel in the data's `_jobmgr` key, for failures only.)
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunFacts {
    /// The worker's exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it (`SIGKILL`), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// The tail of its stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// The tail of its stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// How many bytes it wrote to stdout in all (the tail may be less).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_bytes: Option<u64>,
    /// How many bytes it wrote to stderr in all (the tail may be less).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_bytes: Option<u64>,
}

impl RunFacts {
    /// Refuses a signal name that is not 1 to 32 letters, digits or `_`,
    /// output over [`MAX_RUN_OUTPUT`], and byte counts past `i64::MAX`.
    pub fn check(&self) -> Result<(), JobError> {
        if let Some(signal) = &self.signal
            && (signal.is_empty()
                || signal.len() > 32
                || !signal
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        {
            return Err(JobError::Malformed("run.signal"));
        }
        for (field, text) in [("run.stdout", &self.stdout), ("run.stderr", &self.stderr)] {
            if text.as_ref().is_some_and(|t| t.len() > MAX_RUN_OUTPUT) {
                return Err(JobError::Malformed(field));
            }
        }
        // Stored as 64-bit signed integers.
        for (field, bytes) in [
            ("run.stdoutBytes", self.stdout_bytes),
            ("run.stderrBytes", self.stderr_bytes),
        ] {
            if bytes.is_some_and(|b| i64::try_from(b).is_err()) {
                return Err(JobError::Malformed(field));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_named_by_host_pid_and_pool() {
        let main = WorkerInfo::this_process(None, 4);
        assert_eq!(main.id, format!("{}-{}", main.host, std::process::id()));
        assert_eq!(main.capacity, 4);
        main.check().unwrap();
        let pool = WorkerInfo::this_process(Some("batch"), 2);
        assert!(pool.id.ends_with("/batch"), "{}", pool.id);
    }

    #[test]
    fn run_facts_are_checked() {
        let good = RunFacts {
            exit_code: Some(3),
            signal: Some("SIGKILL".into()),
            stdout: Some("x".repeat(MAX_RUN_OUTPUT)),
            stderr: None,
            stdout_bytes: Some(10_000_000),
            stderr_bytes: Some(0),
        };
        good.check().unwrap();
        for bad in [
            RunFacts {
                signal: Some(String::new()),
                ..good.clone()
            },
            RunFacts {
                signal: Some("SIG KILL".into()),
                ..good.clone()
            },
            RunFacts {
                stderr: Some("x".repeat(MAX_RUN_OUTPUT + 1)),
                ..good.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn hostile_identities_are_refused() {
        let good = WorkerInfo::this_process(None, 1);
        let bad = [
            WorkerInfo {
                id: String::new(),
                ..good.clone()
            },
            WorkerInfo {
                id: "x".repeat(256),
                ..good.clone()
            },
            WorkerInfo {
                host: "a\nb".into(),
                ..good.clone()
            },
            WorkerInfo {
                load: Some(f64::NAN),
                ..good.clone()
            },
            WorkerInfo {
                load: Some(-1.0),
                ..good.clone()
            },
        ];
        for worker in bad {
            assert!(worker.check().is_err(), "{worker:?} was taken");
        }
    }
}
