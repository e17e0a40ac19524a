//! Every job command over the HTTP API of the real binary: what each does,
//! every refusal with its code and Bedrock's message, the state transitions
//! of jobs without children, and unique/overwrite creation.

use crate::common::*;

use chrono::{NaiveDateTime, TimeDelta, Utc};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Helpers

/// A fresh server and a caller for it.
fn setup() -> (Server, Api) {
    let server = Server::start();
    let api = server.api();
    (server, api)
}

/// A time as the server writes it.
#[track_caller]
fn time(value: &Value) -> NaiveDateTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a time string: {value}"));
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .unwrap_or_else(|e| panic!("not a server time {text:?}: {e}"))
}

/// The wall clock, UTC.
fn now() -> NaiveDateTime {
    Utc::now().naive_utc()
}

/// A time as the API takes it, to the millisecond.
fn stamp(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

/// Asserts that `actual` is `offset` after a moment between `before` and
/// `after`, allowing for the server rounding that moment down to the second.
#[track_caller]
fn assert_offset(
    actual: NaiveDateTime,
    before: NaiveDateTime,
    after: NaiveDateTime,
    offset: TimeDelta,
) {
    let low = before + offset - TimeDelta::seconds(1);
    let high = after + offset + TimeDelta::seconds(1);
    assert!(
        low <= actual && actual <= high,
        "{actual} is not within [{low}, {high}]"
    );
}

/// Asserts an error answer's HTTP status, code and Bedrock message.
#[track_caller]
fn assert_refused(answer: (u16, Value), status: u16, code: &str, message: &str) {
    assert_eq!(
        (
            answer.0,
            answer.1["code"].as_str().unwrap_or(""),
            answer.1["message"].as_str().unwrap_or("")
        ),
        (status, code, message),
        "answer: {}",
        answer.1
    );
}

/// Asserts a 200 answer and returns its body.
#[track_caller]
fn ok(answer: (u16, Value)) -> Value {
    assert_eq!(answer.0, 200, "expected success, got {}", answer.1);
    answer.1
}

fn finish(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/finish"), body)
}

fn retry(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/retry"), body)
}

fn fail(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/fail"), body)
}

fn cancel(api: &Api, id: i64) -> (u16, Value) {
    api.post(&format!("/jobs/{id}/cancel"), json!({}))
}

fn update(api: &Api, id: i64, body: Value) -> (u16, Value) {
    api.patch(&format!("/jobs/{id}"), body)
}

fn delete(api: &Api, id: i64) -> (u16, Value) {
    api.delete(&format!("/jobs/{id}"))
}

fn requeue(api: &Api, body: Value) -> (u16, Value) {
    api.post("/jobs/requeue", body)
}

/// Creates a job and hands it out; returns its id.
#[track_caller]
fn start_job(api: &Api, body: Value) -> i64 {
    let name = body["name"].as_str().expect("name").to_string();
    let id = api.create(body);
    let handed = api.take(&name);
    assert_eq!(handed["jobID"], id, "another job was handed out");
    id
}

/// Every job the server holds, in id order.
fn all_jobs(api: &Api) -> Vec<Value> {
    let answer = ok(api.get("/jobs?limit=1000"));
    answer["jobs"].as_array().expect("jobs").clone()
}

/// How many jobs have exactly this (wildcard-free) name.
fn count_named(api: &Api, name: &str) -> usize {
    all_jobs(api).iter().filter(|j| j["name"] == name).count()
}

/// The names of jobs, sorted.
fn sorted_names(jobs: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = jobs
        .iter()
        .map(|j| j["name"].as_str().expect("name").to_string())
        .collect();
    names.sort();
    names
}

/// The ids of jobs, in the order given.
fn ids(jobs: &[Value]) -> Vec<i64> {
    jobs.iter()
        .map(|j| j["jobID"].as_i64().expect("jobID"))
        .collect()
}

// ---------------------------------------------------------------------------
// CreateJob

#[test]
fn create_job_stores_every_field_it_is_given() {
    let (_server, api) = setup();
    let before = now();
    let id = api.create(json!({
        "name": "fields",
        "data": {"to": "a@example.com", "n": 1, "nested": {"deep": [1, 2]}},
        "firstRun": "2020-01-02 03:04:05",
        "repeat": "finished, +1 hour",
        "priority": 750,
        "retryAfter": "+5 MINUTES",
    }));
    let after = now();
    assert!(id > 0);

    let job = api.job(id);
    assert_eq!(job["jobID"], id);
    assert_eq!(job["name"], "fields");
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(
        job["data"],
        json!({"to": "a@example.com", "n": 1, "nested": {"deep": [1, 2]}})
    );
    assert_eq!(job["priority"], 750);
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR", "repeat is upper-cased");
    assert_eq!(job["nextRun"], "2020-01-02 03:04:05");
    assert_eq!(job["lastRun"], "");
    assert_eq!(job["retryAfter"], "+5 MINUTES");
    assert_eq!(job["parentJobID"], 0);
    assert_eq!(job["attempts"], 0);
    let created = job["created"].as_str().expect("created");
    assert_eq!(created.len(), 19, "created is whole seconds: {created}");
    assert_offset(time(&job["created"]), before, after, TimeDelta::zero());
}

#[test]
fn create_job_defaults_to_empty_data_priority_500_and_due_now() {
    let (_server, api) = setup();
    let before = now();
    let id = api.create(json!({"name": "plain"}));
    let after = now();
    let job = api.job(id);
    assert_eq!(job["data"], json!({}));
    assert_eq!(job["priority"], 500);
    assert_eq!(job["repeat"], "");
    assert_eq!(job["retryAfter"], "");
    assert_eq!(job["state"], "QUEUED");
    assert_offset(time(&job["nextRun"]), before, after, TimeDelta::zero());
    assert_eq!(api.take("plain")["jobID"], id, "due at once");

    // `jobPriority` is Bedrock's name for the same field.
    let aliased = api.create(json!({"name": "alias", "jobPriority": 1000}));
    assert_eq!(api.job(aliased)["priority"], 1000);
}

#[test]
fn create_job_with_first_run_in_the_future_is_not_handed_out() {
    let (_server, api) = setup();
    let later = api.create(json!({"name": "sched", "firstRun": "2099-01-01 00:00:00"}));
    let due = api.create(json!({"name": "sched"}));

    let handed = api.dequeue(json!({"name": "sched", "numResults": 10}));
    assert_eq!(ids(&handed), vec![due], "only the due job is handed out");
    assert!(
        api.dequeue(json!({"name": "*", "numResults": 10}))
            .is_empty()
    );
    let job = api.job(later);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["nextRun"], "2099-01-01 00:00:00");
}

#[test]
fn create_job_with_first_run_soon_is_handed_out_once_due_and_not_before() {
    let (_server, api) = setup();
    let first_run = time(&json!(stamp(now() + TimeDelta::milliseconds(1500))));
    let id = api.create(json!({"name": "soon", "firstRun": stamp(first_run)}));
    assert_eq!(time(&api.job(id)["nextRun"]), first_run);

    let (handed, seen_at) = poll("the job to become due", || {
        let jobs = api.dequeue(json!({"name": "soon"}));
        let seen_at = now();
        (!jobs.is_empty()).then_some((jobs, seen_at))
    });
    assert_eq!(ids(&handed), vec![id]);
    // The server hands it out at a moment no later than we saw the answer,
    // on the same clock; that moment must not be before firstRun.
    assert!(
        seen_at >= first_run,
        "handed out early: answer seen at {seen_at}, firstRun {first_run}"
    );
}

#[test]
fn create_job_refuses_bad_parameters_and_creates_nothing() {
    let (_server, api) = setup();
    let cases = [
        (json!({}), "missing_name", "Missing name"),
        (json!({"name": ""}), "missing_name", "Missing name"),
        (
            json!({"name": "x", "priority": 7}),
            "invalid_priority",
            "Invalid priority value",
        ),
        (
            json!({"name": "x", "priority": -1}),
            "invalid_priority",
            "Invalid priority value",
        ),
        (
            json!({"name": "x", "jobPriority": 501}),
            "invalid_priority",
            "Invalid priority value",
        ),
        (
            json!({"name": "x", "data": [1, 2]}),
            "data_not_object",
            "Data is not a valid JSON Object",
        ),
        (
            json!({"name": "x", "data": "{\"a\":1}"}),
            "data_not_object",
            "Data is not a valid JSON Object",
        ),
        (
            json!({"name": "x", "data": 3}),
            "data_not_object",
            "Data is not a valid JSON Object",
        ),
        (
            json!({"name": "x", "repeat": "SOMETIMES"}),
            "malformed_repeat",
            "Malformed repeat",
        ),
        (
            json!({"name": "x", "repeat": "FINISHED"}),
            "malformed_repeat",
            "Malformed repeat",
        ),
        (
            json!({"name": "x", "repeat": "FINISHED, +1 FORTNIGHT"}),
            "malformed_repeat",
            "Malformed repeat",
        ),
        (
            json!({"name": "x", "retryAfter": "soon"}),
            "malformed_retry_after",
            "Malformed retryAfter",
        ),
        (
            json!({"name": "x", "retryAfter": "+1 FORTNIGHT"}),
            "malformed_retry_after",
            "Malformed retryAfter",
        ),
        (
            json!({"name": "x", "firstRun": "tomorrow"}),
            "malformed_first_run",
            "Malformed firstRun",
        ),
        (
            json!({"name": "x", "firstRun": "2020-13-01 00:00:00"}),
            "malformed_first_run",
            "Malformed firstRun",
        ),
    ];
    for (body, code, message) in cases {
        let (status, answer) = api.post("/jobs", body.clone());
        assert_eq!(
            (status, answer["code"].as_str(), answer["message"].as_str()),
            (400, Some(code), Some(message)),
            "create {body} answered {answer}"
        );
    }
    assert!(all_jobs(&api).is_empty(), "a refused create left a job");
}

// ---------------------------------------------------------------------------
// CreateJobs

#[test]
fn create_jobs_creates_every_job_of_the_batch() {
    let (_server, api) = setup();
    let answer = ok(api.post(
        "/jobs/batch",
        json!({"jobs": [
            {"name": "b1", "data": {"i": 1}},
            {"name": "b2", "priority": 1000},
            {"name": "b3", "firstRun": "2099-01-01 00:00:00", "repeat": "daily"},
        ]}),
    ));
    let created: Vec<i64> = answer["jobIDs"]
        .as_array()
        .expect("jobIDs")
        .iter()
        .map(|v| v.as_i64().expect("id"))
        .collect();
    assert_eq!(created.len(), 3);
    assert!(created[0] != created[1] && created[1] != created[2] && created[0] != created[2]);

    let b1 = api.job(created[0]);
    assert_eq!((&b1["name"], &b1["data"]), (&json!("b1"), &json!({"i": 1})));
    let b2 = api.job(created[1]);
    assert_eq!((&b2["name"], &b2["priority"]), (&json!("b2"), &json!(1000)));
    let b3 = api.job(created[2]);
    assert_eq!(b3["name"], "b3");
    assert_eq!(b3["repeat"], "DAILY");
    assert_eq!(b3["nextRun"], "2099-01-01 00:00:00");
    assert_eq!(all_jobs(&api).len(), 3);
}

#[test]
fn create_jobs_is_all_or_nothing() {
    let (_server, api) = setup();
    // Refused while reading the batch.
    assert_refused(
        api.post(
            "/jobs/batch",
            json!({"jobs": [{"name": "good"}, {"name": "bad", "priority": 7}]}),
        ),
        400,
        "invalid_priority",
        "Invalid priority value",
    );
    assert_refused(
        api.post(
            "/jobs/batch",
            json!({"jobs": [{"name": "good"}, {"name": ""}, {"name": "good2"}]}),
        ),
        400,
        "missing_name",
        "Missing name",
    );
    // Refused by the rules after the first job was written in the same
    // transaction: that job must be rolled back too.
    assert_refused(
        api.post(
            "/jobs/batch",
            json!({"jobs": [{"name": "good"}, {"name": "orphan", "parentJobID": 424242}]}),
        ),
        404,
        "parent_missing",
        "parentJobID does not exist",
    );
    assert!(
        all_jobs(&api).is_empty(),
        "a refused batch left jobs behind: {:?}",
        all_jobs(&api)
    );
    assert!(
        api.dequeue(json!({"name": "*", "numResults": 10}))
            .is_empty()
    );

    // The good job alone goes through.
    ok(api.post("/jobs/batch", json!({"jobs": [{"name": "good"}]})));
    assert_eq!(sorted_names(&all_jobs(&api)), vec!["good"]);
}

#[test]
fn create_jobs_with_an_empty_batch_is_invalid_json() {
    let (_server, api) = setup();
    assert_refused(
        api.post("/jobs/batch", json!({"jobs": []})),
        400,
        "invalid_json",
        "Invalid JSON",
    );
    // Not an array at all: a body that does not parse (api.md).
    assert_error(
        api.post("/jobs/batch", json!({"jobs": "x"})),
        400,
        "invalid_request",
    );
    assert!(all_jobs(&api).is_empty());
}

// ---------------------------------------------------------------------------
// GetJob / GetJobs via /dequeue

/// Names of a job of each kind the name tests need.
const NAMES: [&str; 8] = [
    "www-prod/SendEmail",
    "www-prod/Resize",
    "www-stag/SendEmail",
    "abc",
    "abd",
    "ab",
    "xbc",
    "ABC",
];

/// On a fresh server holding one job of each of [`NAMES`], the sorted names
/// one dequeue of `pattern` hands out.
fn handed_out(pattern: &str) -> Vec<String> {
    let (_server, api) = setup();
    for name in NAMES {
        api.create(json!({"name": name}));
    }
    sorted_names(&api.dequeue(json!({"name": pattern, "numResults": 100})))
}

#[test]
fn dequeue_star_glob_matches_every_name() {
    let mut all: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
    all.sort();
    assert_eq!(handed_out("*"), all);
}

#[test]
fn dequeue_prefix_glob_matches_only_that_prefix() {
    assert_eq!(
        handed_out("www-prod/*"),
        vec!["www-prod/Resize", "www-prod/SendEmail"]
    );
    assert_eq!(
        handed_out("www-*/SendEmail"),
        vec!["www-prod/SendEmail", "www-stag/SendEmail"]
    );
    // Without a wildcard a name matches only itself, case-sensitively.
    assert_eq!(handed_out("www-prod"), Vec::<String>::new());
    assert_eq!(handed_out("abc"), vec!["abc"]);
    assert_eq!(handed_out("Abc"), Vec::<String>::new());
}

#[test]
fn dequeue_question_mark_glob_matches_exactly_one_character() {
    assert_eq!(handed_out("ab?"), vec!["abc", "abd"]);
    assert_eq!(handed_out("?bc"), vec!["abc", "xbc"]);
    assert_eq!(handed_out("ab??"), Vec::<String>::new());
}

#[test]
fn dequeue_set_glob_matches_the_listed_characters() {
    assert_eq!(handed_out("[ax]bc"), vec!["abc", "xbc"]);
    assert_eq!(handed_out("ab[c-d]"), vec!["abc", "abd"]);
    assert_eq!(handed_out("[^a]bc"), vec!["xbc"]);
    assert_eq!(handed_out("[A-Z]*"), vec!["ABC"]);
}

#[test]
fn dequeue_comma_list_means_exact_names() {
    assert_eq!(handed_out("abc, ab"), vec!["ab", "abc"]);
    assert_eq!(handed_out("abc,nosuch"), vec!["abc"]);
    // In a list, wildcards are not wildcards.
    assert_eq!(handed_out("ab*, xbc"), vec!["xbc"]);
    assert_eq!(
        handed_out("www-prod/Resize,www-stag/SendEmail"),
        vec!["www-prod/Resize", "www-stag/SendEmail"]
    );
}

#[test]
fn dequeue_num_results_caps_how_many_are_handed_out() {
    let (_server, api) = setup();
    let created: Vec<i64> = (0..5)
        .map(|i| api.create(json!({"name": "batch", "data": {"i": i}})))
        .collect();

    let mut handed = api.dequeue(json!({"name": "batch"}));
    assert_eq!(handed.len(), 1, "numResults defaults to 1");
    let three = api.dequeue(json!({"name": "batch", "numResults": 3}));
    assert_eq!(three.len(), 3);
    handed.extend(three);
    let rest = api.dequeue(json!({"name": "batch", "numResults": 10}));
    assert_eq!(rest.len(), 1, "only one was left");
    handed.extend(rest);
    assert!(
        api.dequeue(json!({"name": "batch", "numResults": 10}))
            .is_empty()
    );

    let mut got = ids(&handed);
    got.sort();
    assert_eq!(got, created, "each job handed out exactly once");
    for id in created {
        assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    }
}

#[test]
fn dequeue_hands_out_by_priority_desc_then_next_run_asc() {
    let (_server, api) = setup();
    let mid_late =
        api.create(json!({"name": "order", "priority": 500, "firstRun": "2020-01-01 00:00:03"}));
    let mid_early =
        api.create(json!({"name": "order", "priority": 500, "firstRun": "2020-01-01 00:00:01"}));
    let lowest_oldest =
        api.create(json!({"name": "order", "priority": 0, "firstRun": "2019-01-01 00:00:00"}));
    let highest_newest =
        api.create(json!({"name": "order", "priority": 1000, "firstRun": "2020-01-01 00:00:05"}));
    let high =
        api.create(json!({"name": "order", "priority": 750, "firstRun": "2020-01-01 00:00:04"}));
    let expected = vec![highest_newest, high, mid_early, mid_late, lowest_oldest];

    let handed = api.dequeue(json!({"name": "order", "numResults": 10}));
    assert_eq!(ids(&handed), expected);
}

#[test]
fn dequeue_one_at_a_time_takes_the_best_job_first() {
    let (_server, api) = setup();
    let low = api.create(json!({"name": "one", "priority": 250, "firstRun": "2019-01-01"}));
    let later = api.create(json!({"name": "one", "priority": 850, "firstRun": "2020-06-01"}));
    let earlier = api.create(json!({"name": "one", "priority": 850, "firstRun": "2020-01-01"}));
    let taken: Vec<i64> = (0..3)
        .map(|_| api.take("one")["jobID"].as_i64().unwrap())
        .collect();
    assert_eq!(taken, vec![earlier, later, low]);
}

#[test]
fn dequeue_priority_filter_hands_out_only_that_priority() {
    let (_server, api) = setup();
    let top = api.create(json!({"name": "pri", "priority": 1000}));
    let mid = api.create(json!({"name": "pri", "priority": 500}));
    let bottom = api.create(json!({"name": "pri", "priority": 0}));

    let handed = api.dequeue(json!({"name": "pri", "priority": 500, "numResults": 10}));
    assert_eq!(ids(&handed), vec![mid]);
    let handed = api.dequeue(json!({"name": "pri", "jobPriority": 0, "numResults": 10}));
    assert_eq!(ids(&handed), vec![bottom]);
    assert!(
        api.dequeue(json!({"name": "pri", "priority": 500}))
            .is_empty(),
        "the 1000 job must not be handed to a priority-500 request"
    );
    assert_refused(
        api.post("/dequeue", json!({"name": "pri", "priority": 7})),
        400,
        "invalid_priority",
        "Invalid priority value",
    );
    assert_eq!(api.state(top).as_deref(), Some("QUEUED"));
    assert_eq!(api.take("pri")["jobID"], top);
}

#[test]
fn dequeue_answer_carries_the_job_as_it_was_before_the_hand_out() {
    let (_server, api) = setup();
    let id = api.create(json!({
        "name": "shape",
        "data": {"k": "v"},
        "priority": 750,
        "firstRun": "2020-05-06 07:08:09",
    }));
    let created = api.job(id)["created"].clone();
    let before = now();
    let job = api.take("shape");
    let after = now();

    assert_eq!(job["jobID"], id);
    assert_eq!(job["name"], "shape");
    assert_eq!(job["data"], json!({"k": "v"}));
    assert_eq!(job["priority"], 750);
    assert_eq!(job["repeat"], "");
    assert_eq!(job["nextRun"], "2020-05-06 07:08:09");
    assert_eq!(job["lastRun"], "", "never run before this hand-out");
    assert_eq!(job["created"], created);
    assert_eq!(job["retryAfter"], "");
    assert!(job["lease"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(job["attempt"], 1);
    for absent in [
        "parentJobID",
        "parentData",
        "finishedChildJobs",
        "cancelledChildJobs",
    ] {
        assert!(job.get(absent).is_none(), "{absent} on a plain job: {job}");
    }

    // The job itself is now RUNNING with lastRun set.
    let stored = api.job(id);
    assert_eq!(stored["state"], "RUNNING");
    assert_eq!(stored["attempts"], 1);
    assert_offset(time(&stored["lastRun"]), before, after, TimeDelta::zero());

    // The next hand-out reports the previous lastRun.
    ok(retry(&api, id, json!({})));
    let again = api.take("shape");
    assert_eq!(again["lastRun"], stored["lastRun"]);
    assert_eq!(again["attempt"], 2);
}

#[test]
fn dequeue_with_nothing_due_answers_an_empty_list() {
    let (_server, api) = setup();
    assert!(api.dequeue(json!({"name": "*"})).is_empty());
    api.create(json!({"name": "other"}));
    assert!(api.dequeue(json!({"name": "wanted"})).is_empty());
    assert_eq!(api.take("other")["name"], "other");
}

#[test]
fn dequeue_without_a_name_is_refused() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "x"}));
    assert_refused(
        api.post("/dequeue", json!({})),
        400,
        "missing_name",
        "Missing name",
    );
    assert_refused(
        api.post("/dequeue", json!({"name": ""})),
        400,
        "missing_name",
        "Missing name",
    );
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
}

// ---------------------------------------------------------------------------
// QueryJob and job ids

#[test]
fn query_job_of_an_unknown_id_is_no_such_job() {
    let (_server, api) = setup();
    assert_refused(
        api.get("/jobs/424242"),
        404,
        "no_such_job",
        "No job with this jobID",
    );
    assert_refused(
        api.get("/jobs/9223372036854775807"),
        404,
        "no_such_job",
        "No job with this jobID",
    );
    let id = api.create(json!({"name": "gone"}));
    assert_eq!(api.job(id)["jobID"], id);
    ok(delete(&api, id));
    assert_refused(
        api.get(&format!("/jobs/{id}")),
        404,
        "no_such_job",
        "No job with this jobID",
    );
}

#[test]
fn job_ids_in_paths_must_be_exact_positive_int64() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "target"}));
    let bad_ids = [
        "abc".to_string(),
        "0".to_string(),
        "-1".to_string(),
        "1.5".to_string(),
        "9223372036854775808".to_string(),
        format!("0{id}"),
        format!("+{id}"),
        format!("{id}.0"),
        format!("{id}abc"),
    ];
    for bad in &bad_ids {
        let answers = [
            ("GET", api.get(&format!("/jobs/{bad}"))),
            ("PATCH", update_raw(&api, bad)),
            ("DELETE", api.delete(&format!("/jobs/{bad}"))),
            (
                "finish",
                api.post(&format!("/jobs/{bad}/finish"), json!({})),
            ),
            ("retry", api.post(&format!("/jobs/{bad}/retry"), json!({}))),
            ("fail", api.post(&format!("/jobs/{bad}/fail"), json!({}))),
            (
                "cancel",
                api.post(&format!("/jobs/{bad}/cancel"), json!({})),
            ),
        ];
        for (what, (status, answer)) in answers {
            assert_eq!(
                (status, answer["code"].as_str(), answer["message"].as_str()),
                (400, Some("malformed_job_id"), Some("Malformed jobID")),
                "{what} /jobs/{bad} answered {answer}"
            );
        }
    }
    // Nothing touched the real job.
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["data"], json!({}));
}

fn update_raw(api: &Api, id: &str) -> (u16, Value) {
    api.patch(&format!("/jobs/{id}"), json!({"data": {"changed": true}}))
}

// ---------------------------------------------------------------------------
// UpdateJob

#[test]
fn update_job_replaces_the_data() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "upd", "data": {"a": 1, "b": {"c": 2}}, "priority": 250}));
    ok(update(&api, id, json!({"data": {"d": 3}})));
    let job = api.job(id);
    assert_eq!(job["data"], json!({"d": 3}), "replaced, not merged");
    assert_eq!(job["priority"], 250);
    assert_eq!(job["repeat"], "");
    assert_eq!(job["state"], "QUEUED");
}

#[test]
fn update_job_explicit_next_run_wins_over_a_new_repeat() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "upd"}));
    ok(update(
        &api,
        id,
        json!({"data": {}, "repeat": "FINISHED, +1 HOUR", "nextRun": "2030-01-02 03:04:05"}),
    ));
    let job = api.job(id);
    assert_eq!(job["nextRun"], "2030-01-02 03:04:05");
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR");
}

#[test]
fn update_job_new_repeat_recomputes_next_run() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "upd"}));
    let before = now();
    ok(update(
        &api,
        id,
        json!({"data": {}, "repeat": "finished, +2 hours"}),
    ));
    let after = now();
    let job = api.job(id);
    assert_eq!(job["repeat"], "FINISHED, +2 HOURS");
    assert_offset(time(&job["nextRun"]), before, after, TimeDelta::hours(2));
    assert!(
        api.dequeue(json!({"name": "upd"})).is_empty(),
        "no longer due"
    );
}

#[test]
fn update_job_clear_repeat_removes_the_repeat() {
    let (_server, api) = setup();
    let cleared = api.create(json!({"name": "cleared", "repeat": "HOURLY"}));
    let kept = api.create(json!({"name": "kept", "repeat": "HOURLY"}));
    ok(update(
        &api,
        cleared,
        json!({"data": {"x": 1}, "clearRepeat": true}),
    ));
    ok(update(
        &api,
        kept,
        json!({"data": {"x": 1}, "clearRepeat": false}),
    ));
    assert_eq!(api.job(cleared)["repeat"], "");
    assert_eq!(api.job(cleared)["data"], json!({"x": 1}));
    assert_eq!(api.job(kept)["repeat"], "HOURLY");

    // A cleared job no longer repeats: finishing it deletes it.
    api.take("cleared");
    ok(finish(&api, cleared, json!({})));
    assert_eq!(api.state(cleared), None);
    api.take("kept");
    ok(finish(&api, kept, json!({})));
    assert_eq!(api.state(kept).as_deref(), Some("QUEUED"));
}

#[test]
fn update_job_changes_the_priority() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "upd"}));
    ok(update(&api, id, json!({"data": {}, "priority": 1000})));
    assert_eq!(api.job(id)["priority"], 1000);
    ok(update(&api, id, json!({"data": {}, "jobPriority": 0})));
    assert_eq!(api.job(id)["priority"], 0);
    assert_refused(
        update(&api, id, json!({"data": {"lost": true}, "priority": 42})),
        400,
        "invalid_priority",
        "Invalid priority value",
    );
    let job = api.job(id);
    assert_eq!(job["priority"], 0);
    assert_eq!(job["data"], json!({}), "a refused update changes nothing");
}

#[test]
fn update_job_is_allowed_in_any_state() {
    let (_server, api) = setup();
    let running = start_job(&api, json!({"name": "run"}));
    ok(update(&api, running, json!({"data": {"progress": 50}})));
    let job = api.job(running);
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["data"], json!({"progress": 50}));

    let failed = start_job(&api, json!({"name": "dead"}));
    ok(fail(&api, failed, json!({})));
    ok(update(&api, failed, json!({"data": {"note": "seen"}})));
    let job = api.job(failed);
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["data"], json!({"note": "seen"}));
}

#[test]
fn update_job_refuses_bad_parameters_and_changes_nothing() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "upd", "data": {"keep": true}}));
    let next_run = api.job(id)["nextRun"].clone();
    assert_refused(
        update(&api, id, json!({})),
        400,
        "missing_data",
        "Missing data",
    );
    assert_refused(
        update(&api, id, json!({"repeat": "HOURLY"})),
        400,
        "missing_data",
        "Missing data",
    );
    assert_refused(
        update(&api, id, json!({"data": [1]})),
        400,
        "data_not_object",
        "Data is not a valid JSON Object",
    );
    assert_refused(
        update(&api, id, json!({"data": {}, "repeat": "EVERY TUESDAY"})),
        400,
        "malformed_repeat",
        "Malformed repeat",
    );
    assert_refused(
        update(&api, id, json!({"data": {}, "nextRun": "soon"})),
        400,
        "malformed_next_run",
        "Malformed nextRun",
    );
    assert_refused(
        update(&api, 424242, json!({"data": {}})),
        404,
        "no_such_job",
        "No job with this jobID",
    );
    let job = api.job(id);
    assert_eq!(job["data"], json!({"keep": true}));
    assert_eq!(job["repeat"], "");
    assert_eq!(job["nextRun"], next_run);
}

// ---------------------------------------------------------------------------
// FinishJob

#[test]
fn finish_job_deletes_a_non_repeating_job() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "once"}));
    ok(finish(&api, id, json!({})));
    assert_eq!(api.state(id), None);
    assert_refused(
        finish(&api, id, json!({})),
        404,
        "no_such_job",
        "No job with this jobID",
    );
    assert!(api.dequeue(json!({"name": "*"})).is_empty());
}

#[test]
fn finish_job_requeues_a_repeating_job_with_its_new_data() {
    let (_server, api) = setup();
    let id = start_job(
        &api,
        json!({"name": "rep", "repeat": "FINISHED, +1 HOUR", "data": {"n": 1}}),
    );
    let before = now();
    ok(finish(&api, id, json!({"data": {"n": 2}})));
    let after = now();
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["data"], json!({"n": 2}));
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR");
    assert_offset(time(&job["nextRun"]), before, after, TimeDelta::hours(1));
    assert!(
        api.dequeue(json!({"name": "rep"})).is_empty(),
        "not due yet"
    );

    // Without data, the data stays as it was.
    let other = start_job(
        &api,
        json!({"name": "rep2", "repeat": "FINISHED, +1 HOUR", "data": {"n": 7}}),
    );
    ok(finish(&api, other, json!({})));
    assert_eq!(api.job(other)["data"], json!({"n": 7}));
}

#[test]
fn finish_job_with_data_delete_true_ends_a_repeating_job() {
    let (_server, api) = setup();
    let ended = start_job(
        &api,
        json!({"name": "rep-a", "repeat": "FINISHED, +1 HOUR"}),
    );
    ok(finish(&api, ended, json!({"data": {"delete": true}})));
    assert_eq!(api.state(ended), None);

    let kept = start_job(
        &api,
        json!({"name": "rep-b", "repeat": "FINISHED, +1 HOUR"}),
    );
    ok(finish(&api, kept, json!({"data": {"delete": false}})));
    assert_eq!(api.state(kept).as_deref(), Some("QUEUED"));
    assert_eq!(api.job(kept)["data"], json!({"delete": false}));
}

#[test]
fn finish_job_on_a_job_that_is_not_held_is_refused() {
    let (_server, api) = setup();
    let queued = api.create(json!({"name": "q"}));
    assert_refused(
        finish(&api, queued, json!({})),
        409,
        "not_held_for_finish",
        "Can only retry/finish RUNNING and RUNQUEUED jobs",
    );
    assert_eq!(api.state(queued).as_deref(), Some("QUEUED"));

    let failed = start_job(&api, json!({"name": "f"}));
    ok(fail(&api, failed, json!({})));
    assert_refused(
        finish(&api, failed, json!({})),
        409,
        "not_held_for_finish",
        "Can only retry/finish RUNNING and RUNQUEUED jobs",
    );
    assert_eq!(api.state(failed).as_deref(), Some("FAILED"));

    assert_refused(
        finish(&api, 424242, json!({})),
        404,
        "no_such_job",
        "No job with this jobID",
    );

    let running = start_job(&api, json!({"name": "r"}));
    assert_refused(
        finish(&api, running, json!({"data": [1]})),
        400,
        "data_not_object",
        "Data is not a valid JSON Object",
    );
    assert_eq!(api.state(running).as_deref(), Some("RUNNING"));
}

// ---------------------------------------------------------------------------
// RetryJob

#[test]
fn retry_job_with_a_delay_requeues_it_that_much_later() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r"}));
    let before = now();
    ok(retry(&api, id, json!({"delay": 3600})));
    let after = now();
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_offset(time(&job["nextRun"]), before, after, TimeDelta::hours(1));
    assert!(api.dequeue(json!({"name": "r"})).is_empty(), "not due yet");
}

#[test]
fn retry_job_without_a_delay_is_due_again_at_once() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r", "data": {"x": 1}}));
    ok(retry(&api, id, json!({})));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
    let again = api.take("r");
    assert_eq!(again["jobID"], id);
    assert_eq!(again["attempt"], 2);
    assert_eq!(
        again["data"],
        json!({"x": 1}),
        "data kept when none is given"
    );
}

#[test]
fn retry_job_at_an_explicit_next_run() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r"}));
    // nextRun wins over delay.
    ok(retry(
        &api,
        id,
        json!({"nextRun": "2031-02-03 04:05:06", "delay": 5}),
    ));
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["nextRun"], "2031-02-03 04:05:06");
}

#[test]
fn retry_job_with_a_new_name_moves_it_to_another_queue() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "old-queue"}));
    assert_refused(
        retry(&api, id, json!({"name": ""})),
        400,
        "missing_name",
        "Missing name",
    );
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));

    ok(retry(&api, id, json!({"name": "new-queue"})));
    assert_eq!(api.job(id)["name"], "new-queue");
    assert!(api.dequeue(json!({"name": "old-queue"})).is_empty());
    assert_eq!(api.take("new-queue")["jobID"], id);
}

#[test]
fn retry_job_changes_priority_and_data() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r", "data": {"try": 1}}));
    ok(retry(
        &api,
        id,
        json!({"priority": 1000, "data": {"try": 2}}),
    ));
    let job = api.job(id);
    assert_eq!(job["priority"], 1000);
    assert_eq!(job["data"], json!({"try": 2}));

    api.take("r");
    assert_refused(
        retry(&api, id, json!({"priority": 7, "data": {"try": 3}})),
        400,
        "invalid_priority",
        "Invalid priority value",
    );
    let job = api.job(id);
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["priority"], 1000);
    assert_eq!(job["data"], json!({"try": 2}));
}

#[test]
fn retry_job_of_a_repeating_job_follows_the_repeat_unless_ignore_repeat() {
    let (_server, api) = setup();
    let follows = start_job(&api, json!({"name": "rr-a", "repeat": "FINISHED, +1 HOUR"}));
    let before = now();
    ok(retry(
        &api,
        follows,
        json!({"nextRun": "2031-02-03 04:05:06"}),
    ));
    let after = now();
    assert_offset(
        time(&api.job(follows)["nextRun"]),
        before,
        after,
        TimeDelta::hours(1),
    );

    let ignores = start_job(&api, json!({"name": "rr-b", "repeat": "FINISHED, +1 HOUR"}));
    ok(retry(
        &api,
        ignores,
        json!({"nextRun": "2031-02-03 04:05:06", "ignoreRepeat": true}),
    ));
    let job = api.job(ignores);
    assert_eq!(job["nextRun"], "2031-02-03 04:05:06");
    assert_eq!(job["repeat"], "FINISHED, +1 HOUR", "the repeat stays");

    let delayed = start_job(&api, json!({"name": "rr-c", "repeat": "FINISHED, +1 HOUR"}));
    let before = now();
    ok(retry(
        &api,
        delayed,
        json!({"delay": 60, "ignoreRepeat": true}),
    ));
    let after = now();
    assert_offset(
        time(&api.job(delayed)["nextRun"]),
        before,
        after,
        TimeDelta::seconds(60),
    );
}

#[test]
fn retry_job_with_a_negative_delay_is_refused() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r"}));
    assert_refused(
        retry(&api, id, json!({"delay": -1})),
        400,
        "negative_delay",
        "Must specify a non-negative delay when retrying",
    );
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    ok(retry(&api, id, json!({"delay": 0})));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
}

#[test]
fn retry_job_on_a_job_that_is_not_held_is_refused() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "q"}));
    assert_refused(
        retry(&api, id, json!({"delay": 10})),
        409,
        "not_held_for_finish",
        "Can only retry/finish RUNNING and RUNQUEUED jobs",
    );
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED");
    assert_refused(
        retry(&api, 424242, json!({})),
        404,
        "no_such_job",
        "No job with this jobID",
    );
}

// ---------------------------------------------------------------------------
// FailJob

#[test]
fn fail_job_marks_a_running_job_failed_and_keeps_it() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "f", "data": {"a": 1}}));
    ok(fail(&api, id, json!({"data": {"error": "boom"}})));
    let job = api.job(id);
    assert_eq!(job["state"], "FAILED");
    assert_eq!(job["data"], json!({"error": "boom"}));
    assert!(
        api.dequeue(json!({"name": "f"})).is_empty(),
        "failed jobs are not handed out"
    );
    assert_eq!(
        api.state(id).as_deref(),
        Some("FAILED"),
        "kept until deleted"
    );

    let plain = start_job(&api, json!({"name": "g", "data": {"a": 1}}));
    ok(fail(&api, plain, json!({})));
    assert_eq!(api.job(plain)["data"], json!({"a": 1}));
}

#[test]
fn fail_job_on_a_job_that_is_not_held_is_refused() {
    let (_server, api) = setup();
    let queued = api.create(json!({"name": "q"}));
    assert_refused(
        fail(&api, queued, json!({})),
        409,
        "not_held_for_fail",
        "Can only fail RUNNING or RUNQUEUED jobs",
    );
    assert_eq!(api.state(queued).as_deref(), Some("QUEUED"));

    let failed = start_job(&api, json!({"name": "f"}));
    ok(fail(&api, failed, json!({"data": {"first": true}})));
    assert_refused(
        fail(&api, failed, json!({"data": {"second": true}})),
        409,
        "not_held_for_fail",
        "Can only fail RUNNING or RUNQUEUED jobs",
    );
    assert_eq!(api.job(failed)["data"], json!({"first": true}));
    assert_refused(
        fail(&api, 424242, json!({})),
        404,
        "no_such_job",
        "No job with this jobID",
    );
}

// ---------------------------------------------------------------------------
// DeleteJob

#[test]
fn delete_job_removes_a_queued_or_failed_job() {
    let (_server, api) = setup();
    let queued = api.create(json!({"name": "q"}));
    ok(delete(&api, queued));
    assert_eq!(api.state(queued), None);
    assert!(api.dequeue(json!({"name": "q"})).is_empty());
    assert_refused(
        delete(&api, queued),
        404,
        "no_such_job",
        "No job with this jobID",
    );

    let failed = start_job(&api, json!({"name": "f"}));
    ok(fail(&api, failed, json!({})));
    ok(delete(&api, failed));
    assert_eq!(api.state(failed), None);
}

#[test]
fn delete_job_refuses_a_running_job() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "r"}));
    assert_refused(
        delete(&api, id),
        409,
        "delete_running",
        "Can't delete a RUNNING job",
    );
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    ok(finish(&api, id, json!({})));
    assert_eq!(api.state(id), None);
}

// ---------------------------------------------------------------------------
// CancelJob (the parent/child cases are in children.rs)

#[test]
fn cancel_job_of_an_unknown_job_is_no_such_job() {
    let (_server, api) = setup();
    assert_refused(
        cancel(&api, 424242),
        404,
        "no_such_job",
        "No job with this jobID",
    );
}

// ---------------------------------------------------------------------------
// RequeueJobs

#[test]
fn requeue_jobs_puts_jobs_back_queued_and_due_at_creation() {
    let (_server, api) = setup();
    let failed = start_job(&api, json!({"name": "rq-failed"}));
    ok(fail(&api, failed, json!({})));
    let running = start_job(&api, json!({"name": "rq-running"}));
    let future = api.create(json!({"name": "rq-future", "firstRun": "2099-01-01 00:00:00"}));

    // A running job is held by its worker: the whole request is refused.
    let refused = requeue(&api, json!({"jobIDs": [failed, running, future]}));
    assert_error(refused.clone(), 409, "requeue_held");
    let message = refused.1["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("Cannot requeue job {running}: a worker holds it")),
        "{message}"
    );
    assert_eq!(api.state(failed).as_deref(), Some("FAILED"));
    assert_eq!(api.state(running).as_deref(), Some("RUNNING"));

    let answer = ok(requeue(&api, json!({"jobIDs": [failed, future, 424242]})));
    assert_eq!(answer["requeued"], 2, "the missing id is not counted");
    for id in [failed, future] {
        let job = api.job(id);
        assert_eq!(job["state"], "QUEUED", "job {id}");
        assert_eq!(job["nextRun"], job["created"], "job {id}");
    }
    let handed = api.dequeue(json!({"name": "rq-*", "numResults": 10}));
    let mut got = ids(&handed);
    got.sort();
    assert_eq!(got, vec![failed, future]);
}

#[test]
fn requeue_jobs_with_a_name_renames_them() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "before"}));
    ok(fail(&api, id, json!({})));
    ok(requeue(&api, json!({"jobIDs": [id], "name": "after"})));
    assert_eq!(api.job(id)["name"], "after");
    assert!(api.dequeue(json!({"name": "before"})).is_empty());
    assert_eq!(api.take("after")["jobID"], id);
}

#[test]
fn requeue_jobs_without_ids_is_refused() {
    let (_server, api) = setup();
    let id = start_job(&api, json!({"name": "f"}));
    ok(fail(&api, id, json!({})));
    assert_refused(
        requeue(&api, json!({})),
        400,
        "missing_job_ids",
        "Missing jobIDs",
    );
    assert_refused(
        requeue(&api, json!({"jobIDs": []})),
        400,
        "missing_job_ids",
        "Missing jobIDs",
    );
    assert_refused(
        requeue(&api, json!({"jobIDs": [id, 0]})),
        400,
        "malformed_job_ids",
        "Malformed jobIDs",
    );
    assert_refused(
        requeue(&api, json!({"jobIDs": [id], "name": ""})),
        400,
        "missing_name",
        "Missing name",
    );
    assert_eq!(api.state(id).as_deref(), Some("FAILED"));
    assert_eq!(api.job(id)["name"], "f");
}

// ---------------------------------------------------------------------------
// State transitions of jobs without children

#[test]
fn job_walks_queued_running_queued_running_failed_queued_running_deleted() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "walk"}));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
    api.take("walk");
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    ok(retry(&api, id, json!({})));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
    api.take("walk");
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    ok(fail(&api, id, json!({})));
    assert_eq!(api.state(id).as_deref(), Some("FAILED"));
    ok(requeue(&api, json!({"jobIDs": [id]})));
    assert_eq!(api.state(id).as_deref(), Some("QUEUED"));
    api.take("walk");
    assert_eq!(api.state(id).as_deref(), Some("RUNNING"));
    ok(finish(&api, id, json!({})));
    assert_eq!(api.state(id), None);
}

#[test]
fn hand_out_of_a_retry_after_job_makes_it_runqueued() {
    let (_server, api) = setup();
    let id = api.create(json!({"name": "ra", "retryAfter": "+1 HOUR", "data": {"k": 1}}));
    let before = now();
    let handed = api.take("ra");
    let after = now();
    assert_eq!(handed["retryAfter"], "+1 HOUR");
    assert_eq!(
        handed["data"],
        json!({"k": 1}),
        "the answer is the job before"
    );

    let job = api.job(id);
    assert_eq!(job["state"], "RUNQUEUED");
    assert_offset(time(&job["nextRun"]), before, after, TimeDelta::hours(1));
    assert_offset(time(&job["lastRun"]), before, after, TimeDelta::zero());
    assert_eq!(job["data"], json!({"k": 1, "retryAfterCount": 1}));
    assert!(
        api.dequeue(json!({"name": "ra"})).is_empty(),
        "not handed out again before its retryAfter"
    );
}

#[test]
fn runqueued_job_can_be_finished_failed_or_retried() {
    let (_server, api) = setup();
    let finished = start_job(&api, json!({"name": "ra-a", "retryAfter": "+1 HOUR"}));
    let failed = start_job(&api, json!({"name": "ra-b", "retryAfter": "+1 HOUR"}));
    let retried = start_job(&api, json!({"name": "ra-c", "retryAfter": "+1 HOUR"}));
    for id in [finished, failed, retried] {
        assert_eq!(api.state(id).as_deref(), Some("RUNQUEUED"));
    }
    ok(finish(&api, finished, json!({})));
    assert_eq!(api.state(finished), None);
    ok(fail(&api, failed, json!({})));
    assert_eq!(api.state(failed).as_deref(), Some("FAILED"));
    ok(retry(&api, retried, json!({})));
    assert_eq!(api.state(retried).as_deref(), Some("QUEUED"));
    assert_eq!(api.take("ra-c")["jobID"], retried);
    assert_eq!(api.state(retried).as_deref(), Some("RUNQUEUED"));
}

// ---------------------------------------------------------------------------
// unique / overwrite

#[test]
fn unique_create_with_the_same_data_returns_the_same_job_unchanged() {
    let (_server, api) = setup();
    let first = api.create(json!({"name": "u", "unique": true, "data": {"a": 1}}));
    api.take("u");
    let before = api.job(first);

    let again =
        api.create(json!({"name": "u", "unique": true, "data": {"a": 1}, "priority": 1000}));
    assert_eq!(again, first);
    let after = api.job(first);
    assert_eq!(after["data"], json!({"a": 1}));
    assert_eq!(after["state"], "RUNNING", "the held job is left alone");
    assert_eq!(after["priority"], 500);
    assert_eq!(after["nextRun"], before["nextRun"]);
    assert_eq!(count_named(&api, "u"), 1);
}

#[test]
fn unique_create_with_different_data_merges_it_as_a_json_merge_patch() {
    let (_server, api) = setup();
    let first = api.create(json!({
        "name": "u",
        "unique": true,
        "data": {"keep": 1, "nested": {"x": 1, "y": 2}, "drop": "me", "list": [1, 2]},
    }));
    let again = api.create(json!({
        "name": "u",
        "unique": true,
        "data": {"add": 2, "nested": {"y": 3, "z": 4}, "drop": null, "list": [3]},
    }));
    assert_eq!(again, first);
    assert_eq!(
        api.job(first)["data"],
        json!({"keep": 1, "add": 2, "nested": {"x": 1, "y": 3, "z": 4}, "list": [3]})
    );

    // null removes a nested key too; overwrite: true is the default spelled out.
    let third = api.create(json!({
        "name": "u",
        "unique": true,
        "overwrite": true,
        "data": {"nested": {"x": null}},
    }));
    assert_eq!(third, first);
    assert_eq!(
        api.job(first)["data"],
        json!({"keep": 1, "add": 2, "nested": {"y": 3, "z": 4}, "list": [3]})
    );
    assert_eq!(count_named(&api, "u"), 1);
}

#[test]
fn unique_create_with_overwrite_false_leaves_the_data_alone() {
    let (_server, api) = setup();
    let first = api.create(json!({"name": "u", "unique": true, "data": {"a": 1}}));
    let again = api.create(json!({
        "name": "u",
        "unique": true,
        "overwrite": false,
        "data": {"a": 2, "b": 3},
    }));
    assert_eq!(again, first);
    assert_eq!(api.job(first)["data"], json!({"a": 1}));
    assert_eq!(count_named(&api, "u"), 1);
}

#[test]
fn unique_create_never_makes_a_second_row() {
    let (_server, api) = setup();
    let first = api.create(json!({"name": "u", "unique": true, "data": {"v": 0}}));
    for v in 1..5 {
        let again = api.create(json!({"name": "u", "unique": true, "data": {"v": v}}));
        assert_eq!(again, first);
    }
    let answer = ok(api.post(
        "/jobs/batch",
        json!({"jobs": [
            {"name": "u", "unique": true, "data": {"v": 9}},
            {"name": "u2", "unique": true},
            {"name": "u2", "unique": true, "data": {"w": 1}},
        ]}),
    ));
    let batch = &answer["jobIDs"];
    assert_eq!(batch[0], first);
    assert_eq!(
        batch[1], batch[2],
        "the second u2 in a batch finds the first"
    );
    assert_eq!(count_named(&api, "u"), 1);
    assert_eq!(count_named(&api, "u2"), 1);
    assert_eq!(api.job(first)["data"], json!({"v": 9}));

    // Without `unique`, the same name makes another job.
    let other = api.create(json!({"name": "u"}));
    assert_ne!(other, first);
    assert_eq!(count_named(&api, "u"), 2);
}
