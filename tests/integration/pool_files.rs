//! Pool files (`/etc/jobmgr/pools/NAME.toml`, one per `jobmgr@NAME`
//! instance) and the site's drop-ins: `/etc/jobmgr/conf.d/*.toml` reaches
//! every pool, read before the pool file, whose own settings win; then the
//! pool's `pools/conf.d/*.toml`. Seen through `jobmgr check-config`, which
//! says where each value came from.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// `jobmgr check-config --config FILE` with no `JOBMGR_*` variable;
/// returns (exit code, stdout, stderr).
fn check_config(config: &Path) -> (i32, String, String) {
    let mut command = Command::new(bin());
    command
        .arg("check-config")
        .arg("--offline")
        .arg("--config")
        .arg(config);
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    let output = command.run_bounded("jobmgr check-config");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The line check-config prints for `key`.
fn line<'a>(output: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key} = ");
    output
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {key} in:\n{output}"))
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The worker directories the configuration names (`workers`, `batch`),
/// made, since check-config refuses a missing one as start does.
fn worker_dir(dir: &Path, name: &str) -> String {
    let path = dir.join("srv").join(name);
    std::fs::create_dir_all(&path).unwrap();
    path.display().to_string()
}

/// An /etc/jobmgr of a host: the README's site drop-in, one pool file and a
/// drop-in of the pools.
fn etc(dir: &Path) {
    write(
        &dir.join("jobmgr.toml"),
        &format!("worker-path = \"{}\"\n", worker_dir(dir, "workers")),
    );
    write(
        &dir.join("conf.d/10-site.toml"),
        "job-name = \"*\"\nmax-load = 5.0\nkill-grace = \"7s\"\n",
    );
    write(
        &dir.join("pools/batch.toml"),
        &format!(
            "job-name = \"batch/*\"\nworker-path = \"{}\"\nmax-workers = 2\n",
            worker_dir(dir, "batch")
        ),
    );
    write(&dir.join("pools/conf.d/10-pools.toml"), "max-workers = 4\n");
}

#[test]
fn a_pool_file_reads_the_site_drop_ins_first_and_its_own_settings_win() {
    let dir = tempfile::tempdir().unwrap();
    let etc_dir = dir.path();
    etc(etc_dir);
    let pool = etc_dir.join("pools/batch.toml");
    let (code, out, err) = check_config(&pool);
    assert_eq!(code, 0, "{err}");
    let site = etc_dir.join("conf.d/10-site.toml");
    // From the site drop-in, which the pool file does not set.
    for key in ["max-load", "kill-grace"] {
        assert!(
            line(&out, key).ends_with(&format!("# file {}", site.display())),
            "{key} does not come from the site drop-in:\n{out}"
        );
    }
    // The pool's own job-name wins over the site's.
    let job_name = line(&out, "job-name");
    assert!(
        job_name.starts_with("job-name = \"batch/*\"")
            && job_name.ends_with(&format!("# file {}", pool.display())),
        "{job_name}"
    );
    // The pools' drop-in comes last.
    let max_workers = line(&out, "max-workers");
    assert!(
        max_workers.starts_with("max-workers = 4")
            && max_workers.ends_with("pools/conf.d/10-pools.toml"),
        "{max_workers}"
    );
    // The main file is the host's default supervisor's, not the pool's.
    assert!(
        !line(&out, "worker-path").contains("srv/workers"),
        "a pool file read /etc/jobmgr/jobmgr.toml:\n{out}"
    );
}

#[test]
fn a_bad_site_drop_in_is_named_for_a_pool_and_other_directories_do_not_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let etc_dir = dir.path();
    etc(etc_dir);
    // A file outside a `pools` directory does not read ../conf.d.
    let elsewhere = etc_dir.join("other/batch.toml");
    write(
        &elsewhere,
        &format!(
            "job-name = \"batch/*\"\nworker-path = \"{}\"\n",
            worker_dir(etc_dir, "batch")
        ),
    );
    let (code, out, err) = check_config(&elsewhere);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("10-site.toml"),
        "a file outside pools/ read the site drop-ins:\n{out}"
    );

    // A bad site drop-in stops a pool too, and the error names it.
    write(&etc_dir.join("conf.d/20-bad.toml"), "max-load = \"lots\"\n");
    let (code, _, err) = check_config(&etc_dir.join("pools/batch.toml"));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("conf.d/20-bad.toml") && err.contains("max-load"),
        "{err}"
    );
}
