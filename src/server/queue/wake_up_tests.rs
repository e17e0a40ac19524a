//! Races between a claim and the wake-up of a job committed while the
//! claim's answer is on its way, scripted with the queue's claim hook over a
//! real SQLite file.

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

/// W (first in line, wanting `w_wants`) claims job A; while its answer is
/// held, V registers and finds nothing, then job X is committed and its
/// wake-up goes to W. Returns what V got once W was answered.
async fn race(w_wants: usize, a_name: &str, x_name: &str) -> (Vec<JobId>, Vec<JobId>, JobId) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store.clone(), QueueConfig::default());
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
    let ids = |handouts: Vec<crate::protocol::view::HandOut>| {
        handouts.iter().map(|h| h.job.id).collect::<Vec<_>>()
    };
    (ids(w_got), ids(v_got), x)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_getjob_can_miss_its_wake_up_when_the_claim_is_not_full() {
    let (w_got, v_got, x) = race(2, "A", "X").await;
    assert_eq!(w_got.len(), 1, "W took A only: X came after its claim");
    assert_eq!(v_got, vec![x], "the wake-up W did not use went to V");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_getjob_can_miss_its_wake_up_when_a_job_of_the_same_name_fills_the_batch() {
    let (w_got, v_got, x) = race(1, "same", "same").await;
    assert_eq!(w_got.len(), 1);
    assert_ne!(w_got, vec![x]);
    assert_eq!(
        v_got,
        vec![x],
        "crossed off by id, not by name: X's wake-up went to V"
    );
}
