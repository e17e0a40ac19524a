//! The job model and the commands of Bedrock::Jobs as pure types: states,
//! priorities, timestamps, repeat descriptions, name patterns, command
//! parameters and their errors. Nothing here touches a socket, SQL or a process.

pub mod command;
pub mod depends;
pub mod error;
pub mod job;
pub mod pattern;
pub mod repeat;
pub mod tags;
pub mod text;
pub mod time;
pub mod view;
pub mod worker;

pub use command::*;
pub use depends::{ChangeDepends, MAX_DEPENDS, check_depends, parse_depends};
pub use error::JobError;
pub use job::{Job, JobId, JobState, Lease, Priority};
pub use pattern::NamePattern;
pub use repeat::{Modifier, Repeat, RepeatBase};
pub use tags::{Labels, TagChange};
pub use time::Timestamp;
pub use worker::{RunFacts, WorkerInfo};

/// The longest job name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The largest job data accepted, in bytes of its JSON text.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

/// The most jobs one GetJobs or dequeue hands out.
pub const MAX_NUM_RESULTS: usize = 1000;

/// The most bytes of jobs (names and data, and a hand-out's parent and
/// children data) one answer holds: a listing page, or the jobs one GetJobs
/// or dequeue hands out. An answer stops before the job that would take it
/// past this, but always holds at least one job.
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

/// The most jobs one CreateJobs creates.
pub const MAX_BATCH_JOBS: usize = 10_000;
