//! A server whose PostgreSQL goes away, through a fault-injecting proxy
//! between them: unreachable at start, it says so and retries with backoff
//! until the database answers; lost mid-run, requests answer 503 with a
//! clear error, nothing acknowledged is lost, and it recovers by itself.
//! These always run on PostgreSQL, whatever `JOBMGR_TEST_STORE` says.

use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::json;

use crate::common::{
    Api, FaultProxy, Server, TestDatabase, bin, kill_and_reap, poll, ready_line, write_token_file,
};

/// The database's URL through `proxy`.
fn via(database: &TestDatabase, proxy: &FaultProxy) -> String {
    database.url().replace("127.0.0.1:5432", proxy.addr())
}

#[test]
fn a_server_whose_database_is_unreachable_at_start_retries_and_serves_once_it_answers() {
    let database = TestDatabase::create();
    let proxy = FaultProxy::start("127.0.0.1:5432");
    proxy.cut();
    let dir = tempfile::tempdir().unwrap();
    let token_file = write_token_file(dir.path());
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let mut child = Command::new(bin())
        .args(["server", "--http", "127.0.0.1:0", "--bedrock", "none"])
        .arg("--db")
        .arg(via(&database, &proxy))
        .arg("--token-file")
        .arg(&token_file)
        .env("JOBMGR_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn jobmgr server");
    let log = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    // It says what it cannot reach, and keeps trying (no crash loop).
    poll("the server to say it retries", || {
        (log().matches("retrying").count() >= 2).then_some(())
    });
    assert!(
        matches!(child.try_wait(), Ok(None)),
        "the server exited instead of retrying:\n{}",
        log()
    );
    let text = log();
    assert!(
        text.contains("cannot reach the job store's database"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    proxy.restore();
    let line = match ready_line(&mut child) {
        Ok(line) => line,
        Err(_) => {
            kill_and_reap(&mut child, "a server that did not become ready");
            panic!(
                "the server did not become ready once its database answered:\n{}",
                log()
            );
        }
    };
    let url = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .expect("http= in the ready line")
        .to_string();
    let id = Api::new(&url).create(json!({"name": "after/outage"}));
    assert!(id > 0);
    kill_and_reap(&mut child, "the server");
}

#[test]
fn a_server_that_loses_its_database_answers_503_loses_nothing_and_recovers() {
    let database = Arc::new(TestDatabase::create());
    let proxy = FaultProxy::start("127.0.0.1:5432");
    let server = Server::builder()
        .on_database_at(&database, &via(&database, &proxy))
        .start();
    let api = server.api();
    let kept = api.create(json!({"name": "outage/kept", "data": {"n": 1}}));

    proxy.cut();
    // Every request answers at once, with an error that says what to do.
    let (status, answer) = poll("a create to be refused while the database is gone", || {
        let answer = api.post("/jobs", json!({"name": "outage/refused"}));
        (answer.0 != 200).then_some(answer)
    });
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["code"], "store_unavailable", "{answer}");
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(message.contains("retry"), "{answer}");
    let (status, answer) = api.get(&format!("/jobs/{kept}"));
    assert_eq!(status, 503, "a read too: {answer}");

    proxy.restore();
    let later = poll("creates to succeed again once the database is back", || {
        let (status, answer) = api.post("/jobs", json!({"name": "outage/later"}));
        (status == 200).then(|| answer["jobID"].as_i64().expect("jobID"))
    });
    // The job acknowledged before the outage is there, as it was; the
    // refused creates left nothing behind.
    let job = api.job(kept);
    assert_eq!(job["data"], json!({"n": 1}), "{job}");
    assert!(api.job(later)["name"] == "outage/later");
    let (_, listed) = api.get("/jobs?name=outage/*");
    let names: Vec<&str> = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["outage/kept", "outage/later"], "{listed}");
}

#[test]
fn healthz_recovers_by_itself_once_the_database_is_back() {
    let database = Arc::new(TestDatabase::create());
    let proxy = FaultProxy::start("127.0.0.1:5432");
    let server = Server::builder()
        .on_database_at(&database, &via(&database, &proxy))
        .start();
    let api = server.api();
    proxy.cut();
    poll("a create to be refused while the database is gone", || {
        let (status, _) = api.post("/jobs", json!({"name": "outage/refused"}));
        (status == 503).then_some(())
    });
    let (status, health) = api.get("/healthz");
    assert_eq!(
        (status, &health["status"]),
        (503, &json!("failing")),
        "{health}"
    );
    // Back, and no client writes: the server's own probe says so.
    proxy.restore();
    poll("healthz to say ok with no client write", || {
        let (status, health) = api.get("/healthz");
        (status == 200 && health["status"] == "ok").then_some(())
    });
}

#[test]
fn a_server_that_lost_its_database_is_woken_by_other_servers_again_once_it_is_back() {
    let database = Arc::new(TestDatabase::create());
    let proxy = FaultProxy::start("127.0.0.1:5432");
    let cut_off = Server::builder()
        .on_database_at(&database, &via(&database, &proxy))
        .start();
    let direct = Server::builder().on_database(&database).start();
    proxy.cut();
    poll("the cut-off server to notice", || {
        let (status, _) = cut_off.api().get("/jobs/1");
        (status == 503).then_some(())
    });
    proxy.restore();
    poll("the cut-off server to reach its database again", || {
        let (status, _) = cut_off.api().get("/jobs?name=none");
        (status == 200).then_some(())
    });
    // Its listener reconnects too: a take held on it is woken by a create
    // through the other server.
    let held = cut_off.api();
    let take = std::thread::spawn(move || {
        held.dequeue(json!({"name": "back/*", "waitMs": 3_600_000, "leaseMs": 60_000}))
    });
    poll("the take to be held", || {
        let (_, health) = cut_off.api().get("/healthz");
        (health["waiting"] == 1).then_some(())
    });
    let listening = || {
        cut_off
            .stderr()
            .contains("listening for other servers' commits again")
    };
    poll("the listener to be back", || listening().then_some(()));
    let id = direct.api().create(json!({"name": "back/one"}));
    poll("the held take to be answered", || {
        take.is_finished().then_some(())
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], id);
}
