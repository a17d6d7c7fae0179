//! The multicast pass: each object's properties and creator, its device group against the
//! creator's count, and every device, binding (and its member memory) and mapping.

use std::collections::BTreeSet;

use cuinterpose_protocol::{
    AllocationId, AllocationReference, BindingSource, MemberRange, MulticastRecord, NamespacePid,
    Record,
};

use super::checker::{Checker, Creators};
use super::errors::{Object, TopologyError};
use crate::render;

impl Checker<'_> {
    /// The one participant holding the creator record of `id`, if exactly one does.
    fn sole_creator(creators: &Creators, id: AllocationId) -> Option<NamespacePid> {
        match creators.get(&id) {
            Some(claimants) if claimants.len() == 1 => claimants.first().copied(),
            _ => None,
        }
    }

    /// Multicast objects, devices, bindings and mappings.
    pub(super) fn multicast(&mut self) {
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
                    found: render::multicast_properties(&record.properties),
                    expected: render::multicast_properties(&creator.properties),
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
                        self.check_multicast_held(pid, &object, "device");
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
                        self.check_multicast_held(pid, &object, "binding");
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
                        let invalid = |problem: &str| TopologyError::InvalidBinding {
                            pid,
                            object: object.clone(),
                            device: r.device,
                            problem: problem.to_string(),
                        };
                        if r.size == 0 {
                            self.errors.push(invalid("size is 0"));
                        }
                        let member = match &r.source {
                            BindingSource::Memory(source) => Some(&source.member),
                            BindingSource::Address(source) => {
                                if source.address == 0 {
                                    self.errors.push(invalid("bound address is null"));
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
                    Record::Allocation(_)
                    | Record::Mapping(_)
                    | Record::Multicast(_)
                    | Record::Pool(_)
                    | Record::PoolMember(_) => {}
                }
            }
        }
    }

    fn holds_multicast(&self, pid: NamespacePid, object: &AllocationReference) -> bool {
        self.multicasts
            .get(&(pid, object.id))
            .is_some_and(|record| record.object == *object)
    }

    /// A `what` record of `pid` (device or binding) must name a multicast object `pid` holds.
    fn check_multicast_held(&mut self, pid: NamespacePid, object: &Object, what: &'static str) {
        if !self.holds_multicast(pid, object.reference()) {
            self.errors.push(TopologyError::MulticastRecordMissing {
                pid,
                object: object.clone(),
                what,
            });
        }
    }

    fn check_member(
        &mut self,
        pid: NamespacePid,
        object: &Object,
        device: i32,
        member: &MemberRange,
        size: u64,
    ) {
        let Some(allocation) = self.held_allocation(pid, &member.allocation) else {
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
}
