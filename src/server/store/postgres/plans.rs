//! The statements the writer prepares, recorded for the test that checks
//! their plans on an analyzed-empty and on a never-analyzed database
//! (`queue/plans_tests.rs`): the list is the code's own, so it cannot
//! drift from what runs.

use std::collections::BTreeSet;
use std::sync::Mutex;

static PREPARED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Records a statement a write transaction prepared.
pub(super) fn prepared(sql: &str) {
    PREPARED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(sql.to_string());
}

/// Every statement write transactions have prepared so far, in this
/// process.
pub fn recorded() -> Vec<String> {
    PREPARED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect()
}
