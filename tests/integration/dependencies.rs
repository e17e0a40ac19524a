//! Dependencies between jobs (issue 23): a job created with `depends` (or
//! given dependencies later) waits in DEPENDS and is handed out only once
//! every job it depends on has finished. Chains and diamonds run in order
//! on a real supervisor with real workers, whose own records show it; a
//! failed dependency leaves its dependent waiting and QueryJob says why;
//! dependencies are added and dropped later over HTTP, Bedrock and the
//! CLI; hostile requests change nothing on either port; and a randomized
//! stress test with concurrent takers counts violations. All on both
//! stores.

use crate::common::bedrock_conn::Conn;
use crate::common::*;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Helpers

/// A Bedrock request with the fixtures' token.
fn req(method: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{method}\r\nToken: {}\r\n", token());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Asserts a 200 answer and returns its body.
#[track_caller]
fn ok(answer: (u16, Value)) -> Value {
    assert_eq!(answer.0, 200, "expected success, got {}", answer.1);
    answer.1
}

/// The state of a job that must exist.
#[track_caller]
fn state(api: &Api, id: i64) -> String {
    api.state(id).unwrap_or_else(|| panic!("job {id} is gone"))
}

/// `[(jobID, state)]` of a QueryJob answer's `dependencies`.
fn dependencies(job: &Value) -> Vec<(i64, String)> {
    job["dependencies"]
        .as_array()
        .unwrap_or_else(|| panic!("no dependencies in {job}"))
        .iter()
        .map(|d| {
            (
                d["jobID"].as_i64().expect("jobID"),
                d["state"].as_str().expect("state").to_string(),
            )
        })
        .collect()
}

/// The ids of a QueryJob answer's `dependents`.
fn dependents(job: &Value) -> Vec<i64> {
    job["dependents"]
        .as_array()
        .unwrap_or_else(|| panic!("no dependents in {job}"))
        .iter()
        .map(|d| d.as_i64().expect("id"))
        .collect()
}

/// How many jobs the queue holds.
fn job_count(api: &Api) -> usize {
    let (status, answer) = api.get("/jobs?limit=1000");
    assert_eq!(status, 200, "{answer}");
    answer["jobs"].as_array().expect("jobs").len()
}

/// A worker that records, in `log`, when it started and ended
/// (`start NAME NANOS`, `end NAME NANOS`), taking `secs` in between.
fn recording_worker(log: &std::path::Path, secs: &str) -> String {
    let log = log.display();
    sh(&format!(
        r#"cat > /dev/null
echo "start $JOBMGR_JOB_NAME $(date +%s%N)" >> '{log}'
sleep {secs}
echo "end $JOBMGR_JOB_NAME $(date +%s%N)" >> '{log}'
exit 0"#
    ))
}

/// The workers' records: `(start, end)` in nanoseconds by job name.
fn records(log: &std::path::Path) -> BTreeMap<String, (u128, u128)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut starts = HashMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [what, name, at] = parts[..] else {
            panic!("a record line that is not `what name time`: {line:?}")
        };
        let at: u128 = at.parse().expect("time");
        match what {
            "start" => {
                assert!(
                    starts.insert(name.to_string(), at).is_none(),
                    "{name} started twice:\n{text}"
                );
            }
            "end" => {
                let start = starts[name];
                out.insert(name.to_string(), (start, at));
            }
            other => panic!("unknown record {other:?}"),
        }
    }
    out
}

/// Runs jobs named `Step*` on a real supervisor (up to 4 at once), each
/// depending on the earlier ones given, created before the supervisor
/// starts; returns the workers' records once all ran.
fn run_graph(graph: &[(&str, &[&str])]) -> BTreeMap<String, (u128, u128)> {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().unwrap();
    let log = out.path().join("log");
    let mut ids: HashMap<&str, i64> = HashMap::new();
    for (name, on) in graph {
        let depends: Vec<i64> = on.iter().map(|d| ids[d]).collect();
        let id = api.create(json!({"name": name, "depends": depends}));
        let expected = if on.is_empty() { "QUEUED" } else { "DEPENDS" };
        assert_eq!(state(&api, id), expected, "{name}");
        ids.insert(name, id);
    }
    // Each dependency lists its dependents, and each dependent what it
    // waits for, with their states.
    for (name, on) in graph {
        let job = api.job(ids[name]);
        let waits: Vec<(i64, String)> = on.iter().map(|d| (ids[d], state(&api, ids[d]))).collect();
        let mut waits = waits;
        waits.sort();
        assert_eq!(dependencies(&job), waits, "{name}: {job}");
        let mut waiting: Vec<i64> = graph
            .iter()
            .filter(|(_, deps)| deps.contains(name))
            .map(|(n, _)| ids[n])
            .collect();
        waiting.sort();
        assert_eq!(dependents(&job), waiting, "{name}: {job}");
    }
    let mut builder = Supervisor::builder(&server.url)
        .arg("--max-workers")
        .arg("4");
    for (name, _) in graph {
        builder = builder.worker(name, &recording_worker(&log, "0.3"));
    }
    let sup = builder.start();
    for (name, _) in graph {
        let id = ids[name];
        wait_for(&format!("{name} ({id}) to run and go"), &sup, || {
            api.state(id).is_none().then_some(())
        });
    }
    let records = records(&log);
    assert_eq!(records.len(), graph.len(), "{records:?}");
    for (name, on) in graph {
        for dependency in *on {
            let (start, _) = records[*name];
            let (_, end) = records[*dependency];
            assert!(
                start >= end,
                "{name} started {} ms before its dependency {dependency} ended: {records:?}",
                (end - start) / 1_000_000
            );
        }
    }
    records
}

// ---------------------------------------------------------------------------
// Order on a real supervisor

#[test]
fn a_chain_runs_in_order_on_a_real_supervisor() {
    run_graph(&[("StepA", &[]), ("StepB", &["StepA"]), ("StepC", &["StepB"])]);
}

#[test]
fn a_diamond_runs_in_order_and_its_middle_runs_side_by_side() {
    let records = run_graph(&[
        ("StepA", &[]),
        ("StepB", &["StepA"]),
        ("StepC", &["StepA"]),
        ("StepD", &["StepB", "StepC"]),
    ]);
    // B and C wait for A only: with four workers they overlap.
    let (b, c) = (records["StepB"], records["StepC"]);
    assert!(
        b.0 < c.1 && c.0 < b.1,
        "B and C did not run side by side: {records:?}"
    );
}

// ---------------------------------------------------------------------------
// What finishes a dependency, and what does not

#[test]
fn a_failed_dependency_leaves_its_dependent_waiting_and_query_job_says_why() {
    let server = Server::start();
    let api = server.api();
    let a = api.create(json!({"name": "a"}));
    let c = api.create(json!({"name": "c"}));
    let b = api.create(json!({"name": "b", "depends": [a]}));
    let job = api.take("a");
    ok(api.post(&format!("/jobs/{a}/fail"), json!({"lease": job["lease"]})));
    assert_eq!(state(&api, b), "DEPENDS");
    assert!(api.dequeue(json!({"name": "b"})).is_empty());
    let queried = api.job(b);
    assert_eq!(dependencies(&queried), [(a, "FAILED".to_string())]);
    assert_eq!(dependents(&api.job(a)), [b]);
    // The Bedrock port shows the same.
    let mut conn = Conn::open(&server.bedrock);
    let bedrock = conn
        .call(&req("QueryJob", &[("jobID", &b.to_string())]))
        .json();
    assert_eq!(bedrock["state"], "DEPENDS");
    assert_eq!(
        bedrock["dependencies"],
        json!([{"jobID": a, "state": "FAILED"}])
    );
    assert_eq!(bedrock["dependents"], json!([]));
    // The listing filters by the state.
    let (_, listed) = api.get("/jobs?state=DEPENDS");
    assert_eq!(listed["jobs"][0]["jobID"], b, "{listed}");

    // Deleted, it shows as it ended (the archive says FAILED); a job
    // deleted before it ran shows as gone.
    ok(api.delete(&format!("/jobs/{a}")));
    assert_eq!(dependencies(&api.job(b)), [(a, "FAILED".to_string())]);
    ok(api.post(&format!("/jobs/{b}/depends"), json!({"add": [c]})));
    ok(api.delete(&format!("/jobs/{c}")));
    assert_eq!(
        dependencies(&api.job(b)),
        [(a, "FAILED".to_string()), (c, "gone".to_string())]
    );
    assert_eq!(state(&api, b), "DEPENDS");

    // Dropping them lets it run; a job that depends on a deleted job that
    // never finished cannot be created.
    let answer = ok(api.post(&format!("/jobs/{b}/depends"), json!({"remove": [a, c]})));
    assert_eq!(answer["state"], "QUEUED", "{answer}");
    assert_eq!(answer["dependencies"], json!([]));
    assert_eq!(api.take("b")["jobID"], b);
    let refused = api.post("/jobs", json!({"name": "d", "depends": [a]}));
    assert_error(refused.clone(), 404, "dependency_ended");
    assert!(
        refused.1["message"]
            .as_str()
            .unwrap()
            .contains(&a.to_string()),
        "{}",
        refused.1
    );
}

#[test]
fn a_finished_dependency_counts_and_a_waiting_request_is_woken() {
    let server = Server::start();
    let api = server.api();
    // Finished and archived before the dependent is created: satisfied.
    let done = api.create(json!({"name": "done"}));
    let job = api.take("done");
    ok(api.post(
        &format!("/jobs/{done}/finish"),
        json!({"lease": job["lease"]}),
    ));
    let now = api.create(json!({"name": "now", "depends": [done]}));
    assert_eq!(state(&api, now), "QUEUED");
    assert_eq!(api.take("now")["jobID"], now);

    // A dequeue held for the dependent is answered when the dependency
    // finishes.
    let a = api.create(json!({"name": "first"}));
    let b = api.create(json!({"name": "second", "depends": [a]}));
    let holder = api.clone();
    let held = std::thread::spawn(move || {
        let started = Instant::now();
        let jobs = holder.dequeue(json!({"name": "second", "waitMs": 20000}));
        (jobs, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let job = api.take("first");
    ok(api.post(&format!("/jobs/{a}/finish"), json!({"lease": job["lease"]})));
    let (jobs, waited) = held.join().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], b);
    assert!(
        waited < Duration::from_secs(15),
        "woken only after {waited:?}"
    );
}

#[test]
fn a_repeating_dependency_releases_at_the_end_of_its_run_a_pausing_parent_does_not() {
    let server = Server::start();
    let api = server.api();
    let repeating = api.create(json!({"name": "rep", "repeat": "FINISHED, +1 HOUR"}));
    let waiting = api.create(json!({"name": "after-rep", "depends": [repeating]}));
    let job = api.take("rep");
    ok(api.post(
        &format!("/jobs/{repeating}/finish"),
        json!({"lease": job["lease"]}),
    ));
    assert_eq!(state(&api, repeating), "QUEUED");
    assert_eq!(state(&api, waiting), "QUEUED");

    // A parent's finish that waits for its children is not the end of its
    // run; its finish after they are done is.
    let parent = api.create(json!({"name": "parent"}));
    let after = api.create(json!({"name": "after-parent", "depends": [parent]}));
    let job = api.take("parent");
    let child = api.create(json!({"name": "child", "parentJobID": parent}));
    ok(api.post(
        &format!("/jobs/{parent}/finish"),
        json!({"lease": job["lease"]}),
    ));
    assert_eq!(state(&api, parent), "PAUSED");
    assert_eq!(state(&api, after), "DEPENDS");
    let job = api.take("child");
    ok(api.post(
        &format!("/jobs/{child}/finish"),
        json!({"lease": job["lease"]}),
    ));
    assert_eq!(state(&api, parent), "QUEUED");
    assert_eq!(state(&api, after), "DEPENDS");
    let job = api.take("parent");
    ok(api.post(
        &format!("/jobs/{parent}/finish"),
        json!({"lease": job["lease"]}),
    ));
    assert_eq!(state(&api, after), "QUEUED");
    // A child cannot have dependencies.
    assert_error(
        api.post(
            "/jobs",
            json!({"name": "c", "parentJobID": after, "depends": [parent]}),
        ),
        409,
        "child_depends",
    );
}

// ---------------------------------------------------------------------------
// Adding and dropping later

#[test]
fn dependencies_are_added_and_dropped_later_over_http_bedrock_and_the_cli() {
    let server = Server::start();
    let api = server.api();
    let a = api.create(json!({"name": "a"}));
    let b = api.create(json!({"name": "b"}));
    let answer = ok(api.post(&format!("/jobs/{b}/depends"), json!({"add": [a]})));
    assert_eq!(answer["state"], "DEPENDS", "{answer}");
    assert_eq!(
        answer["dependencies"],
        json!([{"jobID": a, "state": "QUEUED"}])
    );
    assert!(api.dequeue(json!({"name": "b"})).is_empty());
    let answer = ok(api.post(&format!("/jobs/{b}/depends"), json!({"remove": [a]})));
    assert_eq!(answer["state"], "QUEUED", "{answer}");

    // Bedrock: UpdateJob with addDepends and removeDepends (without data,
    // or with it, in one transaction).
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &b.to_string()), ("addDepends", &format!("[{a}]"))],
    ))
    .assert_empty_ok();
    assert_eq!(state(&api, b), "DEPENDS");
    conn.call(&req(
        "UpdateJob",
        &[
            ("jobID", &b.to_string()),
            ("data", r#"{"n":1}"#),
            ("removeDepends", &format!("[{a}]")),
        ],
    ))
    .assert_empty_ok();
    let job = api.job(b);
    assert_eq!(
        (job["state"].clone(), job["data"].clone()),
        (json!("QUEUED"), json!({"n": 1}))
    );
    // Bedrock: CreateJob with a depends header, and CreateJobs entries.
    let created = conn
        .call(&req(
            "CreateJob",
            &[("name", "c"), ("depends", &format!("[{a}, {b}]"))],
        ))
        .json();
    let c = created["jobID"].as_i64().unwrap();
    assert_eq!(dependencies(&api.job(c)).len(), 2);
    let jobs = format!(r#"[{{"name":"d","depends":[{c}]}},{{"name":"e"}}]"#);
    let created = conn.call(&req("CreateJobs", &[("jobs", &jobs)])).json();
    let d = created["jobIDs"][0].as_i64().unwrap();
    assert_eq!(state(&api, d), "DEPENDS");
    assert_eq!(
        state(&api, created["jobIDs"][1].as_i64().unwrap()),
        "QUEUED"
    );

    // The CLI.
    let (code, out, err) = cli(
        &server,
        &[
            "create",
            "f",
            "--depends",
            &format!("{a},{b}"),
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let f = serde_json::from_str::<Value>(&out).unwrap()["jobID"]
        .as_i64()
        .unwrap();
    assert_eq!(state(&api, f), "DEPENDS");
    let (code, out, err) = cli(
        &server,
        &[
            "depends",
            &f.to_string(),
            "--remove",
            &format!("{a},{b}"),
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["state"],
        "QUEUED",
        "{out}"
    );
    let (code, _, err) = cli(
        &server,
        &["depends", &f.to_string(), "--add", &a.to_string()],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(state(&api, f), "DEPENDS");
    let (code, _, err) = cli(&server, &["depends", &f.to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("--add"), "{err}");

    // Not on a running or failed job.
    let job = api.take("a");
    assert_error(
        api.post(&format!("/jobs/{a}/depends"), json!({"remove": [1]})),
        409,
        "depends_not_allowed",
    );
    ok(api.post(&format!("/jobs/{a}/fail"), json!({"lease": job["lease"]})));
    let refused = api.post(&format!("/jobs/{a}/depends"), json!({"add": []}));
    assert_error(refused.clone(), 409, "depends_not_allowed");
    assert!(
        refused.1["message"].as_str().unwrap().contains("FAILED"),
        "{}",
        refused.1
    );
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &a.to_string()), ("removeDepends", "[1]")],
    ))
    .assert_error(&format!(
        "405 Can only change the dependencies of QUEUED or DEPENDS jobs; job {a} is FAILED"
    ));
}

// ---------------------------------------------------------------------------
// Hostile requests, on both ports: a clear error, nothing changed

#[test]
fn hostile_dependencies_are_refused_on_both_ports_and_change_nothing() {
    let server = Server::start();
    let api = server.api();
    let a = api.create(json!({"name": "a"}));
    let b = api.create(json!({"name": "b"}));
    let before = job_count(&api);

    // HTTP: unknown, a later job, itself, too many, bad JSON.
    let unknown = api.post("/jobs", json!({"name": "x", "depends": [a, 987654]}));
    assert_error(unknown.clone(), 404, "dependency_missing");
    assert!(
        unknown.1["message"].as_str().unwrap().contains("987654"),
        "{}",
        unknown.1
    );
    let batch = api.post(
        "/jobs/batch",
        json!({"jobs": [{"name": "ok"}, {"name": "x", "depends": [987654]}]}),
    );
    assert_error(batch, 404, "dependency_missing");
    let later = api.post(&format!("/jobs/{a}/depends"), json!({"add": [b]}));
    assert_error(later.clone(), 400, "dependency_not_earlier");
    assert!(
        later.1["message"]
            .as_str()
            .unwrap()
            .contains("created before it"),
        "{}",
        later.1
    );
    assert_error(
        api.post(&format!("/jobs/{a}/depends"), json!({"add": [a]})),
        400,
        "dependency_not_earlier",
    );
    let many: Vec<i64> = (1..=101).collect();
    assert_error(
        api.post("/jobs", json!({"name": "x", "depends": many})),
        400,
        "too_many_depends",
    );
    assert_error(
        api.post(&format!("/jobs/{b}/depends"), json!({"add": many})),
        400,
        "too_many_depends",
    );
    for bad in [
        json!("1,2"),
        json!([0]),
        json!([-3]),
        json!([1.5]),
        json!(["1"]),
        json!(null),
        json!({}),
    ] {
        let answer = api.post("/jobs", json!({"name": "x", "depends": bad}));
        assert_eq!(answer.0, 400, "{bad}: {}", answer.1);
    }
    assert_error(
        api.post(
            &format!("/jobs/{b}/depends"),
            json!({"add": [a], "other": 1}),
        ),
        400,
        "invalid_request",
    );
    assert_error(
        api.post("/jobs/987654/depends", json!({"add": [a]})),
        404,
        "no_such_job",
    );
    // Duplicates are one dependency.
    let dup = api.create(json!({"name": "dup", "depends": [a, a, a]}));
    assert_eq!(dependencies(&api.job(dup)), [(a, "QUEUED".to_string())]);
    ok(api.delete(&format!("/jobs/{dup}")));
    assert_eq!(job_count(&api), before);
    assert_eq!(state(&api, a), "QUEUED");
    assert_eq!(state(&api, b), "QUEUED");

    // Bedrock: the same, as status lines.
    let mut conn = Conn::open(&server.bedrock);
    conn.call(&req("CreateJob", &[("name", "x"), ("depends", "[987654]")]))
        .assert_error(
            "404 No job with jobID 987654 to depend on: a job can only depend on jobs that exist \
             (or that finished and are still in the archive)",
        );
    for bad in ["1,2", "[0]", "[1.5]", "{}", "[", "[\"1\"]"] {
        conn.call(&req("CreateJob", &[("name", "x"), ("depends", bad)]))
            .assert_error("402 Malformed depends");
    }
    let many = format!(
        "[{}]",
        (1..=101)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let refused = conn.call(&req("CreateJob", &[("name", "x"), ("depends", &many)]));
    assert!(
        refused
            .status
            .starts_with("402 Malformed depends: at most 100"),
        "{refused:?}"
    );
    let jobs = r#"[{"name":"ok"},{"name":"x","depends":[987654]}]"#;
    assert_eq!(conn.call(&req("CreateJobs", &[("jobs", jobs)])).code(), 404);
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &a.to_string()), ("addDepends", &format!("[{b}]"))],
    ))
    .assert_error(&format!(
        "402 Job {a} cannot depend on job {b}: a job may only depend on jobs created before it \
         (a lower jobID), so that dependencies never form a cycle"
    ));
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &b.to_string()), ("addDepends", "[1,")],
    ))
    .assert_error("402 Malformed addDepends");
    conn.call(&req(
        "UpdateJob",
        &[("jobID", &b.to_string()), ("removeDepends", "x")],
    ))
    .assert_error("402 Malformed removeDepends");
    // Other fields still need data.
    conn.call(&req(
        "UpdateJob",
        &[
            ("jobID", &b.to_string()),
            ("addDepends", &format!("[{a}]")),
            ("repeat", "HOURLY"),
        ],
    ))
    .assert_error("402 Missing data");
    assert_eq!(job_count(&api), before);
    assert_eq!(state(&api, b), "QUEUED");
}

/// A JSON array of these ids, as text.
fn id_list(ids: &[i64]) -> String {
    serde_json::to_string(ids).expect("a list")
}

#[test]
fn depends_holding_the_same_job_twice_counts_it_once_also_past_the_limit() {
    let server = Server::start();
    let api = server.api();
    let jobs: Vec<i64> = (0..100)
        .map(|n| api.create(json!({"name": format!("d{n}")})))
        .collect();
    let (a, b) = (jobs[0], jobs[1]);
    // 100 jobs, and the first of them again: 101 entries, 100 jobs.
    let hundred_and_a_twin: Vec<i64> = jobs.iter().copied().chain([a]).collect();
    let twice_each: Vec<i64> = jobs.iter().flat_map(|&id| [id, id]).collect();
    let waiting_for = |id: i64| dependencies(&api.job(id)).len();

    // HTTP: a create, a batch entry, a later change.
    let one = api.create(json!({"name": "x", "depends": [a, a]}));
    assert_eq!(dependencies(&api.job(one)), [(a, "QUEUED".to_string())]);
    let all = api.create(json!({"name": "x", "depends": hundred_and_a_twin}));
    assert_eq!(waiting_for(all), 100);
    let batch = api.create_batch(vec![json!({"name": "x", "depends": twice_each})]);
    assert_eq!(waiting_for(batch[0]), 100);
    let changed = api.create(json!({"name": "x"}));
    let answer = ok(api.post(
        &format!("/jobs/{changed}/depends"),
        json!({"add": twice_each}),
    ));
    assert_eq!(dependencies(&answer).len(), 100, "{answer}");
    let answer = ok(api.post(
        &format!("/jobs/{changed}/depends"),
        json!({"remove": hundred_and_a_twin}),
    ));
    assert_eq!(dependencies(&answer), [], "{answer}");

    // Bedrock: CreateJob's header, a CreateJobs entry, UpdateJob's lists.
    let mut conn = Conn::open(&server.bedrock);
    let created = conn
        .call(&req(
            "CreateJob",
            &[("name", "x"), ("depends", &id_list(&hundred_and_a_twin))],
        ))
        .json();
    assert_eq!(waiting_for(created["jobID"].as_i64().expect("jobID")), 100);
    let entries = format!(r#"[{{"name":"x","depends":{}}}]"#, id_list(&twice_each));
    let created = conn.call(&req("CreateJobs", &[("jobs", &entries)])).json();
    assert_eq!(
        waiting_for(created["jobIDs"][0].as_i64().expect("jobID")),
        100
    );
    let update = conn.call(&req(
        "UpdateJob",
        &[
            ("jobID", &changed.to_string()),
            ("addDepends", &id_list(&twice_each)),
        ],
    ));
    assert_eq!(update.code(), 200, "{update:?}");
    assert_eq!(waiting_for(changed), 100);

    // Hostile, beside them: 101 jobs, a 0, a negative id, text; refused,
    // and nothing created or changed.
    let before = job_count(&api);
    let extra = api.create(json!({"name": "d100"}));
    let too_many: Vec<i64> = jobs.iter().copied().chain([extra, extra]).collect();
    let before = (before + 1, waiting_for(changed));
    assert_error(
        api.post("/jobs", json!({"name": "x", "depends": too_many})),
        400,
        "too_many_depends",
    );
    assert_error(
        api.post(&format!("/jobs/{b}/depends"), json!({"add": too_many})),
        400,
        "too_many_depends",
    );
    let refused = conn.call(&req(
        "CreateJob",
        &[("name", "x"), ("depends", &id_list(&too_many))],
    ));
    assert!(
        refused
            .status
            .starts_with("402 Malformed depends: at most 100"),
        "{refused:?}"
    );
    for bad in [
        json!([a, a, 0]),
        json!([a, -1, a]),
        json!([a, "1", a]),
        json!([a, a, 1.5]),
    ] {
        let answer = api.post("/jobs", json!({"name": "x", "depends": bad}));
        assert_eq!(answer.0, 400, "{bad}: {}", answer.1);
        let line = conn.call(&req(
            "CreateJob",
            &[("name", "x"), ("depends", &bad.to_string())],
        ));
        line.assert_error("402 Malformed depends");
    }
    assert_eq!((job_count(&api), waiting_for(changed)), before);
}

// ---------------------------------------------------------------------------
// Randomized stress

/// What the takers saw, in the order they saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A hand-out was received.
    Handed(i64),
    /// A finish is about to be sent.
    FinishSent(i64),
    /// A finish was answered.
    Finished(i64),
}

#[test]
fn random_dependency_graphs_with_concurrent_takers_never_run_a_job_early_or_strand_one() {
    use rand::{Rng, SeedableRng};
    const JOBS: usize = 300;
    const TAKERS: usize = 4;
    let seed: u64 = rand::rng().random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let server = Server::start();
    // On PostgreSQL, a second server on the same database: takers on both,
    // so that finishes and claims cross servers (locks and NOTIFY).
    let other = store_is_postgres().then(|| Server::builder().same_store_as(&server).start());
    let apis: Vec<Api> = std::iter::once(server.api())
        .chain(other.as_ref().map(Server::api))
        .collect();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let takers: Vec<_> = (0..TAKERS)
        .map(|i| {
            let api = apis[i % apis.len()].clone();
            let seen = Arc::clone(&seen);
            let stop = Arc::clone(&stop);
            let go = Arc::clone(&go);
            std::thread::spawn(move || {
                let note = |what: Seen| seen.lock().unwrap().push(what);
                while !go.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                while !stop.load(Ordering::SeqCst) {
                    let jobs =
                        api.dequeue(json!({"name": "stress", "numResults": 2, "waitMs": 200}));
                    for job in jobs {
                        let id = job["jobID"].as_i64().unwrap();
                        note(Seen::Handed(id));
                        std::thread::sleep(Duration::from_millis(id as u64 % 7));
                        note(Seen::FinishSent(id));
                        ok(api.post(
                            &format!("/jobs/{id}/finish"),
                            json!({"lease": job["lease"]}),
                        ));
                        note(Seen::Finished(id));
                    }
                }
            })
        })
        .collect();

    // Jobs each depending on up to three of the 40 created last: the first
    // half before the takers start (a backlog of deep graphs), the second
    // while they work (some of their dependencies done by then).
    let mut graph: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut created: Vec<i64> = Vec::new();
    for n in 0..JOBS {
        if n == JOBS / 2 {
            go.store(true, Ordering::SeqCst);
        }
        let mut depends = Vec::new();
        for _ in 0..rng.random_range(0..=3) {
            if let Some(window) = created.len().checked_sub(1) {
                let low = window.saturating_sub(39);
                depends.push(created[rng.random_range(low..=window)]);
            }
        }
        depends.sort_unstable();
        depends.dedup();
        let id = apis[n % apis.len()].create(json!({"name": "stress", "depends": depends}));
        graph.insert(id, depends);
        created.push(id);
    }

    let api = &apis[0];
    let started = Instant::now();
    loop {
        let finished = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| matches!(s, Seen::Finished(_)))
            .count();
        if finished == JOBS || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for taker in takers {
        taker.join().unwrap();
    }

    let seen = seen.lock().unwrap().clone();
    let at = |what: Seen| seen.iter().position(|s| *s == what);
    let mut early = Vec::new();
    let mut stranded = Vec::new();
    let mut twice = Vec::new();
    for (&id, depends) in &graph {
        let handed: Vec<usize> = seen
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Seen::Handed(id))
            .map(|(i, _)| i)
            .collect();
        if handed.len() > 1 {
            twice.push(id);
        }
        match handed.first() {
            // Handed out before a dependency's finish was even sent.
            Some(&when) => {
                for &dependency in depends {
                    if at(Seen::FinishSent(dependency)).is_none_or(|sent| sent > when) {
                        early.push((id, dependency));
                    }
                }
            }
            // Never handed out, though every dependency finished.
            None => {
                if depends.iter().all(|&d| at(Seen::Finished(d)).is_some()) {
                    stranded.push((id, api.job(id)));
                }
            }
        }
    }
    let waiting = api.get("/jobs?state=DEPENDS").1["jobs"].clone();
    eprintln!(
        "{JOBS} jobs, {} dependencies, {} servers, {TAKERS} takers: {} handed out early, {} stranded, {} handed out twice, in {:?}",
        graph.values().map(Vec::len).sum::<usize>(),
        apis.len(),
        early.len(),
        stranded.len(),
        twice.len(),
        started.elapsed()
    );
    assert!(
        early.is_empty(),
        "handed out before a dependency finished (job, dependency): {early:?}"
    );
    assert!(stranded.is_empty(), "never handed out: {stranded:?}");
    assert!(twice.is_empty(), "handed out twice: {twice:?}");
    assert_eq!(waiting, json!([]), "jobs still waiting");
}
