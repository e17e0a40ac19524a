//! Reaching the database: its URL read and shown without the password,
//! connecting at start with backoff, and the errors that say what to do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::schema::SchemaError;

/// Why the PostgreSQL store could not be opened.
#[derive(Debug, Error)]
pub enum PgOpenError {
    /// The URL is not one PostgreSQL's client understands.
    #[error(
        "--db {url}: not a PostgreSQL URL ({reason}); write it as postgres://USER@HOST:PORT/DATABASE"
    )]
    Url {
        /// The URL, without its password.
        url: String,
        /// Why.
        reason: String,
    },
    /// The database could not be reached before the server gave up.
    #[error(
        "cannot reach the job store's database {url} (tried for {secs}s): {reason}; check that \
         PostgreSQL runs there and accepts this user, or pass another --db"
    )]
    Unreachable {
        /// The URL, without its password.
        url: String,
        /// How long it tried.
        secs: u64,
        /// The last error.
        reason: String,
    },
    /// The schema could not be created or migrated.
    #[error("the job store's database {url}: {source}")]
    Schema {
        /// The URL, without its password.
        url: String,
        /// Why.
        source: SchemaError,
    },
    /// The writer thread could not be started.
    #[error("cannot start the job store's writer thread: {0}")]
    Thread(std::io::Error),
}

impl PgOpenError {
    /// A failure of the schema or the first queries on `config`'s database.
    pub(super) fn from_postgres(config: &postgres::Config, source: impl Into<SchemaError>) -> Self {
        PgOpenError::Schema {
            url: describe(config),
            source: source.into(),
        }
    }
}

/// Settings of every session: no statement longer than a minute, no lock
/// waited for longer than half a minute, so that a database that stops
/// answering fails requests instead of holding them.
const SESSION_SETTINGS: &str = "-c statement_timeout=60s -c lock_timeout=30s";

/// Reads a `postgres://` URL (or key=value string).
pub(super) fn parse(url: &str) -> Result<postgres::Config, PgOpenError> {
    // The scheme in any case, as URLs allow (the client wants it lower).
    let url = match url.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => url.to_string(),
    };
    let url = url.as_str();
    let mut config: postgres::Config =
        url.parse().map_err(|e: postgres::Error| PgOpenError::Url {
            url: redacted(url),
            reason: e.to_string(),
        })?;
    if config.get_application_name().is_none() {
        config.application_name("jobmgr");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    let options = match config.get_options() {
        Some(given) => format!("{given} {SESSION_SETTINGS}"),
        None => SESSION_SETTINGS.into(),
    };
    config.options(&options);
    // A dead peer or a silent network is noticed within about half a
    // minute, not after the kernel's retransmissions (a quarter of an
    // hour): requests answer 503 meanwhile instead of hanging.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(10));
    config.keepalives_interval(Duration::from_secs(5));
    config.keepalives_retries(3);
    config.tcp_user_timeout(Duration::from_secs(30));
    Ok(config)
}

/// `url` with any password replaced by `***`.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains("password") {
            "(a connection string with a password)".into()
        } else {
            url.to_string()
        };
    };
    // The client takes the credentials up to the first `@`, whatever they
    // hold (a password may contain `/`, `?` or `:`).
    let (authority, tail) = match rest.split_once('@') {
        Some((user, after)) => {
            let user = match user.split_once(':') {
                Some((name, _)) => format!("{name}:***"),
                None => user.to_string(),
            };
            let split = after.find(['/', '?']).unwrap_or(after.len());
            let (host, tail) = after.split_at(split);
            (format!("{user}@{host}"), tail)
        }
        None => {
            let split = rest.find(['/', '?']).unwrap_or(rest.len());
            let (host, tail) = rest.split_at(split);
            (host.to_string(), tail)
        }
    };
    let tail = if tail.contains("password=") {
        tail.split('&')
            .map(|part| match part.split_once("password=") {
                Some((before, _)) => format!("{before}password=***"),
                None => part.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&")
    } else {
        tail.to_string()
    };
    format!("{scheme}://{authority}{tail}")
}

/// `user@host:port/dbname` of a config, for messages.
fn describe(config: &postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// A connection error as one line: the server's own message when it sent
/// one, else the client's (refused, timed out).
pub(super) fn reason(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            text
        }
    }
}

/// Connects, retrying with backoff (1 s doubling to 10 s) while the
/// database cannot be reached, for up to `give_up_after` (`None`: until it
/// answers, or `cancelled` is set). A refusal that
/// retrying cannot mend (a wrong password, a missing database) ends at
/// once.
pub(super) fn with_backoff(
    config: &postgres::Config,
    give_up_after: Option<Duration>,
    cancelled: &AtomicBool,
) -> Result<postgres::Client, PgOpenError> {
    let started = Instant::now();
    let mut delay = Duration::from_secs(1);
    loop {
        match config.connect(postgres::NoTls) {
            Ok(client) => return Ok(client),
            Err(error) => {
                let why = reason(&error);
                // Only a refusal that waiting cannot mend ends the start: a
                // wrong password or user, a missing database. A database
                // starting up or out of connections is waited for.
                let final_refusal = error.as_db_error().is_some_and(|db| {
                    let code = db.code().code();
                    code.starts_with("28") || code == "3D000"
                });
                let out_of_time =
                    give_up_after.is_some_and(|limit| started.elapsed() + delay > limit);
                if final_refusal || out_of_time || cancelled.load(Ordering::Relaxed) {
                    return Err(PgOpenError::Unreachable {
                        url: describe(config),
                        secs: started.elapsed().as_secs(),
                        reason: why,
                    });
                }
                tracing::warn!(
                    db = %describe(config),
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot reach the job store's database: {why}; retrying"
                );
                let until = Instant::now() + delay;
                while Instant::now() < until && !cancelled.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redacted("postgres://app:s3cret@db.example:5432/jobs"),
            "postgres://app:***@db.example:5432/jobs"
        );
        assert_eq!(
            redacted("postgres://app@db/jobs?password=s3cret&sslmode=disable"),
            "postgres://app@db/jobs?password=***&sslmode=disable"
        );
        assert_eq!(redacted("postgresql://db/jobs"), "postgresql://db/jobs");
        assert!(!redacted("host=db password=s3cret").contains("s3cret"));
        for url in [
            "postgres://app:my?secret@db/jobs",
            "postgres://app:my/secret@db/jobs",
            "postgres://app:a@b@db/jobs",
        ] {
            let shown = redacted(url);
            assert!(
                !shown.contains("secret") && !shown.contains("a@b"),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_bad_url_says_how_to_write_one() {
        let error = parse("postgres://app:pw@db:notaport/jobs").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("postgres://USER@HOST:PORT/DATABASE"),
            "{text}"
        );
        assert!(!text.contains("pw@"), "{text}");
    }
}
