//! [`JobSource`] over the HTTP/JSON API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::report_batch::{MAX_WAIT, ReportBatch, Sent, Turn, answer_within};
use super::riders::{RIDE_WAIT, Riders};
use super::source::{
    JobSource, LeasedJob, Report, SourceError, hand_back_by_retry, read_handouts, refuse_unreadable,
};
use super::{ClientError, HttpClient};
use crate::future::BoxFuture;
use crate::protocol::{CreateJob, Data, JobId, RunFacts, WorkerInfo};

/// A job server reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpSource {
    client: HttpClient,
    /// Set once the server refused the `worker` and `run` fields (a server
    /// older than this supervisor, during a rolling upgrade): from then on
    /// they are not sent.
    older_server: Arc<AtomicBool>,
    /// Set once the server refused the output sizes in `run` (a server that
    /// keeps run history but not the sizes): from then on they are left out.
    no_output_sizes: Arc<AtomicBool>,
    /// Set once the server refused a supervisor's count of frozen jobs (a
    /// server that keeps a worker registry, but not that): from then on it
    /// is left out.
    no_frozen: Arc<AtomicBool>,
    /// Reports sent together under load.
    batch: ReportBatch,
    /// Reports that go with the next fetch.
    riders: Riders,
}

/// Whether the server refused a request for carrying `field`, which an older
/// server does not know.
fn refused_field(error: &ClientError, field: &str) -> bool {
    matches!(error, ClientError::Api { status: 400, message, .. }
        if message.contains(&format!("unknown field `{field}`")))
}

impl HttpSource {
    /// A source at `url` (`http://HOST:PORT`), with an optional bearer token.
    pub fn new(url: &str, token: Option<crate::auth::ApiToken>) -> Result<Self, ClientError> {
        Self::trusting(url, token, None)
    }

    /// A source at `url` that also trusts the CA certificate in the PEM
    /// file `ca_cert` (for `https://` URLs).
    pub fn trusting(
        url: &str,
        token: Option<crate::auth::ApiToken>,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Self, ClientError> {
        Ok(HttpSource {
            client: HttpClient::trusting(url, token, ca_cert)?,
            older_server: Arc::new(AtomicBool::new(false)),
            no_output_sizes: Arc::new(AtomicBool::new(false)),
            no_frozen: Arc::new(AtomicBool::new(false)),
            batch: ReportBatch::default(),
            riders: Riders::default(),
        })
    }

    /// Says `hint` with a refusal for a missing or wrong token.
    pub fn with_hint(mut self, hint: String) -> Self {
        self.client = self.client.with_hint(hint);
        self
    }
}

/// Whether the server cannot hand a job back exactly: it has no such route
/// (it is older than this supervisor), or kept no copy of the job from
/// before the hand-out.
fn cannot_hand_back(error: &ClientError) -> bool {
    matches!(
        error.code(),
        Some("no_such_route" | "method_not_allowed" | "hand_out_not_kept")
    )
}

fn source_error(error: ClientError) -> SourceError {
    match error {
        ClientError::Transport { .. }
        | ClientError::BadUrl(_)
        | ClientError::BadList { .. }
        | ClientError::CaCert { .. } => SourceError::Unavailable(error.to_string()),
        ClientError::Api { ref code, .. } if code == "lease_lost" => SourceError::LeaseLost(0),
        // A server too busy or too slow for it now (its own 5xx, or a
        // proxy's 408 or 429): the report is spooled and sent again.
        ClientError::Api { status, .. } if status >= 500 || status == 408 || status == 429 => {
            SourceError::Unavailable(error.to_string())
        }
        ClientError::Api { status: 404, .. } => SourceError::NotFound(error.to_string()),
        ClientError::Api { .. } => SourceError::Refused(error.to_string()),
    }
}

/// A report's body for its own endpoint, without run facts.
fn report_body(lease: Option<&str>, report: &Report) -> serde_json::Map<String, Value> {
    let mut body = serde_json::Map::new();
    if let Some(lease) = lease {
        body.insert("lease".into(), json!(lease));
    }
    let data = match report {
        Report::Finish { data } | Report::Fail { data } => data,
        Report::Retry {
            delay_secs,
            ignore_repeat,
            data,
            name,
            next_run,
        } => {
            body.insert("delay".into(), json!(delay_secs));
            if *ignore_repeat {
                body.insert("ignoreRepeat".into(), json!(true));
            }
            if let Some(name) = name {
                body.insert("name".into(), json!(name));
            }
            if let Some(next_run) = next_run {
                body.insert("nextRun".into(), json!(next_run));
            }
            data
        }
    };
    if let Some(data) = data {
        body.insert("data".into(), Value::Object(data.clone()));
    }
    body
}

/// What the server's answer to job `id`'s report means.
/// Counts a report the server answered (taken, or refused with a reason:
/// not one that never reached it, which is sent again) by the `way` it
/// went.
fn counted(way: &'static str, sent: Result<Value, ClientError>) -> Result<Value, ClientError> {
    if matches!(sent, Ok(_) | Err(ClientError::Api { .. })) {
        crate::metrics::report_sent(way);
    }
    sent
}

fn reported(id: JobId, sent: Result<Value, ClientError>) -> Result<(), SourceError> {
    match sent {
        Ok(_) => Ok(()),
        Err(error) => Err(match source_error(error) {
            SourceError::LeaseLost(_) => SourceError::LeaseLost(id),
            other => other,
        }),
    }
}

impl HttpSource {
    /// The run facts a report carries to this server: none to a server
    /// older than run history, without the output sizes to one that keeps
    /// history but not them.
    fn run_facts(&self, run: Option<&RunFacts>) -> Option<RunFacts> {
        let mut run = run
            .filter(|_| !self.older_server.load(Ordering::Relaxed))?
            .clone();
        if self.no_output_sizes.load(Ordering::Relaxed) {
            (run.stdout_bytes, run.stderr_bytes) = (None, None);
        }
        Some(run)
    }

    /// A report's `body` with the run facts this server takes, as a batch
    /// or a fetch carries it.
    fn with_run(
        &self,
        mut body: serde_json::Map<String, Value>,
        run: Option<&RunFacts>,
    ) -> serde_json::Map<String, Value> {
        if let Some(run) = self.run_facts(run) {
            body.insert("run".into(), json!(run));
        }
        body
    }

    /// Sends a report to its own endpoint, `/jobs/{id}/{kind}`, with the
    /// run facts this server takes (learning, from a refusal, which those
    /// are).
    async fn report_alone(
        &self,
        id: JobId,
        kind: &str,
        plain: serde_json::Map<String, Value>,
        run: Option<&RunFacts>,
    ) -> Result<Value, ClientError> {
        let path = format!("/jobs/{id}/{kind}");
        let Some(mut run) = self.run_facts(run) else {
            return self
                .client
                .quick(Method::POST, &path, Some(&Value::Object(plain)))
                .await;
        };
        let mut body = plain.clone();
        body.insert("run".into(), json!(run));
        let mut sent = self
            .client
            .quick(Method::POST, &path, Some(&Value::Object(body.clone())))
            .await;
        if let Err(error) = &sent
            && (refused_field(error, "stdoutBytes") || refused_field(error, "stderrBytes"))
        {
            // A server that keeps run history, without the sizes.
            self.no_output_sizes.store(true, Ordering::Relaxed);
            (run.stdout_bytes, run.stderr_bytes) = (None, None);
            body.insert("run".into(), json!(run));
            sent = self
                .client
                .quick(Method::POST, &path, Some(&Value::Object(body)))
                .await;
        }
        match sent {
            Err(error) if refused_field(&error, "run") => {
                // Never lose a report to a field the server does not know.
                self.older_server.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "the job server keeps no run history (it is older than this supervisor); reporting without it"
                );
                self.client
                    .quick(Method::POST, &path, Some(&Value::Object(plain)))
                    .await
            }
            other => other,
        }
    }

    async fn dequeue(
        &self,
        pattern: &str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: Option<&WorkerInfo>,
    ) -> Result<Vec<LeasedJob>, SourceError> {
        let mut body = json!({
            "name": pattern,
            "numResults": count.max(1),
            "waitMs": wait.as_millis() as u64,
            "leaseMs": lease.as_millis() as u64,
        });
        let mut riders = self.riders.take();
        let reports = riders.reports();
        // A dequeue with reports does not wait: its answer comes as soon as
        // any other request's would.
        let timeout = match &reports {
            Some(_) => Duration::from_secs(60),
            None => wait + Duration::from_secs(30),
        };
        if let Some(reports) = &reports {
            body["reports"] = reports.clone();
        }
        let mut sent = self.send_dequeue(&body, worker, timeout).await;
        if reports.is_some() {
            match &sent {
                Ok(answer) => riders.answered(answer),
                Err(error) if refused_field(error, "reports") => {
                    riders.failed(true);
                    tracing::info!(
                        "the job server takes no reports with a fetch (it is older than this supervisor); each report goes by itself"
                    );
                    // The fetch itself again, without them.
                    if let Some(fields) = body.as_object_mut() {
                        fields.remove("reports");
                    }
                    let timeout = wait + Duration::from_secs(30);
                    sent = self.send_dequeue(&body, worker, timeout).await;
                }
                // The fetch fails as a fetch; its reports go by themselves.
                Err(_) => riders.failed(false),
            }
        }
        // Whether the next fetch follows at once (a backlog) is known
        // before this one's turn ends.
        let brought = sent
            .as_ref()
            .ok()
            .and_then(|answer| answer["jobs"].as_array())
            .map_or(0, Vec::len);
        let asked = count.clamp(1, crate::protocol::MAX_NUM_RESULTS);
        self.riders.heard_fetch(brought >= asked);
        drop(riders);
        let mut answer = sent.map_err(source_error)?;
        let Value::Array(handouts) = answer["jobs"].take() else {
            return Err(SourceError::Protocol(format!(
                "dequeue answer without jobs: {answer}"
            )));
        };
        let (jobs, unreadable) = read_handouts(handouts);
        refuse_unreadable(self, unreadable).await;
        Ok(jobs)
    }

    /// A supervisor's identity as this server takes it: without its count
    /// of frozen jobs where the server refused that.
    fn worker_json(&self, worker: &WorkerInfo) -> Value {
        if self.no_frozen.load(Ordering::Relaxed) && worker.frozen > 0 {
            return json!(WorkerInfo {
                frozen: 0,
                ..worker.clone()
            });
        }
        json!(worker)
    }

    /// Whether `error` is the server's refusal of the count of frozen jobs
    /// (a server older than it); if so, it is not sent again.
    fn refused_frozen(&self, error: &ClientError) -> bool {
        let refused = refused_field(error, "frozen");
        if refused && !self.no_frozen.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "the job server's worker registry does not take a count of frozen jobs (it is older than this supervisor); leaving it out"
            );
        }
        refused
    }

    /// Sends a dequeue's `body`, saying which supervisor asks where the
    /// server keeps a worker registry.
    async fn send_dequeue(
        &self,
        body: &Value,
        worker: Option<&WorkerInfo>,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        match worker.filter(|_| !self.older_server.load(Ordering::Relaxed)) {
            Some(worker) => {
                let mut with_worker = body.clone();
                with_worker["worker"] = self.worker_json(worker);
                let mut sent = self
                    .client
                    .call(Method::POST, "/dequeue", Some(&with_worker), timeout)
                    .await;
                if let Err(error) = &sent
                    && self.refused_frozen(error)
                {
                    with_worker["worker"] = self.worker_json(worker);
                    sent = self
                        .client
                        .call(Method::POST, "/dequeue", Some(&with_worker), timeout)
                        .await;
                }
                match sent {
                    Err(error) if refused_field(&error, "worker") => {
                        self.older_server.store(true, Ordering::Relaxed);
                        tracing::warn!(
                            "the job server does not keep a worker registry (it is older than this supervisor); not identifying to it"
                        );
                        self.client
                            .call(Method::POST, "/dequeue", Some(body), timeout)
                            .await
                    }
                    other => other,
                }
            }
            None => {
                self.client
                    .call(Method::POST, "/dequeue", Some(body), timeout)
                    .await
            }
        }
    }
}

impl JobSource for HttpSource {
    fn get_jobs<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.dequeue(pattern, count, wait, lease, None))
    }

    fn get_jobs_as<'a>(
        &'a self,
        pattern: &'a str,
        count: usize,
        wait: Duration,
        lease: Duration,
        worker: &'a WorkerInfo,
    ) -> BoxFuture<'a, Result<Vec<LeasedJob>, SourceError>> {
        Box::pin(self.dequeue(pattern, count, wait, lease, Some(worker)))
    }

    fn announce<'a>(&'a self, worker: &'a WorkerInfo) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            if self.older_server.load(Ordering::Relaxed) {
                return Ok(());
            }
            let mut sent = self
                .client
                .quick(
                    Method::POST,
                    "/workers",
                    Some(&json!({ "worker": self.worker_json(worker) })),
                )
                .await;
            if let Err(error) = &sent
                && self.refused_frozen(error)
            {
                let body = json!({ "worker": self.worker_json(worker) });
                sent = self
                    .client
                    .quick(Method::POST, "/workers", Some(&body))
                    .await;
            }
            sent.map_err(source_error)?;
            Ok(())
        })
    }

    fn heartbeat<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return Ok(());
            };
            let path = format!("/jobs/{}/heartbeat", job.id);
            match self
                .client
                .quick(Method::POST, &path, Some(&json!({"lease": lease})))
                .await
            {
                Ok(_) => Ok(()),
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(job.id),
                    other => other,
                }),
            }
        })
    }

    fn update<'a>(
        &'a self,
        job: &'a LeasedJob,
        data: &'a Data,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let path = format!("/jobs/{}", job.id);
            let mut body = json!({"data": data});
            if let Some(lease) = &job.lease {
                body["lease"] = json!(lease);
            }
            match self.client.quick(Method::PATCH, &path, Some(&body)).await {
                Ok(_) => Ok(()),
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(job.id),
                    other => other,
                }),
            }
        })
    }

    fn report<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        self.report_run(id, lease, report, None)
    }

    fn report_run<'a>(
        &'a self,
        id: JobId,
        lease: Option<&'a str>,
        report: &'a Report,
        run: Option<&'a RunFacts>,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            // Offered to the next fetch (see `riders`): its answer, unless
            // no fetch took it in time.
            if let Some(answer) = self.riders.answer_of(id) {
                let answered = answer_within(answer, RIDE_WAIT, || self.riders.leave(id)).await;
                if let Some(Sent::Answered(sent)) = answered {
                    return reported(id, counted("fetch", sent));
                }
            }
            let plain = report_body(lease, report);
            // Under load, with the reports that come while one is on its
            // way (see `report_batch`); by itself otherwise.
            let mut _lead = None;
            if self.batch.on() {
                let body = self.with_run(plain.clone(), run);
                match self.batch.turn(&self.client, id, report.kind(), body) {
                    Turn::Lead(lead) => _lead = Some(lead),
                    Turn::Follow(answer) => {
                        let answered =
                            answer_within(answer, MAX_WAIT, || self.batch.leave(id)).await;
                        if let Some(Sent::Answered(sent)) = answered {
                            return reported(id, counted("batch", sent));
                        }
                    }
                }
            }
            let sent = self.report_alone(id, report.kind(), plain, run).await;
            reported(id, counted("alone", sent))
        })
    }

    fn offer_report(
        &self,
        id: JobId,
        lease: Option<&str>,
        report: &Report,
        run: Option<&RunFacts>,
    ) {
        // Offers at N > 1 without a backlog find a fetch on its way: the
        // body is made only for one that may ride.
        if self.riders.open() {
            let body = self.with_run(report_body(lease, report), run);
            self.riders.offer(id, report.kind(), body);
        }
    }

    fn withdraw_offers(&self) {
        self.riders.withdraw();
    }

    fn hands_back_exactly(&self) -> bool {
        true
    }

    /// `POST /jobs/{id}/handback` under the job's lease; a server without
    /// the route, or that kept no copy of the job from before the
    /// hand-out, is sent RetryJob instead.
    fn hand_back<'a>(&'a self, job: &'a LeasedJob) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let Some(lease) = &job.lease else {
                return hand_back_by_retry(self, job).await;
            };
            let path = format!("/jobs/{}/handback", job.id);
            match self
                .client
                .quick(Method::POST, &path, Some(&json!({"lease": lease})))
                .await
            {
                Ok(_) => Ok(()),
                Err(error) if cannot_hand_back(&error) => hand_back_by_retry(self, job).await,
                Err(error) => Err(match source_error(error) {
                    SourceError::LeaseLost(_) => SourceError::LeaseLost(job.id),
                    other => other,
                }),
            }
        })
    }

    fn create<'a>(&'a self, job: &'a CreateJob) -> BoxFuture<'a, Result<JobId, SourceError>> {
        Box::pin(async move {
            let mut body = serde_json::Map::new();
            body.insert("name".into(), json!(job.name));
            body.insert("data".into(), Value::Object(job.data.clone()));
            if let Some(repeat) = &job.repeat {
                body.insert("repeat".into(), json!(repeat.text));
            }
            if let Some(priority) = job.priority {
                body.insert("priority".into(), json!(priority.value()));
            }
            if let Some(first_run) = job.first_run {
                body.insert("firstRun".into(), json!(first_run.to_string()));
            }
            if let Some(retry_after) = &job.retry_after {
                body.insert("retryAfter".into(), json!(retry_after.text));
            }
            if let Some(parent) = job.parent_id {
                body.insert("parentJobID".into(), json!(parent));
            }
            body.insert("unique".into(), json!(job.unique));
            body.insert("overwrite".into(), json!(job.overwrite));
            let answer = self
                .client
                .quick(Method::POST, "/jobs", Some(&Value::Object(body)))
                .await
                .map_err(source_error)?;
            answer["jobID"].as_i64().ok_or_else(|| {
                SourceError::Protocol(format!("create answer without jobID: {answer}"))
            })
        })
    }

    fn exists<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            match self
                .client
                .quick(Method::GET, &format!("/jobs/{id}"), None)
                .await
            {
                Ok(_) => Ok(true),
                Err(error) if error.is_not_found() => Ok(false),
                Err(error) => Err(source_error(error)),
            }
        })
    }

    fn delete<'a>(&'a self, id: JobId) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.client
                .quick(Method::DELETE, &format!("/jobs/{id}"), None)
                .await
                .map_err(source_error)?;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        self.client.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_servers_refusal_of_a_new_field_is_recognised() {
        // The message the server gives for a field it does not know.
        let refusal = ClientError::Api {
            status: 400,
            code: "invalid_request".into(),
            message: "request body is not valid: unknown field `run`, expected `data` or `lease` at line 1 column 20".into(),
        };
        assert!(refused_field(&refusal, "run"));
        assert!(!refused_field(&refusal, "worker"));
        let other = ClientError::Api {
            status: 409,
            code: "lease_lost".into(),
            message: "unknown field `run`".into(),
        };
        assert!(!refused_field(&other, "run"));
        // A server that keeps run history but not the output sizes.
        let sizes = ClientError::Api {
            status: 400,
            code: "invalid_request".into(),
            message: "request body is not valid: unknown field `stdoutBytes`, expected one of `exitCode`, `signal`, `stdout`, `stderr` at line 1 column 90".into(),
        };
        assert!(refused_field(&sizes, "stdoutBytes"));
        assert!(!refused_field(&sizes, "run"));
    }

    /// A server older than reports on a fetch: `/dequeue` refuses the
    /// field as unknown; every request is written down.
    async fn older_server() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let on_dequeue = Arc::clone(&seen);
        let on_finish = Arc::clone(&seen);
        let router = axum::Router::new()
            .route(
                "/dequeue",
                axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                    let seen = Arc::clone(&on_dequeue);
                    async move {
                        let mut seen = seen.lock().unwrap();
                        if body.get("reports").is_some() {
                            seen.push("dequeue with reports".to_string());
                            (
                                axum::http::StatusCode::BAD_REQUEST,
                                axum::Json(json!({"code": "invalid_request",
                                    "message": "request body is not valid: unknown field `reports`, expected one of `name`, `worker`"})),
                            )
                        } else {
                            seen.push("dequeue".to_string());
                            (axum::http::StatusCode::OK, axum::Json(json!({"jobs": []})))
                        }
                    }
                }),
            )
            .route(
                "/jobs/{id}/finish",
                axum::routing::post(move |axum::extract::Path(id): axum::extract::Path<String>| {
                    let seen = Arc::clone(&on_finish);
                    async move {
                        seen.lock().unwrap().push(format!("finish {id}"));
                        axum::Json(json!({}))
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (format!("http://{addr}"), seen)
    }

    #[tokio::test]
    async fn reports_an_older_server_refuses_on_a_fetch_go_by_themselves_and_ride_no_more() {
        let (url, seen) = older_server().await;
        let source = HttpSource::new(&url, None).unwrap();
        let finish = Report::Finish { data: None };
        let fetch = || source.get_jobs("Old/*", 1, Duration::ZERO, Duration::from_secs(60));
        source.offer_report(1, Some("lease-1"), &finish, None);
        assert!(
            fetch().await.unwrap().is_empty(),
            "the fetch itself was sent again"
        );
        source
            .report_run(1, Some("lease-1"), &finish, None)
            .await
            .unwrap();
        source.offer_report(2, Some("lease-2"), &finish, None);
        fetch().await.unwrap();
        source
            .report_run(2, Some("lease-2"), &finish, None)
            .await
            .unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                "dequeue with reports",
                "dequeue",
                "finish 1",
                "dequeue",
                "finish 2"
            ]
        );
    }

    /// A server whose worker registry does not know the count of frozen
    /// jobs: it refuses a worker that carries one, and takes it without.
    async fn registry_without_frozen() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let answer = |seen: Arc<std::sync::Mutex<Vec<String>>>, what: &'static str| {
            move |axum::Json(body): axum::Json<Value>| async move {
                let frozen = body["worker"].get("frozen").is_some();
                seen.lock()
                    .unwrap()
                    .push(format!("{what}{}", if frozen { " frozen" } else { "" }));
                if frozen {
                    (
                        axum::http::StatusCode::BAD_REQUEST,
                        axum::Json(json!({"code": "invalid_request",
                            "message": "request body is not valid: worker: unknown field `frozen`, expected one of `id`, `host`, `pid`, `capacity`, `running`, `load`"})),
                    )
                } else {
                    (axum::http::StatusCode::OK, axum::Json(json!({"jobs": []})))
                }
            }
        };
        let router = axum::Router::new()
            .route(
                "/dequeue",
                axum::routing::post(answer(Arc::clone(&seen), "dequeue")),
            )
            .route(
                "/workers",
                axum::routing::post(answer(Arc::clone(&seen), "announce")),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (format!("http://{addr}"), seen)
    }

    #[tokio::test]
    async fn a_registry_that_refuses_frozen_jobs_still_hears_from_the_supervisor_without() {
        let (url, seen) = registry_without_frozen().await;
        let source = HttpSource::new(&url, None).unwrap();
        let mut worker = WorkerInfo::this_process(None, 4);
        worker.running = 2;
        worker.frozen = 1;
        let fetch = |worker: &WorkerInfo| {
            let worker = worker.clone();
            let source = source.clone();
            async move {
                source
                    .get_jobs_as("Any", 1, Duration::ZERO, Duration::from_secs(60), &worker)
                    .await
            }
        };
        fetch(&worker).await.unwrap();
        source.announce(&worker).await.unwrap();
        fetch(&worker).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["dequeue frozen", "dequeue", "announce", "dequeue"],
            "refused once, then left out; the worker still identified"
        );
        assert!(!source.older_server.load(Ordering::Relaxed));
    }
}
