//! Fetch-ahead (`--fetch-ahead N`, `--fetch-ahead-hold`): while every
//! worker slot is taken, the supervisor holds up to N more jobs, leased to
//! it but not started, and a freed slot passes to the oldest of them. This
//! file owns what that promises against the real binary: a held job starts
//! only in a freed slot (never beside `--max-workers`); it goes back to the
//! queue exactly as it was (HandBackJob: QUEUED, no attempt counted) when
//! its hold expires, when its slot comes with the machine's gate closed,
//! and at once on a drain; the status board and log say so; and settings
//! out of range are refused. A randomized run checks that through all of
//! it no job is run twice or lost.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::*;

/// The job (and worker) name of the blocking tests. It must not contain
/// "held", which the status text is searched for.
const WORKER: &str = "Ahead";

/// The log line of every hand-back of a held job; the reason follows it.
const HANDED_BACK: &str = "held job handed back";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A directory the test controls: `ran-ID` (one line per run, the
/// attempt), `done-ID` (the worker ended by release), `counts` (how many
/// workers each saw running as it started), and the release files.
fn workdir() -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("the test's directory");
    std::fs::create_dir(out.path().join("running")).expect("running/");
    out
}

/// A worker that reads its job, records its run, and blocks until
/// `release-ID` or `release-all` appears in `out`.
fn blocking_worker(out: &Path) -> String {
    let o = out.display();
    sh(&format!(
        r#"cat > /dev/null
d='{o}'
echo "$JOBMGR_ATTEMPT" >> "$d/ran-$JOBMGR_JOB_ID"
mkdir "$d/running/$JOBMGR_JOB_ID"
ls "$d/running" | wc -l >> "$d/counts"
while [ ! -e "$d/release-$JOBMGR_JOB_ID" ] && [ ! -e "$d/release-all" ]; do sleep 0.02; done
rmdir "$d/running/$JOBMGR_JOB_ID"
touch "$d/done-$JOBMGR_JOB_ID""#
    ))
}

/// `builder` with the arguments in `flags` (split at spaces).
fn with_flags(builder: SupervisorBuilder, flags: &str) -> SupervisorBuilder {
    flags.split_whitespace().fold(builder, |b, arg| b.arg(arg))
}

/// A supervisor of `server` with one slot and one job held ahead, running
/// [`blocking_worker`]s, with `flags` besides.
fn one_slot_one_ahead(server: &Server, out: &Path, flags: &str) -> Supervisor {
    let builder = Supervisor::builder(&server.url).worker(WORKER, &blocking_worker(out));
    with_flags(builder, &format!("--max-workers 1 --fetch-ahead 1 {flags}")).start()
}

/// As [`one_slot_one_ahead`], once a first job runs (blocked) and a
/// second is held: the supervisor, the running job and the held one.
fn running_and_held(server: &Server, out: &Path, flags: &str) -> (Supervisor, i64, i64) {
    let api = server.api();
    let sup = one_slot_one_ahead(server, out, flags);
    let running = api.create(json!({ "name": WORKER }));
    wait_started(&sup, out, running, "the first job to start");
    let held = api.create(json!({ "name": WORKER }));
    wait_held(&api, &sup, held);
    (sup, running, held)
}

fn started(out: &Path, id: i64) -> bool {
    out.join(format!("ran-{id}")).exists()
}

/// Whether the job's worker ended by release.
fn done(out: &Path, id: i64) -> bool {
    out.join(format!("done-{id}")).exists()
}

fn wait_started(sup: &Supervisor, out: &Path, id: i64, what: &str) {
    wait_for(what, sup, || started(out, id).then_some(()));
}

fn release(out: &Path, id: i64) {
    std::fs::write(out.join(format!("release-{id}")), "").expect("release file");
}

/// The attempts a job's worker saw, one per run.
fn runs(out: &Path, id: i64) -> Vec<String> {
    std::fs::read_to_string(out.join(format!("ran-{id}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The job's entry on the supervisor's status board (its status file,
/// `status.json` beside the spool), if the file is there and lists it.
fn board_entry(sup: &Supervisor, id: i64) -> Option<Value> {
    let text = std::fs::read_to_string(sup.dir.path().join("status.json")).ok()?;
    let status: Value = serde_json::from_str(&text).ok()?;
    status["pools"][0]["running"].get(id.to_string()).cloned()
}

/// Whether the board shows the job held: `held: true`, no worker pid.
fn board_held(sup: &Supervisor, id: i64) -> bool {
    board_entry(sup, id).is_some_and(|e| e["held"] == true && e["pid"].is_null())
}

/// Waits until the job is held: on the board, and leased on the server.
fn wait_held(api: &Api, sup: &Supervisor, id: i64) {
    wait_for(&format!("job {id} to be held"), sup, || {
        (board_held(sup, id) && api.state(id).as_deref() == Some("RUNNING")).then_some(())
    });
}

/// Waits until the job is finished (and so deleted from the server).
fn wait_gone(api: &Api, sup: &Supervisor, id: i64) {
    wait_for(&format!("job {id} to finish"), sup, || {
        api.state(id).is_none().then_some(())
    });
}

/// The supervisor's log lines saying a held job was handed back for
/// `reason`.
fn hand_backs(sup: &Supervisor, reason: &str) -> usize {
    sup.stderr()
        .lines()
        .filter(|l| l.contains(HANDED_BACK) && l.contains(reason))
        .count()
}

fn wait_hand_back(sup: &Supervisor, reason: &str) {
    let what = format!("the log to say {HANDED_BACK:?}: {reason:?}");
    wait_for(&what, sup, || (hand_backs(sup, reason) >= 1).then_some(()));
}

/// Asserts a handed-back job is as before its hand-out: queued, no attempt
/// counted, never run.
#[track_caller]
fn assert_back_as_it_was(api: &Api, out: &Path, id: i64) {
    let job = api.job(id);
    assert_eq!(job["state"], "QUEUED", "{job}");
    assert_eq!(job["attempts"], 0, "an attempt was counted: {job}");
    assert!(!started(out, id), "job {id} went back, yet ran");
}

/// `jobmgr status` for the supervisor (text, or `--json`): its stdout.
fn status_command(sup: &Supervisor, json: bool) -> String {
    let mut command = Command::new(bin());
    command.arg("status").arg("--spool-dir").arg(sup.spool());
    if json {
        command.arg("--json");
    }
    let output = command
        .env_remove("JOBMGR_STATUS_FILE")
        .run_bounded("jobmgr status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "jobmgr status: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The line of `jobmgr status`'s table for the job.
fn status_line(text: &str, id: i64) -> String {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(id.to_string().as_str()))
        .unwrap_or_else(|| panic!("no line for job {id} in:\n{text}"))
        .to_string()
}

/// Polls `check` every 20 ms for up to `limit`; whether it held. For the
/// randomized test, which reports what it finds instead of panicking.
fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

// ---------------------------------------------------------------------------
// A held job takes the next freed slot
// ---------------------------------------------------------------------------

/// One slot, one held: of three jobs one runs, one is held (leased to the
/// supervisor, on its board as held, not started) and one waits on the
/// server. The freed slot goes to the held job, and the third is held in
/// its place; each runs once, one at a time.
#[test]
fn a_held_job_starts_when_a_slot_frees_and_never_beside_max_workers() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let sup = one_slot_one_ahead(&server, o, "--fetch-ahead-hold 60s");
    let ids = api.create_batch(vec![json!({ "name": WORKER }); 3]);

    // Stable once reached: the running job blocks, the hold lasts 60 s.
    let (first, held, third) = wait_for("one job running, one held, one queued", &sup, || {
        let pick = |f: &dyn Fn(i64) -> bool| -> Vec<i64> {
            ids.iter().copied().filter(|&id| f(id)).collect()
        };
        let running = pick(&|id| started(o, id));
        let held = pick(&|id| board_held(&sup, id));
        let queued = pick(&|id| api.state(id).as_deref() == Some("QUEUED"));
        match (running.as_slice(), held.as_slice(), queued.as_slice()) {
            (&[a], &[b], &[c])
                if a != b && b != c && a != c && api.state(b).as_deref() == Some("RUNNING") =>
            {
                Some((a, b, c))
            }
            _ => None,
        }
    });
    // The board tells them apart: the running one has its worker's pid.
    wait_for("the board to show the running job's worker", &sup, || {
        board_entry(&sup, first).filter(|e| e["pid"].is_u64())
    });
    let board: Value = serde_json::from_str(&status_command(&sup, true)).expect("status --json");
    let running = &board["pools"][0]["running"];
    assert_eq!(running[first.to_string()]["held"], false, "{board}");
    assert_eq!(running[held.to_string()]["held"], true, "{board}");
    assert!(running[held.to_string()]["pid"].is_null(), "{board}");
    assert!(running.get(third.to_string()).is_none(), "{board}");
    let text = status_command(&sup, false);
    assert!(status_line(&text, held).contains("held"), "{text}");
    assert!(!status_line(&text, first).contains("held"), "{text}");

    release(o, first);
    wait_started(&sup, o, held, "the held job to start in the freed slot");
    wait_held(&api, &sup, third);
    assert!(
        !started(o, third),
        "the third job started beside the second"
    );
    wait_gone(&api, &sup, first);

    std::fs::write(o.join("release-all"), "").expect("release-all");
    for &id in &ids {
        wait_gone(&api, &sup, id);
        assert_eq!(runs(o, id), ["1"], "job {id}: runs, by attempt");
    }
    let counts = std::fs::read_to_string(o.join("counts")).expect("counts");
    let beside = counts.lines().any(|n| n.trim() != "1");
    assert!(!beside, "workers side by side, --max-workers 1: {counts:?}");
}

// ---------------------------------------------------------------------------
// Hand-backs: hold expired, gate closed, draining
// ---------------------------------------------------------------------------

/// A held job that gets no slot within `--fetch-ahead-hold` goes back
/// exactly as it was, once; nothing is fetched ahead again while no slot
/// frees; when it finally runs, it is its first attempt.
#[test]
fn a_held_job_that_gets_no_slot_in_time_goes_back_once_as_it_was() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let flags = "--fetch-ahead-hold 300ms --metrics 127.0.0.1:0";
    let sup = one_slot_one_ahead(&server, o, flags);
    let long = api.create(json!({ "name": WORKER }));
    wait_started(&sup, o, long, "the long job to start");
    let late = api.create(json!({ "name": WORKER }));
    wait_hand_back(&sup, "no slot freed within");
    wait_state(&api, &sup, late, "QUEUED");
    assert_back_as_it_was(&api, o, late);

    // A check that something does NOT happen, so a fixed observation
    // window (~2 s, six holds long): the job is not fetched ahead again
    // while the long job holds the only slot.
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(2) {
        let state = api.state(late);
        assert_eq!(
            state.as_deref(),
            Some("QUEUED"),
            "fetched again; {}",
            sup.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = scrape(&sup.ready_field("metrics"));
    let expired = ["pool=\"main\"", "reason=\"hold_expired\""];
    assert_eq!(
        sample(&metrics, "jobmgr_jobs_handed_back_total", &expired),
        Some(1.0),
        "{metrics}"
    );
    let expiries = hand_backs(&sup, "no slot freed within");
    assert_eq!(expiries, 1, "{}", sup.logs());
    assert_eq!(api.state(long).as_deref(), Some("RUNNING"));

    release(o, long);
    wait_started(&sup, o, late, "the handed-back job to run");
    release(o, late);
    wait_gone(&api, &sup, late);
    assert_eq!(runs(o, late), ["1"], "JOBMGR_ATTEMPT of its run");
    assert!(done(o, long), "the long job was not let finish");
}

/// SIGTERM: the held job goes back at once, not at the drain timeout (60 s
/// here, beyond every wait), while the running job is let finish.
#[test]
fn a_drain_hands_held_jobs_back_at_once_and_lets_the_running_one_finish() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let flags = "--fetch-ahead-hold 60s --drain-timeout 60s";
    let (mut sup, running, held) = running_and_held(&server, o, flags);

    sup.signal(Signal::SIGTERM);
    wait_state(&api, &sup, held, "QUEUED");
    wait_hand_back(&sup, "draining");
    // Still blocked: leased, and its worker has not ended (it writes
    // done-ID only once released, so a worker the drain stopped never does).
    let state = api.state(running);
    assert_eq!(state.as_deref(), Some("RUNNING"), "{}", sup.logs());
    assert!(!done(o, running), "the running job's worker ended");
    assert_back_as_it_was(&api, o, held);

    release(o, running);
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}; {}", sup.logs());
    assert!(done(o, running), "the running job was stopped");
    assert_eq!(api.state(running), None, "not reported finished");
    assert_back_as_it_was(&api, o, held);
}

/// Quiet (SIGTSTP) takes no more jobs: the held one goes back at once,
/// the running one runs on to its end, and the held one is not taken again.
#[test]
fn quiet_hands_held_jobs_back_and_lets_the_running_one_finish() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let (sup, running, held) = running_and_held(&server, o, "--fetch-ahead-hold 60s");

    sup.signal(Signal::SIGTSTP);
    wait_state(&api, &sup, held, "QUEUED");
    wait_hand_back(&sup, "quiet");
    assert!(!done(o, running), "the running job's worker ended");
    release(o, running);
    wait_gone(&api, &sup, running);
    // Quiet for good: the job that went back stays queued.
    assert_back_as_it_was(&api, o, held);
}

/// Over Bedrock's protocol a job could not go back exactly (a real
/// Bedrock has no HandBackJob): the supervisor says fetch-ahead is off and
/// holds nothing.
#[test]
fn over_bedrocks_protocol_nothing_is_held_ahead() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let url = format!("bedrock://{}", server.bedrock);
    let builder = Supervisor::builder(&url).worker(WORKER, &blocking_worker(o));
    let sup = with_flags(builder, "--max-workers 1 --fetch-ahead 1").start();
    wait_for("the supervisor to say fetch-ahead is off", &sup, || {
        sup.stderr().contains("fetch-ahead is off").then_some(())
    });
    let running = api.create(json!({ "name": WORKER }));
    wait_started(&sup, o, running, "the first job to start");
    let next = api.create(json!({ "name": WORKER }));
    // A "does not happen" check: for 2 s the second job stays queued and
    // off the board.
    let taken = wait_until(Duration::from_secs(2), || {
        api.state(next).as_deref() != Some("QUEUED") || board_entry(&sup, next).is_some()
    });
    assert!(!taken, "the second job was taken ahead: {}", sup.logs());
    release(o, running);
    wait_started(&sup, o, next, "the second job to start once the slot freed");
    release(o, next);
    wait_gone(&api, &sup, next);
}

/// The slot comes, but the load is over `--max-load` by then (the fake
/// load file): the held job goes back instead of starting. Once the load
/// drops it runs, as its first attempt.
#[test]
fn a_held_job_whose_slot_comes_with_the_gate_closed_goes_back_instead_of_starting() {
    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let o = out.path();
    let flags = "--fetch-ahead-hold 60s --max-load 5";
    let (sup, running, held) = running_and_held(&server, o, flags);

    sup.set_load(50.0);
    // Once the gate has read load 50 it drops the reading it keeps, so
    // every reading after, the held job's among them, sees load 50.
    wait_for("the gate to close for the load", &sup, || {
        let text = std::fs::read_to_string(sup.dir.path().join("status.json")).ok()?;
        let status: Value = serde_json::from_str(&text).ok()?;
        (status["pools"][0]["gate"] == "load").then_some(())
    });
    release(o, running);
    wait_hand_back(&sup, "the gate closed");
    wait_state(&api, &sup, held, "QUEUED");
    wait_gone(&api, &sup, running);
    // The gate stays closed, so nothing takes it again before this.
    assert_back_as_it_was(&api, o, held);

    sup.set_load(0.0);
    wait_started(&sup, o, held, "the job to run once the load drops");
    release(o, held);
    wait_gone(&api, &sup, held);
    assert_eq!(runs(o, held), ["1"], "JOBMGR_ATTEMPT of its run");
}

// ---------------------------------------------------------------------------
// Randomized: the cap and never twice, never lost, through hand-backs
// ---------------------------------------------------------------------------

/// A xorshift64 generator: small, seedable, so that a failing run can be
/// replayed (`FETCH_AHEAD_SEED=…`).
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // Seeds from the clock differ in their low bits: mixed (splitmix64's
        // finaliser) so that the first draws differ too.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        XorShift((z ^ (z >> 31)).max(1))
    }

    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}

/// A worker that sleeps its job's `sleep_ms`, appending `start ID NS
/// ATTEMPT` and, just before it exits, `end ID NS` to `log` (short lines
/// under O_APPEND: each lands whole).
fn stress_worker(log: &Path) -> String {
    let l = log.display();
    sh(&format!(
        r#"ms=$(sed -n 's/.*"sleep_ms": *\([0-9]*\).*/\1/p')
echo "start $JOBMGR_JOB_ID $(date +%s%N) $JOBMGR_ATTEMPT" >> '{l}'
sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
echo "end $JOBMGR_JOB_ID $(date +%s%N)" >> '{l}'"#
    ))
}

/// One parsed line of the stress log.
struct Event {
    start: bool,
    id: i64,
    ns: u128,
    attempt: String,
}

fn events(log: &Path) -> Vec<Event> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let parsed = match f.as_slice() {
                [kind @ ("start" | "end"), id, ns, rest @ ..] => {
                    id.parse().ok().zip(ns.parse().ok()).map(|(id, ns)| Event {
                        start: *kind == "start",
                        id,
                        ns,
                        attempt: rest.first().unwrap_or(&"").to_string(),
                    })
                }
                _ => None,
            };
            parsed.unwrap_or_else(|| panic!("a torn or foreign line in the stress log: {line:?}"))
        })
        .collect()
}

/// Two slots, a random 1–6 held (fewer, as many or more than slots), holds
/// of a random 50–400 ms, 150 jobs of random lengths (0–150 ms, one in ten
/// 600 ms, so that both slots are often taken longer than a hold and holds
/// expire), created in a burst and then in trickles while the slots are
/// busy. Violations: a moment with more than two workers, a job not run
/// exactly once (start and end), a run that is not the first attempt (a
/// hand-back counted one), a job not finished.
#[test]
fn under_random_load_the_cap_holds_and_every_job_runs_once_through_hand_backs() {
    let clock = std::time::UNIX_EPOCH
        .elapsed()
        .expect("the clock")
        .as_nanos() as u64;
    let replay = std::env::var("FETCH_AHEAD_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let seed = replay.unwrap_or(clock);
    let mut rng = XorShift::new(seed);
    let hold = 50 + rng.below(351);
    // As many held as slots, fewer, or more.
    let ahead = 1 + rng.below(6);
    eprintln!(
        "fetch-ahead stress: seed {seed} (replay: FETCH_AHEAD_SEED={seed}), {ahead} ahead, hold {hold}ms"
    );

    let server = Server::start();
    let api = server.api();
    let out = workdir();
    let log: PathBuf = out.path().join("events");
    let builder = Supervisor::builder(&server.url).worker("Stress", &stress_worker(&log));
    let flags = format!("--max-workers 2 --fetch-ahead {ahead} --fetch-ahead-hold {hold}ms");
    let mut sup = with_flags(builder, &flags).start();
    let limit = Duration::from_secs(120);
    let total = 150;
    let job = |rng: &mut XorShift| {
        let ms = if rng.below(10) == 0 {
            600
        } else {
            rng.below(151)
        };
        json!({ "name": "Stress", "data": { "sleep_ms": ms } })
    };
    let mut ids = api.create_batch((0..40).map(|_| job(&mut rng)).collect());
    while ids.len() < total {
        // Each trickle once the queue is nearly dry, so that its jobs come
        // while both slots are busy: they are held, and some holds expire.
        let due = ids.len() - 4;
        let ended = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines().filter(|l| l.starts_with("end ")).count() >= due
        };
        if !wait_until(limit, ended) {
            break; // Jobs stopped ending: reported below.
        }
        for _ in 0..(5 + rng.below(16) as usize).min(total - ids.len()) {
            ids.push(api.create(job(&mut rng)));
        }
    }
    let listed = || {
        let (status, answer) = api.get("/jobs?limit=1000");
        assert_eq!(status, 200, "{answer}");
        answer["jobs"].as_array().expect("jobs").clone()
    };
    wait_until(limit, || listed().is_empty());
    sup.assert_running("the stress run");

    let mut violations = Vec::new();
    let events = events(&log);
    let mut order: Vec<&Event> = events.iter().collect();
    // An end and a start at the same nanosecond: the end came first (a
    // slot passes on only when its worker has ended).
    order.sort_by_key(|e| (e.ns, e.start));
    let mut running = 0usize;
    for e in &order {
        if e.start {
            running += 1;
            if running > 2 {
                violations.push(format!("{running} at once as job {} started", e.id));
            }
        } else {
            running = running.saturating_sub(1);
        }
    }
    for &id in &ids {
        let starts = events.iter().filter(|e| e.id == id && e.start).count();
        let ends = events.iter().filter(|e| e.id == id && !e.start).count();
        if (starts, ends) != (1, 1) {
            violations.push(format!("job {id}: {starts} starts, {ends} ends"));
        }
    }
    for e in events.iter().filter(|e| e.start && e.attempt != "1") {
        violations.push(format!("job {} ran as attempt {:?}", e.id, e.attempt));
    }
    for job in listed() {
        violations.push(format!("not finished: {job}"));
    }
    if ids.len() < total {
        violations.push(format!("only {} of {total} jobs were created", ids.len()));
    }
    eprintln!(
        "fetch-ahead stress: {} holds expired, {} handed back in all",
        hand_backs(&sup, "no slot freed within"),
        hand_backs(&sup, "")
    );
    let log = sup.stderr();
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        violations.is_empty(),
        "{} violations (seed {seed}, {ahead} ahead, hold {hold}ms):\n{}\nthe supervisor's last log lines:\n{}",
        violations.len(),
        violations.join("\n"),
        lines[lines.len().saturating_sub(80)..].join("\n")
    );
}

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

/// A supervisor started with `flags`, the variable `env` (`KEY=VALUE`)
/// and a configuration file saying `toml`, which should be refused: its
/// exit code and stderr.
fn refused_start(flags: &str, env: &str, toml: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("jobmgr.toml");
    std::fs::write(&config, toml).expect("config file");
    let mut command = jobmgr_in(dir.path());
    command
        .arg("--config")
        .arg(&config)
        .args(["--server", "http://127.0.0.1:9", "--worker-path"])
        .arg(dir.path())
        .args(flags.split_whitespace());
    if let Some((key, value)) = env.split_once('=') {
        command.env(key, value);
    }
    let output = command.run_bounded(&format!(
        "a supervisor with {flags} {env} {toml:?} to be refused"
    ));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// More held than a fetch brings (1000), holds outside 10ms–10m, and
/// values that are not counts are refused (exit 2, naming the setting), from
/// flags, the environment and the configuration file, a pool's table too;
/// the bounds themselves are taken.
#[test]
fn fetch_ahead_settings_out_of_range_are_refused() {
    let pool = "[[pool]]\nname = \"b\"\njob-name = \"b/*\"\nmax-workers = 1\nfetch-ahead = 1001\n";
    let more = "fetch-ahead 1000 1001";
    let hold = "fetch-ahead-hold";
    // (flags, variable, configuration file, words the refusal says)
    for (flags, env, toml, words) in [
        ("--max-workers 2 --fetch-ahead 1001", "", "", more),
        ("--max-workers 2", "JOBMGR_FETCH_AHEAD=1001", "", more),
        ("", "", "max-workers = 2\nfetch-ahead = 1001\n", more),
        ("", "", pool, "fetch-ahead"),
        ("--fetch-ahead-hold 0s", "", "", hold),
        ("--fetch-ahead-hold 9ms", "", "", hold),
        ("--fetch-ahead-hold 2h", "", "", hold),
        ("", "JOBMGR_FETCH_AHEAD_HOLD=11m", "", hold),
        ("", "", "fetch-ahead-hold = \"1d\"\n", hold),
        ("--fetch-ahead=-1", "", "", "fetch-ahead"),
        ("--fetch-ahead=abc", "", "", "fetch-ahead"),
    ] {
        let (code, stderr) = refused_start(flags, env, toml);
        let case = format!("{flags} {env} {toml:?}");
        assert_eq!(code, Some(2), "{case}: {stderr}");
        for word in words.split(' ') {
            assert!(stderr.contains(word), "{case}: no {word:?} in {stderr}");
        }
    }

    // The bounds are taken: more held than slots up to a fetch's most,
    // holds of 10ms and 10m.
    let dir = tempfile::tempdir().expect("temp dir");
    for (ahead, hold) in [("8", "10ms"), ("1000", "10m")] {
        let output = jobmgr_in(dir.path())
            .args(["check-config", "--offline", "--worker-path"])
            .arg(dir.path())
            .args(
                format!("--max-workers 2 --fetch-ahead {ahead} --fetch-ahead-hold {hold}")
                    .split(' '),
            )
            .run_bounded("check-config with fetch-ahead at its bounds");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "hold {hold}: {stderr}");
        let taken = stdout
            .lines()
            .any(|l| l.starts_with(&format!("fetch-ahead = {ahead} ")));
        assert!(taken, "{stdout}");
    }
}
