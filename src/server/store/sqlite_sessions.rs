//! Ended dashboard sessions in the SQLite store (schema version 13):
//! [`SessionTx`] for [`SqliteTx`].

use rusqlite::{OptionalExtension, params};

use super::sessions::SessionTx;
use super::sqlite::{FailingTx, SqliteTx, store_error};
use crate::protocol::JobError;

impl SessionTx for SqliteTx<'_> {
    fn session_ended(&mut self, id: &str) -> Result<bool, JobError> {
        self.conn
            .prepare_cached("SELECT 1 FROM ended_sessions WHERE session = ?1")
            .and_then(|mut statement| {
                statement
                    .query_row([id], |row| row.get::<_, i64>(0))
                    .optional()
            })
            .map(|found| found.is_some())
            .map_err(store_error)
    }

    fn end_session(&mut self, id: &str, expires: i64, now: i64) -> Result<(), JobError> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO ended_sessions (session, expires) VALUES (?1, ?2)",
            )
            .and_then(|mut statement| statement.execute(params![id, expires]))
            .map_err(store_error)?;
        self.conn
            .prepare_cached(
                "DELETE FROM ended_sessions WHERE session IN (SELECT session FROM \
                 ended_sessions WHERE expires < ?1 ORDER BY expires LIMIT 100)",
            )
            .and_then(|mut statement| statement.execute([now]))
            .map_err(store_error)?;
        Ok(())
    }
}

impl SessionTx for FailingTx {
    fn session_ended(&mut self, _: &str) -> Result<bool, JobError> {
        Err(self.0.clone())
    }
    fn end_session(&mut self, _: &str, _: i64, _: i64) -> Result<(), JobError> {
        Err(self.0.clone())
    }
}
