//! `POST /reports`: several reports in one request, each as its own
//! endpoint takes it, refused whole when one cannot be read (nothing
//! changes), answered report by report otherwise; and a supervisor under
//! load sending its reports that way.

use serde_json::{Value, json};

use crate::common::*;

/// Three jobs, handed out with leases.
fn three_running(api: &Api) -> Vec<Value> {
    for name in ["Batch/a", "Batch/b", "Batch/c"] {
        api.create(json!({"name": name}));
    }
    let jobs = api.dequeue(json!({"name": "Batch/*", "numResults": 3, "leaseMs": 60_000}));
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    jobs
}

fn id(job: &Value) -> i64 {
    job["jobID"].as_i64().expect("jobID")
}

#[test]
fn a_batch_finishes_retries_and_fails_each_job_and_answers_each_in_order() {
    let server = Server::start();
    let api = server.api();
    let jobs = three_running(&api);
    let (finished, retried, failed) = (&jobs[0], &jobs[1], &jobs[2]);
    let (status, answer) = api.post(
        "/reports",
        json!({"reports": [
            {"jobID": id(finished), "outcome": "finish", "lease": finished["lease"], "data": {"done": true}},
            {"jobID": id(retried), "outcome": "retry", "lease": retried["lease"], "delay": 3600},
            {"jobID": id(failed), "outcome": "fail", "lease": failed["lease"],
             "run": {"exitCode": 3, "stderr": "no luck"}},
        ]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"results": [{"jobID": id(finished)}, {"jobID": id(retried)}, {"jobID": id(failed)}]})
    );
    assert_eq!(
        api.state(id(finished)),
        None,
        "a finished job without repeat is gone"
    );
    let job = api.job(id(retried));
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert!(job["nextRun"].as_str().unwrap() > job["created"].as_str().unwrap());
    assert_eq!(api.state(id(failed)).as_deref(), Some("FAILED"));
    assert_eq!(api.outcomes(id(failed)), vec!["failed"]);
}

#[test]
fn a_refused_report_leaves_the_rest_of_its_batch_be() {
    let server = Server::start();
    let api = server.api();
    let jobs = three_running(&api);
    let (status, answer) = api.post(
        "/reports",
        json!({"reports": [
            {"jobID": id(&jobs[0]), "outcome": "finish", "lease": jobs[0]["lease"]},
            {"jobID": id(&jobs[1]), "outcome": "finish", "lease": "not-its-lease"},
            {"jobID": 999_999, "outcome": "fail"},
            {"jobID": id(&jobs[2]), "outcome": "finish", "lease": jobs[2]["lease"]},
        ]}),
    );
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), 4);
    assert_eq!(results[0], json!({"jobID": id(&jobs[0])}));
    assert_eq!(results[1]["jobID"], id(&jobs[1]));
    assert_eq!(results[1]["error"]["code"], "lease_lost", "{answer}");
    assert_eq!(results[1]["error"]["status"], 409, "{answer}");
    assert_eq!(results[2]["error"]["status"], 404, "{answer}");
    assert_eq!(results[3], json!({"jobID": id(&jobs[2])}));
    assert_eq!(api.state(id(&jobs[0])), None);
    assert_eq!(api.state(id(&jobs[1])).as_deref(), Some("RUNNING"));
    assert_eq!(api.state(id(&jobs[2])), None);
}

#[test]
fn a_batch_with_a_report_it_cannot_read_is_refused_whole_and_changes_nothing() {
    let server = Server::start();
    let api = server.api();
    let jobs = three_running(&api);
    let good = json!({"jobID": id(&jobs[0]), "outcome": "finish", "lease": jobs[0]["lease"]});
    let too_many: Vec<Value> = (1..=257)
        .map(|n| json!({"jobID": n, "outcome": "finish"}))
        .collect();
    for (body, says) in [
        (json!({"reports": []}), "empty"),
        (json!({"reports": too_many}), "at most 256"),
        (json!({"reports": [good, good]}), "twice"),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]), "outcome": "done"}]}),
            "reports[1]",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]), "outcome": "finish", "colour": 1}]}),
            "unknown field",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]).to_string(), "outcome": "finish"}]}),
            "positive integer",
        ),
        (
            json!({"reports": [good, {"jobID": -4, "outcome": "fail"}]}),
            "reports[1]",
        ),
        (
            json!({"reports": [good, {"outcome": "fail"}]}),
            "jobID is missing",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1])}]}),
            "outcome is missing",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]), "outcome": "retry", "delay": 100_000_000}]}),
            "more than 99999999 seconds",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]), "outcome": "fail",
                   "run": {"stderrBytes": 9_223_372_036_854_775_808u64}}]}),
            "run.stderrBytes",
        ),
        (
            json!({"reports": [good, {"jobID": id(&jobs[1]), "outcome": "retry", "run": [null, null]}]}),
            "an object is expected",
        ),
        (json!({"reports": [good, 7]}), "invalid type"),
        (json!({"reports": good}), "invalid type"),
        (json!({"reports": [good], "extra": 1}), "unknown field"),
    ] {
        let answer = api.post("/reports", body.clone());
        assert_eq!(answer.0, 400, "{body} → {}", answer.1);
        let message = answer.1["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{body} → {message}");
    }
    // The single endpoints read run facts the same way.
    for (run, says) in [
        (json!([null, null]), "an object is expected"),
        (
            json!({"stdoutBytes": 9_223_372_036_854_775_808u64}),
            "run.stdoutBytes",
        ),
    ] {
        let answer = api.post(
            &format!("/jobs/{}/finish", id(&jobs[0])),
            json!({"lease": jobs[0]["lease"], "run": run}),
        );
        assert_eq!(answer.0, 400, "{run} → {}", answer.1);
        let message = answer.1["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{run} → {message}");
    }
    // Nothing was finished by any of them. (A report its own endpoint
    // reads but then refuses, as a negative delay, is refused on its own:
    // see the test above.)
    for job in &jobs {
        assert_eq!(api.state(id(job)).as_deref(), Some("RUNNING"));
    }
    assert_error(
        server
            .api()
            .without_token()
            .post("/reports", json!({"reports": [good]})),
        401,
        "unauthorized",
    );
    assert_eq!(api.state(id(&jobs[0])).as_deref(), Some("RUNNING"));
}

#[test]
fn a_supervisor_under_load_sends_its_reports_in_batches_and_loses_none() {
    let server = Server::builder()
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker("Quick", &sh("cat > /dev/null; echo '{\"ran\": true}'"))
        .arg("--max-workers")
        .arg("8")
        .start();
    let count = 200;
    let jobs: Vec<Value> = (0..count)
        .map(|_| json!({"name": "Quick", "repeat": "FINISHED, +1 HOUR"}))
        .collect();
    let ids = api.create_batch(jobs);
    // Every job ran once and was finished (back in the queue for its next
    // hour, with the data its worker gave).
    wait_for("every job to be finished once", &sup, || {
        ids.iter()
            .all(|id| {
                let job = api.job(*id);
                job["state"] == "QUEUED" && job["data"]["ran"] == true
            })
            .then_some(())
    });
    for id in &ids {
        assert_eq!(api.outcomes(*id), vec!["finished"], "job {id}");
    }
    let text = scrape(&server.metrics);
    let route = |route: &str| {
        sample(
            &text,
            "jobmgr_server_requests_total",
            &[
                "api=\"http\"",
                "method=\"POST\"",
                &format!("route=\"{route}\""),
            ],
        )
        .unwrap_or(0.0)
    };
    assert!(
        route("/reports") >= 1.0,
        "some reports went together: {text}"
    );
    assert!(
        route("/jobs/{id}/finish") + route("/reports") < count as f64,
        "fewer requests than reports: {text}"
    );
}
