//! The rules a topology can break, as [`TopologyError`], and the [`Object`] each names: one
//! line per problem, scoped to the participant at fault.

use std::fmt;

use cuinterpose_protocol::{AllocationId, AllocationReference, NamespacePid, Phase};

use crate::render;

/// An allocation or a multicast object, as messages name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Allocation(AllocationReference),
    Multicast(AllocationReference),
    Pool(AllocationReference),
}

impl Object {
    pub fn reference(&self) -> &AllocationReference {
        match self {
            Self::Allocation(reference) | Self::Multicast(reference) | Self::Pool(reference) => {
                reference
            }
        }
    }

    pub fn id(&self) -> AllocationId {
        self.reference().id
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allocation(reference) => {
                write!(f, "allocation {}", render::reference(reference))
            }
            Self::Multicast(reference) => {
                write!(f, "multicast object {}", render::reference(reference))
            }
            Self::Pool(reference) => {
                write!(f, "memory pool {}", render::reference(reference))
            }
        }
    }
}

/// `12, 13, 14`.
struct Pids<'a>(&'a [NamespacePid]);

impl fmt::Display for Pids<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, pid) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{pid}")?;
        }
        Ok(())
    }
}

fn pids(list: &[NamespacePid]) -> Pids<'_> {
    Pids(list)
}

/// One broken rule. Displays as one line starting `participant <pid>: ` (or `topology: ` when
/// no single participant is at fault) that names the object by hex id and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("topology: no participants")]
    NoParticipants,
    #[error("participant {pid}: answered as namespace pid {answered} (its socket name says {pid})")]
    PidMismatch {
        pid: NamespacePid,
        answered: NamespacePid,
    },
    #[error("participant {pid}: in phase {found}, expected phase {expected}")]
    WrongPhase {
        pid: NamespacePid,
        found: Phase,
        expected: Phase,
    },
    #[error(
        "participant {pid}: holds {count} live imports of file descriptors that are not \
         cuinterpose tickets; they cannot be checkpointed (release them first)"
    )]
    RawImports { pid: NamespacePid, count: u64 },
    #[error("participant {pid}: {object}: reported twice (one record per object and participant)")]
    DuplicateRecord { pid: NamespacePid, object: Object },
    #[error(
        "topology: {kind} {id}: claimed as creator by participants {} (exactly one creator)",
        pids(claimants)
    )]
    MultipleCreators {
        kind: &'static str,
        id: AllocationId,
        claimants: Vec<NamespacePid>,
    },
    #[error(
        "participant {pid}: {object}: names creator {}, but participant {creator} holds the \
         creator record",
        object.reference().creator_pid
    )]
    ConflictingCreator {
        pid: NamespacePid,
        object: Object,
        creator: NamespacePid,
    },
    #[error(
        "participant {pid}: {object}: imported from participant {}, which is not a participant \
         of this checkpoint",
        object.reference().creator_pid
    )]
    CreatorNotParticipant { pid: NamespacePid, object: Object },
    #[error(
        "participant {pid}: {object}: imported, but its creator (participant {}) has no creator \
         record for it",
        object.reference().creator_pid
    )]
    MissingCreatorRecord { pid: NamespacePid, object: Object },
    #[error(
        "participant {pid}: {pool}: allocation {} is recorded as its member, but this \
         participant holds no record of the pool",
        render::reference(allocation)
    )]
    PoolMemberWithoutPool {
        pid: NamespacePid,
        pool: Object,
        allocation: AllocationReference,
    },
    #[error(
        "participant {pid}: {pool}: member allocation {} has no allocation record here",
        render::reference(allocation)
    )]
    PoolMemberWithoutAllocation {
        pid: NamespacePid,
        pool: Object,
        allocation: AllocationReference,
    },
    #[error(
        "participant {pid}: {pool}: allocation {} (created by participant {}) cannot be its \
         member: a pool's allocations are its creator's",
        render::reference(allocation),
        allocation.creator_pid
    )]
    PoolMemberForeign {
        pid: NamespacePid,
        pool: Object,
        allocation: AllocationReference,
    },
    #[error(
        "participant {pid}: {pool}: grants {granted}, but the mapping of its allocation {} at \
         {address:#x} does not",
        render::reference(allocation)
    )]
    PoolAccessNotApplied {
        pid: NamespacePid,
        pool: Object,
        allocation: AllocationReference,
        address: u64,
        granted: String,
    },
    #[error("participant {pid}: {object}: created with size 0")]
    ZeroSize { pid: NamespacePid, object: Object },
    #[error(
        "participant {pid}: {object}: importer record has size {size:#x}, the creator's has \
         {creator_size:#x} (sizes must match)"
    )]
    ImportSizeMismatch {
        pid: NamespacePid,
        object: Object,
        size: u64,
        creator_size: u64,
    },
    #[error(
        "participant {pid}: {object}: importer properties ({found}) differ from the creator's \
         ({expected})"
    )]
    ImportPropertiesMismatch {
        pid: NamespacePid,
        object: Object,
        found: String,
        expected: String,
    },
    #[error(
        "participant {pid}: {object}: host carrier set on an importer record (only the creator \
         saves shared bytes)"
    )]
    CarrierOnImporter { pid: NamespacePid, object: Object },
    #[error(
        "participant {pid}: {object}: imported by participants {} but not marked for the host \
         carrier (its bytes would not be saved)",
        pids(importers)
    )]
    SharedWithoutCarrier {
        pid: NamespacePid,
        object: Object,
        importers: Vec<NamespacePid>,
    },
    #[error(
        "participant {pid}: {object}: shared creator allocation has no anchor (no live handle \
         and no mapping in its creator)"
    )]
    MissingAnchor { pid: NamespacePid, object: Object },
    #[error(
        "participant {pid}: {object}: {what} at {address:#x} refers to no {kind} record of this \
         participant",
        kind = if matches!(object, Object::Allocation(_)) { "allocation" } else { "multicast" }
    )]
    UnknownObject {
        pid: NamespacePid,
        object: Object,
        what: &'static str,
        address: u64,
    },
    #[error("participant {pid}: {object}: {what} at {address:#x}: {problem}")]
    InvalidRange {
        pid: NamespacePid,
        object: Object,
        what: &'static str,
        address: u64,
        problem: String,
    },
    #[error(
        "participant {pid}: {object}: mapping at {address:#x} (offset {offset:#x}, size \
         {size:#x}) exceeds the allocation size {allocation_size:#x}"
    )]
    MappingOutOfBounds {
        pid: NamespacePid,
        object: Object,
        address: u64,
        offset: u64,
        size: u64,
        allocation_size: u64,
    },
    #[error(
        "participant {pid}: {object}: {what} at {address:#x}: access list names {location} more \
         than once"
    )]
    DuplicateAccess {
        pid: NamespacePid,
        object: Object,
        what: &'static str,
        address: u64,
        location: String,
    },
    #[error(
        "participant {pid}: {object}: {what} at {address:#x}: access location {location} has an \
         invalid id"
    )]
    InvalidAccessLocation {
        pid: NamespacePid,
        object: Object,
        what: &'static str,
        address: u64,
        location: String,
    },
    #[error("participant {pid}: {object}: invalid multicast properties: {problem}")]
    InvalidMulticastProperties {
        pid: NamespacePid,
        object: Object,
        problem: &'static str,
    },
    #[error(
        "participant {pid}: {object}: {what} for a multicast object this participant holds no record of"
    )]
    MulticastRecordMissing {
        pid: NamespacePid,
        object: Object,
        what: &'static str,
    },
    #[error("participant {pid}: {object}: device {device} added more than once")]
    DuplicateMulticastDevice {
        pid: NamespacePid,
        object: Object,
        device: i32,
    },
    #[error(
        "topology: {object}: {found} (participant, device) pairs attached across participants, \
         the object was created for {expected}"
    )]
    IncompleteMulticastGroup {
        object: Object,
        expected: u32,
        found: usize,
    },
    #[error(
        "participant {pid}: {object}: device {device} is attached but has no binding in this participant"
    )]
    UnboundDevice {
        pid: NamespacePid,
        object: Object,
        device: i32,
    },
    #[error(
        "participant {pid}: {object}: binding on device {device}, which this participant did not attach"
    )]
    BindingDeviceNotAttached {
        pid: NamespacePid,
        object: Object,
        device: i32,
    },
    #[error("participant {pid}: {object}: binding on device {device}: {problem}")]
    InvalidBinding {
        pid: NamespacePid,
        object: Object,
        device: i32,
        problem: String,
    },
    #[error(
        "participant {pid}: {object}: binding on device {device}: member allocation {} is not an \
         allocation record of this participant",
        render::reference(member)
    )]
    UnknownMember {
        pid: NamespacePid,
        object: Object,
        device: i32,
        member: AllocationReference,
    },
    #[error(
        "participant {pid}: {object}: binding on device {device}: member allocation {} offset \
         {offset:#x} + size {size:#x} exceeds its size {allocation_size:#x}",
        render::reference(member)
    )]
    MemberOutOfBounds {
        pid: NamespacePid,
        object: Object,
        device: i32,
        member: AllocationReference,
        offset: u64,
        size: u64,
        allocation_size: u64,
    },
    #[error("participant {pid}: the host-carrier bytes of its allocations overflow 64 bits")]
    ByteCountOverflow { pid: NamespacePid },
    #[error(
        "participant {pid}: {record}: names device {ordinal} as {recorded}, but the process's \
         device list {listed} (a record and the device list must name the same GPU)"
    )]
    DeviceIdentity {
        pid: NamespacePid,
        record: String,
        ordinal: i32,
        recorded: String,
        listed: String,
    },
}

impl TopologyError {
    /// The participant at fault; `None` for topology-wide problems.
    pub fn participant(&self) -> Option<NamespacePid> {
        match self {
            Self::NoParticipants
            | Self::MultipleCreators { .. }
            | Self::IncompleteMulticastGroup { .. } => None,
            Self::PidMismatch { pid, .. }
            | Self::WrongPhase { pid, .. }
            | Self::RawImports { pid, .. }
            | Self::DuplicateRecord { pid, .. }
            | Self::ConflictingCreator { pid, .. }
            | Self::CreatorNotParticipant { pid, .. }
            | Self::MissingCreatorRecord { pid, .. }
            | Self::PoolMemberWithoutPool { pid, .. }
            | Self::PoolMemberWithoutAllocation { pid, .. }
            | Self::PoolMemberForeign { pid, .. }
            | Self::PoolAccessNotApplied { pid, .. }
            | Self::ZeroSize { pid, .. }
            | Self::ImportSizeMismatch { pid, .. }
            | Self::ImportPropertiesMismatch { pid, .. }
            | Self::CarrierOnImporter { pid, .. }
            | Self::SharedWithoutCarrier { pid, .. }
            | Self::MissingAnchor { pid, .. }
            | Self::UnknownObject { pid, .. }
            | Self::InvalidRange { pid, .. }
            | Self::MappingOutOfBounds { pid, .. }
            | Self::DuplicateAccess { pid, .. }
            | Self::InvalidAccessLocation { pid, .. }
            | Self::InvalidMulticastProperties { pid, .. }
            | Self::MulticastRecordMissing { pid, .. }
            | Self::DuplicateMulticastDevice { pid, .. }
            | Self::UnboundDevice { pid, .. }
            | Self::BindingDeviceNotAttached { pid, .. }
            | Self::InvalidBinding { pid, .. }
            | Self::UnknownMember { pid, .. }
            | Self::MemberOutOfBounds { pid, .. }
            | Self::DeviceIdentity { pid, .. }
            | Self::ByteCountOverflow { pid } => Some(*pid),
        }
    }
}
