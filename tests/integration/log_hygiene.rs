//! No input can forge a line in a log: job names with control characters
//! are refused on every path that names a job, and text logs escape
//! control characters in whatever else they write (a worker's output, a
//! name already in an old database).

use serde_json::{Value, json};

use crate::common::*;

/// Names that would end a log line early, recolour a terminal, or reorder
/// what it shows.
const BAD_NAMES: [&str; 6] = [
    "a\nINFO forged",
    "a\rb",
    "a\tb",
    "a\u{1b}[31mb",
    "a\u{2028}b",
    "a\u{202e}b",
];

fn all_jobs(server: &Server) -> Vec<Value> {
    let (status, list) = server.api().get("/jobs?limit=1000");
    assert_eq!(status, 200, "{list}");
    list["jobs"].as_array().expect("jobs").clone()
}

#[test]
fn names_with_control_characters_are_refused_over_http() {
    let server = Server::start();
    let api = server.api();
    for name in BAD_NAMES {
        let answer = api.post("/jobs", json!({"name": name}));
        assert_error(answer.clone(), 400, "malformed_name");
        assert!(
            answer.1["message"]
                .as_str()
                .unwrap()
                .contains("control characters"),
            "{}",
            answer.1
        );
        assert_error(
            api.post(
                "/jobs/batch",
                json!({"jobs": [{"name": "fine"}, {"name": name}]}),
            ),
            400,
            "malformed_name",
        );
        assert_error(
            api.post("/dequeue", json!({"name": name})),
            400,
            "malformed_name",
        );
    }
    assert_eq!(all_jobs(&server), Vec::<Value>::new(), "nothing created");

    // A retry that renames is refused too, and leaves the job as it was.
    let id = api.create(json!({"name": "renamed"}));
    let held = api.take("renamed");
    let lease = held["lease"].as_str().expect("lease").to_string();
    assert_error(
        api.post(
            &format!("/jobs/{id}/retry"),
            json!({"lease": lease, "name": "x\ny"}),
        ),
        400,
        "malformed_name",
    );
    assert_eq!(api.job(id)["name"], "renamed");
    assert_eq!(api.job(id)["state"], "RUNNING");
    // Names beyond ASCII without control characters are fine.
    api.create(json!({"name": "café/envoi ☃"}));
}

#[test]
fn names_with_control_characters_are_refused_over_bedrock() {
    let server = Server::start();
    // `\n` and `\u001b` are Bedrock header escapes, undone before the check.
    for escaped in [
        r"a\nINFO forged",
        r"a\rb",
        r"a\tb",
        r"a\u001b[31mb",
        r"a\u2028b",
    ] {
        let answer = bedrock_exchange(
            &server.bedrock,
            format!("CreateJob\r\nname: {escaped}\r\n\r\n").as_bytes(),
        );
        assert!(
            answer.starts_with(
                "402 Malformed name: control characters (newline, tab, escape, ...) are not allowed\r\n"
            ),
            "{escaped}: {answer:?}"
        );
    }
    let jobs = json!([{"name": "fine"}, {"name": "a\nb"}]).to_string();
    let answer = bedrock_exchange(
        &server.bedrock,
        format!("CreateJobs\r\njobs: {jobs}\r\n\r\n").as_bytes(),
    );
    assert!(answer.starts_with("402 Malformed name"), "{answer:?}");
    let answer = bedrock_exchange(&server.bedrock, b"GetJob\r\nname: a\\nb\r\n\r\n");
    assert!(answer.starts_with("402 Malformed name"), "{answer:?}");
    assert_eq!(all_jobs(&server), Vec::<Value>::new(), "nothing created");
}

#[test]
fn a_supervisor_refuses_a_job_name_pattern_with_a_newline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workers = dir.path().join("workers");
    std::fs::create_dir(&workers).expect("workers");
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").expect("config");
    let output = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&empty)
        .arg("--worker-path")
        .arg(&workers)
        .args(["--http", "127.0.0.1:0", "--bedrock", "none"])
        .args(["--job-name", "www/*\nINFO forged"])
        .run_bounded("jobmgr with a bad --job-name");
    assert_eq!(output.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("control characters"), "{stderr}");
}

/// Whether any line of `log` starts with `marker` (a forged line).
fn forged(log: &str, marker: &str) -> Option<String> {
    log.lines()
        .find(|line| line.starts_with(marker))
        .map(str::to_string)
}

#[test]
fn a_workers_output_cannot_forge_a_line_in_the_supervisors_log() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker(
            "Forger",
            &sh(r"printf 'before\nFORGED-LINE INFO jobmgr: all is well\r\nFORGED-CR\n' >&2"),
        )
        .start();
    let id = api.create(json!({"name": "Forger"}));
    wait_for("the worker's stderr in the log", &sup, || {
        sup.stderr().contains("FORGED-CR").then_some(())
    });
    wait_for(&format!("job {id} to be done"), &sup, || {
        api.state(id).is_none().then_some(())
    });
    let log = sup.stderr();
    assert_eq!(forged(&log, "FORGED"), None, "a forged line:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains(r"before\nFORGED-LINE INFO") && l.contains(r"well\r\nFORGED-CR")),
        "the output is logged, escaped, on one line:\n{log}"
    );
}

#[test]
fn a_name_already_in_an_old_database_cannot_forge_a_line() {
    let mut server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "legacy"}));
    // A name written before names were checked.
    server.kill9();
    {
        let db = rusqlite::Connection::open(server.db()).expect("open the store");
        db.execute(
            "UPDATE jobs SET name = ?1 WHERE job_id = ?2",
            rusqlite::params!["legacy\nFORGED-NAME INFO jobmgr: fine", id],
        )
        .expect("rename");
    }
    server.start_again_on_the_same_port();
    let sup = Supervisor::builder(&server.url).start();
    // The supervisor takes it, finds no worker for it, and says so.
    wait_for("the job to be taken", &sup, || {
        sup.stderr().contains("FORGED-NAME").then_some(())
    });
    let log = sup.stderr();
    assert_eq!(forged(&log, "FORGED"), None, "a forged line:\n{log}");
    assert!(log.contains(r"legacy\nFORGED-NAME"), "escaped:\n{log}");
}
