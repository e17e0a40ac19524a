//! Whether the store can write, for `/healthz`: the outcome of the last
//! write transaction that tried to change something. A full disk, an I/O
//! error or a read-only file marks the store failing, with SQLite's reason;
//! the next transaction that commits a change marks it healthy again. While
//! it fails, the writer probes by itself every [`PROBE_EVERY`] (a small
//! write of its own, see [`Probes`]), so that a disk freed or a database
//! back shows healthy again without waiting for a client's write.

use std::cell::RefCell;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::ErrorCode;

thread_local! {
    /// The last disk-level SQLite error seen on this thread (the writer's).
    static DISK_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Remembers `error` if it says the file cannot be written (full, I/O,
/// read-only, corrupt), for the writer to pick up after the operation.
pub(super) fn note(error: &rusqlite::Error) {
    if let Some(code) = error.sqlite_error_code()
        && matches!(
            code,
            ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::ReadOnly
                | ErrorCode::CannotOpen
                | ErrorCode::DatabaseCorrupt
        )
    {
        DISK_ERROR.with(|noted| *noted.borrow_mut() = Some(error.to_string()));
    }
}

/// The disk-level error noted on this thread since the last call, if any.
pub(super) fn take_noted() -> Option<String> {
    DISK_ERROR.with(|noted| noted.borrow_mut().take())
}

/// The store's write health, shared by its writer thread and its readers.
#[derive(Debug, Default, Clone)]
pub struct WriteHealth(Arc<Mutex<Option<String>>>);

impl WriteHealth {
    /// A write failed for `reason`.
    pub(super) fn failed(&self, reason: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }

    /// A transaction with changes committed.
    pub(super) fn committed(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Why writes fail, while they do.
    pub fn failure(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How often a failing store's writer tries a write of its own.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(2);

/// What a store's writer does next.
pub(super) enum Next<T> {
    /// Runs this operation.
    Run(T),
    /// Tries a small write of its own: the store fails, and
    /// [`PROBE_EVERY`] has passed since the last probe.
    Probe,
}

/// When a failing store's writer probes: every [`PROBE_EVERY`] while it
/// fails, whether or not operations come meanwhile (operations that change
/// nothing, such as empty takes from long-polling supervisors, neither
/// mark it healthy nor write).
#[derive(Debug)]
pub(super) struct Probes {
    /// When the last probe ran, or the last operation was taken while the
    /// store was healthy.
    last: Instant,
}

impl Default for Probes {
    fn default() -> Self {
        Probes {
            last: Instant::now(),
        }
    }
}

impl Probes {
    /// The writer's next step: the next operation, or, while the store
    /// fails, a probe once [`PROBE_EVERY`] has passed since the last one;
    /// `None` once the queue is closed.
    pub(super) fn next<T>(
        &mut self,
        receiver: &mpsc::Receiver<T>,
        health: &WriteHealth,
    ) -> Option<Next<T>> {
        if health.failure().is_none() {
            let op = receiver.recv().ok().map(Next::Run);
            self.last = Instant::now();
            return op;
        }
        let due = self.last + PROBE_EVERY;
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            match receiver.recv_timeout(wait) {
                Ok(op) => return Some(Next::Run(op)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
        self.last = Instant::now();
        Some(Next::Probe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_store_is_probed_on_time_though_operations_keep_coming() {
        let health = WriteHealth::default();
        health.failed("disk full".into());
        let (sender, receiver) = mpsc::channel();
        let mut probes = Probes {
            last: Instant::now() - PROBE_EVERY,
        };
        sender.send(1).unwrap();
        // Due already: the probe comes before the waiting operation.
        assert!(matches!(probes.next(&receiver, &health), Some(Next::Probe)));
        assert!(matches!(
            probes.next(&receiver, &health),
            Some(Next::Run(1))
        ));
        drop(sender);
        assert!(probes.next(&receiver, &health).is_none());
    }
}
