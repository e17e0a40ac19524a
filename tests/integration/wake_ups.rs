//! Randomized stress of blocked GetJob against concurrent creates, on the
//! queue over a real store (an SQLite file, or with
//! `JOBMGR_TEST_STORE=postgres` a PostgreSQL database of its own): no job
//! may stay QUEUED while a waiter that could take it sleeps.
//!
//! "Stranded" is decided without timing: every waiter waits an hour, and in
//! each round there are at least as many sleeping catch-all waiters as jobs
//! not yet taken, so every created job must be handed out. A lost wake-up
//! leaves its job QUEUED beside sleeping waiters until the round's (generous)
//! deadline, and is counted. So is a job handed to nobody: leased (by a
//! commit that served a sleeping waiter, or by a claim) for a waiter that
//! went away, and not put back. And a job handed out twice fails at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobmgr::protocol::view::HandOut;
use jobmgr::protocol::{CreateJob, GetJobs, JobId, JobState, LeaseTerm, NamePattern, Priority};
use jobmgr::server::queue::{Queue, QueueConfig};
use jobmgr::server::store::{PgStore, SqliteStore, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rounds per run (`WAKE_UPS_ROUNDS` overrides): each takes milliseconds.
const ROUNDS: usize = 600;
/// How long a round may take before the jobs no waiter received count as stranded:
/// rounds take milliseconds.
const ROUND_DEADLINE: Duration = Duration::from_secs(10);
const HOUR: Duration = Duration::from_secs(3600);

/// The store under the queue, as `JOBMGR_TEST_STORE` says.
enum TestStore {
    Sqlite {
        store: Arc<SqliteStore>,
        _dir: tempfile::TempDir,
    },
    Postgres {
        store: Arc<PgStore>,
        // Dropped (WITH (FORCE)) after the store's connections close.
        _database: crate::common::TestDatabase,
    },
}

impl TestStore {
    /// Opens a new store. Outside any async runtime: PostgreSQL's client
    /// blocks on a runtime of its own.
    fn open() -> TestStore {
        match crate::common::store_kind() {
            crate::common::StoreKind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let store = SqliteStore::open(&dir.path().join("jobs.db")).unwrap();
                TestStore::Sqlite {
                    store: Arc::new(store),
                    _dir: dir,
                }
            }
            crate::common::StoreKind::Postgres => {
                let database = crate::common::TestDatabase::create();
                let never = std::sync::atomic::AtomicBool::new(false);
                let store = PgStore::open(database.url(), Some(Duration::from_secs(10)), &never)
                    .unwrap_or_else(|e| panic!("open {}: {e}", database.url()));
                TestStore::Postgres {
                    store: Arc::new(store),
                    _database: database,
                }
            }
        }
    }

    /// A queue over it, reading the time as the server does.
    fn queue(&self) -> Queue {
        match self {
            TestStore::Sqlite { store, .. } => {
                Queue::start(Arc::clone(store) as Arc<dyn Store>, QueueConfig::default())
            }
            TestStore::Postgres { store, .. } => Queue::start_with_clock(
                Arc::clone(store) as Arc<dyn Store>,
                QueueConfig::default(),
                store.clock(),
            ),
        }
    }

    fn close(&self) {
        match self {
            TestStore::Sqlite { store, .. } => store.close(),
            TestStore::Postgres { store, .. } => store.close(),
        }
    }
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// A waiter's request, at random: a pattern within the round, a batch size,
/// and sometimes a priority filter.
fn random_request(rng: &mut StdRng, round: usize, catch_all: bool) -> GetJobs {
    let pattern = if catch_all {
        NamePattern::Glob(format!("r{round}-*"))
    } else {
        match rng.random_range(0..3) {
            0 => NamePattern::Glob(format!("r{round}-a*")),
            1 => NamePattern::Glob(format!("r{round}-b1")),
            _ => NamePattern::List(vec![format!("r{round}-a1"), format!("r{round}-b1")]),
        }
    };
    let priority = if catch_all || rng.random_bool(0.5) {
        None
    } else {
        Some(*pick(
            rng,
            &[Priority::DEFAULT, Priority::new(1000).unwrap()],
        ))
    };
    GetJobs {
        pattern,
        num_results: rng.random_range(1..=3),
        priority,
        lease: LeaseTerm::Millis(600_000),
        worker: None,
    }
}

/// Waits once, up to an hour (or, for a waiter that drops early, a moment),
/// and records what it was handed.
async fn wait_once(
    queue: Queue,
    request: GetJobs,
    drop_after: Option<Duration>,
    taken: Arc<Mutex<HashSet<JobId>>>,
) {
    let get = queue.get_jobs(request, Some(HOUR));
    let answer: Result<Vec<HandOut>, _> = match drop_after {
        Some(after) => match tokio::time::timeout(after, get).await {
            Ok(answer) => answer,
            // Dropped mid-wait or mid-claim: what it took is put back.
            Err(_) => return,
        },
        None => get.await,
    };
    let handouts = answer.expect("GetJob answered");
    let mut taken = taken.lock().unwrap();
    for handout in handouts {
        assert!(
            taken.insert(handout.job.id),
            "job {} handed out twice",
            handout.job.id
        );
    }
}

/// One round: waiters and creates race; returns the jobs no waiter received
/// by the round's deadline, with their state (QUEUED beside sleeping
/// waiters, or RUNNING for nobody).
async fn round(queue: &Queue, round: usize, rng: &mut StdRng) -> Vec<(JobId, JobState)> {
    // Small rounds: a lost wake-up needs a waiter that registered behind a
    // re-registered one, which a long line of sleepers ahead would prevent.
    let jobs = rng.random_range(1..=3);
    let taken = Arc::new(Mutex::new(HashSet::new()));
    let mut waiters = Vec::new();
    let mut creates = Vec::new();
    let extras = rng.random_range(0..=1);
    let droppers = rng.random_range(0..=1);
    // Catch-alls first or interleaved with the rest, at random.
    let mut kinds: Vec<u8> = std::iter::repeat_n(0, jobs)
        .chain(std::iter::repeat_n(1, extras))
        .chain(std::iter::repeat_n(2, droppers))
        .chain(std::iter::repeat_n(3, jobs))
        .collect();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.random_range(0..=i));
    }
    for kind in kinds {
        // Arrivals spread out a little, so that waiters re-register behind
        // newcomers while creates commit.
        for _ in 0..rng.random_range(0..4) {
            tokio::task::yield_now().await;
        }
        let queue = queue.clone();
        let seed: u64 = rng.random();
        let taken = Arc::clone(&taken);
        match kind {
            3 => creates.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                for _ in 0..rng.random_range(0..3) {
                    tokio::task::yield_now().await;
                }
                let name = format!("r{round}-{}", pick(&mut rng, &["a1", "a2", "b1"]));
                let mut job = CreateJob::named(name);
                job.priority = Some(*pick(
                    &mut rng,
                    &[Priority::DEFAULT, Priority::new(1000).unwrap()],
                ));
                queue.create(job).await.expect("job created")
            })),
            kind => waiters.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                let request = random_request(&mut rng, round, kind == 0);
                let drop_after =
                    (kind == 2).then(|| Duration::from_micros(rng.random_range(0..3000)));
                wait_once(queue, request, drop_after, taken).await
            })),
        }
    }
    let mut created = Vec::new();
    for create in creates {
        created.push(create.await.expect("create task"));
    }
    let started = Instant::now();
    while taken.lock().unwrap().len() < created.len() && started.elapsed() < ROUND_DEADLINE {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut stranded = Vec::new();
    let received = taken.lock().unwrap().clone();
    for id in &created {
        if !received.contains(id) {
            stranded.push((*id, queue.query(*id).await.expect("job exists").state));
        }
    }
    for waiter in waiters {
        waiter.abort();
        let _ = waiter.await;
    }
    stranded
}

#[test]
fn a_blocked_getjob_never_misses_its_wake_up_under_concurrent_creates() {
    let seed: u64 = std::env::var("WAKE_UPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("wake-ups stress seed {seed} (set WAKE_UPS_SEED to replay)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let store = TestStore::open();
    runtime.block_on(async {
        let queue = store.queue();
        queue.ready().await;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut stranded = Vec::new();
        let rounds = std::env::var("WAKE_UPS_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(ROUNDS);
        for r in 0..rounds {
            let left = round(&queue, r, &mut rng).await;
            if !left.is_empty() {
                stranded.push((r, left));
            }
        }
        queue.shutdown();
        queue.settle().await;
        store.close();
        assert!(
            stranded.is_empty(),
            "jobs no waiter received, left QUEUED beside sleeping waiters or RUNNING for \
             nobody (round, [(id, state)]): {stranded:?}; seed {seed}"
        );
    });
}

#[test]
fn a_claim_that_fails_a_worn_out_retry_after_job_hands_out_the_next_due_one() {
    // A woken waiter takes "found nothing" to mean that nothing it could
    // take is due. A claim whose only candidate was a retryAfter job at its
    // hand-out limit (FAILED instead) must still find the job due behind it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = TestStore::open();
    runtime.block_on(async {
        let queue = store.queue();
        queue.ready().await;
        let mut worn = CreateJob::named("worn");
        worn.retry_after = Some(jobmgr::protocol::RetryAfter::parse("+1 HOUR").unwrap());
        worn.data
            .insert("retryAfterCount".into(), serde_json::json!(10));
        let worn = queue.create(worn).await.unwrap();
        let next = queue.create(CreateJob::named("next")).await.unwrap();
        let handed = queue
            .get_jobs(
                GetJobs {
                    pattern: NamePattern::Glob("*".into()),
                    num_results: 1,
                    priority: None,
                    lease: LeaseTerm::Millis(600_000),
                    worker: None,
                },
                Some(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        let ids: Vec<JobId> = handed.iter().map(|h| h.job.id).collect();
        assert_eq!(ids, vec![next], "the job due behind the worn-out one");
        assert_eq!(queue.query(worn).await.unwrap().state, JobState::Failed);
        queue.shutdown();
        queue.settle().await;
        store.close();
    });
}
