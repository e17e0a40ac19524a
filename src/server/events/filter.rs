//! Which events a stream wants: by name GLOB, by job id, and tracked jobs
//! only.

use std::collections::HashSet;
use std::sync::Arc;

use super::event::JobEvent;
use crate::protocol::{JobId, NamePattern};

/// Answers whether a job is tracked, from memory (it is asked for every
/// event a `tracked=true` stream sees, on the stream's task).
pub trait TrackedJobs: Send + Sync {
    /// Whether `job` is tracked now.
    fn is_tracked(&self, job: JobId) -> bool;
}

impl<F: Fn(JobId) -> bool + Send + Sync> TrackedJobs for F {
    fn is_tracked(&self, job: JobId) -> bool {
        self(job)
    }
}

/// A stream's filter; an event passes when it passes every part given.
#[derive(Clone, Default)]
pub struct Filter {
    /// Jobs whose name matches this GLOB.
    pub name: Option<NamePattern>,
    /// These jobs.
    pub jobs: Option<HashSet<JobId>>,
    /// Tracked jobs, as this says.
    pub tracked: Option<Arc<dyn TrackedJobs>>,
}

impl Filter {
    /// Whether `event` passes.
    pub fn admits(&self, event: &JobEvent) -> bool {
        self.name.as_ref().is_none_or(|p| p.matches(&event.name))
            && self.jobs.as_ref().is_none_or(|j| j.contains(&event.job_id))
            && self
                .tracked
                .as_ref()
                .is_none_or(|t| t.is_tracked(event.job_id))
    }
}
