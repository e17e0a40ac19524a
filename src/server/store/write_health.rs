//! Whether the store can write, for `/healthz`: the outcome of the last
//! write transaction that tried to change something. A full disk, an I/O
//! error or a read-only file marks the store failing, with SQLite's reason;
//! the next transaction that commits a change marks it healthy again.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

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
