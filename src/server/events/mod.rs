//! Job state changes as events: what the queue commits (a job created,
//! handed out, finished, …), published after the commit in commit order to
//! a bounded in-memory ring that event streams (`GET /events`) read from.
//! Publishing never waits on a reader: a reader that falls behind the ring
//! loses its place and is told so (see [`Bus`]).

mod bus;
mod event;
mod filter;
mod minutes;

pub use bus::{Bus, EventId, RING_EVENTS, Read};
pub use event::{EventKind, JobEvent, Published};
pub use filter::{Filter, TrackedJobs};
pub use minutes::{MINUTES, Minute, Minutes};
