//! The PostgreSQL store's measures, beside the SQLite figures of the same
//! run: create → dequeue → finish cycles per second with 1, 2 and 3
//! servers on one database, dequeue latency with 10^3 and 10^6 jobs
//! queued, and how long a dequeue held on one server takes to answer a
//! CreateJob committed through another (LISTEN/NOTIFY).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Scale;
use crate::common::{PgDatabase, Servers, Store, median_and_spread, percentile, spread};
use crate::server::{CLIENTS, SqliteFigures, Throughput, latency, post, throughput};

/// The numbers of servers sharing the database.
const SERVERS: [usize; 3] = [1, 2, 3];

/// `median (min–max)` of one figure of throughput runs.
fn spread_of(runs: &[Throughput], figure: fn(&Throughput) -> f64, decimals: usize) -> String {
    spread(runs.iter().map(figure).collect(), decimals)
}

/// Cores kept busy by the servers and the database's backends in a run.
fn cores_busy(t: &Throughput) -> f64 {
    t.cycles_per_second * (t.server_cpu_ms + t.database_cpu_ms) / 1e3
}

/// The PostgreSQL server: its version and the settings that bound a
/// commit; and its `autovacuum` setting.
fn describe_postgres() -> (String, String) {
    let database = PgDatabase::create();
    let show = |setting: &str| database.query_text(&format!("SHOW {setting}"));
    let autovacuum = show("autovacuum");
    let text = format!(
        "PostgreSQL {} on this machine over 127.0.0.1 (fsync={}, synchronous_commit={}, wal_sync_method={}, shared_buffers={}, autovacuum={autovacuum}, as installed)",
        show("server_version"),
        show("fsync"),
        show("synchronous_commit"),
        show("wal_sync_method"),
        show("shared_buffers"),
    );
    (text, autovacuum)
}

/// The 1-minute load average: other work on the machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Signed milliseconds from `from` to `to`.
fn ms_between(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(from.duration_since(to).as_secs_f64() * 1e3),
    }
}

/// Waits until `base` holds `count` dequeues asleep (claimed nothing,
/// waiting for a wake-up).
async fn until_waiting(client: &reqwest::Client, base: &str, count: u64) {
    let health = format!("{base}/healthz");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value: Value = client
            .get(&health)
            .send()
            .await
            .expect("health")
            .json()
            .await
            .expect("json");
        if value["waiting"].as_u64() == Some(count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{base}: the held dequeue never showed as waiting ({value})"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Milliseconds from CreateJob's answer through `create_on` to the answer
/// of a dequeue held on `held_on`, `samples` times, sorted. Negative when
/// the dequeue answered first.
async fn wake_latencies(create_on: &str, held_on: &str, samples: usize) -> Vec<f64> {
    let client = crate::common::async_client();
    let holder = crate::common::async_client();
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let url = format!("{held_on}/dequeue");
        let holder = holder.clone();
        let held = tokio::spawn(async move {
            let got = post(
                &holder,
                &url,
                &json!({"name": "bench/wake", "waitMs": 30_000, "leaseMs": 60_000}),
            )
            .await;
            (Instant::now(), got)
        });
        until_waiting(&client, held_on, 1).await;
        post(
            &client,
            &format!("{create_on}/jobs"),
            &json!({"name": "bench/wake", "data": {"n": 1}}),
        )
        .await;
        let created = Instant::now();
        let (answered, got) = held.await.expect("held dequeue");
        let job = &got["jobs"][0];
        let id = job["jobID"]
            .as_i64()
            .unwrap_or_else(|| panic!("the held dequeue answered without the job: {got}"));
        out.push(ms_between(created, answered));
        post(
            &client,
            &format!("{held_on}/jobs/{id}/finish"),
            &json!({"lease": job["lease"].as_str().expect("lease")}),
        )
        .await;
    }
    out.sort_by(f64::total_cmp);
    out
}

/// The PostgreSQL sections. `sqlite` holds the SQLite figures of the same
/// run; `provenance` says which run measured these sections.
pub async fn report(scale: Scale, sqlite: &SqliteFigures, provenance: &str) -> String {
    let load_before = load_average();
    let started = Instant::now();
    let (description, autovacuum) = describe_postgres();
    let mut out = String::new();

    // 1. Throughput with several servers.
    out.push_str("### Throughput: create → dequeue → finish with 1, 2 and 3 servers\n\n");
    out.push_str(&format!(
        "The HTTP loop of \"Server throughput\" above (each client on a job name of its own, one persistent connection, CreateJob, `/dequeue` with a lease, FinishJob: three durable commits per cycle), with N servers on one fresh database and the given number of clients on each server (client i talks only to server i mod N). The SQLite row is one server on a fresh file, measured in this same run. {} runs of {:?} each on fresh servers and a fresh database; median (min–max). CPU is per cycle: `jobmgr server` processes together, and the PostgreSQL backends connected to the database (the writer, readers and listener of each server; PostgreSQL's WAL writer and other background processes not counted); cores busy is cycles/s × that CPU (the clients' own CPU not counted), out of the machine's {}.\n\n",
        scale.repeats,
        scale.cycle_run,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    ));
    out.push_str("| store | servers | clients per server | cycles/s | server CPU ms/cycle | PostgreSQL CPU ms/cycle | cores busy |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    let mut pg_rates: Vec<(usize, usize, f64)> = Vec::new();
    for clients in CLIENTS {
        if let Some((_, runs)) = sqlite.throughput.iter().find(|(c, _)| *c == clients) {
            out.push_str(&format!(
                "| SQLite | 1 | {clients} | {} | {} | – | {} |\n",
                spread_of(runs, |t| t.cycles_per_second, 0),
                spread_of(runs, |t| t.server_cpu_ms, 2),
                spread_of(runs, cores_busy, 2),
            ));
        }
        for servers in SERVERS {
            let mut runs = Vec::new();
            for _ in 0..scale.repeats {
                runs.push(throughput(Store::Postgres, servers, clients, scale.cycle_run).await);
            }
            pg_rates.push((
                servers,
                clients,
                median_and_spread(runs.iter().map(|t| t.cycles_per_second).collect()).0,
            ));
            out.push_str(&format!(
                "| PostgreSQL | {servers} | {clients} | {} | {} | {} | {} |\n",
                spread_of(&runs, |t| t.cycles_per_second, 0),
                spread_of(&runs, |t| t.server_cpu_ms, 2),
                spread_of(&runs, |t| t.database_cpu_ms, 2),
                spread_of(&runs, cores_busy, 2),
            ));
        }
    }
    let rate = |servers: usize, clients: usize| {
        pg_rates
            .iter()
            .find(|(s, c, _)| *s == servers && *c == clients)
            .map_or(f64::NAN, |r| r.2)
    };
    let sqlite_rate = |clients: usize| {
        sqlite
            .throughput
            .iter()
            .find(|(c, _)| *c == clients)
            .map_or(f64::NAN, |(_, runs)| {
                median_and_spread(runs.iter().map(|t| t.cycles_per_second).collect()).0
            })
    };
    out.push_str(&format!(
        "\nMedians: with 16 clients per server, 3 servers do {:.2}× what 1 server does on PostgreSQL, and 1 PostgreSQL server does {:.2}× what 1 SQLite server does (1 client: {:.2}×).\n",
        rate(3, 16) / rate(1, 16),
        rate(1, 16) / sqlite_rate(16),
        rate(1, 1) / sqlite_rate(1),
    ));

    // 2. Dequeue latency against queue size.
    out.push_str("\n### Dequeue latency against queue size\n\n");
    out.push_str(&format!(
        "\"Dequeue latency against queue size\" above, on one server on a fresh PostgreSQL database: the queue is filled with due jobs by CreateJobs in batches of 10,000 through the server (the fill rate is the jobs created per second), then non-waiting dequeues (`bench/*`, a lease each) are timed one after another from the client: HTTP round trip plus a durable commit. First {before} dequeues on the table as filled, never analyzed (this PostgreSQL runs with autovacuum={autovacuum}: {autovacuum_note}); then `ANALYZE` and {samples} dequeues, with the given number of jobs queued when they start. Rows read is what PostgreSQL's statistics count per dequeue on the `jobs` table: entries returned by its index scans plus rows of its sequential scans, the entries of rows claimed earlier and not vacuumed yet included (the claim asks for 1 row; a plan that walks the queue shows here). The SQLite rows were measured in this same run.\n\n",
        before = scale.before_analyze_samples,
        samples = scale.latency_samples,
        autovacuum = autovacuum,
        autovacuum_note = if autovacuum == "on" {
            "it analyzes a table on its own a while after a large change"
        } else {
            "nothing analyzes a table unless asked"
        },
    ));
    out.push_str("| store | jobs queued | dequeues | p50 ms | p95 ms | p99 ms | max ms | rows read per dequeue | fill jobs/s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for l in &sqlite.latency {
        out.push_str(&format!(
            "| SQLite | {} | {} | {:.2} | {:.2} | {:.2} | – | – | {:.0} |\n",
            l.queued, scale.latency_samples, l.p50, l.p95, l.p99, l.fill_rate
        ));
    }
    let mut pg = Vec::new();
    for queued in scale.queued {
        let l = latency(
            Store::Postgres,
            queued,
            scale.latency_samples,
            scale.before_analyze_samples,
        )
        .await;
        if let Some(b) = l.before_analyze {
            out.push_str(&format!(
                "| PostgreSQL, as filled | {} | {} | {:.2} | – | – | {:.2} | {:.0} | {:.0} |\n",
                queued, b.samples, b.p50, b.max, b.rows_read, l.fill_rate
            ));
        }
        out.push_str(&format!(
            "| PostgreSQL, after `ANALYZE` | {} | {} | {:.2} | {:.2} | {:.2} | – | {} | – |\n",
            queued,
            scale.latency_samples,
            l.p50,
            l.p95,
            l.p99,
            l.rows_read.map_or("–".into(), |r| format!("{r:.0}")),
        ));
        pg.push(l);
    }
    let ratio = pg[1].p50 / pg[0].p50;
    let first_ratio = match (pg[1].before_analyze, pg[0].before_analyze) {
        (Some(big), Some(small)) => big.p50 / small.p50,
        _ => f64::NAN,
    };
    out.push_str(&format!(
        "\nRatio of p50 at {} jobs to p50 at {} jobs: PostgreSQL after `ANALYZE` {:.2} (goal ≤ 1.5: {}); PostgreSQL as filled {:.2}; SQLite {:.2}.\n",
        scale.queued[1],
        scale.queued[0],
        ratio,
        if ratio <= 1.5 { "met" } else { "not met" },
        first_ratio,
        sqlite
            .latency
            .get(1)
            .zip(sqlite.latency.first())
            .map_or(f64::NAN, |(big, small)| big.p50 / small.p50),
    ));

    // 3. Wake-up of a held dequeue.
    out.push_str("\n### Wake-up: CreateJob answered → the held dequeue answered\n\n");
    out.push_str(&format!(
        "A dequeue (`waitMs` 30000, a lease) is sent to the holding server and left until its `/healthz` counts it waiting (its claim found nothing); then CreateJob for its name is sent to the creating server, and the time from CreateJob's answer to the held dequeue's answer is taken (the client's monotonic clock; both answers parsed). Across servers, the creating server's commit sends `NOTIFY`, the holding server's listener receives it and wakes the request, which claims the job with its own commit. {} samples one after another, each job then finished; one run on fresh servers and a fresh database. A negative sample means the dequeue answered first.\n\n",
        scale.wake_samples
    ));
    out.push_str("| store | created on → held on | p50 ms | p95 ms | p99 ms | max ms |\n| --- | --- | --- | --- | --- | --- |\n");
    let cases: [(&str, Store, usize, &str); 3] = [
        ("SQLite", Store::Sqlite, 1, "A → A"),
        ("PostgreSQL", Store::Postgres, 1, "A → A"),
        ("PostgreSQL", Store::Postgres, 2, "A → B"),
    ];
    for (name, store, servers, how) in cases {
        let up = Servers::start(store, servers);
        let urls = up.urls();
        let ms = wake_latencies(&urls[0], &urls[servers - 1], scale.wake_samples).await;
        out.push_str(&format!(
            "| {name} | {how} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            percentile(&ms, 0.5),
            percentile(&ms, 0.95),
            percentile(&ms, 0.99),
            ms[ms.len() - 1],
        ));
    }
    format!(
        "## PostgreSQL store: several servers on one database\n\n{provenance}\n\n\
         - Database: {description}. Each measure creates a database of its own (`jobmgr_bench_<pid>_<n>`), starts the release `jobmgr server --db postgres://…` processes on it, and drops it afterwards. Servers, PostgreSQL and clients share the machine's cores.\n\
         - These sections took {:.0} s. 1-minute load average when they started: {load_before}; when they ended: {} (other work on the machine would show here).\n\n{out}",
        started.elapsed().as_secs_f64(),
        load_average(),
    )
}
