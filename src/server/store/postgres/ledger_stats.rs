//! The ledger's hourly statistics in PostgreSQL, per name (with their
//! histograms) and per supervisor: the half of [`LedgerTx`] for [`PgTx`]
//! that `ledger.rs` hands on. Each event is one upsert that adds to the
//! hour's row without reading it first (Welford's update done in SQL), so
//! that servers sharing the database never lose each other's increments.
//!
//! [`LedgerTx`]: crate::server::store::LedgerTx

use std::collections::BTreeMap;
use std::sync::LazyLock;

use postgres::Row;

use super::PgTx;
use super::glob::{Params, name_condition};
use super::ledger::{bigint, col, count};
use crate::protocol::{JobError, NamePattern, Timestamp};
use crate::server::records::{
    StatsDelta, StatsRow, Summary, WorkerDelta, WorkerStatsRow, histogram,
};

/// The columns of an hour's statistics, in the order [`read_stats`] reads them.
const STATS_COLUMNS: &str = "name, hour, added, started, finished, failed, retried, \
     wait_n, wait_mean, wait_m2, wait_min, wait_max, run_n, run_mean, run_m2, run_min, run_max, \
     service_n, service_mean, service_m2, service_min, service_max";

/// An hour's statistics from [`STATS_COLUMNS`], without histograms.
fn read_stats(row: &Row) -> Result<StatsRow, JobError> {
    const WHAT: &str = "statistics row";
    Ok(StatsRow {
        name: col(row, 0, WHAT)?,
        hour: col(row, 1, WHAT)?,
        added: count(row, 2, WHAT)?,
        started: count(row, 3, WHAT)?,
        finished: count(row, 4, WHAT)?,
        failed: count(row, 5, WHAT)?,
        retried: count(row, 6, WHAT)?,
        wait: read_summary(row, 7)?,
        run: read_summary(row, 12)?,
        service: read_summary(row, 17)?,
        wait_histogram: None,
        run_histogram: None,
    })
}

/// The summary in the five columns from `at` (`X_n, X_mean, X_m2, X_min, X_max`).
fn read_summary(row: &Row, at: usize) -> Result<Summary, JobError> {
    const WHAT: &str = "summary";
    Ok(Summary {
        count: count(row, at, WHAT)?,
        mean: col(row, at + 1, WHAT)?,
        m2: col(row, at + 2, WHAT)?,
        min: col::<Option<f64>>(row, at + 3, WHAT)?.unwrap_or(0.0),
        max: col::<Option<f64>>(row, at + 4, WHAT)?.unwrap_or(0.0),
    })
}

/// The SET clauses that add one sample (given as `excluded.X_mean` with
/// `excluded.X_n` = 1, or nothing with 0) to summary `X` of `table` by
/// Welford's update; every right-hand side reads the row as it was. The
/// row's own columns are named with the table, as `excluded` has them too.
fn welford(table: &str, x: &str) -> String {
    let new_mean =
        format!("{table}.{x}_mean + (excluded.{x}_mean - {table}.{x}_mean) / ({table}.{x}_n + 1)");
    format!(
        "{x}_mean = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_mean ELSE {new_mean} END, \
         {x}_m2 = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_m2 \
           ELSE {table}.{x}_m2 + (excluded.{x}_mean - {table}.{x}_mean) \
             * (excluded.{x}_mean - ({new_mean})) END, \
         {x}_min = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_min \
           ELSE LEAST(COALESCE({table}.{x}_min, excluded.{x}_min), excluded.{x}_min) END, \
         {x}_max = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_max \
           ELSE GREATEST(COALESCE({table}.{x}_max, excluded.{x}_max), excluded.{x}_max) END, \
         {x}_n = {table}.{x}_n + excluded.{x}_n"
    )
}

/// Adds one event to an hour's row in one statement, without reading it.
static ADD_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO stats ({STATS_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
           $8, COALESCE($9::float8, 0), 0, $9, $9, $10, COALESCE($11::float8, 0), 0, $11, $11, \
           $12, COALESCE($13::float8, 0), 0, $13, $13) \
         ON CONFLICT (name, hour) DO UPDATE SET \
           added = stats.added + excluded.added, started = stats.started + excluded.started, \
           finished = stats.finished + excluded.finished, failed = stats.failed + excluded.failed, \
           retried = stats.retried + excluded.retried, {}, {}, {}",
        welford("stats", "wait"),
        welford("stats", "run"),
        welford("stats", "service")
    )
});

/// Counts one duration in an hour's histogram.
const ADD_HISTOGRAM_SQL: &str = "INSERT INTO stats_histogram (name, hour, kind, bucket, count) \
     VALUES ($1, $2, $3, $4, 1) \
     ON CONFLICT (name, hour, kind, bucket) DO UPDATE SET count = stats_histogram.count + 1";

/// Adds one event to a supervisor's hour in one statement.
static ADD_WORKER_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO worker_stats (worker, hour, run_n, run_mean, run_m2, run_min, run_max, \
         busy_ms, capacity_ms) VALUES ($1, $2, $3, COALESCE($4::float8, 0), 0, $4, $4, $5, $6) \
         ON CONFLICT (worker, hour) DO UPDATE SET \
           busy_ms = worker_stats.busy_ms + excluded.busy_ms, \
           capacity_ms = worker_stats.capacity_ms + excluded.capacity_ms, {}",
        welford("worker_stats", "run")
    )
});

/// Adds an event to the statistics of `name` for the hour starting at `hour`.
pub(super) fn add_stats(
    tx: &mut PgTx<'_>,
    name: &str,
    hour: i64,
    delta: &StatsDelta,
) -> Result<(), JobError> {
    // A sample, or no sample: count 0 and no value (so no min or max).
    let sample = |ms: Option<i64>| (i64::from(ms.is_some()), ms.map(|ms| ms.max(0) as f64));
    let (wait_n, wait) = sample(delta.wait_ms);
    let (run_n, run) = sample(delta.run_ms);
    let (service_n, service) = sample(delta.service_ms);
    tx.execute(
        &ADD_STATS_SQL,
        &[
            &name,
            &hour,
            &bigint(delta.added),
            &bigint(delta.started),
            &bigint(delta.finished),
            &bigint(delta.failed),
            &bigint(delta.retried),
            &wait_n,
            &wait,
            &run_n,
            &run,
            &service_n,
            &service,
        ],
    )?;
    for (kind, ms) in [("wait", delta.wait_ms), ("run", delta.run_ms)] {
        if let Some(ms) = ms {
            let bucket = bigint(histogram::bucket(ms));
            tx.execute(ADD_HISTOGRAM_SQL, &[&name, &hour, &kind, &bucket])?;
        }
    }
    Ok(())
}

/// Hourly rows with `from <= hour < to`, by name then hour.
pub(super) fn stats(
    tx: &mut PgTx<'_>,
    pattern: Option<&NamePattern>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Vec<StatsRow>, JobError> {
    // The pattern narrows the rows read; `matches` decides, as in SQLite.
    let mut params = Params::default();
    let window = format!(
        "hour >= {} AND hour < {}",
        params.push(from.0),
        params.push(to.0)
    );
    let filter = pattern
        .map(|p| format!(" AND {}", name_condition(p, &mut params)))
        .unwrap_or_default();
    let rows = tx.query(
        &format!("SELECT {STATS_COLUMNS} FROM stats WHERE {window}{filter} ORDER BY name, hour"),
        &params.refs(),
    )?;
    let mut out: BTreeMap<(String, i64), StatsRow> = BTreeMap::new();
    for row in &rows {
        let row = read_stats(row)?;
        if pattern.is_none_or(|p| p.matches(&row.name)) {
            out.insert((row.name.clone(), row.hour), row);
        }
    }
    let buckets = tx.query(
        &format!(
            "SELECT name, hour, kind, bucket, count FROM stats_histogram \
             WHERE {window}{filter}"
        ),
        &params.refs(),
    )?;
    for bucket in &buckets {
        const WHAT: &str = "histogram bucket";
        let name: String = col(bucket, 0, WHAT)?;
        let hour: i64 = col(bucket, 1, WHAT)?;
        let kind: String = col(bucket, 2, WHAT)?;
        let index: i64 = col(bucket, 3, WHAT)?;
        let n = count(bucket, 4, WHAT)?;
        let (Some(row), Ok(index)) = (out.get_mut(&(name, hour)), usize::try_from(index)) else {
            continue;
        };
        if index >= histogram::bucket_count() {
            continue;
        }
        let histogram = match kind.as_str() {
            "wait" => &mut row.wait_histogram,
            "run" => &mut row.run_histogram,
            _ => continue,
        };
        histogram.get_or_insert_default().0.insert(index, n);
    }
    Ok(out.into_values().collect())
}

/// Adds an event to a supervisor's statistics for the hour starting at `hour`.
pub(super) fn add_worker_stats(
    tx: &mut PgTx<'_>,
    worker: &str,
    hour: i64,
    delta: &WorkerDelta,
) -> Result<(), JobError> {
    tx.execute(
        &ADD_WORKER_STATS_SQL,
        &[
            &worker,
            &hour,
            &i64::from(delta.run_ms.is_some()),
            &delta.run_ms.map(|ms| ms.max(0) as f64),
            &delta.busy_ms.max(0),
            &delta.capacity_ms.max(0),
        ],
    )?;
    Ok(())
}

/// Supervisors' hourly rows with `from <= hour < to`, by supervisor then hour.
pub(super) fn worker_stats(
    tx: &mut PgTx<'_>,
    pattern: Option<&NamePattern>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Vec<WorkerStatsRow>, JobError> {
    // The pattern's condition is on `name`: the supervisor is named so.
    let mut params = Params::default();
    let window = format!(
        "hour >= {} AND hour < {}",
        params.push(from.0),
        params.push(to.0)
    );
    let filter = pattern
        .map(|p| format!(" AND {}", name_condition(p, &mut params)))
        .unwrap_or_default();
    let rows = tx.query(
        &format!(
            "SELECT name, hour, run_n, run_mean, run_m2, run_min, run_max, busy_ms, \
             capacity_ms FROM (SELECT worker AS name, * FROM worker_stats) w \
             WHERE {window}{filter} ORDER BY name, hour"
        ),
        &params.refs(),
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        const WHAT: &str = "supervisor's statistics row";
        let row = WorkerStatsRow {
            worker: col(row, 0, WHAT)?,
            hour: col(row, 1, WHAT)?,
            run: read_summary(row, 2)?,
            busy_ms: col(row, 7, WHAT)?,
            capacity_ms: col(row, 8, WHAT)?,
        };
        if pattern.is_none_or(|p| p.matches(&row.worker)) {
            out.push(row);
        }
    }
    Ok(out)
}
