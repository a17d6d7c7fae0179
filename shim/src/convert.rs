//! Conversions between the driver's raw structs and the schema's types. Decoding goes through
//! the generated `TryFrom<u32>`, so a value the schema does not know is an error, not a guess.

use crate::abi::{RawAccessDesc, RawAllocProp, RawLocation, RawMulticastProp};
use crate::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AllocationProperties, AllocationType, HandleTypes, Location,
    LocationType, MulticastProperties,
};

pub fn location(raw: RawLocation) -> CuResult<Location> {
    Ok(Location {
        location_type: LocationType::try_from(raw.type_).map_err(|_| CuError::INVALID_VALUE)?,
        id: raw.id,
    })
}

pub fn raw_location(location: &Location) -> RawLocation {
    RawLocation {
        type_: location.location_type.as_u32(),
        id: location.id,
    }
}

pub fn allocation_properties(raw: &RawAllocProp) -> CuResult<AllocationProperties> {
    Ok(AllocationProperties {
        allocation_type: AllocationType::try_from(raw.type_).map_err(|_| CuError::NOT_SUPPORTED)?,
        location: location(raw.location).map_err(|_| CuError::NOT_SUPPORTED)?,
        handle_types: HandleTypes::try_from(raw.requested_handle_types)
            .map_err(|_| CuError::NOT_SUPPORTED)?,
    })
}

pub fn raw_allocation_properties(p: &AllocationProperties, alloc_flags: [u8; 8]) -> RawAllocProp {
    RawAllocProp::new(
        p.allocation_type.as_u32(),
        p.handle_types.bits(),
        raw_location(&p.location),
        alloc_flags,
    )
}

pub fn access(raw: &RawAccessDesc) -> CuResult<AccessDescriptor> {
    Ok(AccessDescriptor {
        location: location(raw.location)?,
        flags: AccessFlags::try_from(raw.flags).map_err(|_| CuError::INVALID_VALUE)?,
    })
}

pub fn raw_access(a: &AccessDescriptor) -> RawAccessDesc {
    RawAccessDesc {
        location: raw_location(&a.location),
        flags: a.flags.as_u32(),
    }
}

pub fn multicast_properties(raw: &RawMulticastProp) -> CuResult<MulticastProperties> {
    Ok(MulticastProperties {
        device_count: raw.num_devices,
        size: raw.size as u64,
        handle_types: u32::try_from(raw.handle_types)
            .ok()
            .and_then(|bits| HandleTypes::try_from(bits).ok())
            .ok_or(CuError::NOT_SUPPORTED)?,
        flags: raw.flags,
    })
}

pub fn raw_multicast_properties(p: &MulticastProperties) -> CuResult<RawMulticastProp> {
    Ok(RawMulticastProp {
        num_devices: p.device_count,
        size: usize::try_from(p.size).map_err(|_| CuError::INVALID_VALUE)?,
        handle_types: u64::from(p.handle_types.bits()),
        flags: p.flags,
    })
}

/// Merges `grants` into `current` as `cuMemSetAccess` does: a grant replaces the entry of its
/// location, `PROT_NONE` removes it, other locations keep theirs; the last duplicate wins.
pub fn merge_access(
    current: &[AccessDescriptor],
    grants: &[AccessDescriptor],
) -> Vec<AccessDescriptor> {
    let mut merged: Vec<AccessDescriptor> = current.to_vec();
    for grant in grants {
        merged.retain(|a| a.location != grant.location);
        if grant.flags != AccessFlags::ProtNone {
            merged.push(grant.clone());
        }
    }
    merged.sort();
    merged
}
