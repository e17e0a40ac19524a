//! Where and how log lines are written: human-readable text on a terminal,
//! JSON objects for collectors, and plain lines with syslog priorities under
//! journald. Every line written inside a job's span carries the job's id and
//! name.
//!
//! Text and journal lines escape control characters in every field value
//! and in the message (`\n` is written as the two characters `\` `n`), so
//! that no logged string (a job name from an old database, a worker's
//! output, an error message) can end a line early and forge the next one.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
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
            .fmt_fields(EscapedFields)
            .with_ansi(false)
            .event_format(Journal(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_ansi(false),
            ))
            .init(),
        _ => builder
            .fmt_fields(EscapedFields)
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

/// Writes fields as `name=value` (the message bare, first), with control
/// characters in values escaped.
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            result: Ok(()),
            first: true,
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'writer> {
    writer: Writer<'writer>,
    result: fmt::Result,
    first: bool,
}

impl EscapingVisitor<'_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = if name == "message" {
            write!(self.writer, "{separator}")
        } else if self.writer.has_ansi_escapes() {
            write!(self.writer, "{separator}\x1b[3m{name}\x1b[0m=")
        } else {
            write!(self.writer, "{separator}{name}=")
        }
        .and_then(|()| write_escaped(&mut self.writer, value));
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value);
        } else {
            self.write(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// Writes `text` with every control character (see
/// [`crate::protocol::text::is_control`]) escaped: `\n`, `\r`, `\t`, or
/// `\u{…}`.
pub fn write_escaped(out: &mut impl fmt::Write, text: &str) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(crate::protocol::text::is_control) {
        out.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or_default();
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            other => write!(out, "\\u{{{:x}}}", u32::from(other))?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        write_escaped(&mut out, text).unwrap();
        out
    }

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escaped("plain é 中"), "plain é 中");
        assert_eq!(
            escaped("a\nINFO forged\r\tb\u{1b}[31m\u{2028}"),
            "a\\nINFO forged\\r\\tb\\u{1b}[31m\\u{2028}"
        );
    }

    #[test]
    fn a_logged_newline_stays_on_its_line() {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = std::sync::Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(EscapedFields)
            .with_ansi(false)
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let name = "x\nINFO forged line";
            let span = tracing::info_span!("job", job_name = %name);
            let _entered = span.enter();
            tracing::info!(output = %"out\nERROR fake", text = "s\n", "said {}", "m\nWARN fake");
        });
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(r"said m\nWARN fake"), "{text}");
        assert!(text.contains(r"output=out\nERROR fake"), "{text}");
        assert!(text.contains(r"job_name=x\nINFO forged line"), "{text}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
