//! Commits announced between servers on one database: a write that makes
//! jobs ready or sets a lease sends `NOTIFY jobmgr` in its own transaction
//! (so it is delivered only if it commits), and each server listens on a
//! connection of its own and hands what others announced to its queue.
//! Whenever that connection is not listening (before its first `LISTEN`,
//! after a failed attempt, once it is lost), announcements go unheard:
//! meanwhile the queue is told to look at everything every two seconds,
//! and once more as soon as it listens again, so a lost notification costs
//! a short delay, never a stranded job.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::clock::DatabaseClock;
use crate::protocol::{Priority, Timestamp};
use crate::server::store::{Announcement, ReadyJob};

/// The channel every server listens on.
pub(super) const CHANNEL: &str = "jobmgr";

/// PostgreSQL refuses payloads of 8000 bytes or more; past this, the
/// announcement says only "look at everything due from this moment".
const MAX_PAYLOAD: usize = 7_000;

/// How often the listening connection is checked when quiet.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How often every waiter looks again while this server is not listening.
const LOOK_WHILE_NOT_LISTENING: Duration = Duration::from_secs(2);

/// The longest pause between two attempts to listen.
const RETRY_AT_MOST: Duration = Duration::from_secs(5);

/// An announcement as sent: the sending server, the jobs it made ready
/// (`[id, name, priority, nextRun]`), the earliest lease it set, the GLOBs
/// of the throttles whose slots it freed, or, when that would not fit,
/// `all` with the earliest `nextRun`.
#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    o: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    r: Vec<(i64, String, i64, i64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    f: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    all: Option<i64>,
}

/// The text of an announcement from server `origin`.
pub(super) fn encode(
    origin: u64,
    ready: &[ReadyJob],
    lease_expiry: Option<Timestamp>,
    freed: &[String],
) -> String {
    let payload = Payload {
        o: origin,
        r: ready
            .iter()
            .map(|j| (j.id, j.name.clone(), j.priority.value(), j.next_run.0))
            .collect(),
        l: lease_expiry.map(|t| t.0),
        f: freed.to_vec(),
        all: None,
    };
    let text = serde_json::to_string(&payload).unwrap_or_default();
    if text.len() <= MAX_PAYLOAD {
        return text;
    }
    let earliest = ready
        .iter()
        .map(|j| j.next_run.0)
        .chain(lease_expiry.map(|t| t.0))
        .min();
    serde_json::to_string(&Payload {
        o: origin,
        r: Vec::new(),
        l: None,
        f: Vec::new(),
        all: Some(earliest.unwrap_or(0)),
    })
    .unwrap_or_default()
}

/// What an announcement from another server means; `None` for this
/// server's own. A payload that cannot be read counts as "look at
/// everything".
fn decode(origin: u64, text: &str) -> Option<Announcement> {
    let Ok(payload) = serde_json::from_str::<Payload>(text) else {
        return Some(Announcement::Missed);
    };
    if payload.o == origin {
        return None;
    }
    if payload.all.is_some() {
        return Some(Announcement::Missed);
    }
    let mut ready = Vec::with_capacity(payload.r.len());
    for (id, name, priority, next_run) in payload.r {
        let Ok(priority) = Priority::new(priority) else {
            return Some(Announcement::Missed);
        };
        ready.push(ReadyJob {
            id,
            name,
            priority,
            next_run: Timestamp(next_run),
        });
    }
    Some(Announcement::Changes {
        ready,
        lease_expiry: payload.l.map(Timestamp),
        freed: payload.f,
    })
}

/// This server's listener for other servers' announcements.
pub struct Announcements {
    origin: u64,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Announcement>>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Announcements {
    /// Starts listening on a connection of its own. Its `application_name`
    /// is the others' with ` listener` after it (`jobmgr listener` by
    /// default), to tell it apart in `pg_stat_activity`.
    pub(super) fn listen(mut config: postgres::Config, clock: Arc<DatabaseClock>) -> Self {
        let name = format!(
            "{} listener",
            config.get_application_name().unwrap_or("jobmgr")
        );
        config.application_name(&name);
        let origin = rand::random::<u64>();
        let (sender, receiver) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("jobmgr-pg-listen".into())
            .spawn(move || listen_loop(&config, origin, &sender, &thread_stop, &clock))
            .map_err(|error| tracing::error!(%error, "cannot start the listener for other servers' commits; they are seen only when the timer looks"))
            .ok();
        Announcements {
            origin,
            receiver: Mutex::new(Some(receiver)),
            stop,
            thread: Mutex::new(thread),
        }
    }

    /// This server's id in announcements.
    pub(super) fn origin(&self) -> u64 {
        self.origin
    }

    /// The announcements of other servers; `Some` only the first time.
    pub(super) fn take_receiver(&self) -> Option<mpsc::UnboundedReceiver<Announcement>> {
        self.receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Stops listening.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

fn listen_loop(
    config: &postgres::Config,
    origin: u64,
    sender: &mpsc::UnboundedSender<Announcement>,
    stop: &AtomicBool,
    clock: &DatabaseClock,
) {
    let mut delay = Duration::from_millis(100);
    // Nothing is heard from the start until the first LISTEN.
    let mut gap = NotListening::at_start();
    while !stop.load(Ordering::Relaxed) {
        let mut client = match listening_connection(config) {
            Ok(client) => client,
            Err(why) => {
                tracing::warn!("cannot listen for other servers' commits: {why}; retrying");
                if gap.wait(delay, stop, sender).is_err() {
                    return;
                }
                delay = (delay * 2).min(RETRY_AT_MOST);
                continue;
            }
        };
        delay = Duration::from_millis(100);
        if gap.failed {
            tracing::info!("listening for other servers' commits again; looking at every job");
            let _ = clock.remeasure(&mut client);
        }
        // Whatever was committed while nothing was heard (also before the
        // first LISTEN, while the server started) is looked for now.
        if sender.send(Announcement::Missed).is_err() {
            return;
        }
        if serve(&mut client, origin, sender, stop).is_err() {
            return;
        }
        gap = NotListening::lost();
    }
}

/// A connection that listens on [`CHANNEL`], or why there is none.
fn listening_connection(config: &postgres::Config) -> Result<postgres::Client, String> {
    let mut client = config
        .connect(postgres::NoTls)
        .map_err(|error| super::connect::reason(&error))?;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .map_err(|error| error.to_string())?;
    Ok(client)
}

/// A time while this server does not listen: other servers' commits go
/// unheard, so every waiter and the timer look again every
/// [`LOOK_WHILE_NOT_LISTENING`] until listening resumes.
struct NotListening {
    /// When every waiter last looked, or the gap began.
    looked: Instant,
    /// How many looks this gap has had.
    looks: u32,
    /// Whether listening was lost or an attempt failed: the gap is worth a
    /// line in the log when it ends.
    failed: bool,
}

impl NotListening {
    /// The gap before the first `LISTEN`.
    fn at_start() -> Self {
        NotListening {
            looked: Instant::now(),
            looks: 0,
            failed: false,
        }
    }

    /// The gap after listening was lost.
    fn lost() -> Self {
        NotListening {
            failed: true,
            ..Self::at_start()
        }
    }

    /// Sleeps `delay` before the next attempt to listen, having every
    /// waiter look again whenever a look is due meanwhile. `Err` once
    /// nobody takes announcements any more.
    fn wait(
        &mut self,
        delay: Duration,
        stop: &AtomicBool,
        sender: &mpsc::UnboundedSender<Announcement>,
    ) -> Result<(), ()> {
        self.failed = true;
        let until = Instant::now() + delay;
        loop {
            if self.looked.elapsed() >= LOOK_WHILE_NOT_LISTENING {
                if self.looks == 0 {
                    tracing::info!(
                        every = %humantime::format_duration(LOOK_WHILE_NOT_LISTENING),
                        "not listening for other servers' commits: every held take looks again \
                         this often until listening resumes"
                    );
                }
                self.looks += 1;
                self.looked = Instant::now();
                sender.send(Announcement::Missed).map_err(|_| ())?;
            }
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) || now >= until {
                return Ok(());
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }
}

/// Forwards announcements until the connection fails (`Ok`) or nobody
/// listens any more (`Err`).
fn serve(
    client: &mut postgres::Client,
    origin: u64,
    sender: &mpsc::UnboundedSender<Announcement>,
    stop: &AtomicBool,
) -> Result<(), ()> {
    let mut checked = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        {
            let mut notifications = client.notifications();
            let mut batch = notifications.timeout_iter(Duration::from_millis(250));
            loop {
                match batch.next() {
                    Ok(Some(note)) => {
                        if let Some(announcement) = decode(origin, note.payload()) {
                            sender.send(announcement).map_err(|_| ())?;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(%error, "lost the connection that listens for other servers' commits; reconnecting");
                        return Ok(());
                    }
                }
            }
        }
        if checked.elapsed() >= CHECK_EVERY {
            checked = Instant::now();
            if let Err(error) = client.simple_query("SELECT 1") {
                tracing::warn!(%error, "lost the connection that listens for other servers' commits; reconnecting");
                return Ok(());
            }
        }
        if client.is_closed() {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, name: &str) -> ReadyJob {
        ReadyJob {
            id,
            name: name.into(),
            priority: Priority::new(500).unwrap(),
            next_run: Timestamp(1_000 + id),
        }
    }

    #[test]
    fn an_announcement_reads_back_as_sent_and_its_own_is_ignored() {
        let freed = ["api/*".to_string()];
        let text = encode(
            7,
            &[job(1, "a"), job(2, "b/c")],
            Some(Timestamp(99)),
            &freed,
        );
        assert!(decode(7, &text).is_none());
        match decode(8, &text) {
            Some(Announcement::Changes {
                ready,
                lease_expiry,
                freed,
            }) => {
                assert_eq!(ready.len(), 2);
                assert_eq!(ready[1].name, "b/c");
                assert_eq!(ready[1].next_run, Timestamp(1_002));
                assert_eq!(lease_expiry, Some(Timestamp(99)));
                assert_eq!(freed, ["api/*"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn too_many_jobs_for_one_payload_say_look_at_everything() {
        let long = "n".repeat(250);
        let many: Vec<ReadyJob> = (0..100).map(|i| job(i, &long)).collect();
        let text = encode(1, &many, None, &[]);
        assert!(text.len() < 8_000, "{}", text.len());
        assert!(matches!(decode(2, &text), Some(Announcement::Missed)));
    }

    #[test]
    fn a_payload_that_cannot_be_read_means_look_at_everything() {
        for text in ["", "{", "{\"o\":1,\"r\":[[1,\"a\",3,4]]}", "[]"] {
            assert!(
                matches!(decode(2, text), Some(Announcement::Missed)),
                "{text}"
            );
        }
    }
}
