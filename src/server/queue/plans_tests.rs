//! Plans that hold on PostgreSQL: every statement the store's writer
//! prepared while the queue ran a varied workload (the store records them)
//! is planned again, generic (as a cached plan is), on a database whose
//! tables were analyzed while empty and on one never analyzed: none may
//! read a table that grows with the queue in full. Needs PostgreSQL on
//! 127.0.0.1:5432 (trust authentication), as every test machine has it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use postgres::{Client, NoTls, SimpleQueryMessage};

use super::{HandOut, Queue, QueueConfig};
use crate::protocol::{
    CreateJob, FailJob, FinishJob, GetJobs, JobId, LeaseTerm, NamePattern, RetryJob,
};
use crate::server::store::{POSTGRES_WRITER_SETTINGS, PgStore, postgres_plans};

/// The PostgreSQL server of every test machine.
const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// The tables that grow with the queue and its history.
const GROWING: [&str; 8] = [
    "jobs",
    "attempts",
    "archive",
    "jobs_before_handout",
    "job_tags",
    "job_dependencies",
    "stats",
    "stats_histogram",
];

/// A database of the test's own, dropped at the end.
struct Scratch(String);

impl Scratch {
    fn create(what: &str) -> Scratch {
        let name = format!("jobmgr_plans_{what}_{}", std::process::id());
        let mut admin = Client::connect(&format!("{SERVER}/postgres"), NoTls)
            .expect("PostgreSQL on 127.0.0.1:5432 (trust authentication)");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop a stale database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create a database");
        Scratch(name)
    }

    fn url(&self) -> String {
        format!("{SERVER}/{}", self.0)
    }

    fn client(&self) -> Client {
        Client::connect(&self.url(), NoTls).expect("connect")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&format!("{SERVER}/postgres"), NoTls) {
            let _ =
                admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0));
        }
    }
}

fn open(url: &str) -> PgStore {
    PgStore::open(url, Some(Duration::from_secs(30)), &AtomicBool::new(false))
        .expect("open the store")
}

fn get(pattern: &str, num_results: usize) -> GetJobs {
    GetJobs {
        pattern: NamePattern::Glob(pattern.into()),
        num_results,
        priority: None,
        lease: LeaseTerm::Millis(60_000),
        worker: None,
    }
}

fn lease(handout: &HandOut) -> Option<String> {
    Some(handout.lease_token.clone())
}

/// Creates, claims, reports of every kind, children, dependencies, tags,
/// throttles, heartbeats, hand-backs, cancels and deletes: the writer's
/// statements.
async fn workload(queue: &Queue) {
    let create = |name: &str| CreateJob::named(name);
    let mut tagged = create("plans/tagged");
    tagged.tags = vec!["blue".into()];
    let tagged = queue.create(tagged).await.expect("create");
    let mut dependent = create("plans/dependent");
    dependent.depends = vec![tagged];
    queue.create(dependent).await.expect("create a dependent");
    for name in [
        "plans/parent",
        "plans/retried",
        "plans/failed",
        "plans/back",
    ] {
        queue.create(create(name)).await.expect("create");
    }
    let parent = &queue.get_jobs(get("plans/parent", 1), None).await.unwrap()[0];
    let mut child = create("plans/child");
    child.parent_id = Some(parent.job.id);
    let child: JobId = queue.create(child).await.expect("create a child");
    queue.set_throttle("plans/t*".into(), 1).await.unwrap();
    let handed = queue.get_jobs(get("plans/*", 10), None).await.unwrap();
    queue.delete_throttle("plans/t*".into()).await.unwrap();
    for handout in &handed {
        let id = handout.job.id;
        let _ = queue.heartbeat(id, handout.lease_token.clone()).await;
        let _ = match handout.job.name.as_str() {
            "plans/retried" => {
                queue
                    .retry(RetryJob {
                        id,
                        data: None,
                        delay_secs: 60,
                        next_run: None,
                        name: None,
                        priority: None,
                        ignore_repeat: false,
                        lease: lease(handout),
                        run: None,
                    })
                    .await
            }
            "plans/failed" => {
                queue
                    .fail(FailJob {
                        id,
                        data: None,
                        lease: lease(handout),
                        run: None,
                    })
                    .await
            }
            "plans/back" => queue.hand_back(id, handout.lease_token.clone()).await,
            _ => {
                queue
                    .finish(FinishJob {
                        id,
                        data: None,
                        lease: lease(handout),
                        run: None,
                    })
                    .await
            }
        };
    }
    let _ = queue.cancel(child).await;
    let _ = queue
        .finish(FinishJob {
            id: parent.job.id,
            data: None,
            lease: lease(parent),
            run: None,
        })
        .await;
    for handout in queue.get_jobs(get("plans/*", 10), None).await.unwrap() {
        let _ = queue.delete(handout.job.id).await;
    }
}

/// The statements among `statements` whose generic plan, with `settings`,
/// reads a growing table in full, with their plans.
fn full_reads(db: &Scratch, settings: &str, statements: &[String]) -> Vec<String> {
    let mut client = db.client();
    client
        .batch_execute(&format!(
            "{settings}; SET plan_cache_mode = force_generic_plan; \
             CREATE TEMP TABLE jobmgr_purged (job_id BIGINT PRIMARY KEY)"
        ))
        .expect("settings, and the purge's table of the session");
    let mut found = Vec::new();
    // Only what PREPARE takes (the store also prepares `ANALYZE` and the
    // like, which read no table row by row).
    let plannable = statements.iter().filter(|sql| {
        ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"]
            .iter()
            .any(|verb| sql.trim_start().starts_with(verb))
    });
    for (i, sql) in plannable.enumerate() {
        let params = client.prepare(sql).expect("prepare").params().len();
        client
            .batch_execute(&format!("PREPARE p{i} AS {sql}"))
            .expect("PREPARE");
        let args = vec!["NULL"; params].join(", ");
        let explain = if params == 0 {
            format!("EXPLAIN EXECUTE p{i}")
        } else {
            format!("EXPLAIN EXECUTE p{i}({args})")
        };
        let plan: String = client
            .simple_query(&explain)
            .expect("EXPLAIN")
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(|l| format!("{l}\n")),
                _ => None,
            })
            .collect();
        if GROWING
            .iter()
            .any(|table| plan.contains(&format!("Seq Scan on {table} ")))
        {
            found.push(format!("{sql}\n{plan}"));
        }
    }
    found
}

#[test]
fn the_writers_statements_use_indexes_on_analyzed_empty_and_never_analyzed_tables() {
    let analyzed = Scratch::create("analyzed");
    let store = open(&analyzed.url());
    analyzed.client().batch_execute("ANALYZE").expect("ANALYZE");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let queue = Queue::start(Arc::new(store), QueueConfig::default());
        workload(&queue).await;
        queue.shutdown();
    });
    drop(runtime);
    let statements = postgres_plans::recorded();
    assert!(
        statements.len() >= 25,
        "the workload ran few statements: {statements:#?}"
    );
    let never = Scratch::create("never");
    open(&never.url()).close();
    for db in [&analyzed, &never] {
        let full = full_reads(db, POSTGRES_WRITER_SETTINGS, &statements);
        assert!(
            full.is_empty(),
            "on {}, statements that read a growing table in full:\n{}",
            db.0,
            full.join("\n")
        );
    }
    // The writer's settings are what holds the plans: without them, the
    // analyzed-empty tables are read in full.
    assert!(
        !full_reads(&analyzed, "SELECT 1", &statements).is_empty(),
        "without the writer's settings every plan used an index: this test cannot tell"
    );
}
