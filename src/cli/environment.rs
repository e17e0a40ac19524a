//! The `JOBMGR_*` environment variables: which ones jobmgr knows (every
//! `env =` of the command line, plus the few read or set by hand), a warning
//! for the unknown ones (a misspelt variable is otherwise ignored without a
//! word), and errors for a bad value that name the variable it came from.

use std::collections::BTreeMap;

use clap::CommandFactory;
use clap::error::{ContextKind, ContextValue, ErrorKind};

use super::Cli;

/// The prefix of every variable jobmgr reads.
pub const PREFIX: &str = "JOBMGR_";

/// Variables read by hand, not through a flag: (name, what it does).
pub const READ_BY_HAND: &[(&str, &str)] = &[(
    "JOBMGR_LOG",
    "Which log lines are written: a tracing filter such as debug or jobmgr=debug,info [default: info].",
)];

/// Variables jobmgr sets for each worker (see THE WORKER CONTRACT); a
/// worker that runs `jobmgr job …` has them, so they are known too.
pub const SET_FOR_WORKERS: &[(&str, &str)] = &[
    ("JOBMGR_JOB_ID", "Set for a worker: its job's jobID."),
    (
        "JOBMGR_JOB_NAME",
        "Set for a worker: its job's name (also --job-name's variable for the supervisor).",
    ),
    (
        "JOBMGR_ATTEMPT",
        "Set for a worker: which run of the job this is, from 1.",
    ),
    (
        "JOBMGR_PROGRESS_FD",
        "Set for a worker: the file descriptor on which it may report progress.",
    ),
    (
        "JOBMGR_BEDROCK_HOST",
        "Set for a PHP worker (--worker-kind bwm-php): the job server's Bedrock host its $bedrock client reaches.",
    ),
    (
        "JOBMGR_BEDROCK_PORT",
        "Set for a PHP worker: the job server's Bedrock port.",
    ),
    (
        "JOBMGR_JOB_TOKEN",
        "Set for a PHP worker: its job token, which may create jobs and read its own job and its children while the job runs.",
    ),
];

/// Prefixes and names of the test and benchmark tooling's own variables,
/// which the product does not read and does not warn about.
const TOOLING: &[&str] = &[
    "JOBMGR_BENCH_",
    "JOBMGR_SOAK_",
    "JOBMGR_BIN",
    "JOBMGR_SERVER_FLAGS",
];

/// One known variable: what it does and the flags it stands for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Variable {
    /// The first line of the help of its flag (or of its by-hand entry).
    pub help: String,
    /// The flags it sets, as `--name` or `jobmgr SUB --name`.
    pub flags: Vec<String>,
}

/// Every `JOBMGR_*` variable jobmgr knows, by name: the `env =` of every
/// flag of every subcommand, then those read or set by hand.
pub fn known() -> BTreeMap<String, Variable> {
    let mut out = BTreeMap::new();
    collect(&Cli::command(), "", &mut out);
    for (name, help) in READ_BY_HAND.iter().chain(SET_FOR_WORKERS) {
        let entry: &mut Variable = out.entry(name.to_string()).or_default();
        if entry.help.is_empty() {
            entry.help = help.to_string();
        } else {
            entry.help = format!("{} {help}", entry.help);
        }
    }
    out
}

fn collect(command: &clap::Command, path: &str, out: &mut BTreeMap<String, Variable>) {
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
            continue;
        };
        let flag = match arg.get_long() {
            Some(long) if path.is_empty() => format!("--{long}"),
            Some(long) => format!("jobmgr {path} --{long}"),
            None => continue,
        };
        let entry = out.entry(env.to_string()).or_default();
        if entry.help.is_empty() {
            entry.help = arg
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
        }
        if !entry.flags.contains(&flag) {
            entry.flags.push(flag);
        }
    }
    for sub in command.get_subcommands() {
        let path = format!("{path} {}", sub.get_name()).trim().to_string();
        collect(sub, &path, out);
    }
}

/// The `JOBMGR_*` names in `present` that jobmgr does not know, each with
/// the known name it is closest to, if one is close enough to be a typo.
pub fn unknown<'a>(
    present: impl IntoIterator<Item = &'a str>,
    known: &BTreeMap<String, Variable>,
) -> Vec<(String, Option<String>)> {
    present
        .into_iter()
        .filter(|name| name.starts_with(PREFIX) && !known.contains_key(*name))
        .filter(|name| {
            !TOOLING
                .iter()
                .any(|t| *name == *t || (t.ends_with('_') && name.starts_with(t)))
        })
        .map(|name| {
            let closest = known
                .keys()
                .map(|k| (distance(name, k), k))
                .min()
                .filter(|(d, k)| *d <= 2.max(k.len() / 6))
                .map(|(_, k)| k.clone());
            (name.to_string(), closest)
        })
        .collect()
}

/// Warns once about each unknown `JOBMGR_*` variable of this process.
pub fn warn_unknown() {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    for (name, closest) in unknown(names.iter().map(String::as_str), &known()) {
        match closest {
            Some(closest) => tracing::warn!(
                "unknown environment variable {name} is ignored: did you mean {closest}?"
            ),
            None => tracing::warn!(
                "unknown environment variable {name} is ignored (`jobmgr man` lists the JOBMGR_* variables)"
            ),
        }
    }
}

/// Levenshtein distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

/// For a bad value that came from a variable rather than the command line,
/// clap's message with the variable named in it; `None` for other errors.
pub fn explain(error: &clap::Error) -> Option<String> {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = shown.strip_prefix("--")?.split([' ', '=']).next()?;
    let arg = find_long(&Cli::command(), long)?;
    let env = arg.get_env()?.to_str()?.to_string();
    std::env::var_os(&env)?;
    let mut names = vec![long.to_string()];
    names.extend(
        arg.get_all_aliases()
            .unwrap_or_default()
            .into_iter()
            .map(String::from),
    );
    let on_command_line = std::env::args_os().skip(1).any(|a| {
        let a = a.to_string_lossy();
        names
            .iter()
            .any(|n| a == format!("--{n}") || a.starts_with(&format!("--{n}=")))
    });
    if on_command_line {
        return None;
    }
    let rendered = error.render().to_string();
    let quoted = format!("'{shown}'");
    rendered
        .contains(&quoted)
        .then(|| rendered.replacen(&quoted, &format!("{env} (the variable of {shown})"), 1))
}

fn find_long(command: &clap::Command, long: &str) -> Option<clap::Arg> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .cloned()
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_long(sub, long))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_variable_and_the_hand_read_ones_are_known() {
        let known = known();
        for name in [
            "JOBMGR_MAX_LOAD",
            "JOBMGR_TOKEN",
            "JOBMGR_LOG",
            "JOBMGR_JOB_ID",
        ] {
            assert!(known.contains_key(name), "{name}");
        }
        assert!(known["JOBMGR_DB"].flags.contains(&"--db".to_string()));
        assert!(
            known["JOBMGR_DB"]
                .flags
                .contains(&"jobmgr server --db".to_string())
        );
    }

    #[test]
    fn unknown_names_get_a_close_suggestion_and_tooling_is_quiet() {
        let known = known();
        // Spelt with the prefix apart, so that the scan of src/ for
        // variable names does not take these for real ones.
        let typo = format!("{PREFIX}MAX_LAOD");
        let stranger = format!("{PREFIX}ZZZZZZZZZZZZZZZZ");
        let found = unknown(
            [
                typo.as_str(),
                "JOBMGR_MAX_LOAD",
                "JOBMGR_BENCH_SMOKE",
                "JOBMGR_SOAK_SEED",
                stranger.as_str(),
                "PATH",
            ],
            &known,
        );
        assert_eq!(
            found,
            vec![
                (typo, Some("JOBMGR_MAX_LOAD".to_string())),
                (stranger, None)
            ]
        );
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "ab"), 2);
        assert_eq!(distance("same", "same"), 0);
    }
}
