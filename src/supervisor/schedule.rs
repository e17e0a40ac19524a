//! Recurring jobs declared in the configuration (`[[schedule]]`), kept in
//! step with the server: created as unique jobs on start, updated when their
//! entry changes, deleted when it is removed. This replaces crontab lines.
//!
//! What was declared is remembered in `schedule.json` in the state directory,
//! so that an unchanged entry leaves its job alone (its data evolves from run
//! to run) and a removed entry's job can be found again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::client::{JobSource, SourceError};
use crate::protocol::{CreateJob, JobId};

/// The record of declared jobs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    /// By name: the job's id and the entry it was declared from.
    jobs: BTreeMap<String, Declared>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Declared {
    #[serde(rename = "jobID")]
    job_id: JobId,
    entry: String,
}

/// What a sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Synced {
    /// Names created or updated.
    pub declared: Vec<String>,
    /// Names left as they were.
    pub unchanged: Vec<String>,
    /// Names whose jobs were deleted.
    pub removed: Vec<String>,
    /// Whether some removal must be tried again later.
    pub pending: bool,
}

fn entry_text(job: &CreateJob) -> String {
    serde_json::json!({
        "data": job.data,
        "repeat": job.repeat.as_ref().map(|r| r.text.clone()),
        "priority": job.priority.map(|p| p.value()),
    })
    .to_string()
}

fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join("schedule.json")
}

fn load(state_dir: &Path) -> Record {
    std::fs::read(record_path(state_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save(state_dir: &Path, record: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let path = record_path(state_dir);
    let temporary = path.with_extension("json.tmp");
    std::fs::write(
        &temporary,
        serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(temporary, path)
}

/// Brings the server in step with `schedule`.
pub async fn sync(
    source: &dyn JobSource,
    schedule: &[CreateJob],
    state_dir: &Path,
) -> Result<Synced, SourceError> {
    let mut record = load(state_dir);
    let mut synced = Synced::default();
    for job in schedule {
        let entry = entry_text(job);
        let known = record.jobs.get(&job.name).cloned();
        if let Some(known) = &known
            && known.entry == entry
            && source.exists(known.job_id).await?
        {
            synced.unchanged.push(job.name.clone());
            continue;
        }
        // New or changed: a unique create merges the declared data into an
        // existing job of that name and sets its repeat and priority.
        let job_id = source.create(job).await?;
        record
            .jobs
            .insert(job.name.clone(), Declared { job_id, entry });
        synced.declared.push(job.name.clone());
        save_or_warn(state_dir, &record);
    }
    let gone: Vec<String> = record
        .jobs
        .keys()
        .filter(|name| !schedule.iter().any(|j| &j.name == *name))
        .cloned()
        .collect();
    for name in gone {
        let Some(declared) = record.jobs.get(&name).cloned() else {
            continue;
        };
        match source.delete(declared.job_id).await {
            Ok(()) | Err(SourceError::NotFound(_)) => {}
            Err(SourceError::Refused(why)) => {
                tracing::warn!(job_name = %name, job_id = declared.job_id, %why, "cannot delete a job removed from the schedule yet (it may be running); trying again in a minute");
                synced.pending = true;
                continue;
            }
            Err(error) => return Err(error),
        }
        record.jobs.remove(&name);
        synced.removed.push(name);
        save_or_warn(state_dir, &record);
    }
    save_or_warn(state_dir, &record);
    Ok(synced)
}

fn save_or_warn(state_dir: &Path, record: &Record) {
    if let Err(error) = save(state_dir, record) {
        tracing::warn!(%error, dir = %state_dir.display(), "cannot record the declared jobs");
    }
}
