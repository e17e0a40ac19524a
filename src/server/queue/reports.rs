//! What the queue answers from its ledger: statistics shaped for charts,
//! per name and per supervisor, the worker registry, failure groups and
//! their bulk actions, a job's history, and the purge that retention asks
//! for (run every `purge_every`).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::record;
use super::{Queue, rules};
use crate::protocol::view::query_json;
use crate::protocol::{Job, JobError, JobId, NamePattern, Timestamp, WorkerInfo};
use crate::server::ledger::failure;
use crate::server::ledger::retention::millis;
use crate::server::ledger::utilisation::heard_span;
use crate::server::ledger::{
    ArchivedJob, Attempt, FailureGroup, HOUR_MS, PurgeCounts, StatsRow, WorkerStatsRow,
};
use crate::server::store::{ArchiveQuery, PurgeLimits};

/// One day in milliseconds.
const DAY_MS: i64 = 24 * HOUR_MS;

/// The most points a statistics answer fills in per name.
const MAX_POINTS: i64 = 10_000;

/// A chart period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// One point per hour.
    Hour,
    /// One point per day (UTC).
    Day,
}

impl Period {
    /// Parses `hour` or `day`.
    pub fn parse(text: &str) -> Option<Period> {
        match text {
            "hour" => Some(Period::Hour),
            "day" => Some(Period::Day),
            _ => None,
        }
    }

    fn millis(self) -> i64 {
        match self {
            Period::Hour => HOUR_MS,
            Period::Day => DAY_MS,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
        }
    }

    /// The window shown when none is asked for: a day of hours, or 30 days.
    pub fn default_span(self) -> i64 {
        match self {
            Period::Hour => DAY_MS,
            Period::Day => 30 * DAY_MS,
        }
    }

    /// The window `[from, to)` of whole periods for the times asked (by
    /// default, up to the end of the current period and back
    /// [`Period::default_span`]); an error for people when it is empty or
    /// holds more than 10,000 points.
    pub fn window(
        self,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(Timestamp, Timestamp), String> {
        let step = self.millis();
        let floor = |t: Timestamp| Timestamp(t.0.div_euclid(step) * step);
        let to = floor(to.unwrap_or_else(|| now.plus_millis(step)));
        // Not before the earliest time that can be written (years 0000 on).
        let from = floor(
            from.unwrap_or(Timestamp(
                to.0.saturating_sub(self.default_span())
                    .max(Timestamp::EARLIEST.0),
            )),
        );
        if from >= to {
            return Err(format!(
                "from must be at least one {} before to",
                self.name()
            ));
        }
        if (to.0 - from.0) / step > MAX_POINTS {
            return Err(format!(
                "the window holds more than {MAX_POINTS} {}s; narrow from and to, or use period=day",
                self.name()
            ));
        }
        Ok((from, to))
    }
}

/// A job's history: the job if still queued, its archive entry if it
/// ended, and every recorded attempt.
#[derive(Debug, Clone)]
pub struct History {
    /// The job as it is now.
    pub job: Option<Job>,
    /// The job as it ended.
    pub archived: Option<ArchivedJob>,
    /// A window of its attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// How many attempts it has in all.
    pub attempts_total: u64,
    /// How many of its latest attempts the window skipped.
    pub skipped: usize,
}

impl History {
    /// The history for the API: `attemptsTotal` always, and `nextSkip`
    /// when older attempts than the window's remain.
    pub fn to_json(&self, id: JobId) -> Value {
        let mut answer = json!({
            "jobID": id,
            "job": self.job.as_ref().map(|j| Value::Object(query_json(j))),
            "archived": self.archived.as_ref().map(ArchivedJob::to_json),
            "attempts": self.attempts.iter().map(Attempt::to_json).collect::<Vec<_>>(),
            "attemptsTotal": self.attempts_total,
        });
        let seen = self.skipped as u64 + self.attempts.len() as u64;
        if seen < self.attempts_total {
            answer["nextSkip"] = json!(seen);
        }
        answer
    }
}

/// Statistics of a window for a page (see [`Queue::stats_digest`]).
#[derive(Debug, Clone)]
pub struct StatsDigest {
    /// The window's start.
    pub from: Timestamp,
    /// The window's end.
    pub to: Timestamp,
    /// A point for every period, summed over the names (histograms too).
    pub points: Vec<StatsRow>,
    /// The sum over the window and the names (histograms too).
    pub total: StatsRow,
    /// The busiest names, each with its sums over the window (no
    /// histograms), busiest first.
    pub names: Vec<StatsRow>,
    /// How many names had statistics in the window.
    pub name_count: usize,
}

/// A supervisor as the registry shows it.
#[derive(Debug, Clone)]
pub struct WorkerView {
    /// What it said last.
    pub info: WorkerInfo,
    /// When first seen.
    pub first_seen: Timestamp,
    /// When last seen.
    pub last_seen: Timestamp,
    /// Whether it was seen within `worker_gone_after`.
    pub gone: bool,
    /// The jobs it holds.
    pub jobs: Vec<JobId>,
    /// Its jobs' running time over the last hour, in ms.
    pub busy_ms: i64,
    /// Busy time over capacity for the part of the last hour it was seen.
    pub utilisation: Option<f64>,
}

impl WorkerView {
    /// The worker for the API.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.info.id,
            "host": self.info.host,
            "pid": self.info.pid,
            "capacity": self.info.capacity,
            "running": self.info.running,
            "frozen": self.info.frozen,
            "load": self.info.load,
            "firstSeen": self.first_seen.to_string(),
            "lastSeen": self.last_seen.to_string(),
            "state": if self.gone { "gone" } else { "active" },
            "jobs": self.jobs,
            "busySecs": self.busy_ms as f64 / 1000.0,
            "utilisation": self.utilisation,
        })
    }
}

impl FailureGroup {
    /// The group for the API.
    pub fn to_json(&self) -> Value {
        json!({
            "group": self.group,
            "count": self.count,
            "first": self.first.to_string(),
            "last": self.last.to_string(),
        })
    }
}

impl Queue {
    /// Records a supervisor's presence.
    pub async fn see_worker(&self, worker: WorkerInfo) -> Result<(), JobError> {
        worker.check()?;
        self.write(move |tx| record::heard_from(tx, &worker.id, Some(&worker), None))
            .await
    }

    /// Statistics per name and period over `[from, to)` (a window from
    /// [`Period::window`]), as chart series with a point for every period, a
    /// total over all names, and the queue's depth by state.
    pub async fn stats(
        &self,
        pattern: Option<NamePattern>,
        period: Period,
        window: (Timestamp, Timestamp),
    ) -> Result<Value, JobError> {
        self.stats_of(pattern, period, window).await
    }

    /// Statistics over `[from, to)` (a window from [`Period::window`]) for
    /// a page: summed over the names `pattern` matches, a point for every
    /// period, and per name its sums over the window, the `max_names`
    /// busiest only. Unlike [`Queue::stats`] it builds no series per name
    /// and never counts the queue, so its cost follows the rows stored, not
    /// names × periods: a million names cost a pass over their rows.
    pub async fn stats_digest(
        &self,
        pattern: Option<NamePattern>,
        period: Period,
        (from, to): (Timestamp, Timestamp),
        max_names: usize,
    ) -> Result<StatsDigest, JobError> {
        let step = period.millis();
        let rows = self
            .read(move |tx| tx.ledger().stats(pattern.as_ref(), from, to))
            .await?;
        let mut points: Vec<StatsRow> = (0..(to.0 - from.0) / step)
            .map(|i| StatsRow {
                hour: from.0 + i * step,
                ..StatsRow::default()
            })
            .collect();
        let mut total = StatsRow::default();
        let mut per_name: BTreeMap<&str, StatsRow> = BTreeMap::new();
        for row in &rows {
            let slot = usize::try_from((row.hour - from.0).div_euclid(step)).ok();
            if let Some(point) = slot.and_then(|i| points.get_mut(i)) {
                point.merge(row);
            }
            total.merge(row);
            per_name
                .entry(row.name.as_str())
                .or_insert_with(|| StatsRow {
                    name: row.name.clone(),
                    ..StatsRow::default()
                })
                .merge_figures(row);
        }
        let name_count = per_name.len();
        let mut names: Vec<StatsRow> = per_name.into_values().collect();
        let volume = |r: &StatsRow| r.added + r.started + r.finished + r.failed + r.retried;
        names.sort_by(|a, b| volume(b).cmp(&volume(a)).then_with(|| a.name.cmp(&b.name)));
        names.truncate(max_names);
        total.hour = from.0;
        Ok(StatsDigest {
            from,
            to,
            points,
            total,
            names,
            name_count,
        })
    }

    async fn stats_of(
        &self,
        pattern: Option<NamePattern>,
        period: Period,
        (from, to): (Timestamp, Timestamp),
    ) -> Result<Value, JobError> {
        let step = period.millis();
        let wanted = pattern.clone();
        let (rows, depth) = self
            .read(move |tx| {
                let rows = tx.ledger().stats(wanted.as_ref(), from, to)?;
                let depth = tx.count_by_name()?;
                Ok((rows, depth))
            })
            .await?;
        let mut by_name: BTreeMap<String, BTreeMap<i64, StatsRow>> = BTreeMap::new();
        let mut total = StatsRow::default();
        for row in &rows {
            let bucket = row.hour.div_euclid(step) * step;
            by_name
                .entry(row.name.clone())
                .or_default()
                .entry(bucket)
                .or_insert_with(|| StatsRow {
                    name: row.name.clone(),
                    hour: bucket,
                    ..StatsRow::default()
                })
                .merge(row);
            total.merge(row);
        }
        let series: Vec<Value> = by_name
            .into_iter()
            .map(|(name, points)| {
                let points: Vec<Value> = (0..(to.0 - from.0) / step)
                    .map(|i| {
                        let at = from.0 + i * step;
                        points.get(&at).cloned().unwrap_or(StatsRow {
                            hour: at,
                            ..StatsRow::default()
                        })
                    })
                    .map(|row| row.to_json())
                    .collect();
                json!({"name": name, "points": points})
            })
            .collect();
        let mut queue = Map::new();
        for (name, state, count) in depth {
            if pattern.as_ref().is_none_or(|p| p.matches(&name)) {
                let entry = queue
                    .entry(name)
                    .or_insert_with(|| Value::Object(Map::new()));
                entry[state.as_str()] = json!(count);
            }
        }
        total.hour = from.0;
        let mut total = total.to_json();
        if let Value::Object(map) = &mut total {
            map.remove("time");
        }
        Ok(json!({
            "period": period.name(),
            "from": from.to_string(),
            "to": to.to_string(),
            "series": series,
            "total": total,
            "queue": queue,
        }))
    }

    /// Statistics per supervisor and period over `[from, to)` (a window
    /// from [`Period::window`]), as chart series with a point for every
    /// period and a total per supervisor. Runs still going and the
    /// capacity offered since each supervisor was last heard from count up
    /// to now (up to when it was last heard from, for one that is gone).
    pub async fn worker_stats(
        &self,
        pattern: Option<NamePattern>,
        period: Period,
        (from, to): (Timestamp, Timestamp),
    ) -> Result<Value, JobError> {
        let now = self.now();
        let gone_after = millis(self.inner.config.retention.worker_gone_after);
        let wanted = pattern.clone();
        let (rows, workers, open) = self
            .read(move |tx| {
                let ledger = tx.ledger();
                Ok((
                    ledger.worker_stats(wanted.as_ref(), from, to)?,
                    ledger.workers()?,
                    ledger.open_runs(None)?,
                ))
            })
            .await?;
        let mut hours: BTreeMap<(String, i64), WorkerStatsRow> = rows
            .into_iter()
            .map(|row| ((row.worker.clone(), row.hour), row))
            .collect();
        // Stored figures reach each supervisor's last sighting; the time
        // since (to now, or nothing for one that is gone) is added live.
        let mut runs: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
        for (worker, started) in open {
            runs.entry(worker).or_default().push(started);
        }
        for row in workers {
            if !pattern.as_ref().is_none_or(|p| p.matches(&row.info.id)) {
                continue;
            }
            let (until, _) = row.heard_until(now, gone_after);
            let held = runs.remove(&row.info.id).unwrap_or_default();
            let span = (row.last_seen, until);
            for (hour, delta) in heard_span(span, row.info.capacity, held, (from, to)) {
                hours
                    .entry((row.info.id.clone(), hour))
                    .or_insert_with(|| WorkerStatsRow {
                        worker: row.info.id.clone(),
                        hour,
                        ..WorkerStatsRow::default()
                    })
                    .add(&delta);
            }
        }
        let step = period.millis();
        let mut by_worker: BTreeMap<String, BTreeMap<i64, WorkerStatsRow>> = BTreeMap::new();
        for ((worker, hour), row) in hours {
            let bucket = hour.div_euclid(step) * step;
            by_worker
                .entry(worker.clone())
                .or_default()
                .entry(bucket)
                .or_insert_with(|| WorkerStatsRow {
                    worker,
                    hour: bucket,
                    ..WorkerStatsRow::default()
                })
                .merge(&row);
        }
        let series: Vec<Value> = by_worker
            .into_iter()
            .map(|(worker, points)| {
                let mut total = WorkerStatsRow::default();
                let points: Vec<Value> = (0..(to.0 - from.0) / step)
                    .map(|i| {
                        let at = from.0 + i * step;
                        let row = points.get(&at).cloned().unwrap_or(WorkerStatsRow {
                            hour: at,
                            ..WorkerStatsRow::default()
                        });
                        total.merge(&row);
                        row.to_json()
                    })
                    .collect();
                let mut total = total.to_json();
                if let Value::Object(map) = &mut total {
                    map.remove("time");
                }
                json!({"worker": worker, "points": points, "total": total})
            })
            .collect();
        Ok(json!({
            "period": period.name(),
            "from": from.to_string(),
            "to": to.to_string(),
            "series": series,
        }))
    }

    /// The worker registry, most recently seen first.
    pub async fn workers(&self) -> Result<Vec<WorkerView>, JobError> {
        let now = self.now();
        let gone_after = millis(self.inner.config.retention.worker_gone_after);
        self.read(move |tx| {
            let window_start = now.plus_millis(-HOUR_MS);
            let mut views = Vec::new();
            for row in tx.ledger().workers()? {
                let busy_ms = tx.ledger().busy_ms(&row.info.id, window_start, now)?;
                let seen_from = row.first_seen.max(window_start);
                let (seen_to, gone) = row.heard_until(now, gone_after);
                let seen_ms = seen_to.0 - seen_from.0;
                let capacity_ms = seen_ms.saturating_mul(i64::from(row.info.capacity));
                views.push(WorkerView {
                    utilisation: (capacity_ms > 0).then(|| busy_ms as f64 / capacity_ms as f64),
                    info: row.info,
                    first_seen: row.first_seen,
                    last_seen: row.last_seen,
                    gone,
                    jobs: row.jobs,
                    busy_ms,
                });
            }
            Ok(views)
        })
        .await
    }

    /// Ended jobs in id order, as `query` asks, within about `max_bytes`
    /// of names and data (at least one job); the flag says whether the
    /// page stopped there before its limit.
    pub async fn archived_jobs(
        &self,
        query: ArchiveQuery,
        max_bytes: usize,
    ) -> Result<(Vec<ArchivedJob>, bool), JobError> {
        self.read(move |tx| {
            let jobs = tx.ledger().archived_list(&query)?;
            let mut bytes = 0usize;
            let mut kept = Vec::with_capacity(jobs.len());
            for job in jobs {
                bytes += job.name.len()
                    + serde_json::to_vec(&job.data).map_or(0, |encoded| encoded.len());
                if bytes > max_bytes && !kept.is_empty() {
                    return Ok((kept, true));
                }
                kept.push(job);
            }
            Ok((kept, false))
        })
        .await
    }

    /// Failure groups of jobs still FAILED.
    pub async fn failure_groups(&self) -> Result<Vec<FailureGroup>, JobError> {
        self.read(|tx| tx.ledger().failure_groups()).await
    }

    /// Up to `limit` FAILED jobs of a group, earliest failure first, each
    /// with its error (see [`failure::error_line`]). At most about
    /// `max_bytes` of names and data (at least one job); the flag says
    /// whether jobs were left out for that.
    pub async fn failed_jobs(
        &self,
        group: String,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Vec<(Job, Option<String>)>, bool), JobError> {
        self.read(move |tx| {
            let ids = tx.ledger().failed_in_group(&group, limit)?;
            let mut jobs = Vec::with_capacity(ids.len().min(1024));
            let mut bytes = 0usize;
            for id in ids {
                let Some(job) = tx.get(id)? else { continue };
                bytes += job.name.len()
                    + serde_json::to_vec(&job.data).map_or(0, |encoded| encoded.len());
                if bytes > max_bytes && !jobs.is_empty() {
                    return Ok((jobs, true));
                }
                let (latest, _) = tx.ledger().attempts(id, 0, 1)?;
                let error = failure::error_line(&job.data, latest.last());
                jobs.push((job, error));
            }
            Ok((jobs, false))
        })
        .await
    }

    /// The FAILED job of a group that failed last, with its latest
    /// attempt, if the group has any.
    pub async fn latest_failed(
        &self,
        group: String,
    ) -> Result<Option<(Job, Option<Attempt>)>, JobError> {
        self.read(move |tx| {
            let Some(id) = tx.ledger().latest_failed_in_group(&group)? else {
                return Ok(None);
            };
            let Some(job) = tx.get(id)? else {
                return Ok(None);
            };
            let (mut latest, _) = tx.ledger().attempts(id, 0, 1)?;
            Ok(Some((job, latest.pop())))
        })
        .await
    }

    /// Queues again up to `count` jobs of a failure group; their ids.
    pub async fn retry_failed(&self, group: String, count: usize) -> Result<Vec<JobId>, JobError> {
        self.write(move |tx| rules::retry_failed(tx, &group, count))
            .await
    }

    /// Deletes up to `count` jobs of a failure group; their ids.
    pub async fn delete_failed(&self, group: String, count: usize) -> Result<Vec<JobId>, JobError> {
        self.write(move |tx| rules::delete_failed(tx, &group, count))
            .await
    }

    /// A job's history, with up to `limit` of its attempts after skipping
    /// its `skip` latest; `NoSuchJob` when nothing is known of it.
    pub async fn history(&self, id: JobId, skip: usize, limit: usize) -> Result<History, JobError> {
        self.read(move |tx| {
            let (attempts, attempts_total) = tx.ledger().attempts(id, skip, limit)?;
            let history = History {
                job: tx.get(id)?,
                archived: tx.ledger().archived(id)?,
                attempts,
                attempts_total,
                skipped: skip,
            };
            if history.job.is_none() && history.archived.is_none() && history.attempts_total == 0 {
                return Err(JobError::NoSuchJob);
            }
            Ok(history)
        })
        .await
    }

    /// Removes what retention no longer keeps, as of now.
    pub async fn purge(&self) -> Result<PurgeCounts, JobError> {
        let retention = self.inner.config.retention;
        self.write(move |tx| {
            let now = tx.now;
            let limits = PurgeLimits {
                history_before: now.plus_millis(-millis(retention.history_max_age)),
                history_max_count: retention.history_max_count,
                stats_before: now.plus_millis(-millis(retention.stats_max_age)),
                histograms_before: now.plus_millis(-millis(retention.histogram_max_age)),
            };
            tx.store().ledger().purge(&limits)
        })
        .await
    }
}

/// Purges at start and every `purge_every` until the queue shuts down.
pub(super) async fn purge_periodically(queue: Queue) {
    queue.ready().await;
    let every = queue.inner.config.retention.purge_every;
    loop {
        match queue.purge().await {
            Ok(counts) if counts.is_empty() => {}
            Ok(counts) => tracing::info!(?counts, "purged history past its retention"),
            Err(JobError::ShuttingDown) => break,
            Err(error) => tracing::warn!(%error, "could not purge history; trying again later"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = queue.inner.shutdown.cancelled() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap()
    }

    #[test]
    fn windows_are_whole_periods_and_bounded() {
        let now = at("2026-01-02 10:30:00");
        assert_eq!(
            Period::Hour.window(None, None, now),
            Ok((at("2026-01-01 11:00:00"), at("2026-01-02 11:00:00")))
        );
        assert_eq!(
            Period::Day.window(Some(at("2026-01-01 05:00:00")), None, now),
            Ok((at("2026-01-01"), at("2026-01-03")))
        );
        assert!(
            Period::Hour
                .window(
                    Some(at("2026-01-02 10:10:00")),
                    Some(at("2026-01-02 10:50:00")),
                    now
                )
                .is_err()
        );
        assert!(
            Period::Hour
                .window(Some(at("2000-01-01")), Some(at("2026-01-01")), now)
                .is_err()
        );
        assert!(
            Period::Day
                .window(Some(at("2000-01-01")), Some(at("2026-01-01")), now)
                .is_ok()
        );
    }
}
