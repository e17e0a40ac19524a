//! The README's quick start as a new user runs it: `config/demo.toml` from
//! the checkout, and "Giving it work" with the token the README exports.
//! The demo keeps a store of its own (`target/demo/`), never the default
//! one the packaged service or the user's other servers use.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::*;

/// The demo supervisor, killed (by its pid) when dropped.
struct Demo {
    child: Child,
    stderr: PathBuf,
}

impl Demo {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child, "the demo supervisor");
    }
}

/// A copy of the checkout as far as the demo needs it: `config/demo.toml`
/// (the real file) and `workers/` (a link to the real workers), with a home
/// and a default state directory of its own in `dir`.
fn checkout(dir: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::copy(repo.join("config/demo.toml"), dir.join("config/demo.toml")).unwrap();
    std::os::unix::fs::symlink(repo.join("workers"), dir.join("workers")).unwrap();
    std::fs::create_dir_all(dir.join("home")).unwrap();
}

/// `jobmgr` run in `dir` as a user's shell would: no `JOBMGR_*` variables,
/// `HOME` in `dir`, and the default store (`STATE_DIRECTORY`, which wins
/// over `/var/lib/jobmgr` as root and `~/.local/state` otherwise) in
/// `dir/default-state`, so that a demo using the default is seen there.
fn jobmgr(dir: &Path) -> Command {
    let mut command = Command::new(bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") || key.starts_with("XDG_") {
            command.env_remove(key);
        }
    }
    command
        .current_dir(dir)
        .env("HOME", dir.join("home"))
        .env("STATE_DIRECTORY", dir.join("default-state"));
    command
}

/// Starts the demo as the README says, with its ports from the OS.
fn start_demo(dir: &Path) -> (Demo, String) {
    let stderr = dir.join("demo.stderr");
    let child = jobmgr(dir)
        .args(["--config", "config/demo.toml"])
        .args(["--http", "127.0.0.1:0", "--bedrock", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("start the demo");
    let mut demo = Demo { child, stderr };
    let ready = ready_line(&mut demo.child)
        .unwrap_or_else(|_| panic!("the demo did not become ready:\n{}", demo.stderr()));
    let http = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= in the ready line {ready:?}"))
        .to_string();
    let http = if http.contains("://") {
        http
    } else {
        format!("http://{http}")
    };
    (demo, http)
}

/// `jobmgr job list` against the demo from `dir`, with `envs`.
fn job_list(dir: &Path, server: &str, envs: &[(&str, &str)]) -> (i32, String, String) {
    let output = jobmgr(dir)
        .args(["job", "list", "--server", server, "--format", "json"])
        .envs(envs.iter().copied())
        .run_bounded("jobmgr job list");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_demo_keeps_its_store_in_target_demo_and_the_readme_export_finds_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    checkout(dir);
    let (demo, server) = start_demo(dir);

    // The store, its lock and its token are the demo's own.
    let store = dir.join("target/demo");
    for file in ["jobs.db", "token"] {
        assert!(
            store.join(file).is_file(),
            "the demo has no {file} in target/demo; stderr:\n{}",
            demo.stderr()
        );
    }
    // "Giving it work": one export, then the CLI finds the demo's token and
    // sees the jobs config/demo.toml declares.
    let listed = poll("the demo's declared jobs in `job list`", || {
        let (code, out, err) =
            job_list(dir, &server, &[("JOBMGR_TOKEN_FILE", "target/demo/token")]);
        assert!(
            code == 0,
            "job list with the README's export failed ({code}): {err}"
        );
        (out.contains("Hello") && out.contains("CheckLiveness")).then_some(out)
    });
    assert!(listed.contains("Hello"), "{listed}");

    // Nothing went to the default store: neither the state directory a
    // service (or root) would use, nor the user's ~/.local/state.
    assert!(
        !dir.join("default-state").exists(),
        "the demo wrote into the default state directory: {:?}",
        std::fs::read_dir(dir.join("default-state"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    assert!(
        !dir.join("home/.local/state/jobmgr").exists(),
        "the demo wrote into ~/.local/state/jobmgr"
    );
    drop(demo);
}

#[test]
fn without_the_export_the_cli_finds_no_demo_token_where_the_default_store_is() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    checkout(dir);
    let (demo, server) = start_demo(dir);

    // The default token file is not the demo's: the CLI sends none, and the
    // refusal says where it looked and how to pass one.
    let (code, out, err) = job_list(dir, &server, &[]);
    assert_ne!(code, 0, "job list without a token succeeded: {out}");
    assert!(
        err.contains("default-state/token") && err.contains("--token-file"),
        "the refusal does not say where the token was looked for: {err}"
    );
    // A token file that is not the demo's is refused too.
    let other = dir.join("other-token");
    std::fs::write(&other, "not-the-demo-token").unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (code, _, err) = job_list(
        dir,
        &server,
        &[("JOBMGR_TOKEN_FILE", other.to_str().unwrap())],
    );
    assert_ne!(code, 0, "job list with another token succeeded");
    assert!(err.contains("other-token"), "{err}");
    drop(demo);
}
