//! Hand-outs sized and cut, over a real SQLite file: a claim stops at
//! [`MAX_PAGE_BYTES`] and leaves the rest queued, and the byte budget cuts
//! an answer further, putting back what it has no room for as it was.

use std::sync::Arc;

use serde_json::json;

use super::{Queue, QueueConfig};
use crate::protocol::{
    CreateJob, GetJobs, JobError, JobId, JobState, LeaseTerm, MAX_PAGE_BYTES, NamePattern,
};
use crate::server::budget::{AnswerShare, Holding, byte_budget};
use crate::server::store::SqliteStore;

/// Jobs of about 900 KiB of data each.
const BIG: usize = 900 * 1024;

fn get_all() -> GetJobs {
    GetJobs {
        pattern: NamePattern::Glob("Big*".into()),
        num_results: 1000,
        priority: None,
        lease: LeaseTerm::Millis(60_000),
        worker: None,
    }
}

async fn queue_of_big_jobs(dir: &tempfile::TempDir, count: usize) -> (Queue, Vec<JobId>) {
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store, QueueConfig::default());
    queue.ready().await;
    let blob = "x".repeat(BIG);
    let mut ids = Vec::new();
    for i in 0..count {
        let mut create = CreateJob::named(format!("Big{i}"));
        create.data = serde_json::from_value(json!({"blob": blob})).unwrap();
        ids.push(queue.create(create).await.unwrap());
    }
    (queue, ids)
}

/// Whether the job is queued as if never handed out.
async fn untouched(queue: &Queue, id: JobId) -> bool {
    let job = queue.query(id).await.unwrap();
    job.state == JobState::Queued && job.attempts == 0 && job.lease.is_none()
}

#[tokio::test]
async fn a_claim_stops_at_the_page_bytes_and_the_next_claim_takes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, ids) = queue_of_big_jobs(&dir, 12).await;
    let first = queue.get_jobs(get_all(), None).await.unwrap();
    let bytes: usize = first.iter().map(|h| h.answer_bytes()).sum();
    assert!(bytes <= MAX_PAGE_BYTES, "{bytes} bytes handed out at once");
    assert!(
        (8..12).contains(&first.len()),
        "{} jobs of 900 KiB",
        first.len()
    );
    for id in &ids[first.len()..] {
        assert!(untouched(&queue, *id).await, "job {id} was left as it was");
    }
    let second = queue.get_jobs(get_all(), None).await.unwrap();
    let handed: Vec<JobId> = first.iter().chain(&second).map(|h| h.job.id).collect();
    assert_eq!(handed, ids, "every job once, in order");
}

#[tokio::test]
async fn a_claim_of_small_jobs_is_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store, QueueConfig::default());
    queue.ready().await;
    for i in 0..300 {
        queue
            .create(CreateJob::named(format!("Big{i}")))
            .await
            .unwrap();
    }
    assert_eq!(queue.get_jobs(get_all(), None).await.unwrap().len(), 300);
}

#[tokio::test]
async fn the_budget_cuts_a_hand_out_and_puts_the_rest_back_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, ids) = queue_of_big_jobs(&dir, 3).await;
    // Room for one answer of one job (three times its bytes), not two.
    let budget = byte_budget(4 * 1024 * 1024);
    let share = AnswerShare::new(Arc::clone(&budget), Holding::default());
    let handouts = queue.get_jobs(get_all(), None).await.unwrap();
    assert_eq!(handouts.len(), 3);
    let kept = queue.within_budget(handouts, &share).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].job.id, ids[0]);
    for id in &ids[1..] {
        assert!(untouched(&queue, *id).await, "job {id} was put back");
    }

    // While the first answer holds its share, nothing more fits: the
    // server is busy, and everything is put back.
    let other = AnswerShare::new(Arc::clone(&budget), Holding::default());
    let handouts = queue.get_jobs(get_all(), None).await.unwrap();
    assert_eq!(handouts.len(), 2);
    let refused = queue.within_budget(handouts, &other).await;
    assert_eq!(refused.unwrap_err(), JobError::ServerBusy);
    for id in &ids[1..] {
        assert!(untouched(&queue, *id).await, "job {id} was put back");
    }

    // Once the first answer was sent, the next one takes the next job.
    drop(share);
    let handouts = queue.get_jobs(get_all(), None).await.unwrap();
    let kept = queue.within_budget(handouts, &other).await.unwrap();
    assert_eq!(kept[0].job.id, ids[1]);
    assert_eq!(kept[0].attempt, 1, "its first attempt");
}
