//! Dependencies between jobs as parameters: the lists of job ids a create
//! names in `depends`, and a later change of them (`add`, `remove`),
//! checked alike on both wire front-ends.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{JobError, JobId};

/// The most jobs one job may depend on, and the most one change may add or
/// remove.
pub const MAX_DEPENDS: usize = 100;

/// A change of a job's dependencies: `POST /jobs/{id}/depends`, or
/// Bedrock's UpdateJob with `addDepends` / `removeDepends`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeDepends {
    /// Which job.
    pub id: JobId,
    /// Jobs it is to depend on as well (each created before it).
    pub add: Vec<JobId>,
    /// Jobs it is no longer to depend on.
    pub remove: Vec<JobId>,
}

/// Checks a list of job ids given as numbers: each positive; duplicates
/// count once (the first kept, the order otherwise kept), and at most
/// [`MAX_DEPENDS`] distinct jobs.
pub fn check_depends(param: &'static str, ids: &[i64]) -> Result<Vec<JobId>, JobError> {
    let mut seen = BTreeSet::new();
    let mut out: Vec<JobId> = Vec::with_capacity(ids.len().min(MAX_DEPENDS));
    for &id in ids {
        if id <= 0 {
            return Err(JobError::Malformed(param));
        }
        if seen.insert(id) {
            if out.len() == MAX_DEPENDS {
                return Err(JobError::TooManyDepends(param));
            }
            out.push(id);
        }
    }
    Ok(out)
}

/// Checks a list of job ids given as JSON text: an array of positive whole
/// numbers (as [`check_depends`]). `402 Malformed <param>` for anything
/// else.
pub fn parse_depends(param: &'static str, text: &str) -> Result<Vec<JobId>, JobError> {
    let items = match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Array(items)) => items,
        _ => return Err(JobError::Malformed(param)),
    };
    let ids = items
        .iter()
        .map(|item| item.as_i64().ok_or(JobError::Malformed(param)))
        .collect::<Result<Vec<_>, _>>()?;
    check_depends(param, &ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_positive_ids_without_duplicates_and_capped() {
        assert_eq!(parse_depends("depends", "[3, 1, 3]"), Ok(vec![3, 1]));
        assert_eq!(parse_depends("depends", " [] "), Ok(vec![]));
        for bad in [
            "", "3", "[0]", "[-1]", "[1.5]", "[\"1\"]", "{}", "[1,", "null",
        ] {
            assert_eq!(
                parse_depends("depends", bad),
                Err(JobError::Malformed("depends")),
                "{bad}"
            );
        }
        let many = format!(
            "[{}]",
            (1..=101)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            parse_depends("depends", &many),
            Err(JobError::TooManyDepends("depends"))
        );
        let hundred: Vec<i64> = (1..=100).collect();
        assert_eq!(check_depends("add", &hundred).map(|v| v.len()), Ok(100));
        // Duplicates count once, also past the limit; a bad id anywhere is
        // refused.
        let twice: Vec<i64> = hundred.iter().flat_map(|&id| [id, id]).collect();
        assert_eq!(check_depends("add", &twice), Ok(hundred.clone()));
        let with_twin = format!("[{}, 1]", &many[1..many.len() - 5]);
        assert_eq!(
            parse_depends("depends", &with_twin).map(|v| v.len()),
            Ok(100)
        );
        let mut bad = twice.clone();
        bad.push(0);
        assert_eq!(check_depends("add", &bad), Err(JobError::Malformed("add")));
        let mut too_many = twice;
        too_many.push(101);
        assert_eq!(
            check_depends("add", &too_many),
            Err(JobError::TooManyDepends("add"))
        );
    }
}
