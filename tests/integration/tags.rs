//! qless's tags and tracked jobs (issue 23, items 2 and 3): tags given on
//! create and changed later, found by tag (paged) and counted, shown by
//! QueryJob, gone with their job and kept across a restart; tracked jobs
//! listed with their states, also once they ended. On the HTTP API, the
//! Bedrock port and `jobmgr job`, with the refusals beside the happy paths.

use serde_json::{Value, json};

use crate::common::{Api, Server, assert_error, bedrock_exchange, cli};

/// One Bedrock request (`Connection: close`): the status line and the body.
fn bedrock(server: &Server, method: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut request = format!("{method}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    let answer = bedrock_exchange(&server.bedrock, request.as_bytes());
    let status = answer.lines().next().unwrap_or_default().to_string();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `jobmgr job ARGS --format json`, which must succeed.
fn cli_json(server: &Server, args: &[&str]) -> Value {
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
        .map(|j| j["jobID"].as_i64().expect("jobID"))
        .collect()
}

fn tagged(api: &Api, query: &str) -> Vec<i64> {
    let (status, answer) = api.get(&format!("/jobs?{query}"));
    assert_eq!(status, 200, "{answer}");
    ids(&answer)
}

fn tags_of(api: &Api, id: i64) -> Value {
    api.job(id)["tags"].clone()
}

/// Takes the job `name` and finishes it; returns its id.
fn finish(api: &Api, name: &str) -> i64 {
    let job = api.take(name);
    let id = job["jobID"].as_i64().expect("jobID");
    let (status, answer) = api.post(
        &format!("/jobs/{id}/finish"),
        json!({"lease": job["lease"]}),
    );
    assert_eq!(status, 200, "{answer}");
    id
}

#[test]
fn tags_given_on_create_are_shown_found_by_tag_in_pages_and_counted() {
    let server = Server::start();
    let api = server.api();
    let a = api.create(json!({"name": "tags/a", "tags": ["billing", "urgent", "billing"]}));
    let b = api.create(json!({"name": "tags/b", "tags": ["billing"]}));
    let c = api.create(json!({"name": "other/c", "tags": ["billing", "é 中"]}));
    let plain = api.create(json!({"name": "tags/plain"}));

    // Deduplicated, in byte order; always shown on the HTTP API.
    assert_eq!(tags_of(&api, a), json!(["billing", "urgent"]));
    assert_eq!(api.job(a)["tracked"], json!(false));
    assert_eq!(tags_of(&api, plain), json!([]));

    assert_eq!(tagged(&api, "tag=billing"), [a, b, c]);
    assert_eq!(tagged(&api, "tag=urgent"), [a]);
    assert_eq!(tagged(&api, "tag=%C3%A9%20%E4%B8%AD"), [c]);
    assert!(tagged(&api, "tag=nobody").is_empty());
    // Paged as every listing is, and combined with the other filters.
    assert_eq!(tagged(&api, "tag=billing&limit=2"), [a, b]);
    assert_eq!(tagged(&api, &format!("tag=billing&limit=2&after={b}")), [c]);
    assert_eq!(tagged(&api, "tag=billing&name=tags/*"), [a, b]);
    assert_eq!(tagged(&api, "tag=billing&state=RUNNING"), Vec::<i64>::new());
    // A huge limit is the largest page, not an error.
    assert_eq!(tagged(&api, "tag=billing&limit=99999999"), [a, b, c]);
    let (status, page) = api.get("/jobs?tag=billing");
    assert_eq!(status, 200);
    assert_eq!(page["jobs"][0]["tags"], json!(["billing", "urgent"]));

    let (status, top) = api.get("/tags");
    assert_eq!(status, 200, "{top}");
    assert_eq!(
        top["tags"],
        json!([
            {"tag": "billing", "jobs": 3},
            {"tag": "urgent", "jobs": 1},
            {"tag": "é 中", "jobs": 1},
        ])
    );
    let (_, first) = api.get("/tags?limit=1");
    assert_eq!(first["tags"], json!([{"tag": "billing", "jobs": 3}]));
    let (status, _) = api.get("/tags?limit=99999999");
    assert_eq!(status, 200);

    // A unique create that finds the job adds its tags; with overwrite
    // false it leaves the job as it is.
    let again = api.create(json!({"name": "tags/plain", "unique": true, "tags": ["late"]}));
    assert_eq!(again, plain);
    assert_eq!(tags_of(&api, plain), json!(["late"]));
    api.create(json!({"name": "tags/plain", "unique": true, "overwrite": false, "tags": ["no"]}));
    assert_eq!(tags_of(&api, plain), json!(["late"]));
}

#[test]
fn tags_are_added_and_removed_later_within_the_limit() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "tags/later", "tags": ["a"]}));
    let (status, answer) = api.post(
        &format!("/jobs/{id}/tags"),
        json!({"add": ["b", "c", "b"], "remove": ["a", "never-there"]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"jobID": id, "tags": ["b", "c"]}));
    assert_eq!(tags_of(&api, id), json!(["b", "c"]));
    assert_eq!(tagged(&api, "tag=a"), Vec::<i64>::new());
    assert_eq!(tagged(&api, "tag=c"), [id]);

    // 30 more make 32, the most a job has; one more is refused and
    // changes nothing, unless the same request removes one.
    let thirty: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    let (status, answer) = api.post(&format!("/jobs/{id}/tags"), json!({"add": thirty}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tags"].as_array().map(Vec::len), Some(32));
    let over = api.post(&format!("/jobs/{id}/tags"), json!({"add": ["one-more"]}));
    assert!(
        over.1["message"]
            .as_str()
            .unwrap_or("")
            .contains("at most 32"),
        "{}",
        over.1
    );
    assert_error(over, 400, "malformed_tags");
    assert_eq!(tags_of(&api, id).as_array().map(Vec::len), Some(32));
    let (status, answer) = api.post(
        &format!("/jobs/{id}/tags"),
        json!({"add": ["one-more"], "remove": ["b"]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["tags"]
            .as_array()
            .unwrap()
            .contains(&json!("one-more"))
    );

    // A FAILED job is still in the queue and can be tagged.
    let failed = api.create(json!({"name": "tags/fails"}));
    let job = api.take("tags/fails");
    let (status, _) = api.post(
        &format!("/jobs/{failed}/fail"),
        json!({"lease": job["lease"]}),
    );
    assert_eq!(status, 200);
    let (status, answer) = api.post(&format!("/jobs/{failed}/tags"), json!({"add": ["dead"]}));
    assert_eq!((status, &answer["tags"]), (200, &json!(["dead"])));
}

#[test]
fn bad_tags_are_refused_and_create_or_change_nothing() {
    let server = Server::start();
    let api = server.api();
    let too_many: Vec<String> = (0..33).map(|i| format!("t{i}")).collect();
    let long = "x".repeat(65);
    for tags in [
        json!([""]),
        json!([long]),
        json!(["a\nb"]),
        json!(["a\u{1b}[31m"]),
        json!([" padded"]),
        json!(too_many),
    ] {
        let answer = api.post("/jobs", json!({"name": "tags/bad", "tags": tags}));
        let message = answer.1["message"].as_str().unwrap_or("").to_string();
        assert!(message.contains("a tag is 1 to 64 characters"), "{message}");
        assert_error(answer, 400, "malformed_tags");
    }
    // Not a list of strings, or null: the body is refused.
    for tags in [json!("a"), json!([1]), json!(null), json!({"a": 1})] {
        let (status, answer) = api.post("/jobs", json!({"name": "tags/bad", "tags": tags}));
        assert_eq!(status, 400, "{tags}: {answer}");
    }
    // One bad job in a batch: nothing is created.
    let (status, _) = api.post(
        "/jobs/batch",
        json!({"jobs": [{"name": "tags/bad", "tags": ["ok"]}, {"name": "tags/bad", "tags": [""]}]}),
    );
    assert_eq!(status, 400);
    assert!(tagged(&api, "name=tags/bad").is_empty());
    assert!(tagged(&api, "tag=ok").is_empty());

    let id = api.create(json!({"name": "tags/good", "tags": ["keep"]}));
    let answer = api.post(
        &format!("/jobs/{id}/tags"),
        json!({"add": ["fine", "a\tb"]}),
    );
    assert_error(answer, 400, "malformed_tags");
    assert_error(
        api.post(&format!("/jobs/{id}/tags"), json!({"remove": [""]})),
        400,
        "malformed_tags",
    );
    let (status, _) = api.post(
        &format!("/jobs/{id}/tags"),
        json!({"add": ["x"], "extra": 1}),
    );
    assert_eq!(status, 400);
    assert_eq!(tags_of(&api, id), json!(["keep"]));

    // Unknown jobs, ended jobs, bad ids.
    assert_error(
        api.post("/jobs/999999/tags", json!({"add": ["x"]})),
        404,
        "no_such_job",
    );
    assert_error(
        api.post("/jobs/abc/tags", json!({"add": ["x"]})),
        400,
        "malformed_job_id",
    );
    let done = api.create(json!({"name": "tags/done", "tags": ["gone-soon"]}));
    assert_eq!(finish(&api, "tags/done"), done);
    let answer = api.post(&format!("/jobs/{done}/tags"), json!({"add": ["late"]}));
    assert!(
        answer.1["message"]
            .as_str()
            .unwrap_or("")
            .contains("archive"),
        "{}",
        answer.1
    );
    assert_error(answer, 404, "job_ended");

    // Bad listings.
    assert_error(api.get("/jobs?tag=a%0Ab"), 400, "malformed_tags");
    let (status, _) = api.get("/jobs?tag=a&after=abc");
    assert_eq!(status, 400);
    let (status, _) = api.get("/tags?limit=-1");
    assert_eq!(status, 400);
    let (status, _) = api.get("/tags?after=3");
    assert_eq!(status, 400);
}

#[test]
fn tags_go_with_their_job() {
    let server = Server::start();
    let api = server.api();
    let deleted = api.create(json!({"name": "tags/deleted", "tags": ["t"]}));
    let finished = api.create(json!({"name": "tags/finished", "tags": ["t"]}));
    let kept = api.create(json!({"name": "tags/kept", "tags": ["t"]}));
    let (status, _) = api.delete(&format!("/jobs/{deleted}"));
    assert_eq!(status, 200);
    assert_eq!(finish(&api, "tags/finished"), finished);
    assert_eq!(tagged(&api, "tag=t"), [kept]);
    let (_, top) = api.get("/tags");
    assert_eq!(top["tags"], json!([{"tag": "t", "jobs": 1}]));
}

#[test]
fn tags_are_found_after_a_restart() {
    let mut server = Server::start();
    let api = server.api();
    let a = api.create(json!({"name": "tags/restart", "tags": ["survivor"]}));
    let b = api.create(json!({"name": "tags/restart", "tags": ["survivor", "other"]}));
    let (status, _) = api.post(&format!("/jobs/{a}/track"), json!({}));
    assert_eq!(status, 200);
    server.restart();
    let api = server.api();
    assert_eq!(tagged(&api, "tag=survivor"), [a, b]);
    assert_eq!(tags_of(&api, b), json!(["other", "survivor"]));
    assert_eq!(api.job(a)["tracked"], json!(true));
    let (_, tracked) = api.get("/tracked");
    assert_eq!(ids(&tracked), [a]);
    let (_, top) = api.get("/tags");
    assert_eq!(top["tags"][0], json!({"tag": "survivor", "jobs": 2}));
}

#[test]
fn tracked_jobs_are_listed_with_their_states_even_once_they_ended() {
    let server = Server::start();
    let api = server.api();
    let queued = api.create(json!({"name": "track/queued", "tags": ["x"]}));
    let finished = api.create(json!({"name": "track/finished"}));
    let deleted = api.create(json!({"name": "track/deleted"}));
    let untracked = api.create(json!({"name": "track/never"}));
    for id in [queued, finished, deleted, queued] {
        // Tracking twice changes nothing.
        let (status, answer) = api.post(&format!("/jobs/{id}/track"), json!({}));
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(api.job(queued)["tracked"], json!(true));
    assert_eq!(api.job(untracked)["tracked"], json!(false));
    assert_eq!(finish(&api, "track/finished"), finished);
    let (status, _) = api.delete(&format!("/jobs/{deleted}"));
    assert_eq!(status, 200);

    let (status, list) = api.get("/tracked");
    assert_eq!(status, 200, "{list}");
    assert_eq!(ids(&list), [queued, finished, deleted]);
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs[0]["state"], "QUEUED");
    assert_eq!(jobs[0]["tags"], json!(["x"]));
    assert_eq!(jobs[1]["state"], "FINISHED");
    assert_eq!(jobs[1]["archived"], json!(true));
    assert_eq!(jobs[2]["state"], "GONE");
    assert!(jobs.iter().all(|j| j["tracked"] == json!(true)), "{list}");
    let (_, page) = api.get(&format!("/tracked?after={queued}&limit=1"));
    assert_eq!(ids(&page), [finished]);
    let (status, _) = api.get("/tracked?limit=99999999");
    assert_eq!(status, 200);
    let (status, _) = api.get("/tracked?after=x");
    assert_eq!(status, 400);

    // Untracking is idempotent; a gone job can still be untracked, after
    // which it is unknown.
    for id in [deleted, finished, finished, untracked, untracked] {
        let (status, answer) = api.delete(&format!("/jobs/{id}/track"));
        assert_eq!(status, 200, "untrack {id}: {answer}");
    }
    assert_error(
        api.delete(&format!("/jobs/{deleted}/track")),
        404,
        "no_such_job",
    );
    let (_, list) = api.get("/tracked");
    assert_eq!(ids(&list), [queued]);

    // Unknown jobs.
    assert_error(
        api.post("/jobs/999999/track", json!({})),
        404,
        "no_such_job",
    );
    assert_error(api.delete("/jobs/999999/track"), 404, "no_such_job");
    assert_error(
        api.post(&format!("/jobs/{finished}/track"), json!({})),
        404,
        "job_ended",
    );
    assert_error(
        api.post("/jobs/0/track", json!({})),
        400,
        "malformed_job_id",
    );
}

#[test]
fn the_bedrock_port_takes_tags_and_tracks_jobs_and_shows_them_only_when_used() {
    let server = Server::start();
    let api = server.api();
    let (status, body) = bedrock(
        &server,
        "CreateJob",
        &[("name", "tags/bedrock"), ("tags", r#"["a","b","a"]"#)],
    );
    assert!(status.starts_with("200"), "{status}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["jobID"]
        .as_i64()
        .unwrap();
    assert_eq!(tags_of(&api, id), json!(["a", "b"]));
    let (status, body) = bedrock(
        &server,
        "CreateJobs",
        &[(
            "jobs",
            r#"[{"name":"tags/bedrock-many","tags":["m"]},{"name":"tags/bedrock-many"}]"#,
        )],
    );
    assert!(status.starts_with("200"), "{status}");
    let many: Vec<i64> =
        serde_json::from_value(serde_json::from_str::<Value>(&body).unwrap()["jobIDs"].clone())
            .unwrap();
    assert_eq!(tagged(&api, "tag=m"), [many[0]]);

    // QueryJob: Bedrock's answer unchanged for a job without tags or
    // tracking; `tags` and `tracked` once it has them.
    let query = |id: i64| {
        let (status, body) = bedrock(&server, "QueryJob", &[("jobID", &id.to_string())]);
        assert!(status.starts_with("200"), "{status}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let plain = query(many[1]);
    assert!(
        plain.get("tags").is_none() && plain.get("tracked").is_none(),
        "{plain}"
    );
    assert_eq!(query(id)["tags"], json!(["a", "b"]));

    // UpdateJob: tags alone (no data), or with data, in one transaction.
    let (status, _) = bedrock(
        &server,
        "UpdateJob",
        &[
            ("jobID", &id.to_string()),
            ("addTags", r#"["c"]"#),
            ("removeTags", r#"["a"]"#),
        ],
    );
    assert!(status.starts_with("200"), "{status}");
    assert_eq!(tags_of(&api, id), json!(["b", "c"]));
    let (status, _) = bedrock(
        &server,
        "UpdateJob",
        &[
            ("jobID", &id.to_string()),
            ("data", r#"{"n":1}"#),
            ("addTags", r#"["d"]"#),
        ],
    );
    assert!(status.starts_with("200"), "{status}");
    assert_eq!(api.job(id)["data"], json!({"n": 1}));
    assert_eq!(tags_of(&api, id), json!(["b", "c", "d"]));
    // A bad tag refuses the whole update.
    let (status, _) = bedrock(
        &server,
        "UpdateJob",
        &[
            ("jobID", &id.to_string()),
            ("data", r#"{"n":2}"#),
            ("addTags", r#"[""]"#),
        ],
    );
    assert!(status.starts_with("402 Malformed tags"), "{status}");
    assert_eq!(api.job(id)["data"], json!({"n": 1}));
    for tags in ["a", "[1]", r#"[" padded"]"#] {
        let (status, _) = bedrock(&server, "CreateJob", &[("name", "tags/no"), ("tags", tags)]);
        assert!(status.starts_with("402 Malformed tags"), "{tags}: {status}");
    }
    let (status, _) = bedrock(&server, "UpdateJob", &[("jobID", &id.to_string())]);
    assert!(status.starts_with("402 Missing data"), "{status}");
    let (status, _) = bedrock(
        &server,
        "UpdateJob",
        &[("jobID", "999999"), ("addTags", r#"["x"]"#)],
    );
    assert!(status.starts_with("404"), "{status}");
    assert!(tagged(&api, "name=tags/no").is_empty());

    // TrackJob and UntrackJob.
    let (status, _) = bedrock(&server, "TrackJob", &[("jobID", &id.to_string())]);
    assert!(status.starts_with("200"), "{status}");
    assert_eq!(query(id)["tracked"], json!(true));
    let (status, _) = bedrock(&server, "TrackJob", &[("jobID", "999999")]);
    assert!(status.starts_with("404"), "{status}");
    let (status, _) = bedrock(&server, "TrackJob", &[]);
    assert!(status.starts_with("402 Missing jobID"), "{status}");
    for _ in 0..2 {
        let (status, _) = bedrock(&server, "UntrackJob", &[("jobID", &id.to_string())]);
        assert!(status.starts_with("200"), "{status}");
    }
    assert!(query(id).get("tracked").is_none());
}

#[test]
fn the_command_line_tags_lists_counts_and_tracks() {
    let server = Server::start();
    let (code, out, err) = cli(
        &server,
        &[
            "create",
            "cli/tagged",
            "--tag",
            "ops",
            "--tag",
            "nightly",
            "--format",
            "text",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let id: i64 = out.trim().parse().expect("jobID");
    let other = server
        .api()
        .create(json!({"name": "cli/other", "tags": ["ops"]}));
    let id_text = id.to_string();

    let shown = cli_json(&server, &["show", &id_text]);
    assert_eq!(shown["tags"], json!(["nightly", "ops"]));
    let (code, text, err) = cli(&server, &["query", &id_text, "--format", "text"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("tags: [\"nightly\",\"ops\"]"), "{text}");

    assert_eq!(
        ids(&cli_json(&server, &["list", "--tag", "ops"])),
        [id, other]
    );
    assert_eq!(
        ids(&cli_json(
            &server,
            &["list", "--tag", "ops", "--after", &id_text]
        )),
        [other]
    );
    let (code, _, err) = cli(&server, &["list", "--tag", "ops", "--archived"]);
    assert_ne!(code, 0);
    assert!(err.contains("archive keeps no tags"), "{err}");

    let (code, text, err) = cli(
        &server,
        &[
            "tag", &id_text, "--add", "extra", "--remove", "nightly", "--format", "text",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(text.trim(), "extra, ops");
    let (code, _, err) = cli(&server, &["tag", &id_text, "--add", ""]);
    assert_ne!(code, 0);
    assert!(err.contains("Malformed tags"), "{err}");
    let (code, _, err) = cli(&server, &["tag", "999999", "--add", "x"]);
    assert_ne!(code, 0, "{err}");

    let top = cli_json(&server, &["tags"]);
    assert_eq!(top["tags"][0], json!({"tag": "ops", "jobs": 2}));
    let (code, text, err) = cli(&server, &["tags", "--format", "text"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.lines().nth(1).unwrap_or("").ends_with("  ops"),
        "{text}"
    );

    let (code, _, err) = cli(&server, &["track", &id_text]);
    assert_eq!(code, 0, "{err}");
    let tracked = cli_json(&server, &["tracked"]);
    assert_eq!(ids(&tracked), [id]);
    assert_eq!(tracked["jobs"][0]["state"], "QUEUED");
    let (code, text, err) = cli(&server, &["tracked", "--format", "text"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("QUEUED") && text.contains("cli/tagged"),
        "{text}"
    );
    let (code, _, err) = cli(&server, &["untrack", &id_text]);
    assert_eq!(code, 0, "{err}");
    assert!(ids(&cli_json(&server, &["tracked"])).is_empty());
    let (code, _, _) = cli(&server, &["track", "999999"]);
    assert_ne!(code, 0);
}
