//! What the lifecycle's operations share: their error type, and mapping a recorded object
//! back at its original addresses.

use super::carrier::TransferError;
use crate::calls::sharing::ExportFailure;
use crate::driver::Driver;
use crate::state::registry::{Kind, Registry};
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::AllocationId;
use std::collections::BTreeMap;

/// Why an operation failed, naming the object: what kind of failure decides nothing yet (the
/// operation does), but callers and logs can tell a driver call from a carrier, a peer or the
/// records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// The real driver is not loaded.
    NoDriver(CuError),
    /// A driver call on the named object failed.
    Driver { what: String, error: CuError },
    /// Moving the shared bytes through a carrier failed.
    Carrier {
        what: &'static str,
        error: TransferError,
    },
    /// Another participant (a creator) did not serve what this process needs.
    Peer(String),
    /// The records, the carrier or the request do not allow the step.
    Records(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoDriver(error) => write!(f, "no driver: {error}"),
            Self::Driver { what, error } => write!(f, "{what}: {error}"),
            Self::Carrier { what, error } => write!(f, "{what}: {error}"),
            Self::Peer(why) | Self::Records(why) => f.write_str(why),
        }
    }
}

impl From<ExportFailure> for StepError {
    fn from(failure: ExportFailure) -> Self {
        Self::Peer(failure.0)
    }
}

/// A failure inside an operation.
pub type OpResult<T> = Result<T, StepError>;

/// The driver, or why an operation cannot run without it.
pub fn loaded_driver() -> OpResult<&'static Driver> {
    crate::driver::driver().map_err(StepError::NoDriver)
}

/// A carrier's failure, saying which way the bytes went.
pub fn carrying(what: &'static str) -> impl FnOnce(TransferError) -> StepError {
    move |error| StepError::Carrier { what, error }
}

/// What an operation reports on success: the carrier bytes it moved and, for the copies, the
/// carrier's peak host memory and the checksums of the bytes as copied.
#[derive(Debug, Default)]
pub struct Done {
    pub bytes: u64,
    pub peak_carrier_bytes: u64,
    pub checksums: cuinterpose_protocol::BoundedVec<
        cuinterpose_protocol::CarrierChecksum,
        { cuinterpose_protocol::MAX_RECORDS },
    >,
}

impl From<u64> for Done {
    fn from(bytes: u64) -> Self {
        Self {
            bytes,
            ..Self::default()
        }
    }
}

/// A driver call's failure, naming the object it was for.
pub fn at(what: impl FnOnce() -> String) -> impl FnOnce(CuError) -> StepError {
    move |error| StepError::Driver {
        what: what(),
        error,
    }
}

/// Each object's recorded mappings of one kind, by base address: built once per operation, so
/// remapping N objects costs N lookups rather than N scans of every mapping.
pub struct MappingIndex(BTreeMap<AllocationId, Vec<u64>>);

impl MappingIndex {
    pub fn new(r: &Registry, kind: Kind) -> Self {
        let mut index: BTreeMap<AllocationId, Vec<u64>> = BTreeMap::new();
        for (&base, m) in r.mappings.iter().filter(|(_, m)| m.kind == kind) {
            index.entry(m.id).or_default().push(base);
        }
        MappingIndex(index)
    }

    /// The base addresses of `id`'s mappings, in address order.
    pub fn of(&self, id: &AllocationId) -> &[u64] {
        self.0.get(id).map_or(&[], Vec::as_slice)
    }
}

/// Maps every recorded mapping of `id` (as `index` lists them) at its original address and
/// restores its access.
pub fn remap(
    d: &Driver,
    r: &Registry,
    index: &MappingIndex,
    id: &AllocationId,
    raw: u64,
) -> CuResult<()> {
    for base in index.of(id) {
        let (base, m) = (*base, &r.mappings[base]);
        d.mem_map(base, m.size as usize, m.offset as usize, raw, m.flags)?;
        if !m.access.is_empty() {
            let descriptors: Vec<_> = m.access.iter().map(convert::raw_access).collect();
            d.mem_set_access(base, m.size as usize, &descriptors)?;
        }
    }
    Ok(())
}
