//! What the dashboard shows of failed runs' output, over plain HTTP: a
//! job's page keeps the head and the tail of a long stream and says so,
//! and a failure group's latest output is that of its latest failure even
//! when the group has more jobs than the page lists.

use crate::common::*;
use crate::ui::{cookie_of, get, log_in};

use serde_json::{Value, json};

/// Takes the job named `name` and fails it with `run` (what a supervisor
/// saw of it).
fn take_and_fail(api: &Api, name: &str, run: Value) -> i64 {
    let taken = api.take(name);
    let id = taken["jobID"].as_i64().expect("a job id");
    let lease = taken["lease"].as_str().expect("a lease").to_string();
    let (status, answer) = api.post(
        &format!("/jobs/{id}/fail"),
        json!({"lease": lease, "run": run}),
    );
    assert_eq!(status, 200, "{answer}");
    id
}

#[test]
fn a_long_output_shows_its_head_and_tail_on_the_jobs_page() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    api.create(json!({"name": "Long"}));
    let stderr = format!("HEAD-{}-TAIL\n", "x".repeat(10_000));
    let id = take_and_fail(
        &api,
        "Long",
        json!({"exitCode": 3, "stderr": stderr, "stderrBytes": stderr.len()}),
    );

    let cookie = cookie_of(&log_in(base, token()));
    let (status, page) = get(base, &format!("/ui/jobs/{id}"), Some(&cookie));
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("stderr: head and tail of {} bytes", stderr.len())),
        "{page}"
    );
    let start = page.find("HEAD-xxx").expect("the head on the page");
    let marker = page
        .find(" bytes of output dropped …]")
        .expect("the marker");
    let end = page.find("xxx-TAIL").expect("the tail on the page");
    assert!(start < marker && marker < end, "{page}");

    // The API's history keeps the same: both ends, within 4 KiB.
    let (_, history) = api.get(&format!("/jobs/{id}/history"));
    let kept = history["attempts"][0]["stderr"].as_str().expect("stderr");
    assert!(kept.len() <= 4096, "{}", kept.len());
    assert!(
        kept.starts_with("HEAD-") && kept.ends_with("-TAIL\n"),
        "{kept}"
    );
}

#[test]
fn a_failure_groups_latest_output_is_its_latest_failures() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    // More failures than the page lists per group (10), one at a time so
    // that each fails after the one before.
    let mut last = 0;
    for n in 1..=12 {
        api.create(json!({"name": "Flaky"}));
        last = take_and_fail(
            &api,
            "Flaky",
            json!({"exitCode": 3, "stderr": format!("failure number {n:02}\n")}),
        );
    }

    let cookie = cookie_of(&log_in(base, token()));
    let (status, page) = get(base, "/ui/failures", Some(&cookie));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("exit:3"), "{page}");
    assert!(
        page.contains("failure number 01"),
        "the first jobs are listed"
    );
    assert!(
        !page.contains("failure number 11"),
        "only the first 10 jobs are listed"
    );
    assert!(
        page.contains("failure number 12"),
        "the latest failure's error and output: {page}"
    );
    assert!(
        page.contains(&format!("<a href=\"/ui/jobs/{last}\">{last}</a></summary>")),
        "the latest failure is named: {page}"
    );
}

/// Thousands of job names (a name per user, as BWM's `Name?query` names
/// make): the overview sums their statistics without a series per name,
/// and the statistics page lists the busiest 50 and says how many there
/// are, instead of building a chart series for each.
#[test]
fn many_names_are_summed_and_the_statistics_page_lists_the_busiest() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    let names = 3000;
    let jobs: Vec<Value> = (0..names)
        .map(|n| json!({"name": format!("Send?user={n}")}))
        .chain((0..5).map(|_| json!({"name": "Busiest"})))
        .collect();
    let (status, answer) = api.post("/jobs/batch", json!({"jobs": jobs}));
    assert_eq!(status, 200, "{answer}");

    let cookie = cookie_of(&log_in(base, token()));
    let (status, overview) = get(base, "/ui?live=1", Some(&cookie));
    assert_eq!(status, 200, "{overview}");
    assert!(
        overview.contains(&format!("<span class=\"n\">{}</span> added", names + 5)),
        "the overview sums every name's jobs added this hour: {overview}"
    );

    let (status, stats) = get(base, "/ui/stats?live=1", Some(&cookie));
    assert_eq!(status, 200, "{stats}");
    assert!(
        stats.contains(&format!("The 50 busiest of {} names", names + 1)),
        "{stats}"
    );
    let per_name = &stats[stats.find("id=\"names-h\"").expect("the per-name table")..];
    assert_eq!(
        per_name.matches("<tr><th scope=\"row\">").count(),
        50,
        "{per_name}"
    );
    let first = per_name.find("Busiest").expect("the busiest name listed");
    let other = per_name.find("Send?user=").expect("other names listed");
    assert!(first < other, "busiest first: {stats}");
}
