//! BedrockWorkerManager's PHP worker classes run unchanged
//! (`--worker-kind bwm-php`): real PHP (Debian's php-cli, which CI
//! installs) runs the fixture classes in `tests/fixtures/bwm/`, each
//! extending the test stand-in for `BedrockWorker`, through jobmgr's runner,
//! under a supervisor with its embedded server. Without php on PATH these
//! tests skip, saying so.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::common::*;

/// The fixture classes and their bootstrap.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bwm")
}

/// Whether PHP's command-line interpreter is here; says so when not.
fn php_here(test: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("php").is_file()));
    if !found {
        eprintln!("SKIPPED {test}: no php on PATH (install php-cli; CI does)");
    }
    found
}

/// A supervisor with its embedded server whose workers are the fixture
/// classes, with `args` added.
fn php_supervisor(args: &[&str]) -> Supervisor {
    php_supervisor_as(Supervisor::embedded(), args)
}

/// As [`php_supervisor`], from `builder`. The fixtures are copied into the
/// supervisor's directory (the classes into its worker path, the bootstrap
/// beside it), where workers of any uid can read them.
fn php_supervisor_as(mut builder: SupervisorBuilder, args: &[&str]) -> Supervisor {
    let workers = builder.path().join("workers");
    let site = builder.path().join("site");
    std::fs::create_dir_all(site.join("lib")).expect("site dir");
    for (from, to) in [
        (fixtures(), &workers),
        (fixtures().join("lib"), &site.join("lib")),
    ] {
        for entry in std::fs::read_dir(&from).expect("fixtures") {
            let path = entry.expect("fixture").path();
            if path.extension().is_some_and(|e| e == "php") && path.is_file() {
                let name = path.file_name().expect("name");
                let to = if name == "bootstrap.php" { &site } else { to };
                std::fs::copy(&path, to.join(name)).expect("copy");
            }
        }
    }
    let bootstrap = site.join("bootstrap.php");
    builder = builder
        .arg("--worker-kind")
        .arg("bwm-php")
        .arg("--php-bootstrap")
        .arg(bootstrap.to_str().expect("utf-8 path"));
    for arg in args {
        builder = builder.arg(arg);
    }
    builder.start()
}

/// Waits until the job is in `state`; returns it.
fn wait_state(api: &Api, logs: &dyn Logs, id: i64, state: &str) -> Value {
    wait_for(&format!("job {id} {state}"), logs, || {
        let job = api.job(id);
        (job["state"] == state).then_some(job)
    })
}

/// The job's attempts as its history records them.
fn attempts(api: &Api, id: i64) -> Vec<Value> {
    let (status, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(status, 200, "{history}");
    history["attempts"].as_array().expect("attempts").clone()
}

#[test]
fn a_repeating_job_finishes_with_the_data_its_class_changed_for_its_next_run() {
    if !php_here("a_repeating_job_finishes_with_the_data…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    let id = api.create(
        json!({"name": "www/CountUp?source=test", "data": {"count": 1},
        "repeat": "FINISHED, +1 SECOND"}),
    );
    let job = wait_for("the count passed from run to run", &sup, || {
        let job = api.job(id);
        (job["data"]["count"].as_i64()? >= 3).then_some(job)
    });
    // Each run started from the data the one before finished with.
    assert_eq!(job["name"], "www/CountUp?source=test", "{job}");
    let runs = attempts(&api, id);
    assert!(runs.len() >= 2, "{runs:?}");
    assert!(
        runs.iter().take(2).all(|a| a["outcome"] == "finished"),
        "{runs:?}"
    );
}

#[test]
fn a_retryable_exception_retries_with_its_delay_time_name_and_the_workers_data() {
    if !php_here("a_retryable_exception_retries…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    // Its delay: 120 s.
    let delayed = api.create(json!({"name": "www/RetryLater", "data": {"n": 1}}));
    // Its nextRun, which wins over the delay.
    let timed = api.create(json!({"name": "www/RetryLater",
        "data": {"nextRun": "2030-01-02 03:04:05"}}));
    // A new name, on a repeating job retried at its delay, not its repeat.
    let renamed = api.create(json!({"name": "www/RetryLater",
        "data": {"newName": "www/Renamed", "delay": 300, "ignoreRepeat": true},
        "repeat": "FINISHED, +1 HOUR"}));
    for id in [delayed, timed, renamed] {
        wait_for(&format!("job {id} retried"), &sup, || {
            let runs = attempts(&api, id);
            (runs.first()?["outcome"] == "retried").then_some(())
        });
    }
    let job = api.job(delayed);
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert_eq!(
        job["data"]["tried"], true,
        "the worker's data went with the retry: {job}"
    );
    assert_eq!(job["data"]["n"], 1, "{job}");
    let wait = seconds_until(job["nextRun"].as_str().expect("nextRun"));
    assert!(
        (100..=125).contains(&wait),
        "about 120 s ahead: {wait} s, {job}"
    );

    let job = api.job(timed);
    assert_eq!(job["nextRun"], "2030-01-02 03:04:05", "{job}");
    assert_eq!(job["data"]["tried"], true, "{job}");

    let job = api.job(renamed);
    assert_eq!(job["name"], "www/Renamed", "{job}");
    let wait = seconds_until(job["nextRun"].as_str().expect("nextRun"));
    assert!(
        (250..=305).contains(&wait),
        "the delay, not the hourly repeat: {wait} s, {job}"
    );
}

/// Seconds from now until a protocol time (`YYYY-MM-DD HH:MM:SS`, UTC).
fn seconds_until(time: &str) -> i64 {
    let at = jobmgr::protocol::Timestamp::parse(time).expect("a time");
    (at.0 - jobmgr::protocol::Timestamp::now().0) / 1000
}

#[test]
fn a_thrown_error_fails_the_job_at_once_with_its_message_and_trace() {
    if !php_here("a_thrown_error_fails_the_job_at_once…") {
        return;
    }
    // Five attempts allowed: BWM fails a job that threw, and so do we.
    let sup = php_supervisor(&["--max-attempts", "5"]);
    let api = sup.api();
    let id = api.create(json!({"name": "www/Explode", "data": {"kept": true}}));
    let job = wait_state(&api, &sup, id, "FAILED");
    let details = &job["data"]["_jobmgr"];
    assert_eq!(
        details["reason"], "RuntimeException: boom: the partner API said no",
        "{job}"
    );
    assert_eq!(details["exitCode"], 1, "{job}");
    assert!(
        details["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("Explode.php")),
        "the trace names the class file: {job}"
    );
    assert_eq!(job["data"]["kept"], true, "{job}");
    assert_eq!(attempts(&api, id).len(), 1, "no retries");
}

#[test]
fn a_mock_request_finishes_without_running_the_class() {
    if !php_here("a_mock_request_finishes…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    let mocked = api.create(json!({"name": "www/MockMe", "data": {"mockRequest": true}}));
    let real = api.create(json!({"name": "www/MockMe", "data": {}}));
    wait_for("the mock request finished", &sup, || {
        (api.outcomes(mocked).first()? == "finished").then_some(())
    });
    // The same class without mockRequest runs, and says so: it throws.
    let job = wait_state(&api, &sup, real, "FAILED");
    assert!(
        job["data"]["_jobmgr"]["stdout"]
            .as_str()
            .is_some_and(|o| o.contains("RAN")),
        "{job}"
    );
    let (_, history) = api.get(&format!("/jobs/{mocked}/history"));
    assert!(
        !history.to_string().contains("RAN"),
        "run() was skipped: {history}"
    );
}

#[test]
fn a_worker_creates_a_child_job_through_bedrock_with_its_job_token() {
    if !php_here("a_worker_creates_a_child_job…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    let parent =
        api.create(json!({"name": "www/MakeChild", "data": {"childName": "www/ChildWorker"}}));
    // The child ran; the parent was resumed and finished.
    wait_for("the parent finished after its child", &sup, || {
        (api.outcomes(parent)
            .iter()
            .filter(|o| *o == "finished")
            .count()
            >= 2)
            .then_some(())
    });
    // It was its child: the parent waited for it (a parent without children
    // would not run again), and the child holds what the class gave it.
    let (_, history) = api.get(&format!("/jobs/{parent}/history"));
    let child = history["archived"]["data"]["childJobID"]
        .as_i64()
        .unwrap_or_else(|| panic!("no childJobID in {history}"));
    let (_, child_history) = api.get(&format!("/jobs/{child}/history"));
    assert_eq!(
        child_history["archived"]["name"], "www/ChildWorker",
        "{child_history}"
    );
    assert_eq!(
        child_history["archived"]["state"], "FINISHED",
        "{child_history}"
    );
    assert_eq!(
        child_history["archived"]["data"]["parent"], parent,
        "{child_history}"
    );
    // The worker never had the server's token: nothing it wrote shows it.
    let token = std::fs::read_to_string(sup.dir.path().join("token")).expect("token file");
    assert!(!history.to_string().contains(token.trim()), "{history}");
}

#[test]
fn a_class_file_that_does_not_parse_or_lacks_its_class_fails_saying_which() {
    if !php_here("a_class_file_that_does_not_parse…") {
        return;
    }
    let sup = php_supervisor(&["--max-attempts", "1"]);
    let api = sup.api();
    let broken = api.create(json!({"name": "www/SyntaxBroken"}));
    let classless = api.create(json!({"name": "www/NoClassHere"}));
    let job = wait_state(&api, &sup, broken, "FAILED");
    let stderr = job["data"]["_jobmgr"]["stderr"]
        .as_str()
        .unwrap_or_default();
    assert!(
        stderr.contains("SyntaxBroken.php") && stderr.contains("syntax error"),
        "{job}"
    );
    let job = wait_state(&api, &sup, classless, "FAILED");
    let stderr = job["data"]["_jobmgr"]["stderr"]
        .as_str()
        .unwrap_or_default();
    assert!(
        stderr.contains("NoClassHere") && stderr.contains("SomethingElse"),
        "{job}"
    );
}

#[test]
fn a_worker_that_calls_exit_itself_ends_by_its_exit_code() {
    if !php_here("a_worker_that_calls_exit_itself…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    let id = api.create(json!({"name": "www/ExitsItself", "data": {"same": 1}}));
    wait_for("the job finished", &sup, || {
        (api.outcomes(id).first()? == "finished").then_some(())
    });
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    let archived = &history["archived"];
    assert_eq!(archived["data"]["same"], 1, "data unchanged: {history}");
}

#[test]
fn names_that_are_no_class_fail_and_missing_classes_wait_for_a_host_that_has_them() {
    if !php_here("names_that_are_no_class…") {
        return;
    }
    let sup = php_supervisor(&["--no-worker-timeout", "1h"]);
    let api = sup.api();
    // Not a PHP class name: nothing runs, the job fails at once.
    let bad = api.create(json!({"name": "www/Send-Email"}));
    let job = wait_state(&api, &sup, bad, "FAILED");
    assert_eq!(job["data"]["_jobmgr"]["outcome"], "no_worker", "{job}");
    // No such class file here: handed back for another supervisor.
    let missing = api.create(json!({"name": "www/Elsewhere"}));
    let job = wait_for("a no-worker hand-back", &sup, || {
        let job = api.job(missing);
        (job["data"]["_jobmgr"]["noWorkerHandBacks"].as_i64()? >= 1).then_some(job)
    });
    assert_ne!(job["state"], "FAILED", "{job}");
    // A class file put in place later runs (a deploy): the next hand-out
    // includes it afresh.
    let class = std::fs::read_to_string(fixtures().join("ChildWorker.php"))
        .expect("read")
        .replace("class ChildWorker", "class Elsewhere");
    let aside = sup.workers().join(".Elsewhere.php.new");
    std::fs::write(&aside, class).expect("write");
    std::fs::rename(&aside, sup.workers().join("Elsewhere.php")).expect("deploy");
    wait_for("the deployed class ran", &sup, || {
        api.outcomes(missing)
            .iter()
            .any(|o| o == "finished")
            .then_some(())
    });
    drop(job);
}

#[test]
fn as_root_a_php_worker_runs_in_the_sandbox_under_a_uid_of_its_own() {
    if !php_here("as_root_a_php_worker_runs…") {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED as_root_a_php_worker_runs…: a uid per job needs root, and this test is not running as root"
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let builder = Supervisor::embedded().user(None);
    // Workers of any uid pass through the test's directory to the class
    // files, the bootstrap and the runner.
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let sup = php_supervisor_as(builder, &[]);
    let api = sup.api();
    let id = api.create(json!({"name": "www/WhoAmI", "repeat": "FINISHED, +1 HOUR"}));
    let job = wait_for("the worker's uid in the data", &sup, || {
        let job = api.job(id);
        job["data"]["uid"].as_i64().map(|_| job)
    });
    let uid = job["data"]["uid"].as_i64().expect("uid");
    assert!(uid > 0, "not root: {job}");
    assert!(
        job["data"]["cwd"]
            .as_str()
            .is_some_and(|cwd| cwd.starts_with(&sup.scratch().display().to_string())),
        "in its scratch directory: {job}"
    );
}

#[test]
fn a_class_that_keeps_asking_for_a_retry_now_does_not_grow_its_data() {
    if !php_here("a_class_that_keeps_asking_for_a_retry_now…") {
        return;
    }
    let sup = php_supervisor(&[]);
    let api = sup.api();
    // RetryableException's default delay is 0: retried again and again,
    // never sooner than a second.
    let id = api.create(json!({"name": "www/RetryLater", "data": {"delay": 0}}));
    let job = wait_for("three retries", &sup, || {
        (attempts(&api, id).len() >= 3).then(|| api.job(id))
    });
    let details = &job["data"]["_jobmgr"];
    assert_eq!(details["outcome"], "retry", "{job}");
    assert!(
        details.get("_jobmgr").is_none()
            && !details["stdout"]
                .as_str()
                .unwrap_or_default()
                .contains("_jobmgr"),
        "the last run's details only, not nested in the worker's data: {job}"
    );
    assert!(job.to_string().len() < 4096, "{job}");
}

#[test]
fn a_class_whose_run_returned_is_finished_once_whatever_php_does_at_shutdown() {
    if !php_here("a_class_whose_run_returned_is_finished_once…") {
        return;
    }
    let sup = php_supervisor(&["--max-attempts", "5"]);
    let api = sup.api();
    let id = api.create(json!({"name": "www/ShutdownThrows", "data": {"sent": 0}}));
    wait_for("the job finished", &sup, || {
        (api.outcomes(id).first()? == "finished").then_some(())
    });
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(history["archived"]["data"]["sent"], 1, "{history}");
    assert_eq!(attempts(&api, id).len(), 1, "run once: {history}");
}

#[test]
fn data_larger_than_the_output_cap_and_output_after_run_keep_the_data() {
    if !php_here("data_larger_than_the_output_cap…") {
        return;
    }
    let sup = php_supervisor(&["--output-cap", "16KiB"]);
    let api = sup.api();
    let id = api.create(json!({"name": "www/BigData", "repeat": "FINISHED, +1 HOUR"}));
    let job = wait_for("the data kept", &sup, || {
        let job = api.job(id);
        job["data"]["blob"].is_string().then_some(job)
    });
    assert_eq!(job["data"]["blob"].as_str().map(str::len), Some(200 * 1024));
}

/// With `--server` and no state directory yet, and the umask of a
/// service (077), the supervisor makes the state directory and each one
/// above it that is missing passable by other uids (0711), its spool 0700:
/// a PHP job under a uid of its own reads the runner in the scratch
/// directory inside it, and runs.
#[test]
fn a_php_job_runs_under_a_uid_of_its_own_in_a_state_directory_the_supervisor_made() {
    let test = "a_php_job_runs_under_a_uid_of_its_own_in_a_state_directory_the_supervisor_made";
    if !php_here(test) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: a uid per job needs root, and this test is not running as root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url)
        .user(None)
        .default_state()
        .wrapped(&["sh", "-c", "umask 077 && exec \"$@\"", "sh"]);
    std::fs::set_permissions(builder.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let state = builder.path().join("var/lib/jobmgr");
    let builder = builder
        .arg("--db")
        .arg(state.join("jobs.db").to_str().expect("utf-8 path"))
        .arg("--worker-uids")
        .arg("70030-70031")
        .arg("--max-workers")
        .arg("2");
    let sup = php_supervisor_as(builder, &[]);
    let id = api.create(json!({"name": "www/WhoAmI", "repeat": "FINISHED, +1 HOUR"}));
    wait_for("the job's first run to end", &sup, || {
        let ended = attempts(&api, id).iter().any(|a| a["outcome"] != "running");
        ended.then_some(())
    });
    // Read after the run's end: it finished with the data its class set.
    let job = api.job(id);
    assert!(
        job["data"]["uid"].as_i64().is_some_and(|uid| uid >= 70030),
        "the job did not run under a uid of its own: {job}; history {:?}",
        attempts(&api, id)
    );
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o7777
    };
    for dir in [
        above(&state, 2),
        above(&state, 1),
        state.clone(),
        state.join("scratch"),
    ] {
        assert_eq!(mode(&dir), 0o711, "{}", dir.display());
    }
    assert_eq!(mode(&state.join("spool")), 0o700);
}

/// The directory `levels` above `dir`.
fn above(dir: &Path, levels: usize) -> PathBuf {
    dir.ancestors()
        .nth(levels)
        .expect("an ancestor")
        .to_path_buf()
}
