//! Reports sent together under load, the way the store commits writes
//! together: a report that finds none on its way goes by itself, to its own
//! endpoint; reports that come while one is on its way wait for it, then go
//! as one `POST /reports` (sent by a task of their own), and so on while
//! they keep coming. A supervisor with one job at a time sends exactly what
//! it sent before; one with many saves a request and a commit per report.
//!
//! A batch the server refuses whole (an older server without the route, a
//! report it cannot read, a body too large) sends each of its reports by
//! itself, to its own endpoint, which says precisely what is wrong with it;
//! after an older server's refusal, reports are no longer batched. So does a
//! report the store could not take (a 5xx of its own), which may then go to
//! another server of the store, and one that waited [`MAX_WAIT`] without
//! being taken into a batch. A report whose sender stopped waiting is still
//! sent: a report is never dropped for its caller's sake (a second one of a
//! job is refused under its lease).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::Method;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::{ClientError, HttpClient};
use crate::protocol::JobId;

/// The most reports in one request (the server takes up to 256).
const MAX_REPORTS: usize = 64;

/// About the most bytes of reports in one request (the server takes a
/// body of up to 2 MiB); a report larger than this goes alone.
const MAX_BYTES: usize = 1024 * 1024;

/// The longest a report waits to be taken into a batch (behind a report or
/// batch on its way that the server is slow to answer) before it goes
/// alone: a worker's lease is no longer renewed once it ended.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What became of a report handed to the batch.
#[derive(Debug)]
pub enum Sent {
    /// The server's answer to it.
    Answered(Result<Value, ClientError>),
    /// Send it by itself, to its own endpoint.
    Alone,
}

/// How a report goes.
pub enum Turn {
    /// Nothing is on its way: send it by itself now. The next reports
    /// wait for this one; dropping the turn (once sent, or if the send is
    /// abandoned) sends them.
    Lead(Lead),
    /// It waits for the report on its way, then goes with the others that
    /// came meanwhile; the answer comes here.
    Follow(oneshot::Receiver<Sent>),
}

/// A report waiting to go with others (the next batch, or a fetch: see
/// `riders`).
pub struct Waiting {
    pub id: JobId,
    /// Its body, with `jobID` and `outcome`.
    pub body: Map<String, Value>,
    /// The bytes of its body.
    pub size: usize,
    pub answer: oneshot::Sender<Sent>,
}

impl Waiting {
    /// Job `id`'s report, its body as its own endpoint takes it, to which
    /// `jobID` and `outcome` are added; and where its answer comes.
    pub fn new(
        id: JobId,
        outcome: &str,
        mut body: Map<String, Value>,
    ) -> (Waiting, oneshot::Receiver<Sent>) {
        body.insert("jobID".into(), json!(id));
        body.insert("outcome".into(), json!(outcome));
        let size = serde_json::to_string(&body).map_or(0, |text| text.len());
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            id,
            body,
            size,
            answer,
        };
        (waiting, answered)
    }
}

#[derive(Default)]
struct State {
    /// A report or a batch is on its way.
    busy: bool,
    waiting: Vec<Waiting>,
}

/// The reports of one client.
#[derive(Default, Clone)]
pub struct ReportBatch {
    state: Arc<Mutex<State>>,
    /// Set once the server had no `/reports` route.
    off: Arc<AtomicBool>,
}

impl std::fmt::Debug for ReportBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportBatch")
            .field("off", &self.off.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The turn of a report sent by itself; dropping it sends what waits.
pub struct Lead {
    batch: ReportBatch,
    client: HttpClient,
}

impl ReportBatch {
    /// Whether reports are batched at all (not after an older server
    /// refused the route).
    pub fn on(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// Takes a report of job `id`: its body as its own endpoint takes it
    /// (run facts included), to which a batch adds `jobID` and `outcome`.
    pub fn turn(
        &self,
        client: &HttpClient,
        id: JobId,
        outcome: &str,
        body: Map<String, Value>,
    ) -> Turn {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.busy {
            state.busy = true;
            return Turn::Lead(Lead {
                batch: self.clone(),
                client: client.clone(),
            });
        }
        let (waiting, answered) = Waiting::new(id, outcome, body);
        state.waiting.push(waiting);
        Turn::Follow(answered)
    }

    /// Sends batches while reports keep waiting, then ends the busy spell.
    /// If this ends early (a panic, the runtime shutting down), what still
    /// waits goes alone and the next report leads again.
    async fn send_waiting(self, client: HttpClient) {
        struct Ended(ReportBatch);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.end_busy_spell();
            }
        }
        let _ended = Ended(self.clone());
        loop {
            let batch = self.next_batch();
            if batch.is_empty() {
                return;
            }
            self.send(&client, batch).await;
        }
    }

    /// Ends the busy spell: the next report leads, and what still waits
    /// (came after the last batch was taken) goes alone.
    fn end_busy_spell(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.busy = false;
        alone(std::mem::take(&mut state.waiting));
    }

    /// Takes the next batch off the waiting list (staying busy while it is
    /// sent), or an empty one when none waits.
    fn next_batch(&self) -> Vec<Waiting> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        take_batch(&mut state.waiting)
    }

    /// A report that waited [`MAX_WAIT`] without being taken into a batch
    /// leaves the list and goes alone; `true` if it was still there.
    pub fn leave(&self, id: JobId) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        take_out(&mut state.waiting, id)
    }

    async fn send(&self, client: &HttpClient, batch: Vec<Waiting>) {
        if batch.len() == 1 || !self.on() {
            return alone(batch);
        }
        let reports: Vec<Value> = batch
            .iter()
            .map(|waiting| Value::Object(waiting.body.clone()))
            .collect();
        let sent = client
            .quick(
                Method::POST,
                "/reports",
                Some(&json!({ "reports": reports })),
            )
            .await;
        match sent {
            Ok(answer) => hear(batch, &answer),
            Err(ClientError::Api { code, .. })
                if code == "no_such_route" || code == "method_not_allowed" =>
            {
                tracing::info!(
                    "the job server takes no batched reports (it is older than this supervisor); each report goes by itself"
                );
                self.off.store(true, Ordering::Relaxed);
                alone(batch);
            }
            // Refused whole for any other reason than the token (a report
            // it cannot read, a body too large or too slow, a proxy's
            // refusal): each to its own endpoint, which says what is wrong
            // with it, or takes it.
            Err(ClientError::Api { status, .. })
                if (400..500).contains(&status) && status != 401 && status != 403 =>
            {
                alone(batch)
            }
            Err(error) => {
                for waiting in batch {
                    let _ = waiting.answer.send(Sent::Answered(Err(error.clone())));
                }
            }
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        {
            let mut state = self.batch.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.waiting.is_empty() {
                state.busy = false;
                return;
            }
        }
        let batch = self.batch.clone();
        let client = self.client.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(batch.send_waiting(client));
            }
            // No runtime to send them from: each goes by itself.
            Err(_) => batch.end_busy_spell(),
        }
    }
}

/// The first reports waiting, up to [`MAX_REPORTS`] and about [`MAX_BYTES`].
fn take_batch(waiting: &mut Vec<Waiting>) -> Vec<Waiting> {
    let mut bytes = 0;
    let mut count = 0;
    for report in waiting.iter() {
        if count == MAX_REPORTS || (count > 0 && bytes + report.size > MAX_BYTES) {
            break;
        }
        bytes += report.size;
        count += 1;
    }
    waiting.drain(..count).collect()
}

/// The answer of a report waiting to go with others: the one that comes
/// within `wait`; none if `leave` then finds the report still waiting (it
/// goes by itself); once it is on its way, whenever its request is
/// answered.
pub async fn answer_within(
    mut answer: oneshot::Receiver<Sent>,
    wait: std::time::Duration,
    leave: impl FnOnce() -> bool,
) -> Option<Sent> {
    match tokio::time::timeout(wait, &mut answer).await {
        Ok(answered) => answered.ok(),
        Err(_) if leave() => None,
        Err(_) => answer.await.ok(),
    }
}

/// Takes job `id`'s report out of `waiting`; `true` if it was there.
pub fn take_out(waiting: &mut Vec<Waiting>, id: JobId) -> bool {
    match waiting.iter().position(|report| report.id == id) {
        Some(index) => {
            waiting.remove(index);
            true
        }
        None => false,
    }
}

/// Tells each report of `batch` what the server answered: its own result
/// in the answer's `results` (in order), or, for a result of the store's
/// own (a 5xx), to go alone: the report may go to another server of the
/// store.
pub fn hear(batch: Vec<Waiting>, answer: &Value) {
    let results = answer
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (index, waiting) in batch.into_iter().enumerate() {
        let sent = match read_result(results.get(index), waiting.id) {
            Err(ClientError::Api { status, .. }) if status >= 500 => Sent::Alone,
            result => Sent::Answered(result),
        };
        let _ = waiting.answer.send(sent);
    }
}

/// Tells each report to go by itself.
pub fn alone(batch: Vec<Waiting>) {
    for waiting in batch {
        let _ = waiting.answer.send(Sent::Alone);
    }
}

/// A report's result in the batch's answer: `{"jobID": N}`, or with an
/// `error` as its own endpoint would have answered.
fn read_result(result: Option<&Value>, id: JobId) -> Result<Value, ClientError> {
    let unreadable = || ClientError::Transport {
        url: "/reports".into(),
        detail: format!("the answer has no result for job {id}"),
    };
    let result = result.ok_or_else(unreadable)?;
    if result.get("jobID").and_then(Value::as_i64) != Some(id) {
        return Err(unreadable());
    }
    let Some(error) = result.get("error") else {
        return Ok(result.clone());
    };
    let status = error
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(500);
    Err(ClientError::from_answer(status, error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> HttpClient {
        // Nothing listens on port 1: a batch sent there fails to connect.
        HttpClient::new("http://127.0.0.1:1", None).unwrap()
    }

    fn follow(turn: Turn) -> oneshot::Receiver<Sent> {
        match turn {
            Turn::Follow(answer) => answer,
            Turn::Lead(_) => panic!("expected to wait for the report on its way"),
        }
    }

    #[test]
    fn the_first_report_goes_alone_and_the_next_ones_wait_for_it_in_order() {
        let batch = ReportBatch::default();
        let client = client();
        let lead = batch.turn(&client, 1, "finish", Map::new());
        let Turn::Lead(lead) = lead else {
            panic!("nothing on its way: the report goes by itself");
        };
        let mut second = follow(batch.turn(&client, 2, "retry", Map::new()));
        let _third = follow(batch.turn(&client, 3, "fail", Map::new()));
        let waiting = batch.next_batch();
        let ids: Vec<JobId> = waiting.iter().map(|w| w.id).collect();
        assert_eq!(ids, vec![2, 3]);
        assert_eq!(waiting[0].body["outcome"], "retry");
        assert_eq!(waiting[0].body["jobID"], 2);
        drop(waiting);
        assert!(
            second.try_recv().is_err(),
            "dropped unanswered: its report goes by itself"
        );
        // Nothing left: the busy spell ends with the lead (no runtime here,
        // nothing to send), and the next report goes by itself again.
        drop(lead);
        assert!(matches!(
            batch.turn(&client, 4, "finish", Map::new()),
            Turn::Lead(_)
        ));
    }

    #[test]
    fn a_batch_holds_at_most_its_count_and_about_its_bytes() {
        let batch = ReportBatch::default();
        let client = client();
        let _lead = batch.turn(&client, 1, "finish", Map::new());
        let _small: Vec<_> = (0..70)
            .map(|id| batch.turn(&client, 10 + id, "finish", Map::new()))
            .collect();
        assert_eq!(batch.next_batch().len(), MAX_REPORTS);
        assert_eq!(batch.next_batch().len(), 70 - MAX_REPORTS);
        let mut big = Map::new();
        big.insert(
            "data".into(),
            json!({"blob": "x".repeat(MAX_BYTES / 2 + 1)}),
        );
        let _big: Vec<_> = (0..3)
            .map(|id| batch.turn(&client, 100 + id, "finish", big.clone()))
            .collect();
        for _ in 0..3 {
            assert_eq!(batch.next_batch().len(), 1, "two would pass the byte bound");
        }
        assert!(batch.next_batch().is_empty());
    }

    /// A server on loopback that answers `POST /reports` with `status` and
    /// `body`, as a server of another version or a proxy might.
    async fn answering(status: u16, body: Value) -> HttpClient {
        let router = axum::Router::new().route(
            "/reports",
            axum::routing::post(move || {
                let body = body.clone();
                async move {
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        axum::Json(body),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        HttpClient::new(&format!("http://{addr}"), None).unwrap()
    }

    /// Sends jobs 1 and 2 as one batch through `client`; what each heard.
    async fn batch_of_two(batch: &ReportBatch, client: &HttpClient) -> Vec<Sent> {
        let lead = batch.turn(client, 9, "finish", Map::new());
        let answers: Vec<_> = (1..=2)
            .map(|id| follow(batch.turn(client, id, "finish", Map::new())))
            .collect();
        drop(lead);
        let mut heard = Vec::new();
        for answer in answers {
            heard.push(
                tokio::time::timeout(std::time::Duration::from_secs(60), answer)
                    .await
                    .expect("answered")
                    .expect("not dropped"),
            );
        }
        heard
    }

    #[tokio::test]
    async fn a_server_without_the_route_gets_each_report_alone_from_then_on() {
        let client = answering(
            404,
            json!({"code": "no_such_route", "message": "no route POST /reports"}),
        )
        .await;
        let batch = ReportBatch::default();
        let heard = batch_of_two(&batch, &client).await;
        assert!(
            heard.iter().all(|sent| matches!(sent, Sent::Alone)),
            "{heard:?}"
        );
        assert!(!batch.on(), "no more batches to this server");
    }

    #[tokio::test]
    async fn a_batch_refused_whole_sends_each_alone_but_for_the_token() {
        for (status, code, alone) in [
            (408, "request_timeout", true),
            (400, "invalid_request", true),
            (413, "body_too_large", true),
            (401, "unauthorized", false),
        ] {
            let client = answering(status, json!({"code": code, "message": "no"})).await;
            let batch = ReportBatch::default();
            for sent in batch_of_two(&batch, &client).await {
                match sent {
                    Sent::Alone => assert!(alone, "{status}: sent alone"),
                    Sent::Answered(Err(ClientError::Api { status: got, .. })) => {
                        assert!(!alone && got == status, "{status}: answered {got}")
                    }
                    other => panic!("{status}: {other:?}"),
                }
            }
            assert!(batch.on(), "{status}: batches go on");
        }
    }

    #[tokio::test]
    async fn each_report_hears_its_own_result_and_a_store_error_goes_alone() {
        let client = answering(
            200,
            json!({"results": [
                {"jobID": 1, "error": {"status": 409, "code": "lease_lost", "message": "gone"}},
                {"jobID": 2, "error": {"status": 503, "code": "store_unavailable", "message": "full"}},
            ]}),
        )
        .await;
        let heard = batch_of_two(&ReportBatch::default(), &client).await;
        assert!(
            matches!(&heard[0], Sent::Answered(Err(ClientError::Api { status: 409, code, .. })) if code == "lease_lost"),
            "{heard:?}"
        );
        assert!(matches!(heard[1], Sent::Alone), "{heard:?}");
        // An answer that names other jobs is no answer for these.
        let client = answering(200, json!({"results": [{"jobID": 7}]})).await;
        for sent in batch_of_two(&ReportBatch::default(), &client).await {
            assert!(
                matches!(sent, Sent::Answered(Err(ClientError::Transport { .. }))),
                "{sent:?}"
            );
        }
    }

    #[tokio::test]
    async fn waiting_reports_are_sent_when_the_lead_ends_and_each_hears_the_outcome() {
        let batch = ReportBatch::default();
        let client = client();
        let lead = batch.turn(&client, 1, "finish", Map::new());
        let answers: Vec<_> = (2..=3)
            .map(|id| follow(batch.turn(&client, id, "finish", Map::new())))
            .collect();
        drop(lead);
        for answer in answers {
            let sent = tokio::time::timeout(std::time::Duration::from_secs(60), answer)
                .await
                .expect("answered")
                .expect("not dropped");
            assert!(
                matches!(sent, Sent::Answered(Err(ClientError::Transport { .. }))),
                "the batch's own failure, for each report: {sent:?}"
            );
        }
    }
}
