//! The test harness itself, named after the ways a suite hung: a wait on a
//! child process that never ends is cut at its deadline, kills what the
//! command started and says what it waited for; a test that needs a live
//! supervisor fails at once, with its exit status, when it died early.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::common::*;

/// Runs `f` on a thread of its own and returns its panic message; fails if
/// it returns instead, or does neither within [`DEADLINE`] (a hang).
fn panic_of(what: &str, f: impl FnOnce() + Send + 'static) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(Ok(())) => panic!("{what} did not fail"),
        Ok(Err(payload)) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
        Err(_) => panic!("{what} hung for {DEADLINE:?}"),
    }
}

#[test]
fn a_wait_on_a_command_that_never_ends_is_bounded_and_kills_its_process_group() {
    let dir = tempfile::tempdir().unwrap();
    // A unique word in the command line of the command's own child, so that
    // the test knows it from any process that later gets its pid.
    let marker = dir.path().join("never-ends").display().to_string();
    let script = format!(
        "sh -c 'while :; do sleep 1; done' '{marker}' &\necho \"child $!\"\necho 'still going' >&2\nwait\n"
    );
    let message = panic_of("a run of a command that never ends", move || {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .run_within(Duration::from_secs(1), "a command that never ends");
    });
    assert!(
        message.contains("timed out after 1s waiting for a command that never ends"),
        "{message}"
    );
    assert!(
        message.contains("still going"),
        "the output so far: {message}"
    );
    let child: i32 = message
        .split_whitespace()
        .skip_while(|w| *w != "child")
        .nth(1)
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {message}"));
    poll(
        "the command's own child to die with its process group",
        || (!alive_with(child, &marker)).then_some(()),
    );
}

#[test]
fn a_test_whose_supervisor_died_early_fails_at_once_instead_of_hanging() {
    let server = Server::start();
    let mut sup = Supervisor::builder(&server.url).start();
    poll("the supervisor to hold its spool", || {
        spool_is_locked(&sup.spool()).then_some(())
    });
    // Our own child, not reaped yet: its pid is still ours to signal.
    sup.signal(Signal::SIGKILL);
    poll("the killed supervisor's spool lock to go", || {
        (!spool_is_locked(&sup.spool())).then_some(())
    });
    let stderr = sup.stderr();
    let message = panic_of("a check on a dead supervisor", move || {
        sup.assert_running("the test needs it running");
    });
    assert!(
        message.contains("the test needs it running: the supervisor exited early")
            && message.contains(&format!("{}", std::process::ExitStatus::from_raw(9))),
        "{message}"
    );
    assert!(
        message.contains(stderr.trim()),
        "its stderr is shown: {message}"
    );
}
