//! The allocation passes: creator and importer records against each other (sizes,
//! properties, host carriers, anchors), then every mapping against the allocation it maps.

use std::collections::BTreeMap;

use cuinterpose_protocol::{
    AllocationId, AllocationProperties, AllocationRecord, LocationType, NamespacePid, Record,
};

use super::checker::Checker;
use super::errors::{Object, TopologyError};
use crate::render;

impl Checker<'_> {
    /// `pid`'s import `record` of `object` against its creator's record.
    fn check_import(
        &mut self,
        pid: NamespacePid,
        object: Object,
        record: &AllocationRecord,
        creator: &AllocationRecord,
    ) {
        if record.size != creator.size {
            self.errors.push(TopologyError::ImportSizeMismatch {
                pid,
                object: object.clone(),
                size: record.size,
                creator_size: creator.size,
            });
        }
        if !same_memory(&record.properties, &creator.properties) {
            self.errors.push(TopologyError::ImportPropertiesMismatch {
                pid,
                object,
                found: render::allocation_properties(&record.properties),
                expected: render::allocation_properties(&creator.properties),
            });
        }
    }

    /// Creator and importer allocation records.
    pub(super) fn allocations(&mut self) {
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
            if self.check_reference(pid, object.clone(), &creators) {
                let creator =
                    self.allocations[&(record.allocation.creator_pid, record.allocation.id)];
                self.check_import(pid, object, record, creator);
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

    /// Every mapping: a valid range and access list, within an allocation record of its
    /// participant.
    pub(super) fn mappings(&mut self) {
        let participants = self.participants;
        for (&pid, records) in participants {
            for record in records.iter() {
                let Record::Mapping(r) = record else { continue };
                let object = Object::Allocation(r.allocation.clone());
                self.check_range(pid, &object, "mapping", r.address, r.size);
                self.check_access(pid, &object, "mapping", r.address, &r.access);
                let Some(allocation) = self.held_allocation(pid, &r.allocation) else {
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
}

/// Whether an importer's properties describe the creator's memory. Ordinals are each
/// process's own, so a device named by UUID in both is compared by UUID: an importer that
/// numbers its GPUs differently (another `CUDA_VISIBLE_DEVICES`) sees the same GPU under
/// another ordinal.
fn same_memory(import: &AllocationProperties, creator: &AllocationProperties) -> bool {
    let (a, b) = (&import.location, &creator.location);
    let same_place = match (a.location_type, a.uuid, b.uuid) {
        (LocationType::Device, Some(ours), Some(theirs)) => {
            b.location_type == LocationType::Device && ours == theirs
        }
        _ => a == b,
    };
    same_place
        && import.allocation_type == creator.allocation_type
        && import.handle_types == creator.handle_types
}
