//! A BedrockWorkerManager command line, as a systemd unit has it, starts
//! jobmgr: the options with an equivalent are aliases of its flags, and the
//! others are said, once each at start, to have no effect.

use serde_json::json;

use crate::common::*;

#[test]
fn a_bwm_command_line_starts_and_names_the_options_without_effect() {
    let sup = Supervisor::embedded()
        .worker("Hello", &sh("echo '{\"ran\":true}'"))
        .arg("--jobName=*")
        .arg("--maxLoad=5.0")
        .arg("--enableLoadHandler")
        .arg("--minSafeJobs=5")
        .arg("--multiplicativeDecreaseFraction=0.8")
        .arg("--localJobsDBPath=/tmp/localJobsDB.sql")
        .arg("--logger=SyslogLogger")
        .start();
    let api = Api::new(&sup.ready_field("http"));
    let id = api.create(json!({"name": "Hello"}));
    wait_for("the job to run", &sup, || {
        let (status, history) = api.get(&format!("/jobs/{id}/history"));
        (status == 200 && history["archived"]["state"] == "FINISHED").then_some(())
    });
    let log = sup.stderr();
    for option in [
        "--enableLoadHandler",
        "--minSafeJobs=5",
        "--multiplicativeDecreaseFraction=0.8",
        "--localJobsDBPath=/tmp/localJobsDB.sql",
        "--logger=SyslogLogger",
    ] {
        let said = format!("{option} (a BedrockWorkerManager option) has no effect in jobmgr");
        assert_eq!(log.matches(&said).count(), 1, "{option}: {log}");
    }
    assert!(log.contains("--max-workers caps how many run"), "{log}");
    assert!(
        log.contains("max_load=5.0"),
        "--maxLoad was not taken: {log}"
    );
}

#[test]
fn a_misspelt_bwm_option_is_refused_not_ignored() {
    let (code, _, stderr) = jobmgr_with(&[], &["--enableLoadHandlr", "--worker-path", "/"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--enableLoadHandlr"), "{stderr}");
}
