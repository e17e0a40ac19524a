//! Configuration as an operator meets it: the layers (main file, conf.d in
//! name order, `JOBMGR_*` variables, flags), `jobmgr check-config` with
//! where each value came from, and several pools in one process.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::common::*;

/// Runs `jobmgr check-config` with `args` and `envs` (and no other
/// `JOBMGR_*` variable); returns (exit code, stdout, stderr).
fn check_config(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(bin());
    // No server runs for these: the configuration alone is checked.
    command.arg("check-config").arg("--offline").args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("JOBMGR_") {
            command.env_remove(key);
        }
    }
    let output = command
        .envs(envs.iter().copied())
        .run_bounded(&format!("jobmgr check-config {}", args.join(" ")));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The value and the source of `key` in check-config's output.
fn setting(output: &str, key: &str) -> (String, String) {
    let prefix = format!("{key} = ");
    let line = output
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {key} in:\n{output}"));
    let (value, source) = line[prefix.len()..]
        .split_once(" # ")
        .unwrap_or_else(|| panic!("no source on {line:?}"));
    (value.trim().to_string(), source.trim().to_string())
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn layers_apply_in_order_file_conf_d_environment_flag() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("jobmgr.toml");
    write(
        &main,
        "worker-path = \"/srv\"\ntimeout = \"1m\"\nkill-grace = \"1s\"\nmax-workers = 2\nramp = 1\nbackoff = \"3s\"\n",
    );
    // Name order, not creation order: 20 is written first, 10 then.
    write(
        &dir.path().join("conf.d/20-late.toml"),
        "kill-grace = \"4s\"\nmax-workers = 4\n",
    );
    write(
        &dir.path().join("conf.d/10-early.toml"),
        "timeout = \"2m\"\nkill-grace = \"3s\"\nmax-workers = 3\nramp = 3\n",
    );
    // Not a .toml file: ignored.
    write(&dir.path().join("conf.d/README"), "not = valid toml [");
    let main_arg = main.to_str().unwrap();
    let (code, out, err) = check_config(
        &["--config", main_arg, "--max-workers", "6"],
        &[("JOBMGR_MAX_WORKERS", "5"), ("JOBMGR_RAMP", "5")],
    );
    assert_eq!(code, 0, "{err}");
    let early = dir.path().join("conf.d/10-early.toml");
    let late = dir.path().join("conf.d/20-late.toml");
    assert_eq!(
        setting(&out, "backoff"),
        ("\"3s\"".into(), format!("file {}", main.display()))
    );
    assert_eq!(
        setting(&out, "timeout"),
        ("\"2m\"".into(), format!("file {}", early.display()))
    );
    assert_eq!(
        setting(&out, "kill-grace"),
        ("\"4s\"".into(), format!("file {}", late.display()))
    );
    assert_eq!(
        setting(&out, "ramp"),
        ("5".into(), "environment JOBMGR_RAMP".into())
    );
    assert_eq!(
        setting(&out, "max-workers"),
        ("6".into(), "flag --max-workers".into())
    );
    assert_eq!(
        setting(&out, "drain-timeout"),
        ("\"2m\"".into(), "default".into())
    );
    assert!(
        out.contains(&format!("# file: {}", early.display())),
        "{out}"
    );
}

#[test]
fn a_bad_value_anywhere_is_refused_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("jobmgr.toml");
    write(&main, "worker-path = \"/srv\"\n");
    let bad = dir.path().join("conf.d/50-bad.toml");
    write(&bad, "# a comment\n\nmax-wokers = 3\n");
    let main_arg = main.to_str().unwrap();
    let (code, _, err) = check_config(&["--config", main_arg], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("50-bad.toml") && err.contains("line 3") && err.contains("max-wokers"),
        "names the file, line and key: {err}"
    );

    write(&bad, "timeout = \"soon\"\n");
    let (code, _, err) = check_config(&["--config", main_arg], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("50-bad.toml") && err.contains("line 1") && err.contains("timeout"),
        "{err}"
    );

    std::fs::remove_file(&bad).unwrap();
    let (code, _, err) = check_config(&["--config", main_arg], &[("JOBMGR_MAX_WORKERS", "many")]);
    assert_eq!(code, 2, "a bad variable is refused: {err}");
    assert!(
        err.contains("JOBMGR_MAX_WORKERS") || err.contains("max-workers"),
        "{err}"
    );

    let (code, _, err) = check_config(&["--config", "/nonexistent/jobmgr.toml"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/jobmgr.toml"), "{err}");
}

/// `text` with the example paths, users and groups of the shipped files
/// made ones this machine has (`dir`, and this process's own user and
/// group): check-config checks that they exist, as start does.
fn localised(text: &str, dir: &Path) -> String {
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .expect("this process's user");
    let group = nix::unistd::Group::from_gid(nix::unistd::getgid())
        .ok()
        .flatten()
        .expect("this process's group");
    let dir = format!("{:?}", dir.display().to_string());
    let mut out = text.to_string();
    for path in [
        "\"/srv/jobmgr/workers\"",
        "\"/code/www\"",
        "\"/code/batch\"",
    ] {
        out = out.replace(
            &format!("worker-path = {path}"),
            &format!("worker-path = {dir}"),
        );
    }
    // The pressure files and the site cgroup named must exist: a directory
    // of this test's stands in for /proc/pressure and the cgroup v2 mount.
    let pressure = Path::new(&dir.trim_matches('"')).join("pressure");
    let site = pressure.join("system.slice/php8.2-fpm.service");
    std::fs::create_dir_all(&site).expect("a site cgroup");
    for file in [
        pressure.join("memory"),
        pressure.join("io"),
        site.join("cpu.pressure"),
    ] {
        write_psi(&file, 0.0, 0.0);
    }
    out = out.replace(
        "pressure-dir = \"/proc/pressure\"",
        &format!("pressure-dir = {:?}", pressure.display().to_string()),
    );
    // The PHP files named must exist: a file of this directory's stands in.
    let php_file = Path::new(&dir.trim_matches('"')).join("bootstrap.php");
    std::fs::write(&php_file, "<?php\n").expect("a PHP file");
    for path in [
        "/code/bootstrap.php",
        "/usr/share/jobmgr/bwm-php-runner.php",
    ] {
        out = out.replace(
            &format!("{path:?}"),
            &format!("{:?}", php_file.display().to_string()),
        );
    }
    for user in ["jobmgr", "batch"] {
        out = out.replace(
            &format!("user = \"{user}\""),
            &format!("user = {:?}", me.name),
        );
    }
    out.replace("group = \"jobmgr\"", &format!("group = {:?}", group.name))
}

#[test]
fn every_shipped_config_file_checks() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut checked = 0;
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        // Relative paths (the demo's workers/) are from the repository.
        let text = std::fs::read_to_string(&path).unwrap();
        let local = dir.path().join(path.file_name().unwrap());
        write(&local, &localised(&text, dir.path()));
        let (code, out, err) = check_config(&["--config", local.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{}: {err}", path.display());
        assert!(out.contains("# ok: the configuration is valid"), "{out}");
        checked += 1;
    }
    assert!(checked > 0, "no config/*.toml found");
}

#[test]
fn tables_are_listed_with_their_file_and_pools_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("jobmgr.toml");
    write(
        &main,
        "worker-path = \"/srv\"\n\n[[pool]]\nname = \"www\"\njob-name = \"www/*\"\n",
    );
    write(
        &dir.path().join("conf.d/batch.toml"),
        "[[pool]]\nname = \"batch\"\njob-name = \"batch/*\"\nmax-workers = 1\n\n\
         [[job]]\nname = \"batch/*\"\ntimeout = \"2h\"\n",
    );
    let main_arg = main.to_str().unwrap();
    let (code, out, err) = check_config(&["--config", main_arg], &[]);
    assert_eq!(code, 0, "{err}");
    let pool_line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with("[[pool]]") && l.contains(&format!("name = \"{name}\"")))
            .unwrap_or_else(|| panic!("no pool {name}:\n{out}"))
            .to_string()
    };
    assert!(pool_line("www").ends_with(&format!("# file {}", main.display())));
    assert!(pool_line("batch").contains("max-workers = 1"));
    assert!(
        out.lines()
            .any(|l| l.starts_with("[[job]]") && l.contains("batch.toml")),
        "{out}"
    );

    // The same pool twice, from two files, is refused.
    write(
        &dir.path().join("conf.d/www-again.toml"),
        "[[pool]]\nname = \"www\"\njob-name = \"www2/*\"\n",
    );
    let (code, _, err) = check_config(&["--config", main_arg], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("\"www\"") && err.contains("twice"), "{err}");
}

#[test]
fn environment_variables_configure_a_running_supervisor() {
    let server = Server::start();
    let api = server.api();
    let _sup = Supervisor::builder(&server.url)
        .worker(
            "Picked",
            "#!/bin/sh\ncat > /dev/null\necho '{\"ran\":true}'\n",
        )
        .worker(
            "Ignored",
            "#!/bin/sh\ncat > /dev/null\necho '{\"ran\":true}'\n",
        )
        .env("JOBMGR_JOB_NAME", "Picked")
        .start();
    let ignored = api.create(json!({"name": "Ignored"}));
    let picked = api.create(json!({"name": "Picked"}));
    poll("the picked job to finish", || {
        api.state(picked).is_none().then_some(())
    });
    let job = api.job(ignored);
    assert_eq!(
        job["state"], "QUEUED",
        "JOBMGR_JOB_NAME limits what is taken: {job}"
    );
}

#[test]
fn two_pools_take_their_own_names_from_their_own_paths_under_their_own_caps() {
    use std::os::unix::fs::PermissionsExt;
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let base = builder.path().to_path_buf();
    let marks = base.join("marks");
    for pool in ["www", "batch"] {
        std::fs::create_dir_all(marks.join(pool)).unwrap();
        let script = format!(
            "#!/bin/sh\ncat > /dev/null\nmkdir \"$MARKS/{pool}/$JOBMGR_JOB_ID\"\n\
             n=$(ls \"$MARKS/{pool}\" | wc -l)\necho $n >> \"$MARKS.{pool}\"\nsleep 0.3\n\
             rmdir \"$MARKS/{pool}/$JOBMGR_JOB_ID\"\necho '{{\"pool\":\"{pool}\"}}'\n"
        );
        let path = base.join(pool).join("Work");
        write(&path, &script);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(base.join(pool), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = base.join("pools.toml");
    write(
        &config,
        &format!(
            "env = {{ MARKS = \"{}\" }}\n\n\
             [[pool]]\nname = \"www\"\njob-name = \"www/*\"\nworker-path = \"{}\"\nmax-workers = 4\n\n\
             [[pool]]\nname = \"batch\"\njob-name = \"batch/*\"\nworker-path = \"{}\"\nmax-workers = 1\n",
            marks.display(),
            base.join("www").display(),
            base.join("batch").display()
        ),
    );
    let sup = builder
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();

    let www = api.create(json!({"name": "www/Work", "repeat": "FINISHED, +1 HOUR"}));
    let batch: Vec<i64> = (0..4)
        .map(|_| api.create(json!({"name": "batch/Work", "repeat": "FINISHED, +1 HOUR"})))
        .collect();
    let other = api.create(json!({"name": "other/Work"}));
    let done = |id: i64| {
        let job = api.job(id);
        job["data"]["pool"].is_string().then_some(job)
    };
    let job = poll("the www job to run", || done(www));
    assert_eq!(job["data"]["pool"], "www", "run from the www path: {job}");
    for &id in &batch {
        let job = poll("the batch jobs to run", || done(id));
        assert_eq!(
            job["data"]["pool"], "batch",
            "run from the batch path: {job}"
        );
    }
    let seen = std::fs::read_to_string(marks.with_extension("batch")).unwrap();
    let most = seen
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .max()
        .unwrap();
    assert_eq!(most, 1, "the batch pool runs one at a time: {seen}");
    assert_eq!(
        api.job(other)["state"],
        "QUEUED",
        "a name no pool takes stays queued"
    );
    let stderr = sup.stderr();
    assert!(
        stderr.contains("www") && stderr.contains("batch"),
        "both pools start: {stderr}"
    );
}

#[test]
fn the_annotated_default_documents_every_key_and_each_one_parses() {
    let annotated = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/jobmgr.toml");
    let text = std::fs::read_to_string(&annotated).unwrap();
    // Every commented-out key and table line, uncommented.
    let uncommented: String = text
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with("[[")
                    || rest.split_once(" = ").is_some_and(|(key, _)| {
                        key.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                    }) =>
            {
                rest.to_string()
            }
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let dir = tempfile::tempdir().unwrap();
    let all = dir.path().join("jobmgr.toml");
    write(&all, &localised(&uncommented, dir.path()));
    let (code, out, err) = check_config(&["--config", all.to_str().unwrap()], &[]);
    assert_eq!(
        code, 0,
        "every documented key is valid:\n{err}\n{uncommented}"
    );
    // Every setting check-config knows is documented in the annotated file.
    for line in out
        .lines()
        .filter(|l| !l.starts_with("# jobmgr") && !l.starts_with("# file"))
    {
        let Some((key, _)) = line.trim_start_matches("# ").split_once(" = ") else {
            continue;
        };
        if key.starts_with("[[") {
            continue;
        }
        assert!(
            text.contains(&format!("# {key} = ")) || text.contains(&format!("\n{key} = ")),
            "{key} is not documented in config/jobmgr.toml"
        );
    }
}
