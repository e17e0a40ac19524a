//! `/healthz` reflects whether the store can write. The failure is real: as
//! root, the server runs in a private mount namespace whose store lives on a
//! 1 MiB tmpfs, which the test fills until SQLite reports a full disk.

use std::process::{Command, Stdio};

use serde_json::json;

use crate::common::*;

/// A server (in a mount namespace of its own, its store on a 1 MiB tmpfs)
/// whose store has filled the tmpfs, once `/healthz` says it is failing:
/// the server, the tmpfs's mount point (in the server's namespace), its
/// API and the directory that holds it. `None` (the test skips) unless root.
fn server_on_a_full_tmpfs() -> Option<(ChildGuard, std::path::PathBuf, Api, tempfile::TempDir)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mount = dir.path().join("tiny");
    std::fs::create_dir(&mount).expect("mount point");
    // The tmpfs is mounted in the server's own mount namespace: it goes away
    // with the server, and nothing outside sees it.
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs -o size=1m tmpfs \"$1\" && exec \"$2\" server --db \"$1/jobs.db\" \
             --http 127.0.0.1:0 --bedrock none",
        )
        .args(["sh", mount.to_str().expect("utf-8"), bin()])
        .env("JOBMGR_LOG", "info")
        .env("JOBMGR_TOKEN", token())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn unshare");
    let mut child = ChildGuard::new(child, "the server on a tmpfs");
    let line = ready_line(child.child()).unwrap_or_else(|_| {
        panic!(
            "the server on a tmpfs did not become ready; stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        )
    });
    let url = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= in {line:?}"));
    let api = Api::new(url);
    let (status, health) = api.get("/healthz");
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");

    // 1 MiB of tmpfs holds a few dozen 64 KiB jobs at most. Fill it down to
    // the last page, with smaller and smaller jobs, so that no write at all
    // fits any more (a small background write that still fit would rightly
    // show the store healthy again).
    let mut refused = None;
    for pad in [64 * 1024, 4 * 1024, 256, 0] {
        let payload = "x".repeat(pad);
        refused = None;
        for i in 0..20_000 {
            let (status, answer) = api.post(
                "/jobs",
                json!({"name": "fill", "data": {"i": i, "pad": payload}}),
            );
            if status != 200 {
                refused = Some((status, answer));
                break;
            }
        }
    }
    let (status, answer) = refused.expect("a full 1 MiB store refused even the smallest write");
    assert!(status >= 500, "{status} {answer}");

    let health = poll("healthz to say the store cannot write", || {
        let (status, health) = api.get("/healthz");
        (status == 503).then_some(health)
    });
    assert_eq!(health["status"], "failing", "{health}");
    let reason = health["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("full"),
        "the reason names the full disk: {health}"
    );
    Some((child, mount, api, dir))
}

#[test]
fn healthz_says_ok_while_every_write_fails_with_enospc() {
    // The name is the old defect's: /healthz now says failing.
    server_on_a_full_tmpfs();
}

#[test]
fn healthz_recovers_by_itself_once_a_full_disk_is_freed() {
    let Some((mut child, mount, api, _dir)) = server_on_a_full_tmpfs() else {
        return;
    };
    // While the disk stays full, the server's own probes (every 2 s)
    // cannot write either: still failing after several of them.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let (status, health) = api.get("/healthz");
    assert_eq!(status, 503, "still full: {health}");
    // The disk grows (in the server's own mount namespace); no client
    // writes, and /healthz says ok by itself.
    let pid = child.child().id().to_string();
    let grown = Command::new("nsenter")
        .args([
            "--target",
            &pid,
            "--mount",
            "mount",
            "-o",
            "remount,size=8m",
        ])
        .arg(&mount)
        .status()
        .expect("nsenter");
    assert!(grown.success(), "remounting the tmpfs larger");
    poll("healthz to say ok with no client write", || {
        let (status, health) = api.get("/healthz");
        (status == 200 && health["status"] == "ok").then_some(())
    });
    // And the store takes writes again.
    let (status, answer) = api.post("/jobs", json!({"name": "after"}));
    assert_eq!(status, 200, "{answer}");
}
