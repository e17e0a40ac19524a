//! Races between a claim and the wake-up of a job committed while the
//! claim's answer is on its way, scripted with the queue's claim hook over a
//! real SQLite file: with commits serving sleeping requests (the product),
//! and without (the wake-up path, which requests that are not asleep at a
//! commit take).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{Queue, QueueConfig};
use crate::protocol::{CreateJob, GetJobs, JobId, LeaseTerm, NamePattern};
use crate::server::store::SqliteStore;

/// Far longer than any of these steps takes; a lost wake-up waits an hour.
const GENEROUS: Duration = Duration::from_secs(20);

fn get(num_results: usize) -> GetJobs {
    GetJobs {
        pattern: NamePattern::Glob("*".into()),
        num_results,
        priority: None,
        lease: LeaseTerm::Millis(60_000),
        worker: None,
    }
}

/// Holds back the answer of the first claim that took jobs until released,
/// and reports how many jobs every claim took.
struct Script {
    reached: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
    claims: mpsc::UnboundedReceiver<usize>,
}

fn script(queue: &Queue) -> Script {
    let (reached_tx, reached) = oneshot::channel();
    let (release, release_rx) = oneshot::channel::<()>();
    let (claims_tx, claims) = mpsc::unbounded_channel();
    let first = Arc::new(Mutex::new(Some((reached_tx, release_rx))));
    let hook: super::ClaimHook = Arc::new(move |taken| {
        let _ = claims_tx.send(taken);
        let held = if taken > 0 {
            first.lock().unwrap().take()
        } else {
            None
        };
        Box::pin(async move {
            if let Some((reached, release)) = held {
                let _ = reached.send(());
                let _ = release.await;
            }
        })
    });
    *queue.inner.claim_hook.lock().unwrap() = Some(hook);
    Script {
        reached,
        release,
        claims,
    }
}

/// What a race ended with: what W and V got, X's id, and how many claims
/// were made after V's first one found nothing.
struct Raced {
    w_got: Vec<JobId>,
    v_got: Vec<JobId>,
    x: JobId,
    claims_after: usize,
}

/// W (first in line, wanting `w_wants`) claims job A; while its answer is
/// held, V registers and finds nothing, then job X is committed: it serves
/// V asleep (`serve`), or its wake-up goes to W, which passes it on to V.
async fn race(w_wants: usize, a_name: &str, x_name: &str, serve: bool) -> Raced {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store.clone(), QueueConfig::default());
    queue
        .inner
        .serve_sleepers
        .store(serve, std::sync::atomic::Ordering::SeqCst);
    queue.ready().await;
    queue.create(CreateJob::named(a_name)).await.unwrap();
    let mut script = script(&queue);
    let w = tokio::spawn({
        let queue = queue.clone();
        async move {
            queue
                .get_jobs(get(w_wants), Some(Duration::from_secs(3600)))
                .await
        }
    });
    tokio::time::timeout(GENEROUS, &mut script.reached)
        .await
        .expect("W's claim of A was committed")
        .unwrap();
    let v = tokio::spawn({
        let queue = queue.clone();
        async move {
            queue
                .get_jobs(get(1), Some(Duration::from_secs(3600)))
                .await
        }
    });
    loop {
        let taken = tokio::time::timeout(GENEROUS, script.claims.recv())
            .await
            .expect("V's claim was answered");
        if taken == Some(0) {
            break;
        }
    }
    // V is asleep (counted) before X is committed.
    let asleep_by = tokio::time::Instant::now() + GENEROUS;
    while queue.waiting() == 0 {
        assert!(tokio::time::Instant::now() < asleep_by, "V fell asleep");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let x = queue.create(CreateJob::named(x_name)).await.unwrap();
    script.release.send(()).unwrap();
    let w_got = tokio::time::timeout(GENEROUS, w)
        .await
        .expect("W was answered once released")
        .unwrap()
        .unwrap();
    let v_got = tokio::time::timeout(GENEROUS, v)
        .await
        .expect("V, asleep beside a job it could take, was woken for it")
        .unwrap()
        .unwrap();
    queue.shutdown();
    queue.settle().await;
    store.close();
    let mut claims_after = 0;
    while script.claims.try_recv().is_ok() {
        claims_after += 1;
    }
    let ids = |handouts: Vec<crate::protocol::view::HandOut>| {
        handouts.iter().map(|h| h.job.id).collect::<Vec<_>>()
    };
    Raced {
        w_got: ids(w_got),
        v_got: ids(v_got),
        x,
        claims_after,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_getjob_can_miss_its_wake_up_when_the_claim_is_not_full() {
    let raced = race(2, "A", "X", false).await;
    assert_eq!(
        raced.w_got.len(),
        1,
        "W took A only: X came after its claim"
    );
    assert_eq!(
        raced.v_got,
        vec![raced.x],
        "the wake-up W did not use went to V"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_getjob_can_miss_its_wake_up_when_a_job_of_the_same_name_fills_the_batch() {
    let raced = race(1, "same", "same", false).await;
    assert_eq!(raced.w_got.len(), 1);
    assert_ne!(raced.w_got, vec![raced.x]);
    assert_eq!(
        raced.v_got,
        vec![raced.x],
        "crossed off by id, not by name: X's wake-up went to V"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_getjob_is_served_by_the_commit_that_made_its_job_due() {
    for (w_wants, a, x) in [(2, "A", "X"), (1, "same", "same")] {
        let raced = race(w_wants, a, x, true).await;
        assert_eq!(raced.w_got.len(), 1, "W took A only");
        assert_eq!(raced.v_got, vec![raced.x], "V was handed X");
        assert_eq!(
            raced.claims_after, 0,
            "V was served in X's commit, with no claim of its own (and W passed nothing on)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_retry_after_job_wakes_the_next_sleeper_when_it_comes_due_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store.clone(), QueueConfig::default());
    queue.ready().await;
    let asleep = |count: usize| {
        let queue = queue.clone();
        async move {
            let by = tokio::time::Instant::now() + GENEROUS;
            while queue.waiting() < count {
                assert!(tokio::time::Instant::now() < by, "a request fell asleep");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    // S1 asleep; X, handed out again a second after each hand-out unless
    // reported, is served to it in its create's commit.
    let s1 = tokio::spawn({
        let queue = queue.clone();
        async move {
            queue
                .get_jobs(get(1), Some(Duration::from_secs(3600)))
                .await
        }
    });
    asleep(1).await;
    let mut x = CreateJob::named("X");
    x.retry_after = Some(crate::protocol::RetryAfter::parse("+1 SECOND").unwrap());
    let x = queue.create(x).await.unwrap();
    let got = tokio::time::timeout(GENEROUS, s1)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.iter().map(|h| h.job.id).collect::<Vec<_>>(), vec![x]);
    // S1 never reports: when X comes due again, the timer wakes S2 for it,
    // though no commit happens then.
    let s2 = tokio::spawn({
        let queue = queue.clone();
        async move {
            queue
                .get_jobs(get(1), Some(Duration::from_secs(3600)))
                .await
        }
    });
    let got = tokio::time::timeout(GENEROUS, s2)
        .await
        .expect("S2 was woken when X came due again")
        .unwrap()
        .unwrap();
    assert_eq!(got.iter().map(|h| h.job.id).collect::<Vec<_>>(), vec![x]);
    queue.shutdown();
    queue.settle().await;
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_serves_a_sleeper_on_a_lower_ranked_name_in_the_commit_that_freed_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store.clone(), QueueConfig::default());
    queue.ready().await;
    queue.set_throttle("t/*".into(), 1).await.unwrap();
    queue.create(CreateJob::named("t/held")).await.unwrap();
    let held = queue.get_jobs(get(1), None).await.unwrap().remove(0);
    let mut best = CreateJob::named("t/best");
    best.priority = Some(crate::protocol::Priority::new(1000).unwrap());
    queue.create(best).await.unwrap();
    let low = queue.create(CreateJob::named("t/low")).await.unwrap();
    let mut script = script(&queue);
    let sleeper = tokio::spawn({
        let queue = queue.clone();
        let mut wants = get(1);
        wants.pattern = NamePattern::Glob("t/low".into());
        async move { queue.get_jobs(wants, Some(Duration::from_secs(3600))).await }
    });
    let asleep_by = tokio::time::Instant::now() + GENEROUS;
    while queue.waiting() == 0 {
        assert!(tokio::time::Instant::now() < asleep_by, "it fell asleep");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while script.claims.try_recv().is_ok() {}
    queue
        .finish(crate::protocol::FinishJob {
            id: held.job.id,
            data: None,
            lease: Some(held.lease_token.clone()),
            run: None,
        })
        .await
        .unwrap();
    let got = tokio::time::timeout(GENEROUS, sleeper)
        .await
        .expect("the sleeper on t/low was served when the slot was freed")
        .unwrap()
        .unwrap();
    assert_eq!(got.iter().map(|h| h.job.id).collect::<Vec<_>>(), vec![low]);
    assert!(
        script.claims.try_recv().is_err(),
        "served in the finish's commit, with no claim of its own"
    );
    drop(script.release);
    queue.shutdown();
    queue.settle().await;
    store.close();
}
