//! Authenticated local access (issue 19, items 1 and 6): loopback is no
//! credential. A process of another uid on the same host (a worker, as
//! `nobody`) without the token is refused on the HTTP port and on the
//! Bedrock port, and cannot read the token file; with the token the same
//! process is served. The token file is made private at first start and
//! kept across restarts; a file others could read, or a symbolic link, is
//! refused. The CLI needs no flag beside its server; `--bedrock-trust-loopback`
//! is explicit and loud; metrics take the token; workers never get it.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common::*;

/// `nobody`'s uid and gid, when the tests run as root; else `None`, after
/// printing why the test is skipped.
fn nobody_or_skip(test: &str) -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("{test}: skipped: running as another user needs root");
        return None;
    }
    match nix::unistd::User::from_name("nobody") {
        Ok(Some(user)) => Some((user.uid.as_raw(), user.gid.as_raw())),
        _ => {
            eprintln!("{test}: skipped: there is no user `nobody` on this host");
            None
        }
    }
}

/// Runs `bash -c script` as `uid`/`gid` with no supplementary groups and
/// only `env`; returns (exit code, stdout, stderr).
fn run_as(uid: u32, gid: u32, script: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .current_dir("/");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(gid)).map_err(std::io::Error::from)?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(uid)).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let output = command.run_bounded("a client running as nobody");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A bash script that tries QueryJob, FinishJob, DeleteJob and CreateJob on
/// both ports (over bash's /dev/tcp), sending `$TOKEN` when it is set, then
/// reads the token file. Prints one `what: answer` line per attempt.
const ATTACK: &str = r#"
set -u
auth() { if [ -n "${TOKEN:-}" ]; then printf 'Authorization: Bearer %s\r\n' "$TOKEN"; fi; }
btok() { if [ -n "${TOKEN:-}" ]; then printf 'Token: %s\r\n' "$TOKEN"; fi; }
http() { # METHOD PATH [BODY]
  local body="${3:-}"
  exec 3<>"/dev/tcp/127.0.0.1/$HTTP_PORT" || { echo "http $1 $2: connect failed"; return; }
  { printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n' "$1" "$2" "$HTTP_PORT"
    auth
    if [ -n "$body" ]; then
      printf 'Content-Type: application/json\r\nContent-Length: %s\r\n' "${#body}"
    fi
    printf '\r\n%s' "$body"; } >&3
  echo "http $1 $2: $(tr -d '\r' <&3 | tr '\n' ' ')"
  exec 3<&-
}
bedrock() { # METHOD HEADER-LINE
  exec 3<>"/dev/tcp/127.0.0.1/$BEDROCK_PORT" || { echo "bedrock $1: connect failed"; return; }
  { printf '%s\r\n' "$1"; btok; printf '%s\r\nConnection: close\r\n\r\n' "$2"; } >&3
  echo "bedrock $1: $(tr -d '\r' <&3 | tr '\n' ' ')"
  exec 3<&-
}
http GET "/jobs/$VICTIM"
http GET "/jobs?limit=10"
http POST "/jobs/$VICTIM/finish" '{"data":{"owned":true}}'
http DELETE "/jobs/$QUEUED"
http POST /jobs '{"name":"planted"}'
bedrock QueryJob "jobID: $VICTIM"
bedrock FinishJob "jobID: $VICTIM"
bedrock DeleteJob "jobID: $QUEUED"
bedrock CreateJob "name: planted"
if cat "$TOKEN_FILE" >/dev/null 2>&1; then echo "token file: read"; else echo "token file: refused"; fi
"#;

/// The lines of the attack's output that name `what`.
fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(what))
        .unwrap_or_else(|| panic!("no {what:?} line in the attack's output:\n{out}"))
}

#[test]
fn a_worker_uid_without_the_token_is_refused_on_both_ports_and_cannot_read_it() {
    let Some((uid, gid)) = nobody_or_skip("local_auth") else {
        return;
    };
    let server = Server::start();
    // Only the token file's own mode keeps `nobody` out (not a private
    // directory around it).
    let dir = server.db().parent().expect("db dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let api = server.api();
    let victim = api.create(json!({"name": "victim", "data": {"apiKey": "k-SECRET-42"}}));
    let taken = api.take("victim");
    assert_eq!(taken["jobID"], json!(victim));
    let queued = api.create(json!({"name": "bystander"}));
    let before: Vec<Value> = [victim, queued].iter().map(|id| api.job(*id)).collect();

    let http_port = server.addr().rsplit(':').next().unwrap().to_string();
    let bedrock_port = server.bedrock.rsplit(':').next().unwrap().to_string();
    let token_file = server.token_file();
    let (victim_s, queued_s) = (victim.to_string(), queued.to_string());
    let env = [
        ("HTTP_PORT", http_port.as_str()),
        ("BEDROCK_PORT", bedrock_port.as_str()),
        ("VICTIM", victim_s.as_str()),
        ("QUEUED", queued_s.as_str()),
        ("TOKEN_FILE", token_file.to_str().unwrap()),
    ];
    let (_, out, err) = run_as(uid, gid, ATTACK, &env);
    for what in [
        "http GET /jobs/",
        "http GET /jobs?",
        "http POST /jobs/",
        "http DELETE",
        "http POST /jobs:",
    ] {
        let answer = line(&out, what);
        assert!(
            answer.contains("HTTP/1.1 401") && answer.contains("unauthorized"),
            "{answer}\n(stderr: {err})"
        );
    }
    for what in ["QueryJob", "FinishJob", "DeleteJob", "CreateJob"] {
        let answer = line(&out, &format!("bedrock {what}"));
        assert!(answer.contains(": 401 Unauthorized"), "{answer}");
    }
    assert_eq!(line(&out, "token file"), "token file: refused");
    assert!(
        !out.contains("k-SECRET-42"),
        "the job's data leaked:\n{out}"
    );
    // Untouched: same state, same data, nothing planted.
    let after: Vec<Value> = [victim, queued].iter().map(|id| api.job(*id)).collect();
    assert_eq!(before, after);
    let (_, planted) = api.get("/jobs?name=planted");
    assert_eq!(planted["jobs"], json!([]));

    // The CLI as that user: pointed at the token file, it cannot read it;
    // without, the server's 401 comes with what to do.
    let jobmgr = format!("{} job --server {} query {victim}", bin(), server.url);
    let (runnable, _, _) = run_as(uid, gid, &format!("test -x {}", bin()), &[]);
    if runnable != 0 {
        eprintln!(
            "local_auth: the CLI part skipped: nobody cannot run {}",
            bin()
        );
    } else {
        cli_as_another_user(uid, gid, &jobmgr, &token_file);
    }

    // The same process of the same uid, with the token: served.
    let env_with: Vec<(&str, &str)> = env.iter().copied().chain([("TOKEN", token())]).collect();
    let (_, out, _) = run_as(uid, gid, ATTACK, &env_with);
    assert!(
        line(&out, "http GET /jobs/").contains("HTTP/1.1 200") && out.contains("k-SECRET-42"),
        "{out}"
    );
    assert!(
        line(&out, "http POST /jobs:").contains("HTTP/1.1 200"),
        "{out}"
    );
    // (The HTTP finish before it ended the victim: a 404, not a 401.)
    for what in ["QueryJob", "FinishJob", "DeleteJob"] {
        let answer = line(&out, &format!("bedrock {what}"));
        assert!(
            answer.contains(": 200 OK") || answer.contains(": 404 No job with this jobID"),
            "{answer}"
        );
    }
    assert!(
        line(&out, "bedrock CreateJob").contains(": 200 OK"),
        "{out}"
    );
    assert_eq!(api.state(queued), None, "deleted with the token");
}

/// `jobmgr job … query` run as another user: with the server's token file,
/// which it cannot read, and without any.
fn cli_as_another_user(uid: u32, gid: u32, jobmgr: &str, token_file: &Path) {
    let (code, _, stderr) = run_as(
        uid,
        gid,
        &format!("{jobmgr} --token-file {}", token_file.display()),
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains("Permission denied") && stderr.contains("run as the server's user"),
        "{stderr}"
    );
    let (code, _, stderr) = run_as(uid, gid, jobmgr, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("--token-file"),
        "{stderr}"
    );
}

/// A server started by hand in `dir` with default paths (its database and
/// token file in `dir`), and its ready line.
fn server_in(dir: &Path, extra: &[&str]) -> (ChildGuard, String) {
    let child = jobmgr_in(dir)
        .args([
            "server",
            "--http",
            "127.0.0.1:0",
            "--bedrock",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("JOBMGR_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("stderr"))
                .expect("stderr file"),
        )
        .spawn()
        .expect("spawn jobmgr server");
    let mut guard = ChildGuard::new(child, "a server with default paths");
    let ready = ready_line(guard.child()).unwrap_or_else(|e| {
        panic!(
            "no ready line ({e}); stderr:\n{}",
            std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
        )
    });
    (guard, ready)
}

fn field(ready: &str, key: &str) -> String {
    ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")[..]))
        .unwrap_or_else(|| panic!("no {key}= in {ready:?}"))
        .to_string()
}

#[test]
fn the_token_file_is_made_private_at_first_start_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let (mut first, ready) = server_in(dir.path(), &[]);
    let meta = std::fs::symlink_metadata(&file).expect("the token file was made");
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert_eq!(token.len(), 64, "{token:?}");
    assert!(
        !std::fs::read_to_string(dir.path().join("stderr"))
            .unwrap()
            .contains(&token),
        "the token was logged"
    );
    let url = field(&ready, "http");
    assert_eq!(
        Api::new(&url).with_token(&token).get("/jobs").0,
        200,
        "its own token works"
    );
    first.stop();
    let (_second, ready) = server_in(dir.path(), &[]);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        token,
        "the same token after a restart"
    );
    let url = field(&ready, "http");
    assert_eq!(Api::new(&url).with_token(&token).get("/jobs").0, 200);
}

#[test]
fn the_cli_beside_its_server_needs_no_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, ready) = server_in(dir.path(), &[]);
    let url = field(&ready, "http");
    // Same user, same state directory: the CLI finds the token file.
    let output = jobmgr_in(dir.path())
        .args(["job", "--server", &url, "create", "operator-job"])
        .run_bounded("jobmgr job create beside its server");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = jobmgr_in(dir.path())
        .args(["stats", "--server", &url])
        .run_bounded("jobmgr stats beside its server");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Elsewhere (another state directory, no token): refused, with advice.
    let elsewhere = tempfile::tempdir().unwrap();
    let output = jobmgr_in(elsewhere.path())
        .args(["job", "--server", &url, "create", "stranger-job"])
        .run_bounded("jobmgr job create without a token");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("--token-file"),
        "{stderr}"
    );
    let token = std::fs::read_to_string(dir.path().join("token")).unwrap();
    let (_, list) = Api::new(&url).with_token(token.trim()).get("/jobs");
    let names: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["operator-job"]);
}

#[test]
fn an_exposed_or_linked_token_file_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let refused = |what: &str| {
        let output = jobmgr_in(dir.path())
            .args(["server", "--http", "127.0.0.1:0", "--bedrock", "none"])
            .run_bounded(what);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(!output.status.success(), "{what}: it started: {stdout}");
        assert!(!stdout.contains("ready"), "{what}: {stdout}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = refused("a server with a group-readable token file to refuse it");
    assert!(
        stderr.contains(&format!("chmod 600 {}", file.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("0123456789abcdef"), "{stderr}");

    // A symbolic link, even to a private file, is refused and left alone.
    let target = dir.path().join("elsewhere");
    std::fs::rename(&file, &target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, &file).unwrap();
    let stderr = refused("a server with a symlinked token file to refuse it");
    assert!(
        stderr.contains("symbolic link") && stderr.contains("remove it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "0123456789abcdef\n"
    );
}

#[test]
fn trusting_loopback_on_the_bedrock_port_is_explicit_and_loud() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, ready) = server_in(dir.path(), &["--bedrock-trust-loopback"]);
    let bedrock = field(&ready, "bedrock");
    let answer = raw_exchange(
        &bedrock,
        b"CreateJob\r\nname: old-client\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("200 OK"), "{answer}");
    let log = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(
        log.contains("WARN") && log.contains("ANY local user, workers included"),
        "{log}"
    );
    // The HTTP port still needs the token.
    let url = field(&ready, "http");
    assert_error(
        Api::new(&url).without_token().get("/jobs"),
        401,
        "unauthorized",
    );

    // Without the flag (the default), the same request is refused, and
    // nothing is said about trusting loopback.
    let other = tempfile::tempdir().unwrap();
    let (_server, ready) = server_in(other.path(), &[]);
    let answer = raw_exchange(
        &field(&ready, "bedrock"),
        b"CreateJob\r\nname: old-client\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("401 Unauthorized"), "{answer}");
    let log = std::fs::read_to_string(other.path().join("stderr")).unwrap();
    assert!(!log.contains("bedrock-trust-loopback"), "{log}");
}

#[test]
fn a_token_on_the_command_line_is_warned_about_and_one_in_the_environment_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, ready) = server_in(dir.path(), &["--token", "on-the-command-line"]);
    let api = Api::new(&field(&ready, "http")).with_token("on-the-command-line");
    assert_eq!(api.get("/jobs").0, 200, "the given token is the server's");
    let log = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(
        log.contains("WARN") && log.contains("/proc/PID/cmdline"),
        "{log}"
    );

    let other = tempfile::tempdir().unwrap();
    let child = jobmgr_in(other.path())
        .args(["server", "--http", "127.0.0.1:0", "--bedrock", "none"])
        .env("JOBMGR_TOKEN", "from-the-environment")
        .env("JOBMGR_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(other.path().join("stderr")).expect("stderr file"))
        .spawn()
        .expect("spawn jobmgr server");
    let mut guard = ChildGuard::new(child, "a server with its token in the environment");
    // The warning would come before the ready line.
    let ready = ready_line(guard.child()).expect("ready line");
    let api = Api::new(&field(&ready, "http")).with_token("from-the-environment");
    assert_eq!(api.get("/jobs").0, 200);
    let log = std::fs::read_to_string(other.path().join("stderr")).unwrap();
    assert!(!log.contains("/proc/PID/cmdline"), "{log}");
}

#[test]
fn metrics_refuse_a_client_without_the_token() {
    let server = Server::builder()
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let url = format!("http://{}/metrics", server.metrics);
    let client = reqwest::blocking::Client::new();
    for token in [None, Some("wrong")] {
        let mut request = client.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().expect("scrape");
        assert_eq!(response.status().as_u16(), 401, "token {token:?}");
        let text = response.text().unwrap();
        assert!(!text.contains("jobmgr_"), "{text}");
    }
    let text = scrape(&server.metrics);
    assert!(text.contains("jobmgr_"), "{text}");
}

#[test]
fn a_worker_never_gets_the_token() {
    let server = Server::start();
    let out = tempfile::tempdir().unwrap();
    let env_file = out.path().join("env");
    let sup = Supervisor::builder(&server.url)
        // Even when asked to pass it through.
        .arg("--env-allow")
        .arg("PATH,JOBMGR_TOKEN,JOBMGR_TOKEN_FILE")
        .worker(
            "PrintEnv",
            &format!(
                "#!/bin/sh\nenv > '{}'\ncat >/dev/null\n",
                env_file.display()
            ),
        )
        .start();
    let api = server.api();
    let id = api.create(json!({"name": "PrintEnv"}));
    wait_for("the worker to finish", &sup, || {
        match api.state(id).as_deref() {
            None | Some("FINISHED") => Some(()),
            _ => None,
        }
    });
    let env = std::fs::read_to_string(&env_file).expect("the worker's environment");
    assert!(
        env.contains("PATH="),
        "the worker ran with an environment: {env}"
    );
    assert!(
        !env.contains(token()),
        "the token reached the worker:\n{env}"
    );
    assert!(!env.contains("JOBMGR_TOKEN"), "{env}");
}
