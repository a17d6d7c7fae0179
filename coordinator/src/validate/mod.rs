//! Topology validation: every participant's records checked against each other before anything
//! is destroyed.
//!
//! [`validate`] collects every problem it finds (not just the first), and record or participant
//! order never matters: definitions are indexed in a first pass and references checked in later
//! ones. Nothing is sent to any participant when validation fails.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cuinterpose_protocol::{
    AccessDescriptor, AllocationId, AllocationProperties, AllocationRecord, AllocationReference,
    BindingSource, InspectionReply, LocationType, MemberRange, MulticastProperties,
    MulticastRecord, NamespacePid, Phase, Record,
};

use crate::render;

/// An allocation or a multicast object, as messages name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Allocation(AllocationReference),
    Multicast(AllocationReference),
}

impl Object {
    pub fn reference(&self) -> &AllocationReference {
        match self {
            Self::Allocation(reference) | Self::Multicast(reference) => reference,
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
            | Self::ByteCountOverflow { pid } => Some(*pid),
        }
    }
}

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

/// Validates a live inspection for prepare: every participant in phase `active`.
pub fn validate(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
) -> Result<Topology, Vec<TopologyError>> {
    validate_in_phase(inspections, Phase::Active)
}

/// Validates inspections whose participants must all be in `expected` (and hold no raw
/// imports, and answer under their own PID).
pub fn validate_in_phase(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
    expected: Phase,
) -> Result<Topology, Vec<TopologyError>> {
    let mut errors = Vec::new();
    for (&pid, inspection) in inspections {
        if inspection.namespace_pid != pid {
            errors.push(TopologyError::PidMismatch {
                pid,
                answered: inspection.namespace_pid,
            });
        }
        if inspection.phase != expected {
            errors.push(TopologyError::WrongPhase {
                pid,
                found: inspection.phase,
                expected,
            });
        }
        if inspection.raw_imports > 0 {
            errors.push(TopologyError::RawImports {
                pid,
                count: inspection.raw_imports,
            });
        }
    }
    let records = inspections
        .iter()
        .map(|(&pid, inspection)| (pid, &inspection.records[..]))
        .collect();
    match validate_records(&records) {
        Ok(topology) if errors.is_empty() => Ok(topology),
        Ok(_) => Err(errors),
        Err(more) => {
            errors.extend(more);
            Err(errors)
        }
    }
}

/// Validates records alone (a state file, or inspections already checked for phase).
pub fn validate_records(
    participants: &BTreeMap<NamespacePid, &[Record]>,
) -> Result<Topology, Vec<TopologyError>> {
    let mut checker = Checker::index(participants);
    checker.allocations();
    checker.mappings();
    checker.multicast();
    let topology = checker.summary();
    if checker.errors.is_empty() {
        Ok(topology)
    } else {
        Err(checker.errors)
    }
}

fn is_participant(participants: &BTreeMap<NamespacePid, &[Record]>, pid: NamespacePid) -> bool {
    participants.contains_key(&pid)
}

struct Checker<'a> {
    participants: &'a BTreeMap<NamespacePid, &'a [Record]>,
    errors: Vec<TopologyError>,
    /// First allocation record per (participant, id).
    allocations: BTreeMap<(NamespacePid, AllocationId), &'a AllocationRecord>,
    /// Participants holding a creator allocation record, per id.
    allocation_creators: BTreeMap<AllocationId, BTreeSet<NamespacePid>>,
    /// First multicast record per (participant, id).
    multicasts: BTreeMap<(NamespacePid, AllocationId), &'a MulticastRecord>,
    multicast_creators: BTreeMap<AllocationId, BTreeSet<NamespacePid>>,
    /// Attached devices per object id.
    devices: BTreeMap<AllocationId, BTreeSet<(NamespacePid, i32)>>,
    /// (participant, id, device) of every binding.
    bindings: BTreeSet<(NamespacePid, AllocationId, i32)>,
    /// (participant, id) of allocations mapped in that participant.
    mapped: BTreeSet<(NamespacePid, AllocationId)>,
}

impl<'a> Checker<'a> {
    /// First pass: index definitions, report duplicates.
    fn index(participants: &'a BTreeMap<NamespacePid, &'a [Record]>) -> Self {
        let mut checker = Self {
            participants,
            errors: Vec::new(),
            allocations: BTreeMap::new(),
            allocation_creators: BTreeMap::new(),
            multicasts: BTreeMap::new(),
            multicast_creators: BTreeMap::new(),
            devices: BTreeMap::new(),
            bindings: BTreeSet::new(),
            mapped: BTreeSet::new(),
        };
        if participants.is_empty() {
            checker.errors.push(TopologyError::NoParticipants);
        }
        for (&pid, records) in participants {
            for record in records.iter() {
                match record {
                    Record::Allocation(r) => {
                        if r.allocation.creator_pid == pid {
                            checker
                                .allocation_creators
                                .entry(r.allocation.id)
                                .or_default()
                                .insert(pid);
                        }
                        match checker.allocations.entry((pid, r.allocation.id)) {
                            Entry::Occupied(_) => {
                                checker.errors.push(TopologyError::DuplicateRecord {
                                    pid,
                                    object: Object::Allocation(r.allocation.clone()),
                                })
                            }
                            Entry::Vacant(slot) => {
                                slot.insert(r);
                            }
                        }
                    }
                    Record::Multicast(r) => {
                        if r.object.creator_pid == pid {
                            checker
                                .multicast_creators
                                .entry(r.object.id)
                                .or_default()
                                .insert(pid);
                        }
                        match checker.multicasts.entry((pid, r.object.id)) {
                            Entry::Occupied(_) => {
                                checker.errors.push(TopologyError::DuplicateRecord {
                                    pid,
                                    object: Object::Multicast(r.object.clone()),
                                })
                            }
                            Entry::Vacant(slot) => {
                                slot.insert(r);
                            }
                        }
                    }
                    Record::Mapping(r) => {
                        checker.mapped.insert((pid, r.allocation.id));
                    }
                    Record::MulticastDevice(r) => {
                        let fresh = checker
                            .devices
                            .entry(r.object.id)
                            .or_default()
                            .insert((pid, r.device));
                        if !fresh {
                            checker
                                .errors
                                .push(TopologyError::DuplicateMulticastDevice {
                                    pid,
                                    object: Object::Multicast(r.object.clone()),
                                    device: r.device,
                                });
                        }
                    }
                    Record::MulticastBinding(r) => {
                        checker.bindings.insert((pid, r.object.id, r.device));
                    }
                    Record::MulticastMapping(_) => {}
                }
            }
        }
        for (kind, creators) in [
            ("allocation", &checker.allocation_creators),
            ("multicast object", &checker.multicast_creators),
        ] {
            for (id, claimants) in creators {
                if claimants.len() > 1 {
                    checker.errors.push(TopologyError::MultipleCreators {
                        kind,
                        id: *id,
                        claimants: claimants.iter().copied().collect(),
                    });
                }
            }
        }
        checker
    }

    /// The one participant holding the creator record of `id`, if exactly one does.
    fn sole_creator(
        creators: &BTreeMap<AllocationId, BTreeSet<NamespacePid>>,
        id: AllocationId,
    ) -> Option<NamespacePid> {
        match creators.get(&id) {
            Some(claimants) if claimants.len() == 1 => claimants.first().copied(),
            _ => None,
        }
    }

    /// Checks a reference held by `pid` against the creator records of its id; returns whether
    /// it is consistent (the creator holds a creator record under the referenced PID).
    fn check_reference(
        &mut self,
        pid: NamespacePid,
        object: Object,
        creators: &BTreeMap<AllocationId, BTreeSet<NamespacePid>>,
    ) -> bool {
        let reference = object.reference();
        let named = reference.creator_pid;
        match creators.get(&reference.id) {
            // Several claimants: reported once globally.
            Some(claimants) if claimants.len() > 1 => false,
            Some(claimants) if claimants.contains(&named) => true,
            Some(claimants) => {
                let creator = *claimants.first().expect("non-empty set");
                self.errors.push(TopologyError::ConflictingCreator {
                    pid,
                    object,
                    creator,
                });
                false
            }
            None if !is_participant(self.participants, named) => {
                self.errors
                    .push(TopologyError::CreatorNotParticipant { pid, object });
                false
            }
            None => {
                self.errors
                    .push(TopologyError::MissingCreatorRecord { pid, object });
                false
            }
        }
    }

    fn allocations(&mut self) {
        let allocations: Vec<(NamespacePid, &AllocationRecord)> = self
            .allocations
            .iter()
            .map(|(&(pid, _), &record)| (pid, record))
            .collect();
        let creators = self.allocation_creators.clone();
        let mut importers: BTreeMap<AllocationId, Vec<NamespacePid>> = BTreeMap::new();
        for &(pid, record) in &allocations {
            let object = Object::Allocation(record.allocation.clone());
            if record.allocation.creator_pid == pid {
                if record.size == 0 {
                    self.errors.push(TopologyError::ZeroSize { pid, object });
                }
                continue;
            }
            importers.entry(record.allocation.id).or_default().push(pid);
            if record.host_carrier {
                self.errors.push(TopologyError::CarrierOnImporter {
                    pid,
                    object: object.clone(),
                });
            }
            if !self.check_reference(pid, object.clone(), &creators) {
                continue;
            }
            let creator = self.allocations[&(record.allocation.creator_pid, record.allocation.id)];
            if record.size != creator.size {
                self.errors.push(TopologyError::ImportSizeMismatch {
                    pid,
                    object: object.clone(),
                    size: record.size,
                    creator_size: creator.size,
                });
            }
            if record.properties != creator.properties {
                self.errors.push(TopologyError::ImportPropertiesMismatch {
                    pid,
                    object,
                    found: allocation_properties(&record.properties),
                    expected: allocation_properties(&creator.properties),
                });
            }
        }
        for &(pid, record) in &allocations {
            if record.allocation.creator_pid != pid {
                continue;
            }
            let object = Object::Allocation(record.allocation.clone());
            let importers = importers
                .get(&record.allocation.id)
                .cloned()
                .unwrap_or_default();
            if !importers.is_empty() && !record.host_carrier {
                self.errors.push(TopologyError::SharedWithoutCarrier {
                    pid,
                    object: object.clone(),
                    importers,
                });
            }
            if record.host_carrier
                && record.handle_count == 0
                && !self.mapped.contains(&(pid, record.allocation.id))
            {
                self.errors
                    .push(TopologyError::MissingAnchor { pid, object });
            }
        }
    }

    fn mappings(&mut self) {
        let participants = self.participants;
        for (&pid, records) in participants {
            for record in records.iter() {
                let Record::Mapping(r) = record else { continue };
                let object = Object::Allocation(r.allocation.clone());
                self.check_range(pid, &object, "mapping", r.address, r.size);
                self.check_access(pid, &object, "mapping", r.address, &r.access);
                let allocation = self
                    .allocations
                    .get(&(pid, r.allocation.id))
                    .copied()
                    .filter(|allocation| allocation.allocation == r.allocation);
                let Some(allocation) = allocation else {
                    self.errors.push(TopologyError::UnknownObject {
                        pid,
                        object,
                        what: "mapping",
                        address: r.address,
                    });
                    continue;
                };
                let fits = r
                    .offset
                    .checked_add(r.size)
                    .is_some_and(|end| end <= allocation.size);
                if !fits {
                    self.errors.push(TopologyError::MappingOutOfBounds {
                        pid,
                        object,
                        address: r.address,
                        offset: r.offset,
                        size: r.size,
                        allocation_size: allocation.size,
                    });
                }
            }
        }
    }

    /// A mapped range: non-zero size, non-null address, no wrap-around.
    fn check_range(
        &mut self,
        pid: NamespacePid,
        object: &Object,
        what: &'static str,
        address: u64,
        size: u64,
    ) {
        let problem = if size == 0 {
            Some("size is 0".to_string())
        } else if address == 0 {
            Some("address is null".to_string())
        } else if address.checked_add(size).is_none() {
            Some(format!("size {size:#x} wraps around the address space"))
        } else {
            None
        };
        if let Some(problem) = problem {
            self.errors.push(TopologyError::InvalidRange {
                pid,
                object: object.clone(),
                what,
                address,
                problem,
            });
        }
    }

    fn check_access(
        &mut self,
        pid: NamespacePid,
        object: &Object,
        what: &'static str,
        address: u64,
        access: &[AccessDescriptor],
    ) {
        let mut seen = BTreeSet::new();
        for descriptor in access {
            let location = &descriptor.location;
            // The id is meaningful for devices and NUMA nodes only; CUDA ignores it otherwise.
            let key = match location.location_type {
                LocationType::Host | LocationType::HostNumaCurrent => (location.location_type, 0),
                LocationType::Device | LocationType::HostNuma => {
                    if location.id < 0 {
                        self.errors.push(TopologyError::InvalidAccessLocation {
                            pid,
                            object: object.clone(),
                            what,
                            address,
                            location: render::location(location),
                        });
                    }
                    (location.location_type, location.id)
                }
            };
            if !seen.insert(key) {
                self.errors.push(TopologyError::DuplicateAccess {
                    pid,
                    object: object.clone(),
                    what,
                    address,
                    location: render::location(location),
                });
            }
        }
    }

    fn multicast(&mut self) {
        let creators = self.multicast_creators.clone();
        let multicasts: Vec<(NamespacePid, &MulticastRecord)> = self
            .multicasts
            .iter()
            .map(|(&(pid, _), &record)| (pid, record))
            .collect();
        for &(pid, record) in &multicasts {
            let object = Object::Multicast(record.object.clone());
            if record.object.creator_pid == pid {
                let properties = &record.properties;
                let problem = if properties.device_count == 0 {
                    Some("device count is 0")
                } else if properties.size == 0 {
                    Some("size is 0")
                } else if properties.flags != 0 {
                    Some("creation flags must be 0")
                } else {
                    None
                };
                if let Some(problem) = problem {
                    self.errors.push(TopologyError::InvalidMulticastProperties {
                        pid,
                        object,
                        problem,
                    });
                }
                continue;
            }
            if !self.check_reference(pid, object.clone(), &creators) {
                continue;
            }
            let creator = self.multicasts[&(record.object.creator_pid, record.object.id)];
            if record.properties != creator.properties {
                self.errors.push(TopologyError::ImportPropertiesMismatch {
                    pid,
                    object,
                    found: multicast_properties(&record.properties),
                    expected: multicast_properties(&creator.properties),
                });
            }
        }

        // Device group completeness, against the creator's declared count.
        for (&id, claimants) in &creators {
            let Some(creator) = Self::sole_creator(&creators, id) else {
                continue;
            };
            debug_assert!(claimants.contains(&creator));
            let record = self.multicasts[&(creator, id)];
            let found = self.devices.get(&id).map_or(0, BTreeSet::len);
            if found != record.properties.device_count as usize {
                self.errors.push(TopologyError::IncompleteMulticastGroup {
                    object: Object::Multicast(record.object.clone()),
                    expected: record.properties.device_count,
                    found,
                });
            }
        }

        let participants = self.participants;
        for (&pid, records) in participants {
            for record in records.iter() {
                match record {
                    Record::MulticastDevice(r) => {
                        let object = Object::Multicast(r.object.clone());
                        if !self.holds_multicast(pid, &r.object) {
                            self.errors.push(TopologyError::MulticastRecordMissing {
                                pid,
                                object: object.clone(),
                                what: "device",
                            });
                        }
                        if !self.bindings.contains(&(pid, r.object.id, r.device)) {
                            self.errors.push(TopologyError::UnboundDevice {
                                pid,
                                object,
                                device: r.device,
                            });
                        }
                    }
                    Record::MulticastBinding(r) => {
                        let object = Object::Multicast(r.object.clone());
                        if !self.holds_multicast(pid, &r.object) {
                            self.errors.push(TopologyError::MulticastRecordMissing {
                                pid,
                                object: object.clone(),
                                what: "binding",
                            });
                        }
                        let attached = self
                            .devices
                            .get(&r.object.id)
                            .is_some_and(|devices| devices.contains(&(pid, r.device)));
                        if !attached {
                            self.errors.push(TopologyError::BindingDeviceNotAttached {
                                pid,
                                object: object.clone(),
                                device: r.device,
                            });
                        }
                        if r.size == 0 {
                            self.errors.push(TopologyError::InvalidBinding {
                                pid,
                                object: object.clone(),
                                device: r.device,
                                problem: "size is 0".to_string(),
                            });
                        }
                        let member = match &r.source {
                            BindingSource::Memory(source) => Some(&source.member),
                            BindingSource::Address(source) => {
                                if source.address == 0 {
                                    self.errors.push(TopologyError::InvalidBinding {
                                        pid,
                                        object: object.clone(),
                                        device: r.device,
                                        problem: "bound address is null".to_string(),
                                    });
                                }
                                source.member.as_ref()
                            }
                        };
                        if let Some(member) = member {
                            self.check_member(pid, &object, r.device, member, r.size);
                        }
                    }
                    Record::MulticastMapping(r) => {
                        let object = Object::Multicast(r.object.clone());
                        if !self.holds_multicast(pid, &r.object) {
                            self.errors.push(TopologyError::UnknownObject {
                                pid,
                                object: object.clone(),
                                what: "multicast mapping",
                                address: r.address,
                            });
                        }
                        self.check_range(pid, &object, "multicast mapping", r.address, r.size);
                        if r.flags != 0 {
                            self.errors.push(TopologyError::InvalidRange {
                                pid,
                                object: object.clone(),
                                what: "multicast mapping",
                                address: r.address,
                                problem: format!("cuMemMap flags {:#x} (must be 0)", r.flags),
                            });
                        }
                        self.check_access(pid, &object, "multicast mapping", r.address, &r.access);
                    }
                    Record::Allocation(_) | Record::Mapping(_) | Record::Multicast(_) => {}
                }
            }
        }
    }

    fn holds_multicast(&self, pid: NamespacePid, object: &AllocationReference) -> bool {
        self.multicasts
            .get(&(pid, object.id))
            .is_some_and(|record| record.object == *object)
    }

    fn check_member(
        &mut self,
        pid: NamespacePid,
        object: &Object,
        device: i32,
        member: &MemberRange,
        size: u64,
    ) {
        let allocation = self
            .allocations
            .get(&(pid, member.allocation.id))
            .copied()
            .filter(|allocation| allocation.allocation == member.allocation);
        let Some(allocation) = allocation else {
            self.errors.push(TopologyError::UnknownMember {
                pid,
                object: object.clone(),
                device,
                member: member.allocation.clone(),
            });
            return;
        };
        let fits = member
            .offset
            .checked_add(size)
            .is_some_and(|end| end <= allocation.size);
        if !fits {
            self.errors.push(TopologyError::MemberOutOfBounds {
                pid,
                object: object.clone(),
                device,
                member: member.allocation.clone(),
                offset: member.offset,
                size,
                allocation_size: allocation.size,
            });
        }
    }

    fn summary(&mut self) -> Topology {
        let mut topology = Topology {
            participants: self.participants.keys().copied().collect(),
            records: self
                .participants
                .values()
                .map(|records| records.len())
                .sum(),
            ..Topology::default()
        };
        let mut importers: BTreeMap<AllocationId, Vec<NamespacePid>> = BTreeMap::new();
        for (&(pid, id), record) in &self.allocations {
            if record.allocation.creator_pid != pid {
                topology.importer_records += 1;
                importers.entry(id).or_default().push(pid);
            }
        }
        for &pid in self.participants.keys() {
            topology.bytes_per_participant.insert(pid, 0);
        }
        let mut total: Option<u64> = Some(0);
        for (&(pid, id), record) in &self.allocations {
            if record.allocation.creator_pid != pid || !record.host_carrier {
                continue;
            }
            topology.shared_allocations.push(SharedAllocation {
                allocation: record.allocation.clone(),
                size: record.size,
                importers: importers.get(&id).cloned().unwrap_or_default(),
            });
            let bytes = topology.bytes_per_participant.entry(pid).or_insert(0);
            match bytes.checked_add(record.size) {
                Some(sum) => *bytes = sum,
                None => {
                    if !self
                        .errors
                        .contains(&TopologyError::ByteCountOverflow { pid })
                    {
                        self.errors.push(TopologyError::ByteCountOverflow { pid });
                    }
                }
            }
            total = total.and_then(|total| total.checked_add(record.size));
        }
        topology.bytes_to_save = total.unwrap_or(u64::MAX);
        for (&id, claimants) in &self.multicast_creators {
            let Some(&creator) = claimants.first() else {
                continue;
            };
            let record = self.multicasts[&(creator, id)];
            let members = self
                .multicasts
                .keys()
                .filter(|(_, other)| *other == id)
                .map(|(pid, _)| *pid)
                .collect();
            topology.multicast_groups.push(MulticastGroup {
                object: record.object.clone(),
                properties: record.properties.clone(),
                members,
                devices: self
                    .devices
                    .get(&id)
                    .map(|devices| devices.iter().copied().collect())
                    .unwrap_or_default(),
            });
        }
        topology
    }
}

fn allocation_properties(properties: &AllocationProperties) -> String {
    format!(
        "{} on {}, handle types {}",
        render::allocation_type_name(properties.allocation_type),
        render::location(&properties.location),
        render::handle_type_names(properties.handle_types).join("|")
    )
}

fn multicast_properties(properties: &MulticastProperties) -> String {
    format!(
        "{} devices, size {:#x}, handle types {}, flags {:#x}",
        properties.device_count,
        properties.size,
        render::handle_type_names(properties.handle_types).join("|"),
        properties.flags
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    type Participants = BTreeMap<NamespacePid, Vec<Record>>;

    fn valid() -> Participants {
        shared_topology(101)
    }

    fn of(participants: &mut Participants, p: u32) -> &mut Vec<Record> {
        participants.get_mut(&pid(p)).expect("participant")
    }

    /// Validation of `inspections` fails, and one error is at `participant` (None: global),
    /// names `object` by hex id and contains `rule`. Every error is one line starting with its
    /// scope. Returns all errors.
    fn check_inspections(
        inspections: &BTreeMap<NamespacePid, InspectionReply>,
        participant: Option<u32>,
        object: Option<u8>,
        rule: &str,
    ) -> Vec<TopologyError> {
        let errors = validate(inspections).expect_err("validation must fail");
        for error in &errors {
            let text = error.to_string();
            assert!(!text.contains('\n'), "one line: {text}");
            let prefix = match error.participant() {
                Some(pid) => format!("participant {pid}: "),
                None => "topology: ".to_string(),
            };
            assert!(text.starts_with(&prefix), "{text}");
        }
        let found = errors.iter().any(|error| {
            let text = error.to_string();
            error.participant().map(NamespacePid::get) == participant
                && object.is_none_or(|n| text.contains(&id(n).to_string()))
                && text.contains(rule)
        });
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            found,
            "expected an error at {participant:?} naming {object:?} with `{rule}`, got:\n{}",
            lines.join("\n")
        );
        errors
    }

    fn check(
        participants: &Participants,
        participant: Option<u32>,
        object: Option<u8>,
        rule: &str,
    ) -> Vec<TopologyError> {
        check_inspections(
            &inspections(participants, Phase::Active),
            participant,
            object,
            rule,
        )
    }

    #[test]
    fn shared_topology_is_valid_and_summarised() {
        let topology = validate(&inspections(&valid(), Phase::Active)).expect("valid");
        assert_eq!(topology.participants, [pid(101), pid(102), pid(103)]);
        assert_eq!(topology.shared_allocations.len(), 1);
        let shared = &topology.shared_allocations[0];
        assert_eq!(shared.allocation, reference(1, 101));
        assert_eq!(shared.size, SIZE);
        assert_eq!(shared.importers, [pid(102), pid(103)]);
        assert_eq!(topology.importer_records, 2);
        assert_eq!(topology.bytes_to_save, SIZE);
        assert_eq!(topology.bytes_of(pid(101)), SIZE);
        assert_eq!(topology.bytes_of(pid(102)), 0);
        assert_eq!(topology.multicast_groups.len(), 1);
        let group = &topology.multicast_groups[0];
        assert_eq!(group.members, [pid(101), pid(102), pid(103)]);
        assert_eq!(group.devices, [(pid(101), 0), (pid(102), 0), (pid(103), 0)]);
        assert_eq!(topology.records, 19);
    }

    #[test]
    fn record_and_participant_order_do_not_matter() {
        let expected = validate(&inspections(&valid(), Phase::Active)).expect("valid");
        for rotation in 0..19 {
            let mut participants = valid();
            for records in participants.values_mut() {
                let len = records.len();
                records.rotate_left(rotation % len);
                records.reverse();
            }
            // `inspection` sorts; build unsorted replies directly.
            let replies = participants
                .iter()
                .map(|(p, records)| {
                    let mut reply = inspection(p.get(), Phase::Active, Vec::new());
                    reply.records = records.clone().try_into().expect("bounded");
                    (*p, reply)
                })
                .collect();
            assert_eq!(
                validate(&replies).expect("valid"),
                expected,
                "rotation {rotation}"
            );
        }
    }

    #[test]
    fn participant_rules() {
        check(&BTreeMap::new(), None, None, "no participants");

        let mut replies = inspections(&valid(), Phase::Active);
        replies.get_mut(&pid(102)).expect("102").namespace_pid = pid(7);
        check_inspections(&replies, Some(102), None, "answered as namespace pid 7");

        let mut replies = inspections(&valid(), Phase::Active);
        replies.get_mut(&pid(102)).expect("102").phase = Phase::Frozen;
        check_inspections(
            &replies,
            Some(102),
            None,
            "in phase frozen, expected phase active",
        );
        assert!(validate_in_phase(&replies, Phase::Frozen).is_err());
        let frozen = inspections(&valid(), Phase::Frozen);
        assert!(validate_in_phase(&frozen, Phase::Frozen).is_ok());

        let mut replies = inspections(&valid(), Phase::Active);
        replies.get_mut(&pid(103)).expect("103").raw_imports = 2;
        check_inspections(&replies, Some(103), None, "2 live imports");
    }

    #[test]
    fn creator_rules() {
        let mut p = valid();
        of(&mut p, 101).push(allocation(1, 101, SIZE, true, 3).into());
        check(&p, Some(101), Some(1), "reported twice");

        let mut p = valid();
        of(&mut p, 102).retain(|r| !matches!(r, Record::Allocation(_)));
        of(&mut p, 102).push(allocation(1, 102, SIZE, true, 1).into());
        check(
            &p,
            None,
            Some(1),
            "claimed as creator by participants 101, 102",
        );

        let mut p = valid();
        of(&mut p, 103).retain(|r| !matches!(r, Record::Allocation(_)));
        of(&mut p, 103).push(allocation(1, 102, SIZE, false, 1).into());
        check(
            &p,
            Some(103),
            Some(1),
            "names creator 102, but participant 101 holds the creator record",
        );

        let mut p = valid();
        of(&mut p, 103).push(allocation(5, 999, SIZE, false, 1).into());
        check(
            &p,
            Some(103),
            Some(5),
            "imported from participant 999, which is not a participant",
        );

        let mut p = valid();
        of(&mut p, 103).push(allocation(5, 102, SIZE, false, 1).into());
        check(
            &p,
            Some(103),
            Some(5),
            "its creator (participant 102) has no creator record",
        );

        let mut p = valid();
        of(&mut p, 101).push(allocation(6, 101, 0, false, 1).into());
        check(&p, Some(101), Some(6), "created with size 0");
    }

    #[test]
    fn importer_rules() {
        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::Allocation(r) = record {
                r.size = 2 * SIZE;
            }
        }
        check(
            &p,
            Some(102),
            Some(1),
            "importer record has size 0x400000, the creator's has 0x200000",
        );

        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::Allocation(r) = record {
                r.properties.location.id = 1;
            }
        }
        check(
            &p,
            Some(102),
            Some(1),
            "importer properties (pinned on device 1",
        );

        let mut p = valid();
        for record in of(&mut p, 103).iter_mut() {
            if let Record::Allocation(r) = record {
                r.host_carrier = true;
            }
        }
        check(
            &p,
            Some(103),
            Some(1),
            "host carrier set on an importer record",
        );
    }

    #[test]
    fn shared_allocations_need_the_carrier_and_an_anchor() {
        let mut p = valid();
        for record in of(&mut p, 101).iter_mut() {
            if let Record::Allocation(r) = record {
                r.host_carrier = false;
            }
        }
        check(
            &p,
            Some(101),
            Some(1),
            "imported by participants 102, 103 but not marked for the host carrier",
        );

        // A mapping alone anchors.
        let mut p = valid();
        for record in of(&mut p, 101).iter_mut() {
            if let Record::Allocation(r) = record {
                r.handle_count = 0;
            }
        }
        validate(&inspections(&p, Phase::Active)).expect("a mapping anchors");
        of(&mut p, 101).retain(|r| !matches!(r, Record::Mapping(_)));
        check(&p, Some(101), Some(1), "has no anchor");
    }

    #[test]
    fn mapping_rules() {
        let mut p = valid();
        of(&mut p, 102).push(mapping(7, 101, address(102, 7), SIZE, 0).into());
        check(&p, Some(102), Some(7), "mapping at 0x7f66");
        check(
            &p,
            Some(102),
            Some(7),
            "refers to no allocation record of this participant",
        );

        for (size, address, rule) in [
            (0, address(102, 1), "size is 0"),
            (SIZE, 0, "address is null"),
            (SIZE, u64::MAX - 10, "wraps around the address space"),
        ] {
            let mut p = valid();
            of(&mut p, 102).push(mapping(1, 101, address, size, 0).into());
            check(&p, Some(102), Some(1), rule);
        }

        for offset in [SIZE / 2, u64::MAX] {
            let mut p = valid();
            of(&mut p, 102).push(mapping(1, 101, address(102, 3), SIZE, offset).into());
            check(
                &p,
                Some(102),
                Some(1),
                "exceeds the allocation size 0x200000",
            );
        }
    }

    #[test]
    fn access_rules() {
        use cuinterpose_protocol::{AccessFlags, Location, LocationType};
        let with_access = |access: Vec<AccessDescriptor>| {
            let mut p = valid();
            for record in of(&mut p, 102).iter_mut() {
                if let Record::Mapping(r) = record {
                    r.access = access.clone().try_into().expect("bounded");
                }
            }
            p
        };
        let host = |id, flags| AccessDescriptor {
            location: Location {
                location_type: LocationType::Host,
                id,
            },
            flags,
        };
        let p = with_access(vec![read_write(0), read_write(1), read_write(0)]);
        check(
            &p,
            Some(102),
            Some(1),
            "access list names device 0 more than once",
        );
        // The host location's id is ignored: two entries are still the same location.
        let p = with_access(vec![
            host(0, AccessFlags::ProtRead),
            host(5, AccessFlags::ProtReadWrite),
        ]);
        check(
            &p,
            Some(102),
            Some(1),
            "access list names host more than once",
        );
        let p = with_access(vec![read_write(-1)]);
        check(
            &p,
            Some(102),
            Some(1),
            "access location device -1 has an invalid id",
        );
        let p = with_access(vec![
            read_write(0),
            read_write(1),
            host(0, AccessFlags::ProtNone),
        ]);
        validate(&inspections(&p, Phase::Active)).expect("distinct locations");
    }

    #[test]
    fn multicast_object_rules() {
        let mut p = valid();
        of(&mut p, 102).retain(|r| !matches!(r, Record::Multicast(_)));
        of(&mut p, 102).push(multicast(9, 102, 3, SIZE).into());
        check(&p, None, Some(9), "multicast object");
        check(
            &p,
            None,
            Some(9),
            "claimed as creator by participants 101, 102",
        );

        let mut p = valid();
        of(&mut p, 103).push(multicast(9, 101, 3, SIZE).into());
        check(&p, Some(103), Some(9), "reported twice");

        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::Multicast(r) = record {
                r.properties.device_count = 2;
            }
        }
        check(&p, Some(102), Some(9), "importer properties (2 devices");

        for (edit, rule) in [
            (
                (|r: &mut MulticastRecord| r.properties.device_count = 0) as fn(&mut _),
                "device count is 0",
            ),
            (|r| r.properties.size = 0, "size is 0"),
            (|r| r.properties.flags = 1, "creation flags must be 0"),
        ] {
            let mut p = valid();
            for records in p.values_mut() {
                for record in records.iter_mut() {
                    if let Record::Multicast(r) = record {
                        edit(r);
                    }
                }
            }
            check(&p, Some(101), Some(9), rule);
        }

        let mut p = valid();
        of(&mut p, 103).push(multicast(8, 555, 1, SIZE).into());
        check(
            &p,
            Some(103),
            Some(8),
            "imported from participant 555, which is not a participant",
        );
    }

    #[test]
    fn multicast_device_rules() {
        let mut p = valid();
        of(&mut p, 103)
            .retain(|r| !matches!(r, Record::MulticastDevice(_) | Record::MulticastBinding(_)));
        check(
            &p,
            None,
            Some(9),
            "2 (participant, device) pairs attached across participants, the object was created for 3",
        );

        let mut p = valid();
        of(&mut p, 101).push(multicast_device(9, 101, 1).into());
        of(&mut p, 101)
            .push(memory_binding(reference(9, 101), reference(1, 101), 0, SIZE, 1).into());
        check(&p, None, Some(9), "4 (participant, device) pairs");

        let mut p = valid();
        of(&mut p, 102).push(multicast_device(9, 101, 0).into());
        check(&p, Some(102), Some(9), "device 0 added more than once");

        let mut p = valid();
        of(&mut p, 102).retain(|r| !matches!(r, Record::MulticastBinding(_)));
        check(
            &p,
            Some(102),
            Some(9),
            "device 0 is attached but has no binding in this participant",
        );

        let mut p = valid();
        of(&mut p, 102)
            .push(memory_binding(reference(9, 101), reference(1, 101), 0, SIZE, 1).into());
        check(
            &p,
            Some(102),
            Some(9),
            "binding on device 1, which this participant did not attach",
        );

        let mut p = valid();
        of(&mut p, 102).push(multicast_device(8, 101, 0).into());
        check(
            &p,
            Some(102),
            Some(8),
            "device for a multicast object this participant holds no record of",
        );
    }

    #[test]
    fn multicast_binding_rules() {
        let mut p = valid();
        of(&mut p, 102)
            .push(memory_binding(reference(9, 101), reference(7, 101), 0, SIZE, 0).into());
        let errors = check(&p, Some(102), Some(9), "member allocation");
        assert!(errors.iter().any(|e| e.to_string().contains(&format!(
            "{} (creator 101) is not an allocation record",
            id(7)
        ))));

        let mut p = valid();
        of(&mut p, 102)
            .push(memory_binding(reference(9, 101), reference(1, 101), SIZE / 2, SIZE, 0).into());
        check(
            &p,
            Some(102),
            Some(9),
            "offset 0x100000 + size 0x200000 exceeds its size 0x200000",
        );

        let mut p = valid();
        of(&mut p, 102).push(memory_binding(reference(9, 101), reference(1, 101), 0, 0, 0).into());
        check(&p, Some(102), Some(9), "binding on device 0: size is 0");

        let mut p = valid();
        of(&mut p, 102).push(address_binding(reference(9, 101), 0, None, SIZE, 0).into());
        check(&p, Some(102), Some(9), "bound address is null");

        // Address bindings, tracked or not, are valid when in bounds.
        let mut p = valid();
        of(&mut p, 102).retain(|r| !matches!(r, Record::MulticastBinding(_)));
        let tracked = MemberRange {
            allocation: reference(1, 101),
            offset: 0,
        };
        of(&mut p, 102).push(
            address_binding(reference(9, 101), address(102, 1), Some(tracked), SIZE, 0).into(),
        );
        of(&mut p, 103).retain(|r| !matches!(r, Record::MulticastBinding(_)));
        of(&mut p, 103).push(address_binding(reference(9, 101), 0x1000, None, SIZE, 0).into());
        validate(&inspections(&p, Phase::Active)).expect("address bindings");
        let tracked = MemberRange {
            allocation: reference(1, 101),
            offset: 1,
        };
        of(&mut p, 102).push(
            address_binding(reference(9, 101), address(102, 1), Some(tracked), SIZE, 0).into(),
        );
        check(&p, Some(102), Some(9), "offset 0x1 + size 0x200000 exceeds");

        let mut p = valid();
        of(&mut p, 102)
            .push(memory_binding(reference(8, 101), reference(1, 101), 0, SIZE, 0).into());
        check(
            &p,
            Some(102),
            Some(8),
            "binding for a multicast object this participant holds no record of",
        );
    }

    #[test]
    fn multicast_mapping_rules() {
        let mut p = valid();
        of(&mut p, 102).push(multicast_mapping(reference(8, 101), address(102, 8), SIZE).into());
        check(&p, Some(102), Some(8), "multicast mapping at");
        check(
            &p,
            Some(102),
            Some(8),
            "refers to no multicast record of this participant",
        );

        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::MulticastMapping(r) = record {
                r.flags = 4;
            }
        }
        check(&p, Some(102), Some(9), "cuMemMap flags 0x4 (must be 0)");

        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::MulticastMapping(r) = record {
                r.size = 0;
                r.access = vec![read_write(2), read_write(2)]
                    .try_into()
                    .expect("bounded");
            }
        }
        let errors = check(&p, Some(102), Some(9), "multicast mapping at");
        assert!(errors.iter().any(|e| e.to_string().contains("size is 0")));
        assert!(
            errors
                .iter()
                .any(|e| e.to_string().contains("names device 2 more than once"))
        );
    }

    #[test]
    fn byte_counts_are_overflow_checked() {
        let mut p = valid();
        of(&mut p, 101).push(allocation(3, 101, u64::MAX - 1, true, 1).into());
        check(&p, Some(101), None, "overflow 64 bits");
    }

    #[test]
    fn every_problem_is_reported() {
        let mut p = valid();
        of(&mut p, 101).push(allocation(6, 101, 0, false, 1).into());
        of(&mut p, 102).push(mapping(7, 101, address(102, 7), SIZE, 0).into());
        of(&mut p, 103).push(allocation(5, 999, SIZE, false, 1).into());
        let errors = validate(&inspections(&p, Phase::Active)).expect_err("invalid");
        let scopes: BTreeSet<_> = errors
            .iter()
            .filter_map(TopologyError::participant)
            .collect();
        assert_eq!(
            scopes,
            BTreeSet::from([pid(101), pid(102), pid(103)]),
            "{errors:?}"
        );
    }
}
