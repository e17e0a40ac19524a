//! BWM's options that jobmgr accepts and does nothing with, so that a BWM
//! command line (`BedrockWorkerManager.php --maxLoad=… --enableLoadHandler
//! --minSafeJobs=…`) starts as it is. The options that have a jobmgr
//! equivalent are aliases of its flags (`--maxLoad`, `--jobName`,
//! `--workerPath`, `--maxIterations`, `--versionWatchFile`); these are
//! taken off the command line before it is parsed, and each is named once
//! at start with what takes its place.

/// A BWM option without effect here, and what takes its place.
const NO_EFFECT: &[(&str, &str)] = &[
    ("enableLoadHandler", AIMD),
    ("minSafeJobs", AIMD),
    ("maxJobsInSingleRun", AIMD),
    ("maxSafeTime", AIMD),
    ("backoffThreshold", AIMD),
    ("intervalDurationSeconds", AIMD),
    ("doubleBackoffPreventionIntervalFraction", AIMD),
    ("multiplicativeDecreaseFraction", AIMD),
    ("jobsToAddPerSecond", AIMD),
    ("profileChangeThreshold", AIMD),
    ("debugThrottle", AIMD),
    (
        "localJobsDBPath",
        "the AIMD load handler's local database; jobmgr keeps its own state in --spool-dir and --status-file",
    ),
    (
        "logger",
        "jobmgr logs to stderr or the journal (--log-format, JOBMGR_LOG)",
    ),
    (
        "stats",
        "jobmgr exports Prometheus metrics (--metrics ADDR) and the server keeps statistics (jobmgr stats)",
    ),
    (
        "writeConsistency",
        "jobmgr's server commits every write durably before it answers",
    ),
];

/// What replaces BWM's AIMD load handler.
const AIMD: &str = "BWM's AIMD load handler is replaced by jobmgr's gate: --max-load, --min-memory and --max-cpu-pressure decide when a job may start, --max-workers caps how many run";

/// A BWM option that was given and is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// As given, e.g. `--minSafeJobs=5`.
    pub given: String,
    /// What takes its place.
    pub instead: &'static str,
}

/// Takes BWM's no-effect options (`--name` or `--name=VALUE`, as BWM's
/// getopt reads them) off `args`, before a subcommand (one of
/// `subcommands`) or `--` only: the rest is left for the parser.
pub fn take(
    args: Vec<std::ffi::OsString>,
    subcommands: &[String],
) -> (Vec<std::ffi::OsString>, Vec<Ignored>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut ignored = Vec::new();
    let mut options_end = false;
    for (i, arg) in args.into_iter().enumerate() {
        let text = arg.to_string_lossy();
        // A subcommand, or `--`: BWM's options come before either.
        if i > 0 && (text == "--" || subcommands.iter().any(|s| *s == text)) {
            options_end = true;
        }
        if i == 0 || options_end || !text.starts_with("--") {
            kept.push(arg);
            continue;
        }
        let name = text[2..].split('=').next().unwrap_or_default();
        match NO_EFFECT.iter().find(|(option, _)| *option == name) {
            Some((_, instead)) => ignored.push(Ignored {
                given: text.into_owned(),
                instead,
            }),
            None => kept.push(arg),
        }
    }
    (kept, ignored)
}

/// Says once, at start, each BWM option that has no effect here.
pub fn warn(ignored: &[Ignored]) {
    for option in ignored {
        tracing::warn!(
            "{} (a BedrockWorkerManager option) has no effect in jobmgr: {}",
            option.given,
            option.instead
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    fn take(args: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, Vec<Ignored>) {
        super::take(args, &["job".to_string(), "server".to_string()])
    }

    #[test]
    fn no_effect_options_are_taken_off_before_a_subcommand_only() {
        let (kept, ignored) = take(strings(&[
            "jobmgr",
            "--maxLoad=5.0",
            "--enableLoadHandler",
            "--minSafeJobs=5",
            "--workerPath=/code",
            "--localJobsDBPath=/tmp/x.db",
        ]));
        assert_eq!(
            kept,
            strings(&["jobmgr", "--maxLoad=5.0", "--workerPath=/code"])
        );
        let given: Vec<_> = ignored.iter().map(|i| i.given.as_str()).collect();
        assert_eq!(
            given,
            [
                "--enableLoadHandler",
                "--minSafeJobs=5",
                "--localJobsDBPath=/tmp/x.db"
            ]
        );
        assert!(ignored[0].instead.contains("--max-load"));

        // After a subcommand, or `--`, nothing is taken.
        for args in [
            &["jobmgr", "job", "create", "--minSafeJobs=5"][..],
            &["jobmgr", "--", "--logger=x"][..],
        ] {
            let (kept, ignored) = take(strings(args));
            assert_eq!(kept, strings(args));
            assert!(ignored.is_empty());
        }
        // A name that only starts like one is not taken.
        let (kept, ignored) = take(strings(&["jobmgr", "--loggers=x", "--stat"]));
        assert_eq!(kept.len(), 3);
        assert!(ignored.is_empty());
    }
}
