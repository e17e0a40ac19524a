//! The SQL of a listing of ended jobs (`GET /archive`, `jobmgr job list
//! --archived`): by name, state and the time they ended, in id order, paged
//! by id. The name pattern becomes conditions the `archive_name` index
//! (name, ended) answers, as in [`super::listing`]: an exact name is an
//! equality, a GLOB with a literal prefix a range on that prefix, a list
//! `IN (…)`; a time window alone is a range on `archive_ended`. Only a GLOB
//! that starts with a wildcard, with no window, reads every entry. The
//! index is named (`INDEXED BY`), as the planner would otherwise walk ids in
//! order, reading every entry when few match; the matches in range are
//! then sorted by id.

use rusqlite::types::Value;

use super::listing::{WILDCARDS, after_prefix};
use crate::protocol::{JobId, JobState, NamePattern, Timestamp};

/// Which ended jobs a listing wants.
#[derive(Debug, Clone, Default)]
pub struct ArchiveQuery {
    /// Only names matching this.
    pub pattern: Option<NamePattern>,
    /// Only this final state (`FINISHED` or `FAILED`).
    pub state: Option<JobState>,
    /// Only jobs that ended at or after this.
    pub since: Option<Timestamp>,
    /// Only jobs that ended before this.
    pub until: Option<Timestamp>,
    /// Only ids greater than this (for paging).
    pub after_id: Option<JobId>,
    /// At most this many.
    pub limit: usize,
}

/// The SQL and parameters listing `query`, in id order.
pub(super) fn archive_sql(columns: &str, query: &ArchiveQuery) -> (String, Vec<Value>) {
    let mut params: Vec<Value> = vec![
        Value::Integer(query.after_id.unwrap_or(0)),
        query
            .state
            .map_or(Value::Null, |s| Value::Text(s.as_str().to_string())),
        Value::Integer(query.limit.max(1) as i64),
    ];
    let mut conditions = Vec::new();
    // The index that answers the query: the planner would rather walk ids
    // in order, which reads every entry when few match.
    let mut index = if query.since.is_some() || query.until.is_some() {
        "INDEXED BY archive_ended"
    } else {
        ""
    };
    if let Some(since) = query.since {
        params.push(Value::Integer(since.0));
        conditions.push(format!("ended >= ?{}", params.len()));
    }
    if let Some(until) = query.until {
        params.push(Value::Integer(until.0));
        conditions.push(format!("ended < ?{}", params.len()));
    }
    match &query.pattern {
        None => {}
        Some(NamePattern::List(names)) => {
            let marks: Vec<String> = names
                .iter()
                .map(|name| {
                    params.push(Value::Text(name.clone()));
                    format!("?{}", params.len())
                })
                .collect();
            conditions.push(format!("name IN ({})", marks.join(", ")));
            index = "INDEXED BY archive_name";
        }
        Some(NamePattern::Glob(glob)) => {
            let prefix: &str = glob.split(WILDCARDS).next().unwrap_or_default();
            params.push(Value::Text(glob.clone()));
            if prefix.len() == glob.len() {
                conditions.push(format!("name = ?{}", params.len()));
                index = "INDEXED BY archive_name";
            } else {
                conditions.push(format!("name GLOB ?{}", params.len()));
                if !prefix.is_empty() {
                    index = "INDEXED BY archive_name";
                    params.push(Value::Text(prefix.to_string()));
                    conditions.push(format!("name >= ?{}", params.len()));
                    if let Some(end) = after_prefix(prefix) {
                        params.push(Value::Text(end));
                        conditions.push(format!("name < ?{}", params.len()));
                    }
                }
            }
        }
    }
    let mut filter = String::new();
    for condition in conditions {
        filter.push_str(&condition);
        filter.push_str(" AND ");
    }
    let sql = format!(
        "SELECT {columns} FROM archive {index} WHERE {filter}job_id > ?1 \
         AND (?2 IS NULL OR state = ?2) ORDER BY job_id LIMIT ?3"
    );
    (sql, params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::store::SqliteStore;
    use rusqlite::{Connection, params};

    fn plan(conn: &Connection, query: &ArchiveQuery) -> String {
        let (sql, params) = archive_sql("job_id", query);
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = statement
            .query_map(rusqlite::params_from_iter(params), |row| {
                row.get::<_, String>(3)
            })
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    fn glob(pattern: &str) -> ArchiveQuery {
        ArchiveQuery {
            pattern: Some(NamePattern::Glob(pattern.into())),
            limit: 100,
            ..ArchiveQuery::default()
        }
    }

    /// A store whose archive holds `count` entries named `job-N` (and a
    /// few others), ended a second apart, so that the planner has figures.
    fn archive_of(count: i64) -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        for id in 1..=count {
            let name = if id % 10 == 0 {
                format!("other-{id}")
            } else {
                format!("job-{id}")
            };
            let state = if id % 3 == 0 { "FAILED" } else { "FINISHED" };
            conn.execute(
                "INSERT INTO archive (job_id, name, state, data, created, ended, attempts) \
                 VALUES (?1, ?2, ?3, '{}', 0, ?4, 1)",
                params![id, name, state, id * 1000],
            )
            .unwrap();
        }
        conn.execute_batch("ANALYZE").unwrap();
        (dir, conn)
    }

    #[test]
    fn archived_jobs_are_found_by_name_and_time_through_an_index() {
        let (_dir, conn) = archive_of(2000);
        for query in [
            glob("job-1"),
            glob("job-1*"),
            glob("other-?0"),
            ArchiveQuery {
                pattern: Some(NamePattern::List(vec!["job-1".into(), "job-2".into()])),
                limit: 10,
                ..ArchiveQuery::default()
            },
        ] {
            let plan = plan(&conn, &query);
            assert!(plan.contains("INDEX archive_name"), "{query:?}: {plan}");
            assert!(!plan.contains("SCAN archive"), "{query:?}: {plan}");
        }
        let window = ArchiveQuery {
            since: Some(Timestamp(5_000)),
            until: Some(Timestamp(9_000)),
            limit: 10,
            ..ArchiveQuery::default()
        };
        let plan = plan(&conn, &window);
        assert!(plan.contains("INDEX archive_ended"), "{plan}");
        assert!(!plan.contains("SCAN archive"), "{plan}");
    }

    #[test]
    fn a_listing_keeps_to_its_name_state_window_and_page() {
        let (_dir, conn) = archive_of(40);
        let ids = |query: &ArchiveQuery| -> Vec<i64> {
            let (sql, params) = archive_sql("job_id", query);
            conn.prepare(&sql)
                .unwrap()
                .query_map(rusqlite::params_from_iter(params), |row| row.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(
            ids(&glob("job-3*")),
            [3, 31, 32, 33, 34, 35, 36, 37, 38, 39]
        );
        assert_eq!(ids(&glob("*-20")), [20]);
        let failed_window = ArchiveQuery {
            state: Some(JobState::Failed),
            since: Some(Timestamp(10_000)),
            until: Some(Timestamp(19_000)),
            limit: 100,
            ..ArchiveQuery::default()
        };
        assert_eq!(ids(&failed_window), [12, 15, 18]);
        let page = ArchiveQuery {
            after_id: Some(31),
            limit: 3,
            ..glob("job-3*")
        };
        assert_eq!(ids(&page), [32, 33, 34]);
    }
}
