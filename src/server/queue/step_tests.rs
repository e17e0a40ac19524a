//! A forward step of the wall clock made up for by the queue's writes, over
//! a real SQLite file, with a clock the test steps.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use super::{Clock, Queue, QueueConfig};
use crate::protocol::{CreateJob, GetJobs, JobError, LeaseTerm, NamePattern, Timestamp};
use crate::server::store::SqliteStore;

/// The system clock plus an offset the test sets: a clock that moves with
/// real time and steps.
#[derive(Default)]
struct SteppedClock(AtomicI64);

impl Clock for SteppedClock {
    fn now(&self) -> Timestamp {
        Timestamp::now().plus_millis(self.0.load(Ordering::SeqCst))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_seen_by_a_write_that_rolled_back_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let clock = Arc::new(SteppedClock::default());
    let queue = Queue::start_with_clock(store.clone(), QueueConfig::default(), clock.clone());
    queue.ready().await;
    let id = queue.create(CreateJob::named("held")).await.unwrap();
    let get = GetJobs {
        pattern: NamePattern::Glob("*".into()),
        num_results: 1,
        priority: None,
        lease: LeaseTerm::Millis(60_000),
        worker: None,
    };
    assert_eq!(queue.get_jobs(get, None).await.unwrap().len(), 1);
    let expires = |queue: &Queue| {
        let queue = queue.clone();
        async move {
            let job = queue.query(id).await.unwrap();
            job.lease.and_then(|l| l.expires).expect("a leased job")
        }
    };
    let granted = expires(&queue).await;

    clock.0.store(3_600_000, Ordering::SeqCst);
    // The first write after the step fails: its transaction, with the
    // extension made in it, rolls back.
    let failed = queue.write(|_| Err::<(), _>(JobError::NoSuchJob)).await;
    assert!(failed.is_err());
    assert_eq!(expires(&queue).await, granted, "rolled back with the write");
    // The next write still sees the step, and makes up for it.
    queue.write(|_| Ok(())).await.unwrap();
    let extended = expires(&queue).await;
    assert!(
        extended.0 > granted.0 + 3_500_000,
        "the step was lost with the write that rolled back: {granted:?} -> {extended:?}"
    );
    assert!(extended > queue.now(), "the lease outlives the step");
    // Only once.
    queue.write(|_| Ok(())).await.unwrap();
    assert_eq!(expires(&queue).await, extended, "made up for twice");
    queue.shutdown();
    queue.settle().await;
    store.close();
}
