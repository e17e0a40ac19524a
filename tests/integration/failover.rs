//! Several job servers in `--server` (servers that share a store): the
//! supervisor and the CLI use the next one when one does not answer, and
//! lists that cannot be right are refused at start.

use serde_json::{Value, json};

use crate::common::*;

/// An address where nothing listens (a port from the OS, let go).
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// The job's archived end on `api`'s server.
fn wait_ended(api: &Api, logs: &dyn Logs, id: i64) -> Value {
    wait_for(&format!("job {id} to end"), logs, || {
        let (status, history) = api.get(&format!("/jobs/{id}/history"));
        (status == 200 && !history["archived"].is_null()).then(|| history["archived"].clone())
    })
}

/// Runs `jobmgr ARGS` with the fixtures' token; returns (exit code,
/// stdout, stderr).
fn jobmgr(args: &[&str]) -> (i32, String, String) {
    jobmgr_with(&[("JOBMGR_TOKEN", token())], args)
}

#[test]
fn the_supervisor_and_the_cli_use_the_next_server_when_the_first_does_not_answer() {
    let server = Server::start();
    let list = format!("{},{}", dead_url(), server.url);
    let sup = Supervisor::builder(&list)
        .worker("Hello", &sh("echo '{\"said\":\"hello\"}'"))
        .start();
    let (code, stdout, stderr) = jobmgr(&["job", "create", "Hello", "--server", &list]);
    assert_eq!(code, 0, "jobmgr job create through a list: {stderr}");
    let id: i64 = serde_json::from_str::<Value>(&stdout).expect("JSON")["jobID"]
        .as_i64()
        .expect("jobID");
    let ended = wait_ended(&server.api(), &sup, id);
    assert_eq!(ended["state"], "FINISHED", "{ended}");
    assert_eq!(ended["data"]["said"], "hello", "{ended}");
}

#[test]
fn a_supervisor_carries_on_through_another_server_when_its_server_dies() {
    let mut first = Server::start();
    let second = Server::start();
    let list = format!("{},{}", first.url, second.url);
    let sup = Supervisor::builder(&list)
        .worker("Hello", &sh("echo '{\"ok\":true}'"))
        .start();
    let before = first.api().create(json!({"name": "Hello"}));
    assert_eq!(wait_ended(&first.api(), &sup, before)["state"], "FINISHED");

    first.kill9();
    let after = second.api().create(json!({"name": "Hello"}));
    let ended = wait_ended(&second.api(), &sup, after);
    assert_eq!(ended["state"], "FINISHED", "{ended}");
    let log = sup.stderr();
    assert!(log.contains("job server switched"), "{log}");
    assert!(log.contains(&second.url), "{log}");
}

#[test]
fn server_lists_that_cannot_be_right_are_refused_at_start() {
    let a = "http://127.0.0.1:9";
    let b = "http://127.0.0.1:10";
    for (list, said) in [
        (format!("{a},,{b}"), "an empty item"),
        (format!("{a},"), "an empty item"),
        (format!("{a},{a}/"), "given twice"),
        (
            format!("{a},bedrock://127.0.0.1:8888"),
            "bedrock:// takes one server",
        ),
        (format!("{a},localhost:8889"), "is not http://HOST:PORT"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let workers = dir.path().to_str().unwrap();
        for command in [
            &["--server", &list, "--worker-path", workers][..],
            &[
                "check-config",
                "--offline",
                "--server",
                &list,
                "--worker-path",
                workers,
            ][..],
        ] {
            let (code, _, stderr) = jobmgr(command);
            assert_eq!(code, 2, "{command:?}: {stderr}");
            assert!(
                stderr.contains(said),
                "{command:?}: want {said:?} in {stderr}"
            );
        }
        let (code, _, stderr) = jobmgr(&["job", "list", "--server", &list]);
        assert_ne!(code, 0, "job list took {list}: {stderr}");
    }
}

/// In the configuration file the list is a string or an array of URLs;
/// anything else is refused naming the key.
#[test]
fn the_server_key_takes_a_string_or_an_array_of_urls() {
    let dir = tempfile::tempdir().unwrap();
    let workers = dir.path().to_str().unwrap();
    let config = dir.path().join("jobmgr.toml");
    std::fs::write(
        &config,
        "server = [\"http://127.0.0.1:9\", \"http://127.0.0.1:10\"]\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let check = || {
        jobmgr(&[
            "check-config",
            "--offline",
            "--config",
            config,
            "--worker-path",
            workers,
        ])
    };
    let (code, stdout, stderr) = check();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("server = \"http://127.0.0.1:9,http://127.0.0.1:10\""),
        "{stdout}"
    );
    std::fs::write(dir.path().join("jobmgr.toml"), "server = 8889\n").unwrap();
    let (code, _, stderr) = check();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("server"), "{stderr}");
    assert!(stderr.contains("an array of URLs"), "{stderr}");
}

/// A first server that takes the connection and drops it unanswered: a
/// read (GET) is asked again of the next server; a create is not, since
/// the first may have done it, and the next command goes to the next one.
#[test]
fn a_read_goes_to_the_next_server_when_the_first_drops_it_a_create_does_not() {
    let server = Server::start();
    let api = server.api();
    api.create(json!({"name": "Listed"}));
    let dropper = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dropping = format!("http://{}", dropper.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in dropper.incoming().flatten() {
            // Read the request, then close without a word.
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut &stream, &mut buf);
            drop(stream);
        }
    });
    let list = format!("{dropping},{}", server.url);
    let (code, stdout, stderr) = jobmgr(&["job", "list", "--server", &list, "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("Listed"), "{stdout}");

    let (code, _, stderr) = jobmgr(&["job", "create", "Once", "--server", &list]);
    assert_ne!(
        code, 0,
        "a create dropped by the first server was sent again"
    );
    assert!(stderr.contains(&dropping), "{stderr}");
    let (status, listing) = api.get("/jobs?name=Once");
    assert_eq!(status, 200);
    assert_eq!(listing["jobs"], json!([]), "{listing}");
}

#[test]
fn a_job_running_when_its_server_dies_is_reported_through_another_server_on_the_same_database() {
    use std::os::unix::fs::PermissionsExt;
    let database = std::sync::Arc::new(TestDatabase::create());
    let mut first = Server::builder().on_database(&database).start();
    let second = Server::builder().on_database(&database).start();
    // The worker waits for a file, so that its server can die mid-run, and
    // records each run it completes.
    let shared = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = shared.path().display();
    let list = format!("{},{}", first.url, second.url);
    let sup = Supervisor::builder(&list)
        .arg("--lease")
        .arg("20s")
        .worker(
            "Wait",
            &sh(&format!(
                "while [ ! -e '{o}/go' ]; do sleep 0.02; done\n\
                 echo \"$JOBMGR_JOB_ID\" >> '{o}/runs'\necho '{{\"done\":true}}'"
            )),
        )
        .start();
    let id = first.api().create(json!({"name": "Wait"}));
    wait_for("the job to run", &sup, || {
        (second.api().state(id).as_deref() == Some("RUNNING")).then_some(())
    });

    first.kill9();
    std::fs::write(shared.path().join("go"), "").unwrap();
    // The report (spooled if it had to be) lands through the other server:
    // the same lease on the same database, so the job ends once, finished.
    let ended = wait_ended(&second.api(), &sup, id);
    assert_eq!(ended["state"], "FINISHED", "{ended}");
    assert_eq!(ended["data"]["done"], true, "{ended}");
    let runs = std::fs::read_to_string(shared.path().join("runs")).unwrap();
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        [id.to_string()],
        "ran once"
    );
    assert_eq!(second.api().outcomes(id), ["finished"]);
}
