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
