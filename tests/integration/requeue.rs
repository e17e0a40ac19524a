//! RequeueJobs, and the dashboard's Retry, never hand out again a job that
//! is held: a RUNNING or RUNQUEUED job whose holder's lease still holds
//! (a leased HTTP hand-out, a plain Bedrock hand-out held until reported,
//! a `retryAfter` job, a job a supervisor holds ahead) is refused, with the
//! held ids named, on both fronts, and a request naming several jobs is
//! refused whole when any of them is held. The dashboard offers no Retry on
//! such a job, and refuses the form if it is sent anyway; nor does
//! UpdateJob make a held `retryAfter` job due earlier. A randomized run
//! throws requeues and retries at jobs real supervisors run (some held
//! ahead) and counts runs of one job that overlapped: none may.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::bedrock_conn::Conn;
use crate::common::*;
use crate::ui::{cookie_of, get, log_in};

/// A Bedrock request with the fixtures' token.
fn req(method: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{method}\r\nToken: {}\r\n", token());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// `POST /jobs/requeue` for `ids`.
fn requeue(api: &Api, ids: &[i64]) -> (u16, Value) {
    api.post("/jobs/requeue", json!({ "jobIDs": ids }))
}

/// Bedrock's RequeueJobs for `ids`: its status line.
fn requeue_over_bedrock(conn: &mut Conn, ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    conn.call(&req("RequeueJobs", &[("jobIDs", &list.join(","))]))
        .status
}

/// Asserts a refusal that names every id in `held` and says what to do.
#[track_caller]
fn assert_refused_naming(answer: (u16, Value), held: &[i64]) {
    assert_error(answer.clone(), 409, "requeue_held");
    let message = answer.1["message"].as_str().unwrap_or_default();
    for id in held {
        assert!(message.contains(&id.to_string()), "{message}");
    }
    assert!(message.contains("wait for"), "{message}");
}

#[test]
fn a_requeued_job_counts_its_attempts_and_unreported_hand_outs_afresh() {
    let server = Server::start();
    let api = server.api();
    // Failed after its one attempt: queued again, its next hand-out is
    // attempt 1, not 2 (a supervisor's retry policy would give it no more
    // than one try, once past its --max-attempts).
    let id = api.create(json!({"name": "Requeue/failed"}));
    let held = api.dequeue(json!({"name": "Requeue/failed", "leaseMs": 60_000}));
    assert_eq!(held[0]["attempt"], 1);
    let (status, _) = api.post(
        &format!("/jobs/{id}/fail"),
        json!({"lease": held[0]["lease"]}),
    );
    assert_eq!(status, 200);
    assert_eq!(requeue(&api, &[id]).0, 200);
    let again = api.dequeue(json!({"name": "Requeue/failed", "leaseMs": 60_000}));
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["attempt"], 1, "attempts count afresh: {again:?}");

    // A retryAfter job worn out by unreported hand-outs: FAILED at its next
    // hand-out; requeued, it is handed out, not failed again at once.
    let worn = api.create(json!({"name": "Requeue/worn", "retryAfter": "+1 HOUR",
                                 "data": {"retryAfterCount": 10}}));
    assert!(api.dequeue(json!({"name": "Requeue/worn"})).is_empty());
    assert_eq!(api.state(worn).as_deref(), Some("FAILED"));
    assert_eq!(requeue(&api, &[worn]).0, 200);
    let handed = api.dequeue(json!({"name": "Requeue/worn"}));
    assert_eq!(handed.len(), 1, "handed out again: {handed:?}");
    assert_eq!(api.state(worn).as_deref(), Some("RUNQUEUED"));
}

/// The job's state and lease, which a refused requeue must leave alone.
fn state_and_lease(api: &Api, id: i64) -> (Value, Value) {
    let job = api.job(id);
    (job["state"].clone(), job["leaseExpires"].clone())
}

#[test]
fn requeue_jobs_on_a_running_job_is_refused_on_both_fronts_and_changes_nothing() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let running = api.create(json!({"name": "Held", "data": {"v": 1}}));
    let taken = api.take("Held");
    assert_eq!(taken["jobID"], running);
    let lease = taken["lease"].clone();
    // A job due later: a requeue would make it due at its creation time.
    let later = api.create(json!({"name": "Later", "firstRun": "2099-01-01 00:00:00"}));
    let before = (
        state_and_lease(&api, running),
        api.job(later)["nextRun"].clone(),
    );

    // Alone, or with a job that could be requeued: refused whole.
    assert_refused_naming(requeue(&api, &[running]), &[running]);
    assert_refused_naming(requeue(&api, &[later, running]), &[running]);
    let status = requeue_over_bedrock(&mut conn, &[later, running]);
    assert!(
        status.starts_with("405 ") && status.contains(&running.to_string()),
        "{status}"
    );
    let after = (
        state_and_lease(&api, running),
        api.job(later)["nextRun"].clone(),
    );
    assert_eq!(after, before, "a refused requeue changed something");

    // The holder's lease still holds: its report is taken.
    let (status, answer) = api.post(
        &format!("/jobs/{running}/finish"),
        json!({ "lease": lease }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.outcomes(running), vec!["finished"]);

    // Happy cases: a queued job, and a failed one, go back at once (over
    // HTTP and Bedrock); an id that is gone counts nothing.
    assert_eq!(
        requeue(&api, &[later, running]),
        (200, json!({"requeued": 1}))
    );
    assert_eq!(api.job(later)["nextRun"], api.job(later)["created"]);
    let failed = api.create(json!({"name": "Fails"}));
    let taken = api.take("Fails");
    let (status, _) = api.post(
        &format!("/jobs/{failed}/fail"),
        json!({ "lease": taken["lease"] }),
    );
    assert_eq!(status, 200);
    assert_eq!(requeue_over_bedrock(&mut conn, &[failed]), "200 OK");
    assert_eq!(api.state(failed).as_deref(), Some("QUEUED"));

    // Hostile: no ids, a bad id; nothing changes.
    assert_error(
        api.post("/jobs/requeue", json!({"jobIDs": []})),
        400,
        "missing_job_ids",
    );
    assert_error(
        api.post("/jobs/requeue", json!({"jobIDs": [0]})),
        400,
        "malformed_job_ids",
    );
}

#[test]
fn requeue_jobs_refuses_runqueued_and_unleased_bedrock_hand_outs() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    // A retryAfter job handed out is RUNQUEUED until its retryAfter passes.
    let runqueued = api.create(json!({"name": "Retryable", "retryAfter": "+1 HOUR"}));
    conn.call(&req("GetJob", &[("name", "Retryable")])).json();
    // A plain Bedrock hand-out is RUNNING until reported, with no lease that
    // lapses.
    let unleased = api.create(json!({"name": "Plain"}));
    conn.call(&req("GetJob", &[("name", "Plain")])).json();
    assert_eq!(api.state(runqueued).as_deref(), Some("RUNQUEUED"));
    assert_eq!(api.state(unleased).as_deref(), Some("RUNNING"));

    assert_refused_naming(
        requeue(&api, &[runqueued, unleased]),
        &[runqueued, unleased],
    );
    let status = requeue_over_bedrock(&mut conn, &[unleased]);
    assert!(status.starts_with("405 "), "{status}");
    assert_eq!(api.state(runqueued).as_deref(), Some("RUNQUEUED"));
    assert_eq!(api.state(unleased).as_deref(), Some("RUNNING"));

    // Nothing more is handed out while they are held.
    let status = conn.call(&req("GetJob", &[("name", "*")])).status;
    assert_eq!(status, "404 No job found");

    // What the refusal says to do: once the job is ended (FailJob, here
    // without a lease, as an operator would), it can be requeued.
    conn.call(&req("FailJob", &[("jobID", &unleased.to_string())]))
        .assert_empty_ok();
    assert_eq!(requeue(&api, &[unleased]), (200, json!({"requeued": 1})));
    assert_eq!(api.state(unleased).as_deref(), Some("QUEUED"));
}

/// A worker that records each run's start in `out/ran-ID` and blocks until
/// `out/release` appears.
fn blocking_worker(out: &Path) -> String {
    let o = out.display();
    sh(&format!(
        r#"cat > /dev/null
echo run >> '{o}'/ran-"$JOBMGR_JOB_ID"
while [ ! -e '{o}/release' ]; do sleep 0.02; done"#
    ))
}

fn runs(out: &Path, id: i64) -> usize {
    std::fs::read_to_string(out.join(format!("ran-{id}")))
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn requeue_jobs_refuses_a_job_a_supervisor_holds_ahead() {
    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().expect("the test's directory");
    let sup = Supervisor::builder(&server.url)
        .worker("Ahead", &blocking_worker(out.path()))
        .arg("--max-workers")
        .arg("1")
        .arg("--fetch-ahead")
        .arg("1")
        .arg("--fetch-ahead-hold")
        .arg("10m")
        .start();
    let running = api.create(json!({"name": "Ahead"}));
    wait_for("the first job to start", &sup, || {
        (runs(out.path(), running) == 1).then_some(())
    });
    let held = api.create(json!({"name": "Ahead"}));
    // Leased to the supervisor, which has no slot to start it in.
    wait_for("the second job to be held ahead", &sup, || {
        (api.state(held).as_deref() == Some("RUNNING")).then_some(())
    });
    assert_eq!(runs(out.path(), held), 0);

    assert_refused_naming(requeue(&api, &[held]), &[held]);
    let mut conn = Conn::open(&server.bedrock);
    assert!(requeue_over_bedrock(&mut conn, &[running, held]).starts_with("405 "));

    // Released, each runs exactly once.
    std::fs::write(out.path().join("release"), "").expect("release");
    for id in [running, held] {
        wait_for(&format!("job {id} to finish"), &sup, || {
            api.state(id).is_none().then_some(())
        });
    }
    assert_eq!((runs(out.path(), running), runs(out.path(), held)), (1, 1));
}

/// The CSRF token in a page's forms.
fn csrf_in(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[start..start + 64].to_string()
}

/// The dashboard's retry form for job `id`, sent with this session: the
/// HTTP status and the page it answered with (a 303 when done).
fn dashboard_retry(base: &str, cookie: &str, csrf: &str, id: i64) -> (u16, String) {
    let response = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
        .post(format!("{base}/ui/jobs/{id}/retry"))
        .header(reqwest::header::COOKIE, cookie)
        .form(&[("csrf", csrf)])
        .send()
        .expect("POST the retry form");
    let status = response.status().as_u16();
    (status, response.text().unwrap_or_default())
}

#[test]
fn the_dashboard_offers_no_retry_on_a_held_job_and_refuses_the_form() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    let cookie = cookie_of(&log_in(base, token()));
    let retry_form = |id: i64| format!("action=\"/ui/jobs/{id}/retry\"");

    let running = api.create(json!({"name": "Held"}));
    let lease = api.take("Held")["lease"].clone();
    let runqueued = api.create(json!({"name": "Retryable", "retryAfter": "+1 HOUR"}));
    api.take("Retryable");
    let queued = api.create(json!({"name": "Waiting", "firstRun": "2099-01-01 00:00:00"}));

    let mut csrf = String::new();
    for id in [running, runqueued] {
        let (status, page) = get(base, &format!("/ui/jobs/{id}"), Some(&cookie));
        assert_eq!(status, 200, "{page}");
        assert!(
            !page.contains(&retry_form(id)),
            "Retry offered on a held job:\n{page}"
        );
        assert!(
            page.contains(&format!("action=\"/ui/jobs/{id}/delete\"")),
            "{page}"
        );
        csrf = csrf_in(&page);
    }
    let (status, page) = get(base, &format!("/ui/jobs/{queued}"), Some(&cookie));
    assert_eq!(status, 200);
    assert!(
        page.contains(&retry_form(queued)),
        "no Retry on a queued job:\n{page}"
    );

    // The form sent anyway (an old page, a hand-made request): refused,
    // saying why, and the jobs stay held.
    for id in [running, runqueued] {
        let (status, page) = dashboard_retry(base, &cookie, &csrf, id);
        assert_eq!(status, 409, "{page}");
        assert!(
            page.contains(&id.to_string()) && page.contains("wait for"),
            "{page}"
        );
    }
    assert_eq!(api.state(running).as_deref(), Some("RUNNING"));
    assert_eq!(api.state(runqueued).as_deref(), Some("RUNQUEUED"));
    let (status, _) = api.post(
        &format!("/jobs/{running}/finish"),
        json!({ "lease": lease }),
    );
    assert_eq!(status, 200, "the holder's lease was dropped");

    // The happy case: a queued job is queued again.
    let (status, page) = dashboard_retry(base, &cookie, &csrf, queued);
    assert_eq!(status, 303, "{page}");
    assert_eq!(api.job(queued)["nextRun"], api.job(queued)["created"]);
}

/// One run of a job as its worker recorded it: start and end, in
/// nanoseconds of the wall clock (`None` for a run that never ended).
type Runs = BTreeMap<i64, Vec<(u128, Option<u128>)>>;

/// Reads the workers' log (`start ID NANOS PID` and `end ID NANOS PID`
/// lines) into each job's runs.
fn read_runs(log: &Path) -> Runs {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: BTreeMap<(i64, u64), u128> = BTreeMap::new();
    let mut runs = Runs::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [what, id, nanos, pid] = fields[..] else {
            panic!("a torn line in the workers' log: {line:?}");
        };
        let (id, nanos, pid): (i64, u128, u64) = (
            id.parse().expect("id"),
            nanos.parse().expect("nanos"),
            pid.parse().expect("pid"),
        );
        match what {
            "start" => {
                open.insert((id, pid), nanos);
            }
            "end" => {
                let start = open.remove(&(id, pid)).expect("an end after its start");
                runs.entry(id).or_default().push((start, Some(nanos)));
            }
            other => panic!("unknown line {other:?}"),
        }
    }
    for ((id, _), start) in open {
        runs.entry(id).or_default().push((start, None));
    }
    runs
}

/// Pairs of runs of one job that overlapped in time, and runs that never
/// ended.
fn violations(runs: &Runs) -> (Vec<String>, usize) {
    let mut overlaps = Vec::new();
    let mut unended = 0;
    for (id, list) in runs {
        let mut list = list.clone();
        list.sort();
        unended += list.iter().filter(|(_, end)| end.is_none()).count();
        for pair in list.windows(2) {
            let end = pair[0].1;
            let next_start = pair[1].0;
            if end.is_none_or(|end| next_start < end) {
                overlaps.push(format!("job {id}: {:?} then {:?}", pair[0], pair[1]));
            }
        }
    }
    (overlaps, unended)
}

#[test]
fn random_requeues_and_dashboard_retries_never_run_a_job_twice_at_once() {
    use rand::{Rng, SeedableRng};
    const JOBS: usize = 12;
    const THROWING: Duration = Duration::from_secs(15);
    let seed: u64 = rand::rng().random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let server = Server::start();
    let api = server.api();
    let out = tempfile::tempdir().expect("the test's directory");
    let log = out.path().join("runs");
    let worker = sh(&format!(
        r#"cat > /dev/null
echo "start $JOBMGR_JOB_ID $(date +%s%N) $$" >> '{log}'
sleep 0.3
echo "end $JOBMGR_JOB_ID $(date +%s%N) $$" >> '{log}'"#,
        log = log.display()
    ));
    // Two supervisors with few slots, each holding jobs ahead.
    let mut sups: Vec<Supervisor> = (0..2)
        .map(|_| {
            Supervisor::builder(&server.url)
                .worker("Busy", &worker)
                .arg("--max-workers")
                .arg("2")
                .arg("--fetch-ahead")
                .arg("2")
                .start()
        })
        .collect();
    // Jobs that run again as soon as they finish; and a third with
    // retryAfter (RUNQUEUED while held), which run again when requeued.
    let ids: Vec<i64> = (0..JOBS)
        .map(|n| {
            api.create(if n % 3 == 0 {
                json!({"name": "Busy", "repeat": "FINISHED, +2 HOURS", "retryAfter": "+1 HOUR"})
            } else {
                json!({"name": "Busy", "repeat": "FINISHED, +0 SECONDS"})
            })
        })
        .collect();

    let base = server.url.clone();
    let cookie = cookie_of(&log_in(&base, token()));
    let (_, page) = get(&base, &format!("/ui/jobs/{}", ids[0]), Some(&cookie));
    let csrf = csrf_in(&page);
    let mut conn = Conn::open(&server.bedrock);
    let (mut accepted, mut refused) = (0usize, 0usize);
    let started = Instant::now();
    while started.elapsed() < THROWING {
        let mut chosen: Vec<i64> = (0..rng.random_range(1..=3))
            .map(|_| ids[rng.random_range(0..ids.len())])
            .collect();
        chosen.dedup();
        let done = match rng.random_range(0..3) {
            0 => match requeue(&api, &chosen) {
                (200, _) => true,
                answer @ (409, _) => {
                    assert_eq!(answer.1["code"], "requeue_held", "{}", answer.1);
                    false
                }
                (status, body) => panic!("requeue: HTTP {status} {body}"),
            },
            1 => {
                let status = requeue_over_bedrock(&mut conn, &chosen);
                assert!(status == "200 OK" || status.starts_with("405 "), "{status}");
                status == "200 OK"
            }
            _ => match dashboard_retry(&base, &cookie, &csrf, chosen[0]) {
                (303, _) => true,
                (409, _) => false,
                (status, page) => panic!("dashboard retry: HTTP {status} {page}"),
            },
        };
        if done {
            accepted += 1;
        } else {
            refused += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..60)));
    }

    // Stop taking jobs and let the running ones end; then no job repeats.
    for sup in &mut sups {
        sup.signal(Signal::SIGTERM);
    }
    for sup in &mut sups {
        let status = sup.wait_exit();
        assert!(status.success(), "{status:?}: {}", sup.stderr());
    }
    let runs = read_runs(&log);
    let total: usize = runs.values().map(Vec::len).sum();
    let (overlaps, unended) = violations(&runs);
    eprintln!(
        "{total} runs of {JOBS} jobs; {accepted} requeues taken, {refused} refused; \
         {} overlapping, {unended} unended",
        overlaps.len()
    );
    assert!(
        overlaps.is_empty(),
        "runs of one job overlapped:\n{}",
        overlaps.join("\n")
    );
    assert_eq!(unended, 0, "a run never ended (stopped for a lost lease?)");
    // The test reached both kinds of job: held (refused) and not.
    assert!(
        refused > 0 && accepted > 0,
        "{accepted} taken, {refused} refused"
    );
    assert_eq!(runs.len(), JOBS, "every job ran: {runs:?}");
}

/// A RUNQUEUED job is handed out again once it is due: UpdateJob moving a
/// held one's nextRun earlier (itself, or through a repeat that sets it)
/// would run it twice at once, and is refused whole on both fronts; a
/// later nextRun, or any once the holder reported, is taken.
#[test]
fn update_job_cannot_make_a_held_retry_after_job_due_while_it_runs() {
    let server = Server::start();
    let api = server.api();
    let mut conn = Conn::open(&server.bedrock);
    let id = api.create(json!({"name": "Retryable", "data": {"v": 1}, "retryAfter": "+1 HOUR"}));
    let taken = api.take("Retryable");
    let held = api.job(id);
    assert_eq!(held["state"], "RUNQUEUED", "{held}");

    let path = format!("/jobs/{id}");
    let earlier = "2020-01-01 00:00:00";
    let answer = api.patch(&path, json!({"data": {"v": 2}, "nextRun": earlier}));
    assert_error(answer.clone(), 409, "next_run_held");
    let message = answer.1["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&id.to_string()) && message.contains("later nextRun"),
        "{message}"
    );
    let answer = api.patch(
        &path,
        json!({"data": {"v": 2}, "repeat": "FINISHED, +1 SECOND"}),
    );
    assert_error(answer, 409, "next_run_held");
    let status = conn
        .call(&req(
            "UpdateJob",
            &[
                ("jobID", &id.to_string()),
                ("data", r#"{"v":2}"#),
                ("nextRun", earlier),
            ],
        ))
        .status;
    assert!(status.starts_with("405 Cannot move job"), "{status}");
    // Nothing changed, and nothing is handed out again.
    let after = api.job(id);
    for field in ["state", "data", "nextRun", "repeat"] {
        assert_eq!(
            after[field], held[field],
            "{field}: held {held}, after {after}"
        );
    }
    let status = conn.call(&req("GetJob", &[("name", "Retryable")])).status;
    assert_eq!(status, "404 No job found");

    // Later is taken while it is held; earlier once its holder reported.
    let later = "2099-01-01 00:00:00";
    let (status, answer) = api.patch(&path, json!({"data": {"v": 3}, "nextRun": later}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(api.job(id)["nextRun"], later);
    let (status, answer) = api.post(
        &format!("/jobs/{id}/retry"),
        json!({"lease": taken["lease"], "delay": 3600}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = api.patch(&path, json!({"data": {"v": 4}, "nextRun": earlier}));
    assert_eq!(status, 200, "{answer}");
}
