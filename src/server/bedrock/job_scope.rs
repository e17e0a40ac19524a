//! What a job token ([`crate::auth::job_token`]) may do on the Bedrock port:
//! the credential a supervisor gives a worker whose Bedrock client creates
//! child jobs. It is accepted wherever the `Token` header is read, after the
//! API token (which is compared first, so its requests cost nothing more).
//!
//! - **While its job runs.** Each request's token is checked against the
//!   job as the store has it now (one read): the job must be held (RUNNING,
//!   or RUNQUEUED for a `retryAfter` job) and the token's MAC must be the
//!   one of its current lease. Otherwise, whether the job was reported, its
//!   lease lapsed and it was handed out again, it never existed, or the
//!   token is forged or another server's, the answer is the same
//!   [`NOT_RUNNING`] and the connection closes, as for a wrong API token:
//!   the answer tells a caller nothing about the job.
//! - **CreateJob and CreateJobs** are run as for the API token, except
//!   that a `parentJobID` (of the request, or of any job of a CreateJobs)
//!   must be the token's own job ([`OTHER_PARENT`]), and that a `unique`
//!   create never overwrites the job of that name it finds: it answers
//!   with that job's id and leaves it as it is, as with `overwrite: false`
//!   (overwriting would change the data, repeat and priority of a job the
//!   token does not own). A create with `depends` is refused
//!   ([`NO_DEPENDS`]): its answer would tell whether other jobs exist and
//!   how they ended.
//! - **QueryJob** answers about the token's own job and its children (with
//!   their tags and tracking, as for the API token); any
//!   other id, existing or not, is refused ([`FORBIDDEN`]).
//! - **Everything else** (GetJob(s), UpdateJob, FinishJob, RetryJob,
//!   FailJob, DeleteJob, CancelJob, RequeueJobs, Heartbeat, HandBackJob,
//!   TrackJob, UntrackJob, unknown commands) is refused with [`FORBIDDEN`]; the port has no
//!   harmless command (such as a ping) to allow. A refusal keeps the
//!   connection open.
//!
//! Refusals are logged at info with the job id and the command, never the
//! token, each kind at most once per [`Tally::EVERY`] with how many there
//! were (anyone who can reach the port can send forged tokens as fast as
//! they are answered).
//!
//! A job token's connections have places of their own, per job and for
//! all jobs (see [`crate::server::admission`]).

use super::commands::{self, Answer, Params};
use super::frame::Request;
use crate::auth::ApiToken;
use crate::auth::job_token::JobToken;
use crate::protocol::{Job, JobError, JobId};
use crate::server::admission::Credential;
use crate::server::queue::Queue;
use crate::server::tally::Tally;

/// The answer to a command a job token may not send (the connection stays
/// open).
pub const FORBIDDEN: &str =
    "403 Forbidden: a job token may only create jobs and query its own job and its children";

/// The answer to a create with `depends`.
pub const NO_DEPENDS: &str = "403 Forbidden: a job token may not create jobs with depends; the job's own client (with the API token) can";

/// The answer to a create whose `parentJobID` is not the token's own job
/// (the connection stays open).
pub const OTHER_PARENT: &str = "403 Forbidden: a job token may only create children of its own job";

/// The answer to a job token that does not verify against its job's
/// current hand-out; the connection closes.
pub const NOT_RUNNING: &str = "401 Unauthorized: this job token's job is no longer running";

/// The answer to a `Token` header that is neither the API token nor a job
/// token; the connection closes.
pub const UNAUTHORIZED: &str = "401 Unauthorized: send the server's token in a Token header";

/// Who sent a request that passed the token check.
#[derive(Debug)]
pub enum Caller {
    /// The API token, or a trusted loopback peer: every command.
    Full,
    /// A job token of this job, as read for the check.
    Job(Box<Job>),
}

impl Caller {
    /// What its request proves its connection with.
    pub fn credential(&self) -> Credential {
        match self {
            Caller::Full => Credential::ApiToken,
            Caller::Job(job) => Credential::JobToken(job.id),
        }
    }

    /// The job of a job token's caller.
    pub fn job_id(&self) -> Option<JobId> {
        match self {
            Caller::Full => None,
            Caller::Job(job) => Some(job.id),
        }
    }
}

/// Checks a `Token` header that is not the API token: a job token of a job
/// held under the hand-out it was minted for admits its caller. Otherwise
/// the status line to close the connection with; a refused job token is
/// counted in `refused` (and logged as it says).
pub async fn admit(
    queue: &Queue,
    api_token: &ApiToken,
    given: &str,
    method: &str,
    refused: &Tally,
) -> Result<Caller, String> {
    let Some(claim) = JobToken::parse(given) else {
        return Err(UNAUTHORIZED.into());
    };
    let job_id = claim.job_id();
    let why = match queue.query(job_id).await {
        Ok(job) => match &job.lease {
            Some(lease) if job.state.is_held() => {
                if claim.verify(api_token, &lease.token) {
                    return Ok(Caller::Job(Box::new(job)));
                }
                "it does not match the job's current hand-out (an earlier hand-out's, \
                 or not made with this server's token)"
            }
            _ => "the job is not running",
        },
        Err(JobError::NoSuchJob) => "there is no such job",
        Err(error) => {
            tracing::warn!(job_id, %method, %error,
                "Bedrock port: could not check a job token");
            return Err(error.status_line());
        }
    };
    if let Some(refused) = refused.note() {
        tracing::info!(job_id, %method, refused,
            "Bedrock port: job tokens refused; the last: {why}");
    }
    Err(NOT_RUNNING.into())
}

/// Why a job token's request was not run.
enum Denied {
    /// A rule of the command's own.
    Error(JobError),
    /// Not the token's to send: its status line, and why, to log.
    Forbidden(&'static str, &'static str),
}

impl From<JobError> for Denied {
    fn from(error: JobError) -> Self {
        Denied::Error(error)
    }
}

/// Runs one request of a job token's caller, whose job is `holder`, within
/// what the token allows; a refused request is counted in `refused` (and
/// logged as it says).
pub async fn run(queue: &Queue, request: &Request, holder: &Job, refused: &Tally) -> Answer {
    commands::count(request);
    let method = request.method.to_ascii_lowercase();
    let answer = match method.as_str() {
        "createjob" => create(queue, request, holder, false).await,
        "createjobs" => create(queue, request, holder, true).await,
        "queryjob" => query(queue, request, holder).await,
        _ => Err(Denied::Forbidden(
            FORBIDDEN,
            "the command is not one a job token may send",
        )),
    };
    match answer {
        Ok(answer) => answer,
        Err(Denied::Error(error)) => Answer::error(&error),
        Err(Denied::Forbidden(status_line, why)) => {
            if let Some(refused) = refused.note() {
                tracing::info!(job_id = holder.id, method = %request.method, refused,
                    "Bedrock port: job tokens' requests refused; the last: {why}");
            }
            Answer::refusal(status_line)
        }
    }
}

/// CreateJob(s) with every `parentJobID` the holder's, never overwriting.
async fn create(
    queue: &Queue,
    request: &Request,
    holder: &Job,
    many: bool,
) -> Result<Answer, Denied> {
    let params = Params::new(request);
    let mut cmds = commands::creates(&params, many)?;
    if cmds
        .iter()
        .any(|cmd| cmd.parent_id.is_some_and(|parent| parent != holder.id))
    {
        return Err(Denied::Forbidden(
            OTHER_PARENT,
            "a parentJobID is another job's",
        ));
    }
    if cmds.iter().any(|cmd| !cmd.depends.is_empty()) {
        return Err(Denied::Forbidden(NO_DEPENDS, "a create names depends"));
    }
    for cmd in &mut cmds {
        cmd.overwrite = false;
    }
    Ok(commands::create(queue, &params, cmds, many, Some(holder.id)).await?)
}

/// QueryJob of the holder (answered from the job as read for the token
/// check) or one of its children.
async fn query(queue: &Queue, request: &Request, holder: &Job) -> Result<Answer, Denied> {
    let id: JobId = Params::new(request).job_id()?;
    if id == holder.id {
        let labels = queue.labels(vec![id]).await?.pop().unwrap_or_default();
        return Ok(commands::query_answer(holder.clone(), &labels));
    }
    let not_ours = Denied::Forbidden(FORBIDDEN, "QueryJob of a job neither its own nor a child");
    match queue.query_labelled(id).await {
        Ok((job, labels)) if job.parent_id == holder.id => Ok(commands::query_answer(job, &labels)),
        Ok(_) | Err(JobError::NoSuchJob) => Err(not_ours),
        Err(error) => Err(Denied::Error(error)),
    }
}
