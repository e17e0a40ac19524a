//! The Jobs commands as Bedrock clients send them: parameters as header
//! values (or fields of a JSON body), answers as a status line and a JSON
//! object. Each command is checked with the same rules as the HTTP API and
//! run on the same queue.
//!
//! Leases, for clients that ask (jobmgr's own supervisor): GetJob(s) with
//! `leaseMs` hands out under a lease and answers with the HTTP dequeue's
//! lease fields; `Heartbeat` renews it; UpdateJob, FinishJob, RetryJob and
//! FailJob with `lease` are refused (`409 Lease lost`) once it lapsed;
//! `HandBackJob` puts back, under its lease, a job its holder never started,
//! as it was before the hand-out. A request without these fields is
//! answered exactly as Bedrock answers it.
//!
//! Tags and tracking (qless's): CreateJob(s) take `tags`, a JSON array;
//! UpdateJob takes `addTags` and `removeTags` (with them, `data` may be left
//! out to change only the tags); `TrackJob` and `UntrackJob` take a
//! `jobID`; QueryJob shows `tags` when the job has some and `tracked` when
//! it is tracked, and nothing new otherwise.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::frame::{self, Request};
use crate::protocol::tags::parse_tags;
use crate::protocol::view::{HandOut, add_bedrock_labels};
use crate::protocol::{
    ChangeDepends, CreateJob, Data, FailJob, FinishJob, GetJobs, Job, JobError, JobId, Labels,
    LeaseTerm, NamePattern, Priority, Repeat, RequeueJobs, RetryAfter, RetryJob, TagChange,
    UpdateJob, check_name, parse_data, parse_depends, parse_flag, parse_job_id, parse_job_ids,
    parse_num_results, parse_time,
};
use crate::server::budget::AnswerShare;
use crate::server::queue::{DependencyView, Queue};

/// The longest a `Connection: wait` GetJob is held: one hour.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A command's answer: a status line and a body (empty on errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// E.g. `200 OK` or `404 No job found`.
    pub status_line: String,
    /// The JSON body, or empty.
    pub body: String,
    /// Jobs handed out by this answer, to put back if it cannot be delivered.
    pub handouts: Vec<HandOut>,
}

impl Answer {
    fn ok(body: Value) -> Self {
        Answer {
            status_line: "200 OK".into(),
            body: body.to_string(),
            handouts: Vec::new(),
        }
    }

    fn empty() -> Self {
        Answer {
            status_line: "200 OK".into(),
            body: String::new(),
            handouts: Vec::new(),
        }
    }

    /// The answer for an error.
    pub fn error(error: &JobError) -> Self {
        Answer::refusal(error.status_line())
    }

    /// A refusal with this status line and an empty body.
    pub fn refusal(status_line: impl Into<String>) -> Self {
        Answer {
            status_line: status_line.into(),
            body: String::new(),
            handouts: Vec::new(),
        }
    }
}

/// A request's parameters: headers first, then fields of a JSON object body.
pub(super) struct Params<'a> {
    request: &'a Request,
    body: Option<Map<String, Value>>,
}

impl<'a> Params<'a> {
    pub(super) fn new(request: &'a Request) -> Self {
        let body = (!request.body.is_empty())
            .then(|| serde_json::from_slice::<Value>(&request.body).ok())
            .flatten()
            .and_then(|v| match v {
                Value::Object(map) => Some(map),
                _ => None,
            });
        Params { request, body }
    }

    fn body_field(&self, name: &str) -> Option<String> {
        let value = self
            .body
            .as_ref()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))?
            .1;
        Some(match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// A text parameter, unescaped; empty counts as absent.
    fn text(&self, name: &str) -> Option<String> {
        self.request
            .header(name)
            .or_else(|| self.body_field(name))
            .filter(|v| !v.is_empty())
    }

    /// A JSON parameter's text: as sent, or unescaped when only that parses.
    fn json_text(&self, name: &str) -> Option<String> {
        match self.request.raw_header(name) {
            Some("") => None,
            Some(raw) => {
                // Bedrock unescapes every header (Bedrock-PHP escapes the
                // backslashes of the JSON it sends); a client that sent its
                // JSON unescaped is read as sent when only that reads.
                let unescaped = frame::unescape(raw);
                let reads = |text: &str| serde_json::from_str::<Value>(text).is_ok();
                if !reads(&unescaped) && reads(raw) {
                    Some(raw.to_string())
                } else {
                    Some(unescaped)
                }
            }
            None => self.body_field(name).filter(|v| !v.is_empty()),
        }
    }

    /// The lease token a holder shows (`lease`), when it shows one.
    fn lease(&self) -> Option<String> {
        self.text("lease")
    }

    pub(super) fn job_id(&self) -> Result<JobId, JobError> {
        parse_job_id("jobID", &self.text("jobID").unwrap_or_default())
    }

    fn data(&self) -> Result<Option<Data>, JobError> {
        self.json_text("data").map(|d| parse_data(&d)).transpose()
    }

    fn priority(&self) -> Result<Option<Priority>, JobError> {
        self.text("jobPriority")
            .or_else(|| self.text("priority"))
            .map(|p| Priority::parse(&p))
            .transpose()
    }

    fn flag(&self, name: &'static str) -> Result<bool, JobError> {
        self.text(name)
            .map(|v| parse_flag(name, &v))
            .transpose()
            .map(|v| v.unwrap_or(false))
    }
}

/// The commands the port answers (lower-cased), for counting requests.
const COMMANDS: [&str; 19] = [
    "createjob",
    "createjobs",
    "getjob",
    "getjobs",
    "queryjob",
    "updatejob",
    "finishjob",
    "retryjob",
    "failjob",
    "deletejob",
    "canceljob",
    "requeuejobs",
    "heartbeat",
    "handbackjob",
    "trackjob",
    "untrackjob",
    "setthrottle",
    "deletethrottle",
    "getthrottles",
];

/// Runs one request and answers it; errors become their status lines. The
/// jobs a GetJob(s) hands out are drawn on `share` (see
/// [`Queue::within_budget`]).
pub async fn run(queue: &Queue, request: &Request, share: &AnswerShare) -> Answer {
    count(request);
    match dispatch(queue, request, share).await {
        Ok(answer) => answer,
        Err(error) => Answer::error(&error),
    }
}

/// Counts a request by its command.
pub(super) fn count(request: &Request) {
    let method = request.method.to_ascii_lowercase();
    let known = COMMANDS.iter().find(|c| **c == method).copied();
    crate::metrics::server_request("bedrock", known.unwrap_or("unknown"), "");
}

async fn dispatch(
    queue: &Queue,
    request: &Request,
    share: &AnswerShare,
) -> Result<Answer, JobError> {
    let params = Params::new(request);
    let method = request.method.to_ascii_lowercase();
    match method.as_str() {
        "createjob" | "createjobs" => {
            let many = method == "createjobs";
            create(queue, &params, creates(&params, many)?, many, None).await
        }
        "getjob" | "getjobs" => {
            let many = method == "getjobs";
            get_jobs(queue, request, &params, many, share).await
        }
        "queryjob" => {
            let (job, labels, dependencies) = queue.query_in_full(params.job_id()?).await?;
            Ok(query_answer_with(job, &labels, &dependencies))
        }
        "updatejob" => {
            let id = params.job_id()?;
            let tags = tag_change(&params, id)?;
            let depends = depends_change(&params, id)?;
            let data = params.data()?;
            let updates_fields = [
                "repeat",
                "shouldClearRepeat",
                "jobPriority",
                "priority",
                "nextRun",
            ]
            .iter()
            .any(|name| params.text(name).is_some());
            let cmd = match data {
                Some(data) => Some(UpdateJob {
                    id,
                    data,
                    repeat: params
                        .text("repeat")
                        .map(|r| Repeat::parse(&r))
                        .transpose()?,
                    clear_repeat: params.flag("shouldClearRepeat")?,
                    priority: params.priority()?,
                    next_run: params
                        .text("nextRun")
                        .map(|t| parse_time("nextRun", &t))
                        .transpose()?,
                    lease: params.lease(),
                }),
                // Without data, UpdateJob may only change tags and
                // dependencies.
                None if (tags.is_some() || depends.is_some()) && !updates_fields => None,
                None => return Err(JobError::Missing("data")),
            };
            match (depends, tags, cmd) {
                (Some(change), tags, cmd) => {
                    queue.change_depends(change, cmd).await?;
                    if let Some(tags) = tags {
                        queue.update_and_tag(None, tags).await?;
                    }
                }
                (None, Some(tags), cmd) => queue.update_and_tag(cmd, tags).await?,
                (None, None, Some(cmd)) => queue.update(cmd).await?,
                (None, None, None) => return Err(JobError::Missing("data")),
            }
            Ok(Answer::empty())
        }
        "setthrottle" => {
            let glob = params.text("glob").ok_or(JobError::Missing("glob"))?;
            let max = params.text("max").ok_or(JobError::Missing("max"))?;
            let max: i64 = max
                .trim()
                .parse()
                .map_err(|_| JobError::BadThrottle(format!("max {max:?} is not a whole number")))?;
            crate::server::queue::throttles::check(&glob, Some(max))
                .map_err(JobError::BadThrottle)?;
            queue.set_throttle(glob, max).await?;
            Ok(Answer::empty())
        }
        "deletethrottle" => {
            let glob = params.text("glob").ok_or(JobError::Missing("glob"))?;
            crate::server::queue::throttles::check(&glob, None).map_err(JobError::BadThrottle)?;
            if !queue.delete_throttle(glob).await? {
                return Err(JobError::NoSuchThrottle);
            }
            Ok(Answer::empty())
        }
        "getthrottles" => Ok(Answer::ok(json!({"throttles": queue.throttles().await?}))),
        "trackjob" => {
            queue.track(params.job_id()?).await?;
            Ok(Answer::empty())
        }
        "untrackjob" => {
            queue.untrack(params.job_id()?).await?;
            Ok(Answer::empty())
        }
        "finishjob" => {
            let cmd = FinishJob {
                id: params.job_id()?,
                data: params.data()?,
                lease: params.lease(),
                run: None,
            };
            queue.finish(cmd).await?;
            Ok(Answer::empty())
        }
        "retryjob" => {
            let delay = match params.text("delay") {
                None => 0,
                Some(d) => parse_delay(&d)?,
            };
            let name = params.text("name");
            if let Some(name) = &name {
                check_name(name)?;
            }
            let cmd = RetryJob {
                id: params.job_id()?,
                data: params.data()?,
                delay_secs: delay,
                next_run: params
                    .text("nextRun")
                    .map(|t| parse_time("nextRun", &t))
                    .transpose()?,
                name,
                priority: params.priority()?,
                ignore_repeat: params.flag("ignoreRepeat")?,
                lease: params.lease(),
                run: None,
            };
            queue.retry(cmd).await?;
            Ok(Answer::empty())
        }
        "failjob" => {
            let cmd = FailJob {
                id: params.job_id()?,
                data: params.data()?,
                lease: params.lease(),
                run: None,
            };
            queue.fail(cmd).await?;
            Ok(Answer::empty())
        }
        "deletejob" => {
            queue.delete(params.job_id()?).await?;
            Ok(Answer::empty())
        }
        "canceljob" => {
            queue.cancel(params.job_id()?).await?;
            Ok(Answer::empty())
        }
        "requeuejobs" => {
            let ids = parse_job_ids("jobIDs", &params.text("jobIDs").unwrap_or_default())?;
            let name = params.text("name");
            queue.requeue(RequeueJobs { ids, name }).await?;
            Ok(Answer::empty())
        }
        "heartbeat" => {
            let id = params.job_id()?;
            let token = params.lease().ok_or(JobError::Missing("lease"))?;
            let expires = queue.heartbeat(id, token).await?;
            Ok(Answer::ok(
                json!({"leaseExpires": expires.map(|t| t.to_string()).unwrap_or_default()}),
            ))
        }
        "handbackjob" => {
            let id = params.job_id()?;
            let token = params.lease().ok_or(JobError::Missing("lease"))?;
            queue.hand_back(id, token).await?;
            Ok(Answer::empty())
        }
        _ => Err(JobError::UnrecognizedCommand),
    }
}

/// The jobs a CreateJob (one) or CreateJobs (`many`) asks for, checked.
pub(super) fn creates(params: &Params<'_>, many: bool) -> Result<Vec<CreateJob>, JobError> {
    if !many {
        let cmd = create_job(&|name| params.text(name), &|name| params.json_text(name))?;
        return Ok(vec![cmd]);
    }
    let jobs = params.json_text("jobs").ok_or(JobError::InvalidJson)?;
    let jobs: Vec<Value> = match serde_json::from_str(&jobs) {
        Ok(Value::Array(jobs)) if !jobs.is_empty() => jobs,
        _ => return Err(JobError::InvalidJson),
    };
    jobs.iter()
        .map(|job| {
            // An element that is not a job at all (`[{}]`, `[1]`) makes the
            // list invalid; a job with a bad parameter gets that
            // parameter's error, as CreateJob does.
            let Value::Object(job) = job else {
                return Err(JobError::InvalidJson);
            };
            if job.is_empty() {
                return Err(JobError::InvalidJson);
            }
            let field = |name: &str| -> Option<String> {
                job.get(name)
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .filter(|v| !v.is_empty())
            };
            create_job(&field, &field)
        })
        .collect()
}

/// Creates `cmds` (idempotently with an `idempotencyKey`, within `scope`
/// when it is a job token's) and answers as CreateJob (`{"jobID"}`) or
/// CreateJobs (`many`, `{"jobIDs"}`) does.
pub(super) async fn create(
    queue: &Queue,
    params: &Params<'_>,
    cmds: Vec<CreateJob>,
    many: bool,
    scope: Option<JobId>,
) -> Result<Answer, JobError> {
    let key = params.text("idempotencyKey").map(|key| match scope {
        // A job's keys are its own: a worker can neither take a key the
        // server's clients use nor see what they created with it.
        Some(job) => format!("job {job}: {key}"),
        None => key,
    });
    let ids = queue.create_with_key(key, cmds).await?;
    Ok(if many {
        Answer::ok(json!({"jobIDs": ids}))
    } else {
        Answer::ok(json!({"jobID": ids.first()}))
    })
}

/// UpdateJob's change of tags: `addTags` and `removeTags`, JSON arrays;
/// `None` when neither is given.
fn tag_change(params: &Params<'_>, id: JobId) -> Result<Option<TagChange>, JobError> {
    let add = params.json_text("addTags");
    let remove = params.json_text("removeTags");
    if add.is_none() && remove.is_none() {
        return Ok(None);
    }
    let list = |param: &str, text: Option<String>| {
        text.map(|t| parse_tags(param, &t))
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok(Some(TagChange {
        id,
        add: list("addTags", add)?,
        remove: list("removeTags", remove)?,
    }))
}

/// UpdateJob's change of dependencies: `addDepends` and `removeDepends`,
/// JSON arrays of jobIDs; `None` when neither is given.
fn depends_change(params: &Params<'_>, id: JobId) -> Result<Option<ChangeDepends>, JobError> {
    let add = params.json_text("addDepends");
    let remove = params.json_text("removeDepends");
    if add.is_none() && remove.is_none() {
        return Ok(None);
    }
    let list = |param: &'static str, text: Option<String>| {
        text.map(|t| parse_depends(param, &t))
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok(Some(ChangeDepends {
        id,
        add: list("addDepends", add)?,
        remove: list("removeDepends", remove)?,
    }))
}

/// QueryJob's answer about `job` (see [`query_answer`]), with
/// `dependencies` and `dependents` when it has any.
fn query_answer_with(job: Job, labels: &Labels, dependencies: &DependencyView) -> Answer {
    let mut answer = query_answer(job, labels);
    if !dependencies.is_empty()
        && let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(&answer.body)
    {
        dependencies.add_to(&mut object);
        answer.body = Value::Object(object).to_string();
    }
    answer
}

/// QueryJob's answer about `job`: Bedrock's, plus `tags` when it has some
/// and `tracked` when it is.
pub(super) fn query_answer(job: Job, labels: &Labels) -> Answer {
    let Value::Object(mut out) = json!({
        "created": job.created.to_string(),
        "jobID": job.id,
        "state": job.state.as_str(),
        "name": job.name,
        "nextRun": job.next_run.to_string(),
        "lastRun": job.last_run.map(|t| t.to_string()).unwrap_or_default(),
        "repeat": job.repeat,
        "data": Value::Object(job.data),
        "retryAfter": job.retry_after,
        "priority": job.priority.value(),
    }) else {
        unreachable!("a JSON object literal")
    };
    add_bedrock_labels(&mut out, labels);
    Answer::ok(Value::Object(out))
}

/// A RetryJob `delay` in seconds. Digits too many for 64 bits read as the
/// largest delay, which the queue refuses as `402 Malformed delay` (more
/// than 8 digits) if it applies the delay at all.
fn parse_delay(text: &str) -> Result<i64, JobError> {
    let text = text.trim();
    let digits = text.strip_prefix('+').unwrap_or(text);
    match text.parse::<i64>() {
        Ok(delay) => Ok(delay),
        Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(i64::MAX),
        Err(_) => Err(JobError::NegativeDelay),
    }
}

/// CreateJob from parameters read by `text` (plain) and `json` (JSON-valued).
fn create_job(
    text: &dyn Fn(&str) -> Option<String>,
    json: &dyn Fn(&str) -> Option<String>,
) -> Result<CreateJob, JobError> {
    let name = text("name").unwrap_or_default();
    check_name(&name)?;
    let priority = text("jobPriority")
        .or_else(|| text("priority"))
        .map(|p| Priority::parse(&p))
        .transpose()?;
    let parent_id = match text("parentJobID") {
        Some(id) if id.trim() != "0" => Some(parse_job_id("parentJobID", &id)?),
        _ => None,
    };
    Ok(CreateJob {
        name,
        data: json("data")
            .map(|d| parse_data(&d))
            .transpose()?
            .unwrap_or_default(),
        first_run: text("firstRun")
            .map(|t| parse_time("firstRun", &t))
            .transpose()?,
        repeat: text("repeat").map(|r| Repeat::parse(&r)).transpose()?,
        priority,
        unique: text("unique")
            .map(|v| parse_flag("unique", &v))
            .transpose()?
            .unwrap_or(false),
        overwrite: text("overwrite")
            .map(|v| parse_flag("overwrite", &v))
            .transpose()?
            .unwrap_or(true),
        parent_id,
        retry_after: text("retryAfter")
            .map(|r| RetryAfter::parse(&r))
            .transpose()?,
        tags: json("tags")
            .map(|t| parse_tags("tags", &t))
            .transpose()?
            .unwrap_or_default(),
        depends: json("depends")
            .map(|d| parse_depends("depends", &d))
            .transpose()?
            .unwrap_or_default(),
    })
}

async fn get_jobs(
    queue: &Queue,
    request: &Request,
    params: &Params<'_>,
    many: bool,
    share: &AnswerShare,
) -> Result<Answer, JobError> {
    let name = params.text("name").unwrap_or_default();
    let pattern = NamePattern::parse(&name)?;
    let num_results = match (many, params.text("numResults")) {
        (true, Some(n)) => parse_num_results(&n)?,
        (true, None) => return Err(JobError::Missing("numResults")),
        (false, Some(_)) => return Err(JobError::NumResultsWithGetJob),
        (false, None) => 1,
    };
    let wait = request
        .header("connection")
        .filter(|c| c.eq_ignore_ascii_case("wait"))
        .map(|_| {
            params
                .text("timeout")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map_or(MAX_WAIT, |ms| Duration::from_millis(ms).min(MAX_WAIT))
        });
    let lease = lease_term(params)?;
    let cmd = GetJobs {
        pattern,
        num_results,
        priority: params.priority()?,
        lease,
        worker: None,
    };
    let handouts = queue.get_jobs(cmd, wait).await?;
    if handouts.is_empty() {
        return Err(JobError::NoJobFound);
    }
    let handouts = queue.within_budget(handouts, share).await?;
    // Only a client that asked for a lease sees its fields: a plain Bedrock
    // client gets Bedrock's answer, byte for byte.
    let object = |h: &HandOut| match lease {
        LeaseTerm::UntilReported => h.bedrock_json(),
        LeaseTerm::Millis(_) => h.leased_json(),
    };
    let body = if many {
        let jobs: Vec<Value> = handouts.iter().map(|h| Value::Object(object(h))).collect();
        json!({"jobs": jobs})
    } else {
        Value::Object(object(&handouts[0]))
    };
    Ok(Answer {
        status_line: "200 OK".into(),
        body: body.to_string(),
        handouts,
    })
}

/// The lease a GetJob(s) asks for: `leaseMs` milliseconds (within the HTTP
/// dequeue's bounds), or none, as Bedrock hands out.
fn lease_term(params: &Params<'_>) -> Result<LeaseTerm, JobError> {
    use crate::server::http::{MAX_LEASE_MS, MIN_LEASE_MS};
    match params.text("leaseMs") {
        None => Ok(LeaseTerm::UntilReported),
        Some(ms) => match ms.trim().parse::<u64>() {
            Ok(ms) if (MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms) => {
                Ok(LeaseTerm::Millis(ms as i64))
            }
            _ => Err(JobError::Malformed("leaseMs")),
        },
    }
}
