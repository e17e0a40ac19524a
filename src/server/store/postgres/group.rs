//! One transaction for the write operations queued together on a server's
//! writer: each runs in a savepoint of its own (a failed one undoes only
//! itself), their statistics are written once for the group, and one commit
//! makes them all durable before any is answered.
//!
//! The savepoint statements ride with each other: the end of one
//! operation's savepoint and the start of the next go in one round trip, so
//! that a group of N operations costs N + 1 round trips of its own and one
//! commit, where N transactions cost 2N round trips and N commits. A group
//! of one runs as a plain transaction, without a savepoint.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Conn, PgTx, pg_error};
use crate::protocol::JobError;
use crate::server::store::{Reply, WriteOp};

/// The most operations one transaction takes. A group holds its rows'
/// locks until it commits, so it is kept short enough that another server
/// waiting on one of them waits about one commit.
pub(super) const MAX_GROUP: usize = 256;

/// How the last operation's savepoint ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Kept: `RELEASE`.
    Kept,
    /// Undone: `ROLLBACK TO`, then `RELEASE`.
    Undone,
}

impl Ended {
    fn sql(self) -> &'static str {
        match self {
            Ended::Kept => "RELEASE op",
            Ended::Undone => "ROLLBACK TO op; RELEASE op",
        }
    }
}

/// Runs `ops` in the transaction begun on `conn`, writes their statistics,
/// commits (or rolls back when none kept a change) and answers them.
/// Returns whether a change was committed, or why the transaction failed.
pub(super) fn run(conn: &mut Conn, ops: Vec<WriteOp>, origin: u64) -> Result<bool, String> {
    let alone = ops.len() == 1;
    let mut tx = PgTx {
        client: &mut conn.client,
        cache: &mut conn.cache,
        locking: true,
        origin,
        deferred: Vec::new(),
        childless: Default::default(),
        throttles: None,
    };
    let mut replies: Vec<Reply> = Vec::with_capacity(ops.len());
    let mut kept_any = false;
    let mut last: Option<Ended> = None;
    let mut ops = ops.into_iter();
    while let Some(op) = ops.next() {
        if !alone {
            let start = match last {
                Some(ended) => format!("{}; SAVEPOINT op", ended.sql()),
                None => "SAVEPOINT op".to_string(),
            };
            crate::metrics::store_statement();
            if let Err(error) = tx.client.batch_execute(&start) {
                // The transaction is lost (the connection, or the database
                // ended it): nothing of it will commit.
                let error = pg_error(&error);
                let _ = tx.client.batch_execute("ROLLBACK");
                super::refuse(op, error.clone());
                ops.for_each(|op| super::refuse(op, error.clone()));
                answer(replies, Some(error.clone()));
                return Err(error.to_string());
            }
        }
        let statistics_before = tx.deferred.len();
        tx.childless.clear();
        let outcome = catch_unwind(AssertUnwindSafe(|| op(&mut tx)));
        let keep = matches!(outcome, Ok((true, _)));
        if !keep {
            // What it read of its own undone changes is forgotten too.
            tx.deferred.truncate(statistics_before);
            tx.throttles = None;
        }
        kept_any |= keep;
        last = Some(if keep { Ended::Kept } else { Ended::Undone });
        match outcome {
            Ok((_, reply)) => replies.push(reply),
            Err(_) => tracing::error!("a write operation panicked; its changes were rolled back"),
        }
    }
    crate::metrics::store_statement();
    if !kept_any {
        let _ = tx.client.batch_execute("ROLLBACK");
        answer(replies, None);
        return Ok(false);
    }
    if !alone && last == Some(Ended::Undone) {
        crate::metrics::store_statement();
        if let Err(error) = tx.client.batch_execute(Ended::Undone.sql()) {
            return Err(fail(&mut tx, replies, pg_error(&error)));
        }
    }
    if let Err(error) = tx.write_deferred() {
        return Err(fail(&mut tx, replies, error));
    }
    commit(&mut tx, replies)
}

/// Commits the group's transaction and answers its operations.
fn commit(tx: &mut PgTx<'_>, replies: Vec<Reply>) -> Result<bool, String> {
    let committing = std::time::Instant::now();
    // PostgreSQL answers COMMIT of a transaction that an error aborted by
    // rolling it back, with no error: every operation kept here ended its
    // savepoint, so the transaction is not aborted when this is reached.
    let committed = tx.client.batch_execute("COMMIT");
    crate::metrics::commit(committing.elapsed().as_secs_f64());
    match committed {
        Ok(()) => {
            answer(replies, None);
            Ok(true)
        }
        Err(error) => {
            let _ = tx.client.batch_execute("ROLLBACK");
            // A commit refused by the database was rolled back; one whose
            // connection was lost may have been done.
            let error = match pg_error(&error) {
                JobError::StoreUnavailable(_) if error.as_db_error().is_none() => {
                    JobError::StoreOutcomeUnknown
                }
                other => other,
            };
            tracing::error!(%error, "commit failed");
            answer(replies, Some(error.clone()));
            Err(error.to_string())
        }
    }
}

/// Rolls the group back and answers every operation with `error`.
fn fail(tx: &mut PgTx<'_>, replies: Vec<Reply>, error: JobError) -> String {
    let _ = tx.client.batch_execute("ROLLBACK");
    tracing::error!(%error, "a write group was rolled back; its operations are answered with the error");
    answer(replies, Some(error.clone()));
    error.to_string()
}

/// Answers the operations, in order.
fn answer(replies: Vec<Reply>, error: Option<JobError>) {
    for reply in replies {
        reply(error.clone());
    }
}
