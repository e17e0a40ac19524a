//! What a job token's holder may cost the Bedrock port. A job token (a
//! worker's, see `job_tokens.rs`) proves a connection as the API token
//! does, but its connections have places of their own: a few per job
//! (`--bedrock-max-connections-per-job`), half of the port for all jobs,
//! and none of its address's places (`--bedrock-max-connections-per-peer`
//! is the API token's clients'). So no worker, however many sockets it
//! opens from however many loopback addresses, refuses a client with the
//! API token. And a flood of forged job tokens, or of a job token's
//! forbidden requests, is logged once per 10 s with its count, not once a
//! request.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use jobmgr::auth::job_token::mint;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::bedrock_conn::{Conn, Response};
use crate::common::*;

const JOB_FULL: &str = "503 Too many connections for this job token";
const JOBS_FULL: &str = "503 Too many job-token connections";
const NOT_RUNNING: &str = "401 Unauthorized: this job token's job is no longer running";

fn addr(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// A server whose Bedrock port holds `max` connections, `per_peer` from
/// one address, and `per_job` of each job's token.
fn server(max: usize, per_peer: usize, per_job: usize) -> Server {
    Server::builder()
        .arg("--bedrock-max-connections")
        .arg(&max.to_string())
        .arg("--bedrock-max-connections-per-peer")
        .arg(&per_peer.to_string())
        .arg("--bedrock-max-connections-per-job")
        .arg(&per_job.to_string())
        .start()
}

/// A job handed out over HTTP under a long lease: its id and job token.
fn running_job(api: &Api, name: &str) -> (i64, String) {
    let id = api.create(json!({ "name": name }));
    let handed = api.dequeue(json!({ "name": name, "leaseMs": 3_600_000 }));
    assert_eq!(handed.len(), 1, "{handed:?}");
    let lease = handed[0]["lease"].as_str().expect("a lease");
    (id, mint(&api_token(), id, lease))
}

/// A Bedrock request with `token` in its `Token` header.
fn request(method: &str, token: &str, job: i64) -> Vec<u8> {
    format!("{method}\r\nToken: {token}\r\njobID: {job}\r\n\r\n").into_bytes()
}

/// Sends `bytes` and reads the answer; `None` if the server closed the
/// connection without one (as it does a connection refused at accept
/// once its 503 is lost, or one it closed before).
fn try_call(conn: &mut Conn, bytes: &[u8]) -> Option<Response> {
    conn.stream.write_all(bytes).ok()?;
    conn.next_response()
}

/// A new connection from `from` whose first request, a QueryJob of its own
/// job `job` with its job `token`, was answered: `Ok` with the connection
/// if it was served, else what the server said.
fn job_connection(server: &Server, from: IpAddr, job: i64, token: &str) -> Result<Conn, String> {
    let mut conn = Conn::open_from(from, &server.bedrock);
    match try_call(&mut conn, &request("QueryJob", token, job)) {
        Some(answer) if answer.code() == 200 => Ok(conn),
        Some(answer) => Err(answer.status),
        None => Err("closed without an answer".into()),
    }
}

/// What a client with the API token from `from` is told on a new
/// connection (a QueryJob of a job that does not exist: `404`), with the
/// connection; a client whose new connection a flood closed before its
/// request was read (`503 Closed for a newer connection`, or closed) may
/// retry: `None`.
fn api_client(server: &Server, from: IpAddr) -> Option<(String, Conn)> {
    let mut conn = Conn::open_from(from, &server.bedrock);
    let answer = try_call(&mut conn, &request("QueryJob", token(), 999_999))?;
    if answer
        .status
        .starts_with("503 Closed for a newer connection")
    {
        return None;
    }
    Some((answer.status, conn))
}

/// Whether a status is a refusal for want of places.
fn too_many(status: &str) -> bool {
    status.starts_with("503 Too many")
}

#[test]
fn a_workers_job_token_cannot_lock_api_token_clients_out_of_the_bedrock_port() {
    // 64 places, 16 per address: the worker's flood below (16 connections
    // from each of 9 addresses, its own 127.0.0.1 included) is more than
    // twice the port.
    let server = server(64, 16, 8);
    let api = server.api();
    let (job, job_token) = running_job(&api, "jtl-flood");
    let mut worker = Vec::new();
    let mut told = Vec::new();
    for n in 1..=9 {
        for _ in 0..16 {
            match job_connection(&server, addr(n), job, &job_token) {
                Ok(conn) => worker.push(conn),
                Err(status) => told.push(status),
            }
        }
    }
    // Clients with the API token: 16 from 127.0.0.1 (the worker's own
    // address) and 16 from 127.0.0.2, each answered and held open.
    let mut refused = 0;
    let mut clients = Vec::new();
    for n in [1, 2] {
        for _ in 0..16 {
            let (status, conn) = poll("an API-token client to be answered", || {
                api_client(&server, addr(n))
            });
            if too_many(&status) {
                refused += 1;
            } else {
                assert!(status.starts_with("404 "), "{status}");
                clients.push(conn);
            }
        }
    }
    println!(
        "job-token connections served {}, refused {}; API-token clients refused {refused} of 32",
        worker.len(),
        told.len()
    );
    assert_eq!(
        refused, 0,
        "API-token clients refused with a job token flooding"
    );
    // The worker keeps the places of its job, and only those; the rest of
    // its flood is told why and what to do.
    assert_eq!(worker.len(), 8, "a job's connections");
    for status in &told {
        assert!(
            status.starts_with(JOB_FULL) && status.contains("may hold 8 at once"),
            "{status}"
        );
    }
    // Its connections are served on, as are the clients'.
    for conn in &mut worker {
        let answer = try_call(conn, &request("QueryJob", &job_token, job)).expect("served");
        assert_eq!(answer.code(), 200, "{answer:?}");
    }
    for conn in &mut clients {
        let answer = try_call(conn, &request("QueryJob", token(), 999_999)).expect("served");
        assert!(answer.status.starts_with("404 "), "{answer:?}");
    }
}

#[test]
fn a_jobs_places_free_as_its_connections_close_and_jobs_share_half_the_port() {
    // 8 places: 4 for jobs, 2 per job.
    let server = server(8, 8, 2);
    let api = server.api();
    let (a, a_token) = running_job(&api, "jtl-a");
    let (b, b_token) = running_job(&api, "jtl-b");
    let (c, c_token) = running_job(&api, "jtl-c");
    let mut held_a: Vec<Conn> = (0..2)
        .map(|_| job_connection(&server, addr(1), a, &a_token).expect("a's places"))
        .collect();
    let third = job_connection(&server, addr(1), a, &a_token).unwrap_err();
    assert!(third.starts_with(JOB_FULL), "{third}");
    let held_b: Vec<Conn> = (0..2)
        .map(|_| job_connection(&server, addr(2), b, &b_token).expect("b's places"))
        .collect();
    // The jobs hold their half: another job is refused, not a client.
    let told = job_connection(&server, addr(3), c, &c_token).unwrap_err();
    assert!(told.starts_with(JOBS_FULL), "{told}");
    // A forged token is refused as ever, jobs' places full or not.
    let forged = format!("job.{c}.{}", "0".repeat(64));
    let mut conn = Conn::open_from(addr(5), &server.bedrock);
    let answer = try_call(&mut conn, &request("QueryJob", &forged, c)).expect("an answer");
    answer.assert_error(NOT_RUNNING);
    conn.assert_closed();
    let clients: Vec<Conn> = (0..4)
        .map(|_| {
            let (status, conn) = poll("an API-token client", || api_client(&server, addr(1)));
            assert!(status.starts_with("404 "), "{status}");
            conn
        })
        .collect();
    // A connection of a closes: its place is a's again (once the server
    // has seen it close), not the port's.
    drop(held_a.pop());
    let again = poll("a's freed place to be taken again", || {
        job_connection(&server, addr(4), a, &a_token).ok()
    });
    drop((held_a, held_b, again, clients));
}

/// Held connections of one kind, counted as the server must see them at
/// least: a job-token connection is counted from its 200 to before the
/// test closes it, so the server's own count is never below this one's.
#[derive(Default)]
struct Held {
    per_job: Mutex<HashMap<i64, usize>>,
    violations: AtomicUsize,
    api_refused: AtomicUsize,
    api_served: AtomicUsize,
    job_served: AtomicUsize,
    job_refused: AtomicUsize,
}

impl Held {
    fn violation(&self, what: &str) {
        eprintln!("violation: {what}");
        self.violations.fetch_add(1, Ordering::Relaxed);
    }

    fn took(&self, job: i64, per_job: usize, share: usize) {
        let mut held = self.per_job.lock().unwrap();
        let of_job = held.entry(job).or_default();
        *of_job += 1;
        let (of_job, all) = (*of_job, held.values().sum::<usize>());
        drop(held);
        if of_job > per_job {
            self.violation(&format!("job {job} holds {of_job} connections"));
        }
        if all > share {
            self.violation(&format!("jobs hold {all} connections"));
        }
    }

    fn gave_back(&self, job: i64) {
        *self.per_job.lock().unwrap().entry(job).or_default() -= 1;
    }
}

/// One client's random walk: opens and closes job-token connections of
/// random jobs from random addresses, API-token connections from a few
/// addresses (each must be served; held ones must stay served), forged
/// and tokenless requests.
fn random_walk(server: &Server, jobs: &[(i64, String)], held: &Held, seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (per_job, share) = (4, 32);
    let mut mine: Vec<(i64, Conn)> = Vec::new();
    let mut clients: Vec<Conn> = Vec::new();
    for _ in 0..steps {
        match rng.random_range(0..10) {
            0..=3 => {
                let (job, job_token) = &jobs[rng.random_range(0..jobs.len())];
                let from = addr(rng.random_range(1..=20));
                match job_connection(server, from, *job, job_token) {
                    Ok(conn) => {
                        held.job_served.fetch_add(1, Ordering::Relaxed);
                        held.took(*job, per_job, share);
                        mine.push((*job, conn));
                    }
                    Err(status) if status.starts_with(JOB_FULL) => {
                        held.job_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) if status.starts_with(JOBS_FULL) => {
                        held.job_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    // Evicted as a newcomer needed its place before its
                    // request was read: retryable, and no place held.
                    Err(status) if status.starts_with("503 Closed for a newer") => {}
                    Err(status) => held.violation(&format!("job-token client told {status}")),
                }
            }
            4 if !mine.is_empty() => {
                let (job, conn) = mine.swap_remove(rng.random_range(0..mine.len()));
                held.gave_back(job);
                drop(conn);
            }
            5..=6 => {
                let from = addr(rng.random_range(1..=4));
                match api_client(server, from) {
                    Some((status, conn)) if status.starts_with("404 ") => {
                        held.api_served.fetch_add(1, Ordering::Relaxed);
                        if clients.len() < 3 {
                            clients.push(conn);
                        }
                    }
                    Some((status, _)) if too_many(&status) => {
                        held.api_refused.fetch_add(1, Ordering::Relaxed);
                        held.violation(&format!("API-token client from {from} told {status}"));
                    }
                    Some((status, _)) => held.violation(&format!("API-token client told {status}")),
                    None => {}
                }
            }
            7 if !clients.is_empty() => {
                let at = rng.random_range(0..clients.len());
                match try_call(&mut clients[at], &request("QueryJob", token(), 999_999)) {
                    Some(answer) if answer.status.starts_with("404 ") => {}
                    other => held.violation(&format!("a held API-token client got {other:?}")),
                }
                if rng.random_bool(0.3) {
                    clients.swap_remove(at);
                }
            }
            8 => {
                let (job, _) = &jobs[rng.random_range(0..jobs.len())];
                let forged = format!("job.{job}.{:064x}", rng.random::<u128>());
                let mut conn = Conn::open_from(addr(rng.random_range(1..=20)), &server.bedrock);
                match try_call(&mut conn, &request("CreateJob", &forged, *job)) {
                    Some(answer) if answer.status == NOT_RUNNING => conn.assert_closed(),
                    Some(answer) if answer.status.starts_with("503 Closed for a newer") => {}
                    None => {}
                    other => held.violation(&format!("a forged job token got {other:?}")),
                }
            }
            _ => {}
        }
    }
    for (job, conn) in mine {
        held.gave_back(job);
        drop(conn);
    }
}

#[test]
fn random_mixes_of_job_token_and_api_token_connections_never_refuse_an_api_token_client() {
    // 64 places: 32 for jobs, 4 per job; ten running jobs could take 40.
    let server = server(64, 16, 4);
    let api = server.api();
    let jobs: Vec<(i64, String)> = (0..10)
        .map(|n| running_job(&api, &format!("jtl-mix-{n}")))
        .collect();
    let seed = std::env::var("JOBMGR_MIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed {seed} (JOBMGR_MIX_SEED to repeat it)");
    let held = Arc::new(Held::default());
    std::thread::scope(|scope| {
        for walker in 0..4 {
            let (server, jobs, held) = (&server, &jobs, Arc::clone(&held));
            scope.spawn(move || random_walk(server, jobs, &held, seed + walker, 300));
        }
    });
    println!(
        "job-token connections served {}, refused {}; API-token clients served {}, refused {}",
        held.job_served.load(Ordering::Relaxed),
        held.job_refused.load(Ordering::Relaxed),
        held.api_served.load(Ordering::Relaxed),
        held.api_refused.load(Ordering::Relaxed),
    );
    assert_eq!(held.violations.load(Ordering::Relaxed), 0, "seed {seed}");
    assert!(held.api_served.load(Ordering::Relaxed) > 0);
}

/// The log lines of `server` that say job tokens (or their requests)
/// were refused, as `(line, count)`: `refused=N` when the line tallies
/// several, else 1.
fn refusal_lines(server: &Server, what: &str) -> Vec<(String, u64)> {
    server
        .stderr()
        .lines()
        .filter(|line| line.contains(what))
        .map(|line| {
            let count = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("refused="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            (line.to_string(), count)
        })
        .collect()
}

/// Sends one forged job token for `job` on a new connection: refused,
/// closed.
fn forge(server: &Server, job: i64, n: u64) {
    let forged = format!("job.{job}.{n:064x}");
    let mut conn = Conn::open_from(addr(2 + (n % 8) as u8), &server.bedrock);
    let answer = try_call(&mut conn, &request("CreateJob", &forged, job)).expect("an answer");
    answer.assert_error(NOT_RUNNING);
    conn.assert_closed();
}

#[test]
fn forged_job_tokens_do_not_flood_the_log() {
    let server = Server::start();
    let api = server.api();
    let (job, job_token) = running_job(&api, "jtl-forged");
    let began = Instant::now();
    // Forged tokens, for the running job (whose lease must be read to
    // refuse them) and for jobs that do not exist; and a real token's
    // requests that are not its to send.
    let forged: u64 = 400;
    for n in 0..forged {
        forge(
            &server,
            if n % 2 == 0 {
                job
            } else {
                1_000_000 + n as i64
            },
            n,
        );
    }
    let mut conn = Conn::open_from(addr(1), &server.bedrock);
    let forbidden: u64 = 400;
    for _ in 0..forbidden {
        let answer =
            try_call(&mut conn, &request("FinishJob", &job_token, job)).expect("an answer");
        assert_eq!(answer.code(), 403, "{answer:?}");
    }
    let elapsed = began.elapsed();
    // One line of each kind at once, then at most one each 10 s (and one
    // for the period the flood began in).
    let most = 2 + elapsed.as_secs() as usize / 10;
    let all = refusal_lines(&server, "Bedrock port: job token").len();
    let tokens = refusal_lines(&server, "Bedrock port: job tokens refused").len();
    let requests = refusal_lines(&server, "Bedrock port: job tokens' requests refused").len();
    println!(
        "{all} log lines of refused job tokens and requests for {} refusals in {elapsed:?}",
        forged + forbidden
    );
    assert!(
        all <= 2 * most && tokens >= 1 && requests >= 1,
        "{tokens} lines for refused job tokens, {requests} for refused requests, {all} in all, \
         in {elapsed:?}:\n{}",
        server.stderr()
    );
    // Nothing is lost: the next line says how many it stands for.
    let before = refusal_lines(&server, "Bedrock port: job tokens refused").len();
    let mut extra = 0;
    let counted = poll("the next tally of forged job tokens", || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        forge(&server, job, forged + extra);
        extra += 1;
        let lines = refusal_lines(&server, "Bedrock port: job tokens refused");
        (lines.len() > before).then(|| lines.iter().map(|(_, n)| n).sum::<u64>())
    });
    assert_eq!(counted, forged + extra);
}
