//! The checker's state and its first pass: every definition indexed (duplicates and rival
//! creators reported), the checks later passes share, and the summary of a valid topology.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use cuinterpose_protocol::{
    AccessDescriptor, AllocationId, AllocationRecord, AllocationReference, LocationType,
    MulticastRecord, NamespacePid, PoolRecord, Record,
};

use super::errors::{Object, TopologyError};
use super::topology::{MulticastGroup, SharedAllocation, Topology};
use crate::render;

fn is_participant(participants: &BTreeMap<NamespacePid, &[Record]>, pid: NamespacePid) -> bool {
    participants.contains_key(&pid)
}

/// Creator participants per object id.
pub(super) type Creators = BTreeMap<AllocationId, BTreeSet<NamespacePid>>;

pub(super) struct Checker<'a> {
    pub(super) participants: &'a BTreeMap<NamespacePid, &'a [Record]>,
    pub(super) errors: Vec<TopologyError>,
    /// First allocation record per (participant, id).
    pub(super) allocations: BTreeMap<(NamespacePid, AllocationId), &'a AllocationRecord>,
    /// Participants holding a creator allocation record, per id.
    pub(super) allocation_creators: Creators,
    /// First multicast record per (participant, id).
    pub(super) multicasts: BTreeMap<(NamespacePid, AllocationId), &'a MulticastRecord>,
    pub(super) multicast_creators: Creators,
    /// Attached devices per object id.
    pub(super) devices: BTreeMap<AllocationId, BTreeSet<(NamespacePid, i32)>>,
    /// (participant, id, device) of every binding.
    pub(super) bindings: BTreeSet<(NamespacePid, AllocationId, i32)>,
    /// (participant, id) of allocations mapped in that participant.
    pub(super) mapped: BTreeSet<(NamespacePid, AllocationId)>,
    /// First pool record per (participant, pool id).
    pub(super) pools: BTreeMap<(NamespacePid, AllocationId), &'a PoolRecord>,
    pub(super) pool_creators: Creators,
}

/// Indexes one allocation or multicast record of `pid`: a creator record is noted under its
/// id, and a second record of the same object is reported.
fn define<'a, R>(
    pid: NamespacePid,
    reference: &AllocationReference,
    record: &'a R,
    object: fn(AllocationReference) -> Object,
    records: &mut BTreeMap<(NamespacePid, AllocationId), &'a R>,
    creators: &mut Creators,
    errors: &mut Vec<TopologyError>,
) {
    if reference.creator_pid == pid {
        creators.entry(reference.id).or_default().insert(pid);
    }
    match records.entry((pid, reference.id)) {
        Entry::Occupied(_) => errors.push(TopologyError::DuplicateRecord {
            pid,
            object: object(reference.clone()),
        }),
        Entry::Vacant(slot) => {
            slot.insert(record);
        }
    }
}

impl<'a> Checker<'a> {
    /// First pass: index definitions, report duplicates.
    pub(super) fn index(participants: &'a BTreeMap<NamespacePid, &'a [Record]>) -> Self {
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
            pools: BTreeMap::new(),
            pool_creators: BTreeMap::new(),
        };
        if participants.is_empty() {
            checker.errors.push(TopologyError::NoParticipants);
        }
        for (&pid, records) in participants {
            for record in records.iter() {
                match record {
                    Record::Allocation(r) => define(
                        pid,
                        &r.allocation,
                        r,
                        Object::Allocation,
                        &mut checker.allocations,
                        &mut checker.allocation_creators,
                        &mut checker.errors,
                    ),
                    Record::Multicast(r) => define(
                        pid,
                        &r.object,
                        r,
                        Object::Multicast,
                        &mut checker.multicasts,
                        &mut checker.multicast_creators,
                        &mut checker.errors,
                    ),
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
                    Record::Pool(r) => define(
                        pid,
                        &r.pool,
                        r,
                        Object::Pool,
                        &mut checker.pools,
                        &mut checker.pool_creators,
                        &mut checker.errors,
                    ),
                    Record::MulticastMapping(_) | Record::PoolMember(_) => {}
                }
            }
        }
        for (kind, creators) in [
            ("allocation", &checker.allocation_creators),
            ("multicast object", &checker.multicast_creators),
            ("memory pool", &checker.pool_creators),
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

    /// Checks a reference held by `pid` against the creator records of its id; returns whether
    /// it is consistent (the creator holds a creator record under the referenced PID).
    pub(super) fn check_reference(
        &mut self,
        pid: NamespacePid,
        object: Object,
        creators: &Creators,
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

    /// `pid`'s allocation record of exactly `reference` (same id and creator), if it holds one.
    pub(super) fn held_allocation(
        &self,
        pid: NamespacePid,
        reference: &AllocationReference,
    ) -> Option<&'a AllocationRecord> {
        self.allocations
            .get(&(pid, reference.id))
            .copied()
            .filter(|allocation| allocation.allocation == *reference)
    }

    /// A mapped range: non-zero size, non-null address, no wrap-around.
    pub(super) fn check_range(
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

    pub(super) fn check_access(
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

    pub(super) fn summary(&mut self) -> Topology {
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
