//! qless's tags and tracked jobs on the queue.
//!
//! - **Tags** are given on create and added or removed later, on any job
//!   still in the queue (FAILED ones and children that ended included); a
//!   job that ended and left it is refused ([`JobError::JobEnded`]). A job
//!   has at most [`MAX_TAGS`]. Its tags go with it when it leaves the
//!   queue: the archive keeps none.
//! - **Tracking** marks jobs an operator cares about, in the queue. Tracking
//!   and untracking are idempotent. A tracked job stays on the tracked list
//!   after it ends: shown from the archive while retention keeps it there
//!   (and dropped with its archive entry), or as `GONE` when it was
//!   deleted, until it is untracked (after which the deleted job is
//!   unknown).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Queue, Tracked};
use crate::protocol::tags::MAX_TAGS;
use crate::protocol::view::{json_len, labelled_json};
use crate::protocol::{JobError, JobId, Labels, TagChange, UpdateJob};
use crate::server::store::{ByteCount, ListQuery, Page};

/// The most tags `GET /tags` and the tracked list answer at once.
pub const MAX_LABEL_PAGE: usize = 1000;

/// The error for a job not in the queue: ended (it is in the archive) or
/// unknown.
fn missing(tx: &mut Tracked, id: JobId) -> JobError {
    match tx.store().ledger().archived(id) {
        Ok(Some(_)) => JobError::JobEnded(id),
        Ok(None) => JobError::NoSuchJob,
        Err(error) => error,
    }
}

/// Adds tags to a job when it is created (or found by a `unique` create
/// that overwrites), within [`MAX_TAGS`].
pub(super) fn tag_new(tx: &mut Tracked, id: JobId, tags: &[String]) -> Result<(), JobError> {
    if tags.is_empty() {
        return Ok(());
    }
    change(tx, id, tags, &[])
}

/// Adds `add` to a job's tags and removes `remove`, refusing a result of
/// more than [`MAX_TAGS`].
fn change(tx: &mut Tracked, id: JobId, add: &[String], remove: &[String]) -> Result<(), JobError> {
    let current = tx
        .store()
        .labels()
        .of(&[id])?
        .pop()
        .unwrap_or_default()
        .tags;
    let after = current
        .iter()
        .chain(add)
        .filter(|tag| !remove.contains(tag))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if after > MAX_TAGS {
        return Err(JobError::BadTags(format!(
            "job {id} would have {after} tags, and a job has at most {MAX_TAGS}; remove some \
             in the same request"
        )));
    }
    tx.store().labels().change_tags(id, add, remove)
}

impl Queue {
    /// Adds and removes tags of a job still in the queue; returns its tags.
    pub async fn change_tags(&self, cmd: TagChange) -> Result<Vec<String>, JobError> {
        self.write(move |tx| {
            if tx.get(cmd.id)?.is_none() {
                return Err(missing(tx, cmd.id));
            }
            change(tx, cmd.id, &cmd.add, &cmd.remove)?;
            Ok(tx
                .store()
                .labels()
                .of(&[cmd.id])?
                .pop()
                .unwrap_or_default()
                .tags)
        })
        .await
    }

    /// UpdateJob (when `update` is given) and a change of the job's tags,
    /// in one transaction: both are made or neither.
    pub async fn update_and_tag(
        &self,
        update: Option<UpdateJob>,
        tags: TagChange,
    ) -> Result<(), JobError> {
        self.write(move |tx| {
            match &update {
                Some(cmd) => super::rules::update(tx, cmd)?,
                None if tx.get(tags.id)?.is_none() => return Err(missing(tx, tags.id)),
                None => {}
            }
            change(tx, tags.id, &tags.add, &tags.remove)
        })
        .await
    }

    /// Lists jobs in id order, each with its tags and tracking.
    pub async fn list_labelled(&self, query: ListQuery) -> Result<(Page, Vec<Labels>), JobError> {
        self.read(move |tx| {
            let page = tx.list(&query)?;
            let ids: Vec<JobId> = page.jobs.iter().map(|job| job.id).collect();
            let labels = tx.labels().of(&ids)?;
            Ok((page, labels))
        })
        .await
    }

    /// Tracks a job still in the queue (again: nothing changes).
    pub async fn track(&self, id: JobId) -> Result<(), JobError> {
        self.write(move |tx| {
            if tx.get(id)?.is_none() {
                return Err(missing(tx, id));
            }
            let now = tx.now.0;
            tx.store().labels().set_tracked(id, true, now)?;
            Ok(())
        })
        .await?;
        self.inner.tracked.set(id, true);
        Ok(())
    }

    /// Stops tracking a job (again: nothing changes). A job that is not
    /// tracked and neither in the queue nor in the archive is unknown
    /// (`NoSuchJob`), as a deleted job is once untracked.
    pub async fn untrack(&self, id: JobId) -> Result<(), JobError> {
        self.write(move |tx| {
            let was_tracked = tx.store().labels().set_tracked(id, false, 0)?;
            if !was_tracked && tx.get(id)?.is_none() {
                return match missing(tx, id) {
                    JobError::JobEnded(_) => Ok(()),
                    other => Err(other),
                };
            }
            Ok(())
        })
        .await?;
        self.inner.tracked.set(id, false);
        Ok(())
    }

    /// QueryJob with the job's tags and tracking.
    pub async fn query_labelled(
        &self,
        id: JobId,
    ) -> Result<(crate::protocol::Job, Labels), JobError> {
        self.read(move |tx| {
            let job = tx.get(id)?.ok_or(JobError::NoSuchJob)?;
            let labels = tx.labels().of(&[id])?.pop().unwrap_or_default();
            Ok((job, labels))
        })
        .await
    }

    /// The tags and tracking of each of `ids`, in their order.
    pub async fn labels(&self, ids: Vec<JobId>) -> Result<Vec<Labels>, JobError> {
        self.read(move |tx| tx.labels().of(&ids)).await
    }

    /// The `limit` tags on most jobs, as `{"tag", "jobs"}` objects.
    pub async fn top_tags(&self, limit: usize) -> Result<Vec<Value>, JobError> {
        let limit = limit.clamp(1, MAX_LABEL_PAGE);
        let tags = self.read(move |tx| tx.labels().top_tags(limit)).await?;
        Ok(tags
            .into_iter()
            .map(|(tag, jobs)| json!({"tag": tag, "jobs": jobs}))
            .collect())
    }

    /// Up to `limit` tracked jobs with ids above `after`, in id order,
    /// within about `max_bytes` of JSON (at least one job; the page then
    /// says where to go on): a job in the queue as QueryJob shows it (with
    /// its tags); one that ended as its archive entry has it, with
    /// `"archived": true`; one that is in neither (deleted) as `{"jobID",
    /// "state": "GONE"}`. Each has `"tracked": true`.
    pub async fn tracked(
        &self,
        after: JobId,
        limit: usize,
        max_bytes: usize,
    ) -> Result<TrackedPage, JobError> {
        let limit = limit.clamp(1, MAX_LABEL_PAGE);
        self.read(move |tx| {
            let ids = tx.labels().tracked(after, limit)?;
            let labels = tx.labels().of(&ids)?;
            let mut page = TrackedPage::default();
            let mut bytes = ByteCount::new(max_bytes);
            for (id, labels) in ids.into_iter().zip(labels) {
                let shown = match tx.get(id)? {
                    Some(job) => Value::Object(labelled_json(&job, &labels)),
                    None => match tx.ledger().archived(id)? {
                        Some(ended) => {
                            let mut object = match ended.to_json() {
                                Value::Object(object) => object,
                                _ => serde_json::Map::new(),
                            };
                            object.insert("archived".into(), json!(true));
                            object.insert("tracked".into(), json!(true));
                            Value::Object(object)
                        }
                        None => json!({"jobID": id, "state": "GONE", "tracked": true}),
                    },
                };
                if !bytes.admit(json_len(&shown), page.jobs.is_empty()) {
                    page.next_after = page.last;
                    break;
                }
                page.last = Some(id);
                page.jobs.push(shown);
            }
            Ok(page)
        })
        .await
    }
}

/// A page of tracked jobs (see [`Queue::tracked`]).
#[derive(Debug, Default)]
pub struct TrackedPage {
    /// The jobs, in id order.
    pub jobs: Vec<Value>,
    /// Set when the page was cut short to keep it small: the last id on
    /// it, to go on after.
    pub next_after: Option<JobId>,
    last: Option<JobId>,
}

/// The tracked jobs' ids in memory, for the event stream's `tracked`
/// filter, which must answer without the store: read at start, then kept
/// by this server's track and untrack (a job tracked through another
/// server sharing the store shows once this one restarts).
#[derive(Debug, Default)]
pub struct TrackedSet(std::sync::RwLock<std::collections::HashSet<JobId>>);

impl TrackedSet {
    fn set(&self, id: JobId, tracked: bool) {
        let mut ids = self.0.write().unwrap_or_else(|e| e.into_inner());
        if tracked {
            ids.insert(id);
        } else {
            ids.remove(&id);
        }
    }

    fn contains(&self, id: JobId) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }
}

/// Gives the event streams the tracked jobs, by the set in memory.
pub(super) fn watch_tracked(queue: &Queue) {
    let set = Arc::clone(&queue.inner.tracked);
    queue
        .events()
        .set_tracked(Arc::new(move |id: JobId| set.contains(id)));
}

impl Queue {
    /// Reads the tracked jobs into memory for the event streams; the
    /// server does so before it serves.
    pub async fn load_tracked(&self) {
        let mut after = 0;
        loop {
            match self.read(move |tx| tx.labels().tracked(after, 1000)).await {
                Ok(ids) if ids.is_empty() => return,
                Ok(ids) => {
                    after = ids.last().copied().unwrap_or(after);
                    for id in ids {
                        self.inner.tracked.set(id, true);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the tracked jobs: event streams with tracked=true miss those tracked before this start");
                    return;
                }
            }
        }
    }
}
