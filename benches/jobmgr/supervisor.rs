//! The supervisor's measures: dispatch latency (CreateJob acknowledged →
//! the worker's first instruction), end-to-end throughput of no-op jobs next
//! to the machine's raw fork/exec/wait rate, and the supervisor's footprint
//! (idle CPU and requests, RSS idle, with 100 workers, and over 100,000
//! jobs).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Scale;
use crate::common::*;

/// The shell worker: appends its job id to the marks file.
const SH_WORKER: &str = "#!/bin/sh\necho \"$JOBMGR_JOB_ID 0\" >> \"$BENCH_MARKS\"\n";

/// A worker that says it started, then waits for the release file.
const HOLD_WORKER: &str = "#!/bin/sh\necho \"$JOBMGR_JOB_ID 0\" >> \"$BENCH_MARKS\"\n\
     while [ ! -e \"$BENCH_RELEASE\" ]; do sleep 0.2; done\n";

/// The lines workers append to one file: `<job id> <monotonic ns>`.
struct Marks {
    path: PathBuf,
    read: u64,
    partial: String,
    lines: Vec<(i64, i64)>,
}

impl Marks {
    fn new(path: PathBuf) -> Self {
        // Workers of other uids (the full sandbox) reach it too.
        if let Some(dir) = path.parent() {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::write(&path, "").expect("marks file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        Marks {
            path,
            read: 0,
            partial: String::new(),
            lines: Vec::new(),
        }
    }

    /// Reads what was appended since the last call.
    fn refresh(&mut self) {
        let mut file = std::fs::File::open(&self.path).expect("marks");
        file.seek(SeekFrom::Start(self.read)).expect("seek");
        let mut text = String::new();
        self.read += file.read_to_string(&mut text).expect("read marks") as u64;
        self.partial.push_str(&text);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            let mut words = line.split_whitespace();
            let id = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            let at = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            self.lines.push((id, at));
        }
    }

    /// Waits for job `id`'s line; returns its timestamp.
    fn wait_for(&mut self, id: i64) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.refresh();
            if let Some((_, at)) = self.lines.iter().rev().find(|(i, _)| *i == id) {
                return *at;
            }
            assert!(Instant::now() < deadline, "job {id} never ran");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits until there are `count` lines.
    fn wait_count(&mut self, count: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            self.refresh();
            if self.lines.len() >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {count} jobs ran",
                self.lines.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A worker directory with `Noop` (compiled), `NoopNoLibc` (compiled
/// without a C library, where it can be), `Sh` and `Hold`.
struct Workers {
    dir: tempfile::TempDir,
    compiled: bool,
    no_libc: bool,
}

impl Workers {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let compiled = compile_noop_worker(dir.path(), "Noop").is_some();
        let no_libc = compile_noop_worker_nolibc(dir.path(), "NoopNoLibc").is_some();
        for (name, script) in [("Sh", SH_WORKER), ("Hold", HOLD_WORKER)] {
            let path = dir.path().join(name);
            std::fs::write(&path, script).expect("worker");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        Workers {
            dir,
            compiled,
            no_libc,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The flags of the full sandbox as root: a uid of each job's own (and
/// so a helper that kills what is left of it after each job), rlimits, and
/// the cgroup per job and `no_new_privs` that every job gets anyway.
const FULL_SANDBOX: [&str; 6] = [
    "--user",
    "dynamic",
    "--limit-nofile",
    "1024",
    "--limit-core",
    "0",
];

fn full_sandbox() -> Vec<String> {
    FULL_SANDBOX.iter().map(|s| s.to_string()).collect()
}

fn env_args(marks: &Path, extra: &[String]) -> Vec<String> {
    let mut args = vec![
        "--env".to_string(),
        format!("BENCH_MARKS={}", marks.display()),
    ];
    args.extend_from_slice(extra);
    args
}

fn create_batch(client: &reqwest::blocking::Client, base: &str, name: &str, count: usize) {
    let mut left = count;
    while left > 0 {
        let n = left.min(5_000);
        let jobs: Vec<Value> = (0..n).map(|_| json!({ "name": name })).collect();
        post(
            client,
            &format!("{base}/jobs/batch"),
            &json!({ "jobs": jobs }),
        );
        left -= n;
    }
}

/// Dispatch latencies in ms (sorted) of `samples` jobs created one after
/// another at `base`, each measured from its acknowledgement to the
/// worker's first instruction.
fn dispatch_latencies(base: &str, marks: &mut Marks, samples: usize) -> Vec<f64> {
    let client = crate::common::client();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples + 20 {
        let created = post(
            &client,
            &format!("{base}/jobs"),
            &json!({"name": "bench/Noop"}),
        );
        let acknowledged = monotonic_ns();
        let id = created["jobID"].as_i64().expect("jobID");
        let started = marks.wait_for(id);
        // The first 20 warm the caches and the connection.
        if i >= 20 {
            out.push((started - acknowledged) as f64 / 1e6);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// The machine's raw fork/exec/wait rate for `worker`, `concurrency`
/// threads at once, `count` in all.
fn raw_spawn_rate(worker: &Path, concurrency: usize, count: usize, scratch: &Path) -> f64 {
    let marks = scratch.join("raw-marks");
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..concurrency {
            let marks = &marks;
            scope.spawn(move || {
                for _ in 0..count / concurrency {
                    let status = Command::new(worker)
                        .env_clear()
                        .env("BENCH_MARKS", marks)
                        .env("JOBMGR_JOB_ID", "0")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .expect("spawn");
                    assert!(status.success());
                }
            });
        }
    });
    let rate = (count / concurrency * concurrency) as f64 / start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&marks);
    rate
}

/// Whether the binary measured has `--fetch-ahead` (an older build, given
/// in `JOBMGR_BENCH_BIN`, may not).
fn supports_fetch_ahead() -> bool {
    Command::new(bin())
        .arg("--help")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("--fetch-ahead"))
}

/// One row of the throughput table.
struct Row {
    /// The worker's file name.
    worker: &'static str,
    label: String,
    /// With the full sandbox.
    sandboxed: bool,
    /// With `--fetch-ahead 4N`.
    ahead: bool,
}

/// The throughput rows: each compiled no-op worker built here, plain, in
/// the full sandbox, fetching ahead and both (fetching ahead only where
/// the binary measured has it), and the `/bin/sh` worker; with a note for
/// each kind of row skipped.
fn throughput_rows(workers: &Workers) -> (Vec<Row>, Vec<&'static str>) {
    let fetch_ahead = supports_fetch_ahead();
    let mut notes = Vec::new();
    if !fetch_ahead {
        notes.push("the binary measured has no `--fetch-ahead`: its rows are skipped");
    }
    if !workers.no_libc {
        notes.push(
            "the worker without libc could not be built (it needs x86_64 Linux and `cc`): its rows are skipped",
        );
    }
    let mut rows = Vec::new();
    for (name, plain, short, built) in [
        ("Noop", "compiled (C, static)", "compiled", workers.compiled),
        (
            "NoopNoLibc",
            "without libc",
            "without libc",
            workers.no_libc,
        ),
    ] {
        for (sandboxed, ahead) in [(false, false), (true, false), (false, true), (true, true)] {
            if !built || (ahead && !fetch_ahead) {
                continue;
            }
            let label = match (sandboxed, ahead) {
                (false, false) => plain.to_string(),
                (true, false) => format!("{short}, full sandbox"),
                (false, true) => format!("{short}, `--fetch-ahead 4N`"),
                (true, true) => format!("{short}, full sandbox, `--fetch-ahead 4N`"),
            };
            rows.push(Row {
                worker: name,
                label,
                sandboxed,
                ahead,
            });
        }
    }
    // The shell worker after the first row, as the report always had it.
    let shell = Row {
        worker: "Sh",
        label: "`/bin/sh` script".to_string(),
        sandboxed: false,
        ahead: false,
    };
    rows.insert(1.min(rows.len()), shell);
    (rows, notes)
}

/// One end-to-end run: jobs per second, the CPU milliseconds per job of
/// the supervisor and of the server, and the server's requests per job.
struct Run {
    rate: f64,
    supervisor_ms: f64,
    server_ms: f64,
    requests: f64,
}

/// `count` no-op jobs queued first, then a supervisor with `concurrency`
/// slots started and timed until the last one ran.
fn throughput(
    workers: &Workers,
    name: &str,
    concurrency: usize,
    count: usize,
    extra: &[String],
) -> Run {
    let server = ServerProcess::start();
    let client = crate::common::client();
    create_batch(&client, &server.url, &format!("bench/{name}"), count);
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut marks = Marks::new(scratch.path().join("marks"));
    let requests_before = server.requests();
    let start = Instant::now();
    let server_before = server.cpu_seconds();
    let supervisor = SupervisorProcess::start(SupervisorSpec {
        server: Some(&server.url),
        workers: workers.path(),
        max_workers: concurrency,
        args: env_args(&marks.path, extra),
    });
    marks.wait_count(count, Duration::from_secs(600));
    let elapsed = start.elapsed();
    let supervisor_ms = supervisor.cpu_seconds() * 1000.0 / count as f64;
    let server_ms = (server.cpu_seconds() - server_before) * 1000.0 / count as f64;
    // The last reports land just after the last worker ran (within the
    // 50 ms a report waits for a fetch to take it): counted once the count
    // holds still for 200 ms. The scrapes go to the metrics port, which
    // counts no request.
    let reported = || server.requests() - requests_before;
    let mut requests = reported();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = reported();
        if now == requests {
            break;
        }
        requests = now;
    }
    Run {
        rate: count as f64 / elapsed.as_secs_f64(),
        supervisor_ms,
        server_ms,
        requests: requests / count as f64,
    }
}

/// How reports reached the server in one run of `count` compiled no-op
/// jobs, in % (with a fetch, with other reports, alone), and how many times
/// the spawner slept a job.
struct Ways {
    fetch: f64,
    batch: f64,
    alone: f64,
    spawner_sleeps: f64,
}

/// How many times `pid` has gone to sleep (its voluntary context switches).
fn sleeps(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0)
}

fn ways(workers: &Workers, count: usize, max_workers: usize, extra: &[&str]) -> Ways {
    let server = ServerProcess::start();
    let client = crate::common::client();
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut marks = Marks::new(scratch.path().join("marks"));
    let mut args: Vec<String> = ["--metrics", "127.0.0.1:0"].map(String::from).to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    let supervisor = SupervisorProcess::start(SupervisorSpec {
        server: Some(&server.url),
        workers: workers.path(),
        max_workers,
        args: env_args(&marks.path, &args),
    });
    let metrics = field(&supervisor.ready, "metrics");
    let spawner = supervisor.helpers().first().copied();
    let slept = spawner.map_or(0.0, sleeps);
    create_batch(&client, &server.url, "bench/Noop", count);
    marks.wait_count(count, Duration::from_secs(600));
    let spawner_sleeps = spawner.map_or(0.0, |pid| (sleeps(pid) - slept) / count as f64);
    // The last reports land just after the last worker ran.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = client
            .get(format!("http://{metrics}/metrics"))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default();
        if total(&text, "jobmgr_reports_sent_total") >= count as f64 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let way = |way: &str| {
        sample(
            &text,
            "jobmgr_reports_sent_total",
            &[&format!("way=\"{way}\"")],
        )
        .unwrap_or(0.0)
            * 100.0
            / count as f64
    };
    Ways {
        fetch: way("fetch"),
        batch: way("batch"),
        alone: way("alone"),
        spawner_sleeps,
    }
}

/// The section on how reports reach the server: the share that rides on
/// a fetch (none a request of its own), that goes with other reports, and
/// alone, under a backlog at N = 1, 4 and 8 and at a start-up ramp's
/// ceiling, and the spawner's sleeps a job.
fn report_ways(workers: &Workers, scale: Scale) -> String {
    let count = scale.throughput_jobs;
    let mut out = String::from("\n## How reports reach the server\n\n");
    out.push_str(&format!(
        "{count} compiled no-op jobs queued on a fresh `jobmgr server`, run by a supervisor with `--metrics`; the shares are its `jobmgr_reports_sent_total{{way=…}}` over the jobs: *with a fetch* rode on a `POST /dequeue` (no request of its own), *batched* went in a `POST /reports` with others, *alone* to its own endpoint. A report rides when a fetch follows its freed slot, or one on its way under a backlog answers, within 50 ms: so these shares depend on the machine's speed and load, and are figures here, never assertions in a test (the tests assert that each report is answered once, whichever way it went). The ramp row starts at one worker and adds one a second (`--ramp 1`, `--max-workers 100`), so its gate stays closed at the ramp's ceiling. Spawner sleeps are its voluntary context switches a job, over the run (a job's end told with the next spawn request saves one a job; several requests read in one wake at N > 1 save more). {} runs each; median (min–max).\n\n",
        scale.repeats
    ));
    out.push_str(
        "| case | with a fetch % | batched % | alone % | spawner sleeps/job |\n| --- | --- | --- | --- | --- |\n",
    );
    let cases: [(&str, usize, &[&str]); 4] = [
        ("backlog, N = 1", 1, &[]),
        ("backlog, N = 4", 4, &[]),
        ("backlog, N = 8", 8, &[]),
        (
            "ramp's ceiling (`--ramp 1`, N = 100)",
            100,
            &["--ramp", "1"],
        ),
    ];
    for (label, max_workers, extra) in cases {
        let runs: Vec<Ways> = (0..scale.repeats)
            .map(|_| ways(workers, count, max_workers, extra))
            .collect();
        let column = |f: fn(&Ways) -> f64, decimals| spread(runs.iter().map(f).collect(), decimals);
        out.push_str(&format!(
            "| {label} | {} | {} | {} | {} |\n",
            column(|w| w.fetch, 0),
            column(|w| w.batch, 0),
            column(|w| w.alone, 0),
            column(|w| w.spawner_sleeps, 2),
        ));
    }
    out
}

/// The report's supervisor sections (the footprint only if `footprint`).
pub fn report(scale: Scale, footprint: bool) -> String {
    let mut out = String::new();
    let workers = Workers::new();
    if !workers.compiled {
        out.push_str("\n**No C compiler (`cc`): the compiled-worker measures are skipped.**\n");
        return out;
    }

    // 1. Dispatch latency.
    out.push_str(
        "\n## Dispatch latency: CreateJob acknowledged → the worker's first instruction\n\n",
    );
    out.push_str(&format!(
        "A compiled no-op worker reads CLOCK_MONOTONIC as its first instruction and appends it to a file; the client reads the same clock when CreateJob's answer arrives. Jobs are created one after another (the next once the last one ran), the supervisor waiting in its long-poll each time. {} runs of {} samples (after 20 warm-up jobs); median (min–max) over the runs. A negative sample means the worker started before the client had read the answer.\n\n",
        scale.repeats, scale.dispatch_samples
    ));
    out.push_str("| server | p50 ms | p95 ms | p99 ms |\n| --- | --- | --- | --- |\n");
    for (embedded, sandboxed) in [(false, false), (true, false), (false, true)] {
        let (mut p50, mut p95, mut p99) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..scale.repeats {
            let server = (!embedded).then(ServerProcess::start);
            let scratch = tempfile::tempdir().expect("temp dir");
            let mut marks = Marks::new(scratch.path().join("marks"));
            let supervisor = SupervisorProcess::start(SupervisorSpec {
                server: server.as_ref().map(|s| s.url.as_str()),
                workers: workers.path(),
                max_workers: 8,
                args: env_args(
                    &marks.path,
                    &if sandboxed {
                        full_sandbox()
                    } else {
                        Vec::new()
                    },
                ),
            });
            let base = match &server {
                Some(server) => server.url.clone(),
                None => field(&supervisor.ready, "http"),
            };
            let latencies = dispatch_latencies(&base, &mut marks, scale.dispatch_samples);
            p50.push(percentile(&latencies, 0.5));
            p95.push(percentile(&latencies, 0.95));
            p99.push(percentile(&latencies, 0.99));
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            match (embedded, sandboxed) {
                (true, _) => "embedded (in-process fetch; CreateJob over HTTP)",
                (false, false) => "`jobmgr server` over HTTP",
                (false, true) => "`jobmgr server` over HTTP, full sandbox",
            },
            spread(p50, 2),
            spread(p95, 2),
            spread(p99, 2)
        ));
    }

    // 2. End-to-end throughput against the raw spawn rate.
    out.push_str("\n## End-to-end throughput of no-op jobs, against the raw spawn rate\n\n");
    out.push_str(&format!(
        "{} no-op jobs are queued on a fresh `jobmgr server`, then a supervisor with `--max-workers N` is started and timed until the last worker ran (its start-up included). Each job is a lease, a fork/exec with stdin/stdout/stderr pipes and a scratch directory, a wait and a durable FinishJob (sent with others that are ready at the same moment, or with the next fetch). The raw rate is the same worker started by this harness with `std::process::Command` (fork/exec/wait, nothing else) from N threads, {} times, in the same run. The `--fetch-ahead 4N` rows hold up to 4N jobs more than `--max-workers` while every slot is taken, so that a slot that frees starts its next job without waiting for a fetch (opt-in; the default fetches only for a free slot). Server requests/job counts every request the server answered during the run (fetches, reports sent by themselves or together, heartbeats), divided by the jobs: a report that rides on a fetch adds none. The rows *without libc* run the same no-op built without a C library (`noop_worker_nolibc.c`, raw system calls): a C library's start-up is the worker's own cost, and glibc's probe of the CPU's caches (`cpuid`, which traps to the hypervisor on Intel hosts under KVM) can cost as much as the supervisor and the server together there; these rows show the spawn path alone on any host. {} runs each; median (min–max).\n\n",
        scale.throughput_jobs, scale.throughput_jobs, scale.repeats
    ));
    out.push_str(
        "| worker | N | jobs/s | raw spawns/s | ratio | supervisor CPU ms/job | server CPU ms/job | server requests/job |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let scratch = tempfile::tempdir().expect("temp dir");
    // (jobs/s, raw spawns/s at N = 1, supervisor ms, server ms) of the
    // compiled worker at N = 8, for the analysis below.
    let mut bound = (0.0, 0.0, 0.0, 0.0);
    let (rows, notes) = throughput_rows(&workers);
    for Row {
        worker: name,
        label,
        sandboxed,
        ahead,
    } in rows
    {
        let program = workers.path().join(name);
        let extra = if sandboxed {
            full_sandbox()
        } else {
            Vec::new()
        };
        for concurrency in [1, 2, 8] {
            let mut extra = extra.clone();
            if ahead {
                extra.extend(["--fetch-ahead".to_string(), (4 * concurrency).to_string()]);
            }
            let (mut jobs, mut raw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let (mut supervisor_ms, mut server_ms, mut requests) =
                (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..scale.repeats {
                let run = throughput(&workers, name, concurrency, scale.throughput_jobs, &extra);
                let limit =
                    raw_spawn_rate(&program, concurrency, scale.throughput_jobs, scratch.path());
                jobs.push(run.rate);
                raw.push(limit);
                ratios.push(run.rate / limit * 100.0);
                supervisor_ms.push(run.supervisor_ms);
                server_ms.push(run.server_ms);
                requests.push(run.requests);
            }
            let median = |v: &Vec<f64>| median_and_spread(v.clone()).0;
            if name == "Noop" && !sandboxed && !ahead && concurrency == 1 {
                bound.1 = median(&raw);
            }
            if name == "Noop" && !sandboxed && !ahead && concurrency == 8 {
                bound.0 = median(&jobs);
                bound.2 = median(&supervisor_ms);
                bound.3 = median(&server_ms);
            }
            out.push_str(&format!(
                "| {label} | {concurrency} | {} | {} | {} % | {} | {} | {} |\n",
                spread(jobs, 0),
                spread(raw, 0),
                spread(ratios, 0),
                spread(supervisor_ms, 2),
                spread(server_ms, 2),
                spread(requests, 2)
            ));
        }
    }
    for note in notes {
        out.push_str(&format!("\n*Skipped: {note}.*\n"));
    }

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (rate, raw_one, supervisor_ms, server_ms) = bound;
    let worker_ms = 1000.0 / raw_one;
    let cpu_bound = cores * 1000.0 / (supervisor_ms + server_ms + worker_ms);
    out.push_str(&format!(
        "\n**What limits it.** Every process here shares {cores:.0} cores, so jobs/s can be no more than cores ÷ (CPU per job). At N = 8 with the compiled worker, a job costs {supervisor_ms:.2} ms of supervisor CPU, {server_ms:.2} ms of server CPU (its claim and its report, each a request and a durable commit that jobs share under load: a batch of hand-outs per dequeue, reports riding on the fetches or sent together) and about {worker_ms:.2} ms for the fork/exec/wait itself (one raw spawn at N = 1): at most {cpu_bound:.0} jobs/s on this machine, of which the measured {rate:.0} jobs/s is {:.0} %. The raw spawn rate has none of the lease, the scratch directory, the pipes, the sandbox (a cgroup per job when run as root), the report or the server, so the raw rate cannot be met with the server on the same cores. Workers are started by the spawner, a single-threaded process forked before the supervisor's runtime, so a fork no longer copies the runtime's page tables; profiling the supervisor and its spawner (`perf record -g` during this measure) puts most of what is left in the kernel: the job's scratch directory and cgroup (`mkdir`, `rmdir`), the spawner's `clone`, and switches between the runtime's threads. BENCHMARKS.md's section on the spawn path has the measures of each step.\n",
        rate / cpu_bound * 100.0
    ));

    out.push_str(&report_ways(&workers, scale));

    if !footprint {
        return out;
    }

    // 3. Footprint.
    out.push_str("\n## Supervisor footprint\n\n");
    out.push_str(&format!(
        "Idle: a supervisor (default `--poll-wait 30s`) against a `jobmgr server` with nothing to do, watched for {:?} after a 2 s settle; requests are the server's own count (`jobmgr_server_requests_total`). {} runs; median (min–max).\n\n",
        scale.idle_watch, scale.repeats
    ));
    let (mut cpu, mut requests, mut idle_rss, mut busy_rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut helper_idle_rss, mut helper_busy_rss) = (Vec::new(), Vec::new());
    for _ in 0..scale.repeats {
        let server = ServerProcess::start();
        let scratch = tempfile::tempdir().expect("temp dir");
        let marks = Marks::new(scratch.path().join("marks"));
        let supervisor = SupervisorProcess::start(SupervisorSpec {
            server: Some(&server.url),
            workers: workers.path(),
            max_workers: 100,
            args: env_args(
                &marks.path,
                &[
                    "--env".into(),
                    format!("BENCH_RELEASE={}", scratch.path().join("release").display()),
                ],
            ),
        });
        std::thread::sleep(Duration::from_secs(2));
        let count = || {
            let text = crate::common::client()
                .get(format!("http://{}/metrics", server.metrics))
                .send()
                .expect("scrape")
                .text()
                .expect("text");
            sample(
                &text,
                "jobmgr_server_requests_total",
                &["route=\"/dequeue\""],
            )
            .unwrap_or(0.0)
        };
        let (cpu_before, requests_before) = (supervisor.cpu_seconds(), count());
        std::thread::sleep(scale.idle_watch);
        cpu.push((supervisor.cpu_seconds() - cpu_before) / scale.idle_watch.as_secs_f64() * 100.0);
        requests.push(count() - requests_before);
        idle_rss.push(supervisor.rss() as f64 / 1048576.0);
        helper_idle_rss.push(supervisor.helpers_rss() as f64 / 1048576.0);

        // 100 workers at once.
        let client = crate::common::client();
        create_batch(&client, &server.url, "bench/Hold", 100);
        let mut marks = marks;
        marks.wait_count(100, Duration::from_secs(120));
        busy_rss.push(supervisor.rss() as f64 / 1048576.0);
        helper_busy_rss.push(supervisor.helpers_rss() as f64 / 1048576.0);
        std::fs::write(scratch.path().join("release"), "").expect("release");
    }
    out.push_str("| measure | value |\n| --- | --- |\n");
    out.push_str(&format!(
        "| idle CPU (% of one core) | {} |\n",
        spread(cpu, 3)
    ));
    out.push_str(&format!(
        "| idle requests in {:?} | {} |\n",
        scale.idle_watch,
        spread(requests, 0)
    ));
    out.push_str(&format!("| RSS idle (MiB) | {} |\n", spread(idle_rss, 1)));
    out.push_str(&format!(
        "| RSS with 100 workers running (MiB) | {} |\n",
        spread(busy_rss, 1)
    ));
    out.push_str(&format!(
        "| its helper process's RSS (spawner or job guard), idle (MiB) | {} |\n",
        spread(helper_idle_rss, 1)
    ));
    out.push_str(&format!(
        "| its helper process's RSS with 100 workers running (MiB) | {} |\n",
        spread(helper_busy_rss, 1)
    ));

    // RSS over many jobs.
    let rounds = scale.rss_rounds;
    let per_round = scale.rss_jobs / rounds;
    out.push_str(&format!(
        "\nRSS over {} compiled no-op jobs (`--max-workers 8`), read after each {} (one run: the series is the measure):\n\n",
        scale.rss_jobs, per_round
    ));
    let server = ServerProcess::start();
    let client = crate::common::client();
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut marks = Marks::new(scratch.path().join("marks"));
    let supervisor = SupervisorProcess::start(SupervisorSpec {
        server: Some(&server.url),
        workers: workers.path(),
        max_workers: 8,
        args: env_args(&marks.path, &[]),
    });
    let mut series = vec![supervisor.rss() as f64 / 1048576.0];
    let start = Instant::now();
    for round in 1..=rounds {
        create_batch(&client, &server.url, "bench/Noop", per_round);
        marks.wait_count(round * per_round, Duration::from_secs(600));
        series.push(supervisor.rss() as f64 / 1048576.0);
    }
    let elapsed = start.elapsed();
    out.push_str("| jobs run | RSS MiB |\n| --- | --- |\n");
    for (i, rss) in series.iter().enumerate() {
        out.push_str(&format!("| {} | {rss:.1} |\n", i * per_round));
    }
    let after_first = series[1];
    let last = series[series.len() - 1];
    out.push_str(&format!(
        "\nGrowth from the first {per_round} jobs to the last reading: {:+.1} MiB ({:+.1} %). {} jobs in {:.0} s ({:.0} jobs/s).\n",
        last - after_first,
        (last - after_first) / after_first * 100.0,
        scale.rss_jobs,
        elapsed.as_secs_f64(),
        scale.rss_jobs as f64 / elapsed.as_secs_f64()
    ));
    out
}
