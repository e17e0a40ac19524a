//! A freed throttle slot wakes the held dequeues that can use it, over HTTP
//! against the real server; on PostgreSQL the slot is freed through one
//! server and the dequeue held on another sharing its database. Two
//! regression tests (a freed slot that woke only for the throttle's best
//! held-back job, whatever its name; a rename that freed the slot under the
//! new name) and a randomized stress that counts dequeues left asleep beside
//! a job they could take. Runs on both stores.
//!
//! "Not woken" is told apart from "woken late" by the wait: every held
//! dequeue waits 30 s, and one counts as not woken when it is still held
//! 3 s after a job it could take is due with room in its throttles, far
//! more than any wake-up takes even on a loaded machine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jobmgr::protocol::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::{Api, Server, poll};
use crate::throttles::{encode, fleet, set, throttles};

/// How long a held dequeue waits: one that is not woken comes back empty
/// after it.
const WAIT_MS: u64 = 30_000;

/// How long a held dequeue may sleep beside a job it could take before it
/// counts as not woken.
const BOUND: Duration = Duration::from_secs(3);

/// Rounds of the stress (`FREED_SLOTS_ROUNDS` overrides).
const ROUNDS: usize = 30;

/// How many dequeues the servers hold asleep (from `/healthz`).
fn asleep(servers: &[Server]) -> i64 {
    servers
        .iter()
        .map(|server| {
            let (_, health) = server.api().get("/healthz");
            health["waiting"].as_i64().unwrap_or(0)
        })
        .sum()
}

/// A dequeue for `name` held on `api` in a thread of its own, waiting
/// [`WAIT_MS`]; the thread returns the jobs it was handed.
fn hold(api: Api, name: &str) -> JoinHandle<Vec<Value>> {
    let body = json!({"name": name, "waitMs": WAIT_MS, "leaseMs": 60_000});
    std::thread::spawn(move || api.dequeue(body))
}

fn ids(jobs: &[Value]) -> Vec<i64> {
    jobs.iter()
        .map(|job| job["jobID"].as_i64().expect("jobID"))
        .collect()
}

/// Reports `report` (`finish`, `fail`, `retry`) on a held job, with its
/// lease and `extra` fields; panics unless it succeeds.
fn report(api: &Api, job: &Value, report: &str, extra: Value) {
    let mut body = json!({"lease": job["lease"]});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let (status, answer) = api.post(&format!("/jobs/{}/{report}", job["jobID"]), body);
    assert_eq!(status, 200, "{report} {}: {answer}", job["jobID"]);
}

#[test]
fn a_freed_slot_wakes_a_dequeue_blocked_on_a_lower_ranked_name() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "rank/*", 1);
    api.create(json!({"name": "rank/Holder"}));
    let holder = api.take("rank/Holder");
    // Held back behind the full throttle, the best of them a name nobody
    // waits for.
    api.create(json!({"name": "rank/Best", "priority": 1000}));
    let low = api.create(json!({"name": "rank/Low", "priority": 0}));
    let held = hold(servers[servers.len() - 1].api(), "rank/Low");
    poll("the dequeue for rank/Low to be held", || {
        (asleep(&servers) == 1).then_some(())
    });
    report(&api, &holder, "finish", json!({}));
    let freed = Instant::now();
    let jobs = held.join().expect("the held dequeue");
    assert_eq!(
        ids(&jobs),
        [low],
        "the freed slot did not wake the dequeue held on rank/Low: it came back after {:?} of \
         its {WAIT_MS} ms",
        freed.elapsed()
    );
}

/// RequeueJobs refuses a job while its holder's lease holds (it would run
/// twice at once), so it renames a job that holds a slot only once that
/// lease has lapsed and before the server's timer put the job back: it is
/// asked again until it is taken, or until the lapse put the job back
/// (then the lapse freed the slot). Returns whether the requeue renamed it.
fn requeue_once_its_lease_lapsed(api: &Api, id: &Value, name: &str) -> bool {
    poll("a requeue of a job whose lease lapsed", || {
        let (status, answer) = api.post("/jobs/requeue", json!({"jobIDs": [id], "name": name}));
        match status {
            200 => Some(true),
            409 if api.job(id.as_i64().expect("jobID"))["lapses"].as_i64() >= Some(1) => {
                Some(false)
            }
            409 => {
                assert_eq!(answer["code"], "requeue_held", "{answer}");
                std::thread::sleep(Duration::from_millis(20));
                None
            }
            _ => panic!("requeue {id}: {status} {answer}"),
        }
    })
}

#[test]
fn a_rename_by_retry_or_requeue_frees_the_slot_under_the_old_name() {
    let servers = fleet();
    let api = servers[0].api();
    set(&api, "old/*", 1);
    for how in ["retry", "requeue"] {
        api.create(json!({"name": format!("old/{how}")}));
        // A requeue waits for the lease to lapse: a short one.
        let lease_ms = if how == "retry" { 60_000 } else { 300 };
        let holder = api
            .dequeue(json!({"name": format!("old/{how}"), "leaseMs": lease_ms}))
            .into_iter()
            .next()
            .expect("the holder's job");
        let next = api.create(json!({"name": format!("old/next-{how}")}));
        let held = hold(servers[servers.len() - 1].api(), "old/*");
        poll("the dequeue for old/* to be held", || {
            (asleep(&servers) == 1).then_some(())
        });
        // Out of old/*: the job no longer holds that throttle's slot.
        let renamed = format!("new/{how}");
        let by_rename = if how == "retry" {
            report(&api, &holder, "retry", json!({"delay": 0, "name": renamed}));
            true
        } else {
            requeue_once_its_lease_lapsed(&api, &holder["jobID"], &renamed)
        };
        let freed = Instant::now();
        let jobs = held.join().expect("the held dequeue");
        // The lapse, when it came first, put the holder's job back under
        // old/*, where the woken dequeue may take it before the next one.
        let expected = if by_rename {
            vec![next]
        } else {
            vec![next, holder["jobID"].as_i64().expect("jobID")]
        };
        assert!(
            jobs.len() == 1 && expected.contains(&ids(&jobs)[0]),
            "{how} renamed the held job out of old/* (or its lease lapsed), but the dequeue \
             held on old/* was not woken for {expected:?}: it came back with {:?} after {:?} of \
             its {WAIT_MS} ms",
            ids(&jobs),
            freed.elapsed()
        );
        report(&api, &jobs[0], "finish", json!({}));
    }
}

/// What the stress does to a job it holds: each way of freeing a slot, or
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Held to the end of the round.
    Keep,
    Finish,
    Fail,
    /// RetryJob due now, under another name.
    RetryRenamed,
    /// RequeueJobs under another name, once its short lease lapsed
    /// (RequeueJobs refuses a job whose holder's lease holds).
    RequeueRenamed,
    /// DeleteJob, of a `retryAfter` job handed out (RUNQUEUED).
    Delete,
    /// Its lease lapses.
    Lapse,
    /// A `retryAfter` job handed out, due again a second later: its slot is
    /// freed by time, with no write.
    DueAgain,
}

const EVENTS: [Event; 8] = [
    Event::Keep,
    Event::Finish,
    Event::Fail,
    Event::RetryRenamed,
    Event::RequeueRenamed,
    Event::Delete,
    Event::Lapse,
    Event::DueAgain,
];

/// A job the stress holds, and what it will do to it.
struct Holder {
    job: Value,
    event: Event,
}

/// A dequeue the stress holds: its pattern, its answer once it came, and
/// since when a job it could take is due with room.
struct Held {
    pattern: String,
    answer: Arc<Mutex<Option<Vec<Value>>>>,
    takeable_since: Option<Instant>,
    counted: bool,
}

/// A GLOB as the stress writes them: a literal, or a literal prefix and `*`.
fn matches(glob: &str, name: &str) -> bool {
    match glob.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => glob == name,
    }
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970");
    i64::try_from(since.as_millis()).expect("ms fit")
}

/// The jobs of a round as the server shows them (finished ones are gone),
/// and its throttles as `(glob, max, running)`.
fn look(api: &Api, jobs: &[i64], prefix: &str) -> (Vec<Value>, Vec<(String, i64, i64)>) {
    let views = jobs
        .iter()
        .filter_map(|id| {
            let (status, job) = api.get(&format!("/jobs/{id}"));
            (status == 200).then_some(job)
        })
        .collect();
    let throttles = throttles(api)
        .into_iter()
        .filter(|(glob, _)| glob.starts_with(prefix))
        .map(|(glob, (max, running))| (glob, max, running))
        .collect();
    (views, throttles)
}

/// Whether a job is due at `now` (ms).
fn due(job: &Value, now: i64) -> bool {
    let next_run = job["nextRun"]
        .as_str()
        .and_then(Timestamp::parse)
        .map_or(i64::MAX, |t| t.0);
    match job["state"].as_str() {
        Some("QUEUED") => next_run <= now,
        Some("RUNQUEUED") => next_run <= now,
        _ => false,
    }
}

/// Whether a RUNQUEUED job is due within the next ten seconds: its slot
/// is freed by time, soon.
fn due_soon(job: &Value, now: i64) -> bool {
    job["state"] == "RUNQUEUED"
        && job["nextRun"]
            .as_str()
            .and_then(Timestamp::parse)
            .is_some_and(|t| t.0 > now && t.0 <= now + 10_000)
}

/// The shared state of the stress: every dequeue it holds, over all rounds.
struct Stress {
    servers: Vec<Server>,
    apis: Vec<Api>,
    /// Dequeues sent and not answered yet.
    outstanding: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
    violations: Vec<String>,
    /// Dequeues asleep when their round's slots were freed, and how many
    /// of them were then handed a job.
    parked: usize,
    woken: usize,
}

impl Stress {
    fn api(&self, rng: &mut StdRng) -> &Api {
        pick(rng, &self.apis)
    }

    /// Takes one job of `name` under a lease of `lease_ms`, if one is
    /// handed out.
    fn take(&self, rng: &mut StdRng, name: &str, lease_ms: u64) -> Option<Value> {
        let jobs = self
            .api(rng)
            .dequeue(json!({"name": name, "leaseMs": lease_ms}));
        jobs.into_iter().next()
    }

    /// Sends a dequeue held up to [`WAIT_MS`] from a thread of its own.
    fn hold(&mut self, rng: &mut StdRng, pattern: &str) -> Held {
        let api = self.api(rng).clone();
        let answer = Arc::new(Mutex::new(None));
        let body = json!({
            "name": pattern,
            "numResults": rng.random_range(1..=2),
            "waitMs": WAIT_MS,
            "leaseMs": 60_000,
        });
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        let (outstanding, answered) = (Arc::clone(&self.outstanding), Arc::clone(&answer));
        self.threads.push(std::thread::spawn(move || {
            let jobs = api.dequeue(body);
            *answered.lock().unwrap() = Some(jobs);
            outstanding.fetch_sub(1, Ordering::SeqCst);
        }));
        Held {
            pattern: pattern.to_string(),
            answer,
            takeable_since: None,
            counted: false,
        }
    }

    /// Waits until every dequeue sent is asleep on its server or answered.
    fn settle_dequeues(&self) {
        poll("every held dequeue to be asleep or answered", || {
            let outstanding = self.outstanding.load(Ordering::SeqCst) as i64;
            (asleep(&self.servers) == outstanding).then_some(())
        });
    }

    /// Does to a held job what its event says.
    fn free(&self, rng: &mut StdRng, holder: &Holder, names: &[String]) {
        let api = self.api(rng);
        let id = &holder.job["jobID"];
        let renamed = pick(rng, names).clone();
        match holder.event {
            Event::Keep | Event::Lapse | Event::DueAgain => {}
            Event::Finish => report(api, &holder.job, "finish", json!({})),
            Event::Fail => report(api, &holder.job, "fail", json!({})),
            Event::RetryRenamed => report(
                api,
                &holder.job,
                "retry",
                json!({"delay": 0, "name": renamed}),
            ),
            Event::RequeueRenamed => {
                requeue_once_its_lease_lapsed(api, id, &renamed);
            }
            Event::Delete => {
                let (status, answer) = api.delete(&format!("/jobs/{id}"));
                assert_eq!(status, 200, "delete {id}: {answer}");
            }
        }
    }

    /// Watches the round's held dequeues until none could take a job and
    /// no slot is about to be freed by time, counting each dequeue held
    /// [`BOUND`] beside a job it could take.
    fn watch(&mut self, round: usize, prefix: &str, jobs: &[i64], held: &mut [Held]) {
        let started = Instant::now();
        loop {
            let (views, throttles) = look(&self.apis[0], jobs, prefix);
            let now = now_ms();
            let room = |name: &str| {
                throttles
                    .iter()
                    .filter(|(glob, _, _)| matches(glob, name))
                    .all(|(_, max, running)| running < max)
            };
            let mut any = false;
            for dequeue in held.iter_mut() {
                if dequeue.counted || dequeue.answer.lock().unwrap().is_some() {
                    continue;
                }
                let takeable: Vec<&Value> = views
                    .iter()
                    .filter(|job| {
                        let name = job["name"].as_str().unwrap_or_default();
                        due(job, now) && matches(&dequeue.pattern, name) && room(name)
                    })
                    .collect();
                if takeable.is_empty() {
                    dequeue.takeable_since = None;
                    continue;
                }
                any = true;
                let since = *dequeue.takeable_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= BOUND {
                    dequeue.counted = true;
                    let jobs: Vec<String> = takeable
                        .iter()
                        .map(|job| format!("{} {}", job["jobID"], job["name"]))
                        .collect();
                    self.violations.push(format!(
                        "round {round}: the dequeue for {} slept {:?} beside {jobs:?}, \
                         throttles {throttles:?}",
                        dequeue.pattern,
                        since.elapsed()
                    ));
                }
            }
            let soon = views.iter().any(|job| due_soon(job, now));
            if !any && !soon {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "round {round} never settled: jobs {views:?}, throttles {throttles:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One round under names of its own: throttles filled by held jobs, more
    /// jobs held back behind them, dequeues held on various GLOBs, then
    /// slots freed in every way at random.
    fn round(&mut self, round: usize, rng: &mut StdRng) {
        let prefix = format!("fs{round}");
        let names: Vec<String> = ["a1", "a2", "ab1", "ab2", "b1", "c1"]
            .iter()
            .map(|n| format!("{prefix}/{n}"))
            .collect();
        let mut globs: Vec<String> = ["a*", "ab*", "b*", "*", "a1"]
            .iter()
            .map(|g| format!("{prefix}/{g}"))
            .collect();
        for i in (1..globs.len()).rev() {
            globs.swap(i, rng.random_range(0..=i));
        }
        globs.truncate(rng.random_range(1..=3));
        let caps: Vec<i64> = globs.iter().map(|_| rng.random_range(1..=2)).collect();
        for (glob, cap) in globs.iter().zip(&caps) {
            set(&self.apis[0], glob, *cap);
        }
        let mut jobs = Vec::new();
        let mut events = HashMap::new();
        let mut holders = Vec::new();
        // Each throttle filled with held jobs of names it matches.
        for (glob, cap) in globs.iter().zip(&caps) {
            let under: Vec<String> = names.iter().filter(|n| matches(glob, n)).cloned().collect();
            for _ in 0..*cap {
                let name = pick(rng, &under).clone();
                let event = *pick(rng, &EVENTS);
                let mut job = json!({"name": name, "priority": *pick(rng, &[0, 500, 1000])});
                match event {
                    Event::Delete => job["retryAfter"] = json!("+1 HOURS"),
                    Event::DueAgain => job["retryAfter"] = json!("+1 SECONDS"),
                    _ => {}
                }
                let id = self.api(rng).create(job);
                jobs.push(id);
                events.insert(id, event);
                // A requeue waits for its holder's lease to lapse.
                let lease = match event {
                    Event::Lapse | Event::RequeueRenamed => 300,
                    _ => 60_000,
                };
                // The best job of the name: this one, or one of its name
                // created before and not taken (a throttle was full). A
                // `retryAfter` job's lease lasts until it is due again.
                if let Some(job) = self.take(rng, &name, lease) {
                    let event = match events[&job["jobID"].as_i64().expect("jobID")] {
                        Event::Delete => Event::Delete,
                        Event::DueAgain => Event::DueAgain,
                        // Lapse or RequeueRenamed: the lease was chosen for it.
                        _ if lease < 60_000 => event,
                        Event::Lapse | Event::RequeueRenamed => Event::Keep,
                        other => other,
                    };
                    holders.push(Holder { job, event });
                }
            }
        }
        for _ in 0..rng.random_range(3..=7) {
            let name = pick(rng, &names).clone();
            let priority = *pick(rng, &[0, 500, 1000]);
            jobs.push(
                self.api(rng)
                    .create(json!({"name": name, "priority": priority})),
            );
        }
        let patterns: Vec<String> = ["*", "a*", "ab*", "b*", "a1", "a2", "ab1", "ab2", "b1"]
            .iter()
            .map(|p| format!("{prefix}/{p}"))
            .collect();
        let mut held: Vec<Held> = (0..rng.random_range(2..=5))
            .map(|_| {
                let pattern = pick(rng, &patterns).clone();
                self.hold(rng, &pattern)
            })
            .collect();
        self.settle_dequeues();
        let parked: Vec<bool> = held
            .iter()
            .map(|h| h.answer.lock().unwrap().is_none())
            .collect();
        self.parked += parked.iter().filter(|p| **p).count();
        // Renamed into another throttle, out of every one, or the same.
        let mut renames = names.clone();
        renames.push(format!("{prefix}/zz"));
        for holder in &holders {
            std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
            self.free(rng, holder, &renames);
        }
        if rng.random_bool(0.2) {
            let glob = pick(rng, &globs).clone();
            if rng.random_bool(0.5) {
                set(self.api(rng), &glob, 3);
            } else {
                let (status, answer) = self
                    .api(rng)
                    .delete(&format!("/throttles/{}", encode(&glob)));
                assert_eq!(status, 200, "{answer}");
            }
        }
        // Lapses take the server's timer: watched once they happened.
        for holder in holders.iter().filter(|h| h.event == Event::Lapse) {
            let id = holder.job["jobID"].as_i64().expect("jobID");
            poll("a lease to lapse", || {
                (self.apis[0].job(id)["lapses"].as_i64() >= Some(1)).then_some(())
            });
        }
        self.watch(round, &prefix, &jobs, &mut held);
        self.woken += held
            .iter()
            .zip(&parked)
            .filter(|(h, parked)| {
                **parked
                    && h.answer
                        .lock()
                        .unwrap()
                        .as_ref()
                        .is_some_and(|a| !a.is_empty())
            })
            .count();
    }
}

#[test]
fn randomized_freed_slots_never_leave_a_dequeue_asleep_beside_a_job_it_could_take() {
    let seed: u64 = std::env::var("FREED_SLOTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let rounds = std::env::var("FREED_SLOTS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS);
    eprintln!("seed {seed} (FREED_SLOTS_SEED reruns it), {rounds} rounds");
    let servers = fleet();
    let apis = servers.iter().map(Server::api).collect();
    let mut stress = Stress {
        servers,
        apis,
        outstanding: Arc::default(),
        threads: Vec::new(),
        violations: Vec::new(),
        parked: 0,
        woken: 0,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        stress.round(round, &mut rng);
    }
    // The dequeues still held come back empty once their wait ends.
    for thread in std::mem::take(&mut stress.threads) {
        thread.join().expect("a held dequeue");
    }
    eprintln!(
        "{} dequeues asleep when slots were freed, {} of them then handed a job, {} not woken",
        stress.parked,
        stress.woken,
        stress.violations.len()
    );
    assert!(
        stress.violations.is_empty(),
        "{} held dequeues not woken for a job they could take (seed {seed}): {:#?}",
        stress.violations.len(),
        stress.violations
    );
}
