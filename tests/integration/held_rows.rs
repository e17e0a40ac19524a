//! Jobs whose rows another transaction holds, on a PostgreSQL store
//! (another server claiming or lapsing them, a report in flight; here the
//! test's own `SELECT ... FOR UPDATE`): a server skips them and looks again
//! a little later, never in a spin, and acts on them once they are let
//! go. The spin is counted in the database's own statistics: the
//! transactions that ended in the test's database over a few seconds.
//! These always run on PostgreSQL, whatever `JOBMGR_TEST_STORE` says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Server, TestDatabase, bedrock_exchange, poll};

/// How long the transactions are counted.
const WINDOW: Duration = Duration::from_secs(3);

/// The most transactions a server may end in [`WINDOW`] while it waits on
/// held rows: one that looks again at once ends thousands (14,000 seen),
/// one that looks four times a second a dozen or two.
const AT_MOST: i64 = 300;

/// The database's time, in milliseconds, as the store keeps times.
const DATABASE_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The CPU time (user and system) of process `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the server's stat");
    // The fields after the command's name (which may hold spaces), from
    // the state on: utime and stime are the 12th and 13th.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("a clock-tick count"))
        .collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Duration::from_millis((fields[0] + fields[1]) * 1000 / ticks)
}

/// The transactions that ended in `database`, and the CPU time `server`
/// spent, over [`WINDOW`].
fn count_over_window(database: &TestDatabase, server: &Server) -> (i64, Duration) {
    let (before, cpu_before) = (database.transactions(), cpu_time(server.pid()));
    let end = Instant::now() + WINDOW;
    poll("the counting window to pass", || {
        (Instant::now() >= end).then_some(())
    });
    (
        database.transactions() - before,
        cpu_time(server.pid()) - cpu_before,
    )
}

/// Locks the rows of `ids` in a transaction of `client`'s, held until it
/// is ended.
fn hold<'c>(client: &'c mut postgres::Client, ids: &[i64]) -> postgres::Transaction<'c> {
    let mut held = client.transaction().expect("begin");
    let locked = held
        .query(
            "SELECT job_id FROM jobs WHERE job_id = ANY($1) ORDER BY job_id FOR UPDATE",
            &[&ids],
        )
        .expect("lock the rows");
    assert_eq!(locked.len(), ids.len());
    held
}

/// Whether `condition` (on the job `id`'s row, against [`DATABASE_NOW`])
/// holds, read inside the transaction that holds the row.
fn row_says(held: &mut postgres::Transaction<'_>, id: i64, condition: &str) -> bool {
    held.query_one(
        &format!("SELECT COALESCE({condition}, false) FROM jobs WHERE job_id = $1"),
        &[&id],
    )
    .expect("read the row")
    .get(0)
}

#[test]
fn a_lapsed_lease_whose_row_is_held_is_looked_at_again_later_not_in_a_spin() {
    let database = Arc::new(TestDatabase::create());
    let server = Server::builder().on_database(&database).start();
    let api = server.api();
    let id = api.create(json!({"name": "held/lapse"}));
    // Long enough to count the transactions once while it runs.
    let jobs = api.dequeue(json!({"name": "held/lapse", "leaseMs": 10_000}));
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (idle, idle_cpu) = count_over_window(&database, &server);

    let mut client = database.connect();
    let mut held = hold(&mut client, &[id]);
    assert!(
        row_says(&mut held, id, &format!("lease_expires > {DATABASE_NOW}")),
        "the lease ended before its row was held (a machine this slow cannot run this test)"
    );
    poll("the lease to end while its row is held", || {
        row_says(&mut held, id, &format!("lease_expires < {DATABASE_NOW}")).then_some(())
    });
    let (during, cpu) = count_over_window(&database, &server);
    eprintln!(
        "transactions in {WINDOW:?}: {idle} with the lease running, {during} with its row held \
         after it lapsed; the server's CPU time: {idle_cpu:?} and {cpu:?}"
    );
    assert!(
        during <= AT_MOST,
        "{during} transactions in {WINDOW:?} while a lapsed lease's row was held (at most \
         {AT_MOST}): the server's timer spins"
    );
    assert!(row_says(&mut held, id, "state = 'RUNNING'"));

    held.rollback().expect("let the row go");
    let job = poll("the lease to lapse once its row is let go", || {
        let job = api.job(id);
        (job["state"] == "QUEUED").then_some(job)
    });
    assert_eq!(job["lapses"], 1, "{job}");
    assert_eq!(api.outcomes(id), ["lease_lost"]);
}

/// A Bedrock `GetJob` for `name` with no `retryAfter`: a hand-out with no
/// lease. Returns the answer's status line.
fn take_unleased(server: &Server, name: &str) -> String {
    let request = format!("GetJob\r\nname: {name}\r\nConnection: close\r\n\r\n");
    let answer = bedrock_exchange(&server.bedrock, request.as_bytes());
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn due_jobs_and_jobs_held_without_a_lease_whose_rows_are_held_spin_nothing() {
    let database = Arc::new(TestDatabase::create());
    let server = Server::builder()
        .on_database(&database)
        .arg("--requeue-unleased-after")
        .arg("1s")
        .start();
    let api = server.api();
    let due = api.create(json!({"name": "held/due"}));
    let first_run = chrono::Utc::now() + chrono::Duration::seconds(2);
    let later = api.create(json!({
        "name": "held/later",
        "firstRun": first_run.format("%Y-%m-%d %H:%M:%S").to_string(),
    }));
    let unleased = api.create(json!({"name": "held/unleased"}));
    assert_eq!(take_unleased(&server, "held/unleased"), "200 OK");

    let mut client = database.connect();
    let mut held = hold(&mut client, &[due, later, unleased]);
    // Takes held for the due jobs: each claim skips the held row and
    // waits; the timer wakes the second's when its job falls due.
    let takes: Vec<_> = ["held/due", "held/later"]
        .into_iter()
        .map(|name| {
            let api = api.clone();
            std::thread::spawn(move || -> Vec<Value> {
                api.dequeue(json!({"name": name, "waitMs": 8_000, "leaseMs": 60_000}))
            })
        })
        .collect();
    poll(
        "the later job to fall due and the unleased one to be old",
        || {
            let later_due = row_says(&mut held, later, &format!("next_run < {DATABASE_NOW}"));
            let old = row_says(
                &mut held,
                unleased,
                &format!("last_run + 1000 < {DATABASE_NOW}"),
            );
            (later_due && old).then_some(())
        },
    );
    let (during, cpu) = count_over_window(&database, &server);
    eprintln!(
        "transactions in {WINDOW:?} with due and unleased rows held: {during}; the server's CPU \
         time: {cpu:?}"
    );
    assert!(
        during <= AT_MOST,
        "{during} transactions in {WINDOW:?} while due and unleased rows were held (at most \
         {AT_MOST})"
    );
    // A held row is not handed out: the takes end at their deadline.
    for take in takes {
        assert_eq!(take.join().expect("a take"), Vec::<Value>::new());
    }
    assert!(row_says(&mut held, unleased, "state = 'RUNNING'"));

    held.rollback().expect("let the rows go");
    let job = poll("the unleased job to be queued again once let go", || {
        let job = api.job(unleased);
        (job["state"] == "QUEUED").then_some(job)
    });
    assert_eq!(job["lapses"], 1, "{job}");
    assert_eq!(api.take("held/due")["jobID"], due);
    assert_eq!(api.take("held/later")["jobID"], later);
}
