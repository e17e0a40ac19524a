//! Dashboard sessions ended by a logout, in the store: the session cookie
//! is signed, not stored (see the dashboard's `session` module), so a
//! logout is kept as a row `ended_sessions(session, expires)` that every
//! server on the store checks, across restarts, until the cookie would
//! have expired anyway; expired rows are forgotten a bounded batch at a
//! time at each logout.

use crate::protocol::JobError;

/// Row-level access to ended dashboard sessions inside one transaction.
pub trait SessionTx {
    /// Whether the dashboard session `id` was ended by a logout.
    fn session_ended(&mut self, id: &str) -> Result<bool, JobError>;
    /// Ends the dashboard session `id`, remembered until `expires`
    /// (milliseconds since the epoch: when its cookie lapses anyway), and
    /// forgets up to 100 ended sessions that lapsed before `now`.
    fn end_session(&mut self, id: &str, expires: i64, now: i64) -> Result<(), JobError>;
}
