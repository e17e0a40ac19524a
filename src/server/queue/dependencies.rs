//! Dependencies between jobs (qless's "depends"): a job created with
//! `depends`, or given dependencies later, waits in DEPENDS, where no claim
//! ever sees it (claims read only QUEUED and RUNQUEUED jobs), until every
//! job it depends on has finished; then it is QUEUED, due at its `nextRun`,
//! and the commit wakes waiters (and, on a shared store, the other
//! servers) as for any job made ready.
//!
//! - A dependency is satisfied by a FinishJob that ends its run: a one-off
//!   job's (deleted, or FINISHED for a child), or a repeating job's current
//!   run. A finish that pauses a parent for its children is not the end of
//!   its run.
//! - A dependency that fails, is cancelled or is deleted leaves its
//!   dependents waiting, and QueryJob shows it (with its state, its end
//!   state from the archive, or `gone`); drop it from them to let them run.
//! - Only jobs that exist can be depended on (a job that finished and is
//!   still in the archive counts as finished), and only jobs created before
//!   the dependent (a lower id): no cycle can ever form.
//!
//! Locking, for servers sharing a store: jobs are locked in id order, the
//! dependencies (always lower ids) before their dependent, so that a
//! change of dependencies and the finish of a dependency take turns on the
//! dependent, and the one that comes second sees the other's rows.

use serde_json::{Map, Value, json};

use super::tracked::Tracked;
use super::{Queue, rules};
use crate::protocol::{ChangeDepends, Job, JobError, JobId, JobState, UpdateJob};

/// The most dependents QueryJob lists.
pub const MAX_DEPENDENTS_SHOWN: usize = 1000;

/// What QueryJob shows of a job's dependencies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DependencyView {
    /// The jobs it still waits for, each with its state: the job's, the
    /// archive's end state if it ended, or `gone`.
    pub dependencies: Vec<(JobId, String)>,
    /// Jobs waiting for it, in id order (at most [`MAX_DEPENDENTS_SHOWN`]).
    pub dependents: Vec<JobId>,
    /// Whether more jobs wait for it than are listed.
    pub more_dependents: bool,
    /// The throttles its name is counted under (see
    /// [`super::throttles::matching`]); shown only when there are some.
    pub throttles: Vec<Value>,
}

impl DependencyView {
    /// Whether it shows nothing (no dependency either way).
    pub fn is_empty(&self) -> bool {
        self.dependencies.is_empty() && self.dependents.is_empty() && self.throttles.is_empty()
    }

    /// Adds `dependencies` (`[{jobID, state}]`) and `dependents` (`[jobID]`)
    /// to a job's JSON object, and `moreDependents: true` when the list of
    /// dependents was cut.
    pub fn add_to(&self, object: &mut Map<String, Value>) {
        let dependencies: Vec<Value> = self
            .dependencies
            .iter()
            .map(|(id, state)| json!({"jobID": id, "state": state}))
            .collect();
        object.insert("dependencies".into(), Value::Array(dependencies));
        object.insert("dependents".into(), json!(self.dependents));
        if self.more_dependents {
            object.insert("moreDependents".into(), json!(true));
        }
        if !self.throttles.is_empty() {
            object.insert("throttles".into(), Value::Array(self.throttles.clone()));
        }
    }
}

/// Of the jobs `ids`, those that have not finished, in id order; each is
/// locked (lowest id first). A job that finished and left the queue is
/// found in the archive; an unknown id, or a job that ended otherwise and
/// was deleted, is refused.
pub fn unfinished(tx: &mut Tracked, ids: &[JobId]) -> Result<Vec<JobId>, JobError> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut waiting = Vec::with_capacity(ids.len());
    for id in ids {
        match tx.get(id)? {
            Some(job) if job.state == JobState::Finished => {}
            Some(_) => waiting.push(id),
            None => match tx.store().ledger().archived(id)? {
                Some(ended) if ended.state == JobState::Finished.as_str() => {}
                Some(ended) => return Err(JobError::DependencyEnded(id, ended.state)),
                None => return Err(JobError::DependencyMissing(id)),
            },
        }
    }
    Ok(waiting)
}

/// Records that the new job `id` waits for `on` (from [`unfinished`]).
/// Refuses a dependency that is not an earlier job.
pub fn record(tx: &mut Tracked, id: JobId, on: &[JobId]) -> Result<(), JobError> {
    if let Some(&later) = on.iter().find(|&&dependency| dependency >= id) {
        return Err(JobError::DependencyNotEarlier { job: id, on: later });
    }
    if on.is_empty() {
        return Ok(());
    }
    tx.store().depends().add(id, on)
}

/// After a FinishJob of `id`: if it ended its run (the job is gone,
/// FINISHED, or queued for its next run; not paused for its children), no
/// job waits for it any more.
pub fn after_finish(tx: &mut Tracked, id: JobId) -> Result<(), JobError> {
    let paused = tx
        .store()
        .peek(id)?
        .is_some_and(|job| job.state == JobState::Paused);
    if paused {
        return Ok(());
    }
    release(tx, id)
}

/// The jobs waiting for `id` wait for it no more; each that waited for
/// nothing else is QUEUED. Each is locked first (in id order: all are
/// later than `id`), so that two servers finishing two of its dependencies
/// take turns and the second sees it waits for nothing.
fn release(tx: &mut Tracked, id: JobId) -> Result<(), JobError> {
    for dependent in tx.store().depends().dependents(id)? {
        let Some(mut job) = tx.get(dependent)? else {
            continue;
        };
        tx.store().depends().remove(dependent, &[id])?;
        if job.state == JobState::Depends && tx.store().depends().outstanding(dependent)?.is_empty()
        {
            job.state = JobState::Queued;
            tx.update(&job)?;
        }
    }
    Ok(())
}

/// Adds and drops dependencies of a QUEUED or DEPENDS job (drops first, so
/// a job in both lists is kept); it is DEPENDS after if it waits for
/// anything, else QUEUED. Returns the job as it is now.
pub fn change(tx: &mut Tracked, cmd: &ChangeDepends) -> Result<Job, JobError> {
    if let Some(&later) = cmd.add.iter().find(|&&on| on >= cmd.id) {
        return Err(JobError::DependencyNotEarlier {
            job: cmd.id,
            on: later,
        });
    }
    // Dependencies first: they are earlier jobs (see the module's doc).
    let adding = unfinished(tx, &cmd.add)?;
    let mut job = tx.existing(cmd.id)?;
    if job.is_child() {
        return Err(JobError::ChildDepends);
    }
    if !matches!(job.state, JobState::Queued | JobState::Depends) {
        return Err(JobError::DependsNotAllowed(job.id, job.state));
    }
    let depends = tx.store().depends();
    depends.remove(job.id, &cmd.remove)?;
    depends.add(job.id, &adding)?;
    let state = if depends.outstanding(job.id)?.is_empty() {
        JobState::Queued
    } else {
        JobState::Depends
    };
    if state != job.state {
        job.state = state;
        tx.update(&job)?;
    }
    Ok(job)
}

/// What QueryJob shows of job `id`'s dependencies, read unlocked.
pub fn view(
    tx: &mut dyn crate::server::store::StoreTx,
    id: JobId,
) -> Result<DependencyView, JobError> {
    let mut view = DependencyView::default();
    for on in tx.depends().outstanding(id)? {
        let state = match tx.peek(on)? {
            Some(job) => job.state.as_str().to_string(),
            None => match tx.ledger().archived(on)? {
                Some(ended) => ended.state,
                None => "gone".to_string(),
            },
        };
        view.dependencies.push((on, state));
    }
    let mut dependents = tx.depends().dependents(id)?;
    if dependents.len() > MAX_DEPENDENTS_SHOWN {
        dependents.truncate(MAX_DEPENDENTS_SHOWN);
        view.more_dependents = true;
    }
    view.dependents = dependents;
    Ok(view)
}

impl Queue {
    /// QueryJob, with the job's dependencies and dependents.
    pub async fn query_with_dependencies(
        &self,
        id: JobId,
    ) -> Result<(Job, DependencyView), JobError> {
        self.read(move |tx| {
            let job = tx.get(id)?.ok_or(JobError::NoSuchJob)?;
            Ok((job, view(tx, id)?))
        })
        .await
    }

    /// QueryJob with all that is shown of the job: its tags and tracking,
    /// its dependencies and dependents, and the throttles its name is
    /// counted under, read together.
    pub async fn query_in_full(
        &self,
        id: JobId,
    ) -> Result<(Job, crate::protocol::Labels, DependencyView), JobError> {
        let now = self.now();
        self.read(move |tx| {
            let job = tx.get(id)?.ok_or(JobError::NoSuchJob)?;
            let labels = tx.labels().of(&[id])?.pop().unwrap_or_default();
            let mut view = view(tx, id)?;
            view.throttles = super::throttles::matching(tx, &job.name, now)?;
            Ok((job, labels, view))
        })
        .await
    }

    /// Adds and drops dependencies of a job (see [`change`]), after an
    /// UpdateJob of it in the same transaction when one is given. Returns
    /// the job as it is now and what QueryJob shows of its dependencies.
    pub async fn change_depends(
        &self,
        cmd: ChangeDepends,
        update: Option<UpdateJob>,
    ) -> Result<(Job, DependencyView), JobError> {
        self.write(move |tx| {
            if let Some(update) = &update {
                rules::update(tx, update)?;
            }
            let job = change(tx, &cmd)?;
            let view = view(tx.store(), job.id)?;
            Ok((job, view))
        })
        .await
    }
}
