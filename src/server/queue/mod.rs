//! Bedrock::Jobs semantics over a [`Store`], with blocking GetJob: requests
//! held until a matching job is due, woken by the commit that made it due or,
//! for jobs due later, by one timer set to the earliest such moment. Leases
//! lapse on the same timer.

mod answer_budget;
mod clock;
pub mod dependencies;
mod emit;
pub mod idempotency;
pub mod labels;
mod record;
pub mod reports;
mod rules;
mod scheduler;
mod serving;
mod sessions;
mod steps;
mod sweeper;
pub mod throttles;
mod tracked;
mod waiters;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::protocol::view::HandOut;
use crate::protocol::{
    CreateJob, FailJob, FinishJob, GetJobs, Job, JobError, JobId, JobState, RequeueJobs, RetryJob,
    Timestamp, UpdateJob,
};
use crate::server::events::{Bus, Minute, Minutes};
use crate::server::ledger::Retention;
use crate::server::ledger::retention::millis;
use crate::server::store::{Announcement, ListQuery, Store};

pub use clock::{Clock, FileClock, SystemClock};
pub use dependencies::DependencyView;
pub use reports::{History, StatsDigest, WorkerView};
pub use rules::{MAX_RETRY_AFTER_HANDOUTS, MAX_RETRY_DELAY_SECS, new_token};
pub use tracked::{Changes, Tracked};
pub use waiters::{DueJob, Owed, Ticket, Waiters};

/// Settings of the queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// The lease a hand-out gets when the caller asks for a lease but names
    /// no term, and a job has no `retryAfter`.
    pub default_lease_ms: i64,
    /// Lapsed leases after which a job is FAILED rather than queued again.
    pub max_lapses: i64,
    /// What the ledger keeps, and for how long.
    pub retention: Retention,
    /// Queue again RUNNING jobs held without a lease (by plain Bedrock
    /// clients) this long after their hand-out; `None`: never (the default).
    pub requeue_unleased_after: Option<Duration>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            default_lease_ms: 5 * 60 * 1000,
            max_lapses: 10,
            retention: Retention::default(),
            requeue_unleased_after: None,
        }
    }
}

/// The job queue: cheap to clone, shared by every front-end.
#[derive(Clone)]
pub struct Queue {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    waiters: Waiters,
    /// Held requests whose claim found nothing and that sleep until a
    /// wake-up or their deadline.
    asleep: std::sync::atomic::AtomicUsize,
    timer: Timer,
    config: QueueConfig,
    clock: Arc<dyn Clock>,
    /// Tells a step of `clock` from time passing, for every write.
    steps: Arc<Mutex<clock::StepWatch>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Where committed job state changes are published.
    events: Arc<Bus>,
    /// The last hour's published events counted by minute.
    minutes: Arc<Minutes>,
    /// The tracked jobs' ids, for the event stream's `tracked` filter.
    tracked: Arc<labels::TrackedSet>,
    /// Set once leases held before a restart were extended.
    recovered: tokio::sync::watch::Sender<bool>,
    /// Runs between a claim's commit and its answer, to script races.
    #[cfg(test)]
    claim_hook: Mutex<Option<ClaimHook>>,
    /// Whether commits serve sleeping requests (see `serving`); tests of
    /// the wake-up path for requests that are not asleep turn it off.
    #[cfg(test)]
    serve_sleepers: std::sync::atomic::AtomicBool,
}

/// A test's hook on claims: given the number of jobs a committed claim
/// took, it may hold the answer back.
#[cfg(test)]
type ClaimHook = Arc<dyn Fn(usize) -> crate::future::BoxFuture<'static, ()> + Send + Sync>;

/// A claim's answer that its requester may stop waiting for: if dropped
/// with the answer unread, the jobs in it are put back.
struct Unread {
    answer: Option<oneshot::Receiver<Result<Vec<HandOut>, JobError>>>,
    queue: Queue,
}

impl Unread {
    /// The answer, once it comes (it is then read, and nothing is put back);
    /// `None` if it never will (its sender was dropped). Without an answer
    /// to wait for, never resolves.
    async fn recv(&mut self) -> Option<Result<Vec<HandOut>, JobError>> {
        let Some(answer) = self.answer.as_mut() else {
            return std::future::pending().await;
        };
        let result = answer.await.ok();
        self.answer = None;
        result
    }
}

impl Drop for Unread {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            answer.close();
            if let Ok(Ok(handouts)) = answer.try_recv() {
                self.queue.put_back(handouts);
            }
        }
    }
}

/// Counts a held request as asleep while it lives.
struct Asleep<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Asleep<'a> {
    fn count(counter: &'a std::sync::atomic::AtomicUsize) -> Self {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Asleep(counter)
    }
}

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The scheduler's alarm: the earliest moment something is due, set by
/// commits and read by the scheduler task.
#[derive(Default)]
struct Timer {
    state: Mutex<TimerState>,
    notify: Notify,
}

#[derive(Default)]
struct TimerState {
    /// The moment the scheduler is sleeping until.
    armed: Option<Timestamp>,
    /// An earlier moment reported since it last looked.
    pending: Option<Timestamp>,
}

impl Timer {
    fn nudge(&self, at: Timestamp) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.armed.is_some_and(|armed| armed <= at) || state.pending.is_some_and(|p| p <= at) {
            return;
        }
        state.pending = Some(at);
        drop(state);
        self.notify.notify_one();
    }

    /// Makes the scheduler look again at once: the moment it sleeps until
    /// was reckoned by the clock before a step, and later commits compare
    /// their moments with it.
    fn wake_now(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pending = Some(Timestamp(i64::MIN));
        drop(state);
        self.notify.notify_one();
    }
}

/// How many times a write that met another server's in a deadlock runs,
/// at most.
const CONFLICT_TRIES: u32 = 5;

impl Queue {
    /// A queue over `store`, with its scheduler running on the current
    /// runtime until [`Queue::shutdown`].
    pub fn start(store: Arc<dyn Store>, config: QueueConfig) -> Self {
        Self::start_with_clock(store, config, Arc::new(SystemClock))
    }

    /// As [`Queue::start`], reading time from `clock`.
    pub fn start_with_clock(
        store: Arc<dyn Store>,
        config: QueueConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let queue = Queue {
            inner: Arc::new(Inner {
                store,
                waiters: Waiters::default(),
                asleep: std::sync::atomic::AtomicUsize::new(0),
                timer: Timer::default(),
                config,
                clock,
                steps: Arc::new(Mutex::new(clock::StepWatch::new())),
                shutdown: CancellationToken::new(),
                events: Arc::new(Bus::default()),
                minutes: Arc::default(),
                tracked: Arc::default(),
                recovered: tokio::sync::watch::Sender::new(false),
                tasks: TaskTracker::new(),
                #[cfg(test)]
                claim_hook: Mutex::new(None),
                #[cfg(test)]
                serve_sleepers: std::sync::atomic::AtomicBool::new(true),
            }),
        };
        if let Some(announcements) = queue.inner.store.announcements() {
            tokio::spawn(follow_other_servers(queue.clone(), announcements));
        }
        labels::watch_tracked(&queue);
        tokio::spawn(scheduler::run(queue.clone()));
        tokio::spawn(throttles::follow_freed_slots(queue.clone()));
        tokio::spawn(reports::purge_periodically(queue.clone()));
        if let Some(age) = config.requeue_unleased_after {
            tokio::spawn(sweeper::run(queue.clone(), age));
        }
        queue
    }

    /// The queue's settings.
    pub fn config(&self) -> QueueConfig {
        self.inner.config
    }

    /// The current time, by the queue's clock.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// Why the store's writes fail, while they do (for `/healthz`).
    pub fn write_failure(&self) -> Option<String> {
        self.inner.store.write_failure()
    }

    /// How many GetJob requests are held: asleep after a claim that found
    /// nothing, until a wake-up or their deadline.
    pub fn waiting(&self) -> usize {
        self.inner.asleep.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once the queue has recovered from a restart (leases held
    /// before it extended); serve requests only after this.
    pub async fn ready(&self) {
        let mut recovered = self.inner.recovered.subscribe();
        let _ = recovered.wait_for(|done| *done).await;
    }

    /// The job state changes this server commits, for event streams.
    pub fn events(&self) -> &Arc<Bus> {
        &self.inner.events
    }

    /// The last hour by minute (oldest first), as counted from the events
    /// this server published since it started.
    pub fn last_hour(&self) -> Vec<Minute> {
        self.inner.minutes.last_hour(self.now())
    }

    /// Stops the scheduler, answers every held request (with nothing) and
    /// ends event streams.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.events.close();
        self.inner.waiters.wake_all();
    }

    /// Whether [`Queue::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// Runs `op` in a durable write transaction, then wakes waiters for the
    /// jobs it made due and sets the timer for those it scheduled (see
    /// [`Queue::write_once`]). A transaction rolled back because it met
    /// another server's in a deadlock (a store shared by several servers
    /// commits several operations together, and their row locks add up) is
    /// run again, up to [`CONFLICT_TRIES`] times in all.
    pub async fn write<R, F>(&self, op: F) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: Fn(&mut Tracked) -> Result<R, JobError> + Send + Sync + 'static,
    {
        let op = Arc::new(op);
        let mut tries = 1;
        loop {
            let this_try = Arc::clone(&op);
            match self.write_once(move |tx| this_try(tx)).await {
                Err(JobError::StoreConflict(why)) if tries < CONFLICT_TRIES => {
                    tracing::debug!(%why, tries, "a write met another server's; running it again");
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Runs `op` once in a durable write transaction, then wakes waiters
    /// for the jobs it made due and sets the timer for those it scheduled. Before
    /// `op` runs, a forward step of the wall clock since the last write is
    /// made up for in the same transaction (see `steps`); not on a store
    /// shared with other servers, whose clock is the database's, counted on
    /// by this machine's monotonic clock (each server would make up for a
    /// step of it once more).
    async fn write_once<R, F>(&self, op: F) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Tracked) -> Result<R, JobError> + Send + 'static,
    {
        let clock = Arc::clone(&self.inner.clock);
        let watch = Arc::clone(&self.inner.steps);
        let watch_after = Arc::clone(&watch);
        let gone_after = millis(self.inner.config.retention.worker_gone_after);
        let shared = self.inner.store.shared();
        let bus = Arc::clone(&self.inner.events);
        let minutes = Arc::clone(&self.inner.minutes);
        let waiters = self.inner.waiters.clone();
        #[cfg(test)]
        let serve = self
            .inner
            .serve_sleepers
            .load(std::sync::atomic::Ordering::SeqCst);
        #[cfg(not(test))]
        let serve = true;
        let queue = Arc::downgrade(&self.inner);
        let runtime = tokio::runtime::Handle::current();
        let (result, changes, _, stepped, _) = self
            .inner
            .store
            .write_then(
                move |store| {
                    let mut tx = Tracked::new(store, clock.now(), gone_after);
                    let (reading, stepped) =
                        steps::make_up_for_step(&mut tx, &watch, clock.is_scripted() || shared)?;
                    let result = op(&mut tx)?;
                    throttles::wake_for_freed_slots(&mut tx, &waiters)?;
                    // Not on a store shared with other servers: there a claim
                    // inside another write would take the throttles' and
                    // supervisors' row locks after that write's own, an order
                    // that deadlocks against claims taking them first.
                    let served = if serve && !shared {
                        serving::serve_sleepers(&mut tx, &waiters)?
                    } else {
                        serving::Served::default()
                    };
                    if shared {
                        tx.announce()?;
                    }
                    watch
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .kept(reading);
                    let mut changes = tx.into_changes();
                    // Published by the writer once committed, so in commit
                    // order, and never for a write rolled back; the served
                    // requests are answered there too, as soon as it is
                    // durable.
                    let events = std::mem::take(&mut changes.events);
                    let after = Mutex::new(Some((events, served)));
                    Ok((result, changes, reading, stepped, after))
                },
                move |(_, _, reading, _, after), committed| {
                    watch_after
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .ended(*reading, committed);
                    let Some((events, served)) =
                        after.lock().unwrap_or_else(|e| e.into_inner()).take()
                    else {
                        return;
                    };
                    if committed {
                        minutes.record(&events);
                        bus.publish(events);
                    }
                    served.answer(committed, &queue, &runtime);
                },
            )
            .await?;
        if stepped {
            self.inner.timer.wake_now();
        }
        self.after_commit(changes);
        Ok(result)
    }

    fn after_commit(&self, changes: Changes) {
        // Judge "due" by the time after the commit: a job that became due
        // while the commit was in flight is woken here, since the timer may
        // already have passed its moment.
        let now = self.now();
        let mut due = Vec::new();
        let mut later = changes.lease_expiry;
        for (job, next_run) in changes.ready {
            if next_run <= now {
                due.push(job);
            } else {
                later = Some(later.map_or(next_run, |l| l.min(next_run)));
            }
        }
        self.inner.waiters.wake(due);
        self.inner.waiters.wake_for_slots(changes.slot_wake_ups);
        if let Some(at) = later {
            self.inner.timer.nudge(at);
        }
    }

    /// Acts on another server's commit as on this server's own: wakes the
    /// waiters for what it made due, sets the timer for the rest, and has
    /// the throttles whose slots it freed looked at again. After
    /// announcements may have been missed, every waiter and the timer look
    /// again.
    fn after_other_commit(&self, announcement: Announcement) {
        match announcement {
            Announcement::Changes {
                ready,
                lease_expiry,
                freed,
            } => {
                self.inner.waiters.look_again(freed);
                self.after_commit(Changes {
                    ready: ready
                        .into_iter()
                        .map(|job| {
                            let due = DueJob {
                                id: job.id,
                                name: job.name,
                                priority: job.priority,
                            };
                            (due, job.next_run)
                        })
                        .collect(),
                    lease_expiry,
                    ..Changes::default()
                })
            }
            Announcement::Missed => {
                self.inner.waiters.wake_all();
                self.inner.timer.wake_now();
            }
        }
    }

    async fn read<R, F>(&self, op: F) -> Result<R, JobError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn crate::server::store::StoreTx) -> Result<R, JobError> + Send + 'static,
    {
        self.inner.store.read(op).await
    }

    /// CreateJob.
    pub async fn create(&self, cmd: CreateJob) -> Result<JobId, JobError> {
        self.write(move |tx| rules::create(tx, &cmd)).await
    }

    /// CreateJobs: all or nothing.
    pub async fn create_many(&self, cmds: Vec<CreateJob>) -> Result<Vec<JobId>, JobError> {
        self.write(move |tx| cmds.iter().map(|cmd| rules::create(tx, cmd)).collect())
            .await
    }

    /// GetJob(s). Without `wait`, answers at once; with it, holds the request
    /// until a matching job is due or the wait ends, and then answers with
    /// what it found (possibly nothing). If the caller stops waiting (drops
    /// the future) after jobs were taken for it, they are put back.
    pub async fn get_jobs(
        &self,
        cmd: GetJobs,
        wait: Option<Duration>,
    ) -> Result<Vec<HandOut>, JobError> {
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        let pattern = Arc::new(cmd.pattern.clone());
        let request = Arc::new(cmd.clone());
        // Wake-ups this request holds: each is settled or passed on (see
        // `waiters`), also when this future is dropped or fails.
        let mut owed = Owed::new(self.inner.waiters.clone());
        loop {
            let ticket = deadline.map(|_| {
                self.inner
                    .waiters
                    .register(Arc::clone(&pattern), cmd.priority, cmd.num_results)
            });
            let handouts = self.claim(cmd.clone()).await?;
            if !handouts.is_empty() {
                if let Some(ticket) = ticket {
                    // Woken while claiming: the claim may have read the
                    // store before the job it was woken for was committed.
                    owed.add(ticket.disarm());
                }
                owed.pass_on_all_but(&handouts);
                return Ok(handouts);
            }
            // The claim came after every commit whose wake-up `owed` holds
            // and found nothing: those jobs are gone. (A wake-up that came
            // during the claim is still in the ticket.)
            owed.settle_all();
            let (Some(deadline), Some(ticket)) = (deadline, ticket) else {
                return Ok(handouts);
            };
            if self.is_shut_down() {
                return Ok(Vec::new());
            }
            // Dropping the ticket (rather than disarming it) passes on a
            // wake-up that raced with the end of the wait.
            // Asleep, it may be served by the commit that makes a job it
            // could take due (see `serving`); jobs served to it after it
            // stopped waiting are put back. Counted asleep once servable.
            let mut served = Unread {
                answer: ticket.sleep_servable(Arc::clone(&request)),
                queue: self.clone(),
            };
            let _asleep = Asleep::count(&self.inner.asleep);
            tokio::select! {
                _ = ticket.notified() => owed.add(ticket.disarm()),
                answer = served.recv() => match answer {
                    Some(Ok(handouts)) if !handouts.is_empty() => return Ok(handouts),
                    // Served nothing, or its commit failed: claim again.
                    _ => owed.add(ticket.disarm()),
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                _ = self.inner.shutdown.cancelled() => return Ok(Vec::new()),
            }
        }
    }

    /// Takes due jobs in a task of its own, so that a caller who goes away
    /// mid-claim cannot strand them: whether the caller left before the
    /// answer came or after it came but before it was read, the jobs are put
    /// back.
    async fn claim(&self, cmd: GetJobs) -> Result<Vec<HandOut>, JobError> {
        let (answer, answered) = oneshot::channel();
        let queue = self.clone();
        self.inner.tasks.spawn(async move {
            let result = queue.write(move |tx| rules::get_jobs(tx, &cmd)).await;
            #[cfg(test)]
            queue.run_claim_hook(&result).await;
            if let Err(Ok(handouts)) = answer.send(result) {
                queue.put_back(handouts);
            }
        });
        let mut pending = Unread {
            answer: Some(answered),
            queue: self.clone(),
        };
        let result = match pending.answer.as_mut() {
            Some(answer) => answer.await.unwrap_or(Err(JobError::ShuttingDown)),
            None => Err(JobError::ShuttingDown),
        };
        pending.answer = None;
        result
    }

    /// Runs the test's claim hook, if one is set.
    #[cfg(test)]
    async fn run_claim_hook(&self, result: &Result<Vec<HandOut>, JobError>) {
        let hook = self
            .inner
            .claim_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(hook) = hook {
            hook(result.as_ref().map_or(0, Vec::len)).await;
        }
    }

    /// Puts back, in the background, hand-outs nobody received.
    fn put_back(&self, handouts: Vec<HandOut>) {
        if handouts.is_empty() {
            return;
        }
        tracing::info!(
            count = handouts.len(),
            "requester left before its jobs were delivered; putting them back"
        );
        let queue = self.clone();
        self.inner.tasks.spawn(async move {
            if let Err(error) = queue.return_undelivered(handouts).await {
                tracing::error!(%error, "could not put back undelivered jobs; a leased one returns when its lease lapses, one held until reported stays RUNNING until reported or failed (or --requeue-unleased-after)");
            }
        });
    }

    /// Waits for the queue's background tasks (claims, put-backs) to end,
    /// after [`Queue::shutdown`]. Call before closing the store.
    pub async fn settle(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Puts back jobs whose hand-out could not be delivered, undoing what
    /// the hand-out changed (not an update made since), unless someone
    /// already reported on them.
    pub async fn return_undelivered(&self, handouts: Vec<HandOut>) -> Result<usize, JobError> {
        self.write(move |tx| rules::return_undelivered(tx, &handouts))
            .await
    }

    /// HandBackJob: puts back a job its holder never started, undoing what
    /// the hand-out under `token` changed (not an update made since).
    pub async fn hand_back(&self, id: JobId, token: String) -> Result<(), JobError> {
        self.write(move |tx| rules::hand_back(tx, id, &token)).await
    }

    /// QueryJob.
    pub async fn query(&self, id: JobId) -> Result<Job, JobError> {
        self.read(move |tx| tx.get(id)?.ok_or(JobError::NoSuchJob))
            .await
    }

    /// Lists jobs in id order.
    pub async fn list(&self, query: ListQuery) -> Result<crate::server::store::Page, JobError> {
        self.read(move |tx| tx.list(&query)).await
    }

    /// How many jobs are in each state.
    pub async fn count_by_name(&self) -> Result<Vec<(String, JobState, u64)>, JobError> {
        self.read(|tx| tx.count_by_name()).await
    }

    /// UpdateJob.
    pub async fn update(&self, cmd: UpdateJob) -> Result<(), JobError> {
        self.write(move |tx| rules::update(tx, &cmd)).await
    }

    /// FinishJob.
    pub async fn finish(&self, cmd: FinishJob) -> Result<(), JobError> {
        self.write(move |tx| {
            rules::finish_or_retry(tx, rules::Report::Finish(&cmd))?;
            dependencies::after_finish(tx, cmd.id)
        })
        .await
    }

    /// RetryJob.
    pub async fn retry(&self, cmd: RetryJob) -> Result<(), JobError> {
        self.write(move |tx| rules::finish_or_retry(tx, rules::Report::Retry(&cmd)))
            .await
    }

    /// FailJob.
    pub async fn fail(&self, cmd: FailJob) -> Result<(), JobError> {
        self.write(move |tx| rules::fail(tx, &cmd)).await
    }

    /// DeleteJob.
    pub async fn delete(&self, id: JobId) -> Result<(), JobError> {
        self.write(move |tx| rules::delete(tx, id)).await
    }

    /// CancelJob.
    pub async fn cancel(&self, id: JobId) -> Result<(), JobError> {
        self.write(move |tx| rules::cancel(tx, id)).await
    }

    /// RequeueJobs; returns how many jobs existed and were requeued.
    pub async fn requeue(&self, cmd: RequeueJobs) -> Result<usize, JobError> {
        self.write(move |tx| rules::requeue(tx, &cmd)).await
    }

    /// Renews a lease; returns when it now lapses.
    pub async fn heartbeat(&self, id: JobId, token: String) -> Result<Option<Timestamp>, JobError> {
        let term = self.inner.config.default_lease_ms;
        self.write(move |tx| rules::heartbeat(tx, id, &token, term))
            .await
    }
}

/// Hands what other servers on a shared store commit to the queue, until
/// the queue shuts down or the store stops listening.
async fn follow_other_servers(
    queue: Queue,
    mut announcements: tokio::sync::mpsc::UnboundedReceiver<Announcement>,
) {
    loop {
        tokio::select! {
            _ = queue.inner.shutdown.cancelled() => return,
            announcement = announcements.recv() => match announcement {
                Some(announcement) => queue.after_other_commit(announcement),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod answer_budget_tests;
#[cfg(test)]
mod plans_tests;
#[cfg(test)]
mod put_back_tests;
#[cfg(test)]
mod step_tests;
#[cfg(test)]
mod wake_up_tests;
