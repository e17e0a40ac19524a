//! Ended dashboard sessions in PostgreSQL: [`SessionTx`] for [`PgTx`], the
//! same rows and meaning as SQLite's. Every server on the database reads
//! them, so a logout through one ends the session on all.

use super::PgTx;
use crate::protocol::JobError;
use crate::server::store::SessionTx;

impl SessionTx for PgTx<'_> {
    fn session_ended(&mut self, id: &str) -> Result<bool, JobError> {
        let row = self.query_opt("SELECT 1 FROM ended_sessions WHERE session = $1", &[&id])?;
        Ok(row.is_some())
    }

    fn end_session(&mut self, id: &str, expires: i64, now: i64) -> Result<(), JobError> {
        self.execute(
            "INSERT INTO ended_sessions (session, expires) VALUES ($1, $2) \
             ON CONFLICT (session) DO UPDATE SET expires = excluded.expires",
            &[&id, &expires],
        )?;
        self.execute(
            "DELETE FROM ended_sessions WHERE session IN (SELECT session FROM ended_sessions \
             WHERE expires < $1 ORDER BY expires LIMIT 100)",
            &[&now],
        )?;
        Ok(())
    }
}
