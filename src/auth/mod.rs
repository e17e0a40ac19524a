//! The API token: the one secret every client of the job server shows, on
//! both ports and on every address, loopback included (a worker is a local
//! user too, so loopback is no credential).
//!
//! - **Where it comes from.** `--token`/`JOBMGR_TOKEN` wins; else the token
//!   file, `--token-file`/`JOBMGR_TOKEN_FILE`, by default `token` beside the
//!   SQLite file ([`default_token_file`]).
//! - **A server makes its own.** At first start a server (standalone or
//!   embedded in a supervisor) writes 32 random bytes as hex into the token
//!   file: written to a private temporary file, synced, then linked into
//!   place, so the file never exists half-written or with looser modes, and
//!   two servers starting at once end up with the same token. The file is
//!   mode 0600, owned by the server's user: workers, running as other users,
//!   cannot read it.
//! - **Refused files.** A token file that is a symbolic link or not a regular
//!   file, that group or others can read, that is empty, or (for a server)
//!   owned by another user is refused with what to do about it.
//! - **Clients** read the same file when they can ([`for_client`]), so an
//!   operator running the CLI as the server's user needs no flag.
//!
//! - **Job tokens** ([`job_token`]), derived from it, let a worker create
//!   child jobs on the Bedrock port while its job runs, and nothing more.
//!
//! The token is never logged: [`ApiToken`]'s `Debug` hides it.

pub mod job_token;

use std::fmt;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::RngCore;
use thiserror::Error;

/// The token file's name, beside the SQLite file.
pub const TOKEN_FILE_NAME: &str = "token";

/// The longest token file read (a token is 64 characters).
const MAX_TOKEN_FILE: u64 = 4096;

/// A bearer token. Cheap to clone; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(Arc<str>);

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<hidden>)")
    }
}

impl ApiToken {
    /// A token from its text; `None` when empty.
    pub fn new(text: &str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then(|| ApiToken(Arc::from(text)))
    }

    /// A fresh token: 32 random bytes as 64 hex digits.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        ApiToken(Arc::from(hex))
    }

    /// The secret itself, to send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this token, compared in constant time.
    pub fn matches(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.0.as_bytes())
    }
}

/// Compares secrets without stopping at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token file of a server whose store is `db`: `token` in the SQLite
/// file's directory, or for a PostgreSQL URL in the state directory.
pub fn default_token_file(db: &Path) -> PathBuf {
    crate::server::StoreLocation::of(db)
        .state_dir()
        .join(TOKEN_FILE_NAME)
}

/// Why a token file cannot be used.
#[derive(Debug, Error)]
pub enum TokenError {
    /// Group or others may read it.
    #[error(
        "refusing the token file {path}: its mode {mode:04o} lets group or others read it; \
         run `chmod 600 {path}` (and make a new token if others may have read it: remove the \
         file and restart the server)"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link, directory, FIFO…
    #[error(
        "refusing the token file {path}: it is {what}, not a regular file; remove it \
         (the server makes a new one at start) or point --token-file at the real file"
    )]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// Another user owns it (and could change it).
    #[error(
        "refusing the token file {path}: it is owned by uid {owner}, not by this server's \
         user (uid {me}); run `chown {me} {path}`, or remove it so the server makes a new one"
    )]
    NotOwned {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's uid.
        me: u32,
    },
    /// Empty, or not a token.
    #[error(
        "refusing the token file {path}: {problem}; remove it (the server makes a new one at \
         start) or write one token of printable characters into it"
    )]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A token given on the command line or in the environment that could
    /// not travel in a header.
    #[error(
        "the token given with --token (or JOBMGR_TOKEN) holds spaces or control characters; \
         give one of printable characters only"
    )]
    BadGiven,
    /// It could not be read.
    #[error("cannot read the token file {path}: {source}; {advice}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
        /// What to do.
        advice: &'static str,
    },
    /// It could not be created.
    #[error(
        "cannot create the token file {path}: {source}; make its directory writable by this \
         user, or pass --token-file PATH (or --token)"
    )]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

const READ_ADVICE: &str = "run as the server's user, or pass --token-file PATH or JOBMGR_TOKEN";

/// The server's token: `given` if any, else the one in `file`, which is
/// created (0600, a fresh token) when absent. The file's checks are the
/// module's (not a link, private, owned by this user, not empty).
pub fn for_server(given: Option<&str>, file: &Path) -> Result<ApiToken, TokenError> {
    if let Some(token) = checked(given)? {
        return Ok(token);
    }
    match read_file(file, true) {
        Ok(token) => Ok(token),
        Err(TokenError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
            create_file(file)
        }
        Err(error) => Err(error),
    }
}

/// A client's token, and what to tell the user when the server refuses it.
#[derive(Debug, Clone)]
pub struct ClientToken {
    /// The token to send, if one was found.
    pub token: Option<ApiToken>,
    /// Where the token came from, or why there is none: the advice shown
    /// with a `401`.
    pub hint: String,
}

/// The token file of `jobmgr-server.service` (its `StateDirectory`), where
/// a client running as root also looks.
pub const SERVER_UNIT_TOKEN_FILE: &str = "/var/lib/jobmgr-server/token";

/// Where a client looks for a token file when told none: `token` beside
/// the default database ([`crate::server::default_db_path`]), then, as root,
/// the packaged server unit's ([`SERVER_UNIT_TOKEN_FILE`]).
pub fn default_client_files() -> Vec<PathBuf> {
    let mut files = vec![default_token_file(&crate::server::default_db_path())];
    if nix::unistd::geteuid().is_root() {
        files.push(PathBuf::from(SERVER_UNIT_TOKEN_FILE));
    }
    files
}

/// Whether a server URL (`http://`, `https://` or `bedrock://`) names this
/// host by a loopback address or `localhost`: only such a server may be
/// sent a token found in a default file.
pub fn url_is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    let host = host.trim_end_matches('.');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// A client's token for the server at `url`: `given` if any; else `file`
/// (an error if it cannot be read); else, when `url` is on this host
/// ([`url_is_local`]), the first of `defaults` that exists, when this user
/// can read it: a local token is never sent to another machine unasked.
/// Without one, requests go out without a token and a `401` says why.
pub fn for_client(
    given: Option<&str>,
    file: Option<&Path>,
    defaults: &[PathBuf],
    url: &str,
) -> Result<ClientToken, TokenError> {
    if let Some(token) = checked(given)? {
        return Ok(ClientToken {
            token: Some(token),
            hint: "the token given with --token (or JOBMGR_TOKEN) is not this server's; \
                   use the one in the server's token file"
                .into(),
        });
    }
    if let Some(file) = file {
        let token = read_file(file, false)?;
        return Ok(ClientToken {
            token: Some(token),
            hint: format!(
                "the token in {} is not this server's; point --token-file at the server's \
                 token file",
                file.display()
            ),
        });
    }
    if !url_is_local(url) {
        return Ok(ClientToken {
            token: None,
            hint: format!(
                "no token was sent: {url} is not on this host, and this host's token files are \
                 only sent to a server on it; pass that server's token with --token-file PATH \
                 or JOBMGR_TOKEN"
            ),
        });
    }
    let mut missing = Vec::new();
    for default_file in defaults {
        match read_file(default_file, false) {
            Ok(token) => {
                return Ok(ClientToken {
                    token: Some(token),
                    hint: format!(
                        "the token in {} is not this server's; pass the server's with \
                         --token-file PATH or JOBMGR_TOKEN",
                        default_file.display()
                    ),
                });
            }
            Err(TokenError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
                missing.push(default_file.display().to_string());
            }
            Err(TokenError::Read { source, .. }) => {
                let why = match source.kind() {
                    ErrorKind::PermissionDenied => "is not readable by this user".to_string(),
                    _ => format!("cannot be read ({source})"),
                };
                return Ok(ClientToken {
                    token: None,
                    hint: format!(
                        "no token was sent: {} {why}; run as the server's user, or pass \
                         --token-file PATH or JOBMGR_TOKEN",
                        default_file.display()
                    ),
                });
            }
            Err(error) => return Err(error),
        }
    }
    Ok(ClientToken {
        token: None,
        hint: format!(
            "no token was sent: no token file at {}; run as the server's user (its token \
             file is `token` beside its database), or pass --token-file PATH or JOBMGR_TOKEN",
            missing.join(" or ")
        ),
    })
}

/// A given token, if any, when it can travel in a header.
fn checked(given: Option<&str>) -> Result<Option<ApiToken>, TokenError> {
    match given.and_then(ApiToken::new) {
        Some(token) if !printable(&token) => Err(TokenError::BadGiven),
        token => Ok(token),
    }
}

fn printable(token: &ApiToken) -> bool {
    token.expose().bytes().all(|b| b.is_ascii_graphic())
}

/// Reads and checks a token file; `own` also requires this user to own it.
fn read_file(path: &Path, own: bool) -> Result<ApiToken, TokenError> {
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(source) if source.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(TokenError::NotAFile {
                path: path.to_path_buf(),
                what: "a symbolic link",
            });
        }
        Err(source) => {
            return Err(TokenError::Read {
                path: path.to_path_buf(),
                source,
                advice: READ_ADVICE,
            });
        }
    };
    let read_error = |source| TokenError::Read {
        path: path.to_path_buf(),
        source,
        advice: READ_ADVICE,
    };
    let meta = file.metadata().map_err(read_error)?;
    if !meta.file_type().is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "a special file"
        };
        return Err(TokenError::NotAFile {
            path: path.to_path_buf(),
            what,
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if own && meta.uid() != me {
        return Err(TokenError::NotOwned {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    let mut text = String::new();
    (&mut file)
        .take(MAX_TOKEN_FILE)
        .read_to_string(&mut text)
        .map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
            advice: "write one token of printable characters into it",
        })?;
    let unusable = |problem| TokenError::Unusable {
        path: path.to_path_buf(),
        problem,
    };
    let token = ApiToken::new(&text).ok_or_else(|| unusable("it is empty"))?;
    if !printable(&token) {
        return Err(unusable(
            "it holds spaces or control characters, which cannot travel in a header",
        ));
    }
    Ok(token)
}

/// Creates `path` holding a fresh token, atomically: a private temporary
/// file, synced, is hard-linked into place (which fails if another server
/// got there first: its token is used), then removed.
fn create_file(path: &Path) -> Result<ApiToken, TokenError> {
    let error = |source| TokenError::Create {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(error)?;
    let token = ApiToken::generate();
    let mut suffix = [0u8; 8];
    rand::rng().fill_bytes(&mut suffix);
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    let temp = dir.join(format!(".{TOKEN_FILE_NAME}.{suffix}.tmp"));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&temp)?;
        // The umask can only narrow the mode; make it exactly 0600.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(format!("{}\n", token.expose()).as_bytes())?;
        file.sync_all()
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(error(source));
    }
    let linked = std::fs::hard_link(&temp, path);
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => {
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
            tracing::info!(path = %path.display(), "created the API token file (mode 0600); clients running as this user read it");
            Ok(token)
        }
        // Another server made it first: use theirs.
        Err(source) if source.kind() == ErrorKind::AlreadyExists => read_file(path, true),
        Err(source) => Err(error(source)),
    }
}

#[cfg(test)]
mod tests {
    /// A server URL on this host.
    const LOCAL: &str = "http://127.0.0.1:8889";
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn a_server_creates_a_private_token_once_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state/token");
        let first = for_server(None, &file).unwrap();
        assert_eq!(first.expose().len(), 64);
        assert!(first.expose().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(mode(&file), 0o600);
        let again = for_server(None, &file).unwrap();
        assert_eq!(first, again, "the same token across restarts");
        let leftovers: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("token")]);
    }

    #[test]
    fn a_given_token_wins_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let token = for_server(Some("s3cret"), &file).unwrap();
        assert_eq!(token.expose(), "s3cret");
        assert!(!file.exists());
        // One that could forge a header is refused.
        assert!(matches!(
            for_server(Some("a\r\nX: y"), &file),
            Err(TokenError::BadGiven)
        ));
        // An empty one counts as none.
        assert_eq!(for_server(Some(""), &file).unwrap().expose().len(), 64);
    }

    #[test]
    fn exposed_linked_empty_and_odd_files_are_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "abc\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let message = for_server(None, &file).unwrap_err().to_string();
        assert!(message.contains("chmod 600"), "{message}");
        let message = for_client(None, None, std::slice::from_ref(&file), LOCAL)
            .unwrap_err()
            .to_string();
        assert!(message.contains("chmod 600"), "{message}");

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let message = for_server(None, &link).unwrap_err().to_string();
        assert!(message.contains("symbolic link"), "{message}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "abc\n");

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
        let message = for_server(None, &empty).unwrap_err().to_string();
        assert!(message.contains("empty"), "{message}");

        let spaced = dir.path().join("spaced");
        std::fs::write(&spaced, "a b\n").unwrap();
        std::fs::set_permissions(&spaced, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            for_server(None, &spaced),
            Err(TokenError::Unusable { .. })
        ));

        let message = for_server(None, dir.path()).unwrap_err().to_string();
        assert!(message.contains("a directory"), "{message}");
    }

    #[test]
    fn a_client_reads_the_default_file_when_it_can_and_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let other = dir.path().join("other/token");
        let defaults = [other.clone(), file.clone()];
        let none = for_client(None, None, &defaults, LOCAL).unwrap();
        assert!(none.token.is_none());
        assert!(none.hint.contains("no token file at"), "{}", none.hint);
        assert!(none.hint.contains("--token-file"), "{}", none.hint);
        let made = for_server(None, &file).unwrap();
        assert_eq!(
            for_client(None, None, &defaults, LOCAL).unwrap().token,
            Some(made),
            "the first default that exists"
        );
        assert_eq!(
            for_client(Some("x"), None, &defaults, LOCAL)
                .unwrap()
                .token
                .unwrap()
                .expose(),
            "x"
        );
        // An explicit file must be readable.
        let missing = dir.path().join("missing");
        assert!(for_client(None, Some(&missing), &defaults, LOCAL).is_err());
        // Another host is never sent this host's token unasked; asked, it is.
        let remote = for_client(None, None, &defaults, "http://jobs.example:8889").unwrap();
        assert!(remote.token.is_none());
        assert!(remote.hint.contains("not on this host"), "{}", remote.hint);
        assert!(
            for_client(None, Some(&file), &defaults, "https://10.0.0.5:8889")
                .unwrap()
                .token
                .is_some()
        );
    }

    #[test]
    fn only_loopback_and_localhost_urls_are_local() {
        for local in [
            "http://127.0.0.1:8889",
            "https://127.9.9.9",
            "http://localhost:1/x",
            "http://LOCALHOST.:1",
            "bedrock://[::1]:8888",
            "http://[::ffff:127.0.0.1]:1",
            "http://user@127.0.0.1:1",
        ] {
            assert!(url_is_local(local), "{local}");
        }
        for remote in [
            "http://10.0.0.1:8889",
            "http://jobs.example",
            "http://localhost.evil.example",
            "bedrock://[2001:db8::1]:8888",
            "http://127.0.0.1.evil.example",
            "http://127.0.0.1@evil.example",
        ] {
            assert!(!url_is_local(remote), "{remote}");
        }
    }

    #[test]
    fn tokens_compare_whole_and_never_show_in_debug() {
        let token = ApiToken::new("s3cret").unwrap();
        assert!(token.matches("s3cret"));
        for wrong in ["", "s3cre", "s3crett", "S3cret"] {
            assert!(!token.matches(wrong), "{wrong}");
        }
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
