//! `jobmgr check-config` makes every check the supervisor's start makes
//! (the same code), and verifies the server like `gitlab-runner verify`:
//! an authenticated request with the configured token, or, for the
//! embedded server, its store's directory and its ports.

use std::path::Path;

use crate::common::*;

/// Runs `jobmgr check-config ARGS` in `dir` (no other `JOBMGR_*` variable,
/// no /etc file); returns (exit code, stdout, stderr).
fn check_config(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = jobmgr_in(dir);
    command.arg("check-config");
    if !args.contains(&"--config") {
        let empty = dir.join("empty.toml");
        std::fs::write(&empty, "").expect("config");
        command.arg("--config").arg(&empty);
    }
    let output = command
        .args(args)
        .envs(envs.iter().copied())
        .run_bounded(&format!("jobmgr check-config {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A port nothing listens on (bound for a moment, then let go).
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().unwrap().to_string()
}

#[test]
fn what_start_refuses_check_config_refuses_with_the_same_words() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let workers = d.display().to_string();
    // The two cases: no worker path, and a server without scheme.
    let (code, _, err) = check_config(d, &["--offline"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no worker path: pass --worker-path"), "{err}");
    let missing = d.join("no-such-dir").display().to_string();
    let (code, _, err) = check_config(d, &["--offline", "--worker-path", &missing], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pass an existing directory as --worker-path"),
        "{err}"
    );
    let config = d.join("server.toml");
    std::fs::write(
        &config,
        format!("worker-path = {workers:?}\nserver = \"localhost:8889\"\n"),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let (code, _, err) = check_config(d, &["--offline", "--config", &config_arg], &[]);
    assert_eq!(code, 2, "{err}");
    let said = "bad server \"localhost:8889\"";
    assert!(
        err.contains(said) && err.contains("expected http://HOST:PORT"),
        "{err}"
    );
    // The supervisor's start refuses it with the same words, exit 2.
    let output = jobmgr_in(d)
        .arg("--config")
        .arg(&config)
        .run_bounded("a supervisor with a server without scheme");
    let start_err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{start_err}");
    assert!(start_err.contains(said), "{start_err}");
    // A sandbox start would refuse: a user that does not exist.
    let (code, _, err) = check_config(
        d,
        &[
            "--offline",
            "--worker-path",
            &workers,
            "--user",
            "no-such-user-jobmgr",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no-such-user-jobmgr"), "{err}");
}

#[test]
fn a_reachable_server_that_takes_the_token_passes_on_both_ports() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let workers = d.display().to_string();
    let token_file = server.token_file().display().to_string();
    let bedrock = format!("bedrock://{}", server.bedrock);
    for url in [server.url.as_str(), bedrock.as_str()] {
        let (code, out, err) = check_config(
            d,
            &[
                "--worker-path",
                &workers,
                "--server",
                url,
                "--token-file",
                &token_file,
            ],
            &[],
        );
        assert_eq!(code, 0, "{url}: {out}{err}");
        assert!(
            out.contains(&format!(
                "# server check: {url}: reached, and it took the token"
            )),
            "{out}"
        );
    }
}

#[test]
fn an_unreachable_server_or_a_wrong_token_fails_with_exit_1() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let workers = d.display().to_string();
    let nowhere = format!("http://{}", closed_port());
    let token = token();
    let (code, out, err) = check_config(
        d,
        &["--worker-path", &workers, "--server", &nowhere],
        &[("JOBMGR_TOKEN", token)],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("cannot reach {nowhere}")), "{err}");
    assert!(!out.contains("# ok"), "{out}");
    // --offline skips the connection: the same configuration passes.
    let (code, out, err) = check_config(
        d,
        &["--offline", "--worker-path", &workers, "--server", &nowhere],
        &[("JOBMGR_TOKEN", token)],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("# server check: skipped (--offline)"), "{out}");

    // Hostile: the right server, the wrong token, on both ports.
    let wrong = jobmgr::auth::ApiToken::generate().expose().to_string();
    let bedrock = format!("bedrock://{}", server.bedrock);
    for url in [server.url.as_str(), bedrock.as_str()] {
        let (code, out, err) = check_config(
            d,
            &["--worker-path", &workers, "--server", url],
            &[("JOBMGR_TOKEN", &wrong)],
        );
        assert_eq!(code, 1, "{url}: {out}{err}");
        assert!(err.contains(&format!("cannot reach {url}")), "{err}");
        assert!(err.to_lowercase().contains("token"), "{url}: {err}");
    }
}

#[test]
fn check_config_checks_each_server_of_a_list_and_names_the_dead_ones() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let workers = d.display().to_string();
    let nowhere = format!("http://{}", closed_port());
    let token = token();
    // The live server first: the list's failover answers through it, and
    // the dead one behind it must still be found.
    let list = format!("{},{nowhere}", server.url);
    let (code, out, err) = check_config(
        d,
        &["--worker-path", &workers, "--server", &list],
        &[("JOBMGR_TOKEN", token)],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("cannot reach {nowhere}")), "{err}");
    assert!(err.contains("1 of 2 servers failed"), "{err}");
    assert!(
        err.contains(&format!("{}: reached", server.url)),
        "the live one is named as reached: {err}"
    );
    // Both alive: each is named as reached.
    let other = Server::start();
    let list = format!("{},{}", server.url, other.url);
    let (code, out, err) = check_config(
        d,
        &["--worker-path", &workers, "--server", &list],
        &[("JOBMGR_TOKEN", token)],
    );
    assert_eq!(code, 0, "{out}{err}");
    for url in [&server.url, &other.url] {
        assert!(out.contains(&format!("{url}: reached")), "{url}: {out}");
    }
    // Hostile lists are refused as the supervisor's start refuses them.
    for bad in [
        format!("{},", server.url),
        format!("{0},{0}", server.url),
        format!("{},bedrock://{}", server.url, server.bedrock),
    ] {
        let (code, out, err) = check_config(
            d,
            &["--worker-path", &workers, "--server", &bad],
            &[("JOBMGR_TOKEN", token)],
        );
        assert_eq!(code, 2, "{bad}: {out}{err}");
        assert!(err.contains("error: bad server"), "{bad}: {err}");
    }
}

#[test]
fn the_embedded_server_needs_a_writable_store_and_free_ports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let workers = d.display().to_string();
    let db = d.join("state/jobs.db").display().to_string();
    let (code, out, err) = check_config(
        d,
        &[
            "--worker-path",
            &workers,
            "--db",
            &db,
            "--http",
            "127.0.0.1:0",
            "--bedrock",
            "none",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("# server check: embedded server:"), "{out}");
    assert!(!d.join("state").exists(), "check-config made nothing");
    // A port held by someone else: exit 1, with the advice.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_addr = held.local_addr().unwrap().to_string();
    let (code, out, err) = check_config(
        d,
        &[
            "--worker-path",
            &workers,
            "--db",
            &db,
            "--http",
            &held_addr,
            "--bedrock",
            "none",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "cannot listen on {held_addr}: address already in use"
        )),
        "{err}"
    );
    drop(held);
}
