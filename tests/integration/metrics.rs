//! The Prometheus endpoints, scraped and parsed: every series the
//! supervisor and the server promise is present and counts what it names.

use serde_json::json;

use crate::common::*;

#[test]
fn the_supervisor_counts_every_outcome_and_the_server_its_queue() {
    let server = Server::builder()
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .start();
    let api = server.api();
    let builder = Supervisor::builder(&server.url);
    let gate = builder.path().join("release");
    let once = builder.path().join("asked-once");
    let sup = builder
        .worker(
            "Echo",
            "#!/bin/sh\ncat > /dev/null\necho '{\"done\":true}'\n",
        )
        .worker("Fail", "#!/bin/sh\nexit 3\n")
        .worker(
            "Later",
            &format!(
                "#!/bin/sh\n[ -e '{0}' ] && exit 0\ntouch '{0}'\nexit 75\n",
                once.display()
            ),
        )
        .worker(
            "Stubborn",
            "#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 1; done\n",
        )
        .worker("Loud", "#!/bin/sh\nhead -c 20000 /dev/zero | tr '\\0' x\n")
        .worker(
            "Hold",
            &format!(
                "#!/bin/sh\nwhile [ ! -e '{}' ]; do sleep 0.1; done\n",
                gate.display()
            ),
        )
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .arg("--max-attempts")
        .arg("1")
        .arg("--output-cap")
        .arg("1KiB")
        .arg("--lease")
        .arg("2s")
        .arg("--config")
        .arg(&{
            let config = server.db().with_extension("metrics.toml");
            std::fs::write(
                &config,
                "[[job]]\nname = \"Stubborn\"\ntimeout = \"500ms\"\n",
            )
            .unwrap();
            config.display().to_string()
        })
        .start();
    let addr = sup.ready_field("metrics");

    // A held job: running workers, lease renewals, and a job the server
    // counts as RUNNING under its name.
    let hold = api.create(json!({"name": "Hold"}));
    let text = scrape_until(&addr, "a held worker with a renewed lease", |text| {
        sample(text, "jobmgr_workers_running", &["pool=\"main\""]) == Some(1.0)
            && sample(text, "jobmgr_lease_renewals_total", &["result=\"ok\""]).unwrap_or(0.0) >= 1.0
            && sample(text, "jobmgr_load1", &[]).is_some()
            && sample(
                text,
                "jobmgr_gate_state",
                &["pool=\"main\"", "state=\"open\""],
            ) == Some(1.0)
    });
    assert!(sample(&text, "jobmgr_load1", &[]).is_some(), "{text}");
    assert_eq!(
        sample(
            &text,
            "jobmgr_gate_state",
            &["pool=\"main\"", "state=\"open\""]
        ),
        Some(1.0),
        "{text}"
    );
    let served = scrape_until(
        &server.metrics,
        "the server to count the held job",
        |text| {
            sample(
                text,
                "jobmgr_server_jobs_by_name",
                &["name=\"Hold\"", "state=\"RUNNING\""],
            ) == Some(1.0)
                && sample(text, "jobmgr_server_jobs", &["state=\"RUNNING\""]) == Some(1.0)
        },
    );
    assert_eq!(
        sample(
            &served,
            "jobmgr_server_jobs_by_name",
            &["name=\"Hold\"", "state=\"RUNNING\""]
        ),
        Some(1.0),
        "{served}"
    );
    assert_eq!(
        sample(&served, "jobmgr_server_jobs", &["state=\"RUNNING\""]),
        Some(1.0),
        "{served}"
    );
    std::fs::write(&gate, "").unwrap();
    poll("the held job to finish", || {
        api.state(hold).is_none().then_some(())
    });

    for name in ["Echo", "Fail", "Later", "Stubborn", "Loud"] {
        api.create(json!({ "name": name }));
    }
    let runs = [
        ("Echo", 1.0),
        ("Fail", 1.0),
        ("Later", 2.0),
        ("Stubborn", 1.0),
        ("Loud", 1.0),
        ("Hold", 1.0),
    ];
    // A report is counted before its worker's slot is given back, and each
    // series is updated on its own: wait for one scrape with every outcome
    // counted and no worker left running.
    let text = scrape_until(
        &addr,
        "every outcome counted and no worker running",
        |text| {
            sample(
                text,
                "jobmgr_jobs_timed_out_total",
                &["worker=\"Stubborn\""],
            ) == Some(1.0)
                && sample(text, "jobmgr_jobs_retried_total", &["worker=\"Later\""]) == Some(1.0)
                && sample(text, "jobmgr_jobs_finished_total", &["worker=\"Later\""]) == Some(1.0)
                && sample(text, "jobmgr_jobs_finished_total", &["worker=\"Loud\""]) == Some(1.0)
                && sample(text, "jobmgr_jobs_finished_total", &["worker=\"Echo\""]) == Some(1.0)
                && sample(text, "jobmgr_jobs_failed_total", &["worker=\"Fail\""]) == Some(1.0)
                && runs.iter().all(|(worker, runs)| {
                    let label = format!("worker=\"{worker}\"");
                    sample(text, "jobmgr_jobs_started_total", &[&label]) == Some(*runs)
                        && sample(text, "jobmgr_job_run_seconds_count", &[&label]) == Some(*runs)
                })
                && sample(text, "jobmgr_kill_escalations_total", &[]) == Some(1.0)
                && sample(text, "jobmgr_output_truncations_total", &[]).unwrap_or(0.0) >= 1.0
                && sample(text, "jobmgr_dispatch_latency_seconds_count", &[]) == Some(7.0)
                && sample(text, "jobmgr_workers_running", &["pool=\"main\""]) == Some(0.0)
        },
    );
    for (worker, runs) in runs {
        let label = format!("worker=\"{worker}\"");
        assert_eq!(
            sample(&text, "jobmgr_jobs_started_total", &[&label]),
            Some(runs),
            "{worker}: {text}"
        );
        assert_eq!(
            sample(&text, "jobmgr_job_run_seconds_count", &[&label]),
            Some(runs),
            "{worker}: {text}"
        );
    }
    assert_eq!(
        sample(&text, "jobmgr_kill_escalations_total", &[]),
        Some(1.0),
        "the stubborn worker needed SIGKILL: {text}"
    );
    assert!(
        sample(&text, "jobmgr_output_truncations_total", &[]).unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "jobmgr_dispatch_latency_seconds_count", &[]),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "jobmgr_workers_running", &["pool=\"main\""]),
        Some(0.0),
        "{text}"
    );

    // The server: the queue by state and by name (emptied names go to 0),
    // the long-poll waiter the supervisor keeps, and commit latency.
    let served = scrape_until(&server.metrics, "the server's view", |text| {
        sample(text, "jobmgr_server_waiters", &[]).unwrap_or(0.0) >= 1.0
            && sample(
                text,
                "jobmgr_server_jobs_by_name",
                &["name=\"Hold\"", "state=\"RUNNING\""],
            ) == Some(0.0)
            && sample(text, "jobmgr_server_jobs", &["state=\"FAILED\""]) == Some(2.0)
            && sample(
                text,
                "jobmgr_server_jobs_by_name",
                &["name=\"Fail\"", "state=\"FAILED\""],
            ) == Some(1.0)
            && sample(text, "jobmgr_server_commit_seconds_count", &[]).unwrap_or(0.0) >= 10.0
            && sample(
                text,
                "jobmgr_server_requests_total",
                &["api=\"http\"", "method=\"POST\"", "route=\"/dequeue\""],
            )
            .unwrap_or(0.0)
                >= 7.0
    });
    assert_eq!(
        sample(&served, "jobmgr_server_jobs", &["state=\"FAILED\""]),
        Some(2.0),
        "Fail and Stubborn: {served}"
    );
    assert_eq!(
        sample(
            &served,
            "jobmgr_server_jobs_by_name",
            &["name=\"Fail\"", "state=\"FAILED\""]
        ),
        Some(1.0),
        "{served}"
    );
    assert!(
        sample(&served, "jobmgr_server_commit_seconds_count", &[]).unwrap_or(0.0) >= 10.0,
        "{served}"
    );
    assert!(
        sample(
            &served,
            "jobmgr_server_requests_total",
            &["api=\"http\"", "method=\"POST\"", "route=\"/dequeue\""]
        )
        .unwrap_or(0.0)
            >= 7.0,
        "every fetch is counted: {served}"
    );
    // A Bedrock request is counted by command, garbage as "unknown".
    bedrock_exchange(&server.bedrock, b"QueryJob\r\njobID: 1\r\n\r\n");
    bedrock_exchange(&server.bedrock, b"Bogus\r\n\r\n");
    let served = scrape_until(&server.metrics, "both Bedrock requests counted", |text| {
        sample(
            text,
            "jobmgr_server_requests_total",
            &["api=\"bedrock\"", "method=\"queryjob\""],
        )
        .is_some()
            && sample(
                text,
                "jobmgr_server_requests_total",
                &["api=\"bedrock\"", "method=\"unknown\""],
            )
            .is_some()
    });
    assert_eq!(
        sample(
            &served,
            "jobmgr_server_requests_total",
            &["api=\"bedrock\"", "method=\"queryjob\""]
        ),
        Some(1.0),
        "{served}"
    );
    assert_eq!(
        sample(
            &served,
            "jobmgr_server_requests_total",
            &["api=\"bedrock\"", "method=\"unknown\""]
        ),
        Some(1.0),
        "{served}"
    );
}
