//! Finding jobs that ended (issue 20, item 5): `job query` of an archived
//! job, `job list --state FINISHED`, by name GLOB and time window, paged,
//! and the refusals of bad patterns, times and limits. The Bedrock port's
//! QueryJob stays Bedrock's.

use serde_json::{Value, json};

use crate::common::{Api, Clock, Server, assert_error, bedrock_exchange, cli};

/// Creates a job and ends it through a lease: finished, or failed.
fn end_job(api: &Api, name: &str, finish: bool) -> i64 {
    let id = api.create(json!({"name": name, "data": {"n": name}}));
    let job = api.take(name);
    assert_eq!(job["jobID"], id, "{job}");
    let verb = if finish { "finish" } else { "fail" };
    let (status, answer) = api.post(
        &format!("/jobs/{id}/{verb}"),
        json!({"lease": job["lease"]}),
    );
    assert_eq!(status, 200, "{verb} {id}: {answer}");
    id
}

fn json_of(args: &[&str], server: &Server) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let (code, stdout, stderr) = cli(server, &all);
    assert_eq!(code, 0, "job {all:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn ids(answer: &Value) -> Vec<i64> {
    answer["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no jobs in {answer}"))
        .iter()
        .map(|j| j["jobID"].as_i64().unwrap())
        .collect()
}

#[test]
fn a_finished_job_is_queried_from_the_archive_with_a_pointer_to_its_history() {
    let server = Server::start();
    let api = server.api();
    let id = end_job(&api, "mail/send", true);
    assert_error(api.get(&format!("/jobs/{id}")), 404, "no_such_job");

    let (code, text, stderr) = cli(&server, &["query", &id.to_string(), "--format", "text"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("FINISHED") && text.contains("mail/send"),
        "{text}"
    );
    assert!(text.contains("archived: true"), "{text}");
    assert!(
        stderr.contains(&format!("jobmgr job history {id}")),
        "points to the history: {stderr}"
    );
    let answer = json_of(&["query", &id.to_string()], &server);
    assert_eq!(
        [
            &answer["jobID"],
            &answer["state"],
            &answer["archived"],
            &answer["data"]
        ],
        [
            &json!(id),
            &json!("FINISHED"),
            &json!(true),
            &json!({"n": "mail/send"})
        ],
        "{answer}"
    );
    assert!(
        answer["ended"].as_str().is_some_and(|e| !e.is_empty()),
        "{answer}"
    );

    // A job that never was: still "not found", exit 3, saying where it looked.
    let (code, _, stderr) = cli(&server, &["query", "999999"]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("neither queued nor in the archive"),
        "{stderr}"
    );

    // The Bedrock port answers QueryJob exactly as Bedrock does.
    let reply = bedrock_exchange(
        &server.bedrock,
        format!("QueryJob\njobID: {id}\n\n").as_bytes(),
    );
    assert!(reply.starts_with("404 No job with this jobID"), "{reply}");
}

#[test]
fn archived_jobs_are_listed_by_state_name_glob_time_and_page() {
    let clock = Clock::at("2026-03-01 10:00:00");
    let server = clock.server().start();
    let api = server.api();
    let early = end_job(&api, "mail/send", true);
    let failed = end_job(&api, "mail/bounce", false);
    clock.set("2026-03-01 12:00:00");
    let late: Vec<i64> = (0..3).map(|_| end_job(&api, "mail/send", true)).collect();
    let other = end_job(&api, "report/daily", true);

    // --state FINISHED reads the archive (finished jobs leave the queue).
    let finished = json_of(&["list", "--state", "FINISHED"], &server);
    let mut all_finished = vec![early];
    all_finished.extend(&late);
    all_finished.push(other);
    assert_eq!(ids(&finished), all_finished, "{finished}");
    // The queue's own listing has none of them.
    let (_, queued) = api.get("/jobs?state=FINISHED");
    assert_eq!(queued["jobs"], json!([]), "{queued}");

    // FAILED ones with --archived; by name GLOB.
    let failures = json_of(&["list", "--archived", "--state", "FAILED"], &server);
    assert_eq!(ids(&failures), [failed], "{failures}");
    assert_eq!(failures["jobs"][0]["failure"], "failed", "{failures}");
    let mail = json_of(&["list", "--archived", "--name", "mail/*"], &server);
    let mut all_mail = vec![early, failed];
    all_mail.extend(&late);
    assert_eq!(ids(&mail), all_mail, "{mail}");
    let send = json_of(
        &["list", "--name", "mail/s?nd", "--state", "finished"],
        &server,
    );
    let mut all_send = vec![early];
    all_send.extend(&late);
    assert_eq!(ids(&send), all_send, "{send}");

    // By the time they ended.
    let before_noon = json_of(
        &["list", "--until", "2026-03-01 11:00:00", "--name", "mail/*"],
        &server,
    );
    assert_eq!(ids(&before_noon), [early, failed], "{before_noon}");
    let after = json_of(&["list", "--since", "2026-03-01 11:00:00"], &server);
    let mut all_after = late.clone();
    all_after.push(other);
    assert_eq!(ids(&after), all_after, "{after}");

    // Paged by id: a full page says where to go on.
    let first = json_of(&["list", "--state", "FINISHED", "--limit", "2"], &server);
    assert_eq!(ids(&first), all_finished[..2], "{first}");
    let next = first["nextAfter"].as_i64().expect("nextAfter");
    let second = json_of(
        &[
            "list",
            "--state",
            "FINISHED",
            "--limit",
            "2",
            "--after",
            &next.to_string(),
        ],
        &server,
    );
    assert_eq!(ids(&second), all_finished[2..4], "{second}");
    let (code, text, stderr) = cli(
        &server,
        &[
            "list", "--state", "FINISHED", "--limit", "2", "--format", "text",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("ENDED") && text.contains("mail/send"),
        "{text}"
    );
    assert!(
        stderr.contains(&format!("--after {}", all_finished[1])),
        "{stderr}"
    );
}

#[test]
fn bad_archive_listings_are_refused_with_what_to_do() {
    let server = Server::start();
    let api = server.api();
    end_job(&api, "x", true);
    for (path, says) in [
        ("/archive?name=mail%2F%5Bab", "not closed"),
        ("/archive?since=yesterday", "since is not a time"),
        ("/archive?until=2026-13-45", "until is not a time"),
        (
            "/archive?since=2026-01-02&until=2026-01-01",
            "since must be before until",
        ),
        ("/archive?limit=1000000", "limit must be 1 to 1000"),
        ("/archive?limit=0", "limit must be 1 to 1000"),
        ("/archive?state=QUEUED", "FINISHED and FAILED"),
        ("/archive?after=-1", "after must be"),
        ("/archive?color=red", "query string is not valid"),
    ] {
        let (status, answer) = api.get(path);
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(answer.to_string().contains(says), "{path}: {answer}");
    }
    let (code, _, stderr) = cli(&server, &["list", "--since", "last tuesday"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--since") && stderr.contains("YYYY-MM-DD"),
        "{stderr}"
    );
    let (code, _, stderr) = cli(&server, &["list", "--archived", "--limit", "99999"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("limit must be 1 to 1000"), "{stderr}");
    // Without the token, nothing.
    let (status, _) = api.clone().without_token().get("/archive");
    assert_eq!(status, 401);
}
