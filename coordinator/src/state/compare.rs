//! Saved records against fresh ones: [`compare`] lists each [`RecordDifference`], ignoring
//! order, for restore's checks of the live participants against the checkpoint; and a load's
//! carrier checksums against the saved ones ([`compare_checksums`]).

use std::fmt;

use cuinterpose_protocol::{AllocationId, CarrierChecksum, Record};

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

/// The first way a load's checksums differ from the saved ones (see [`compare_checksums`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChecksumDifference {
    /// Saved, but the load reported no checksum for it.
    Missing { allocation: AllocationId },
    /// The load reported a checksum for an allocation that was never saved.
    Unexpected { allocation: AllocationId },
    /// Another size or chunking than the saved one.
    Shape { allocation: AllocationId },
    /// The bytes of one chunk hash to another value.
    Chunk {
        allocation: AllocationId,
        offset: u64,
        len: u64,
        saved: u64,
        found: u64,
    },
}

impl fmt::Display for ChecksumDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { allocation } => {
                write!(
                    f,
                    "allocation {allocation}: no checksum of its bytes was reported"
                )
            }
            Self::Unexpected { allocation } => write!(
                f,
                "allocation {allocation}: a checksum was reported for bytes it does not carry"
            ),
            Self::Shape { allocation } => write!(
                f,
                "allocation {allocation}: the checksums cover another size or chunking than \
                 its bytes"
            ),
            Self::Chunk {
                allocation,
                offset,
                len,
                saved,
                found,
            } => write!(
                f,
                "allocation {allocation}: the {len} bytes loaded at offset {offset} hash to \
                 {found:#018x}, but the checkpoint recorded {saved:#018x}"
            ),
        }
    }
}

/// Whether a save's checksums cover exactly the allocations a creator carries (`carried`:
/// id and size), each in whole chunks of a non-zero size: the first problem, or `None`.
pub fn check_coverage(
    carried: &[(AllocationId, u64)],
    reported: &[CarrierChecksum],
) -> Option<ChecksumDifference> {
    let reported: std::collections::BTreeMap<_, _> =
        reported.iter().map(|c| (c.allocation, c)).collect();
    let carried: std::collections::BTreeMap<_, _> = carried.iter().copied().collect();
    for (allocation, size) in &carried {
        let Some(c) = reported.get(allocation) else {
            return Some(ChecksumDifference::Missing {
                allocation: *allocation,
            });
        };
        let whole = c.chunk_bytes > 0
            && c.size == *size
            && c.chunks.len() as u64 == size.div_ceil(c.chunk_bytes);
        if !whole {
            return Some(ChecksumDifference::Shape {
                allocation: *allocation,
            });
        }
    }
    reported
        .keys()
        .find(|allocation| !carried.contains_key(allocation))
        .map(|allocation| ChecksumDifference::Unexpected {
            allocation: *allocation,
        })
}

/// The first difference between the checksums a creator's save recorded and those its load
/// reported (both sorted by allocation, as the shim reports them), or `None` when they agree.
pub fn compare_checksums(
    saved: &[CarrierChecksum],
    loaded: &[CarrierChecksum],
) -> Option<ChecksumDifference> {
    let carried: Vec<_> = saved.iter().map(|c| (c.allocation, c.size)).collect();
    if let Some(difference) = check_coverage(&carried, loaded) {
        return Some(difference);
    }
    let loaded: std::collections::BTreeMap<_, _> =
        loaded.iter().map(|c| (c.allocation, c)).collect();
    for before in saved {
        let after = loaded[&before.allocation];
        if before.chunk_bytes != after.chunk_bytes {
            return Some(ChecksumDifference::Shape {
                allocation: before.allocation,
            });
        }
        let chunk = before.chunk_bytes;
        let differs = before
            .chunks
            .iter()
            .zip(after.chunks.iter())
            .position(|(s, l)| s != l);
        if let Some(index) = differs {
            let offset = index as u64 * chunk;
            return Some(ChecksumDifference::Chunk {
                allocation: before.allocation,
                offset,
                len: chunk.min(before.size - offset),
                saved: before.chunks[index],
                found: after.chunks[index],
            });
        }
    }
    None
}
