//! One job, from hand-out to report: resolve its worker, prepare its scratch
//! directory and environment, run it while renewing its lease and forwarding
//! its progress, decide the report, and deliver it (or spool it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::held::{self, NoPlace, Place, WentBack};
use super::process::{self, PROGRESS_FD, WorkerSpec};
use super::report::{self, DETAILS_KEY, Decision, JobFacts, NotRun};
use super::scratch::JobScratch;
use super::settings::JobSettings;
use super::spool::Spooled;
use super::uids;
use super::worker_path::{NoWorker, WorkerPath};
use super::{Generation, Shared};
use crate::client::{LeasedJob, Report, SourceError};
use crate::config::WorkerKind;
use crate::protocol::RunFacts;
use crate::protocol::{Data, MAX_DATA_BYTES, data_len};

/// The least time between two progress updates of one job.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A job to run.
pub(super) struct JobTask {
    /// Its place under `--max-workers` (a slot, and its count in the
    /// running workers' gauge, given back once its worker is gone, before
    /// the report), or its wait for one when held ahead.
    pub place: std::sync::Mutex<Place>,
    pub shared: Arc<Shared>,
    pub generation: Arc<Generation>,
    pub job: LeasedJob,
    pub stop: CancellationToken,
}

impl JobTask {
    pub async fn run(mut self) {
        let span = tracing::info_span!("job", job_id = self.job.id, job_name = %self.job.name);
        let held = matches!(self.place.get_mut(), Ok(Place::Held(..)));
        let on_board = Arc::new(self.shared.board.running(self.job.id, &self.job.name, held));
        self.run_job(on_board).instrument(span).await
    }

    /// Which run of the job this is: the server's count where it keeps one
    /// (a jobmgr server counts no attempt for a no-worker hand-back), else
    /// one more than the last failure recorded in the job's data.
    fn attempt(&self) -> i64 {
        if self.job.handout.contains_key("attempt") {
            return self.job.attempt.max(1);
        }
        self.job
            .data
            .get(DETAILS_KEY)
            .and_then(|d| d.get("attempt"))
            .and_then(Value::as_i64)
            .map_or(1, |a| a.saturating_add(1).max(1))
    }

    /// Whether the job repeats.
    fn repeats(&self) -> bool {
        self.job
            .handout
            .get("repeat")
            .and_then(Value::as_str)
            .is_some_and(|r| !r.is_empty())
    }

    async fn run_job(mut self, on_board: Arc<super::status::OnBoard>) {
        let attempt = self.attempt();
        let started = std::time::Instant::now();
        let retry = self.job_settings().retry;
        let facts = JobFacts {
            data: &self.job.data,
            progressed: false,
            attempt,
            repeats: self.repeats(),
        };
        let mut no_worker = false;
        let (decision, run) = match self.run_worker(facts, on_board).await {
            Ok(Outcome::Decided(decision, run)) => (decision, run),
            Ok(Outcome::WentBack(why)) => {
                return held::go_back(&self.shared, &self.job, &why).await;
            }
            Err(why) => {
                if let NotRun::Busy(reason) = &why {
                    self.shared.back_off(reason);
                }
                no_worker = matches!(why, NotRun::NoWorker(_));
                (report::decide_not_run(&why, facts, &retry), None)
            }
        };
        // Offered to the fetch that the freed slot brings (before the slot
        // is freed, so that the fetch finds it).
        if let Some(report) = &decision.report {
            self.shared.source.offer_report(
                self.job.id,
                self.job.lease.as_deref(),
                report,
                run.as_ref(),
            );
        }
        // Nothing of the worker is left: the next job may start while this
        // one's report is on its way.
        let place = self.place.get_mut().unwrap_or_else(|e| e.into_inner());
        drop(std::mem::replace(place, Place::Left));
        let elapsed = started.elapsed();
        let handed_back = no_worker
            && matches!(
                decision.report,
                Some(Report::Retry {
                    ignore_repeat: true,
                    ..
                })
            );
        match &decision.report {
            Some(Report::Finish { .. }) => {
                tracing::info!(?elapsed, attempt, "{}", decision.summary)
            }
            // A job handed back for want of its worker comes again every
            // few seconds: said once a minute per name.
            _ if handed_back => {
                match self
                    .shared
                    .no_worker_lines
                    .say(&self.job.name, std::time::Instant::now())
                {
                    Some(0) => tracing::warn!(?elapsed, attempt, "{}", decision.summary),
                    Some(held) => tracing::warn!(
                        ?elapsed,
                        attempt,
                        "{} ({held} more such hand-backs of {} in the last minute not logged)",
                        decision.summary,
                        self.job.name
                    ),
                    None => tracing::debug!(?elapsed, attempt, "{}", decision.summary),
                }
            }
            // The worker's own last word on why, when it said one.
            _ => match run
                .as_ref()
                .and_then(|run| run.stderr.as_deref())
                .and_then(crate::server::ledger::failure::last_line)
            {
                Some(stderr) => {
                    tracing::warn!(?elapsed, attempt, %stderr, "{}", decision.summary)
                }
                None => tracing::warn!(?elapsed, attempt, "{}", decision.summary),
            },
        }
        if let Some(report) = decision.report {
            self.deliver(report, run).await;
        }
    }

    /// Which settings apply: 0 for the defaults, `i + 1` for the `i`-th
    /// `[[job]]` table.
    fn rule(&self) -> usize {
        self.generation.settings.for_job(&self.job.name).0
    }

    /// The settings that apply to this job.
    fn job_settings(&self) -> &JobSettings {
        self.generation.settings.for_job(&self.job.name).1
    }

    async fn run_worker(
        &self,
        facts: JobFacts<'_>,
        on_board: Arc<super::status::OnBoard>,
    ) -> Result<Outcome, NotRun> {
        let settings = &self.generation.settings;
        let job_settings = self.job_settings();

        // Keep the lease from the start, also while waiting for a slot. The
        // renewals and the progress updates are futures of this task, as is
        // the worker's run: no task of their own per job.
        let lease_lost = AtomicBool::new(false);
        let worker_stop = self.stop.child_token();
        let (progress_tx, progress_rx) = mpsc::channel(64);
        let watchers = CancellationToken::new();
        let heartbeat = heartbeat(
            &self.shared,
            &self.job,
            settings.lease,
            job_settings.kill_grace,
            &lease_lost,
            worker_stop.clone(),
            watchers.clone(),
        );
        let progress = forward_progress(&self.shared, &self.job, progress_rx, watchers.clone());
        let run = async {
            let _stop_watchers = watchers.clone().drop_guard();
            self.run_leased(
                facts.attempt,
                &lease_lost,
                worker_stop,
                progress_tx,
                on_board,
            )
            .await
        };
        let (ran, (), progressed) = tokio::join!(run, heartbeat, progress);
        let Ran {
            finished,
            oom,
            starved,
            worker,
            run_started,
        } = match ran? {
            Leased::Ran(ran) => ran,
            Leased::NotStarted(decision) => return Ok(Outcome::Decided(decision, None)),
            Leased::WentBack(why) => return Ok(Outcome::WentBack(why)),
        };
        // The report starts from the latest data the worker reported, not
        // from the data as handed out (which would undo its progress).
        let facts = match &progressed {
            Some(data) => JobFacts {
                data,
                progressed: true,
                ..facts
            },
            None => facts,
        };
        let mut finished =
            finished.map_err(|e| not_started(&e, "cannot start or wait for the worker"))?;
        finished.oom = oom;
        if finished.killed {
            crate::metrics::kill_escalated();
        }
        for stream in [&finished.stdout, &finished.stderr] {
            if stream.truncated {
                crate::metrics::output_truncated();
            }
        }
        let cap = settings.output_cap as u64;
        if finished.stdout.total > cap || finished.stderr.total > cap {
            tracing::warn!(
                stdout_bytes = finished.stdout.total,
                stderr_bytes = finished.stderr.total,
                cap = settings.output_cap,
                "worker output was larger than the cap; head and tail kept"
            );
        }
        if !finished.stderr.text.is_empty() {
            tracing::debug!(stderr = %finished.stderr.text, "worker stderr");
        }
        let draining = self.shared.draining.load(Ordering::SeqCst) && self.stop.is_cancelled();
        let decision = report::decide(
            &finished,
            facts,
            &job_settings.retry,
            lease_lost.load(Ordering::SeqCst),
            draining,
        );
        crate::metrics::job_ended(
            &worker,
            decision.report.as_ref().map_or("lease_lost", |r| r.kind()),
            run_started.elapsed().as_secs_f64(),
            finished.ending == process::Ending::TimedOut,
        );
        if let Some(starved) = starved {
            crate::metrics::job_starved(&worker, starved.as_secs_f64());
            tracing::debug!(
                starved_ms = starved.as_millis() as u64,
                "time the job waited for a CPU"
            );
        }
        Ok(Outcome::Decided(
            decision,
            Some(report::run_facts(&finished)),
        ))
    }

    /// The job's run under its lease: a slot, its worker, a uid, a scratch
    /// directory and sandbox, the worker to its end, and what it leaves
    /// removed.
    async fn run_leased(
        &self,
        attempt: i64,
        lease_lost: &AtomicBool,
        worker_stop: CancellationToken,
        progress_tx: mpsc::Sender<Data>,
        on_board: Arc<super::status::OnBoard>,
    ) -> Result<Leased, NotRun> {
        let settings = &self.generation.settings;
        let job_settings = self.job_settings();
        let sandbox = &self.generation.sandboxes[self.rule()];

        // Held ahead: wait for a worker slot.
        let waits = held::Waits {
            hold: settings.gate.fetch_ahead_hold,
            limits: &settings.gate,
            drain: &self.shared.release_held,
            stop: &worker_stop,
        };
        match held::take_place(&self.place, &self.shared, waits, &on_board).await {
            Ok(()) => {}
            Err(NoPlace::WentBack(why)) => return Ok(Leased::WentBack(why)),
            // Stopped while held, its lease kept: back as it was.
            Err(NoPlace::Stopped) if !lease_lost.load(Ordering::SeqCst) => {
                return Ok(Leased::WentBack(WentBack::Draining));
            }
            Err(NoPlace::Stopped) => return Ok(stopped_waiting(lease_lost, "a worker slot")),
        }

        // A `[[job]]` table's max-concurrency: wait for a slot.
        let _slot = match &self.generation.slots[self.rule()] {
            Some(slots) => {
                let slots = Arc::clone(slots);
                tokio::select! {
                    permit = slots.acquire_owned() => permit.ok(),
                    _ = worker_stop.cancelled() => return Ok(stopped_waiting(lease_lost, "a slot")),
                }
            }
            None => None,
        };

        let worker_path =
            WorkerPath::new(&settings.worker_path).map_err(|e| NotRun::NoWorker(e.to_string()))?;
        let resolved = match job_settings.kind {
            WorkerKind::Exec => worker_path.resolve(&self.job.name),
            WorkerKind::BwmPhp => worker_path.resolve_class(&self.job.name),
        };
        let program = resolved.map_err(|e| match e {
            NoWorker::BadName(_) | NoWorker::NotAClass(_) => NotRun::BadName(e.to_string()),
            e => NotRun::NoWorker(e.to_string()),
        })?;
        // A uid of the job's own, where jobs get one: wait for a free one.
        let claimed = match sandbox.uids() {
            Some(pool) => match uids::claim(pool, &worker_stop).await {
                Ok(Some(claimed)) => Some(claimed),
                Ok(None) => return Ok(stopped_waiting(lease_lost, "a uid")),
                Err(e) => return Err(not_started(&e, "cannot claim a uid for the job")),
            },
            None => None,
        };
        let credentials = sandbox.credentials(claimed.as_ref());
        let scratch = JobScratch::create(&settings.scratch_dir, self.job.id).map_err(|e| {
            not_started(
                &e,
                &format!(
                    "cannot create a scratch directory in {}",
                    settings.scratch_dir.display()
                ),
            )
        })?;
        let owner = credentials.as_ref().map(|c| (c.uid, c.gid));
        super::sandbox::hand_over(scratch.path(), owner).map_err(|e| {
            not_started(&e, "cannot give the scratch directory to the worker's user")
        })?;
        let mut job_sandbox = sandbox
            .job(self.job.id, scratch.path(), credentials)
            .map_err(|e| not_started(&e, "cannot prepare the job's sandbox"))?;
        let mut stdin_object = self.job.handout.clone();
        stdin_object.remove("lease");
        stdin_object.remove("leaseExpires");
        stdin_object.remove("leaseMs");
        let mut stdin = serde_json::to_vec(&stdin_object).unwrap_or_default();
        stdin.push(b'\n');

        let (executable, args, runner_env) = self.command(&program);
        let mut env = self.environment(attempt, scratch.path());
        env.extend(runner_env);
        // Under the back-off from its start to its end: frozen while the
        // site is pressed, thawed before it is stopped.
        let backoff = self.shared.backoff.register(
            super::backoff::JobFacts {
                id: self.job.id,
                name: self.job.name.clone(),
                tree: job_sandbox.tree(),
                on_board: Arc::clone(&on_board),
            },
            self.shared.drained.clone(),
        );
        let spec = WorkerSpec {
            program: executable,
            args,
            env,
            cwd: scratch.path().to_path_buf(),
            stdin,
            timeout: job_settings.timeout,
            grace: job_settings.kill_grace,
            output_cap: settings.output_cap,
            on_spawn: Some(process::SpawnHook(Arc::new(move |pid| {
                on_board.started(pid)
            }))),
            freeze: Some(backoff.freeze()),
        };

        tracing::info!(worker = %program.display(), attempt, "starting worker");
        let worker = match job_settings.kind {
            WorkerKind::Exec => program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            WorkerKind::BwmPhp => WorkerPath::worker_name(&self.job.name)
                .unwrap_or_default()
                .to_string(),
        };
        let due = self
            .job
            .handout
            .get("nextRun")
            .and_then(Value::as_str)
            .and_then(crate::protocol::Timestamp::parse);
        let latency =
            due.map(|due| (crate::protocol::Timestamp::now().0 - due.0).max(0) as f64 / 1000.0);
        crate::metrics::job_started(&worker, latency);
        let run_started = std::time::Instant::now();
        let finished = process::run(
            &self.shared.launcher,
            spec,
            worker_stop,
            Some(progress_tx),
            job_sandbox.take_setup(),
            job_sandbox.tree(),
        )
        .await;
        drop(backoff);
        let oom = job_sandbox.oom_killed();
        let starved = job_sandbox.starved();
        // Empty cgroups (the usual end) are removed here; killing what is
        // left and waiting for it to go is not for the async threads.
        let emptied = job_sandbox.ended_empty()
            || tokio::task::spawn_blocking(move || job_sandbox.end())
                .await
                .unwrap_or(false);
        // The scratch directory (the job's uid's own) goes before the uid
        // does, so that no later job of the uid finds it; off the async
        // threads unless it is empty.
        scratch.remove().await;
        // Nothing of the job's uid outlives it; only then may another job
        // have the uid. Where the job's cgroups were seen empty, nothing of
        // it is left to look for.
        match claimed {
            Some(claimed) if emptied => claimed.release_emptied(),
            Some(claimed) => {
                let uid = claimed.uid();
                let launcher = self.shared.launcher.clone();
                let left = tokio::task::spawn_blocking(move || claimed.release(&launcher))
                    .await
                    .unwrap_or_default();
                if !left.is_empty() {
                    tracing::warn!(
                        uid,
                        pids = ?left,
                        "processes of the job's uid outlived it and could not be killed; no job gets this uid until they are gone"
                    );
                }
            }
            None => {}
        }
        Ok(Leased::Ran(Ran {
            finished,
            oom,
            starved,
            worker,
            run_started,
        }))
    }

    /// What to execute for the worker file `program`: itself, or for a PHP
    /// class the interpreter with the runner, and the runner's variables.
    fn command(
        &self,
        program: &std::path::Path,
    ) -> (
        std::path::PathBuf,
        Vec<std::ffi::OsString>,
        Vec<(String, String)>,
    ) {
        let job_settings = self.job_settings();
        let generation = &self.generation;
        let (WorkerKind::BwmPhp, Some(php), Some(runner)) = (
            job_settings.kind,
            &generation.settings.php,
            &generation.php_runner,
        ) else {
            return (program.to_path_buf(), Vec::new(), Vec::new());
        };
        let access = &self.shared.access;
        let job_token = access
            .token
            .as_ref()
            .zip(self.job.lease.as_deref())
            .map(|(token, lease)| crate::auth::job_token::mint(token, self.job.id, lease));
        let class = WorkerPath::worker_name(&self.job.name).unwrap_or_default();
        let invocation = super::bwm_php::invocation(
            php,
            runner,
            class,
            program,
            job_settings.php_bootstrap.as_deref(),
            php.bedrock.as_deref().or(access.bedrock.as_deref()),
            job_token,
        );
        (invocation.program, invocation.args, invocation.env)
    }

    /// The worker's whole environment: the allowed variables of the
    /// supervisor's own, the configured extras, and the job's.
    fn environment(&self, attempt: i64, scratch: &std::path::Path) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for name in &self.generation.settings.env_allow {
            if let Ok(value) = std::env::var(name) {
                env.push((name.clone(), value));
            }
        }
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
        }
        env.extend(self.job_settings().env.iter().cloned());
        let scratch = scratch.display().to_string();
        env.push(("HOME".into(), scratch.clone()));
        env.push(("TMPDIR".into(), scratch));
        env.push(("JOBMGR_JOB_ID".into(), self.job.id.to_string()));
        env.push(("JOBMGR_JOB_NAME".into(), self.job.name.clone()));
        env.push(("JOBMGR_ATTEMPT".into(), attempt.to_string()));
        env.push(("JOBMGR_PROGRESS_FD".into(), PROGRESS_FD.to_string()));
        env
    }

    /// Sends the report; if the server is unreachable, spools it for the
    /// courier.
    async fn deliver(&self, report: Report, run: Option<RunFacts>) {
        let lease = self.job.lease.as_deref();
        match self
            .shared
            .source
            .report_run(self.job.id, lease, &report, run.as_ref())
            .await
        {
            Ok(()) => {}
            Err(SourceError::Unavailable(error)) => {
                let spooled = Spooled {
                    job_id: self.job.id,
                    job_name: self.job.name.clone(),
                    lease: self.job.lease.clone(),
                    report,
                    run,
                };
                match self.shared.spool.put(&spooled) {
                    Ok(path) => {
                        tracing::warn!(%error, spool = %path.display(), "server unavailable; report spooled for later delivery");
                        self.shared.courier.notify_one();
                    }
                    Err(io) => {
                        tracing::error!(%error, %io, "server unavailable and the report could not be spooled; the job returns when its lease lapses")
                    }
                }
            }
            Err(SourceError::LeaseLost(_)) => {
                tracing::warn!(
                    report = report.kind(),
                    "server refused the report: the lease was lost (the job was handed to someone else)"
                )
            }
            Err(error) => {
                tracing::warn!(report = report.kind(), %error, "server refused the report")
            }
        }
    }
}

/// How a job's run under its lease went.
enum Leased {
    /// Its worker ran (or could not be started or waited for).
    Ran(Ran),
    /// It was stopped before its worker started.
    NotStarted(Decision),
    /// Held ahead, it goes back to the queue unstarted.
    WentBack(WentBack),
}

/// What became of a job.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per job and matched at once, never stored"
)]
enum Outcome {
    /// Its report is decided (none when its lease was lost).
    Decided(Decision, Option<RunFacts>),
    /// Held ahead, it goes back to the queue unstarted.
    WentBack(WentBack),
}

/// A worker that ran, its cgroups, scratch directory and uid gone.
struct Ran {
    finished: std::io::Result<process::Finished>,
    /// Whether the kernel killed part of the job for lack of memory.
    oom: bool,
    /// How long it waited for a CPU, where its cgroup tells.
    starved: Option<std::time::Duration>,
    /// The worker's name, for the metrics.
    worker: String,
    run_started: std::time::Instant,
}

/// A job stopped while waiting for `what` before its worker started: told
/// nothing if its lease was lost, handed back otherwise.
fn stopped_waiting(lease_lost: &AtomicBool, what: &str) -> Leased {
    Leased::NotStarted(if lease_lost.load(Ordering::SeqCst) {
        Decision {
            report: None,
            summary: format!("the lease was lost while waiting for {what}"),
        }
    } else {
        Decision {
            report: Some(Report::Retry {
                delay_secs: 0,
                ignore_repeat: true,
                data: None,
                name: None,
                next_run: None,
            }),
            summary: format!("stopped by shutdown while waiting for {what}; handed back"),
        }
    })
}

/// Sorts a failure to start a worker: out of processes, memory or file
/// descriptors, or cgroups that cannot be made, is the machine's state
/// (back off); anything else is the worker's (a missing interpreter, no
/// permission to execute, …).
fn not_started(error: &std::io::Error, what: &str) -> NotRun {
    use nix::libc::{EAGAIN, EMFILE, ENFILE, ENOMEM};
    let reason = format!("{what}: {error}");
    match error.raw_os_error() {
        Some(EAGAIN | ENOMEM | EMFILE | ENFILE) => NotRun::Busy(reason),
        _ if super::sandbox::CgroupsUnavailable::is(error) => NotRun::Busy(reason),
        _ => NotRun::CannotStart(reason),
    }
}

/// Renews the lease often enough for the term the server granted (for a
/// job with `retryAfter` that is its `retryAfter`, whatever was asked). A
/// lost lease stops the worker. A renewal that fails (the server down or
/// slow) is tried again sooner, several times, so that a short outage costs
/// no run; only a lease that could not be renewed in time stops the worker,
/// while the lease still holds, leaving it the kill grace (or a third of the
/// term, if less) to end before anyone else can be handed the job.
async fn heartbeat(
    shared: &Shared,
    job: &LeasedJob,
    asked: Duration,
    grace: Duration,
    lost: &AtomicBool,
    worker_stop: CancellationToken,
    done: CancellationToken,
) {
    let Some(_) = &job.lease else {
        if let Some(term) = job.lease_term {
            stop_before_reissue(term, grace, lost, worker_stop, done).await;
        }
        return;
    };
    let granted = job.lease_term.unwrap_or(asked);
    let every = (granted.min(asked) / 3).max(Duration::from_millis(100));
    let margin = grace.min(granted / 3);
    let mut valid_until = tokio::time::Instant::now() + granted;
    let mut wait = every;
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let sent = tokio::time::Instant::now();
        // The answer must come while there is still time to stop the
        // worker before the lease lapses; half of that, so that a renewal
        // that hangs leaves room for another try.
        let budget = valid_until
            .saturating_duration_since(sent)
            .saturating_sub(margin);
        let attempt = (budget / 2).max(Duration::from_millis(500)).min(budget);
        let outcome = match tokio::time::timeout(attempt, shared.source.heartbeat(job)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SourceError::Unavailable(
                "the renewal did not answer in time".into(),
            )),
        };
        match outcome {
            Ok(()) => {
                crate::metrics::lease_renewal("ok");
                valid_until = sent + granted;
                wait = every;
            }
            Err(SourceError::LeaseLost(_)) => {
                crate::metrics::lease_renewal("lost");
                tracing::warn!(
                    "lease lost: the job was put back or handed to someone else; stopping the worker"
                );
                lost.store(true, Ordering::SeqCst);
                worker_stop.cancel();
                return;
            }
            Err(error) => {
                crate::metrics::lease_renewal("failed");
                let left = valid_until
                    .saturating_duration_since(tokio::time::Instant::now())
                    .saturating_sub(margin);
                if left.is_zero() {
                    tracing::warn!(%error, "lease could not be renewed and lapses soon; stopping the worker");
                    lost.store(true, Ordering::SeqCst);
                    worker_stop.cancel();
                    return;
                }
                // Try again soon, several times before the lease would
                // lapse: a short outage of the server costs no run.
                wait = (left / 4).clamp(Duration::from_millis(100), every);
                tracing::warn!(%error, retry_in = ?wait, "lease renewal failed; trying again");
            }
        }
    }
}

/// For a job handed out without a lease but with a term after which the
/// server hands it out again (a real Bedrock's `retryAfter`): the term
/// cannot be renewed, so the worker is stopped before it passes, leaving
/// it the kill grace (or a third of the term, if less) to end, and the job
/// runs again from the server rather than twice at once.
async fn stop_before_reissue(
    term: Duration,
    grace: Duration,
    lost: &AtomicBool,
    worker_stop: CancellationToken,
    done: CancellationToken,
) {
    let margin = grace.min(term / 3);
    tokio::select! {
        _ = done.cancelled() => {}
        _ = tokio::time::sleep(term.saturating_sub(margin)) => {
            tracing::warn!(
                retry_after = ?term,
                "the job's retryAfter passes soon and this server gives no leases, so it will hand the job out again; stopping the worker so that it does not run twice (give the job a retryAfter longer than its run)"
            );
            lost.store(true, Ordering::SeqCst);
            worker_stop.cancel();
        }
    }
}

/// Forwards progress objects as UpdateJob, merged into the job's data and
/// at most one per [`PROGRESS_EVERY`]; the latest wins. Merged data the
/// server would refuse (over [`MAX_DATA_BYTES`]) is not kept: progress
/// stops there for this run, and what was merged before stands. Returns
/// the latest data merged (sent or not), or `None` when the worker
/// reported no progress that was kept: the job's report starts from it.
async fn forward_progress(
    shared: &Shared,
    job: &LeasedJob,
    mut updates: mpsc::Receiver<Data>,
    done: CancellationToken,
) -> Option<Data> {
    let mut merged = Merged::new(&job.data);
    let mut pending = false;
    let mut last_sent = tokio::time::Instant::now() - PROGRESS_EVERY;
    loop {
        let next_send = last_sent + PROGRESS_EVERY;
        if merged.closed && !pending {
            // The worker closed fd 3 and everything was sent.
            done.cancelled().await;
            return merged.latest;
        }
        tokio::select! {
            _ = done.cancelled() => {
                // What the worker wrote last is still queued: it counts.
                while !merged.closed && let Ok(update) = updates.try_recv() {
                    merged.add(update, &mut updates);
                }
                return merged.latest;
            }
            update = updates.recv(), if !merged.closed => match update {
                Some(update) => pending = merged.add(update, &mut updates),
                None => merged.closed = true,
            },
            _ = tokio::time::sleep_until(next_send), if pending => {
                if let Value::Object(map) = &merged.data {
                    match shared.source.update(job, map).await {
                        Ok(()) => {}
                        Err(SourceError::LeaseLost(_)) => {
                            tracing::debug!("progress not delivered: the lease was lost");
                            return merged.latest;
                        }
                        Err(error) => tracing::debug!(%error, "progress update not delivered"),
                    }
                }
                pending = false;
                last_sent = tokio::time::Instant::now();
            }
        }
    }
}

/// A job's data with the worker's progress merged in.
struct Merged {
    /// The data with every update merged (`Null` once over the cap).
    data: Value,
    /// The latest merged data within the cap, once there was progress.
    latest: Option<Data>,
    size: MergedSize,
    /// No more progress is taken.
    closed: bool,
}

impl Merged {
    fn new(data: &Data) -> Self {
        Merged {
            data: Value::Object(data.clone()),
            latest: None,
            size: MergedSize::new(data),
            closed: false,
        }
    }

    /// Merges an update; returns whether there is something to send. Past
    /// the cap, takes no more progress for this run.
    fn add(&mut self, update: Data, updates: &mut mpsc::Receiver<Data>) -> bool {
        self.size.add(&update);
        json_patch::merge(&mut self.data, &Value::Object(update));
        if self.size.over(&self.data) {
            tracing::warn!(
                "the worker's progress would make the job's data larger than 1 MiB; \
                 no more progress is forwarded for this run"
            );
            self.data = Value::Null;
            updates.close();
            self.closed = true;
            return false;
        }
        if let Value::Object(map) = &self.data {
            self.latest = Some(map.clone());
        }
        true
    }
}

/// A bound on the size of progress merged into a job's data, kept without
/// writing the data out on every update: each update adds at most its own
/// length, and only when that bound passes the cap is the data measured.
struct MergedSize {
    bound: usize,
}

impl MergedSize {
    fn new(data: &Data) -> Self {
        MergedSize {
            bound: data_len(data),
        }
    }

    /// Counts an update about to be merged.
    fn add(&mut self, update: &Data) {
        self.bound = self.bound.saturating_add(data_len(update));
    }

    /// Whether the merged `data` is over the cap (measuring it only when
    /// the bound says it may be).
    fn over(&mut self, data: &Value) -> bool {
        if self.bound <= MAX_DATA_BYTES {
            return false;
        }
        self.bound = match data {
            Value::Object(map) => data_len(map),
            _ => usize::MAX,
        };
        self.bound > MAX_DATA_BYTES
    }
}
