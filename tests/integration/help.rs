//! What a new operator reads: `--help` grouped under headings, a short
//! `status --help`, and the man page's sections.

use std::process::Command;

use crate::common::*;

/// Runs the binary with `args` and a clean `JOBMGR_*` environment; returns
/// (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(bin());
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("JOBMGR_") {
            command.env_remove(name);
        }
    }
    let output = command.run_bounded(&format!("jobmgr {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The flags listed under `heading:` in a help text.
fn flags_under(help: &str, heading: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != format!("{heading}:"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .map(|l| {
            let l = l.trim_start();
            // "-h, --help": the long name.
            l.split_once(", ")
                .filter(|(s, _)| s.len() == 2)
                .map_or(l, |(_, long)| long)
        })
        .filter_map(|l| l.strip_prefix("--"))
        .map(|l| l.split([' ', '[', '=']).next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn help_groups_the_supervisor_flags_under_headings() {
    let (code, help, stderr) = run(&["--help"]);
    assert_eq!(code, 0, "{stderr}");
    for (heading, flag) in [
        ("Gate", "max-load"),
        ("Gate", "min-memory"),
        ("Workers", "worker-path"),
        ("Workers", "timeout"),
        ("Sandbox", "limit-nofile"),
        ("Sandbox", "read-only-fs"),
        ("Server", "server"),
        ("Server", "db"),
        ("Logs", "log-format"),
        ("Config", "config"),
    ] {
        let flags = flags_under(&help, heading);
        assert!(
            flags.iter().any(|f| f == flag),
            "--{flag} is not under {heading}: ({flags:?})\n{help}"
        );
    }
    // Only help and version stay under the plain "Options:".
    let plain = flags_under(&help, "Options");
    assert_eq!(plain, ["help", "version"], "{help}");
    // The short help has the headings too.
    let (_, short, _) = run(&["-h"]);
    assert!(
        short.contains("\nGate:\n") && short.contains("\nSandbox:\n"),
        "{short}"
    );
}

#[test]
fn status_help_lists_only_what_status_needs() {
    let (code, help, stderr) = run(&["status", "--help"]);
    assert_eq!(code, 0, "{stderr}");
    for flag in ["--status-file", "--config", "--json"] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
    }
    for flag in ["--max-load", "--worker-path", "--limit-nofile", "--server"] {
        assert!(!help.contains(flag), "{flag} is a supervisor flag:\n{help}");
    }
    assert!(help.lines().count() < 60, "{help}");
    // A supervisor flag given to status is refused, not silently taken.
    let (code, _, stderr) = run(&["status", "--max-load", "3"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--max-load"), "{stderr}");
}
