//! Where and how log lines are written: human-readable text on a terminal,
//! JSON objects for collectors, and plain lines with syslog priorities under
//! journald. Every line written inside a job's span carries the job's id and
//! name.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `journal` when stderr is connected to journald, else `text`.
    Auto,
    /// Human-readable lines with a timestamp (colours on a terminal).
    Text,
    /// One JSON object per line, with the job's id and name as fields.
    Json,
    /// Plain lines prefixed with their syslog priority (`<6>`), no
    /// timestamp: journald adds its own.
    Journal,
}

impl LogFormat {
    /// `Auto` decided: journald's `JOURNAL_STREAM` names stderr's device
    /// and inode when systemd connected it to the journal.
    pub fn resolve(self) -> LogFormat {
        match self {
            LogFormat::Auto if stderr_is_journal() => LogFormat::Journal,
            LogFormat::Auto => LogFormat::Text,
            other => other,
        }
    }
}

fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Installs the global subscriber: lines to stderr in `format`, filtered by
/// `JOBMGR_LOG` (an `EnvFilter`, default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("JOBMGR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format.resolve() {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        LogFormat::Journal => builder
            .with_ansi(false)
            .event_format(Journal(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_ansi(false),
            ))
            .init(),
        _ => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// The text format without time, each line prefixed with the syslog
/// priority journald reads (`<3>` error … `<7>` debug).
struct Journal(Format<Full, ()>);

impl<S, N> FormatEvent<S, N> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}
