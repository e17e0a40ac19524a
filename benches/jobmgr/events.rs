//! The cost of event streams: create → dequeue → finish cycles per second
//! on a server with no `GET /events` listener and on one with 10, each
//! listener reading every event as it comes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Scale;
use crate::common::{ServerProcess, spread};
use crate::server::cycles_per_second;

/// Listeners in the measure.
const LISTENERS: usize = 10;

/// Clients in the measure.
const CLIENTS: usize = 16;

/// What the listeners of one run saw.
#[derive(Default)]
struct Seen {
    events: AtomicU64,
    dropped: AtomicU64,
}

/// Opens a stream and counts its events (and drop notes) until aborted.
async fn listen(url: String, seen: Arc<Seen>, open: Arc<tokio::sync::Barrier>) {
    let client = crate::common::async_client();
    let mut response = client
        .get(format!("{url}/events"))
        .send()
        .await
        .expect("GET /events");
    assert!(response.status().is_success(), "{}", response.status());
    open.wait().await;
    while let Ok(Some(chunk)) = response.chunk().await {
        let text = String::from_utf8_lossy(&chunk);
        let events = text.matches("\nevent: ").count() + usize::from(text.starts_with("event: "));
        let dropped = text.matches("event: dropped").count();
        seen.events
            .fetch_add((events - dropped) as u64, Ordering::Relaxed);
        seen.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
    }
}

/// One run: cycles per second with `listeners` streams open, and the
/// events the listeners received per cycle (each, on average).
async fn run(listeners: usize, length: Duration) -> (f64, f64, u64) {
    let server = ServerProcess::start_with(&["--http-max-event-streams-per-peer", "64"]);
    let seen = Arc::new(Seen::default());
    let open = Arc::new(tokio::sync::Barrier::new(listeners + 1));
    let tasks: Vec<_> = (0..listeners)
        .map(|_| {
            tokio::spawn(listen(
                server.url.clone(),
                Arc::clone(&seen),
                Arc::clone(&open),
            ))
        })
        .collect();
    open.wait().await;
    let started = std::time::Instant::now();
    let rate = cycles_per_second(std::slice::from_ref(&server.url), CLIENTS, length).await;
    let cycles = rate * started.elapsed().as_secs_f64();
    // Let the listeners read what is on its way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for task in tasks {
        task.abort();
    }
    let per_listener = if listeners == 0 {
        0.0
    } else {
        seen.events.load(Ordering::Relaxed) as f64 / listeners as f64 / cycles
    };
    (rate, per_listener, seen.dropped.load(Ordering::Relaxed))
}

/// The report's section.
pub async fn report(scale: Scale) -> String {
    let mut out = String::new();
    out.push_str("## Event streams: 10 listeners on create → dequeue → finish\n\n");
    out.push_str(&format!(
        "The HTTP throughput measure above ({CLIENTS} clients, {:?} runs, {} of each, alternating, each on a fresh server) without any `GET /events` stream, and with {LISTENERS} streams open without a filter, each reading every event as it comes (3 per cycle: created, handed_out, finished). Median (min–max).\n\n",
        scale.cycle_run, scale.repeats
    ));
    let (mut without, mut with, mut per, mut dropped) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..scale.repeats {
        without.push(run(0, scale.cycle_run).await.0);
        let (rate, events, drops) = run(LISTENERS, scale.cycle_run).await;
        with.push(rate);
        per.push(events);
        dropped += drops;
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cost = 1.0 - median(&with) / median(&without);
    out.push_str(
        "| listeners | cycles/s | events received per cycle, per listener |\n| --- | --- | --- |\n",
    );
    out.push_str(&format!("| 0 | {} | – |\n", spread(without, 0)));
    out.push_str(&format!(
        "| {LISTENERS} | {} | {} |\n",
        spread(with, 0),
        spread(per, 2)
    ));
    out.push_str(&format!(
        "\n{LISTENERS} listeners cost {:.1}% of the cycles per second (median against median); streams dropped for falling behind: {dropped}.\n",
        cost * 100.0
    ));
    out
}
