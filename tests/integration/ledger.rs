//! The ledger end to end: statistics checked figure by figure against a
//! scripted run whose timings the test sets (the server reads its time
//! from a file, `--clock-file`), every attempt in a job's history, failure
//! groups retried and deleted in bulk, purges by age and by count, and the
//! worker registry marking a supervisor that stopped being seen as gone.

use crate::common::*;

use serde_json::{Value, json};

fn worker(id: &str) -> Value {
    json!({"id": id, "host": "web-1", "pid": 4242, "capacity": 2, "running": 0, "load": 0.5})
}

/// The point for `time` in the series whose `key` (`name`, `worker`) is `id`.
fn series_point<'a>(stats: &'a Value, key: &str, id: &str, time: &str) -> &'a Value {
    let series = stats["series"]
        .as_array()
        .expect("series")
        .iter()
        .find(|s| s[key] == id)
        .unwrap_or_else(|| panic!("no series for {key} {id} in {stats}"));
    series["points"]
        .as_array()
        .expect("points")
        .iter()
        .find(|p| p["time"] == time)
        .unwrap_or_else(|| panic!("no point at {time} for {id} in {series}"))
}

/// The point for `time` in the series of `name`.
fn point<'a>(stats: &'a Value, name: &str, time: &str) -> &'a Value {
    series_point(stats, "name", name, time)
}

fn close(actual: &Value, expected: f64) -> bool {
    actual.as_f64().is_some_and(|a| (a - expected).abs() < 1e-9)
}

#[track_caller]
fn assert_summary(summary: &Value, count: u64, mean: f64, variance: f64, min: f64, max: f64) {
    assert_eq!(summary["count"], count, "{summary}");
    assert!(close(&summary["mean"], mean), "mean {mean}: {summary}");
    assert!(
        close(&summary["variance"], variance),
        "variance {variance}: {summary}"
    );
    assert!(close(&summary["min"], min), "min {min}: {summary}");
    assert!(close(&summary["max"], max), "max {max}: {summary}");
}

#[test]
fn statistics_match_a_scripted_run_with_known_timings() {
    let clock = Clock::at("2026-01-01 10:00:00");
    let server = clock.server().start();
    let api = server.api();
    let a = api.create(json!({"name": "mail/send", "data": {"to": "a"}}));
    let b = api.create(json!({"name": "mail/send", "data": {"to": "b"}}));
    let c = api.create(json!({"name": "mail/other"}));

    // Waits of 5 s and 9 s; a run of 7 s; services of 12 s and 20 s.
    clock.set("2026-01-01 10:00:05");
    let first = api.dequeue(json!({"name": "mail/send", "worker": worker("web-1-4242")}));
    assert_eq!(first[0]["jobID"], a);
    clock.set("2026-01-01 10:00:09");
    let second = api.dequeue(json!({"name": "mail/send", "worker": worker("web-1-4242")}));
    assert_eq!(second[0]["jobID"], b);
    clock.set("2026-01-01 10:00:12");
    let (status, _) = api.post(&format!("/jobs/{a}/finish"), json!({}));
    assert_eq!(status, 200);
    clock.set("2026-01-01 10:00:20");
    let details =
        json!({"_jobmgr": {"outcome": "exit", "exitCode": 3, "stdout": "no route to host\n"}});
    let (status, _) = api.post(&format!("/jobs/{b}/fail"), json!({"data": details}));
    assert_eq!(status, 200);
    // A 21 s wait and a retry.
    clock.set("2026-01-01 10:00:21");
    assert_eq!(api.take("mail/other")["jobID"], c);
    let (status, _) = api.post(&format!("/jobs/{c}/retry"), json!({"delay": 3600}));
    assert_eq!(status, 200);

    let (status, stats) =
        api.get("/stats?name=mail/*&from=2026-01-01%2009:00:00&to=2026-01-01%2012:00:00");
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["period"], "hour");
    // A point for every hour of the window, for charts.
    for series in stats["series"].as_array().unwrap() {
        assert_eq!(series["points"].as_array().unwrap().len(), 3, "{series}");
    }
    let send = point(&stats, "mail/send", "2026-01-01 10:00:00");
    assert_eq!(
        [
            &send["added"],
            &send["started"],
            &send["finished"],
            &send["failed"],
            &send["retried"]
        ],
        [&json!(2), &json!(2), &json!(1), &json!(1), &json!(0)],
        "{send}"
    );
    // Waits 5 and 9: mean 7, sample variance ((5-7)² + (9-7)²) / 1 = 8.
    assert_summary(&send["wait"], 2, 7.0, 8.0, 5.0, 9.0);
    assert_summary(&send["run"], 1, 7.0, 0.0, 7.0, 7.0);
    // Services 12 and 20: mean 16, variance 32.
    assert_summary(&send["service"], 2, 16.0, 32.0, 12.0, 20.0);
    assert_eq!(
        send["wait"]["histogram"],
        json!([{"from": 5, "to": 6, "count": 1}, {"from": 9, "to": 10, "count": 1}])
    );
    assert_eq!(
        send["run"]["histogram"],
        json!([{"from": 7, "to": 8, "count": 1}])
    );
    let earlier = point(&stats, "mail/send", "2026-01-01 09:00:00");
    assert_eq!(earlier["added"], 0);
    assert_eq!(earlier["wait"]["count"], 0);
    let other = point(&stats, "mail/other", "2026-01-01 10:00:00");
    assert_eq!(
        [&other["started"], &other["retried"]],
        [&json!(1), &json!(1)]
    );
    assert_summary(&other["wait"], 1, 21.0, 0.0, 21.0, 21.0);
    assert_eq!(
        other["service"]["count"], 0,
        "a retry is not a service: {other}"
    );
    // The total over names, and the queue's depth by state.
    assert_eq!(stats["total"]["added"], 3);
    assert_summary(
        &stats["total"]["wait"],
        3,
        35.0 / 3.0,
        ((5.0f64 - 35.0 / 3.0).powi(2)
            + (9.0f64 - 35.0 / 3.0).powi(2)
            + (21.0f64 - 35.0 / 3.0).powi(2))
            / 2.0,
        5.0,
        21.0,
    );
    assert_eq!(stats["queue"]["mail/send"]["FAILED"], 1);
    assert_eq!(stats["queue"]["mail/other"]["QUEUED"], 1);

    // An hour later, a 2 s wait and a 3 s run: the day adds both hours up.
    clock.set("2026-01-01 11:30:00");
    let d = api.create(json!({"name": "mail/send"}));
    clock.set("2026-01-01 11:30:02");
    assert_eq!(api.take("mail/send")["jobID"], d);
    clock.set("2026-01-01 11:30:05");
    assert_eq!(api.post(&format!("/jobs/{d}/finish"), json!({})).0, 200);
    let (_, days) = api.get("/stats?name=mail/send&period=day&from=2026-01-01&to=2026-01-02");
    let day = point(&days, "mail/send", "2026-01-01 00:00:00");
    assert_eq!([&day["added"], &day["finished"]], [&json!(3), &json!(2)]);
    // Waits 5, 9, 2: mean 16/3; runs 7 and 3: mean 5, variance 8.
    let wait_mean = 16.0 / 3.0;
    let wait_var = [5.0f64, 9.0, 2.0]
        .iter()
        .map(|w| (w - wait_mean).powi(2))
        .sum::<f64>()
        / 2.0;
    assert_summary(&day["wait"], 3, wait_mean, wait_var, 2.0, 9.0);
    assert_summary(&day["run"], 2, 5.0, 8.0, 3.0, 7.0);
    assert_summary(
        &day["service"],
        3,
        (12.0 + 20.0 + 5.0) / 3.0,
        {
            let m = 37.0 / 3.0;
            [12.0f64, 20.0, 5.0]
                .iter()
                .map(|s| (s - m).powi(2))
                .sum::<f64>()
                / 2.0
        },
        5.0,
        20.0,
    );

    // The same figures for people.
    let (columns, text) = text_row(
        &server,
        &["stats", "--name", "mail/send", "--period", "day"],
        "mail/send",
    );
    assert_eq!(
        &columns[..9],
        ["3", "3", "2", "1", "0", "5.3s", "9.0s", "5.0s", "12.3s"],
        "{text}"
    );
    assert_column_lines_up(&text, "NAME");
}

/// `jobmgr ARGS` over 2026-01-01 as text: the columns of the row that
/// ends with `last`, and the whole text.
fn text_row(server: &Server, args: &[&str], last: &str) -> (Vec<String>, String) {
    let mut args = args.to_vec();
    args.extend([
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--format",
        "text",
    ]);
    let (code, text, stderr) = client_command(server, &args);
    assert_eq!(code, 0, "jobmgr {args:?}: {stderr}");
    let line = text
        .lines()
        .find(|l| l.ends_with(&format!(" {last}")))
        .unwrap_or_else(|| panic!("no row for {last}: {text}"));
    let columns = line.split_whitespace().map(String::from).collect();
    (columns, text)
}

/// Every row after the header line holding `label` has a value starting
/// exactly under `label`: the columns before it are padded to width.
fn assert_column_lines_up(text: &str, label: &str) {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no {label} header in {text}"));
    let at = header.find(label).unwrap();
    let mut rows = 0;
    for row in lines {
        let bytes = row.as_bytes();
        assert!(
            bytes.len() > at && bytes[at - 1] == b' ' && bytes[at] != b' ',
            "{label} starts at column {at}, but not in {row:?}:\n{text}"
        );
        rows += 1;
    }
    assert!(rows > 0, "no rows under {label} in {text}");
}

#[test]
fn statistics_refuse_what_they_cannot_answer() {
    let server = Server::start();
    let api = server.api();
    for query in [
        "period=week",
        "from=yesterday",
        "from=2026-01-02&to=2026-01-01",
        "from=2000-01-01&to=2026-01-01",
        "name=",
        "colour=blue",
    ] {
        let (status, answer) = api.get(&format!("/stats?{query}"));
        if query == "name=" {
            assert_eq!(status, 200, "an empty name means every name: {answer}");
        } else {
            assert_eq!(status, 400, "{query}: {answer}");
            assert!(
                answer["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{answer}"
            );
        }
    }
}

fn report_json(server: &Server, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["--format", "json"]);
    let (code, stdout, stderr) = client_command(server, &args);
    assert_eq!(code, 0, "jobmgr {args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn every_attempt_is_recorded_with_its_worker_outcome_and_output() {
    let server = Server::start();
    let api = server.api();
    let supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("flaky")
        .arg("--max-attempts")
        .arg("3")
        .worker(
            "flaky",
            "#!/bin/sh\nmark=\"$(dirname \"$0\")/../ran-once\"\nif [ ! -e \"$mark\" ]; then\n  touch \"$mark\"\n  echo 'no route to host'\n  echo 'giving up' >&2\n  exit 3\nfi\necho '{\"sent\": true}'\n",
        )
        .start();
    let id = api.create(json!({"name": "flaky", "data": {"to": "x"}}));
    let history = poll("the job's two attempts", || {
        let history = report_json(&server, &["job", "history", &id.to_string()]);
        (history["archived"]["state"] == "FINISHED").then_some(history)
    });
    let attempts = history["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{history}");
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let me = format!("{host}-{}", supervisor.pid());
    let (first, second) = (&attempts[0], &attempts[1]);
    assert_eq!(
        [
            &first["attempt"],
            &first["outcome"],
            &first["failure"],
            &first["exitCode"]
        ],
        [&json!(1), &json!("retried"), &json!("exit:3"), &json!(3)],
        "{first}"
    );
    assert_eq!(first["worker"], me.as_str());
    assert!(
        first["stdout"]
            .as_str()
            .unwrap()
            .contains("no route to host"),
        "{first}"
    );
    assert!(
        first["stderr"].as_str().unwrap().contains("giving up"),
        "{first}"
    );
    assert_eq!(
        [&second["attempt"], &second["outcome"]],
        [&json!(2), &json!("finished")],
        "{second}"
    );
    assert_eq!(second["worker"], me.as_str());
    assert_eq!(second["exitCode"], 0, "{second}");
    assert!(
        second["stdout"]
            .as_str()
            .unwrap()
            .contains(r#"{"sent": true}"#),
        "{second}"
    );
    // Times in order, and a retry delay of at least a second between runs.
    let started = |a: &Value| a["started"].as_str().unwrap().to_string();
    let ended = |a: &Value| a["ended"].as_str().unwrap().to_string();
    assert!(
        started(first) <= ended(first) && ended(first) < started(second),
        "{history}"
    );
    assert_eq!(history["archived"]["data"], json!({"sent": true}));
    // The supervisor's own statistics: two runs reported, busy for part of
    // the capacity it offered.
    let (_, stats) = api.get("/stats/workers");
    let mine = stats["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["worker"] == me.as_str())
        .unwrap_or_else(|| panic!("no series for {me}: {stats}"));
    let total = &mine["total"];
    assert_eq!(total["jobs"], 2, "{total}");
    assert!(total["busySecs"].as_f64().unwrap() > 0.0, "{total}");
    let utilisation = total["utilisation"].as_f64().unwrap();
    assert!(utilisation > 0.0 && utilisation <= 1.0, "{total}");
    assert_eq!(
        history["job"],
        Value::Null,
        "a finished job leaves the queue, as in Bedrock"
    );
    // For people: a row per attempt, with the output's tail.
    let (code, text, _) = client_command(
        &server,
        &["job", "history", &id.to_string(), "--format", "text"],
    );
    assert_eq!(code, 0);
    assert!(
        text.contains("FINISHED") && text.contains("exit 3") && text.contains("no route to host"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("  1  2")),
        "the attempt number fills its column: {text}"
    );
    // Unknown jobs and bad ids.
    assert_error(api.get("/jobs/99999/history"), 404, "no_such_job");
    let (code, _, stderr) = client_command(&server, &["job", "history", "99999"]);
    assert_eq!(code, 3, "{stderr}");
    let (code, _, _) = client_command(&server, &["job", "history", "abc"]);
    assert_eq!(code, 2);
}

#[test]
fn the_bedrock_port_answers_as_before_and_its_runs_are_recorded() {
    let server = Server::start();
    let api = server.api();
    let created = bedrock_exchange(
        &server.bedrock,
        b"CreateJob\nname: bedrock/one\ndata: {\"a\":1}\n\n",
    );
    assert!(created.starts_with("200 OK"), "{created}");
    let body = &created[created.find('{').expect("a JSON body")..];
    let id = serde_json::from_str::<Value>(body.trim()).unwrap()["jobID"]
        .as_i64()
        .expect("jobID");
    let got = bedrock_exchange(&server.bedrock, b"GetJob\nname: bedrock/*\n\n");
    assert!(got.starts_with("200 OK"), "{got}");
    let failed = bedrock_exchange(
        &server.bedrock,
        format!("FailJob\njobID: {id}\n\n").as_bytes(),
    );
    assert!(failed.starts_with("200 OK"), "{failed}");
    let queried = bedrock_exchange(
        &server.bedrock,
        format!("QueryJob\njobID: {id}\n\n").as_bytes(),
    );
    assert!(queried.contains("\"state\":\"FAILED\""), "{queried}");
    assert!(
        !queried.contains("failure") && !queried.contains("attempts\":["),
        "{queried}"
    );
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    let attempts = history["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{history}");
    assert_eq!(
        [
            &attempts[0]["outcome"],
            &attempts[0]["failure"],
            &attempts[0]["worker"]
        ],
        [&json!("failed"), &json!("failed"), &Value::Null]
    );
    let (_, groups) = api.get("/failures");
    let groups = groups["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(
        [&groups[0]["group"], &groups[0]["count"]],
        [&json!("failed"), &json!(1)]
    );
}

#[test]
fn a_failure_group_is_listed_retried_and_deleted_in_bulk() {
    let server = Server::start();
    let api = server.api();
    let supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("bulk/*")
        .arg("--max-attempts")
        .arg("1")
        .worker(
            "task",
            "#!/bin/sh\nif [ -e \"$(dirname \"$0\")/../fixed\" ]; then exit 0; fi\necho broken\nexit 3\n",
        )
        .worker("crash", "#!/bin/sh\nkill -9 $$\n")
        .start();
    let ids: Vec<i64> = (0..4)
        .map(|i| api.create(json!({"name": "bulk/task", "data": {"n": i}})))
        .collect();
    let crashed = api.create(json!({"name": "bulk/crash"}));
    for id in ids.iter().chain([&crashed]) {
        poll("the job to fail", || {
            (api.state(*id).as_deref() == Some("FAILED")).then_some(())
        });
    }
    let groups = report_json(&server, &["failures"]);
    let count = |group: &str| {
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == group)
            .map(|g| g["count"].clone())
    };
    assert_eq!(count("exit:3"), Some(json!(4)), "{groups}");
    assert_eq!(count("signal:SIGKILL"), Some(json!(1)), "{groups}");
    let members = report_json(&server, &["failures", "exit:3"]);
    let listed: Vec<i64> = members["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["jobID"].as_i64().unwrap())
        .collect();
    let mut sorted = listed.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ids, "{members}");

    // Fixed: the two earliest failures (the listing's order) go back and
    // run, as new.
    std::fs::write(supervisor.dir.path().join("fixed"), "").unwrap();
    let retried = report_json(&server, &["failures", "exit:3", "--retry", "--count", "2"]);
    assert_eq!(retried["retried"], 2, "{retried}");
    // The two earliest failures, answered in id order (the order they are
    // locked in), which need not be the order they failed in.
    let mut earliest = listed[..2].to_vec();
    earliest.sort_unstable();
    assert_eq!(retried["jobIDs"], json!(earliest), "{retried}");
    for id in &listed[..2] {
        poll("the retried job to finish", || {
            api.state(*id).is_none().then_some(())
        });
        let (_, history) = api.get(&format!("/jobs/{id}/history"));
        let attempts = history["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{history}");
        assert_eq!(
            attempts[1]["attempt"], 1,
            "attempts count afresh: {history}"
        );
        assert_eq!(attempts[1]["outcome"], "finished");
    }
    for id in &listed[2..] {
        assert_eq!(api.state(*id).as_deref(), Some("FAILED"));
    }
    let groups = report_json(&server, &["failures"]);
    let exit3 = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "exit:3");
    assert_eq!(exit3.unwrap()["count"], 2, "{groups}");

    // For people: one row per group, in columns.
    let (code, text, stderr) = client_command(&server, &["failures", "--format", "text"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("exit:3"), "{text}");
    assert_column_lines_up(&text, "GROUP");

    // The rest of the group deleted at once; the other group untouched.
    let (code, text, stderr) = client_command(
        &server,
        &["failures", "exit:3", "--delete", "--format", "text"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("deleted 2 jobs of exit:3"), "{text}");
    for id in &listed[2..] {
        assert_eq!(api.state(*id), None);
    }
    assert_eq!(api.state(crashed).as_deref(), Some("FAILED"));

    // Hostile group names and counts.
    assert_error(
        api.post("/failures/a%20b/retry", json!({})),
        400,
        "invalid_request",
    );
    assert_error(
        api.post("/failures/exit:3/retry", json!({"count": 0})),
        400,
        "invalid_request",
    );
    assert_error(
        api.post("/failures/exit:3/delete", json!({"count": 10001})),
        400,
        "invalid_request",
    );
    assert_error(
        api.post("/failures/exit:3/retry", json!({"count": -1})),
        400,
        "invalid_request",
    );
    let (code, _, _) = client_command(&server, &["failures", "exit:3", "--retry", "--count", "0"]);
    assert_eq!(code, 2);
    let (_, empty) = api.post("/failures/no_such_group/retry", json!({}));
    assert_eq!(empty["retried"], 0);
}

#[test]
fn failures_of_a_group_with_no_failed_job_exit_3() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "Crashes"}));
    let held = api.dequeue(json!({"name": "Crashes", "leaseMs": 60_000}));
    let (status, _) = api.post(
        &format!("/jobs/{id}/fail"),
        json!({"lease": held[0]["lease"], "run": {"exitCode": 3}}),
    );
    assert_eq!(status, 200);
    // A group with a job: listed, exit 0.
    let (code, text, stderr) = client_command(&server, &["failures", "exit:3"]);
    assert_eq!(code, 0, "{text}{stderr}");
    // A group without one, listed or acted on: nothing found, exit 3,
    // saying where the groups are, in either format.
    for args in [
        &["failures", "NOSUCH"][..],
        &["failures", "NOSUCH", "--format", "text"],
        &["failures", "NOSUCH", "--retry"],
        &["failures", "NOSUCH", "--delete"],
    ] {
        let (code, text, stderr) = client_command(&server, args);
        assert_eq!(code, 3, "{args:?}: {text}{stderr}");
        assert!(stderr.contains("jobmgr failures"), "{args:?}: {stderr}");
    }
    assert_eq!(api.state(id).as_deref(), Some("FAILED"), "untouched");
}

#[test]
fn failures_are_grouped_by_timeout_and_missing_worker() {
    let server = Server::start();
    let api = server.api();
    let _supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("kinds/*")
        .arg("--max-attempts")
        .arg("1")
        .arg("--no-worker-timeout")
        .arg("0")
        .arg("--timeout")
        .arg("1s")
        .worker(
            "slow",
            "#!/bin/sh
sleep 60
",
        )
        .start();
    let slow = api.create(json!({"name": "kinds/slow"}));
    let missing = api.create(json!({"name": "kinds/missing"}));
    for id in [slow, missing] {
        poll("the job to fail", || {
            (api.state(id).as_deref() == Some("FAILED")).then_some(())
        });
    }
    let groups = report_json(&server, &["failures"]);
    let mut found: Vec<(String, u64)> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().into(),
                g["count"].as_u64().unwrap(),
            )
        })
        .collect();
    found.sort();
    assert_eq!(
        found,
        [("no_worker".into(), 1), ("timeout".into(), 1)],
        "{groups}"
    );
    let members = report_json(&server, &["failures", "timeout"]);
    assert_eq!(members["jobs"][0]["jobID"], slow, "{members}");
    let (_, history) = api.get(&format!("/jobs/{slow}/history"));
    assert_eq!(
        [
            &history["attempts"][0]["outcome"],
            &history["attempts"][0]["failure"]
        ],
        [&json!("failed"), &json!("timeout")],
        "{history}"
    );
}

#[test]
fn history_is_purged_by_count_and_by_age() {
    let clock = Clock::at("2026-03-01 00:00:00");
    let server = clock.server().arg("--history-max-count").arg("3").start();
    let api = server.api();
    let mut finished = Vec::new();
    for second in 1..=5 {
        let id = api.create(json!({"name": "purge/me"}));
        api.take("purge/me");
        clock.set(&format!("2026-03-01 00:00:0{second}"));
        assert_eq!(api.post(&format!("/jobs/{id}/finish"), json!({})).0, 200);
        finished.push(id);
    }
    // By count: the two oldest of five go.
    let (status, purged) = api.post("/purge", json!({}));
    assert_eq!(status, 200, "{purged}");
    assert_eq!(purged["archived"], 2, "{purged}");
    for id in &finished[..2] {
        assert_error(api.get(&format!("/jobs/{id}/history")), 404, "no_such_job");
    }
    for id in &finished[2..] {
        assert_eq!(api.get(&format!("/jobs/{id}/history")).0, 200);
    }
    // A failure counts too, and pushes the oldest kept out.
    let failed = api.create(json!({"name": "purge/fail"}));
    api.take("purge/fail");
    clock.set("2026-03-01 00:00:10");
    assert_eq!(api.post(&format!("/jobs/{failed}/fail"), json!({})).0, 200);
    let purged = report_json(&server, &["purge"]);
    assert_eq!(purged["archived"], 1, "{purged}");
    assert_error(
        api.get(&format!("/jobs/{}/history", finished[2])),
        404,
        "no_such_job",
    );

    // By age: eight days on, the history (7 days) is gone, FAILED jobs with
    // it; the statistics (30 days) stay, without their histograms (7 days).
    clock.set("2026-03-09 00:00:00");
    let (_, purged) = api.post("/purge", json!({}));
    assert_eq!(
        [&purged["archived"], &purged["failed"]],
        [&json!(3), &json!(1)],
        "{purged}"
    );
    assert_eq!(api.state(failed), None);
    assert_error(
        api.get(&format!("/jobs/{failed}/history")),
        404,
        "no_such_job",
    );
    let (_, groups) = api.get("/failures");
    assert_eq!(groups["groups"], json!([]));
    let (_, stats) = api.get("/stats?name=purge/*&from=2026-03-01&to=2026-03-01%2001:00:00");
    let kept = point(&stats, "purge/me", "2026-03-01 00:00:00");
    assert_eq!(kept["finished"], 5);
    assert!(purged["histograms"].as_u64().unwrap() >= 1, "{purged}");
    assert_eq!(kept["run"]["histogram"], json!([]), "{kept}");
    assert_eq!(kept["run"]["count"], 5);

    // Thirty-one days on, the statistics go too.
    clock.set("2026-04-01 00:00:00");
    let (_, purged) = api.post("/purge", json!({}));
    assert!(purged["stats"].as_u64().unwrap() >= 2, "{purged}");
    let (_, stats) = api.get("/stats?name=purge/*&from=2026-03-01&to=2026-03-01%2001:00:00");
    assert_eq!(stats["series"], json!([]), "{stats}");
}

#[test]
fn the_server_purges_on_its_own_schedule() {
    let clock = Clock::at("2026-04-01 00:00:00");
    let server = clock.server().arg("--purge-every").arg("1s").start();
    let api = server.api();
    let id = api.create(json!({"name": "auto/purge"}));
    api.take("auto/purge");
    assert_eq!(api.post(&format!("/jobs/{id}/finish"), json!({})).0, 200);
    assert_eq!(api.get(&format!("/jobs/{id}/history")).0, 200);
    clock.set("2026-05-05 00:00:00");
    poll("the periodic purge", || {
        let (status, _) = api.get(&format!("/jobs/{id}/history"));
        let (_, stats) = api.get("/stats?name=auto/*&from=2026-04-01&to=2026-04-02");
        (status == 404 && stats["series"] == json!([])).then_some(())
    });
    // Logged once the purge's commit is done, which the test may see first.
    poll("the purge to be logged", || {
        server.stderr().contains("purged history").then_some(())
    });
    // A purge interval under a second is refused at start.
    let dir = tempfile::tempdir().expect("temp dir");
    let output = jobmgr_in(dir.path())
        .args([
            "server",
            "--purge-every",
            "10ms",
            "--http",
            "127.0.0.1:0",
            "--bedrock",
            "none",
        ])
        .run_bounded("jobmgr server --purge-every 10ms to be refused");
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_supervisor_that_is_no_longer_seen_is_marked_gone() {
    let clock = Clock::at("2026-06-01 12:00:00");
    let server = clock.server().arg("--worker-gone-after").arg("1m").start();
    let api = server.api();
    let mut supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("reg/*")
        .arg("--max-workers")
        .arg("3")
        .worker(
            "hold",
            "#!/bin/sh\nwhile [ ! -e \"$(dirname \"$0\")/../release\" ]; do sleep 0.05; done\n",
        )
        .start();
    let pid = supervisor.pid();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let id = api.create(json!({"name": "reg/hold"}));
    let me = poll("the supervisor registered, holding the job", || {
        let (_, workers) = api.get("/workers");
        workers["workers"]
            .as_array()?
            .iter()
            .find(|w| w["pid"] == pid && w["jobs"] == json!([id]))
            .cloned()
    });
    assert_eq!(me["id"], format!("{host}-{pid}"));
    assert_eq!(
        [&me["host"], &me["capacity"], &me["state"]],
        [&json!(host), &json!(3), &json!("active")],
        "{me}"
    );
    assert_eq!(me["load"], 0.0, "the load it read: {me}");
    assert_eq!(me["lastSeen"], "2026-06-01 12:00:00");

    // Half an hour of holding one job of three slots: 1/3 utilisation.
    clock.set("2026-06-01 12:30:00");
    std::fs::write(supervisor.dir.path().join("release"), "").unwrap();
    poll("the job to finish", || {
        api.state(id).is_none().then_some(())
    });
    let (_, workers) = api.get("/workers");
    let me = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pid"] == pid)
        .unwrap()
        .clone();
    assert!(close(&me["utilisation"], 1.0 / 3.0), "{me}");
    assert_eq!(me["busySecs"], 1800.0);

    supervisor.kill9();
    clock.set("2026-06-01 12:32:00");
    let (_, workers) = api.get("/workers");
    let me = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pid"] == pid)
        .unwrap()
        .clone();
    assert_eq!(me["state"], "gone", "{me}");
    let (code, text, _) = client_command(&server, &["workers", "--format", "text"]);
    assert_eq!(code, 0);
    let line = text
        .lines()
        .find(|l| l.contains(&format!("-{pid}")))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("gone"), "{text}");
    assert_column_lines_up(&text, "WORKER");

    // Hostile identities are refused and change nothing.
    for bad in [
        json!({"id": "", "host": "h", "pid": 1, "capacity": 1, "running": 0}),
        json!({"id": "x\ny", "host": "h", "pid": 1, "capacity": 1, "running": 0}),
        json!({"id": "x", "host": "h", "pid": -1, "capacity": 1, "running": 0}),
        json!({"id": "x", "host": "h", "pid": 1, "capacity": 1, "running": 0, "colour": "red"}),
        json!({"id": "x", "host": "h", "pid": 1, "capacity": 1}),
    ] {
        let (status, answer) = api.post("/dequeue", json!({"name": "reg/*", "worker": bad}));
        assert_eq!(status, 400, "{bad}: {answer}");
        let (status, answer) = api.post("/workers", json!({"worker": bad}));
        assert_eq!(status, 400, "{bad}: {answer}");
    }
    let (_, workers) = api.get("/workers");
    assert_eq!(workers["workers"].as_array().unwrap().len(), 1, "{workers}");
}

/// A supervisor's point at `time` in `/stats/workers`.
fn worker_point<'a>(stats: &'a Value, worker: &str, time: &str) -> &'a Value {
    series_point(stats, "worker", worker, time)
}

#[track_caller]
fn assert_worker_figures(point: &Value, jobs: u64, busy: f64, capacity: f64) {
    assert_eq!(point["jobs"], jobs, "jobs: {point}");
    assert!(close(&point["busySecs"], busy), "busy {busy}: {point}");
    assert!(
        close(&point["capacitySecs"], capacity),
        "capacity {capacity}: {point}"
    );
    assert!(
        close(&point["utilisation"], busy / capacity),
        "utilisation {}: {point}",
        busy / capacity
    );
}

/// A supervisor's row in `GET /workers`.
fn registry_row(api: &Api, id: &str) -> Value {
    let (_, workers) = api.get("/workers");
    workers["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no supervisor {id} in {workers}"))
}

#[test]
fn worker_utilisation_per_hour_matches_a_scripted_run() {
    let clock = Clock::at("2026-01-01 10:59:00");
    let server = clock.server().start();
    let api = server.api();
    let w = json!({"id": "web-1-100", "host": "web-1", "pid": 100, "capacity": 2, "running": 0});
    let announce = |who: &Value| {
        let (status, answer) = api.post("/workers", json!({"worker": who}));
        assert_eq!(status, 200, "{answer}");
    };
    announce(&w);
    let a = api.create(json!({"name": "util/a"}));
    // Job A runs from 10:59:30 to 11:00:30, half in each hour, with a
    // heartbeat at 11:00 between.
    clock.set("2026-01-01 10:59:30");
    let taken = api.dequeue(json!({"name": "util/*", "worker": w}));
    assert_eq!(taken[0]["jobID"], a);
    let lease = taken[0]["lease"].as_str().expect("lease").to_string();
    clock.set("2026-01-01 11:00:00");
    let (status, _) = api.post(
        &format!("/jobs/{a}/heartbeat"),
        json!({"lease": lease.clone()}),
    );
    assert_eq!(status, 200);
    clock.set("2026-01-01 11:00:30");
    let (status, _) = api.post(&format!("/jobs/{a}/finish"), json!({"lease": lease}));
    assert_eq!(status, 200);
    clock.set("2026-01-01 11:01:00");
    announce(&w);
    // Nine minutes unheard (more than --worker-gone-after, 2m): no capacity.
    clock.set("2026-01-01 11:10:00");
    announce(&w);
    clock.set("2026-01-01 11:10:30");
    // A retryAfter job, so that it can be deleted while handed out.
    let b = api.create(json!({"name": "util/b", "retryAfter": "+1 HOUR"}));
    assert_eq!(
        api.dequeue(json!({"name": "util/*", "worker": w}))[0]["jobID"],
        b
    );

    // Ten seconds into B: it counts as busy, the capacity since 11:10:30
    // as offered.
    clock.set("2026-01-01 11:10:40");
    let (status, stats) =
        api.get("/stats/workers?from=2026-01-01%2010:00:00&to=2026-01-01%2012:00:00");
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["series"].as_array().unwrap().len(), 1, "{stats}");
    // Hour 10: 10:59 to 11:00 at 2 slots = 120 s offered, 30 s of A.
    let ten = worker_point(&stats, "web-1-100", "2026-01-01 10:00:00");
    assert_worker_figures(ten, 0, 30.0, 120.0);
    assert_eq!(ten["run"]["count"], 0);
    // Hour 11: 11:00-11:01 and 11:10-11:10:40 at 2 slots = 200 s; 30 s of
    // A and 10 of B; A's run of 60 s ended in it.
    let eleven = worker_point(&stats, "web-1-100", "2026-01-01 11:00:00");
    assert_worker_figures(eleven, 1, 40.0, 200.0);
    assert_summary(&eleven["run"], 1, 60.0, 0.0, 60.0, 60.0);
    let (_, days) = api.get("/stats/workers?period=day&from=2026-01-01&to=2026-01-02");
    let day = worker_point(&days, "web-1-100", "2026-01-01 00:00:00");
    assert_worker_figures(day, 1, 70.0, 320.0);
    assert_eq!(days["series"][0]["total"]["jobs"], 1);
    // For people: the window's figures in a row.
    let (columns, text) = text_row(
        &server,
        &["stats", "--workers", "--period", "day"],
        "web-1-100",
    );
    assert_eq!(
        columns,
        ["1", "1m00s", "1m00s", "1m10s", "5m20s", "22%", "web-1-100"],
        "{text}"
    );
    assert_column_lines_up(&text, "WORKER");

    // B is deleted at 11:11:30 without a report: it kept the supervisor
    // busy until it was last heard from, at 11:11:00.
    clock.set("2026-01-01 11:11:00");
    announce(&w);
    clock.set("2026-01-01 11:11:30");
    assert_eq!(api.delete(&format!("/jobs/{b}")).0, 200);

    // A second supervisor takes C and dies: its lease lapses at 11:20, long
    // after it was last heard from, which is all the busy time it gets; the
    // lapse does not count as hearing from it.
    let w2 = json!({"id": "web-2-200", "host": "web-2", "pid": 200, "capacity": 1, "running": 0});
    announce(&w2);
    let c = api.create(json!({"name": "util/c"}));
    clock.set("2026-01-01 11:12:10");
    let taken = api.dequeue(json!({"name": "util/c", "worker": w2, "leaseMs": 1000}));
    assert_eq!(taken[0]["jobID"], c);
    clock.set("2026-01-01 11:20:00");
    poll("C's lease to lapse", || {
        (api.state(c).as_deref() == Some("QUEUED")).then_some(())
    });
    let (_, stats) = api.get("/stats/workers?from=2026-01-01%2011:00:00&to=2026-01-01%2012:00:00");
    // W: 240 s offered (11:11:00 added 60), 60 s busy; gone, so nothing live.
    assert_worker_figures(
        worker_point(&stats, "web-1-100", "2026-01-01 11:00:00"),
        1,
        60.0,
        240.0,
    );
    // W2: 40 s offered (11:11:30 to 11:12:10 at 1 slot), none busy.
    assert_worker_figures(
        worker_point(&stats, "web-2-200", "2026-01-01 11:00:00"),
        0,
        0.0,
        40.0,
    );
    let (_, history) = api.get(&format!("/jobs/{c}/history"));
    assert_eq!(history["attempts"][0]["outcome"], "lease_lost", "{history}");
    let w2_row = registry_row(&api, "web-2-200");
    assert_eq!(
        [&w2_row["lastSeen"], &w2_row["state"]],
        [&json!("2026-01-01 11:12:10"), &json!("gone")],
        "{w2_row}"
    );
    // A third supervisor runs D through a ten-minute silence: neither the
    // capacity nor the busy time of the gap counts (utilisation stays
    // undefined rather than infinite), but the run it reported does.
    clock.set("2026-01-01 11:30:00");
    let w3 = json!({"id": "web-3-300", "host": "web-3", "pid": 300, "capacity": 1, "running": 0});
    announce(&w3);
    let d = api.create(json!({"name": "util/d"}));
    let taken = api.dequeue(json!({"name": "util/d", "worker": w3, "leaseMs": 3_600_000}));
    assert_eq!(taken[0]["jobID"], d);
    let lease = taken[0]["lease"].as_str().unwrap().to_string();
    clock.set("2026-01-01 11:40:00");
    let (status, _) = api.post(&format!("/jobs/{d}/finish"), json!({"lease": lease}));
    assert_eq!(status, 200);
    // E is taken at 11:40:30 and finished by an operator at 11:41:00,
    // without the lease: that is not hearing from the supervisor, nor a run
    // it reported.
    clock.set("2026-01-01 11:40:30");
    let e = api.create(json!({"name": "util/e"}));
    assert_eq!(
        api.dequeue(json!({"name": "util/e", "worker": w3}))[0]["jobID"],
        e
    );
    clock.set("2026-01-01 11:41:00");
    let (code, _, stderr) = client_command(&server, &["job", "finish", &e.to_string()]);
    assert_eq!(code, 0, "{stderr}");
    clock.set("2026-01-01 11:50:00");
    let (_, stats) = api
        .get("/stats/workers?worker=web-3-*&from=2026-01-01%2011:00:00&to=2026-01-01%2012:00:00");
    let w3_hour = worker_point(&stats, "web-3-300", "2026-01-01 11:00:00");
    assert_eq!(
        [&w3_hour["jobs"], &w3_hour["busySecs"]],
        [&json!(1), &json!(0.0)],
        "{w3_hour}"
    );
    assert!(close(&w3_hour["capacitySecs"], 30.0), "{w3_hour}");
    assert_summary(&w3_hour["run"], 1, 600.0, 0.0, 600.0, 600.0);
    let w3_row = registry_row(&api, "web-3-300");
    assert_eq!(w3_row["lastSeen"], "2026-01-01 11:40:30", "{w3_row}");

    // One supervisor by GLOB; hostile parameters refused.
    let (_, one) = api.get("/stats/workers?worker=web-2-*&from=2026-01-01&to=2026-01-02");
    assert_eq!(one["series"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["series"][0]["worker"], "web-2-200");
    for query in ["period=week", "from=noon", "colour=red", "name=x"] {
        let (status, answer) = api.get(&format!("/stats/workers?{query}"));
        assert_eq!(status, 400, "{query}: {answer}");
    }
    let (code, _, _) = client_command(&server, &["stats", "--workers", "--name", "x"]);
    assert_eq!(code, 2, "--workers and --name do not go together");

    // Kept as long as the statistics (30 days), then purged.
    clock.set("2026-02-01 12:00:00");
    let (_, purged) = api.post("/purge", json!({}));
    // Six hours of names (util/a twice, b, c, d, e) and four of supervisors.
    assert_eq!(purged["stats"], 10, "{purged}");
    let (_, stats) = api.get("/stats/workers?from=2026-01-01&to=2026-01-02");
    assert_eq!(stats["series"], json!([]), "{stats}");
}

#[test]
fn a_report_carries_what_the_supervisor_saw_and_bad_facts_change_nothing() {
    let server = Server::start();
    let api = server.api();
    let id = api.create(json!({"name": "facts/one"}));
    let lease = api.take("facts/one")["lease"].as_str().unwrap().to_string();
    // A supervisor newer than the server sends fields the server does not
    // know; the refusal names the field, which is how it falls back.
    let (status, answer) = api.post(
        &format!("/jobs/{id}/finish"),
        json!({"lease": lease, "bogus": 1}),
    );
    assert_eq!(status, 400);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `bogus`"),
        "{answer}"
    );
    for bad in [
        json!({"signal": "SIG KILL"}),
        json!({"stdout": "x".repeat(64 * 1024 + 1)}),
        json!({"exitCode": "zero"}),
        json!({"exitCode": 0, "colour": "red"}),
    ] {
        let (status, answer) = api.post(
            &format!("/jobs/{id}/finish"),
            json!({"lease": lease, "run": bad}),
        );
        assert_eq!(status, 400, "{answer}");
        assert_eq!(
            api.state(id).as_deref(),
            Some("RUNNING"),
            "a refused report changes nothing"
        );
    }
    let tail = format!("{}the end\n", "x".repeat(10_000));
    let run = json!({"exitCode": 0, "stdout": tail, "stderr": ""});
    let (status, answer) = api.post(
        &format!("/jobs/{id}/finish"),
        json!({"lease": lease, "run": run}),
    );
    assert_eq!(status, 200, "{answer}");
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    let attempt = &history["attempts"][0];
    assert_eq!(attempt["exitCode"], 0);
    let stdout = attempt["stdout"].as_str().unwrap();
    assert!(
        stdout.len() <= 4096 && stdout.len() > 4000,
        "4 KiB at most are kept: {}",
        stdout.len()
    );
    assert!(stdout.starts_with("xxx"), "the head is kept");
    assert!(stdout.contains(" bytes of output dropped …]"), "{stdout}");
    assert!(stdout.ends_with("the end\n"), "the tail is kept");
}

#[test]
fn a_supervisor_whose_gate_is_closed_still_says_it_is_alive() {
    let server = Server::start();
    let api = server.api();
    let supervisor = Supervisor::builder(&server.url)
        .arg("--job-name")
        .arg("idle/*")
        .arg("--max-load")
        .arg("1")
        .start();
    supervisor.set_load(50.0);
    let pid = supervisor.pid();
    // Tests poll every 5 s, so it is heard from within about that.
    let me = poll("the supervisor to announce itself with its load", || {
        let (_, workers) = api.get("/workers");
        workers["workers"]
            .as_array()?
            .iter()
            .find(|w| w["pid"] == pid && w["load"] == 50.0)
            .cloned()
    });
    assert_eq!(
        [&me["state"], &me["running"]],
        [&json!("active"), &json!(0)],
        "{me}"
    );
    // The load it reported stopped it taking jobs.
    let id = api.create(json!({"name": "idle/none"}));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
}

#[test]
fn a_retry_after_job_handed_out_again_or_deleted_closes_its_attempts() {
    let clock = Clock::at("2026-07-01 00:00:00");
    let server = clock.server().start();
    let api = server.api();
    let id = api.create(json!({"name": "ra/job", "retryAfter": "+1 MINUTE"}));
    api.take("ra/job");
    clock.set("2026-07-01 00:01:01");
    // Nudge the queue: the hand-out is due again a minute later.
    poll("the job handed out again", || {
        let jobs = api.dequeue(json!({"name": "ra/job"}));
        (!jobs.is_empty()).then_some(())
    });
    assert_eq!(api.delete(&format!("/jobs/{id}")).0, 200);
    assert_eq!(
        api.outcomes(id),
        ["superseded", "deleted"],
        "attempts outlive a deleted job"
    );
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    assert_eq!(history["attempts"][1]["ended"], "2026-07-01 00:01:01");
    assert_eq!(history["job"], Value::Null);
}

/// Several events of one hour in one transaction (a claim of three jobs)
/// are summed before they are added to the hour's row: the row ends as
/// if each had been added alone.
#[test]
fn statistics_of_a_claim_of_several_jobs_add_to_the_hour_as_each_would_alone() {
    let clock = Clock::at("2026-01-01 10:00:00");
    let server = clock.server().start();
    let api = server.api();
    api.create(json!({"name": "mail/send"}));
    api.create(json!({"name": "mail/send"}));
    clock.set("2026-01-01 10:00:04");
    api.create(json!({"name": "mail/send"}));
    api.create(json!({"name": "mail/send"}));
    // A wait of 5 s alone, then waits of 9, 5 and 5 s in one claim.
    clock.set("2026-01-01 10:00:05");
    assert_eq!(api.dequeue(json!({"name": "mail/send"})).len(), 1);
    clock.set("2026-01-01 10:00:09");
    let three = api.dequeue(json!({"name": "mail/send", "numResults": 3}));
    assert_eq!(three.len(), 3, "{three:?}");

    let (status, stats) =
        api.get("/stats?name=mail/send&from=2026-01-01%2010:00:00&to=2026-01-01%2011:00:00");
    assert_eq!(status, 200, "{stats}");
    let send = point(&stats, "mail/send", "2026-01-01 10:00:00");
    assert_eq!([&send["added"], &send["started"]], [&json!(4), &json!(4)]);
    // Waits 5, 9, 5, 5: mean 6, sample variance (1 + 9 + 1 + 1) / 3 = 4.
    assert_summary(&send["wait"], 4, 6.0, 4.0, 5.0, 9.0);
    assert_eq!(
        send["wait"]["histogram"],
        json!([{"from": 5, "to": 6, "count": 3}, {"from": 9, "to": 10, "count": 1}])
    );
}
