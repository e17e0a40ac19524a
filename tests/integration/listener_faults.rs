//! Servers on one PostgreSQL database whose connection that listens for
//! the others' commits is refused or cut (through a fault proxy that tells
//! it by its `application_name`), while their writes go on: a take held on
//! such a server is still served, by the looks it has every waiter take
//! while it does not listen and once listening resumes. These always run
//! on PostgreSQL, whatever `JOBMGR_TEST_STORE` says.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::{FaultProxy, Server, TestDatabase, poll};

/// The `application_name` of a server's listening connection.
const LISTENER: &str = "jobmgr listener";

/// How long a held take waits: far longer than any look may take, and
/// within the test client's two minutes.
const WAIT_MS: u64 = 90_000;

/// How long a take of the randomized test waits: ten times the longest
/// look a server that does not listen lets pass (two seconds).
const STRESS_WAIT_MS: u64 = 20_000;

/// The database's URL through `proxy`.
fn via(database: &TestDatabase, proxy: &FaultProxy) -> String {
    database.url().replace("127.0.0.1:5432", proxy.addr())
}

/// How many GetJob requests a server holds (from `/healthz`).
fn waiting(server: &Server) -> i64 {
    let (_, health) = server.api().get("/healthz");
    health["waiting"].as_i64().unwrap_or(0)
}

/// A server on `database` through a new proxy whose listener connections
/// are refused from the start; once its listener was refused (its writes
/// go through).
fn server_that_cannot_listen(database: &Arc<TestDatabase>) -> (FaultProxy, Server) {
    let proxy = FaultProxy::start_postgres("127.0.0.1:5432");
    proxy.refuse(LISTENER);
    let server = Server::builder()
        .on_database_at(database, &via(database, &proxy))
        .start();
    poll(
        "the server's first listening connection to be refused",
        || (proxy.refusals_of(LISTENER) >= 1).then_some(()),
    );
    (proxy, server)
}

/// Holds a take for `pattern` on `server` (on a thread of its own), and
/// waits until the server holds it.
fn hold_take(server: &Server, pattern: &str) -> std::thread::JoinHandle<Vec<Value>> {
    let api = server.api();
    let body = json!({"name": pattern, "waitMs": WAIT_MS, "leaseMs": 60_000});
    let take = std::thread::spawn(move || api.dequeue(body));
    poll("the take to be held", || {
        (waiting(server) >= 1).then_some(())
    });
    take
}

#[test]
fn a_server_whose_first_listen_failed_hears_what_was_committed_meanwhile_once_it_listens() {
    let database = Arc::new(TestDatabase::create());
    let direct = Server::builder().on_database(&database).start();
    let (proxy, deaf) = server_that_cannot_listen(&database);
    let take = hold_take(&deaf, "gap/*");
    // Committed while the second server hears nothing of it.
    let id = direct.api().create(json!({"name": "gap/one"}));
    proxy.allow(LISTENER);
    let started = Instant::now();
    poll("the held take to be answered", || {
        take.is_finished().then_some(())
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], id);
    eprintln!(
        "served {:?} after listening was let through",
        started.elapsed()
    );
    poll("the server to say it listens", || {
        deaf.stderr()
            .contains("listening for other servers' commits again")
            .then_some(())
    });
    assert_eq!(proxy.connections_of(LISTENER), 1);
}

#[test]
fn a_server_that_cannot_listen_still_serves_a_take_held_on_it_by_looking_every_few_seconds() {
    let database = Arc::new(TestDatabase::create());
    let direct = Server::builder().on_database(&database).start();
    let (proxy, deaf) = server_that_cannot_listen(&database);
    let take = hold_take(&deaf, "deaf/*");
    let id = direct.api().create(json!({"name": "deaf/one"}));
    let created = Instant::now();
    poll("the held take to be answered", || {
        take.is_finished().then_some(())
    });
    let jobs = take.join().expect("the take");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["jobID"], id);
    eprintln!("served {:?} after the create", created.elapsed());
    // Still not listening: the look was the server's own.
    assert_eq!(proxy.connections_of(LISTENER), 0);
    let log = deaf.stderr();
    assert!(
        log.contains("not listening for other servers' commits"),
        "{log}"
    );
}

/// What the fault thread did.
#[derive(Default, Debug)]
struct Faults {
    cuts: usize,
    refusals: usize,
}

/// Until `done`, every 0.2–2 s, to the listener of one of the `faulty`
/// servers: cuts it (it reconnects at once), or refuses it for 0.5–4 s
/// (and cuts it, or lets it be refused when next it reconnects). The first
/// fault is a refusal. Listeners refused from their start (`refused_until`)
/// are let through at the time given.
fn make_faults(
    proxies: &[FaultProxy],
    faulty: &[usize],
    mut refused_until: Vec<Option<Instant>>,
    seed: u64,
    done: &AtomicBool,
) -> Faults {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Faults::default();
    let mut first = true;
    while !done.load(Ordering::SeqCst) {
        let pause = Instant::now() + Duration::from_millis(rng.random_range(200..2000));
        while Instant::now() < pause && !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for (proxy, until) in proxies.iter().zip(refused_until.iter_mut()) {
            if until.is_some_and(|t| Instant::now() >= t) {
                proxy.allow(LISTENER);
                *until = None;
            }
        }
        let victim = faulty[rng.random_range(0..faulty.len())];
        let proxy = &proxies[victim];
        let action = if first { 1 } else { rng.random_range(0..3) };
        first = false;
        if action >= 1 {
            proxy.refuse(LISTENER);
            refused_until[victim] =
                Some(Instant::now() + Duration::from_millis(rng.random_range(500..4000)));
            faults.refusals += 1;
        }
        if action <= 1 {
            faults.cuts += proxy.cut_application(LISTENER);
        }
    }
    for proxy in proxies {
        proxy.allow(LISTENER);
    }
    faults
}

/// One held take and the job made for it, on random servers.
struct Trial {
    /// The server the take is held on.
    waiter: usize,
    /// The server the job is created through.
    creator: usize,
    /// How long after the take the job is created.
    delay: Duration,
    /// Whether the job is due a second or two after it is created.
    later: bool,
}

/// Runs `trial` number `n`: holds a take for a name of its own and creates
/// the job; returns a violation if the take was not handed that job, and
/// how long after the job was due it was served.
fn run_trial(n: usize, trial: &Trial, apis: &[crate::common::Api]) -> (Option<String>, Duration) {
    let name = format!("stress/{n}");
    std::thread::scope(|scope| {
        let creator = &apis[trial.creator];
        let job_name = name.clone();
        let create = scope.spawn(move || {
            std::thread::sleep(trial.delay);
            let mut body = json!({"name": job_name});
            let mut due = Instant::now();
            if trial.later {
                // Whole seconds: due within the next two.
                let at = chrono::Utc::now() + chrono::Duration::seconds(2);
                body["firstRun"] = json!(at.format("%Y-%m-%d %H:%M:%S").to_string());
                due += Duration::from_secs(1);
            }
            (creator.create(body), due)
        });
        let (status, answer) = apis[trial.waiter].post(
            "/dequeue",
            json!({"name": name, "waitMs": STRESS_WAIT_MS, "leaseMs": 60_000}),
        );
        let served = Instant::now();
        let (id, due) = create.join().expect("the create");
        let late = served.saturating_duration_since(due);
        let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
        let violation = if status != 200 {
            Some(format!("take {n}: {status} {answer}"))
        } else if jobs.len() != 1 || jobs[0]["jobID"] != id {
            Some(format!(
                "take {n} on server {} (job {id} created through server {}): not served within \
                 {STRESS_WAIT_MS} ms: {answer}",
                trial.waiter, trial.creator
            ))
        } else {
            None
        };
        (violation, late)
    })
}

#[test]
fn random_listener_faults_on_random_servers_leave_no_held_take_unserved() {
    const TRIALS: usize = 120;
    const AT_ONCE: usize = 8;
    let seed: u64 = std::env::var("LISTENER_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (LISTENER_FAULTS_SEED reruns it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let count = rng.random_range(2..=4);
    let database = Arc::new(TestDatabase::create());
    let proxies: Vec<FaultProxy> = (0..count)
        .map(|_| FaultProxy::start_postgres("127.0.0.1:5432"))
        .collect();
    // The first server starts with its listener refused (its first LISTEN
    // fails; it listens 1–5 s into the run) and has no fault after that;
    // each other server starts so or not, and has faults or not (at least
    // one has).
    let mut faulty: Vec<usize> = (1..count).filter(|_| rng.random_bool(0.5)).collect();
    if faulty.is_empty() {
        faulty.push(rng.random_range(1..count));
    }
    let refused_from_start: Vec<Option<Duration>> = proxies
        .iter()
        .enumerate()
        .map(|(n, proxy)| {
            (n == 0 || rng.random_bool(0.5)).then(|| {
                proxy.refuse(LISTENER);
                Duration::from_millis(rng.random_range(1000..5000))
            })
        })
        .collect();
    let servers: Vec<Server> = proxies
        .iter()
        .map(|proxy| {
            Server::builder()
                .on_database_at(&database, &via(&database, proxy))
                .start()
        })
        .collect();
    let apis: Vec<_> = servers.iter().map(Server::api).collect();
    let trials: Vec<Trial> = (0..TRIALS)
        .map(|_| Trial {
            waiter: rng.random_range(0..count),
            creator: rng.random_range(0..count),
            delay: Duration::from_millis(rng.random_range(0..1500)),
            later: rng.random_ratio(1, 4),
        })
        .collect();
    let fault_seed = rng.random();
    let done = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let violations: Mutex<Vec<String>> = Mutex::default();
    let latest = Mutex::new(Duration::ZERO);
    let started = Instant::now();
    let refused_until = refused_from_start
        .iter()
        .map(|refused| refused.map(|d| started + d))
        .collect();
    let faults = std::thread::scope(|scope| {
        let faults =
            scope.spawn(|| make_faults(&proxies, &faulty, refused_until, fault_seed, &done));
        let runners: Vec<_> = (0..AT_ONCE)
            .map(|_| {
                scope.spawn(|| {
                    loop {
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        let Some(trial) = trials.get(n) else { break };
                        let (violation, late) = run_trial(n, trial, &apis);
                        violations.lock().unwrap().extend(violation);
                        let mut latest = latest.lock().unwrap();
                        *latest = (*latest).max(late);
                    }
                })
            })
            .collect();
        for runner in runners {
            runner.join().expect("a trial runner");
        }
        done.store(true, Ordering::SeqCst);
        faults.join().expect("the fault thread")
    });
    let refused: usize = proxies.iter().map(|p| p.refusals_of(LISTENER)).sum();
    let looked = servers
        .iter()
        .map(|s| {
            s.stderr()
                .matches("not listening for other servers' commits")
                .count()
        })
        .sum::<usize>();
    let deaf_at_start = refused_from_start.iter().flatten().count();
    eprintln!(
        "{count} servers ({deaf_at_start} not listening at start, {} with faults), {TRIALS} \
         takes, {faults:?}, \
         {refused} listener connections refused, {looked} gaps with periodic looks; the latest \
         take served {:?} after its job was due, in {:?}",
        faulty.len(),
        latest.lock().unwrap(),
        started.elapsed()
    );
    let violations = violations.into_inner().unwrap();
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
    assert!(
        faults.refusals >= 1 && refused >= 1,
        "the faults were made: {faults:?}, {refused} refused"
    );
}
