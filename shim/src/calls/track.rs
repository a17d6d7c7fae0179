//! Recording tracked objects and their mappings: new ids and tokens, adoption of a fresh
//! driver handle under a logical handle, mapping records, and releasing what nothing refers to
//! any more.

use crate::driver::Driver;
use crate::log;
use crate::state::cache;
use crate::state::registry::{
    Allocation, Count, Kind, Mapping, Multicast, Origin, Registry, is_logical,
};
use crate::sys::abi::consts;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AllocationId, AllocationProperties, AllocationReference, AllocationType, CapabilityToken,
    LocationType,
};
use std::os::fd::BorrowedFd;

/// 16 random bytes, never all zero.
pub fn random_bytes() -> [u8; 16] {
    loop {
        let mut bytes = [0u8; 16];
        crate::driver::os::fill_random(&mut bytes);
        if bytes != [0; 16] {
            return bytes;
        }
    }
}

pub fn new_id() -> AllocationId {
    AllocationId::new(random_bytes()).expect("random_bytes is never all zero")
}

pub fn new_capability() -> CapabilityToken {
    CapabilityToken::new(random_bytes()).expect("random_bytes is never all zero")
}

/// The origin of an object this process creates from `raw` in `context`: a new id and a new
/// token, not shared yet.
pub fn created(r: &Registry, raw: u64, context: usize) -> Origin {
    let reference = AllocationReference {
        id: new_id(),
        creator_pid: r.pid,
    };
    Origin {
        reference,
        raw,
        shared: false,
        context,
        capability: new_capability(),
    }
}

/// Whether the shim can save and restore memory with these properties.
pub fn trackable(properties: &AllocationProperties) -> bool {
    properties.allocation_type == AllocationType::Pinned
        && matches!(
            properties.location.location_type,
            LocationType::Device | LocationType::HostNuma
        )
}

/// Handle types the shim lets an allocation or multicast object request: POSIX FDs, which it
/// tracks, and FABRIC, which the driver decides on at creation and the shim refuses at export
/// and import as a driver without IMEX does (so a fabric handle never leaves the process).
pub const HANDLE_TYPES_ALLOWED: u32 = consts::HANDLE_TYPE_POSIX_FD | consts::HANDLE_TYPE_FABRIC;

/// Records a new allocation whose driver handle was just obtained and mints its logical
/// handle; on any refusal the driver handle is released again.
pub fn adopt(d: &Driver, r: &mut Registry, allocation: Allocation) -> CuResult<u64> {
    adopt_object(d, r, allocation)
}

/// What [`adopt_object`] needs of a tracked object.
pub trait Tracked: Sized {
    const KIND: Kind;
    fn id(&self) -> AllocationId;
    fn raw(&self) -> u64;
    fn set_primary(&mut self, handle: u64);
    fn table(r: &mut Registry) -> &mut std::collections::BTreeMap<AllocationId, Self>;
}

macro_rules! tracked {
    ($type:ty, $kind:expr, $table:ident) => {
        impl Tracked for $type {
            const KIND: Kind = $kind;
            fn id(&self) -> AllocationId {
                self.reference.id
            }
            fn raw(&self) -> u64 {
                self.driver.expect("adopted objects have a driver handle")
            }
            fn set_primary(&mut self, handle: u64) {
                self.primary_handle = handle;
            }
            fn table(r: &mut Registry) -> &mut std::collections::BTreeMap<AllocationId, Self> {
                &mut r.$table
            }
        }
    };
}

tracked!(Allocation, Kind::Unicast, allocations);
tracked!(Multicast, Kind::Multicast, multicasts);

/// Records an object whose driver handle was just obtained and mints its logical handle;
/// on any refusal (a driver handle that carries the shim's tag, handles exhausted) the driver
/// handle is released again and nothing is recorded.
pub fn adopt_object<T: Tracked>(d: &Driver, r: &mut Registry, mut object: T) -> CuResult<u64> {
    let raw = object.raw();
    if is_logical(raw) {
        let _ = d.mem_release(raw);
        log!("the driver returned handle {raw:#x}, which carries the shim's tag; refused");
        return Err(CuError::UNKNOWN);
    }
    let id = object.id();
    object.set_primary(0);
    T::table(r).insert(id, object);
    match r.mint(id, T::KIND) {
        Ok(handle) => {
            T::table(r)
                .get_mut(&id)
                .expect("inserted above")
                .set_primary(handle);
            Ok(handle)
        }
        Err(e) => {
            T::table(r).remove(&id);
            let _ = d.mem_release(raw);
            Err(e)
        }
    }
}

/// Drops the record (and the driver's handle, and the cached export) of an object nothing
/// refers to any more.
pub fn release_if_unused(
    d: &Driver,
    r: &mut Registry,
    id: AllocationId,
    kind: Kind,
) -> CuResult<()> {
    let raw = match kind {
        Kind::Unicast if r.unicast_unused(&id) => {
            let allocation = r.allocations.remove(&id);
            allocation.expect("checked by unicast_unused").driver
        }
        Kind::Multicast if r.multicast_unused(&id) => {
            let object = r.multicasts.remove(&id);
            object.expect("checked by multicast_unused").driver
        }
        _ => return Ok(()),
    };
    cache::remove(&id);
    if let Some(raw) = raw {
        d.mem_release(raw)?;
    }
    Ok(())
}

/// Records a mapping at `address` of object `id` of `kind`, mapped through logical `handle`
/// (0 for a `cuMemAlloc` region).
pub fn record_mapping(
    r: &mut Registry,
    address: u64,
    (id, kind, handle): (AllocationId, Kind, u64),
    size: u64,
    offset: u64,
    flags: u64,
) {
    if let Some(mappings) = r.count_mut(&id, kind, Count::Mappings) {
        *mappings += 1;
    }
    r.mappings.insert(
        address,
        Mapping {
            id,
            kind,
            handle,
            size,
            offset,
            flags,
            access: Vec::new(),
        },
    );
}

/// Forgets the recorded mapping at `base` and drops its object if nothing else holds it.
pub fn forget_mapping(d: &Driver, r: &mut Registry, base: u64) -> CuResult<()> {
    let Some(mapping) = r.mappings.remove(&base) else {
        return Ok(());
    };
    if let Some(mappings) = r.count_mut(&mapping.id, mapping.kind, Count::Mappings) {
        *mappings -= 1;
    }
    release_if_unused(d, r, mapping.id, mapping.kind)
}

/// The driver's POSIX import of `fd`, refused when the driver's handle carries the shim's tag
/// (it would be mistaken for a logical handle).
pub fn import_fd(d: &Driver, fd: BorrowedFd<'_>) -> CuResult<u64> {
    let raw = d.import_posix_fd(fd)?;
    if is_logical(raw) {
        let _ = d.mem_release(raw);
        log!("the driver returned handle {raw:#x}, which carries the shim's tag; refused");
        return Err(CuError::UNKNOWN);
    }
    Ok(raw)
}
