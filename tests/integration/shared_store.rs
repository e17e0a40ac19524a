//! Several servers on one PostgreSQL database, all serving at once: claims
//! that skip each other's rows, a create through one server waking a take
//! held on another, lapses acted on once, statistics that add up. These
//! always run on PostgreSQL (the machines and CI have it on 127.0.0.1:5432),
//! whatever `JOBMGR_TEST_STORE` says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::{Server, TestDatabase, poll};

/// `n` servers on one new database.
fn servers(n: usize) -> Vec<Server> {
    let database = Arc::new(TestDatabase::create());
    (0..n)
        .map(|_| Server::builder().on_database(&database).start())
        .collect()
}

/// How many GetJob requests a server holds (from `/healthz`).
fn waiting(server: &Server) -> i64 {
    let (_, health) = server.api().get("/healthz");
    health["waiting"].as_i64().unwrap_or(0)
}

#[test]
fn a_create_through_one_server_wakes_a_take_held_on_another() {
    let servers = servers(2);
    let (a, b) = (&servers[0], &servers[1]);
    let held = b.api();
    // The take waits an hour: only a wake-up from the other server's commit
    // can answer it within the test's deadline (nothing polls).
    let take = std::thread::spawn(move || {
        held.dequeue(json!({"name": "cross/*", "waitMs": 3_600_000, "leaseMs": 60_000}))
    });
    poll("the take to be held on the second server", || {
        (waiting(b) == 1).then_some(())
    });
    let id = a.api().create(json!({"name": "cross/now"}));
    poll("the held take to be answered", || {
        take.is_finished().then_some(())
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], id);
}

#[test]
fn a_job_due_later_wakes_a_take_held_on_another_server_when_it_is_due() {
    let servers = servers(2);
    let (a, b) = (&servers[0], &servers[1]);
    let held = b.api();
    let take = std::thread::spawn(move || {
        held.dequeue(json!({"name": "later/*", "waitMs": 3_600_000, "leaseMs": 60_000}))
    });
    poll("the take to be held on the second server", || {
        (waiting(b) == 1).then_some(())
    });
    // Due in two seconds: the second server's timer must learn of it from
    // the announcement, since nothing it committed scheduled it.
    let first_run = chrono::Utc::now() + chrono::Duration::seconds(2);
    let id = a.api().create(json!({
        "name": "later/one",
        "firstRun": first_run.format("%Y-%m-%d %H:%M:%S").to_string(),
    }));
    poll("the held take to be answered once the job is due", || {
        take.is_finished().then_some(())
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], id);
}

#[test]
fn a_lapsed_lease_is_acted_on_once_across_servers() {
    let servers = servers(3);
    let id = servers[0].api().create(json!({"name": "lapse/one"}));
    let jobs = servers[1]
        .api()
        .dequeue(json!({"name": "lapse/*", "leaseMs": 300}));
    assert_eq!(jobs.len(), 1);
    // Every server's timer sees the lease lapse; one of them acts on it.
    poll("the lapsed job to be queued again", || {
        (servers[2].api().state(id).as_deref() == Some("QUEUED")).then_some(())
    });
    // Let every server's timer have its turn before counting.
    let settled = Instant::now() + Duration::from_secs(2);
    poll("the other servers' timers to pass the lapse", || {
        (Instant::now() >= settled).then_some(())
    });
    let job = servers[0].api().job(id);
    assert_eq!(job["lapses"], 1, "{job}");
    assert_eq!(job["state"], "QUEUED", "{job}");
    let outcomes = servers[2].api().outcomes(id);
    assert_eq!(outcomes, ["lease_lost"], "one attempt, lapsed once");
}

#[test]
fn concurrent_takers_on_three_servers_never_share_a_job_and_the_statistics_add_up() {
    const JOBS: usize = 300;
    const TAKERS: usize = 6;
    let seed: u64 = std::env::var("SHARED_STORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (SHARED_STORE_SEED reruns it)");
    let servers = servers(3);
    let apis: Arc<Vec<_>> = Arc::new(servers.iter().map(Server::api).collect());
    let name = "stress/job";
    // Who took each job: leases never lapse here, so any second hand-out
    // of a job is a violation.
    let held: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let finished: Arc<Mutex<Vec<i64>>> = Arc::default();

    // Creators and takers at once, each request to a random server.
    let creator = {
        let apis = Arc::clone(&apis);
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..JOBS {
                let api = &apis[rng.random_range(0..apis.len())];
                api.create(json!({"name": name}));
            }
        })
    };
    let takers: Vec<_> = (0..TAKERS)
        .map(|taker| {
            let apis = Arc::clone(&apis);
            let held = Arc::clone(&held);
            let violations = Arc::clone(&violations);
            let finished = Arc::clone(&finished);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (taker as u64 + 1));
                let deadline = Instant::now() + Duration::from_secs(120);
                while finished.lock().unwrap().len() < JOBS && Instant::now() < deadline {
                    let api = &apis[rng.random_range(0..apis.len())];
                    let count = rng.random_range(1..=4);
                    let jobs: Vec<Value> = api.dequeue(json!({
                        "name": "stress/*", "numResults": count,
                        "waitMs": 200, "leaseMs": 600_000,
                    }));
                    for job in jobs {
                        let id = job["jobID"].as_i64().expect("jobID");
                        let lease = job["lease"].as_str().expect("lease").to_string();
                        let before = held.lock().unwrap().insert(id, taker);
                        if let Some(before) = before {
                            violations.lock().unwrap().push(format!(
                                "job {id} handed to taker {taker} after taker {before} took it"
                            ));
                        }
                        let reporter = &apis[rng.random_range(0..apis.len())];
                        let (status, answer) =
                            reporter.post(&format!("/jobs/{id}/finish"), json!({"lease": lease}));
                        if status != 200 {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("finish of {id} refused: {status} {answer}"));
                        }
                        finished.lock().unwrap().push(id);
                    }
                }
            })
        })
        .collect();
    creator.join().expect("creator");
    for taker in takers {
        taker.join().expect("taker");
    }
    let violations = violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
    let finished = finished.lock().unwrap().clone();
    assert_eq!(
        finished.len(),
        JOBS,
        "every job handed out and finished once"
    );
    let (_, queued) = servers[0].api().get("/jobs?name=stress/*");
    assert_eq!(queued["jobs"], json!([]), "nothing left: {queued}");

    // The ledger's increments from three servers add up.
    // A window of three days around now, whatever the hour.
    let day = |offset: i64| {
        (chrono::Utc::now() + chrono::Duration::days(offset))
            .format("%Y-%m-%d")
            .to_string()
    };
    let (status, stats) = servers[1].api().get(&format!(
        "/stats?name=stress/*&period=day&from={}&to={}",
        day(-1),
        day(2)
    ));
    assert_eq!(status, 200, "{stats}");
    let total = |field: &str| -> u64 {
        stats["series"]
            .as_array()
            .expect("series")
            .iter()
            .filter(|s| s["name"] == name)
            .flat_map(|s| s["points"].as_array().expect("points").clone())
            .map(|p| p[field].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(total("added"), JOBS as u64, "{stats}");
    assert_eq!(total("started"), JOBS as u64, "{stats}");
    assert_eq!(total("finished"), JOBS as u64, "{stats}");
}

#[test]
fn siblings_finished_at_once_through_different_servers_queue_their_parent_once() {
    const FAMILIES: usize = 6;
    const CHILDREN: usize = 16;
    let seed: u64 = std::env::var("SHARED_STORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (SHARED_STORE_SEED reruns it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let servers = servers(3);
    let apis: Arc<Vec<_>> = Arc::new(servers.iter().map(Server::api).collect());
    let mut violations = Vec::new();
    for family in 0..FAMILIES {
        let name = format!("family-{family}");
        let parent = apis[0].create(json!({"name": name}));
        let held = apis[1].take(&name);
        assert_eq!(held["jobID"], parent);
        let children: Vec<i64> = (0..CHILDREN)
            .map(|i| {
                apis[rng.random_range(0..apis.len())].create(json!({
                    "name": format!("{name}/child"), "parentJobID": parent, "data": {"i": i}
                }))
            })
            .collect();
        let (status, answer) = apis[2].post(
            &format!("/jobs/{parent}/finish"),
            json!({"lease": held["lease"]}),
        );
        assert_eq!(status, 200, "{answer}");
        // Takers on random servers take and finish children at once, so
        // that claims of some children meet reports of their siblings: the
        // last sibling to finish queues the parent, whichever server it
        // went through.
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let takers: Vec<_> = (0..6)
            .map(|taker| {
                let apis = Arc::clone(&apis);
                let taken = Arc::clone(&taken);
                let mut rng = StdRng::seed_from_u64(rng.random());
                let name = name.clone();
                std::thread::spawn(move || {
                    let mut refused = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while taken.load(std::sync::atomic::Ordering::SeqCst) < CHILDREN
                        && Instant::now() < deadline
                    {
                        let api = &apis[rng.random_range(0..apis.len())];
                        // Two supervisors' names: their registry rows are
                        // written by claims and reports alike.
                        let jobs = api.dequeue(json!({
                            "name": format!("{name}/child"), "numResults": 2, "leaseMs": 600_000,
                            "worker": {"id": format!("sup-{}", taker % 2), "host": "h",
                                       "pid": 1, "capacity": 4, "running": 0},
                        }));
                        for job in jobs {
                            taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let id = job["jobID"].as_i64().expect("jobID");
                            let reporter = &apis[rng.random_range(0..apis.len())];
                            let (status, answer) = reporter.post(
                                &format!("/jobs/{id}/finish"),
                                json!({"lease": job["lease"], "data": {"done": id}}),
                            );
                            if status != 200 {
                                refused.push(format!("finish of {id}: {status} {answer}"));
                            }
                        }
                    }
                    refused
                })
            })
            .collect();
        for taker in takers {
            for refused in taker.join().expect("taker") {
                violations.push(format!("{name}: {refused}"));
            }
        }
        let job = apis[0].job(parent);
        if job["state"] != "QUEUED" {
            violations.push(format!("{name}: parent not queued again: {job}"));
            continue;
        }
        // A claim passes over a row another server's transaction holds
        // (SKIP LOCKED): asked again until it is handed out.
        let resumed = poll("the resumed parent to be handed out", || {
            apis[2].dequeue(json!({"name": name})).into_iter().next()
        });
        assert_eq!(resumed["jobID"], parent);
        let finished = resumed["finishedChildJobs"].as_array().map_or(0, Vec::len);
        if finished != CHILDREN {
            violations.push(format!(
                "{name}: resumed with {finished} finished children of {}: {resumed}",
                children.len()
            ));
        }
    }
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
}
