//! Conversions between the driver's raw structs and the schema's types. Decoding goes through
//! the generated `TryFrom<u32>`, so a value the schema does not know is an error, not a guess.

use crate::sys::abi::{RawAccessDesc, RawAllocProp, RawLocation, RawMulticastProp};
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AllocationProperties, AllocationType, HandleTypes, Location,
    LocationType, MulticastProperties,
};

pub fn location(raw: RawLocation) -> CuResult<Location> {
    Ok(Location {
        location_type: LocationType::try_from(raw.type_).map_err(|_| CuError::INVALID_VALUE)?,
        id: raw.id,
        uuid: None,
    })
}

/// `flags` for device `device`.
pub fn device_grant(device: i32, flags: AccessFlags) -> AccessDescriptor {
    AccessDescriptor::device(device, flags)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(device: i32, flags: AccessFlags) -> AccessDescriptor {
        device_grant(device, flags)
    }

    fn check(
        current: &[AccessDescriptor],
        grants: &[AccessDescriptor],
        expected: &[AccessDescriptor],
    ) {
        assert_eq!(merge_access(current, grants), expected);
    }

    #[test]
    fn access_merges_like_cu_mem_set_access() {
        use AccessFlags::*;
        // A grant replaces its location's entry, others stay.
        check(
            &[grant(0, ProtRead), grant(1, ProtReadWrite)],
            &[grant(0, ProtReadWrite)],
            &[grant(0, ProtReadWrite), grant(1, ProtReadWrite)],
        );
        // PROT_NONE removes.
        check(
            &[grant(0, ProtRead), grant(1, ProtRead)],
            &[grant(1, ProtNone)],
            &[grant(0, ProtRead)],
        );
        // The last duplicate wins.
        check(
            &[],
            &[grant(2, ProtRead), grant(2, ProtReadWrite)],
            &[grant(2, ProtReadWrite)],
        );
        check(&[], &[grant(2, ProtRead), grant(2, ProtNone)], &[]);
    }

    #[test]
    fn unknown_cuda_values_are_refused_not_guessed() {
        let raw = RawAccessDesc {
            location: RawLocation { type_: 1, id: 0 },
            flags: 2,
        };
        assert_eq!(access(&raw), Err(CuError::INVALID_VALUE));
        let raw = RawAccessDesc {
            location: RawLocation { type_: 77, id: 0 },
            flags: 3,
        };
        assert_eq!(access(&raw), Err(CuError::INVALID_VALUE));
        let prop = RawAllocProp::new(2, 1, RawLocation { type_: 1, id: 0 }, [0; 8]);
        assert_eq!(allocation_properties(&prop), Err(CuError::NOT_SUPPORTED));
        let prop = RawAllocProp::new(1, 1 << 7, RawLocation { type_: 1, id: 0 }, [0; 8]);
        assert_eq!(allocation_properties(&prop), Err(CuError::NOT_SUPPORTED));
        let ok = RawAllocProp::new(1, 1, RawLocation { type_: 1, id: 3 }, [0; 8]);
        let decoded = allocation_properties(&ok).unwrap();
        assert_eq!(
            raw_allocation_properties(&decoded, [0; 8]).location,
            ok.location
        );
    }
}
