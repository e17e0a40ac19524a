//! `JOBMGR_*` variables as an operator sets them: a bad value names the
//! variable, and an unknown (misspelt) one is warned about once at start.

use crate::common::*;

/// Runs the binary with `args`, only `vars` of the `JOBMGR_*` variables set;
/// returns (exit code, stdout, stderr).
fn run_with(vars: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    jobmgr_with(vars, args)
}

#[test]
fn a_bad_value_from_a_variable_names_the_variable() {
    let (code, _, stderr) = run_with(&[("JOBMGR_MAX_LOAD", "abc")], &["--worker-path", "/"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains("'abc' for JOBMGR_MAX_LOAD"),
        "the variable is not named: {stderr}"
    );

    // The same value on the command line is the flag's, even with the
    // variable also set (the flag wins).
    let (code, _, stderr) = run_with(
        &[("JOBMGR_MAX_LOAD", "abc")],
        &["--worker-path", "/", "--max-load=xyz"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("'xyz' for '--max-load"), "{stderr}");
    assert!(!stderr.contains("JOBMGR_MAX_LOAD"), "{stderr}");

    // A subcommand's variable too.
    let (code, _, stderr) = run_with(
        &[("JOBMGR_REQUEUE_UNLEASED_AFTER", "soon")],
        &["server", "--db", "/nonexistent/x.db"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("JOBMGR_REQUEUE_UNLEASED_AFTER"), "{stderr}");
}

#[test]
fn an_unknown_variable_is_warned_about_once_with_a_suggestion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let status = dir.path().join("status.json");
    let status = status.to_str().expect("path");
    let (code, _, stderr) = run_with(
        &[
            ("JOBMGR_MAX_LAOD", "3"),
            ("JOBMGR_FROBNICATE_EVERYTHING", "1"),
        ],
        &["status", "--status-file", status],
    );
    assert_eq!(code, 3, "no supervisor runs there: {stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("unknown environment variable"))
        .collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    let typo = warnings
        .iter()
        .find(|l| l.contains("JOBMGR_MAX_LAOD"))
        .expect("the typo is named");
    assert!(typo.contains("did you mean JOBMGR_MAX_LOAD?"), "{typo}");
    let other = warnings
        .iter()
        .find(|l| l.contains("JOBMGR_FROBNICATE_EVERYTHING"))
        .expect("the stranger is named");
    assert!(!other.contains("did you mean"), "{other}");

    // Known variables, the tests' and benchmarks' own: no warning.
    let (code, _, stderr) = run_with(
        &[
            ("JOBMGR_MAX_LOAD", "3"),
            ("JOBMGR_LOG", "info"),
            ("JOBMGR_JOB_ID", "7"),
            ("JOBMGR_BENCH_SMOKE", "1"),
            ("JOBMGR_SOAK_SEED", "1"),
        ],
        &["status", "--status-file", status],
    );
    assert_eq!(code, 3, "{stderr}");
    assert!(!stderr.contains("unknown environment variable"), "{stderr}");
}

/// A bad value in a variable of the supervisor's own options is the
/// supervisor's business: `jobmgr job …` works beside it, and the
/// supervisor and `check-config` still refuse it.
#[test]
fn a_bad_supervisor_variable_does_not_break_the_other_commands() {
    let server = Server::start();
    let token_file = server.token_file();
    let bad = [("JOBMGR_MAX_LOAD", "abc"), ("JOBMGR_MAX_WORKERS", "many")];
    let (code, stdout, stderr) = run_with(
        &bad,
        &[
            "job",
            "create",
            "Hello",
            "--server",
            &server.url,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "jobmgr job create refused: {stderr}");
    assert!(stdout.contains("jobID"), "{stdout}");
    for args in [
        &["--worker-path", "/"][..],
        &["check-config", "--offline", "--worker-path", "/"][..],
    ] {
        let (code, _, stderr) = run_with(&bad, args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("JOBMGR_MAX_"), "{args:?}: {stderr}");
    }
}
