//! The man page's sections beyond the options: FILES, ENVIRONMENT (every
//! variable jobmgr knows, from [`super::environment::known`]), SIGNALS,
//! EXIT STATUS and THE WORKER CONTRACT (taken from the README's section of
//! that name, so the two cannot drift apart).

/// The README, whose "The worker contract" section the man page carries.
const README: &str = include_str!("../../README.md");

/// The heading of the README's worker-contract section.
const CONTRACT_HEADING: &str = "### The worker contract";

/// The roff of the sections after the options.
pub fn sections() -> String {
    let mut out = String::new();
    out.push_str(&files());
    out.push_str(&environment());
    out.push_str(SIGNALS);
    out.push_str(EXIT_STATUS);
    out.push_str(".SH \"THE WORKER CONTRACT\"\n");
    out.push_str(&markdown_to_roff(&worker_contract()));
    out
}

fn files() -> String {
    let items: &[(&str, &str)] = &[
        (
            crate::config::DEFAULT_CONFIG,
            "The supervisor's configuration file when --config names none (config/jobmgr.toml in the source shows every key with its default). Re-read on SIGHUP.",
        ),
        (
            "/etc/jobmgr/conf.d/*.toml",
            "Drop-in files beside the main configuration file, read after it in name order; later values win, [[job]], [[schedule]] and [[pool]] tables add up.",
        ),
        (
            "/var/lib/jobmgr/jobs.db",
            "The embedded server's SQLite store when run as root ($STATE_DIRECTORY/jobs.db under systemd, else $XDG_STATE_HOME/jobmgr/jobs.db); --db.",
        ),
        (
            "/var/lib/jobmgr/token",
            "The API token (mode 0600), made by the embedded server at first start beside its store; --token-file. As root, clients also look in /var/lib/jobmgr-server/token.",
        ),
        (
            "/var/lib/jobmgr/spool/",
            "Reports waiting while the server cannot be reached, beside the store; --spool-dir.",
        ),
        (
            "/var/lib/jobmgr/status.json",
            "What the supervisor is running now, for jobmgr status: beside the spool directory; --status-file.",
        ),
        (
            "/var/lib/jobmgr/scratch/",
            "Each job's scratch directory (its HOME, TMPDIR and working directory), beside the store; --scratch-dir.",
        ),
        (
            "/proc/loadavg, /proc/meminfo, /proc/pressure/cpu",
            "What the gate reads: load, available memory and CPU pressure; --loadavg-path, --meminfo-path, --cpu-pressure-path read files in their format instead (lxcfs in containers).",
        ),
        (
            "/proc/pressure/memory, /proc/pressure/io, /sys/fs/cgroup/SITE/*.pressure",
            "What the back-off reads: the system-wide \"full avg10\" of memory and I/O, or with --site-cgroup the site's cgroups' \"some avg10\" of cpu, memory and io; --pressure-dir reads them under another directory (tests, containers).",
        ),
    ];
    let mut out = String::from(".SH FILES\n");
    for (path, what) in items {
        out.push_str(&format!(".TP\n.B {}\n{}\n", escape(path), escape(what)));
    }
    out
}

fn environment() -> String {
    let mut out = String::from(
        ".SH ENVIRONMENT\nEvery supervisor option is also a variable: JOBMGR_ and the flag's name in capitals, lists separated by commas. A flag wins over its variable, a variable over the configuration files. An unknown JOBMGR_ variable is warned about at start.\n",
    );
    for (name, variable) in super::environment::known() {
        let flags = if variable.flags.is_empty() {
            String::new()
        } else {
            format!(" ({})", variable.flags.join(", "))
        };
        out.push_str(&format!(
            ".TP\n.B {}\n{}{}\n",
            escape(&name),
            escape(&variable.help),
            escape(&flags)
        ));
    }
    out
}

const SIGNALS: &str = r#".SH SIGNALS
.TP
.B SIGTERM, SIGINT
Drain: stop taking jobs, let running ones finish up to \-\-drain\-timeout, then stop the rest and hand them back for an immediate retry. A second signal stops them at once. The server (jobmgr server) stops on either.
.TP
.B SIGTSTP
Quiet: stop taking jobs and keep the running ones.
.TP
.B SIGHUP
Re\-read \-\-config and conf.d; the new settings apply to the next job.
.TP
.B SIGKILL
Jobs in flight are not lost: their leases run out and the server hands them out again.
"#;

const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
.B 0
Success; the supervisor drained as asked.
.TP
.B 1
Failure: the server could not be reached or refused, a job could not be stored.
.TP
.B 2
Bad usage or configuration: an unknown flag or key, a bad value, a missing \-\-worker\-path. The packaged units do not restart on it (RestartPreventExitStatus=2).
.TP
.B 3
Nothing found: no job due (job take), no such job, no supervisor running (status).
"#;

/// The README's worker-contract section, without its heading.
pub fn worker_contract() -> String {
    let start = README
        .find(CONTRACT_HEADING)
        .map_or(README.len(), |i| i + CONTRACT_HEADING.len());
    let rest = &README[start..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    rest[..end].trim().to_string()
}

/// Markdown bullets and paragraphs as roff: `**bold**` and `code` in bold.
fn markdown_to_roff(markdown: &str) -> String {
    let mut out = String::new();
    let mut paragraph = String::new();
    let flush = |paragraph: &mut String, out: &mut String| {
        if !paragraph.is_empty() {
            out.push_str(&inline(paragraph.trim()));
            out.push('\n');
            paragraph.clear();
        }
    };
    for line in markdown.lines() {
        if let Some(item) = line.strip_prefix("- ") {
            flush(&mut paragraph, &mut out);
            out.push_str(".IP \\(bu 2\n");
            paragraph.push_str(item);
        } else if line.trim().is_empty() {
            flush(&mut paragraph, &mut out);
            out.push_str(".PP\n");
        } else {
            paragraph.push(' ');
            paragraph.push_str(line.trim());
        }
    }
    flush(&mut paragraph, &mut out);
    out
}

/// One markdown line as roff text: bold for `**…**` and `…`.
fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut bold = false;
    let text = escape(text).replace("**", "`");
    for c in text.chars() {
        if c == '`' {
            out.push_str(if bold { "\\fR" } else { "\\fB" });
            bold = !bold;
        } else {
            out.push(c);
        }
    }
    if bold {
        out.push_str("\\fR");
    }
    out
}

/// Text safe in roff: backslashes and dashes escaped, no line starting with
/// a control character.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_is_the_readmes_section() {
        let contract = worker_contract();
        assert!(contract.contains("**Exit codes:**"), "{contract}");
        assert!(!contract.contains("### The sandbox"), "{contract}");
        let roff = markdown_to_roff(&contract);
        assert!(roff.contains(".IP \\(bu 2\n\\fBExit codes:\\fR"), "{roff}");
        assert!(
            roff.lines()
                .all(|l| !l.starts_with('.') || l.starts_with(".IP") || l.starts_with(".PP"))
        );
    }
}
