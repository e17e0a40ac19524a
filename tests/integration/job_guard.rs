//! Nothing of a job outlives its supervisor: when the supervisor is killed
//! with SIGKILL, its job guard kills what the job's worker started (the
//! worker itself dies of its parent-death signal), so that the job's next
//! run, after its lease lapses, does not run beside the first one's
//! children.

use serde_json::json;

use crate::common::*;

/// The pids of live processes whose command line holds `marker`.
fn with_marker(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // A zombie is dead already (its parent has yet to reap it).
        let zombie = state
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_workers_children_die_when_its_supervisor_is_killed() {
    let server = Server::start();
    // A sleep told apart by its length; it ends by itself within a minute
    // should this test fail, so nothing is left for long.
    let marker = format!("59.{}", std::process::id());
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Spawner",
            &sh(&format!("sleep {marker} &\nsleep {marker} &\nwait")),
        )
        .start();
    server.api().create(json!({"name": "Spawner"}));
    wait_for("the worker's two children", &sup, || {
        (with_marker(&marker).len() == 2).then_some(())
    });
    let mut sup = sup;
    sup.kill9();
    poll("the worker's children to die with their supervisor", || {
        with_marker(&marker).is_empty().then_some(())
    });
}

/// A worker whose children escape its process group three ways: one
/// stays in the group, one starts a session of its own (`setsid`), and one
/// is both orphaned by a double fork and in a session of its own. Each is a
/// `sleep` told apart by `marker`; it ends by itself within a minute should
/// the test fail, so nothing is left for long.
fn escaping_worker(marker: &str) -> String {
    sh(&format!(
        "sleep {marker} &\n\
         setsid sleep {marker} &\n\
         ( setsid sleep {marker} & ) &\n\
         wait"
    ))
}

/// Every process of a job whose processes escaped its group and session is
/// gone after `kill -9` of the supervisor; `sup` says whether it found
/// cgroups.
fn escaped_processes_die_with_the_supervisor(sup: Supervisor, server: &Server, marker: &str) {
    server.api().create(json!({"name": "Escaper"}));
    wait_for("the worker's three children", &sup, || {
        (with_marker(marker).len() == 3).then_some(())
    });
    let mut sup = sup;
    sup.kill9();
    poll(
        "every process of the job to die with its supervisor",
        || with_marker(marker).is_empty().then_some(()),
    );
}

#[test]
fn processes_that_left_the_jobs_session_die_with_the_supervisor_with_cgroups() {
    let server = Server::start();
    let marker = format!("58.{}", std::process::id());
    let sup = Supervisor::builder(&server.url)
        .worker("Escaper", &escaping_worker(&marker))
        .start();
    escaped_processes_die_with_the_supervisor(sup, &server, &marker);
}

#[test]
fn processes_that_left_the_jobs_session_die_with_the_supervisor_without_cgroups() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED processes_that_left_the_jobs_session_die_with_the_supervisor_without_cgroups: hiding the cgroups needs root"
        );
        return;
    }
    let server = Server::start();
    let marker = format!("57.{}", std::process::id());
    let sup = Supervisor::builder(&server.url)
        .without_cgroups()
        .worker("Escaper", &escaping_worker(&marker))
        .start();
    // The sandbox's start-up line says what it found.
    wait_for("the sandbox's start-up line", &sup, || {
        sup.stderr().contains("cgroups: ").then_some(())
    });
    assert!(
        sup.stderr().contains("cgroups: none"),
        "the supervisor was meant to find no cgroups: {}",
        sup.stderr()
    );
    escaped_processes_die_with_the_supervisor(sup, &server, &marker);
}
