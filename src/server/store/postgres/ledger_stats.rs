//! The ledger's hourly statistics in PostgreSQL, per name (with their
//! histograms) and per supervisor: the half of [`LedgerTx`] for [`PgTx`]
//! that `ledger.rs` hands on. A transaction's events are summed per row
//! first, then added to the stored rows by one upsert per table that does
//! not read them first (Chan et al.'s parallel update done in SQL), so that
//! servers sharing the database never lose each other's increments.
//!
//! [`LedgerTx`]: crate::server::store::LedgerTx

use std::collections::BTreeMap;
use std::sync::LazyLock;

use postgres::Row;

use super::PgTx;
use super::glob::{Params, name_condition};
use super::ledger::{bigint, col, count};
use crate::protocol::{JobError, NamePattern, Timestamp};
use crate::server::records::{StatsRow, Summary, WorkerStatsRow, histogram};

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

/// The SET clauses that merge summary `X` of the incoming row
/// (`excluded.X_n` samples, none when 0) into summary `X` of `table` by
/// Chan et al.'s parallel update, as [`Summary::merge`] does; every
/// right-hand side reads the row as it was. The row's own columns are named
/// with the table, as `excluded` has them too.
///
/// [`Summary::merge`]: crate::server::records::Summary::merge
fn merge_summary(table: &str, x: &str) -> String {
    let (n1, n2) = (
        format!("{table}.{x}_n::float8"),
        format!("excluded.{x}_n::float8"),
    );
    let delta = format!("(excluded.{x}_mean - {table}.{x}_mean)");
    format!(
        "{x}_mean = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_mean \
           ELSE {table}.{x}_mean + {delta} * {n2} / ({n1} + {n2}) END, \
         {x}_m2 = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_m2 \
           ELSE {table}.{x}_m2 + excluded.{x}_m2 + {delta} * {delta} * {n1} * {n2} / ({n1} + {n2}) END, \
         {x}_min = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_min \
           ELSE LEAST(COALESCE({table}.{x}_min, excluded.{x}_min), excluded.{x}_min) END, \
         {x}_max = CASE WHEN excluded.{x}_n = 0 THEN {table}.{x}_max \
           ELSE GREATEST(COALESCE({table}.{x}_max, excluded.{x}_max), excluded.{x}_max) END, \
         {x}_n = {table}.{x}_n + excluded.{x}_n"
    )
}

/// Adds hours' rows to theirs in one statement, without reading them: the
/// rows come as one array per column.
static ADD_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO stats ({STATS_COLUMNS}) SELECT * FROM UNNEST($1::text[], $2::int8[], \
           $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], \
           $8::int8[], $9::float8[], $10::float8[], $11::float8[], $12::float8[], \
           $13::int8[], $14::float8[], $15::float8[], $16::float8[], $17::float8[], \
           $18::int8[], $19::float8[], $20::float8[], $21::float8[], $22::float8[]) \
         ON CONFLICT (name, hour) DO UPDATE SET \
           added = stats.added + excluded.added, started = stats.started + excluded.started, \
           finished = stats.finished + excluded.finished, failed = stats.failed + excluded.failed, \
           retried = stats.retried + excluded.retried, {}, {}, {}",
        merge_summary("stats", "wait"),
        merge_summary("stats", "run"),
        merge_summary("stats", "service")
    )
});

/// Adds counts to hours' histogram buckets in one statement.
const ADD_HISTOGRAM_SQL: &str = "INSERT INTO stats_histogram (name, hour, kind, bucket, count) \
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[]) \
     ON CONFLICT (name, hour, kind, bucket) DO UPDATE SET count = stats_histogram.count + excluded.count";

/// Adds supervisors' hours to theirs in one statement.
static ADD_WORKER_STATS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO worker_stats (worker, hour, run_n, run_mean, run_m2, run_min, run_max, \
         busy_ms, capacity_ms) SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], \
           $4::float8[], $5::float8[], $6::float8[], $7::float8[], $8::int8[], $9::int8[]) \
         ON CONFLICT (worker, hour) DO UPDATE SET \
           busy_ms = worker_stats.busy_ms + excluded.busy_ms, \
           capacity_ms = worker_stats.capacity_ms + excluded.capacity_ms, {}",
        merge_summary("worker_stats", "run")
    )
});

/// A summary as the five columns' arrays take it: no minimum or maximum
/// without a sample.
struct SummaryColumns {
    n: Vec<i64>,
    mean: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<Option<f64>>,
    max: Vec<Option<f64>>,
}

impl SummaryColumns {
    fn of<'a>(summaries: impl Iterator<Item = &'a Summary>) -> Self {
        let mut out = SummaryColumns {
            n: Vec::new(),
            mean: Vec::new(),
            m2: Vec::new(),
            min: Vec::new(),
            max: Vec::new(),
        };
        for s in summaries {
            let some = s.count > 0;
            out.n.push(bigint(s.count));
            out.mean.push(if some { s.mean } else { 0.0 });
            out.m2.push(if some { s.m2 } else { 0.0 });
            out.min.push(some.then_some(s.min));
            out.max.push(some.then_some(s.max));
        }
        out
    }
}

/// Adds hours' statistics (and their histograms) to the stored rows, in
/// the order given (the order their rows are locked in): one statement for
/// the rows and one for the histograms.
pub(super) fn add_stats(tx: &mut PgTx<'_>, rows: &[StatsRow]) -> Result<(), JobError> {
    if rows.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let hours: Vec<i64> = rows.iter().map(|r| r.hour).collect();
    let counts = |f: fn(&StatsRow) -> u64| rows.iter().map(|r| bigint(f(r))).collect::<Vec<i64>>();
    let (added, started, finished, failed, retried) = (
        counts(|r| r.added),
        counts(|r| r.started),
        counts(|r| r.finished),
        counts(|r| r.failed),
        counts(|r| r.retried),
    );
    let wait = SummaryColumns::of(rows.iter().map(|r| &r.wait));
    let run = SummaryColumns::of(rows.iter().map(|r| &r.run));
    let service = SummaryColumns::of(rows.iter().map(|r| &r.service));
    tx.execute(
        &ADD_STATS_SQL,
        &[
            &names,
            &hours,
            &added,
            &started,
            &finished,
            &failed,
            &retried,
            &wait.n,
            &wait.mean,
            &wait.m2,
            &wait.min,
            &wait.max,
            &run.n,
            &run.mean,
            &run.m2,
            &run.min,
            &run.max,
            &service.n,
            &service.mean,
            &service.m2,
            &service.min,
            &service.max,
        ],
    )?;
    let (mut names, mut hours, mut kinds, mut buckets, mut counts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        for (kind, histogram) in [("wait", &row.wait_histogram), ("run", &row.run_histogram)] {
            for (bucket, count) in histogram.iter().flat_map(|h| h.0.iter()) {
                names.push(row.name.as_str());
                hours.push(row.hour);
                kinds.push(kind);
                buckets.push(bigint(*bucket as u64));
                counts.push(bigint(*count));
            }
        }
    }
    if !names.is_empty() {
        tx.execute(
            ADD_HISTOGRAM_SQL,
            &[&names, &hours, &kinds, &buckets, &counts],
        )?;
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

/// Adds supervisors' hours to the stored rows, in the order given, in one
/// statement.
pub(super) fn add_worker_stats(tx: &mut PgTx<'_>, rows: &[WorkerStatsRow]) -> Result<(), JobError> {
    if rows.is_empty() {
        return Ok(());
    }
    let workers: Vec<&str> = rows.iter().map(|r| r.worker.as_str()).collect();
    let hours: Vec<i64> = rows.iter().map(|r| r.hour).collect();
    let run = SummaryColumns::of(rows.iter().map(|r| &r.run));
    let busy: Vec<i64> = rows.iter().map(|r| r.busy_ms.max(0)).collect();
    let capacity: Vec<i64> = rows.iter().map(|r| r.capacity_ms.max(0)).collect();
    tx.execute(
        &ADD_WORKER_STATS_SQL,
        &[
            &workers, &hours, &run.n, &run.mean, &run.m2, &run.min, &run.max, &busy, &capacity,
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
