//! Saved records against fresh ones: [`compare`] lists each [`RecordDifference`], ignoring
//! order, for restore's checks of the live participants against the checkpoint.

use std::fmt;

use cuinterpose_protocol::Record;

use crate::render;

/// A record present on one side only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordDifference {
    /// Saved, but not in the fresh inspection.
    Missing(Record),
    /// In the fresh inspection, but never saved.
    Unexpected(Record),
}

impl fmt::Display for RecordDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(record) => write!(f, "missing {}", render::record(record)),
            Self::Unexpected(record) => write!(f, "unexpected {}", render::record(record)),
        }
    }
}

/// The records that differ between `saved` and `fresh`, ignoring order (a record saved twice
/// must be there twice). Missing ones first, each group sorted.
pub fn compare(saved: &[Record], fresh: &[Record]) -> Vec<RecordDifference> {
    let mut saved: Vec<&Record> = saved.iter().collect();
    let mut fresh: Vec<&Record> = fresh.iter().collect();
    saved.sort();
    fresh.sort();
    let (mut missing, mut unexpected) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < saved.len() || j < fresh.len() {
        match (saved.get(i), fresh.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                missing.push(RecordDifference::Missing((*a).clone()));
                i += 1;
            }
            (Some(a), None) => {
                missing.push(RecordDifference::Missing((*a).clone()));
                i += 1;
            }
            (_, Some(b)) => {
                unexpected.push(RecordDifference::Unexpected((*b).clone()));
                j += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
    missing.extend(unexpected);
    missing
}
