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
    // Dead, not only rid of its lock: a killed process closes its files
    // (and so drops the spool lock) before a wait sees it exited.
    poll("the killed supervisor to exit", || {
        sup.has_exited().then_some(())
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

/// Every line of the tests' sources with `needle` on it: its file, line
/// number, and what follows the needle. Give `needle` in parts, which are
/// joined, so that the scan does not find its own call.
fn in_the_tests(needle: &[&str]) -> Vec<(String, usize, String)> {
    fn walk(dir: &std::path::Path, needle: &str, found: &mut Vec<(String, usize, String)>) {
        for entry in std::fs::read_dir(dir).expect("tests directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, needle, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("test source");
                for (n, line) in text.lines().enumerate() {
                    if let Some((_, rest)) = line.split_once(needle) {
                        found.push((path.display().to_string(), n + 1, rest.to_string()));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    walk(&tests, &needle.concat(), &mut found);
    found
}

/// A pid read from a pidfile (or `/proc`, or a report) may belong to
/// another test's process by the time it is signalled: the tests signal
/// only children they hold an unreaped handle for (`child.id()`, or a
/// fixture's `self.pid()`, which reads its handle); a pid they read goes
/// through `signal_if`, which pins the process and checks it is the one
/// meant before it signals.
#[test]
fn no_test_signals_a_pid_it_read_from_a_file() {
    let found = in_the_tests(&["Pid::", "from_raw("]);
    assert!(
        !found.is_empty(),
        "the scan found the fixtures' own signals"
    );
    let strays: Vec<_> = found
        .iter()
        .filter(|(_, _, rest)| !(rest.starts_with("child.id()") || rest.starts_with("self.pid()")))
        .collect();
    assert!(
        strays.is_empty(),
        "signals to pids that are not a held child's: {strays:?}"
    );
}

/// `Command::output`, `Child::wait` and `wait_with_output` wait for ever:
/// a child that does not end hangs the suite. Tests use `run_bounded`,
/// `wait_child` and `kill_and_reap`, which have deadlines.
#[test]
fn no_test_waits_on_a_child_without_a_deadline() {
    let mut found = in_the_tests(&[".out", "put()"]);
    found.extend(in_the_tests(&[".wa", "it()"]));
    found.extend(in_the_tests(&["wait_with", "_output("]));
    assert!(found.is_empty(), "unbounded waits: {found:?}");
}

/// A start that should have been refused but was not must not write to a
/// state directory every test shares (`/var/lib/jobmgr` as root): a
/// command from `jobmgr_in` keeps its default spool, status file and
/// scratch directory in the test's own directory.
#[test]
fn a_supervisor_started_without_paths_keeps_its_files_in_the_tests_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let workers = dir.path().join("workers");
    std::fs::create_dir(&workers).unwrap();
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let child = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&empty)
        .args(["--server", "http://127.0.0.1:9", "--user", "self"])
        .arg("--worker-path")
        .arg(&workers)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn jobmgr");
    let mut sup = ChildGuard::new(child, "a supervisor with default paths");
    let ready = ready_line(sup.child()).expect("the supervisor's ready line");
    // Nothing listens on port 9: it says so rather than "ready".
    assert!(
        ready.starts_with("jobmgr supervisor waiting for server at http://127.0.0.1:9"),
        "{ready}"
    );
    for own in ["spool", "status.json"] {
        poll(&format!("its {own} in the test's directory"), || {
            dir.path().join(own).exists().then_some(())
        });
    }
    sup.stop();
}

/// The fault proxy forwards both ways; a cut breaks the live connection and
/// refuses new ones; a restore lets new ones through.
#[test]
fn the_fault_proxy_forwards_cuts_and_restores() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};

    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    if writer.write_all(line.as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
    let proxy = FaultProxy::start(&target);
    let exchange = |stream: &mut TcpStream, text: &str| -> Option<String> {
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        stream.write_all(format!("{text}\n").as_bytes()).ok()?;
        let mut line = String::new();
        let n = BufReader::new(stream.try_clone().ok()?)
            .read_line(&mut line)
            .ok()?;
        (n > 0).then(|| line.trim_end().to_string())
    };

    let mut live = TcpStream::connect(proxy.addr()).unwrap();
    assert_eq!(exchange(&mut live, "one").as_deref(), Some("one"));
    assert_eq!(proxy.connections(), 1);

    proxy.cut();
    assert_eq!(
        exchange(&mut live, "two"),
        None,
        "a cut connection still answered"
    );
    let mut refused = TcpStream::connect(proxy.addr()).unwrap();
    assert_eq!(
        exchange(&mut refused, "three"),
        None,
        "a new connection got through a cut"
    );

    proxy.restore();
    let mut again = TcpStream::connect(proxy.addr()).unwrap();
    assert_eq!(exchange(&mut again, "four").as_deref(), Some("four"));
}
