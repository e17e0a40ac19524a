//! BedrockWorkerManager's PHP worker classes as workers (`worker-kind =
//! "bwm-php"`). The job `a/SendEmail?x=1` runs class `SendEmail` from
//! `WORKERPATH/SendEmail.php`: the worker process is
//! `php RUNNER CLASS_FILE CLASS_NAME`, where the runner (`runner.php`,
//! embedded in the binary) loads the site's bootstrap, includes the class
//! file, builds the class with a Bedrock client and the job, calls `run()`,
//! and maps its outcome to the worker contract: success is exit 0 with the
//! worker's data on stdout's last line, a `RetryableException` a report
//! line (its delay, name, nextRun and ignoreRepeat) and exit 75, any other
//! `Throwable` a report line that fails the job and exit 1.
//!
//! Everything else of a worker applies as it is: the sandbox, the timeout,
//! the lease, the spool and progress. The PHP process is the worker.
//!
//! The Bedrock client the runner gives the class points at the job
//! server's Bedrock port ([`Access`]) and shows a job token (see
//! [`crate::auth::job_token`]) that lets it create jobs and read its own job
//! and its children, and nothing else.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::auth::ApiToken;

/// The runner's source, as `jobmgr bwm-php-runner` prints it.
pub const RUNNER: &str = include_str!("runner.php");

/// The runner's file name in the scratch directory.
pub const RUNNER_FILE_NAME: &str = "bwm-php-runner.php";

/// How PHP workers are run, for a supervisor that runs any.
#[derive(Debug, Clone, PartialEq)]
pub struct PhpSettings {
    /// The PHP interpreter.
    pub php: PathBuf,
    /// Its version, as it says (`PHP_VERSION`).
    pub version: String,
    /// The runner given with `php-runner`; jobmgr's own otherwise.
    pub runner: Option<PathBuf>,
    /// The Bedrock address given with `php-bedrock`.
    pub bedrock: Option<String>,
}

impl PhpSettings {
    /// Checks the PHP options: the interpreter (found on `PATH` unless
    /// given), the runner and the Bedrock address.
    pub fn resolve(
        php: Option<&Path>,
        runner: Option<&Path>,
        bedrock: Option<&str>,
    ) -> Result<Self, String> {
        let php = match php {
            Some(path) => executable(path).map_err(|e| format!("php {}: {e}", path.display()))?,
            None => on_path("php").ok_or(
                "worker-kind bwm-php needs the PHP command-line interpreter, and there is no php on PATH: install it (Debian: apt install php-cli) or pass --php PATH",
            )?,
        };
        let runner = runner
            .map(|path| {
                readable_file(path).map_err(|e| format!("php-runner {}: {e}", path.display()))
            })
            .transpose()?;
        if let Some(addr) = bedrock {
            check_address(addr)?;
        }
        let version = php_version(&php)?;
        Ok(PhpSettings {
            php,
            version,
            runner,
            bedrock: bedrock.map(str::to_string),
        })
    }
}

/// Checks a `php-bootstrap` file and makes its path absolute (workers run
/// in their scratch directory).
pub fn bootstrap(path: &Path) -> Result<PathBuf, String> {
    readable_file(path).map_err(|e| format!("php-bootstrap {}: {e}", path.display()))
}

/// What workers are told of the job server: where its Bedrock port is,
/// and the token their job tokens derive from.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `HOST:PORT` of the Bedrock port, when known.
    pub bedrock: Option<String>,
    /// The API token of the server (never given to workers).
    pub token: Option<ApiToken>,
}

impl Access {
    /// The Bedrock address a worker should connect to, for a listener's
    /// bound address: an unspecified IP (`0.0.0.0`, `::`) means IPv4
    /// loopback (Bedrock-PHP's client speaks IPv4 only; a `::` listener
    /// takes IPv4 too).
    pub fn connect_to(bound: std::net::SocketAddr) -> String {
        let ip = if bound.ip().is_unspecified() {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        } else {
            bound.ip()
        };
        std::net::SocketAddr::new(ip, bound.port()).to_string()
    }
}

/// One PHP worker's command and the environment the runner reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The interpreter.
    pub program: PathBuf,
    /// `-d …`, the runner, the class file, the class name.
    pub args: Vec<OsString>,
    /// `JOBMGR_PHP_BOOTSTRAP`, `JOBMGR_BEDROCK_HOST`/`_PORT`,
    /// `JOBMGR_JOB_TOKEN`.
    pub env: Vec<(String, String)>,
}

/// The worker for class `class` (named by the job) in `class_file` (its
/// file, resolved in the worker path: a symbolic link does not change which
/// class runs), with the runner at `runner`.
pub fn invocation(
    settings: &PhpSettings,
    runner: &Path,
    class: &str,
    class_file: &Path,
    bootstrap: Option<&Path>,
    bedrock: Option<&str>,
    job_token: Option<String>,
) -> Invocation {
    let args = vec![
        "-d".into(),
        "display_errors=stderr".into(),
        "-d".into(),
        "log_errors=0".into(),
        runner.into(),
        class_file.into(),
        class.into(),
    ];
    let mut env = Vec::new();
    if let Some(bootstrap) = bootstrap {
        env.push((
            "JOBMGR_PHP_BOOTSTRAP".to_string(),
            bootstrap.display().to_string(),
        ));
    }
    if let Some((host, port)) = bedrock.and_then(|a| a.rsplit_once(':')) {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        env.push(("JOBMGR_BEDROCK_HOST".into(), host.to_string()));
        env.push(("JOBMGR_BEDROCK_PORT".into(), port.to_string()));
    }
    if let Some(token) = job_token {
        env.push(("JOBMGR_JOB_TOKEN".into(), token));
    }
    Invocation {
        program: settings.php.clone(),
        args,
        env,
    }
}

/// Writes jobmgr's runner into `dir` (the scratch directory, which workers
/// can pass through but not list or write), readable by every worker user,
/// and returns its path. Written whole under a temporary name, then renamed,
/// so a worker never reads half of it.
pub fn install_runner(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join(RUNNER_FILE_NAME);
    if std::fs::read(&path).is_ok_and(|on_disk| on_disk == RUNNER.as_bytes()) {
        return Ok(path);
    }
    let temporary = dir.join(format!(".{RUNNER_FILE_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temporary)?;
    file.write_all(RUNNER.as_bytes())?;
    file.sync_all()?;
    // The umask may have taken read bits away.
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&temporary, &path)?;
    Ok(path)
}

/// A PHP class name: the worker's file name must be one, since BWM
/// constructs the class named after the file.
pub fn is_class_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// How long the interpreter may take to say its version.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks `php` its version (`php -r 'echo PHP_VERSION;'`): a program that is
/// not PHP would finish every job without running it.
fn php_version(php: &Path) -> Result<String, String> {
    use std::io::Read;
    let not_php = |why: String| {
        format!(
            "php {} does not run PHP ({why}): pass --php the PHP command-line interpreter",
            php.display()
        )
    };
    let mut child = std::process::Command::new(php)
        .args(["-n", "-r", "echo PHP_VERSION;"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| not_php(format!("cannot start it: {e}")))?;
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not_php(format!("no answer within {PROBE_TIMEOUT:?}")));
            }
            Err(e) => return Err(not_php(e.to_string())),
        }
    };
    let mut out = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout.take(256).read_to_string(&mut out);
    }
    let looks_like_a_version = out.split('.').count() >= 2
        && out
            .split('.')
            .next()
            .is_some_and(|major| !major.is_empty() && major.bytes().all(|b| b.is_ascii_digit()));
    if !status.success() || !looks_like_a_version {
        return Err(not_php(format!(
            "`{} -r 'echo PHP_VERSION;'` printed {:?} and exited {status}",
            php.display(),
            out.chars().take(60).collect::<String>()
        )));
    }
    Ok(out)
}

fn check_address(addr: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "php-bedrock {addr:?}: write HOST:PORT, e.g. 127.0.0.1:8888 (the job server's Bedrock port)"
        )
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(())
}

fn readable_file(path: &Path) -> Result<PathBuf, String> {
    let resolved = path
        .canonicalize()
        .map_err(|e| format!("cannot find it ({e})"))?;
    let metadata = std::fs::metadata(&resolved).map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err("is not a regular file".into());
    }
    std::fs::File::open(&resolved).map_err(|e| format!("cannot read it ({e})"))?;
    Ok(resolved)
}

fn executable(path: &Path) -> Result<PathBuf, String> {
    let resolved = readable_file(path)?;
    let mode = std::fs::metadata(&resolved)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o111 == 0 {
        return Err("is not executable".into());
    }
    Ok(resolved)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| executable(candidate).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_reach_an_unspecified_listener_on_ipv4_loopback() {
        for (bound, reach) in [
            ("0.0.0.0:8888", "127.0.0.1:8888"),
            ("[::]:8888", "127.0.0.1:8888"),
            ("10.1.2.3:8888", "10.1.2.3:8888"),
        ] {
            assert_eq!(Access::connect_to(bound.parse().unwrap()), reach);
        }
    }

    #[test]
    fn class_names_are_php_identifiers() {
        for good in ["SendEmail", "_x", "A1_b"] {
            assert!(is_class_name(good), "{good}");
        }
        for bad in ["", "1A", "a-b", "a.b", "é", "a b"] {
            assert!(!is_class_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_invocation_names_the_runner_class_and_server() {
        let settings = PhpSettings {
            php: "/usr/bin/php".into(),
            version: "8.2.0".into(),
            runner: None,
            bedrock: None,
        };
        let got = invocation(
            &settings,
            Path::new("/s/bwm-php-runner.php"),
            "SendEmail",
            Path::new("/code/deploy-42/SendEmail.php"),
            Some(Path::new("/code/bootstrap.php")),
            Some("[::1]:8888"),
            Some("job.1.ab".into()),
        );
        assert_eq!(got.program, PathBuf::from("/usr/bin/php"));
        assert_eq!(
            &got.args[4..],
            &[
                OsString::from("/s/bwm-php-runner.php"),
                "/code/deploy-42/SendEmail.php".into(),
                "SendEmail".into()
            ]
        );
        assert_eq!(
            got.env,
            [
                ("JOBMGR_PHP_BOOTSTRAP".into(), "/code/bootstrap.php".into()),
                ("JOBMGR_BEDROCK_HOST".into(), "::1".into()),
                ("JOBMGR_BEDROCK_PORT".into(), "8888".into()),
                ("JOBMGR_JOB_TOKEN".into(), "job.1.ab".into()),
            ]
        );
    }

    #[test]
    fn bad_addresses_and_files_are_refused_with_what_to_do() {
        for bad in ["8888", ":8888", "host:", "host:0", "host:99999"] {
            let error = PhpSettings::resolve(Some(Path::new("/bin/sh")), None, Some(bad));
            assert!(error.unwrap_err().contains("HOST:PORT"), "{bad}");
        }
        let error = PhpSettings::resolve(Some(Path::new("/nonexistent/php")), None, None);
        assert!(error.unwrap_err().contains("cannot find it"));
        // A program that is not PHP would finish every job unrun.
        for not_php in ["/bin/echo", "/bin/true", "/bin/false"] {
            let error = PhpSettings::resolve(Some(Path::new(not_php)), None, None).unwrap_err();
            assert!(error.contains("does not run PHP"), "{not_php}: {error}");
        }
        let error = bootstrap(Path::new("/")).unwrap_err();
        assert!(error.contains("not a regular file"), "{error}");
    }

    #[test]
    fn the_runner_is_installed_readable_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = install_runner(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), RUNNER);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // A changed copy is put right.
        std::fs::write(&path, "<?php exit(3);").unwrap();
        install_runner(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), RUNNER);
    }
}
