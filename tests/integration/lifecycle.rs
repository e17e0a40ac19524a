//! The supervisor's life: the embedded server, configuration files and
//! SIGHUP, `--max-iterations`, the version watch file, declared recurring
//! jobs, and the metrics endpoint.

use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::*;

const ECHO_DATA: &str = "#!/bin/sh\ncat > /dev/null\necho '{\"done\":true}'\n";

#[test]
fn without_server_the_supervisor_runs_an_embedded_one_that_clients_can_reach() {
    let sup = Supervisor::embedded().worker("Echo", ECHO_DATA).start();
    let api = Api::new(&sup.ready_field("http"));
    let id = api.create(json!({"name": "Echo", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the embedded server's job to run", || {
        let job = api.job(id);
        (job["data"]["done"] == true).then_some(job)
    });
    assert_eq!(job["state"], "QUEUED");
    // Its Bedrock port answers too.
    let answer = bedrock_exchange(
        &sup.ready_field("bedrock"),
        format!("QueryJob\r\njobID: {id}\r\n\r\n").as_bytes(),
    );
    assert!(answer.starts_with("200 OK"), "{answer}");
}

#[test]
fn max_iterations_starts_that_many_jobs_then_drains_and_exits() {
    let server = Server::start();
    let api = server.api();
    let ids: Vec<i64> = (0..5)
        .map(|i| api.create(json!({"name": "Echo", "data": {"i": i}})))
        .collect();
    let mut sup = Supervisor::builder(&server.url)
        .worker("Echo", ECHO_DATA)
        .arg("--maxIterations")
        .arg("2")
        .start();
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}: {}", sup.stderr());
    let gone = ids.iter().filter(|&&id| api.state(id).is_none()).count();
    let queued = ids
        .iter()
        .filter(|&&id| api.state(id).as_deref() == Some("QUEUED"))
        .count();
    assert_eq!((gone, queued), (2, 3), "exactly two jobs ran");
}

#[test]
fn a_changed_version_watch_file_drains_and_exits() {
    let server = Server::start();
    let api = server.api();
    let builder =
        Supervisor::builder(&server.url).worker("Slow", "#!/bin/sh\ncat > /dev/null\nsleep 2\n");
    let version = builder.path().join("VERSION");
    std::fs::write(&version, "1\n").unwrap();
    let mut sup = builder
        .arg("--versionWatchFile")
        .arg(version.to_str().unwrap())
        .start();
    let id = api.create(json!({"name": "Slow"}));
    poll("the slow job to start", || {
        (api.state(id).as_deref() == Some("RUNNING")).then_some(())
    });
    std::fs::write(&version, "2\n").unwrap();
    let status = sup.wait_exit();
    assert!(status.success(), "{status:?}");
    assert!(
        sup.stderr().contains("version watch file changed"),
        "{}",
        sup.stderr()
    );
    // The running job was let finish, not dropped.
    assert_eq!(api.state(id), None, "the job finished before the exit");
}

#[test]
fn sighup_applies_a_changed_config_to_the_next_job_without_dropping_the_running_one() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url)
        .worker("Env", "#!/bin/sh\ncat > /dev/null\nsleep \"${NAP:-0}\"\necho \"{\\\"color\\\":\\\"$COLOR\\\"}\"\n");
    let config = builder.path().join("jobmgr.toml");
    std::fs::write(&config, "env = { COLOR = \"red\", NAP = \"2\" }\n").unwrap();
    let sup = builder
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();

    let first = api.create(json!({"name": "Env", "repeat": "FINISHED, +1 HOUR"}));
    // Leased is not yet started: a reload between the two applies to the
    // job, so the test waits for the worker's start, not the state.
    poll("the first job to run", || {
        (api.state(first).as_deref() == Some("RUNNING") && sup.stderr().contains("starting worker"))
            .then_some(())
    });
    std::fs::write(&config, "env = { COLOR = \"blue\" }\n").unwrap();
    sup.signal(Signal::SIGHUP);
    poll("the reload to be logged", || {
        sup.stderr()
            .contains("configuration reloaded")
            .then_some(())
    });

    // The job that was running when the signal came kept its settings.
    let job = poll("the first job to finish", || {
        let job = api.job(first);
        (job["state"] == "QUEUED").then_some(job)
    });
    assert_eq!(job["data"]["color"], "red", "{job}");
    let second = api.create(json!({"name": "Env", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the second job to finish", || {
        let job = api.job(second);
        (job["state"] == "QUEUED" && job["data"]["color"].is_string()).then_some(job)
    });
    assert_eq!(job["data"]["color"], "blue", "{job}");

    // A broken file is refused, naming the key, and the settings stay.
    std::fs::write(&config, "colour = \"green\"\n").unwrap();
    sup.signal(Signal::SIGHUP);
    poll("the refusal to be logged", || {
        let log = sup.stderr();
        (log.contains("configuration not reloaded") && log.contains("colour")).then_some(())
    });
    let third = api.create(json!({"name": "Env", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the third job to finish", || {
        let job = api.job(third);
        (job["state"] == "QUEUED" && job["data"]["color"].is_string()).then_some(job)
    });
    assert_eq!(job["data"]["color"], "blue", "{job}");
}

#[test]
fn a_bad_config_file_stops_the_start_with_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    let workers = dir.path().display();
    std::fs::write(
        &config,
        format!("worker-path = \"{workers}\"\nmax-lod = 3\n"),
    )
    .unwrap();
    let output = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&config)
        .run_bounded("jobmgr with a bad config file to refuse to start");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.toml") && stderr.contains("line 2") && stderr.contains("max-lod"),
        "{stderr}"
    );
}

#[test]
fn declared_recurring_jobs_are_created_updated_and_removed_with_the_file() {
    let builder = Supervisor::embedded().worker("Tick", "#!/bin/sh\ncat > /dev/null\n");
    let config = builder.path().join("jobmgr.toml");
    let declare = |entries: &str| std::fs::write(&config, entries).unwrap();
    declare(
        "[[schedule]]\nname = \"Tick\"\nrepeat = \"FINISHED, +1 HOUR\"\ndata = { size = 1 }\n\n\
         [[schedule]]\nname = \"Tock\"\nrepeat = \"DAILY\"\n",
    );
    // Tock has no worker and is not taken: a removed entry whose job is
    // RUNNING at that moment is deleted only a minute later, by design.
    let sup = builder
        .arg("--job-name")
        .arg("Tick")
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();
    let api = Api::new(&sup.ready_field("http"));
    let by_name = |name: &str| -> Option<serde_json::Value> {
        let (_, answer) = api.get(&format!("/jobs?name={name}"));
        answer["jobs"]
            .as_array()
            .and_then(|jobs| jobs.first().cloned())
    };
    let tick = poll("Tick to be declared", || by_name("Tick"));
    poll("Tock to be declared", || by_name("Tock"));
    assert_eq!(tick["repeat"], "FINISHED, +1 HOUR");
    assert_eq!(tick["data"]["size"], 1);

    // Change one entry, remove the other.
    declare(
        "[[schedule]]\nname = \"Tick\"\nrepeat = \"FINISHED, +2 HOURS\"\ndata = { size = 2 }\n",
    );
    sup.signal(Signal::SIGHUP);
    let tick = poll("Tick to follow the file", || {
        by_name("Tick").filter(|job| job["repeat"] == "FINISHED, +2 HOURS")
    });
    assert_eq!(tick["data"]["size"], 2);
    poll("Tock to be removed", || {
        by_name("Tock").is_none().then_some(())
    });
    let (_, all) = api.get("/jobs?name=Tick");
    assert_eq!(
        all["jobs"].as_array().map(Vec::len),
        Some(1),
        "no second Tick: {all}"
    );
}

#[test]
fn metrics_show_the_gate_and_the_jobs() {
    let server = Server::start();
    let api = server.api();
    let sup = Supervisor::builder(&server.url)
        .worker("Echo", ECHO_DATA)
        .worker("Fail", "#!/bin/sh\nexit 3\n")
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .arg("--max-load")
        .arg("2")
        .arg("--max-attempts")
        .arg("1")
        .start();
    let addr = sup.ready_field("metrics");
    let ok = api.create(json!({"name": "Echo"}));
    let bad = api.create(json!({"name": "Fail"}));
    poll("both jobs to be reported", || {
        (api.state(ok).is_none() && api.state(bad).as_deref() == Some("FAILED")).then_some(())
    });
    // Each counter is updated on its own after the report: wait for a
    // scrape that shows them all.
    let text = scrape_until(&addr, "the counters to show", |text| {
        sample(text, "jobmgr_jobs_failed_total", &["worker=\"Fail\""]) == Some(1.0)
            && sample(text, "jobmgr_jobs_finished_total", &["worker=\"Echo\""]) == Some(1.0)
            && sample(text, "jobmgr_jobs_started_total", &["worker=\"Echo\""]) == Some(1.0)
            && sample(text, "jobmgr_job_run_seconds_count", &["worker=\"Echo\""]).is_some()
            && sample(text, "jobmgr_gate_state", &["state=\"open\""]) == Some(1.0)
    });
    assert_eq!(
        sample(&text, "jobmgr_jobs_finished_total", &["worker=\"Echo\""]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "jobmgr_jobs_started_total", &["worker=\"Echo\""]),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "jobmgr_job_run_seconds_count", &["worker=\"Echo\""]).is_some(),
        "{text}"
    );
    assert_eq!(
        sample(&text, "jobmgr_gate_state", &["state=\"open\""]),
        Some(1.0),
        "{text}"
    );

    // High load closes the gate, and the metrics say so. A scrape may fall
    // between the updates of two gauges, so wait for a scrape after all of
    // them.
    sup.set_load(9.0);
    let text = scrape_until(&addr, "the gate to show as closed by load", |text| {
        sample(text, "jobmgr_gate_state", &["state=\"load\""]) == Some(1.0)
            && sample(text, "jobmgr_gate_state", &["state=\"open\""]) == Some(0.0)
            && sample(text, "jobmgr_load1", &[]) == Some(9.0)
    });
    assert_eq!(sample(&text, "jobmgr_load1", &[]), Some(9.0), "{text}");
    assert_eq!(
        sample(&text, "jobmgr_gate_state", &["state=\"open\""]),
        Some(0.0),
        "{text}"
    );
}

#[test]
fn job_tables_set_timeout_retries_env_and_concurrency_by_name() {
    let server = Server::start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url)
        .worker("SlowOne", "#!/bin/sh\ncat > /dev/null\nsleep 30\n")
        .worker("Env", "#!/bin/sh\ncat > /dev/null\necho \"{\\\"flavour\\\":\\\"$FLAVOUR\\\"}\"\n")
        .worker(
            "Limited",
            "#!/bin/sh\ncat > /dev/null\nmkdir \"$MARKS/$JOBMGR_JOB_ID\"\n\
             n=$(ls \"$MARKS\" | wc -l)\necho $n >> \"$MARKS.seen\"\nsleep 0.3\nrmdir \"$MARKS/$JOBMGR_JOB_ID\"\n",
        );
    let marks = builder.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let config = builder.path().join("jobmgr.toml");
    std::fs::write(
        &config,
        format!(
            "env = {{ FLAVOUR = \"plain\", MARKS = \"{}\" }}\n\n\
             [[job]]\nname = \"Slow*\"\ntimeout = \"1s\"\nmax-attempts = 1\n\n\
             [[job]]\nname = \"Env\"\nenv = {{ FLAVOUR = \"special\" }}\n\n\
             [[job]]\nname = \"Limited\"\nmax-concurrency = 1\n",
            marks.display()
        ),
    )
    .unwrap();
    let _sup = builder
        .arg("--config")
        .arg(config.to_str().unwrap())
        .arg("--max-workers")
        .arg("4")
        .start();

    let slow = api.create(json!({"name": "SlowOne"}));
    let job = poll("the slow job to time out and fail at once", || {
        let job = api.job(slow);
        (job["state"] == "FAILED").then_some(job)
    });
    assert_eq!(job["data"]["_jobmgr"]["outcome"], "timeout", "{job}");

    let env = api.create(json!({"name": "Env", "repeat": "FINISHED, +1 HOUR"}));
    let job = poll("the env job to finish", || {
        let job = api.job(env);
        job["data"]["flavour"].is_string().then_some(job)
    });
    assert_eq!(
        job["data"]["flavour"], "special",
        "the table's env wins: {job}"
    );

    let ids: Vec<i64> = (0..6)
        .map(|_| api.create(json!({"name": "Limited"})))
        .collect();
    poll("the limited jobs to finish", || {
        ids.iter().all(|&id| api.state(id).is_none()).then_some(())
    });
    let seen = std::fs::read_to_string(marks.with_extension("seen")).unwrap();
    let most = seen
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .max()
        .unwrap();
    assert_eq!(most, 1, "never more than one Limited at once: {seen}");
}

#[test]
fn a_bad_job_table_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    let workers = dir.path().display();
    std::fs::write(
        &config,
        format!("worker-path = \"{workers}\"\n\n[[job]]\nname = \"x*\"\nmax-concurrency = 0\n"),
    )
    .unwrap();
    let output = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&config)
        .run_bounded("jobmgr with a bad job table to refuse to start");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("[[job]] \"x*\"") && stderr.contains("max-concurrency"),
        "{stderr}"
    );
    std::fs::write(
        &config,
        format!("worker-path = \"{workers}\"\n\n[[job]]\nname = \"x*\"\ntimout = \"1s\"\n"),
    )
    .unwrap();
    let output = jobmgr_in(dir.path())
        .arg("--config")
        .arg(&config)
        .run_bounded("jobmgr with a misspelt job table key to refuse to start");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("timout") && stderr.contains("line"),
        "{stderr}"
    );
}

#[test]
fn a_second_supervisor_on_the_same_spool_is_refused() {
    let server = Server::start();
    let mut first = Supervisor::builder(&server.url)
        .worker("Echo", ECHO_DATA)
        .start();
    // Only a live first supervisor holding its spool makes the second one
    // a second: otherwise it would start, and this would test nothing.
    poll("the first supervisor to hold its spool's lock", || {
        first.assert_running("the first supervisor must hold the spool");
        spool_is_locked(&first.spool()).then_some(())
    });
    let empty = first.dir.path().join("second.toml");
    std::fs::write(&empty, "").unwrap();
    let output = jobmgr_in(first.dir.path())
        .arg("--config")
        .arg(&empty)
        .args(["--server", &server.url, "--worker-path"])
        .arg(first.workers())
        .arg("--spool-dir")
        .arg(first.spool())
        .arg("--scratch-dir")
        .arg(first.dir.path().join("scratch2"))
        .arg("--status-file")
        .arg(first.dir.path().join("status2.json"))
        .args(["--user", "self"])
        .run_bounded("a second supervisor on the same spool to be refused");
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("in use by another supervisor") && stderr.contains("--spool-dir"),
        "{stderr}"
    );
    // The first one is unharmed: it still holds the spool and runs jobs.
    first.assert_running("the first supervisor must outlive the refusal");
    assert!(
        spool_is_locked(&first.spool()),
        "the first supervisor let its spool go"
    );
    let api = server.api();
    let id = api.create(json!({"name": "Echo", "repeat": "FINISHED, +1 HOUR"}));
    poll("the first supervisor to run a job", || {
        let job = api.job(id);
        (job["data"]["done"] == true).then_some(())
    });
}
