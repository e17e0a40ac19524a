//! Reports that ride on the next fetch: a job that ends frees its slot, and
//! the supervisor's next fetch follows at once; its report, offered before
//! the slot is freed, goes in that fetch's request (`POST /dequeue` with
//! `reports`), so that the server takes the report and the claim in one
//! request (and, as a rule, one commit) instead of two of each.
//!
//! A report rides while it is small, and when no fetch is on its way, or
//! one is but was sent under a backlog (the fetch before it brought every
//! job it asked for) less than [`RIDE_WAIT`] ago: a fetch already sent
//! cannot take the report, but under a backlog its answer comes at once
//! and the next fetch, for the slot this job freed, follows it and takes
//! the report (at N > 1 a fetch is usually on its way when a job ends;
//! without this, each such report was a request and a commit of its own).
//! A fetch out longer is waiting for jobs, or its server is slow: reports
//! do not wait for it. A report goes the usual way instead (by itself, or
//! batched under load: `report_batch`) when the supervisor will not fetch
//! for now (its gate closed for anything but a full pool or its ramp's
//! ceiling, it is quiet, backs off or drains: it withdraws the offers, and
//! none is taken until its next fetch), when no fetch took it within
//! [`RIDE_WAIT`], and when its fetch failed or was refused; a report is
//! never dropped. After a server refused the field (it is older than this
//! supervisor), reports no longer ride.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::report_batch::{Sent, Waiting, alone, hear, take_out};
use crate::protocol::JobId;

/// The longest an offered report waits for a fetch to take it (a fetch
/// follows a freed slot within a fraction of a millisecond, or the answer
/// of a fetch on its way under a backlog within a few; this bounds the
/// wait where none comes and none withdrew it). A fetch on its way for
/// this long already takes no offers behind it: it waits for jobs (a long
/// poll), or its server is slow.
pub const RIDE_WAIT: Duration = Duration::from_millis(50);

/// The largest report that rides, in bytes of JSON (a dequeue's body is
/// at most 2 MiB).
const MAX_RIDER_BYTES: usize = 64 * 1024;

/// The most reports one fetch takes (the server takes 64 on a dequeue).
const MAX_RIDERS: usize = 64;

/// About the most bytes of reports one fetch takes (the server takes a
/// dequeue's body up to 2 MiB).
const MAX_RIDERS_BYTES: usize = 1024 * 1024;

/// The most offered reports whose answer was not yet asked for (each offer
/// is followed by its report at once; this only bounds a mistake).
const MAX_OFFERED: usize = 1024;

#[derive(Default)]
struct State {
    /// Fetches on their way.
    fetching: usize,
    /// No fetch comes for now: offers are not taken until the next one.
    paused: bool,
    /// The last fetch answered brought every job it asked for: one on its
    /// way is answered at once, and a report may wait for the one after it.
    backlog: bool,
    /// When the last fetch was sent.
    sent: Option<Instant>,
    waiting: Vec<Waiting>,
    /// Answers of reports offered, kept until their report asks for them.
    offered: Vec<(JobId, oneshot::Receiver<Sent>)>,
}

/// The riders of one client.
#[derive(Default, Clone)]
pub struct Riders {
    state: Arc<Mutex<State>>,
    /// Set once the server refused reports on a dequeue.
    off: Arc<AtomicBool>,
}

impl std::fmt::Debug for Riders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Riders")
            .field("off", &self.off.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The reports a fetch carries; dropping it ends the fetch's turn (until
/// then, the fetch on its way cannot take a report offered: one is offered
/// only for the fetch after it, under a backlog).
pub struct Taken {
    riders: Riders,
    carried: Vec<Waiting>,
}

impl Riders {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an offer would be taken now (a report need not be made
    /// ready for one that would not).
    pub fn open(&self) -> bool {
        if self.off.load(Ordering::Relaxed) {
            return false;
        }
        Self::takes(&self.lock())
    }

    /// Whether `state` takes an offer: a fetch comes, and none is on its
    /// way or the last one sent went under a backlog a moment ago.
    fn takes(state: &State) -> bool {
        let behind = || state.backlog && state.sent.is_some_and(|sent| sent.elapsed() < RIDE_WAIT);
        !state.paused && (state.fetching == 0 || behind())
    }

    /// What the last fetch brought: `backlog` if every job it asked for.
    pub fn heard_fetch(&self, backlog: bool) {
        self.lock().backlog = backlog;
    }

    /// Offers job `id`'s report (its body as its own endpoint takes it) to
    /// the next fetch. Not taken when reports do not ride here, no fetch
    /// comes for now, a fetch is on its way without a backlog or for
    /// [`RIDE_WAIT`] already, or the report is large.
    pub fn offer(&self, id: JobId, outcome: &str, body: Map<String, Value>) {
        if !self.open() {
            return;
        }
        let (waiting, answered) = Waiting::new(id, outcome, body);
        let mut state = self.lock();
        let bytes: usize = state.waiting.iter().map(|w| w.size).sum();
        if !Self::takes(&state)
            || waiting.size > MAX_RIDER_BYTES
            || state.waiting.len() >= MAX_RIDERS
            || bytes + waiting.size > MAX_RIDERS_BYTES
            || state.offered.len() >= MAX_OFFERED
        {
            return;
        }
        state.waiting.push(waiting);
        state.offered.push((id, answered));
    }

    /// The answer of job `id`'s offered report, if it was offered.
    pub fn answer_of(&self, id: JobId) -> Option<oneshot::Receiver<Sent>> {
        let mut state = self.lock();
        let index = state
            .offered
            .iter()
            .position(|(offered, _)| *offered == id)?;
        Some(state.offered.swap_remove(index).1)
    }

    /// Takes job `id`'s report back if no fetch took it yet; `true` if it
    /// was still waiting.
    pub fn leave(&self, id: JobId) -> bool {
        take_out(&mut self.lock().waiting, id)
    }

    /// No fetch comes for now (the gate closed for anything but a full
    /// pool or its ramp's ceiling, the supervisor is quiet, backs off or
    /// drains): the waiting reports go the usual way at once, and so do
    /// those offered until the next fetch.
    pub fn withdraw(&self) {
        let withdrawn = {
            let mut state = self.lock();
            state.paused = true;
            std::mem::take(&mut state.waiting)
        };
        alone(withdrawn);
    }

    /// A fetch about to be sent takes the waiting reports; until the
    /// returned turn is dropped, reports are offered to a later fetch only
    /// under a backlog (see [`Riders::offer`]).
    pub fn take(&self) -> Taken {
        let mut state = self.lock();
        state.fetching += 1;
        state.sent = Some(Instant::now());
        state.paused = false;
        let carried = std::mem::take(&mut state.waiting);
        Taken {
            riders: self.clone(),
            carried,
        }
    }
}

impl Taken {
    /// The reports to put in the request, or `None` if none rides.
    pub fn reports(&self) -> Option<Value> {
        if self.carried.is_empty() {
            return None;
        }
        Some(Value::Array(
            self.carried
                .iter()
                .map(|waiting| Value::Object(waiting.body.clone()))
                .collect(),
        ))
    }

    /// Tells each report what the server answered: its own result in the
    /// answer's `results`, or for a result of the store's own (a 5xx) to go
    /// alone.
    pub fn answered(&mut self, answer: &Value) {
        hear(std::mem::take(&mut self.carried), answer);
    }

    /// The fetch failed or was refused: each report goes the usual way.
    /// With `refused_field`, the server does not know reports on a dequeue,
    /// and they no longer ride.
    pub fn failed(&mut self, refused_field: bool) {
        if refused_field {
            self.riders.off.store(true, Ordering::Relaxed);
        }
        alone(std::mem::take(&mut self.carried));
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // Not answered (the fetch was dropped before its answer): each goes
        // the usual way.
        alone(std::mem::take(&mut self.carried));
        let mut state = self.riders.lock();
        state.fetching = state.fetching.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientError;
    use serde_json::json;

    fn body() -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("lease".into(), json!("L"));
        body
    }

    fn heard(riders: &Riders, id: JobId) -> Sent {
        riders
            .answer_of(id)
            .expect("offered")
            .try_recv()
            .expect("answered")
    }

    #[test]
    fn an_offered_report_goes_with_the_next_fetch_and_hears_its_own_result() {
        let riders = Riders::default();
        riders.offer(1, "finish", body());
        riders.offer(2, "fail", body());
        let taken = riders.take();
        let reports = taken.reports().expect("two ride");
        assert_eq!(
            reports,
            json!([
                {"lease": "L", "jobID": 1, "outcome": "finish"},
                {"lease": "L", "jobID": 2, "outcome": "fail"},
            ])
        );
        let mut taken = taken;
        taken.answered(&json!({"jobs": [], "results": [
            {"jobID": 1},
            {"jobID": 2, "error": {"status": 409, "code": "lease_lost", "message": "gone"}},
        ]}));
        assert!(matches!(heard(&riders, 1), Sent::Answered(Ok(_))));
        assert!(matches!(
            heard(&riders, 2),
            Sent::Answered(Err(ClientError::Api { status: 409, .. }))
        ));
        // Taken by that fetch: nothing waits for the next one.
        assert!(riders.take().reports().is_none());
        assert!(riders.answer_of(1).is_none(), "asked for once");
    }

    #[test]
    fn a_store_error_or_a_missing_result_is_not_taken_as_an_answer() {
        let riders = Riders::default();
        for id in 1..=3 {
            riders.offer(id, "finish", body());
        }
        riders.take().answered(&json!({"jobs": [], "results": [
            {"jobID": 1, "error": {"status": 503, "code": "store_unavailable", "message": "full"}},
            {"jobID": 7},
        ]}));
        assert!(
            matches!(heard(&riders, 1), Sent::Alone),
            "may go to another server"
        );
        for id in [2, 3] {
            assert!(
                matches!(
                    heard(&riders, id),
                    Sent::Answered(Err(ClientError::Transport { .. }))
                ),
                "job {id}: an answer that names another job, or none, is no answer"
            );
        }
    }

    #[test]
    fn no_report_rides_on_a_fetch_already_on_its_way_nor_a_large_one() {
        let riders = Riders::default();
        let on_its_way = riders.take();
        riders.offer(1, "finish", body());
        assert!(
            riders.answer_of(1).is_none(),
            "a sent fetch cannot take it, and no backlog says another follows"
        );
        drop(on_its_way);
        let mut large = body();
        large.insert("data".into(), json!({"blob": "x".repeat(MAX_RIDER_BYTES)}));
        riders.offer(2, "finish", large);
        assert!(riders.answer_of(2).is_none(), "too large to ride");
        riders.offer(3, "finish", body());
        assert_eq!(
            riders.take().reports().map(|r| r[0]["jobID"].clone()),
            Some(json!(3))
        );
    }

    #[test]
    fn under_a_backlog_a_report_waits_behind_a_fetch_on_its_way_for_the_next() {
        let riders = Riders::default();
        riders.heard_fetch(true);
        let on_its_way = riders.take();
        riders.offer(1, "finish", body());
        let mut answer = riders.answer_of(1).expect("offered behind it");
        riders.heard_fetch(false);
        drop(on_its_way);
        let next = riders.take();
        assert_eq!(
            next.reports().map(|r| r[0]["jobID"].clone()),
            Some(json!(1)),
            "the next fetch takes it"
        );
        // No backlog now: a fetch on its way takes no offer.
        riders.offer(2, "finish", body());
        assert!(riders.answer_of(2).is_none(), "no backlog behind this one");
        drop(next);
        assert!(
            matches!(answer.try_recv(), Ok(Sent::Alone)),
            "its fetch went unanswered: it goes alone"
        );
        // Withdrawn under a backlog: no fetch comes, the offer goes alone.
        riders.heard_fetch(true);
        let on_its_way = riders.take();
        riders.offer(3, "finish", body());
        riders.withdraw();
        assert!(matches!(heard(&riders, 3), Sent::Alone), "withdrawn");
        drop(on_its_way);
        // A fetch out for RIDE_WAIT already waits for jobs, or is slow:
        // no report waits behind it.
        let on_its_way = riders.take();
        riders.lock().sent = Instant::now().checked_sub(RIDE_WAIT);
        riders.offer(4, "finish", body());
        assert!(riders.answer_of(4).is_none(), "not behind a fetch out long");
        drop(on_its_way);
    }

    #[test]
    fn riders_of_a_withdrawn_failed_or_dropped_fetch_go_by_themselves() {
        let riders = Riders::default();
        riders.offer(1, "finish", body());
        riders.withdraw();
        assert!(matches!(heard(&riders, 1), Sent::Alone), "withdrawn");
        assert!(riders.take().reports().is_none(), "and no longer waiting");

        riders.offer(2, "finish", body());
        drop(riders.take());
        assert!(
            matches!(heard(&riders, 2), Sent::Alone),
            "fetch dropped unanswered"
        );

        riders.offer(3, "finish", body());
        riders.take().failed(false);
        assert!(matches!(heard(&riders, 3), Sent::Alone), "fetch failed");
        riders.offer(4, "finish", body());
        assert!(riders.answer_of(4).is_some(), "reports still ride");
        assert!(riders.leave(4), "left before any fetch took it");
        assert!(!riders.leave(4));
        assert!(riders.take().reports().is_none());
    }

    #[test]
    fn after_a_refusal_of_the_field_reports_no_longer_ride() {
        let riders = Riders::default();
        riders.offer(1, "finish", body());
        riders.take().failed(true);
        assert!(matches!(heard(&riders, 1), Sent::Alone));
        riders.offer(2, "finish", body());
        assert!(riders.answer_of(2).is_none(), "not offered");
        assert!(riders.take().reports().is_none());
        riders.offer(3, "finish", body());
        assert!(riders.answer_of(3).is_none(), "nor after the next fetch");
    }

    #[test]
    fn once_withdrawn_no_report_is_taken_until_the_next_fetch() {
        let riders = Riders::default();
        riders.withdraw();
        riders.offer(1, "finish", body());
        assert!(riders.answer_of(1).is_none(), "no fetch comes for now");
        drop(riders.take());
        riders.offer(2, "finish", body());
        assert!(
            riders.answer_of(2).is_some(),
            "the fetch came: offers again"
        );
    }

    #[test]
    fn the_reports_one_fetch_takes_are_bounded_in_count_and_bytes() {
        let riders = Riders::default();
        for id in 0..(MAX_RIDERS as JobId + 5) {
            riders.offer(id, "finish", body());
        }
        assert_eq!(
            riders.take().reports().map(|r| r.as_array().map(Vec::len)),
            Some(Some(MAX_RIDERS))
        );
        let mut big = body();
        big.insert(
            "data".into(),
            json!({"blob": "x".repeat(MAX_RIDER_BYTES - 100)}),
        );
        let fit = MAX_RIDERS_BYTES / MAX_RIDER_BYTES;
        for id in 0..(fit as JobId + 3) {
            riders.offer(1000 + id, "finish", big.clone());
        }
        let taken = riders.take().reports().expect("some ride");
        let taken = taken.as_array().expect("a list");
        assert!(
            taken.len() <= fit && taken.len() >= fit - 1,
            "{}",
            taken.len()
        );
        // A rider that left gives its bytes back.
        riders.offer(1, "finish", big.clone());
        assert!(riders.leave(1));
        for id in 0..fit as JobId {
            riders.offer(2000 + id, "finish", big.clone());
        }
        assert!(
            riders
                .take()
                .reports()
                .expect("ride")
                .as_array()
                .unwrap()
                .len()
                >= fit - 1
        );
    }
}
