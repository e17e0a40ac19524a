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

/// Every `JOBMGR_*` name in the product's source (src/), but the test and
/// benchmark tooling's own.
fn variables_in_source() -> std::collections::BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("JOBMGR_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let name = name.trim_end_matches('_').to_string();
                rest = &rest[at + "JOBMGR_".len()..];
                let tooling = [
                    "JOBMGR_BENCH",
                    "JOBMGR_SOAK",
                    "JOBMGR_BIN",
                    "JOBMGR_SERVER_FLAGS",
                ];
                if name.len() > "JOBMGR_".len() && !tooling.iter().any(|t| name.starts_with(t)) {
                    out.insert(name);
                }
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut out,
    );
    out
}

#[test]
fn the_man_page_has_the_operators_sections_and_every_variable() {
    let (code, man, stderr) = run(&["man"]);
    assert_eq!(code, 0, "{stderr}");
    for section in [
        ".SH FILES",
        ".SH ENVIRONMENT",
        ".SH SIGNALS",
        ".SH \"EXIT STATUS\"",
        ".SH \"THE WORKER CONTRACT\"",
    ] {
        assert!(man.contains(section), "{section} missing");
    }
    let environment = man
        .split(".SH ENVIRONMENT")
        .nth(1)
        .and_then(|rest| rest.split("\n.SH ").next())
        .expect("the ENVIRONMENT section");
    let variables = variables_in_source();
    assert!(variables.len() > 40, "the scan found {variables:?}");
    for name in &variables {
        assert!(
            environment.contains(&format!(".B {name}\n")),
            "{name} is read in src/ but not in the man page's ENVIRONMENT"
        );
    }
    // The worker contract is the README's, exit code 75 included.
    assert!(man.contains("75 (EX_TEMPFAIL)"), "the worker contract");
    assert!(man.contains("RestartPreventExitStatus=2"), "exit status 2");
    assert!(man.contains(".B SIGTSTP"), "signals");
}

#[test]
fn the_annotated_config_shows_every_supervisor_key() {
    use clap::Args;
    let annotated = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/jobmgr.toml");
    let text = std::fs::read_to_string(annotated).expect("config/jobmgr.toml");
    // The keys: every option of the supervisor's options struct, named as
    // serde names them (kebab-case of the field), plus its tables.
    let command = jobmgr::config::SupervisorOptions::augment_args(clap::Command::new("keys"));
    let mut keys: Vec<String> = command
        .get_arguments()
        .map(|arg| arg.get_id().as_str().replace('_', "-"))
        .collect();
    assert!(keys.len() > 40, "{keys:?}");
    keys.extend(["schedule", "job", "pool"].map(|t| format!("[[{t}]]")));
    let missing: Vec<&String> = keys
        .iter()
        .filter(|key| {
            if key.starts_with("[[") {
                return !text.contains(key.as_str());
            }
            !text.lines().any(|line| {
                let line = line.strip_prefix("# ").unwrap_or(line);
                line.starts_with(&format!("{key} = "))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "missing from config/jobmgr.toml: {missing:?}"
    );
}
