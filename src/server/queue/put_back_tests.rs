//! A hand-out nobody received, put back (its requester went away), over a
//! real SQLite file: only what the hand-out changed is undone, and an
//! UpdateJob acknowledged while the job was held stays.

use std::sync::Arc;

use serde_json::json;

use super::{Queue, QueueConfig};
use crate::protocol::{
    CreateJob, Data, GetJobs, JobState, LeaseTerm, NamePattern, Priority, Repeat, RetryAfter,
    UpdateJob,
};
use crate::server::store::SqliteStore;

fn data(value: serde_json::Value) -> Data {
    serde_json::from_value(value).expect("an object")
}

#[tokio::test]
async fn a_put_back_keeps_an_update_made_while_the_job_was_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
    let queue = Queue::start(store, QueueConfig::default());
    queue.ready().await;
    // A retryAfter job with a SCHEDULED repeat: its hand-out writes the
    // retryAfter count and the schedule's anchor into its data.
    let mut create = CreateJob::named("held");
    create.data = data(json!({"v": 1}));
    create.retry_after = Some(RetryAfter::parse("+1 HOUR").unwrap());
    create.repeat = Some(Repeat::parse("SCHEDULED, +1 HOUR").unwrap());
    let id = queue.create(create).await.unwrap();
    let before = queue.query(id).await.unwrap();

    let get = GetJobs {
        pattern: NamePattern::Glob("held".into()),
        num_results: 1,
        priority: None,
        lease: LeaseTerm::Millis(60_000),
        worker: None,
    };
    let handouts = queue.get_jobs(get, None).await.unwrap();
    assert_eq!(handouts.len(), 1);
    let held = queue.query(id).await.unwrap();
    assert_eq!(held.state, JobState::Runqueued);
    assert!(held.data.contains_key("retryAfterCount"), "{:?}", held.data);

    // An operator's update while it is held, acknowledged.
    queue
        .update(UpdateJob {
            id,
            data: data(json!({"v": 2})),
            repeat: Some(Repeat::parse("SCHEDULED, +2 HOURS").unwrap()),
            clear_repeat: false,
            priority: Some(Priority::new(1000).unwrap()),
            next_run: None,
            lease: None,
        })
        .await
        .unwrap();

    assert_eq!(queue.return_undelivered(handouts).await.unwrap(), 1);
    let after = queue.query(id).await.unwrap();
    assert_eq!(after.data, data(json!({"v": 2})), "the update's data stays");
    assert_eq!(after.priority.value(), 1000);
    assert_eq!(after.repeat, "SCHEDULED, +2 HOURS");
    assert_eq!(
        (after.state, after.next_run, after.last_run, after.attempts),
        (
            before.state,
            before.next_run,
            before.last_run,
            before.attempts
        ),
        "the hand-out is undone"
    );
    assert!(after.lease.is_none());
    queue.shutdown();
    queue.settle().await;
}
