//! The SQL of a job listing (`GET /jobs`, `jobmgr job list`): the name
//! pattern is turned into conditions the `jobs_name` index answers, so that
//! a pattern matching nothing costs an index probe, not a scan of the table.
//!
//! - an exact name (a GLOB without wildcards) is an equality;
//! - a GLOB with a literal prefix (`SendEmail*`, `www-prod/?x`) is a range on
//!   that prefix, with the GLOB itself checked on the rows in range;
//! - a list of names is `IN (…)`;
//! - a GLOB that starts with a wildcard (`*Email`) needs the scan.
//!
//! With a state, the state's part of the `jobs_state` index is read in id
//! order instead, with the pattern checked on each job, until the page is
//! full: for no pattern, a GLOB that starts with a wildcard, and a prefix
//! that at least [`WIDE_PREFIX_JOBS`] jobs share (counted first on the name
//! index, up to that many), which is then not sorted by id. A narrower
//! prefix keeps its range of the name index, sorted: at most that many
//! jobs, and a prefix no job has stays a probe.

use rusqlite::types::Value;

use super::ListQuery;
use crate::protocol::NamePattern;

/// The characters that make a GLOB more than a literal.
pub(super) const WILDCARDS: [char; 3] = ['*', '?', '['];

/// How many jobs sharing a GLOB's literal prefix make it wide: a listing
/// with a state then reads the state's index rather than sorting the
/// prefix's range by id.
pub(super) const WIDE_PREFIX_JOBS: i64 = 10_000;

/// For a listing with a state and a GLOB with a literal prefix (and
/// wildcards), the SQL and parameters counting the jobs in the prefix's
/// range of the name index, up to [`WIDE_PREFIX_JOBS`].
pub(super) fn prefix_count_sql(query: &ListQuery) -> Option<(String, Vec<Value>)> {
    let Some(NamePattern::Glob(glob)) = &query.pattern else {
        return None;
    };
    let prefix: &str = glob.split(WILDCARDS).next().unwrap_or_default();
    if query.state.is_none() || query.tag.is_some() || prefix.is_empty() || prefix == glob {
        return None;
    }
    let mut params = vec![Value::Text(prefix.to_string())];
    let mut range = "name >= ?1".to_string();
    if let Some(end) = after_prefix(prefix) {
        params.push(Value::Text(end));
        range.push_str(" AND name < ?2");
    }
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_name WHERE {range} \
         LIMIT {WIDE_PREFIX_JOBS})"
    );
    Some((sql, params))
}

/// The SQL and parameters listing `query`, in id order; `wide_prefix` says
/// whether its GLOB's prefix is wide (see [`prefix_count_sql`]).
pub(super) fn list_sql(
    columns: &str,
    query: &ListQuery,
    wide_prefix: bool,
) -> (String, Vec<Value>) {
    let mut params: Vec<Value> = vec![
        Value::Integer(query.after_id.unwrap_or(0)),
        query
            .state
            .map_or(Value::Null, |s| Value::Text(s.as_str().to_string())),
        Value::Integer(query.limit.max(1) as i64),
    ];
    let by_state = query.state.is_some()
        && match &query.pattern {
            None => true,
            Some(NamePattern::List(_)) => false,
            Some(NamePattern::Glob(glob)) => {
                let prefix = glob.split(WILDCARDS).next().unwrap_or_default();
                glob.contains(WILDCARDS) && (prefix.is_empty() || wide_prefix)
            }
        };
    let (index, name) = match &query.pattern {
        None => ("", String::new()),
        Some(NamePattern::List(names)) => {
            let marks: Vec<String> = names
                .iter()
                .map(|name| {
                    params.push(Value::Text(name.clone()));
                    format!("?{}", params.len())
                })
                .collect();
            (
                "INDEXED BY jobs_name",
                format!("name IN ({}) AND ", marks.join(", ")),
            )
        }
        Some(NamePattern::Glob(glob)) => {
            let prefix: &str = glob.split(WILDCARDS).next().unwrap_or_default();
            if prefix.len() == glob.len() {
                params.push(Value::Text(glob.clone()));
                (
                    "INDEXED BY jobs_name",
                    format!("name = ?{} AND ", params.len()),
                )
            } else if prefix.is_empty() {
                params.push(Value::Text(glob.clone()));
                ("", format!("name GLOB ?{} AND ", params.len()))
            } else {
                params.push(Value::Text(glob.clone()));
                let glob_mark = params.len();
                params.push(Value::Text(prefix.to_string()));
                let mut range = format!("name >= ?{} AND ", params.len());
                if let Some(end) = after_prefix(prefix) {
                    params.push(Value::Text(end));
                    range.push_str(&format!("name < ?{} AND ", params.len()));
                }
                (
                    "INDEXED BY jobs_name",
                    format!("{range}name GLOB ?{glob_mark} AND "),
                )
            }
        }
    };
    // With a tag, the tag's rows (in id order on the primary key) lead, and
    // each is joined to its job: a rare tag costs its own rows, whatever
    // else is in the table.
    let (from, tag) = match &query.tag {
        Some(tag) => {
            params.push(Value::Text(tag.clone()));
            (
                "job_tags CROSS JOIN jobs USING (job_id)".to_string(),
                format!("tag = ?{} AND ", params.len()),
            )
        }
        None if by_state => ("jobs INDEXED BY jobs_state".to_string(), String::new()),
        None => (format!("jobs {index}"), String::new()),
    };
    // `?2 IS NULL OR` would keep the state's index out of use.
    let state = if query.state.is_some() {
        "state = ?2"
    } else {
        "?2 IS NULL"
    };
    let sql = format!(
        "SELECT {columns} FROM {from} WHERE {tag}{name}job_id > ?1 AND {state} \
         ORDER BY job_id LIMIT ?3"
    );
    (sql, params)
}

/// The least string greater than every string starting with `prefix` (its
/// last character incremented), if there is one.
pub(super) fn after_prefix(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        while next <= char::MAX as u32 {
            if let Some(c) = char::from_u32(next) {
                chars.push(c);
                return Some(chars.into_iter().collect());
            }
            next += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CreateJob, JobState};
    use crate::server::store::SqliteStore;
    use rusqlite::Connection;

    fn plan(conn: &Connection, query: &ListQuery) -> String {
        let (sql, params) = list_sql("job_id", query, true);
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = statement
            .query_map(rusqlite::params_from_iter(params), |row| {
                row.get::<_, String>(3)
            })
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    fn glob(pattern: &str) -> ListQuery {
        ListQuery {
            pattern: Some(NamePattern::Glob(pattern.into())),
            limit: 100,
            ..ListQuery::default()
        }
    }

    #[test]
    fn get_jobs_with_a_pattern_that_matches_nothing_scans_the_whole_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        for query in [
            glob("NoSuchJob"),
            glob("NoSuch*"),
            glob("www-prod/?x"),
            ListQuery {
                pattern: Some(NamePattern::List(vec!["a".into(), "b".into()])),
                limit: 10,
                state: Some(JobState::Queued),
                ..ListQuery::default()
            },
        ] {
            let plan = plan(&conn, &query);
            assert!(
                plan.contains("USING INDEX jobs_name")
                    || plan.contains("USING COVERING INDEX jobs_name"),
                "{query:?}: {plan}"
            );
            assert!(!plan.contains("SCAN jobs"), "{query:?}: {plan}");
        }
    }

    #[test]
    fn a_listing_by_state_reads_the_states_index_in_id_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        for pattern in [
            None,
            Some(NamePattern::Glob("bench/name-0*".into())),
            Some(NamePattern::Glob("*Email".into())),
        ] {
            let query = ListQuery {
                pattern,
                state: Some(JobState::Running),
                limit: 100,
                ..ListQuery::default()
            };
            let plan = plan(&conn, &query);
            assert!(
                plan.contains("INDEX jobs_state (state=? AND job_id>?)"),
                "{query:?}: {plan}"
            );
            assert!(!plan.contains("TEMP B-TREE"), "no sort: {plan}");
            assert!(!plan.contains("SCAN"), "{plan}");
        }
        // An exact name still reads the name's index, and so does a prefix
        // few jobs share.
        let mut exact = glob("SendEmail");
        exact.state = Some(JobState::Running);
        assert!(plan(&conn, &exact).contains("INDEX jobs_name"));
        let mut narrow = glob("Send*");
        narrow.state = Some(JobState::Running);
        let (sql, params) = list_sql("job_id", &narrow, false);
        let explained: String = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(rusqlite::params_from_iter(params), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
            .join("; ");
        assert!(explained.contains("INDEX jobs_name"), "{explained}");
    }

    #[test]
    fn a_listing_by_tag_reads_the_tags_index_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        for pattern in [None, Some(NamePattern::Glob("Send*".into()))] {
            let query = ListQuery {
                tag: Some("billing".into()),
                pattern,
                state: Some(JobState::Queued),
                limit: 10,
                ..ListQuery::default()
            };
            let plan = plan(&conn, &query);
            assert!(
                plan.starts_with("SEARCH job_tags USING PRIMARY KEY (tag=? AND job_id>?)"),
                "{plan}"
            );
            assert!(!plan.contains("SCAN"), "{plan}");
        }
    }

    #[tokio::test]
    async fn listings_by_pattern_find_exactly_the_matching_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let store: std::sync::Arc<dyn crate::server::store::Store> =
            std::sync::Arc::new(SqliteStore::open(&dir.path().join("jobs.db")).unwrap());
        let queue = crate::server::queue::Queue::start(store, Default::default());
        queue.ready().await;
        for name in [
            "Send",
            "SendEmail",
            "SendFax",
            "Senc",
            "Sf",
            "x/Send",
            "Send\u{10FFFF}x",
        ] {
            queue.create(CreateJob::named(name)).await.unwrap();
        }
        let names =
            |jobs: Vec<crate::protocol::Job>| jobs.into_iter().map(|j| j.name).collect::<Vec<_>>();
        assert_eq!(
            names(queue.list(glob("Send")).await.unwrap().jobs),
            ["Send"]
        );
        assert_eq!(
            names(queue.list(glob("Send*")).await.unwrap().jobs),
            ["Send", "SendEmail", "SendFax", "Send\u{10FFFF}x"]
        );
        assert_eq!(
            names(queue.list(glob("Send?ma*")).await.unwrap().jobs),
            ["SendEmail"]
        );
        assert_eq!(
            names(queue.list(glob("*Send")).await.unwrap().jobs),
            ["Send", "x/Send"]
        );
        assert!(queue.list(glob("Nothing*")).await.unwrap().jobs.is_empty());
        let mut paged = glob("Send*");
        paged.limit = 2;
        paged.after_id = Some(1);
        assert_eq!(
            names(queue.list(paged).await.unwrap().jobs),
            ["SendEmail", "SendFax"]
        );
        queue.shutdown();
        queue.settle().await;
    }

    #[test]
    fn the_end_of_a_prefix_range_is_its_last_character_incremented() {
        assert_eq!(after_prefix("ab").as_deref(), Some("ac"));
        assert_eq!(after_prefix("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(after_prefix("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(after_prefix("\u{10FFFF}"), None);
    }
}
