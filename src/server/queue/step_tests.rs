//! A forward step of the wall clock made up for by the queue's writes, over
//! a real SQLite file, with a clock the test steps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;

use super::{Clock, Queue, QueueConfig};
use crate::protocol::{
    CreateJob, GetJobs, JobError, JobState, LeaseTerm, NamePattern, RetryAfter, Timestamp,
};
use crate::server::store::SqliteStore;

/// Far longer than any of these steps takes.
const GENEROUS: Duration = Duration::from_secs(20);

/// The lease every hand-out here gets (a `retryAfter` job's is its
/// `retryAfter`).
const TERM_MS: i64 = 60_000;

fn get(num_results: usize) -> GetJobs {
    GetJobs {
        pattern: NamePattern::Glob("*".into()),
        num_results,
        priority: None,
        lease: LeaseTerm::Millis(TERM_MS),
        worker: None,
    }
}

/// The system clock plus an offset the test sets: a clock that moves with
/// real time and steps.
#[derive(Default)]
struct SteppedClock(AtomicI64);

impl Clock for SteppedClock {
    fn now(&self) -> Timestamp {
        Timestamp::now().plus_millis(self.0.load(Ordering::SeqCst))
    }
}

/// Waits (polling) until the queue's timer task sleeps until a moment still
/// to come with nothing reported since: no write of its own comes before
/// that moment or the next commit's nudge.
async fn timer_asleep(queue: &Queue) {
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        {
            let state = queue.inner.timer.state.lock().unwrap();
            if state.pending.is_none() && state.armed.is_some_and(|at| at > queue.now()) {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timer task never went to sleep"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
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
    assert_eq!(queue.get_jobs(get(1), None).await.unwrap().len(), 1);
    let expires = |queue: &Queue| {
        let queue = queue.clone();
        async move {
            let job = queue.query(id).await.unwrap();
            job.lease.and_then(|l| l.expires).expect("a leased job")
        }
    };
    let granted = expires(&queue).await;
    // The timer task's own write (a tick for the job created, nudged by the
    // commit) would otherwise make up for the step if it came after it.
    timer_asleep(&queue).await;

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

/// Holders heartbeat and a claimer claims, concurrently (so writes share
/// group commits), while the clock steps forward a random number of times
/// by random amounts. Violations counted: a held job handed out, a
/// heartbeat refused, and, at the end, a renewed lease lapsing later than
/// one term from now or lapsed, and an abandoned one not extended by the
/// steps exactly once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_across_clock_steps_neither_lose_nor_repeat_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let clock = Arc::new(SteppedClock::default());
    let queue = Queue::start_with_clock(store.clone(), QueueConfig::default(), clock.clone());
    queue.ready().await;
    let mut rng = rand::rng();
    let holders = rng.random_range(2..=8usize);
    for i in 0..holders {
        let mut job = CreateJob::named(format!("held/{i}"));
        if i % 2 == 1 {
            // Held RUNQUEUED, due again when its lease lapses.
            job.retry_after = Some(RetryAfter::parse("+1 MINUTE").unwrap());
        }
        queue.create(job).await.unwrap();
    }
    let mut handouts = queue.get_jobs(get(holders), None).await.unwrap();
    assert_eq!(handouts.len(), holders);
    // Half the jobs' holders went away: their leases, never renewed, show
    // how often the steps were made up for.
    let abandoned = handouts.split_off(holders / 2);

    let violations = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let beat = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for handout in &handouts {
        let (queue, violations, stop, beat) = (
            queue.clone(),
            violations.clone(),
            stop.clone(),
            beat.clone(),
        );
        let (id, token) = (handout.job.id, handout.lease_token.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match queue.heartbeat(id, token.clone()).await {
                    Ok(_) => beat.notify_waiters(),
                    Err(error) => {
                        eprintln!("job {id}'s heartbeat was refused: {error}");
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    tasks.push(tokio::spawn({
        let (queue, violations, stop) = (queue.clone(), violations.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let taken = queue.get_jobs(get(holders), None).await.unwrap();
                if !taken.is_empty() {
                    eprintln!("held jobs handed out again: {taken:?}");
                    violations.fetch_add(taken.len(), Ordering::SeqCst);
                }
            }
        }
    }));

    let steps = rng.random_range(2..=5);
    let mut offset = 0;
    for _ in 0..steps {
        offset += rng.random_range(3_000..=7_200_000i64);
        clock.0.store(offset, Ordering::SeqCst);
        for _ in 0..rng.random_range(1..=20) {
            tokio::time::timeout(GENEROUS, beat.notified())
                .await
                .expect("a heartbeat after the step");
        }
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        tokio::time::timeout(GENEROUS, task)
            .await
            .expect("holders and the claimer stop")
            .unwrap();
    }
    let now = queue.now();
    for handout in &abandoned {
        let job = queue.query(handout.job.id).await.unwrap();
        let expires = job.lease.as_ref().and_then(|l| l.expires).unwrap();
        let granted = handout.lease_expires.unwrap();
        // Each step is made up for once: by about its size (to the
        // millisecond; the least step is 3 s).
        let extended = expires.0 - granted.0;
        if (extended - offset).abs() > 1_000 || job.lapses != 0 {
            eprintln!(
                "abandoned job {} extended by {extended} ms for steps of {offset} ms: {job:?}",
                job.id
            );
            violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    for handout in &handouts {
        let job = queue.query(handout.job.id).await.unwrap();
        let expires = job.lease.as_ref().and_then(|l| l.expires).unwrap();
        let held = matches!(job.state, JobState::Running | JobState::Runqueued);
        if !held || job.lapses != 0 || expires > now.plus_millis(TERM_MS) || expires <= now {
            eprintln!("job {} after the steps: {job:?} (now {now:?})", job.id);
            violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    queue.shutdown();
    queue.settle().await;
    store.close();
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "{holders} holders, {steps} steps to +{offset} ms"
    );
}
