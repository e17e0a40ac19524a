//! Throttles across the fleet: a cap on how many jobs matching a GLOB are
//! held at once, over every supervisor and (on PostgreSQL) every server
//! sharing the database. Counted from what the workers themselves saw,
//! freed by lapsed leases, never blocking other names, changed and
//! removed while jobs run, refusing hostile input, and held under a
//! randomized stress of takers over HTTP. Runs on both stores.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::bedrock_conn::Conn;
use crate::common::{
    Api, Server, Supervisor, assert_error, client_command, poll, store_is_postgres,
};

/// One server, or on PostgreSQL two sharing one database.
pub(crate) fn fleet() -> Vec<Server> {
    let first = Server::start();
    if store_is_postgres() {
        let second = Server::builder().same_store_as(&first).start();
        vec![first, second]
    } else {
        vec![first]
    }
}

/// `PUT /throttles/{glob}`; panics unless it succeeds.
pub(crate) fn set(api: &Api, glob: &str, max: i64) {
    let (status, answer) = api.send(
        "PUT",
        &format!("/throttles/{}", encode(glob)),
        Some(json!({"max": max}).to_string()),
    );
    assert_eq!(status, 200, "set {glob} to {max}: {answer}");
}

/// A GLOB as one path segment.
pub(crate) fn encode(glob: &str) -> String {
    glob.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// `GET /throttles` as glob → (max, running).
pub(crate) fn throttles(api: &Api) -> HashMap<String, (i64, i64)> {
    let (status, answer) = api.get("/throttles");
    assert_eq!(status, 200, "{answer}");
    answer["throttles"]
        .as_array()
        .expect("throttles")
        .iter()
        .map(|t| {
            (
                t["glob"].as_str().expect("glob").to_string(),
                (
                    t["max"].as_i64().expect("max"),
                    t["running"].as_i64().expect("running"),
                ),
            )
        })
        .collect()
}

fn finish(api: &Api, job: &Value) -> (u16, Value) {
    api.post(
        &format!("/jobs/{}/finish", job["jobID"]),
        json!({"lease": job["lease"]}),
    )
}

/// The most intervals open at once, from `start T` and `end T` lines (an
/// end before a start at the same instant).
fn max_overlap(lines: &str) -> (usize, usize) {
    let mut events: Vec<(f64, i32)> = lines
        .lines()
        .filter_map(|line| {
            let (kind, time) = line.split_once(' ')?;
            let time: f64 = time.trim().parse().ok()?;
            Some((time, if kind == "start" { 1 } else { -1 }))
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut open, mut most, mut starts) = (0i32, 0i32, 0usize);
    for (_, delta) in events {
        open += delta;
        most = most.max(open);
        starts += usize::from(delta == 1);
    }
    (most as usize, starts)
}

#[test]
fn a_throttle_of_2_holds_across_3_supervisors_with_30_jobs() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "thr/*", 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("runs");
    std::fs::write(&log, "").expect("log file");
    let script = format!(
        "#!/bin/sh\necho \"start $(date +%s.%N)\" >> {log}\nsleep 0.3\necho \"end $(date +%s.%N)\" >> {log}\n",
        log = log.display()
    );
    // Three supervisors of four workers each, spread over the servers:
    // without the throttle, up to twelve would run at once.
    let supervisors: Vec<Supervisor> = (0..3)
        .map(|i| {
            Supervisor::builder(&servers[i % servers.len()].url)
                .arg("--job-name")
                .arg("thr/*")
                .arg("--max-workers")
                .arg("4")
                .worker("Sleep", &script)
                .start()
        })
        .collect();
    for _ in 0..30 {
        api.create(json!({"name": "thr/Sleep"}));
    }
    let text = poll("30 runs to end", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.lines().filter(|l| l.starts_with("end ")).count() == 30).then_some(text)
    });
    let (most, starts) = max_overlap(&text);
    assert_eq!(starts, 30, "{text}");
    assert!(
        most <= 2,
        "{most} ran at once under a throttle of 2:\n{text}"
    );
    assert_eq!(
        most, 2,
        "the throttle allows 2 at once, and 3 supervisors had work"
    );
    drop(supervisors);
}

#[test]
fn a_lapsed_lease_frees_the_slot() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "lapse/*", 1);
    let first = api.create(json!({"name": "lapse/Hang"}));
    let mut supervisor = Supervisor::builder(&servers[0].url)
        .arg("--job-name")
        .arg("lapse/*")
        .arg("--lease")
        .arg("2s")
        .worker("Hang", "#!/bin/sh\nsleep 600\n")
        .start();
    poll("the supervisor to hold the job", || {
        (api.state(first).as_deref() == Some("RUNNING")).then_some(())
    });
    let second = api.create(json!({"name": "lapse/Other"}));
    // The slot is taken: nothing is handed out while the first job runs.
    assert!(api.dequeue(json!({"name": "lapse/*"})).is_empty());
    supervisor.kill9();
    // A take held on the last server is answered once the lease lapses.
    let held = servers[servers.len() - 1].api();
    let take = std::thread::spawn(move || {
        held.dequeue(json!({"name": "lapse/*", "waitMs": 60_000, "leaseMs": 60_000}))
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let id = jobs[0]["jobID"].as_i64().expect("jobID");
    assert!(id == first || id == second, "{id}");
    assert_eq!(throttles(&api)["lapse/*"], (1, 1));
}

#[test]
fn a_throttled_name_never_blocks_other_names() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "api/*", 1);
    for i in 0..200 {
        api.create(json!({"name": format!("api/Call{}", i % 7), "priority": 1000}));
    }
    for _ in 0..5 {
        api.create(json!({"name": "batch/Job"}));
    }
    let held = api.dequeue(json!({"name": "*", "leaseMs": 60_000}));
    assert_eq!(held.len(), 1);
    assert!(
        held[0]["name"].as_str().unwrap().starts_with("api/"),
        "{held:?}"
    );
    // The best jobs are all throttled: each claim takes the others.
    let mut batch = 0;
    for server in &servers {
        let jobs = server
            .api()
            .dequeue(json!({"name": "*", "numResults": 3, "leaseMs": 60_000}));
        assert!(
            jobs.iter().all(|j| j["name"] == "batch/Job"),
            "a throttled job was handed out: {jobs:?}"
        );
        batch += jobs.len();
    }
    let rest = api.dequeue(json!({"name": "*", "numResults": 10, "leaseMs": 60_000}));
    assert!(rest.iter().all(|j| j["name"] == "batch/Job"), "{rest:?}");
    assert_eq!(batch + rest.len(), 5, "{rest:?}");
    // The held-back jobs were parked once, not stepped over by each claim.
    let parked =
        servers[0].store_query_i64("SELECT COUNT(*) FROM jobs WHERE held_back_by IS NOT NULL");
    assert_eq!(parked, [199]);
    // Finishing the held job hands out the next one.
    assert_eq!(finish(&api, &held[0]).0, 200);
    let next = api.dequeue(json!({"name": "api/*", "numResults": 5, "leaseMs": 60_000}));
    assert_eq!(next.len(), 1, "{next:?}");
}

#[test]
fn lowering_and_deleting_a_throttle() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "low/*", 3);
    for _ in 0..10 {
        api.create(json!({"name": "low/Job"}));
    }
    let take = |n: usize| api.dequeue(json!({"name": "low/*", "numResults": n, "leaseMs": 60_000}));
    let first = take(10);
    assert_eq!(first.len(), 3, "{first:?}");
    // Lowered below the running count: nothing is stopped, nothing new
    // is handed out until the running ones drain below it.
    set(&api, "low/*", 1);
    assert_eq!(throttles(&api)["low/*"], (1, 3));
    for job in &first {
        assert_eq!(
            api.state(job["jobID"].as_i64().unwrap()).as_deref(),
            Some("RUNNING")
        );
    }
    assert!(take(10).is_empty());
    assert_eq!(finish(&api, &first[0]).0, 200);
    assert_eq!(finish(&api, &first[1]).0, 200);
    assert!(take(10).is_empty(), "still one running, at the cap of 1");
    // A take held on the last server is woken by the freed slot.
    let held = servers[servers.len() - 1].api();
    let waiting = std::thread::spawn(move || {
        held.dequeue(
            json!({"name": "low/*", "numResults": 10, "waitMs": 60_000, "leaseMs": 60_000}),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(finish(&api, &first[2]).0, 200);
    let woken = waiting.join().expect("the held take");
    assert_eq!(woken.len(), 1, "{woken:?}");
    // Paused (0), then deleted: a held take is woken by the delete and
    // gets every job left.
    set(&api, "low/*", 0);
    assert_eq!(finish(&api, &woken[0]).0, 200);
    assert!(take(10).is_empty(), "paused");
    let held = servers[servers.len() - 1].api();
    let waiting = std::thread::spawn(move || {
        held.dequeue(
            json!({"name": "low/*", "numResults": 10, "waitMs": 60_000, "leaseMs": 60_000}),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let (status, answer) = api.delete(&format!("/throttles/{}", encode("low/*")));
    assert_eq!(status, 200, "{answer}");
    let rest = waiting.join().expect("the held take");
    let rest = if rest.len() < 6 {
        let mut more = rest;
        more.extend(take(10));
        more
    } else {
        rest
    };
    assert_eq!(rest.len(), 6, "{rest:?}");
    assert!(throttles(&api).is_empty());
    assert_error(
        api.delete(&format!("/throttles/{}", encode("low/*"))),
        404,
        "no_such_throttle",
    );
}

#[test]
fn overlapping_throttles_each_need_room() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "ov/*", 3);
    set(&api, "ov/slow*", 1);
    for _ in 0..4 {
        api.create(json!({"name": "ov/slowJob"}));
        api.create(json!({"name": "ov/fastJob"}));
    }
    let jobs = api.dequeue(json!({"name": "*", "numResults": 10, "leaseMs": 60_000}));
    let slow = jobs.iter().filter(|j| j["name"] == "ov/slowJob").count();
    assert_eq!((jobs.len(), slow), (3, 1), "{jobs:?}");
    assert_eq!(throttles(&api)["ov/*"], (3, 3));
    assert_eq!(throttles(&api)["ov/slow*"], (1, 1));
}

#[test]
fn hostile_throttle_inputs_are_refused_and_change_nothing() {
    let server = Server::start();
    let api = server.api();
    set(&api, "keep/*", 2);
    let put = |path: &str, body: &str| api.send("PUT", path, Some(body.to_string()));
    let before = throttles(&api);
    for body in [
        r#"{"max": -1}"#,
        r#"{"max": 1000001}"#,
        r#"{"max": "3"}"#,
        r#"{"max": 2.5}"#,
        r#"{"max": null}"#,
        r#"{}"#,
        r#"{"max": 1, "extra": true}"#,
        r#"[1]"#,
        r#"{"max": 99999999999999999999}"#,
    ] {
        let (status, answer) = put("/throttles/keep%2F%2A", body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    let long = "x".repeat(256);
    for glob in ["%5Babc", "a%2Cb", "a%0Ab", "a%1B", long.as_str()] {
        let (status, answer) = put(&format!("/throttles/{glob}"), r#"{"max": 1}"#);
        assert_eq!(status, 400, "{glob}: {answer}");
    }
    assert_eq!(throttles(&api), before, "refused inputs changed nothing");
    assert_error(api.delete("/throttles/nothing"), 404, "no_such_throttle");
    // At most 1,000 throttles.
    for i in 1..1000 {
        set(&api, &format!("many/{i}"), 1);
    }
    assert_error(
        api.send(
            "PUT",
            "/throttles/one-too-many",
            Some(r#"{"max": 1}"#.into()),
        ),
        400,
        "too_many_throttles",
    );
    // Changing one that exists is still allowed.
    set(&api, "many/1", 5);
    assert_eq!(throttles(&api).len(), 1000);
}

#[test]
fn the_throttle_command_sets_lists_and_deletes() {
    let server = Server::start();
    let (code, out, err) = client_command(
        &server,
        &["throttle", "set", "cli/*", "3", "--format", "text"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let id = server.api().create(json!({"name": "cli/Job"}));
    server
        .api()
        .dequeue(json!({"name": "cli/*", "leaseMs": 60_000}));
    let (code, out, err) = client_command(&server, &["throttle", "list", "--format", "text"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["1", "3", "cli/*"]),
        "{out}"
    );
    let (code, out, _) = client_command(&server, &["throttle", "list", "--format", "json"]);
    assert_eq!(code, 0);
    let answer: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        answer["throttles"][0],
        json!({"glob": "cli/*", "max": 3, "running": 1})
    );
    let (code, _, err) = client_command(&server, &["throttle", "set", "cli/*", "-1"]);
    assert_ne!(code, 0);
    assert!(!err.is_empty());
    let (code, _, err) = client_command(&server, &["throttle", "delete", "cli/*"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = client_command(&server, &["throttle", "delete", "cli/*"]);
    assert_eq!(code, 3, "deleting what is not there is 'not found': {err}");
    assert_eq!(server.api().state(id).as_deref(), Some("RUNNING"));
}

/// A throttle's values over time, as the changer set them: (when the PUT
/// or DELETE was sent, the new cap, `None` when deleted).
type History = Arc<Mutex<Vec<(Instant, Option<i64>)>>>;

/// The highest cap that may have been in effect at any moment from
/// `since` on: the values set after it, the one before it, and the one
/// before that (a change sent before `since` may commit after it).
fn allowed(history: &[(Instant, Option<i64>)], since: Instant) -> Option<i64> {
    let before = history.iter().filter(|(at, _)| *at < since).count();
    let from = before.saturating_sub(2);
    let mut most = Some(0);
    for (_, value) in &history[from..] {
        most = match (most, value) {
            (Some(a), Some(b)) => Some(a.max(*b)),
            _ => None,
        };
    }
    most
}

#[test]
fn randomized_stress_never_exceeds_a_cap_and_starves_no_job() {
    const JOBS: usize = 240;
    const TAKERS: usize = 8;
    let seed: u64 = std::env::var("THROTTLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (THROTTLE_SEED reruns it)");
    let servers = fleet();
    let apis: Arc<Vec<Api>> = Arc::new(servers.iter().map(Server::api).collect());
    let globs = ["s/a*", "s/ab*", "s/b*"];
    let histories: Arc<Vec<History>> = Arc::new(globs.iter().map(|_| History::default()).collect());
    for (i, glob) in globs.iter().enumerate() {
        histories[i].lock().unwrap().push((Instant::now(), Some(2)));
        set(&apis[0], glob, 2);
    }
    let names = ["s/a1", "s/ab1", "s/ab2", "s/b1", "s/c1"];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut all = HashSet::new();
    for _ in 0..JOBS {
        let name = names[rng.random_range(0..names.len())];
        let priority = [0, 500, 1000][rng.random_range(0..3)];
        all.insert(apis[0].create(json!({"name": name, "priority": priority})));
    }
    // Jobs held as the takers know them (id → name, when the take was
    // sent): a job leaves before its report is sent or its lease is let
    // lapse, so this is always a subset of what the server counts.
    let held: Arc<Mutex<HashMap<i64, (String, Instant)>>> = Arc::default();
    let done: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let handouts = Arc::new(AtomicUsize::new(0));
    let changer = {
        let (apis, histories, stop) =
            (Arc::clone(&apis), Arc::clone(&histories), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A9);
            let deadline = Instant::now() + Duration::from_secs(8);
            while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.random_range(50..250)));
                let i = rng.random_range(0..globs.len());
                let api = &apis[rng.random_range(0..apis.len())];
                let value = if rng.random_bool(0.15) {
                    None
                } else {
                    Some(rng.random_range(0..4))
                };
                histories[i].lock().unwrap().push((Instant::now(), value));
                match value {
                    Some(max) => set(api, globs[i], max),
                    None => {
                        let (status, _) = api.delete(&format!("/throttles/{}", encode(globs[i])));
                        assert!(status == 200 || status == 404);
                    }
                }
            }
            // The end: every throttle in place with room, so every job can run.
            for (i, glob) in globs.iter().enumerate() {
                histories[i].lock().unwrap().push((Instant::now(), Some(2)));
                set(&apis[0], glob, 2);
            }
        })
    };
    let takers: Vec<_> = (0..TAKERS)
        .map(|taker| {
            let apis = Arc::clone(&apis);
            let (held, done, violations) = (Arc::clone(&held), Arc::clone(&done), Arc::clone(&violations));
            let (histories, stop, handouts) = (Arc::clone(&histories), Arc::clone(&stop), Arc::clone(&handouts));
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (taker as u64 + 1));
                while !stop.load(Ordering::SeqCst) {
                    let api = &apis[rng.random_range(0..apis.len())];
                    let lapse = rng.random_bool(0.08);
                    let lease = if lapse { 500 } else { 60_000 };
                    let sent = Instant::now();
                    let (status, answer) = api.post(
                        "/dequeue",
                        json!({"name": "s/*", "numResults": rng.random_range(1..=3), "waitMs": 500, "leaseMs": lease}),
                    );
                    assert_eq!(status, 200, "{answer}");
                    let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
                    for job in &jobs {
                        handouts.fetch_add(1, Ordering::SeqCst);
                        let id = job["jobID"].as_i64().unwrap();
                        let name = job["name"].as_str().unwrap().to_string();
                        let mut held = held.lock().unwrap();
                        held.insert(id, (name.clone(), sent));
                        for (i, glob) in globs.iter().enumerate() {
                            let matching: Vec<Instant> = held
                                .values()
                                .filter(|(n, _)| crate_glob(glob, n))
                                .map(|(_, at)| *at)
                                .collect();
                            if !crate_glob(glob, &name) {
                                continue;
                            }
                            let since = matching.iter().min().copied().unwrap_or(sent);
                            let cap = allowed(&histories[i].lock().unwrap(), since);
                            if let Some(cap) = cap
                                && matching.len() as i64 > cap
                            {
                                violations.lock().unwrap().push(format!(
                                    "{} jobs of {glob} held with a cap of at most {cap} (job {id})",
                                    matching.len()
                                ));
                            }
                        }
                    }
                    for job in jobs {
                        let id = job["jobID"].as_i64().unwrap();
                        std::thread::sleep(Duration::from_millis(rng.random_range(0..20)));
                        held.lock().unwrap().remove(&id);
                        if lapse {
                            continue; // let the lease lapse
                        }
                        let roll = rng.random_range(0..10);
                        let path = match roll {
                            0..=5 => "finish",
                            6..=7 => "retry",
                            _ => "fail",
                        };
                        let body = if path == "retry" {
                            json!({"lease": job["lease"], "delay": 0})
                        } else {
                            json!({"lease": job["lease"]})
                        };
                        let (status, answer) = api.post(&format!("/jobs/{id}/{path}"), body);
                        assert_eq!(status, 200, "{path} {id}: {answer}");
                        if path != "retry" {
                            done.lock().unwrap().insert(id);
                        }
                    }
                }
            })
        })
        .collect();
    changer.join().expect("the changer");
    // Every job ends (finished or failed): none is starved by a throttle.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left: Vec<i64> = {
            let done = done.lock().unwrap();
            all.iter()
                .filter(|id| !done.contains(id))
                .copied()
                .collect()
        };
        let left: Vec<i64> = left
            .into_iter()
            .filter(|id| {
                matches!(
                    apis[0].state(*id).as_deref(),
                    Some("QUEUED" | "RUNQUEUED" | "RUNNING")
                )
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} jobs starved: {left:?}; throttles {:?}",
            left.len(),
            throttles(&apis[0])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    for taker in takers {
        taker.join().expect("a taker");
    }
    let violations = violations.lock().unwrap();
    eprintln!("{} hand-outs", handouts.load(Ordering::SeqCst));
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
}

/// SQLite's GLOB, as the server matches throttles (enough for these
/// patterns: a literal prefix and `*`).
fn crate_glob(glob: &str, name: &str) -> bool {
    match glob.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => glob == name,
    }
}

#[test]
fn the_bedrock_port_sets_lists_and_deletes_throttles() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let call = |conn: &mut Conn, method: &str, headers: &[(&str, &str)]| {
        let mut request = format!("{method}\r\nToken: {}\r\n", crate::common::token());
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        conn.call(request.as_bytes())
    };
    call(&mut conn, "SetThrottle", &[("glob", "api/*"), ("max", "3")]).assert_empty_ok();
    assert_eq!(throttles(&api).get("api/*"), Some(&(3, 0)));
    // QueryJob shows the throttles a job is counted under, on both ports.
    let held = api.create(json!({"name": "api/charge"}));
    let other = api.create(json!({"name": "batch/x"}));
    let want = json!([{"glob": "api/*", "max": 3, "running": 0}]);
    assert_eq!(api.job(held)["throttles"], want);
    assert!(api.job(other).get("throttles").is_none());
    let queried = call(&mut conn, "QueryJob", &[("jobID", &held.to_string())]).json();
    assert_eq!(queried["throttles"], want, "{queried}");
    let listed = call(&mut conn, "GetThrottles", &[]).json();
    assert_eq!(listed["throttles"][0]["glob"], "api/*", "{listed}");
    assert_eq!(listed["throttles"][0]["max"], 3, "{listed}");
    // Hostile: each refused with its line, nothing changed.
    call(&mut conn, "SetThrottle", &[("max", "3")]).assert_error("402 Missing glob");
    call(&mut conn, "SetThrottle", &[("glob", "api/*")]).assert_error("402 Missing max");
    for (glob, max) in [
        ("api/*", "three"),
        ("api/*", "-1"),
        ("a,b", "1"),
        ("[oops", "1"),
    ] {
        let answer = call(&mut conn, "SetThrottle", &[("glob", glob), ("max", max)]);
        assert!(
            answer.status.starts_with("402 Malformed throttle: "),
            "{glob} {max}: {answer:?}"
        );
    }
    assert_eq!(throttles(&api).get("api/*"), Some(&(3, 0)));
    assert_eq!(throttles(&api).len(), 1);
    call(&mut conn, "DeleteThrottle", &[("glob", "api/*")]).assert_empty_ok();
    call(&mut conn, "DeleteThrottle", &[("glob", "api/*")])
        .assert_error("404 No such throttle; GetThrottles lists those there are");
    assert!(throttles(&api).is_empty());
}
