//! jobmgr on PostgreSQL beside the PostgreSQL job queues it is measured
//! against, PgQueuer and procrastinate (`JOBMGR_BENCH_ONLY=peers`): the
//! same burn-down for each, on the same PostgreSQL, in interleaved rounds,
//! each on a fresh database of its own. N no-op jobs are created in batches
//! of 1,000, then drained by K consumers. jobmgr's consumers are this
//! process's tasks, each a `POST /dequeue` of up to 64 jobs that carries
//! the reports of the jobs its previous dequeue took; the peers run as
//! their documentation shows (`peers.py`), in a venv under `target/` that
//! this module makes with pinned versions. Beside the rates: jobmgr's
//! statements (round trips) and commits per job, from its own metrics, and
//! the rate with the tables analyzed while empty (the plans must hold).
//! `JOBMGR_BENCH_BASELINE_BIN=PATH` adds another `jobmgr` binary to every
//! round, to compare two builds in the same run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use crate::common::{
    PgDatabase, ServerProcess, async_client, bin, machine, median_and_spread, spread, total,
};

/// The consumers of each burn-down.
const CONSUMERS: [usize; 3] = [1, 4, 16];

/// Jobs one dequeue takes.
const DEQUEUE: usize = 64;

/// The peers' pinned versions.
const PEER_PACKAGES: [&str; 6] = [
    "pgqueuer==1.6.0",
    "asyncpg==0.32.0",
    "procrastinate==3.10.0",
    "psycopg[binary,pool]==3.3.9",
    "psycopg-binary==3.3.9",
    "psycopg-pool==3.3.3",
];

/// What one burn-down measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Burn {
    /// Jobs created per second.
    pub enqueue: f64,
    /// Jobs drained per second.
    pub drain: f64,
    /// jobmgr on PostgreSQL: round trips per job, creates included.
    pub statements: Option<f64>,
    /// jobmgr: commits per job, creates included.
    pub commits: Option<f64>,
}

/// The systems of a round.
#[derive(Debug, Clone, PartialEq)]
enum System {
    /// jobmgr on PostgreSQL, with this binary; `analyzed` when the tables
    /// are analyzed while empty before the jobs are created.
    Jobmgr { binary: String, analyzed: bool },
    /// jobmgr on SQLite.
    Sqlite,
    /// A peer, by its `peers.py` name.
    Peer(&'static str),
}

impl System {
    fn label(&self) -> String {
        match self {
            System::Jobmgr { binary, analyzed } => {
                let build = if binary == bin() {
                    ""
                } else {
                    " (baseline build)"
                };
                let plans = if *analyzed { ", analyzed empty" } else { "" };
                format!("jobmgr on PostgreSQL{build}{plans}")
            }
            System::Sqlite => "jobmgr on SQLite".into(),
            System::Peer(name) => (*name).into(),
        }
    }
}

/// The Python of a venv under `target/` holding the peers, made (or
/// completed) with pip on first use.
fn peers_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/peers-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!("installed-{}", PEER_PACKAGES.join(",")));
    if marker.exists() {
        return python;
    }
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("run python3 -m venv (install python3 and python3-venv)");
    assert!(
        status.success(),
        "python3 -m venv {} failed",
        venv.display()
    );
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(PEER_PACKAGES)
        .status()
        .expect("run pip");
    assert!(
        status.success(),
        "pip could not install the peers ({}): PyPI must be reachable",
        PEER_PACKAGES.join(" ")
    );
    std::fs::write(&marker, "").expect("mark the venv");
    python
}

/// A peer's burn-down on a fresh database.
fn peer_burn(python: &Path, peer: &str, jobs: usize, consumers: usize) -> Burn {
    let database = PgDatabase::create();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jobmgr/peers.py");
    let dsn = database.url().replace("postgres://", "postgresql://");
    let out = Command::new(python)
        .arg(script)
        .args([peer, &dsn, &jobs.to_string(), &consumers.to_string()])
        .output()
        .expect("run peers.py");
    assert!(
        out.status.success(),
        "{peer}'s burn-down failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let answer: Value = serde_json::from_str(line.trim()).expect("peers.py's JSON line");
    Burn {
        enqueue: answer["enqueue"].as_f64().expect("enqueue"),
        drain: answer["drain"].as_f64().expect("drain"),
        statements: None,
        commits: None,
    }
}

/// The server's statement and commit counters.
async fn counters(server: &ServerProcess) -> (f64, f64) {
    let text = async_client()
        .get(format!("http://{}/metrics", server.metrics))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    (
        total(&text, "jobmgr_server_store_statements_total"),
        total(&text, "jobmgr_server_commit_seconds_count"),
    )
}

/// jobmgr's burn-down: creates in batches of 1,000, then `consumers`
/// tasks dequeuing [`DEQUEUE`] jobs with the previous dequeue's reports.
async fn jobmgr_burn(system: &System, jobs: usize, consumers: usize) -> Burn {
    let database = matches!(system, System::Jobmgr { .. }).then(PgDatabase::create);
    let binary = match system {
        System::Jobmgr { binary, .. } => binary.clone(),
        _ => bin().to_string(),
    };
    let server = ServerProcess::start_binary(&binary, database.as_ref().map(|d| d.url()), &[]);
    if let (System::Jobmgr { analyzed: true, .. }, Some(database)) = (system, &database) {
        database.execute("ANALYZE");
    }
    let client = async_client();
    let before = counters(&server).await;
    let started = Instant::now();
    for first in (0..jobs).step_by(1_000) {
        let batch: Vec<Value> = (first..jobs.min(first + 1_000))
            .map(|_| json!({"name": "noop"}))
            .collect();
        let answer = client
            .post(format!("{}/jobs/batch", server.url))
            .json(&json!({"jobs": batch}))
            .send()
            .await
            .expect("create a batch");
        assert!(
            answer.status().is_success(),
            "a batch create: {}",
            answer.status()
        );
    }
    let enqueued = Instant::now();
    let drained: usize = futures_util::future::join_all(
        (0..consumers).map(|_| consume(client.clone(), server.url.clone())),
    )
    .await
    .into_iter()
    .sum();
    let done = Instant::now();
    assert_eq!(drained, jobs, "every job is reported once");
    let after = counters(&server).await;
    let per_job = |d: f64| d / jobs as f64;
    let postgres = database.is_some();
    Burn {
        enqueue: jobs as f64 / (enqueued - started).as_secs_f64(),
        drain: jobs as f64 / (done - enqueued).as_secs_f64(),
        // A build without the statement counter has none to show.
        statements: (postgres && after.0 > before.0).then(|| per_job(after.0 - before.0)),
        commits: Some(per_job(after.1 - before.1)),
    }
}

/// One consumer: dequeues until a dequeue that carried no report finds
/// nothing; returns how many jobs it reported finished.
async fn consume(client: reqwest::Client, url: String) -> usize {
    let mut reports: Vec<Value> = Vec::new();
    let mut reported = 0;
    loop {
        let carried = reports.len();
        let mut body = json!({"name": "noop", "numResults": DEQUEUE, "leaseMs": 600_000});
        if carried > 0 {
            body["reports"] = Value::Array(std::mem::take(&mut reports));
        }
        let answer: Value = client
            .post(format!("{url}/dequeue"))
            .json(&body)
            .send()
            .await
            .expect("dequeue")
            .json()
            .await
            .expect("dequeue's JSON");
        if let Some(results) = answer["results"].as_array() {
            let refused: Vec<&Value> = results
                .iter()
                .filter(|r| r.get("error").is_some())
                .collect();
            assert!(refused.is_empty(), "refused reports: {refused:?}");
            reported += results.len();
        }
        let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.is_empty() && carried == 0 {
            return reported;
        }
        reports = jobs
            .iter()
            .map(|job| json!({"jobID": job["jobID"], "outcome": "finish", "lease": job["lease"]}))
            .collect();
    }
}

/// The burn-downs of every system at every K, `rounds` times, interleaved.
pub async fn report(rounds: usize, jobs: usize) -> String {
    let python = peers_python();
    let mut systems = vec![
        System::Jobmgr {
            binary: bin().to_string(),
            analyzed: false,
        },
        System::Peer("pgqueuer"),
        System::Peer("procrastinate"),
        System::Sqlite,
    ];
    if let Ok(baseline) = std::env::var("JOBMGR_BENCH_BASELINE_BIN") {
        systems.insert(
            1,
            System::Jobmgr {
                binary: baseline,
                analyzed: false,
            },
        );
    }
    let analyzed = System::Jobmgr {
        binary: bin().to_string(),
        analyzed: true,
    };
    let mut runs: Vec<(String, usize, Burn)> = Vec::new();
    for round in 0..rounds {
        for &k in &CONSUMERS {
            let mut order = systems.clone();
            if k == 16 {
                order.push(analyzed.clone());
            }
            let turn = round % order.len();
            order.rotate_left(turn);
            for system in order {
                let burn = match &system {
                    System::Peer(peer) => {
                        let (python, peer) = (python.clone(), *peer);
                        tokio::task::spawn_blocking(move || peer_burn(&python, peer, jobs, k))
                            .await
                            .expect("peer burn-down")
                    }
                    _ => jobmgr_burn(&system, jobs, k).await,
                };
                eprintln!("peers: round {round} K={k} {}: {burn:?}", system.label());
                runs.push((system.label(), k, burn));
            }
        }
    }
    render(&runs, rounds, jobs)
}

/// The figures of `label` at `k`.
fn of(runs: &[(String, usize, Burn)], label: &str, k: usize) -> Vec<Burn> {
    runs.iter()
        .filter(|(l, kk, _)| l == label && *kk == k)
        .map(|(_, _, b)| *b)
        .collect()
}

fn median(values: Vec<f64>) -> f64 {
    median_and_spread(values).0
}

/// `n` with a comma between thousands.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn render(runs: &[(String, usize, Burn)], rounds: usize, jobs: usize) -> String {
    let mut labels: Vec<String> = Vec::new();
    for (label, _, _) in runs {
        if !labels.contains(label) {
            labels.push(label.clone());
        }
    }
    let mut out = String::from("## PostgreSQL beside its peers\n\n");
    out.push_str(&format!(
        "- Machine: {}; PostgreSQL as installed, on 127.0.0.1.\n- Burn-down: {} no-op jobs created in batches of 1,000, then drained by K consumers; {rounds} interleaved rounds, each on a fresh database; median (min–max).\n- jobmgr: K tasks of this process, each a `POST /dequeue` of up to {DEQUEUE} jobs carrying the reports of the previous one's. PgQueuer 1.6.0: K queue managers, batches of 64, drain mode. procrastinate 3.10.0: one worker of concurrency K, `wait=False`.\n- Reproduce: `JOBMGR_BENCH_ONLY=peers cargo bench --bench jobmgr` (needs `python3-venv` and PyPI for the peers' venv under `target/`).\n\n",
        machine(),
        thousands(jobs)
    ));
    out.push_str("| K | system | drain, jobs/s | enqueue, jobs/s | drain / PgQueuer's | statements per job | commits per job |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for &k in &CONSUMERS {
        let pgqueuer = median(of(runs, "pgqueuer", k).iter().map(|b| b.drain).collect());
        for label in &labels {
            let burns = of(runs, label, k);
            if burns.is_empty() {
                continue;
            }
            let drain = median(burns.iter().map(|b| b.drain).collect());
            let optional = |f: fn(&Burn) -> Option<f64>| {
                let values: Vec<f64> = burns.iter().filter_map(f).collect();
                if values.is_empty() {
                    "—".to_string()
                } else {
                    format!("{:.2}", median(values))
                }
            };
            out.push_str(&format!(
                "| {k} | {label} | {} | {} | {:.2} | {} | {} |\n",
                spread(burns.iter().map(|b| b.drain).collect(), 0),
                spread(burns.iter().map(|b| b.enqueue).collect(), 0),
                drain / pgqueuer,
                optional(|b| b.statements),
                optional(|b| b.commits),
            ));
        }
    }
    out
}
