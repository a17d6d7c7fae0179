//! What a valid topology holds: the summary [`super::validate`] returns and the lifecycle
//! plans with (shared allocations, multicast groups, bytes per participant).

use std::collections::BTreeMap;

use cuinterpose_protocol::{AllocationReference, MulticastProperties, NamespacePid};

/// A shared allocation: saved once by its creator through the host carrier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedAllocation {
    pub allocation: AllocationReference,
    pub size: u64,
    /// Participants holding an importer record, ascending.
    pub importers: Vec<NamespacePid>,
}

/// A multicast object and the participants that hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MulticastGroup {
    pub object: AllocationReference,
    pub properties: MulticastProperties,
    /// Participants holding a multicast record (creator included), ascending.
    pub members: Vec<NamespacePid>,
    /// Attached (participant, device) pairs.
    pub devices: Vec<(NamespacePid, i32)>,
}

/// What a valid topology holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    pub participants: Vec<NamespacePid>,
    /// Creator allocations with the host carrier, ordered by creator then id.
    pub shared_allocations: Vec<SharedAllocation>,
    /// Importer allocation records across all participants.
    pub importer_records: usize,
    /// Bytes each participant copies to its host carrier (every participant has an entry).
    pub bytes_per_participant: BTreeMap<NamespacePid, u64>,
    /// Sum of [`Topology::bytes_per_participant`].
    pub bytes_to_save: u64,
    pub multicast_groups: Vec<MulticastGroup>,
    pub records: usize,
}

impl Topology {
    /// Bytes `pid` moves in `save_allocations` and `load_allocations` (0 for a non-participant).
    pub fn bytes_of(&self, pid: NamespacePid) -> u64 {
        self.bytes_per_participant.get(&pid).copied().unwrap_or(0)
    }
}
