//! The dashboard's pages (GET only; nothing here changes the queue). Each
//! reads through the same queue calls as the JSON API and shapes what it
//! read for its template; with `?live=1` it answers its live part alone.

use std::collections::{BTreeMap, HashMap};

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Ui;
use super::render::Page;
use super::session::Session;
use crate::protocol::view::query_json;
use crate::protocol::{JobError, JobState, NamePattern, Priority, Timestamp, parse_job_id};
use crate::server::events::Minute;
use crate::server::http::listen::MAX_PAGE_BYTES;
use crate::server::ledger::StatsRow;
use crate::server::ledger::failure::{self, OUTPUT_KEPT_BYTES, head_and_tail};
use crate::server::queue::StatsDigest;
use crate::server::queue::reports::Period;
use crate::server::store::ListQuery;

/// Jobs on one page of the jobs list.
pub const JOBS_PER_PAGE: usize = 50;
/// Running jobs shown at most.
const RUNNING_SHOWN: usize = 200;
/// Names shown at most on the overview.
const NAMES_SHOWN: usize = 50;
/// Failure groups shown at most, and jobs shown per group.
const GROUPS_SHOWN: usize = 20;
const JOBS_PER_GROUP: usize = 10;

/// The query parameters the pages take (others are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PageParams {
    live: Option<String>,
    name: Option<String>,
    state: Option<String>,
    after: Option<String>,
    period: Option<String>,
    notice: Option<String>,
}

impl PageParams {
    fn live(&self) -> bool {
        self.live.as_deref() == Some("1")
    }
}

impl Ui {
    /// Renders `page` for `session`, or its live part.
    fn show(&self, page: Page, session: &Session, uri: &Uri, params: &PageParams) -> Response {
        let mut page = page;
        if let (Some(notice), Value::Object(map)) = (&params.notice, &mut page.data) {
            map.insert("notice".into(), json!(notice));
        }
        let own = own_url(uri);
        self.templates
            .page(page, &session.csrf(&self.token), &own, params.live())
    }

    /// An error page for a request that cannot be answered as asked.
    pub(super) fn refuse(&self, session: &Session, message: String, back: &str) -> Response {
        self.templates.error(
            StatusCode::BAD_REQUEST,
            &message,
            back,
            &session.csrf(&self.token),
        )
    }

    /// An error page for what the queue said.
    pub(super) fn fail(&self, session: &Session, error: JobError, back: &str) -> Response {
        let api = crate::server::http::ApiError::from(error);
        self.templates
            .error(api.status, &api.message, back, &session.csrf(&self.token))
    }
}

/// The page's URL without `live` and `notice`.
fn own_url(uri: &Uri) -> String {
    let kept: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("live=") && !p.starts_with("notice="))
        .collect();
    if kept.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{}", uri.path(), kept.join("&"))
    }
}

/// `GET /ui/login`: the login form (a valid session goes to the overview).
pub async fn login(State(ui): State<Ui>) -> Response {
    ui.templates.login(None)
}

/// A number of seconds for people: `350 ms`, `4.2 s`, `3.5 min`, `2.0 h`.
pub fn secs(value: Option<f64>) -> String {
    match value {
        None => "–".into(),
        Some(s) if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7200.0 => format!("{:.1} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

/// A job's progress in percent, from its data's `progress`: a number from
/// 0 to 100, or `{"done": N, "total": M}`.
pub fn progress(data: &Value) -> Option<f64> {
    let value = data.get("progress")?;
    let percent = match value {
        Value::Number(n) => n.as_f64()?,
        Value::Object(o) => {
            let done = o.get("done")?.as_f64()?;
            let total = o.get("total")?.as_f64()?;
            if total <= 0.0 {
                return None;
            }
            done * 100.0 / total
        }
        _ => return None,
    };
    percent
        .is_finite()
        .then(|| (percent.clamp(0.0, 100.0) * 10.0).round() / 10.0)
}

/// A percentage as shown: whole numbers without a fraction.
fn percent(value: Option<f64>) -> Value {
    match value {
        Some(p) if p.fract() == 0.0 => json!(p as i64),
        other => json!(other),
    }
}

/// Output as shown: what the server kept is already within
/// [`OUTPUT_KEPT_BYTES`], its head and tail; anything longer is cut the
/// same way.
fn shown_output(text: &str) -> String {
    head_and_tail(text, OUTPUT_KEPT_BYTES)
}

/// The heading of one stream of an attempt: its name, and when the server
/// kept less than the stream carried, that it shows the head and tail.
fn stream_label(stream: &str, kept: &str, total: Option<u64>) -> String {
    match total {
        Some(total) if total > kept.len() as u64 => {
            format!("{stream}: head and tail of {total} bytes")
        }
        _ => stream.to_string(),
    }
}

/// A chart's label for a point's time (`YYYY-MM-DD HH:MM:SS`).
fn label(time: &str, period: Period) -> String {
    match period {
        Period::Hour => time.get(11..16).unwrap_or(time).to_string(),
        Period::Day => time.get(5..10).unwrap_or(time).to_string(),
    }
}

/// Sums over names of a statistics answer, per point: the times, and per
/// figure its values.
#[derive(Debug, Default)]
struct Summed {
    times: Vec<String>,
    counts: BTreeMap<&'static str, Vec<u64>>,
    /// Total seconds and counts of waits and runs, per point.
    wait: Vec<(f64, u64)>,
    run: Vec<(f64, u64)>,
}

const FIGURES: [&str; 5] = ["added", "started", "finished", "failed", "retried"];

fn sum_series(stats: &Value) -> Summed {
    let mut summed = Summed::default();
    let series = stats["series"].as_array().cloned().unwrap_or_default();
    for serie in &series {
        let points = serie["points"].as_array().cloned().unwrap_or_default();
        if summed.times.is_empty() {
            summed.times = points
                .iter()
                .map(|p| p["time"].as_str().unwrap_or("").to_string())
                .collect();
            for figure in FIGURES {
                summed.counts.insert(figure, vec![0; points.len()]);
            }
            summed.wait = vec![(0.0, 0); points.len()];
            summed.run = vec![(0.0, 0); points.len()];
        }
        for (i, point) in points.iter().enumerate().take(summed.times.len()) {
            for figure in FIGURES {
                if let Some(values) = summed.counts.get_mut(figure) {
                    values[i] += point[figure].as_u64().unwrap_or(0);
                }
            }
            for (key, into) in [("wait", &mut summed.wait), ("run", &mut summed.run)] {
                let count = point[key]["count"].as_u64().unwrap_or(0);
                let mean = point[key]["mean"].as_f64().unwrap_or(0.0);
                into[i].0 += mean * count as f64;
                into[i].1 += count;
            }
        }
    }
    summed
}

/// A digest in the shape [`sum_series`] reads: one series, its points
/// summed over the names.
fn digest_json(digest: &StatsDigest) -> Value {
    let mut total = digest.total.to_json();
    if let Value::Object(map) = &mut total {
        map.remove("time");
    }
    json!({
        "from": digest.from.to_string(),
        "to": digest.to.to_string(),
        "series": [{"name": "*", "points": digest.points.iter().map(StatsRow::to_json).collect::<Vec<_>>()}],
        "total": total,
    })
}

fn mean(total: (f64, u64)) -> Option<f64> {
    (total.1 > 0).then(|| total.0 / total.1 as f64)
}

fn chart(kind: &str, labels: Vec<String>, datasets: Vec<Value>) -> Value {
    json!({"type": kind, "labels": labels, "datasets": datasets})
}

fn dataset(name: &str, data: Value) -> Value {
    json!({"label": name, "data": data})
}

/// The last hour's charts by minute (throughput and failures, mean wait),
/// from the counts this server keeps in memory.
fn last_hour_charts(minutes: &[Minute]) -> (Value, Value) {
    let labels: Vec<String> = minutes
        .iter()
        .map(|m| Timestamp(m.minute * 60_000).to_string())
        .map(|t| t.get(11..16).unwrap_or(&t).to_string())
        .collect();
    let counts = |count: fn(&Minute) -> u64| json!(minutes.iter().map(count).collect::<Vec<_>>());
    let throughput = chart(
        "line",
        labels.clone(),
        vec![
            dataset("finished", counts(|m| m.finished)),
            dataset("failed", counts(|m| m.failed)),
        ],
    );
    let waits: Vec<Option<f64>> = minutes
        .iter()
        .map(|m| m.mean_wait_secs().map(|s| (s * 1000.0).round() / 1000.0))
        .collect();
    let wait = chart("line", labels, vec![dataset("mean wait (s)", json!(waits))]);
    (throughput, wait)
}

/// `GET /ui`: counts per state and name, this hour's figures, the last
/// day's charts, supervisors online.
pub async fn overview(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let queue = &ui.queue;
    let window = match Period::Hour.window(None, None, queue.now()) {
        Ok(window) => window,
        Err(message) => return ui.refuse(&session, message, "/ui"),
    };
    let (stats, workers, (depth, counted)) = match tokio::try_join!(
        queue.stats_digest(None, Period::Hour, window, 0),
        queue.workers(),
        ui.depth.get(queue),
    ) {
        Ok(all) => all,
        Err(e) => return ui.fail(&session, e, "/ui"),
    };
    // Counts per state and per name.
    let mut per_state: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (name, state, count) in depth.iter() {
        let slot = JobState::ALL.iter().position(|s| s == state).unwrap_or(0);
        by_name
            .entry(name.as_str())
            .or_insert_with(|| vec![0; JobState::ALL.len()])[slot] += count;
        *per_state.entry(state.as_str()).or_default() += count;
    }
    let mut names: Vec<(String, Vec<u64>, u64)> = by_name
        .into_iter()
        .map(|(name, counts)| {
            let total = counts.iter().sum();
            (name.to_string(), counts, total)
        })
        .collect();
    names.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let names_cut = names.len() > NAMES_SHOWN;
    names.truncate(NAMES_SHOWN);
    let states: Vec<Value> = JobState::ALL
        .iter()
        .map(|s| json!({"state": s.as_str(), "count": per_state.get(s.as_str()).copied().unwrap_or(0)}))
        .collect();
    let summed = sum_series(&digest_json(&stats));
    let last = summed.times.len().saturating_sub(1);
    let figure = |name: &str| {
        summed
            .counts
            .get(name)
            .and_then(|v| v.get(last))
            .copied()
            .unwrap_or(0)
    };
    let hour = json!({
        "since": summed.times.get(last).and_then(|t| t.get(11..16)).unwrap_or(""),
        "finished": figure("finished"),
        "failed": figure("failed"),
        "retried": figure("retried"),
        "added": figure("added"),
        "wait": secs(summed.wait.get(last).copied().and_then(mean)),
        "run": secs(summed.run.get(last).copied().and_then(mean)),
    });
    let labels: Vec<String> = summed
        .times
        .iter()
        .map(|t| label(t, Period::Hour))
        .collect();
    let series = |name: &str| json!(summed.counts.get(name).cloned().unwrap_or_default());
    let throughput = chart(
        "line",
        labels.clone(),
        vec![
            dataset("finished", series("finished")),
            dataset("failed", series("failed")),
            dataset("added", series("added")),
        ],
    );
    let seconds = |v: &Vec<(f64, u64)>| json!(v.iter().map(|p| mean(*p)).collect::<Vec<_>>());
    let waits = chart(
        "line",
        labels,
        vec![
            dataset("mean wait (s)", seconds(&summed.wait)),
            dataset("mean run (s)", seconds(&summed.run)),
        ],
    );
    let (minute_throughput, minute_wait) = last_hour_charts(&queue.last_hour());
    let online = workers.iter().filter(|w| !w.gone).count();
    let data = json!({
        "states": states,
        "state_names": JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "names": names.iter().map(|(name, counts, _)| json!({"name": name, "counts": counts})).collect::<Vec<_>>(),
        "names_cut": names_cut,
        "hour": hour,
        "throughput_chart": throughput,
        "wait_chart": waits,
        "minute_throughput_chart": minute_throughput,
        "minute_wait_chart": minute_wait,
        "supervisors_online": online,
        "counted": counted.to_string().get(11..19).unwrap_or_default(),
    });
    let page = Page {
        template: "overview",
        section: "overview",
        title: "Overview".into(),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// `GET /ui/jobs?name=GLOB&state=STATE&after=ID`: a page of jobs in id
/// order.
pub async fn jobs(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let name = params.name.clone().unwrap_or_default();
    let state_text = params.state.clone().unwrap_or_default();
    let pattern = match Some(name.trim())
        .filter(|n| !n.is_empty())
        .map(NamePattern::parse)
    {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return ui.fail(&session, e, "/ui/jobs"),
    };
    let state = match Some(state_text.as_str()).filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => match text.parse::<JobState>() {
            Ok(state) => Some(state),
            Err(_) => {
                return ui.refuse(
                    &session,
                    format!("no state {text:?}; pick one from the list"),
                    "/ui/jobs",
                );
            }
        },
    };
    let after = match params.after.as_deref().filter(|a| !a.is_empty()) {
        None => None,
        Some(text) => match parse_job_id("after", text) {
            Ok(id) => Some(id),
            Err(e) => return ui.fail(&session, e, "/ui/jobs"),
        },
    };
    let query = ListQuery {
        pattern,
        state,
        tag: None,
        after_id: after,
        limit: JOBS_PER_PAGE,
        max_bytes: MAX_PAGE_BYTES,
    };
    let page = match ui.queue.list(query).await {
        Ok(page) => page,
        Err(e) => return ui.fail(&session, e, "/ui/jobs"),
    };
    let filter_query =
        serde_urlencoded::to_string([("name", &name), ("state", &state_text)]).unwrap_or_default();
    let next_url = (page.cut || page.jobs.len() == JOBS_PER_PAGE)
        .then(|| page.jobs.last())
        .flatten()
        .map(|last| format!("/ui/jobs?{filter_query}&after={}", last.id));
    let jobs: Vec<Value> = page
        .jobs
        .iter()
        .map(|job| {
            json!({
                "id": job.id,
                "name": job.name,
                "state": job.state.as_str(),
                "priority": job.priority.value(),
                "next_run": job.next_run.to_string(),
                "attempts": job.attempts,
            })
        })
        .collect();
    let data = json!({
        "jobs": jobs,
        "filter": {"name": name, "state": state_text},
        "state_names": JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "after": after,
        "first_url": format!("/ui/jobs?{filter_query}"),
        "next_url": next_url,
    });
    let page = Page {
        template: "jobs",
        section: "jobs",
        title: "Jobs".into(),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// `GET /ui/jobs/{id}`: a job, its progress and its attempts.
pub async fn job(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let id = match parse_job_id("jobID", &id) {
        Ok(id) => id,
        Err(e) => return ui.fail(&session, e, "/ui/jobs"),
    };
    let history = match ui.queue.history(id, 0, 100).await {
        Ok(history) => history,
        Err(e) => return ui.fail(&session, e, "/ui/jobs"),
    };
    let (job, data, priority, next_run) = match (&history.job, &history.archived) {
        (Some(job), _) => {
            let data = Value::Object(job.data.clone());
            let shown = query_json(job);
            (
                json!({
                    "name": job.name,
                    "state": job.state.as_str(),
                    "repeat": job.repeat,
                    "next_run": shown["nextRun"],
                    "priority": job.priority.value(),
                    "created": shown["created"],
                }),
                data,
                Some(job.priority.value()),
                Some(job.next_run.to_string()),
            )
        }
        (None, Some(archived)) => {
            let shown = archived.to_json();
            (
                json!({
                    "name": shown["name"],
                    "state": shown["state"],
                    "created": shown["created"],
                    "ended": shown["ended"],
                }),
                shown["data"].clone(),
                None,
                None,
            )
        }
        (None, None) => (
            json!({"name": "(deleted)", "state": "DELETED", "created": ""}),
            json!({}),
            None,
            None,
        ),
    };
    let attempts: Vec<Value> = history
        .attempts
        .iter()
        .rev()
        .map(|a| {
            let end = a.end.as_ref();
            let exit = match end {
                Some(e) if e.signal.is_some() => {
                    format!("signal {}", e.signal.as_deref().unwrap_or(""))
                }
                Some(e) if e.exit_code.is_some() => format!("exit {}", e.exit_code.unwrap_or(0)),
                _ => String::new(),
            };
            let mut outcome = match end {
                None => "running".to_string(),
                Some(e) => match &e.failure {
                    Some(group) => format!("{} ({group})", e.outcome),
                    None => e.outcome.clone(),
                },
            };
            // A streak of hand-backs for want of the worker: how many.
            if let Some(times) = end.map(|e| e.hand_backs).filter(|&n| n > 0) {
                outcome.push_str(&format!(" ×{times}"));
            }
            json!({
                "attempt": a.attempt,
                "worker": a.worker.as_deref().unwrap_or(""),
                "started": a.started.to_string(),
                "ended": a.ended.map(|t| t.to_string()).unwrap_or_default(),
                "outcome": outcome,
                "exit": exit,
                "stdout": end.and_then(|e| e.stdout.as_deref()).map(shown_output),
                "stderr": end.and_then(|e| e.stderr.as_deref()).map(shown_output),
                "stdout_label": end.map(|e| {
                    stream_label("stdout", e.stdout.as_deref().unwrap_or(""), e.stdout_bytes)
                }),
                "stderr_label": end.map(|e| {
                    stream_label("stderr", e.stderr.as_deref().unwrap_or(""), e.stderr_bytes)
                }),
            })
        })
        .collect();
    let data = json!({
        "id": id,
        "job": job,
        "data": serde_json::to_string_pretty(&data).unwrap_or_default(),
        "progress": percent(progress(&data)),
        "attempts": attempts,
        "attempts_total": history.attempts_total,
        "actions": history.job.is_some(),
        // Not while a worker holds it: queued again, it would run twice.
        "retryable": history
            .job
            .as_ref()
            .is_some_and(|j| !j.is_held_at(ui.queue.now())),
        // Bedrock cancels child jobs only.
        "cancellable": history.job.as_ref().is_some_and(|j| j.is_child()),
        "priority": priority,
        "priorities": Priority::ALL,
        "next_run": next_run,
    });
    let page = Page {
        template: "job",
        section: "jobs",
        title: format!("Job {id}"),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// `GET /ui/running`: each running job's supervisor, elapsed time and
/// progress.
pub async fn running(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let query = ListQuery {
        pattern: None,
        state: Some(JobState::Running),
        tag: None,
        after_id: None,
        limit: RUNNING_SHOWN,
        max_bytes: MAX_PAGE_BYTES,
    };
    let (page, workers) = match tokio::try_join!(ui.queue.list(query), ui.queue.workers()) {
        Ok(both) => both,
        Err(e) => return ui.fail(&session, e, "/ui"),
    };
    let holders: HashMap<i64, (&str, u32)> = workers
        .iter()
        .flat_map(|w| {
            w.jobs
                .iter()
                .map(move |id| (*id, (w.info.id.as_str(), w.info.pid)))
        })
        .collect();
    let now = ui.queue.now();
    let jobs: Vec<Value> = page
        .jobs
        .iter()
        .map(|job| {
            let holder = holders.get(&job.id);
            let elapsed = job
                .last_run
                .map(|t| secs(Some((now.0 - t.0).max(0) as f64 / 1000.0)))
                .unwrap_or_default();
            json!({
                "id": job.id,
                "name": job.name,
                "worker": holder.map_or("", |h| h.0),
                "pid": holder.map(|h| h.1),
                "elapsed": elapsed,
                "progress": percent(progress(&Value::Object(job.data.clone()))),
            })
        })
        .collect();
    let data = json!({"jobs": jobs, "cut": page.cut || page.jobs.len() == RUNNING_SHOWN});
    let page = Page {
        template: "running",
        section: "running",
        title: "Running now".into(),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// `GET /ui/failures`: each failure group with its count, latest output
/// and first jobs.
pub async fn failures(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let groups = match ui.queue.failure_groups().await {
        Ok(groups) => groups,
        Err(e) => return ui.fail(&session, e, "/ui"),
    };
    let mut shown = Vec::new();
    for group in groups.iter().take(GROUPS_SHOWN) {
        let (jobs, _) = match ui
            .queue
            .failed_jobs(group.group.clone(), JOBS_PER_GROUP, MAX_PAGE_BYTES)
            .await
        {
            Ok(jobs) => jobs,
            Err(e) => return ui.fail(&session, e, "/ui"),
        };
        // The error and output of the group's latest failure (whether or
        // not it is among the first jobs shown).
        let latest = match ui.queue.latest_failed(group.group.clone()).await {
            Ok(latest) => latest,
            Err(e) => return ui.fail(&session, e, "/ui"),
        };
        let (mut error, mut output, mut latest_id) = (None, None, None);
        if let Some((job, attempt)) = latest {
            error = failure::error_line(&job.data, attempt.as_ref());
            latest_id = Some(job.id);
            output = attempt
                .as_ref()
                .and_then(|a| a.end.as_ref())
                .and_then(|end| {
                    end.stderr
                        .as_deref()
                        .filter(|s| !s.is_empty())
                        .or(end.stdout.as_deref())
                })
                .map(shown_output);
        }
        let jobs: Vec<Value> = jobs
            .iter()
            .map(|(job, line)| json!({"id": job.id, "name": job.name, "error": line}))
            .collect();
        shown.push(json!({
            "group": group.group,
            "count": group.count,
            "first": group.first.to_string(),
            "last": group.last.to_string(),
            "error": error,
            "latest_id": latest_id,
            "tail": output,
            "jobs": jobs,
        }));
    }
    let page = Page {
        template: "failures",
        section: "failures",
        title: "Failures".into(),
        data: json!({"groups": shown}),
    };
    ui.show(page, &session, &uri, &params)
}

/// `GET /ui/supervisors`: the registry and each supervisor's utilisation
/// per hour over the last day.
pub async fn supervisors(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let queue = &ui.queue;
    let window = match Period::Hour.window(None, None, queue.now()) {
        Ok(window) => window,
        Err(message) => return ui.refuse(&session, message, "/ui"),
    };
    let (workers, stats) = match tokio::try_join!(
        queue.workers(),
        queue.worker_stats(None, Period::Hour, window)
    ) {
        Ok(both) => both,
        Err(e) => return ui.fail(&session, e, "/ui"),
    };
    let now = queue.now();
    let rows: Vec<Value> = workers
        .iter()
        .map(|w| {
            json!({
                "id": w.info.id,
                "state": if w.gone { "gone" } else { "online" },
                "last_seen": format!("{} ({} ago)", w.last_seen, secs(Some((now.0 - w.last_seen.0).max(0) as f64 / 1000.0))),
                "capacity": w.info.capacity,
                "running": w.info.running,
                "frozen": w.info.frozen,
                "load": w.info.load.map(|l| format!("{l:.2}")).unwrap_or_default(),
                "utilisation": w.utilisation.map(|u| format!("{:.0}%", u * 100.0)).unwrap_or_default(),
            })
        })
        .collect();
    let mut labels = Vec::new();
    let mut datasets = Vec::new();
    for serie in stats["series"].as_array().into_iter().flatten() {
        let points = serie["points"].as_array().cloned().unwrap_or_default();
        if labels.is_empty() {
            labels = points
                .iter()
                .map(|p| label(p["time"].as_str().unwrap_or(""), Period::Hour))
                .collect();
        }
        let values: Vec<Option<f64>> = points
            .iter()
            .map(|p| {
                p["utilisation"]
                    .as_f64()
                    .map(|u| (u * 1000.0).round() / 10.0)
            })
            .collect();
        datasets.push(dataset(
            &format!("{} (%)", serie["worker"].as_str().unwrap_or("")),
            json!(values),
        ));
    }
    let data = json!({
        "workers": rows,
        "utilisation_chart": chart("line", labels, datasets),
    });
    let page = Page {
        template: "supervisors",
        section: "supervisors",
        title: "Supervisors".into(),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// A percentile read from a histogram (`[{from, to, count}]`, seconds):
/// the upper bound of the bucket it falls in.
pub fn percentile(histogram: &Value, fraction: f64) -> Option<f64> {
    let buckets = histogram.as_array()?;
    let total: u64 = buckets
        .iter()
        .map(|b| b["count"].as_u64().unwrap_or(0))
        .sum();
    if total == 0 {
        return None;
    }
    let rank = (fraction * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for bucket in buckets {
        seen += bucket["count"].as_u64().unwrap_or(0);
        if seen >= rank {
            return bucket["to"].as_f64().or_else(|| bucket["from"].as_f64());
        }
    }
    None
}

fn histogram_chart(histogram: &Value, name: &str) -> Value {
    let buckets = histogram.as_array().cloned().unwrap_or_default();
    let labels: Vec<String> = buckets
        .iter()
        .map(|b| {
            let to = b["to"].as_f64();
            match to {
                Some(to) => format!("≤{}", secs(Some(to))),
                None => format!(">{}", secs(b["from"].as_f64())),
            }
        })
        .collect();
    let counts: Vec<u64> = buckets
        .iter()
        .map(|b| b["count"].as_u64().unwrap_or(0))
        .collect();
    chart("bar", labels, vec![dataset(name, json!(counts))])
}

/// `GET /ui/stats?name=GLOB&period=hour|day`: histograms, percentiles and
/// throughput.
pub async fn stats(
    State(ui): State<Ui>,
    Extension(session): Extension<Session>,
    uri: Uri,
    Query(params): Query<PageParams>,
) -> Response {
    let name = params.name.clone().unwrap_or_default();
    let period = match params.period.as_deref().filter(|p| !p.is_empty()) {
        None => Period::Hour,
        Some(text) => match Period::parse(text) {
            Some(p) => p,
            None => {
                return ui.refuse(
                    &session,
                    format!("period must be hour or day, not {text:?}"),
                    "/ui/stats",
                );
            }
        },
    };
    let pattern = match Some(name.trim())
        .filter(|n| !n.is_empty())
        .map(NamePattern::parse)
    {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return ui.fail(&session, e, "/ui/stats"),
    };
    let window = match period.window(None, None, ui.queue.now()) {
        Ok(window) => window,
        Err(message) => return ui.refuse(&session, message, "/ui/stats"),
    };
    let digest = match ui
        .queue
        .stats_digest(pattern, period, window, NAMES_SHOWN)
        .await
    {
        Ok(digest) => digest,
        Err(e) => return ui.fail(&session, e, "/ui/stats"),
    };
    let stats = digest_json(&digest);
    let period_name = if period == Period::Hour {
        "hour"
    } else {
        "day"
    };
    let total = &stats["total"];
    let percentiles: Vec<Value> = [("Wait", "wait"), ("Run", "run")]
        .iter()
        .map(|(label, key)| {
            let figure = &total[key];
            let histogram = &figure["histogram"];
            // A bucket's bound may lie past the largest sample.
            let (low, high) = (
                figure["min"].as_f64().unwrap_or(0.0),
                figure["max"].as_f64().unwrap_or(f64::MAX),
            );
            let at = |fraction| {
                percentile(histogram, fraction).map(|p: f64| p.clamp(low, high.max(low)))
            };
            json!({
                "label": label,
                "count": figure["count"].as_u64().unwrap_or(0),
                "mean": secs(figure["mean"].as_f64()),
                "p50": secs(at(0.5)),
                "p90": secs(at(0.9)),
                "p99": secs(at(0.99)),
                "max": secs(figure["max"].as_f64()),
            })
        })
        .collect();
    let summed = sum_series(&stats);
    let labels: Vec<String> = summed.times.iter().map(|t| label(t, period)).collect();
    let series = |name: &str| json!(summed.counts.get(name).cloned().unwrap_or_default());
    let throughput = chart(
        "line",
        labels,
        vec![
            dataset("finished", series("finished")),
            dataset("failed", series("failed")),
            dataset("retried", series("retried")),
        ],
    );
    let names: Vec<Value> = digest
        .names
        .iter()
        .map(|row| {
            json!({
                "name": row.name,
                "added": row.added,
                "finished": row.finished,
                "failed": row.failed,
                "retried": row.retried,
                "wait": secs((row.wait.count > 0).then_some(row.wait.mean / 1000.0)),
                "run": secs((row.run.count > 0).then_some(row.run.mean / 1000.0)),
            })
        })
        .collect();
    let data = json!({
        "filter": {"name": name, "period": period_name},
        "period": period_name,
        "from": stats["from"],
        "to": stats["to"],
        "percentiles": percentiles,
        "throughput_chart": throughput,
        "wait_histogram": histogram_chart(&total["wait"]["histogram"], "waits"),
        "run_histogram": histogram_chart(&total["run"]["histogram"], "runs"),
        "names": names,
        "name_count": digest.name_count,
    });
    let page = Page {
        template: "stats",
        section: "stats",
        title: "Statistics".into(),
        data,
    };
    ui.show(page, &session, &uri, &params)
}

/// The time a form gave, `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn form_time(text: &str) -> Result<Timestamp, JobError> {
    crate::protocol::parse_time("nextRun", text.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_a_percentage_or_done_over_total() {
        assert_eq!(progress(&json!({"progress": 42})), Some(42.0));
        assert_eq!(progress(&json!({"progress": 150})), Some(100.0));
        assert_eq!(
            progress(&json!({"progress": {"done": 1, "total": 4}})),
            Some(25.0)
        );
        assert_eq!(
            progress(&json!({"progress": {"done": 1, "total": 0}})),
            None
        );
        assert_eq!(progress(&json!({"progress": "half"})), None);
        assert_eq!(progress(&json!({})), None);
    }

    #[test]
    fn percentiles_are_bucket_upper_bounds() {
        let histogram = json!([
            {"from": 0, "to": 1, "count": 50},
            {"from": 1, "to": 2, "count": 40},
            {"from": 2, "to": 3, "count": 9},
            {"from": 60, "to": null, "count": 1},
        ]);
        assert_eq!(percentile(&histogram, 0.5), Some(1.0));
        assert_eq!(percentile(&histogram, 0.9), Some(2.0));
        assert_eq!(percentile(&histogram, 0.99), Some(3.0));
        assert_eq!(percentile(&histogram, 1.0), Some(60.0));
        assert_eq!(percentile(&json!([]), 0.5), None);
    }

    #[test]
    fn own_url_drops_live_and_notice() {
        let uri: Uri = "/ui/jobs?name=a&live=1&notice=x&state=FAILED"
            .parse()
            .unwrap();
        assert_eq!(own_url(&uri), "/ui/jobs?name=a&state=FAILED");
        let uri: Uri = "/ui?live=1".parse().unwrap();
        assert_eq!(own_url(&uri), "/ui");
    }
}
