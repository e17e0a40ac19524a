//! The server's event ring: the last [`RING_EVENTS`] events, numbered in
//! commit order, with a signal for readers when more arrive. The writer
//! only appends (dropping the oldest); readers keep their own place and
//! find out that they fell behind when the event they wanted is gone.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::event::{JobEvent, Published};
use super::filter::TrackedJobs;

/// Events the ring keeps: how far a stream may fall behind before it is
/// dropped, and how far back `Last-Event-ID` can resume.
pub const RING_EVENTS: usize = 8192;

/// An event's id in a stream, `BOOT-SEQ`: the server's start time (ms since
/// the epoch) and the event's number, so that an id from before a restart
/// is told from one of this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId {
    /// The server's start time, ms since the epoch.
    pub boot: i64,
    /// The event's number in that run, from 1.
    pub seq: u64,
}

impl EventId {
    /// Reads `BOOT-SEQ`.
    pub fn parse(text: &str) -> Option<EventId> {
        let (boot, seq) = text.trim().split_once('-')?;
        Some(EventId {
            boot: boot.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.boot, self.seq)
    }
}

struct Ring {
    events: VecDeque<Arc<Published>>,
    /// The number the next event gets.
    next: u64,
}

/// What a reader finds at its place.
pub enum Read {
    /// Events from its place on (empty: none yet).
    Events(Vec<Arc<Published>>),
    /// The events from its place to just before `oldest` are gone.
    Behind {
        /// How many it missed.
        missed: u64,
        /// The oldest event still kept.
        oldest: u64,
    },
}

/// The server's events: published by the queue after each commit, read by
/// event streams. Cheap to share.
pub struct Bus {
    boot: i64,
    ring: Mutex<Ring>,
    /// The number of the latest event.
    latest: watch::Sender<u64>,
    /// Cancelled when the server shuts down: streams end.
    closed: CancellationToken,
    tracked: RwLock<Option<Arc<dyn TrackedJobs>>>,
}

impl Default for Bus {
    fn default() -> Self {
        Bus::new(crate::protocol::Timestamp::now().0)
    }
}

impl Bus {
    /// An empty bus of a server started at `boot` (ms since the epoch).
    pub fn new(boot: i64) -> Self {
        Bus {
            boot,
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(1024),
                next: 1,
            }),
            latest: watch::Sender::new(0),
            closed: CancellationToken::new(),
            tracked: RwLock::new(None),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Numbers and keeps `events`, in order, and tells readers. Never
    /// waits on a reader.
    pub fn publish(&self, events: Vec<JobEvent>) {
        if events.is_empty() {
            return;
        }
        let latest = {
            let mut ring = self.ring();
            for event in events {
                let seq = ring.next;
                ring.next += 1;
                if ring.events.len() == RING_EVENTS {
                    ring.events.pop_front();
                }
                ring.events.push_back(Arc::new(Published::new(seq, event)));
            }
            ring.next - 1
        };
        self.latest.send_replace(latest);
    }

    /// The number of the latest event (0: none yet).
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    /// Told of each new latest event number.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// Up to `most` events from number `from` on.
    pub fn read(&self, from: u64, most: usize) -> Read {
        let ring = self.ring();
        let Some(oldest) = ring.events.front().map(|e| e.seq) else {
            return Read::Events(Vec::new());
        };
        if from < oldest {
            return Read::Behind {
                missed: oldest - from,
                oldest,
            };
        }
        let skip = usize::try_from(from - oldest).unwrap_or(usize::MAX);
        Read::Events(ring.events.iter().skip(skip).take(most).cloned().collect())
    }

    /// The number of the oldest event kept (the next one when none is).
    pub fn oldest(&self) -> u64 {
        let ring = self.ring();
        ring.events.front().map_or(ring.next, |e| e.seq)
    }

    /// The stream id of event `seq`.
    pub fn id(&self, seq: u64) -> EventId {
        EventId {
            boot: self.boot,
            seq,
        }
    }

    /// This server's start time, as in its event ids.
    pub fn boot(&self) -> i64 {
        self.boot
    }

    /// Ends every stream (the server is shutting down).
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Resolves once [`Bus::close`] was called.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.closed.cancelled()
    }

    /// Where streams with `tracked=true` learn which jobs are tracked.
    pub fn set_tracked(&self, tracked: Arc<dyn TrackedJobs>) {
        *self.tracked.write().unwrap_or_else(|e| e.into_inner()) = Some(tracked);
    }

    /// Which jobs are tracked, once the server knows tracked jobs.
    pub fn tracked(&self) -> Option<Arc<dyn TrackedJobs>> {
        self.tracked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Timestamp;

    fn event(id: i64) -> JobEvent {
        JobEvent {
            kind: super::super::EventKind::Created,
            job_id: id,
            name: "A".into(),
            state: "QUEUED",
            at: Timestamp(0),
            attempt: 0,
            detail: serde_json::Map::new(),
            waited_ms: None,
        }
    }

    #[test]
    fn a_reader_reads_in_order_and_learns_when_it_fell_behind() {
        let bus = Bus::new(7);
        assert!(matches!(bus.read(1, 10), Read::Events(e) if e.is_empty()));
        bus.publish((1..=3).map(event).collect());
        assert_eq!(bus.latest(), 3);
        let Read::Events(events) = bus.read(2, 10) else {
            panic!("behind")
        };
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        bus.publish((4..=(RING_EVENTS as i64 + 5)).map(event).collect());
        match bus.read(2, 10) {
            Read::Behind { missed, oldest } => {
                assert_eq!(oldest, 6);
                assert_eq!(missed, 4);
            }
            Read::Events(_) => panic!("not behind"),
        }
        assert_eq!(bus.id(5).to_string(), "7-5");
        assert_eq!(EventId::parse("7-5"), Some(bus.id(5)));
        assert_eq!(EventId::parse("x"), None);
    }
}
