//! The devices a record names, each an ordinal with its GPU's UUID beside it: walked in one
//! place, so the shim names them, and the coordinator checks and remaps them, alike.
//!
//! A device is named by an `AllocationProperties` location, an access descriptor, a multicast
//! device, a binding and a pool. Host locations name no device (their UUID stays none).

use crate::generated::{
    AccessDescriptor, AccessFlags, Device, DeviceUuid, Location, LocationType, Record,
};

impl Location {
    /// Device `ordinal`, its UUID not named yet (an inspection names it).
    pub fn device(ordinal: i32) -> Self {
        Self {
            location_type: LocationType::Device,
            id: ordinal,
            uuid: None,
        }
    }
}

impl AccessDescriptor {
    /// `flags` for device `ordinal` (see [`Location::device`]).
    pub fn device(ordinal: i32, flags: AccessFlags) -> Self {
        Self {
            location: Location::device(ordinal),
            flags,
        }
    }
}

impl Record {
    /// Calls `f` with every device this record names: its ordinal and the UUID beside it.
    pub fn for_each_device_mut(&mut self, mut f: impl FnMut(i32, &mut Option<DeviceUuid>)) {
        match self {
            Record::Allocation(a) => location(&mut a.properties.location, &mut f),
            Record::Mapping(m) => access(&mut m.access, &mut f),
            Record::MulticastMapping(m) => access(&mut m.access, &mut f),
            Record::Multicast(_) | Record::PoolMember(_) => {}
            Record::MulticastDevice(d) => f(d.device, &mut d.uuid),
            Record::MulticastBinding(b) => f(b.device, &mut b.device_uuid),
            Record::Pool(p) => {
                f(p.device, &mut p.device_uuid);
                access(&mut p.access, &mut f);
            }
        }
    }

    /// Every device this record names, as `(ordinal, uuid)` in record order.
    pub fn devices(&self) -> Vec<(i32, Option<DeviceUuid>)> {
        let mut out = Vec::new();
        self.clone()
            .for_each_device_mut(|ordinal, uuid| out.push((ordinal, *uuid)));
        out
    }

    /// Names every device by `devices`, a process's list by ordinal: an ordinal it does not
    /// list gets no UUID (which a coordinator refuses).
    pub fn name_devices(&mut self, devices: &[Device]) {
        self.for_each_device_mut(|ordinal, uuid| {
            *uuid = devices
                .iter()
                .find(|d| d.ordinal == ordinal)
                .map(|d| d.uuid);
        });
    }

    /// Replaces every device's UUID by `new(uuid)`: what a restore onto other GPUs makes of
    /// the recorded ones.
    pub fn remap_devices(&mut self, new: impl Fn(DeviceUuid) -> DeviceUuid) {
        self.for_each_device_mut(|_, uuid| *uuid = uuid.map(&new));
    }
}

fn location(l: &mut Location, f: &mut impl FnMut(i32, &mut Option<DeviceUuid>)) {
    if l.location_type == LocationType::Device {
        f(l.id, &mut l.uuid);
    }
}

fn access(list: &mut [AccessDescriptor], f: &mut impl FnMut(i32, &mut Option<DeviceUuid>)) {
    for descriptor in list {
        location(&mut descriptor.location, f);
    }
}
