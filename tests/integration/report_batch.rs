//! `POST /reports`: several reports in one request, each as its own
//! endpoint takes it, refused whole when one cannot be read (nothing
//! changes), answered report by report otherwise; and a supervisor under
//! load sending its reports that way. `POST /dequeue` with `reports`: the
//! same, applied before the claim, and a supervisor that takes one job at a
//! time sending each report with its next fetch (several workers: see
//! `riders`).

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
        (json!({"reports": too_many}), "send at most 256"),
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

/// Creates `count` jobs of the `Quick` worker (repeating, so that each
/// stays to be looked at) and waits until each has run once, its data
/// saying so: their ids.
pub fn run_quick_jobs(api: &Api, sup: &Supervisor, count: usize) -> Vec<i64> {
    let jobs: Vec<Value> = (0..count)
        .map(|_| json!({"name": "Quick", "repeat": "FINISHED, +1 HOUR"}))
        .collect();
    let ids = api.create_batch(jobs);
    wait_for("every job to be finished once", sup, || {
        ids.iter()
            .all(|id| {
                let job = api.job(*id);
                job["state"] == "QUEUED" && job["data"]["ran"] == true
            })
            .then_some(())
    });
    ids
}

/// What a run of [`quick_jobs_with`] left: the server's and the
/// supervisor's metrics.
pub struct QuickRun {
    /// The server's metrics text.
    pub server: String,
    /// The supervisor's metrics text, once it counted every report.
    pub supervisor: String,
}

impl QuickRun {
    /// The server's count of `POST` requests to `route`.
    pub fn route(&self, route: &str) -> f64 {
        sample(
            &self.server,
            "jobmgr_server_requests_total",
            &[
                "api=\"http\"",
                "method=\"POST\"",
                &format!("route=\"{route}\""),
            ],
        )
        .unwrap_or(0.0)
    }

    /// The supervisor's count of reports answered that went `way`
    /// (`fetch`, `batch` or `alone`).
    pub fn way(&self, way: &str) -> f64 {
        sample(
            &self.supervisor,
            "jobmgr_reports_sent_total",
            &[&format!("way=\"{way}\"")],
        )
        .unwrap_or(0.0)
    }

    /// Asserts what holds however fast the machine is: each of the
    /// `count` reports was answered once, by one way, and the server saw
    /// at least one request for each report that went by itself and at
    /// most one for each two batched.
    pub fn assert_each_report_answered_once(&self, count: usize) {
        let (fetch, batch, alone) = (self.way("fetch"), self.way("batch"), self.way("alone"));
        let text = format!("{}\n{}", self.supervisor, self.server);
        assert_eq!(
            fetch + batch + alone,
            count as f64,
            "each report answered once ({fetch} with a fetch, {batch} batched, {alone} alone): {text}"
        );
        assert!(
            self.route("/jobs/{id}/finish") >= alone,
            "a request for each report alone: {text}"
        );
        assert!(
            self.route("/reports") * 2.0 <= batch,
            "two or more reports in each batch: {text}"
        );
    }
}

/// Runs `count` jobs of a quick worker (each repeating an hour after it
/// finished, and writing `stderr_bytes` to its stderr, which its report
/// carries) through a supervisor with `max_workers` and `extra` arguments,
/// and checks that each ran once and was finished (back in the queue with
/// its worker's data). Then: the server's and the supervisor's metrics.
pub fn quick_jobs_with(
    max_workers: usize,
    count: usize,
    stderr_bytes: usize,
    extra: &[&str],
) -> QuickRun {
    let server = Server::builder()
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let api = server.api();
    let mut sup = Supervisor::builder(&server.url)
        .worker(
            "Quick",
            &sh(&format!(
                "cat > /dev/null; head -c {stderr_bytes} /dev/zero | tr '\\0' x >&2; echo '{{\"ran\": true}}'"
            )),
        )
        .arg("--max-workers")
        .arg(&max_workers.to_string())
        .arg("--metrics")
        .arg("127.0.0.1:0");
    for arg in extra {
        sup = sup.arg(arg);
    }
    let sup = sup.start();
    let ids = run_quick_jobs(&api, &sup, count);
    for id in &ids {
        assert_eq!(api.outcomes(*id), vec!["finished"], "job {id}");
    }
    // A job's data says it finished once its report was taken; the
    // supervisor counts the report as its answer arrives, just after.
    let supervisor = scrape_until(
        &sup.ready_field("metrics"),
        "every report counted",
        |text| total(text, "jobmgr_reports_sent_total") >= count as f64,
    );
    QuickRun {
        server: scrape(&server.metrics),
        supervisor,
    }
}

#[test]
fn a_supervisor_under_load_sends_its_reports_in_batches_and_loses_none() {
    // Large reports: each carries its worker's stderr, cut to the output
    // cap. How many went in batches depends on the machine's speed: the
    // bench's figure.
    let count = 200;
    quick_jobs_with(8, count, 70_000, &[]).assert_each_report_answered_once(count);
}

#[test]
fn a_dequeue_carrying_reports_applies_them_before_its_claim_and_answers_at_once() {
    let server = Server::start();
    let api = server.api();
    let parent = api.create(json!({"name": "Ride/parent"}));
    let child = api.create(json!({"name": "Ride/child", "depends": [parent]}));
    let held = api.dequeue(json!({"name": "Ride/parent", "leaseMs": 60_000}));
    assert_eq!(held.len(), 1, "{held:?}");
    // The child is due only once its parent finished: the same request
    // finishes the parent and hands the child out.
    let (status, answer) = api.post(
        "/dequeue",
        json!({"name": "Ride/child", "leaseMs": 60_000, "waitMs": 3_600_000,
               "reports": [{"jobID": parent, "outcome": "finish", "lease": held[0]["lease"]}]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"], json!([{"jobID": parent}]), "{answer}");
    let jobs = answer["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{answer}");
    assert_eq!(jobs[0]["jobID"], child, "{answer}");
    assert_eq!(api.state(parent), None, "finished");
    // Nothing due, and a wait of an hour: a dequeue with reports answers
    // at once. A report refused under its lease is answered as its own
    // endpoint would, and the rest of the request goes on.
    let later = api.create(json!({"name": "Ride/later", "firstRun": "2999-01-01 00:00:00"}));
    let (status, answer) = api.post(
        "/dequeue",
        json!({"name": "Ride/*", "waitMs": 3_600_000, "reports": [
            {"jobID": child, "outcome": "fail", "lease": "not-its-lease"},
            {"jobID": child + 1000, "outcome": "finish"},
        ]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["jobs"], json!([]), "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results[0]["error"]["code"], "lease_lost", "{answer}");
    assert_eq!(results[1]["error"]["status"], 404, "{answer}");
    assert_eq!(api.state(child).as_deref(), Some("RUNNING"));
    let (status, answer) = api.post(
        "/dequeue",
        json!({"name": "Ride/*", "reports": [
            {"jobID": child, "outcome": "fail", "lease": jobs[0]["lease"]},
        ]}),
    );
    assert_eq!(
        (status, &answer["results"]),
        (200, &json!([{"jobID": child}]))
    );
    assert_eq!(api.state(child).as_deref(), Some("FAILED"));
    assert_eq!(api.state(later).as_deref(), Some("QUEUED"));
    // A dequeue without reports answers as it always did.
    let (status, answer) = api.post("/dequeue", json!({"name": "Ride/*"}));
    assert_eq!((status, answer), (200, json!({"jobs": []})));
}

#[test]
fn a_dequeue_with_a_report_it_cannot_read_is_refused_whole_and_claims_nothing() {
    let server = Server::start();
    let api = server.api();
    let jobs = three_running(&api);
    let waiting = api.create(json!({"name": "Batch/waiting"}));
    let good = json!({"jobID": id(&jobs[0]), "outcome": "finish", "lease": jobs[0]["lease"]});
    let too_many: Vec<Value> = (1..=65)
        .map(|n| json!({"jobID": n, "outcome": "finish"}))
        .collect();
    for (reports, says) in [
        (json!(too_many), "send at most 64"),
        (json!([good, good]), "twice"),
        (
            json!([good, {"jobID": id(&jobs[1]), "outcome": "done"}]),
            "reports[1]",
        ),
        (
            json!([good, {"jobID": id(&jobs[1]), "outcome": "finish", "colour": 1}]),
            "unknown field",
        ),
        (json!([good, {"outcome": "fail"}]), "jobID is missing"),
        (
            json!([good, {"jobID": id(&jobs[1]), "outcome": "retry", "delay": 100_000_000}]),
            "more than 99999999 seconds",
        ),
        (json!([good, 7]), "invalid type"),
        (good.clone(), "invalid type"),
        (json!(null), "leave an optional field out"),
    ] {
        let body = json!({"name": "Batch/*", "leaseMs": 60_000, "reports": reports});
        let answer = api.post("/dequeue", body.clone());
        assert_eq!(answer.0, 400, "{body} → {}", answer.1);
        let message = answer.1["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{body} → {message}");
    }
    // A bad dequeue refuses its reports too.
    let answer = api.post(
        "/dequeue",
        json!({"name": "Batch/*", "leaseMs": 1, "reports": [good]}),
    );
    assert_eq!(answer.0, 400, "{}", answer.1);
    // Nothing was reported, and nothing claimed.
    for job in &jobs {
        assert_eq!(api.state(id(job)).as_deref(), Some("RUNNING"));
    }
    assert_eq!(api.state(waiting).as_deref(), Some("QUEUED"));
    assert_error(
        server
            .api()
            .without_token()
            .post("/dequeue", json!({"name": "Batch/*", "reports": [good]})),
        401,
        "unauthorized",
    );
    assert_eq!(api.state(id(&jobs[0])).as_deref(), Some("RUNNING"));
    assert_eq!(api.state(waiting).as_deref(), Some("QUEUED"));
}

#[test]
fn a_supervisor_taking_one_job_at_a_time_sends_reports_with_its_fetches_and_loses_none() {
    let count = 12;
    quick_jobs_with(1, count, 0, &[]).assert_each_report_answered_once(count);
}
