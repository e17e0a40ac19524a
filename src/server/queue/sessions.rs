//! Dashboard sessions ended by a logout: kept in the store (see
//! `store::sessions`), so that a copied cookie stops working on every
//! server of the store, and after a restart, as soon as its session is
//! logged out.

use super::Queue;
use crate::protocol::JobError;

/// How long past its cookie's expiry an ended session is still kept.
const SESSION_CLOCK_MARGIN_MS: i64 = 24 * 3600 * 1000;

impl Queue {
    /// Ends the dashboard session `id`, whose cookie expires at
    /// `expires_ms` (milliseconds since the epoch): from the commit on,
    /// every server on the store refuses it.
    pub async fn end_session(&self, id: String, expires_ms: i64) -> Result<(), JobError> {
        // Ended sessions are forgotten once their cookies expired, by the
        // store's clock, which may be ahead of a server's own (by which a
        // cookie's expiry is judged): forgotten a day late.
        let now = self.now().0 - SESSION_CLOCK_MARGIN_MS;
        self.inner
            .store
            .write(move |tx| tx.sessions().end_session(&id, expires_ms, now))
            .await
    }

    /// Whether the dashboard session `id` was ended by a logout.
    pub async fn session_ended(&self, id: String) -> Result<bool, JobError> {
        self.read(move |tx| tx.sessions().session_ended(&id)).await
    }
}
