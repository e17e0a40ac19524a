//! The overview's last hour by minute, over plain HTTP: a job finished and
//! one failed through this server show in the minute charts, with the wait
//! of their hand-outs, and the page says what the counts cover.

use crate::common::*;
use crate::ui::{cookie_of, get, log_in};

use serde_json::{Value, json};

/// The JSON of the chart `id` on a page.
fn chart(page: &str, id: &str) -> Value {
    let open = format!("<script type=\"application/json\" id=\"{id}\">");
    let start = page.find(&open).unwrap_or_else(|| panic!("{id}: {page}")) + open.len();
    let end = start + page[start..].find("</script>").expect("the script's end");
    serde_json::from_str(&page[start..end]).expect("the chart as JSON")
}

/// The sum of a chart's dataset `n`.
fn total(chart: &Value, n: usize) -> u64 {
    chart["datasets"][n]["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(Value::as_u64)
        .sum()
}

#[test]
fn the_last_hour_shows_by_minute_what_this_server_committed() {
    let server = Server::start();
    let api = server.api();
    let base = server.url.as_str();
    let cookie = cookie_of(&log_in(base, token()));

    let (status, page) = get(base, "/ui", Some(&cookie));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("The last hour, by minute"), "{page}");
    assert!(page.contains("since this server started"), "{page}");
    let throughput = chart(&page, "chart-minute-throughput");
    assert_eq!(throughput["labels"].as_array().map(Vec::len), Some(60));
    assert_eq!((total(&throughput, 0), total(&throughput, 1)), (0, 0));

    for (name, verb) in [("Good", "finish"), ("Bad", "fail")] {
        let id = api.create(json!({"name": name}));
        let job = api.take(name);
        let (status, answer) = api.post(
            &format!("/jobs/{id}/{verb}"),
            json!({"lease": job["lease"]}),
        );
        assert_eq!(status, 200, "{answer}");
    }

    let (status, page) = get(base, "/ui?live=1", Some(&cookie));
    assert_eq!(status, 200, "{page}");
    let throughput = chart(&page, "chart-minute-throughput");
    assert_eq!(throughput["datasets"][0]["label"], "finished");
    assert_eq!(throughput["datasets"][1]["label"], "failed");
    assert_eq!(
        (total(&throughput, 0), total(&throughput, 1)),
        (1, 1),
        "{throughput}"
    );
    let wait = chart(&page, "chart-minute-wait");
    let waits: Vec<f64> = wait["datasets"][0]["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(
        !waits.is_empty(),
        "a minute with hand-outs has a wait: {wait}"
    );
    assert!(waits.iter().all(|w| *w >= 0.0), "{wait}");
}
