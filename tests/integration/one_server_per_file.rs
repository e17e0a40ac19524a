//! One server per SQLite file: a second `jobmgr server` (or the embedded
//! server of a supervisor) on a file already served refuses to start, and
//! says which file and which pid holds it.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{DEADLINE, Server, Supervisor, bin, kill_and_reap, wait_child};

/// Runs `jobmgr server` on `db`, expecting it to refuse; returns its stderr.
fn second_server_refused(db: &Path) -> String {
    let mut child = Command::new(bin())
        .args([
            "server",
            "--http",
            "127.0.0.1:0",
            "--bedrock",
            "127.0.0.1:0",
        ])
        .arg("--db")
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second jobmgr server");
    let status = match wait_child(&mut child, DEADLINE) {
        Some(status) => status,
        None => {
            // Still our unreaped child: safe to kill by its handle.
            kill_and_reap(&mut child, "a second server that started");
            panic!(
                "the second server on {} did not exit within {DEADLINE:?}: it started",
                db.display()
            );
        }
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(
        !status.success(),
        "the second server exited successfully: {stderr}"
    );
    stderr
}

#[test]
fn two_servers_on_one_sqlite_file_the_second_is_refused() {
    let first = Server::start();
    let stderr = second_server_refused(first.db());
    assert!(
        stderr.contains("in use by another jobmgr server"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&first.db().display().to_string()),
        "names the file: {stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "names the holder: {stderr}"
    );
    // The first is unharmed.
    let (status, _) = first.api().get("/healthz");
    assert_eq!(status, 200);
}

#[test]
fn a_server_on_the_file_of_a_supervisors_embedded_server_is_refused() {
    let supervisor = Supervisor::embedded().start();
    let db = supervisor.dir.path().join("jobs.db");
    let stderr = second_server_refused(&db);
    assert!(
        stderr.contains(&format!("pid {}", supervisor.pid())),
        "{stderr}"
    );
}

#[test]
fn a_killed_servers_file_can_be_served_again() {
    let mut server = Server::start();
    server.restart();
    let (status, _) = server.api().get("/healthz");
    assert_eq!(status, 200, "the lock died with its holder");
}
