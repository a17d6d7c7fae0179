//! The logic behind each wrapped VMM entry point. Inputs arrive as plain values (the FFI edge
//! read the application's pointers); pass-through pointers the shim never dereferences travel
//! on to the driver untouched.

use crate::abi::{RawAccessDesc, RawAllocProp, consts};
use crate::context;
use crate::convert;
use crate::driver::call;
use crate::driver::{Driver, driver};
use crate::error::{CuError, CuResult};
use crate::log;
use crate::process;
use crate::registry::{Allocation, Kind, Registry, is_logical};
use crate::runtime::cache;
use cuinterpose_protocol::{
    AccessDescriptor, AllocationId, AllocationProperties, AllocationReference, AllocationType,
    CapabilityToken, LocationType, MAX_ACCESS,
};
use std::ffi::c_void;

pub fn init(flags: u32) -> CuResult<()> {
    let d = driver()?;
    call!(d, cuInit(flags))?;
    crate::runtime::start()
}

/// 16 random bytes, never all zero.
pub fn random_bytes() -> [u8; 16] {
    loop {
        let mut bytes = [0u8; 16];
        let mut filled = 0;
        while filled < bytes.len() {
            // SAFETY: writes at most the remaining bytes of a live local array.
            let n = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
            };
            if n > 0 {
                filled += n as usize;
            }
        }
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

pub fn mem_create(size: usize, prop: &RawAllocProp, flags: u64) -> CuResult<u64> {
    let d = driver()?;
    let types = prop.requested_handle_types;
    if types & consts::HANDLE_TYPE_POSIX_FD == 0 && types & !HANDLE_TYPES_ALLOWED == 0 {
        // Not POSIX-exportable (none requested, or FABRIC alone, whose export the shim
        // refuses): never shared, so native checkpoint saves it; the shim stays out of the way
        // and the driver answers (a driver without IMEX accepts FABRIC here and refuses it at
        // export, as the shim then does).
        let mut handle = 0;
        call!(d, cuMemCreate(&mut handle, size, prop, flags))?;
        return Ok(handle);
    }
    if types & !HANDLE_TYPES_ALLOWED != 0 {
        log!(
            "cuMemCreate: requested handle types {types:#x} refused with CUDA_ERROR_NOT_SUPPORTED: \
             only POSIX file descriptors (1), optionally with FABRIC (8), can be checkpointed"
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    let properties = match convert::allocation_properties(prop) {
        Ok(p) if trackable(&p) => p,
        _ => {
            log!(
                "cuMemCreate: exportable allocation of type {} at location type {} refused with \
                 CUDA_ERROR_NOT_SUPPORTED: only pinned device or host-NUMA memory can be checkpointed",
                prop.type_,
                prop.location.type_
            );
            return Err(CuError::NOT_SUPPORTED);
        }
    };
    process::with(|r| {
        r.require_active()?;
        let context = context::current(d);
        let mut raw = 0;
        call!(d, cuMemCreate(&mut raw, size, prop, flags))?;
        let id = new_id();
        let allocation = Allocation {
            reference: AllocationReference {
                id,
                creator_pid: r.pid,
            },
            driver: Some(raw),
            size: size as u64,
            properties,
            alloc_flags: prop.alloc_flags,
            shared: false,
            published: false,
            context,
            capability: new_capability(),
            primary_handle: 0,
            handle_refs: 0,
            mappings: 0,
            malloc: None,
        };
        adopt(d, r, allocation)
    })
}

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
tracked!(crate::registry::Multicast, Kind::Multicast, multicasts);

/// Records an object whose driver handle was just obtained and mints its logical handle;
/// on any refusal (a driver handle that carries the shim's tag, handles exhausted) the driver
/// handle is released again and nothing is recorded.
pub fn adopt_object<T: Tracked>(d: &Driver, r: &mut Registry, mut object: T) -> CuResult<u64> {
    let raw = object.raw();
    if is_logical(raw) {
        let _ = call!(d, cuMemRelease(raw));
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
            let _ = call!(d, cuMemRelease(raw));
            Err(e)
        }
    }
}

pub fn mem_release(handle: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        call!(d, cuMemRelease(handle))?;
        process::note_native_release(handle);
        return Ok(());
    }
    process::with(|r| {
        r.require_active()?;
        let entry = r.drop_handle(handle)?;
        release_if_unused(d, r, entry.id, entry.kind)
    })
}

/// Drops the record (and the driver's handle, and the cached export) of an object nothing
/// refers to any more.
pub fn release_if_unused(
    d: &Driver,
    r: &mut Registry,
    id: AllocationId,
    kind: Kind,
) -> CuResult<()> {
    match kind {
        Kind::Unicast => {
            if r.unicast_unused(&id) {
                let allocation = r
                    .allocations
                    .remove(&id)
                    .expect("checked by unicast_unused");
                cache::remove(&id);
                if let Some(raw) = allocation.driver {
                    call!(d, cuMemRelease(raw))?;
                }
            }
        }
        Kind::Multicast => {
            if r.multicast_unused(&id) {
                let object = r
                    .multicasts
                    .remove(&id)
                    .expect("checked by multicast_unused");
                cache::remove(&id);
                if let Some(raw) = object.driver {
                    call!(d, cuMemRelease(raw))?;
                }
            }
        }
    }
    Ok(())
}

pub fn retain(address: u64) -> CuResult<u64> {
    let d = driver()?;
    process::with(|r| {
        if let Some((_, mapping)) = r.mapping_at(address) {
            r.require_active()?;
            let (id, kind, handle) = (mapping.id, mapping.kind, mapping.handle);
            let malloc =
                kind == Kind::Unicast && r.allocations.get(&id).is_some_and(|a| a.malloc.is_some());
            if malloc || handle == 0 {
                // cuMemAlloc memory has no generic allocation handle: the driver's answer.
                return Err(CuError::INVALID_VALUE);
            }
            // The very value that was mapped there (clients release it twice, NCCL's
            // ncclCuMemFree), with one more reference.
            r.retain_handle(handle, id, kind);
            return Ok(handle);
        }
        let mut handle = 0;
        call!(
            d,
            cuMemRetainAllocationHandle(&mut handle, address as usize as *mut c_void)
        )?;
        Ok(handle)
    })
}

pub fn map(address: u64, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return call!(d, cuMemMap(address, size, offset, handle, flags));
    }
    process::with(|r| {
        r.require_active()?;
        let entry = r.entry(handle)?;
        let current = context::current(d);
        let (driver_handle, context) = match entry.kind {
            Kind::Unicast => {
                let a = r
                    .allocations
                    .get_mut(&entry.id)
                    .ok_or(CuError::INVALID_HANDLE)?;
                (a.driver, &mut a.context)
            }
            Kind::Multicast => {
                let m = r
                    .multicasts
                    .get_mut(&entry.id)
                    .ok_or(CuError::INVALID_HANDLE)?;
                (m.driver, &mut m.context)
            }
        };
        let raw = driver_handle.ok_or(CuError::INVALID_HANDLE)?;
        call!(d, cuMemMap(address, size, offset, raw, flags))?;
        if *context == 0 {
            *context = current;
        }
        record_mapping(
            r,
            address,
            (entry.id, entry.kind, handle),
            size as u64,
            offset as u64,
            flags,
        );
        Ok(())
    })
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
    match kind {
        Kind::Unicast => {
            if let Some(a) = r.allocations.get_mut(&id) {
                a.mappings += 1;
            }
        }
        Kind::Multicast => {
            if let Some(m) = r.multicasts.get_mut(&id) {
                m.mappings += 1;
            }
        }
    }
    r.mappings.insert(
        address,
        crate::registry::Mapping {
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
    match mapping.kind {
        Kind::Unicast => {
            if let Some(a) = r.allocations.get_mut(&mapping.id) {
                a.mappings -= 1;
            }
        }
        Kind::Multicast => {
            if let Some(m) = r.multicasts.get_mut(&mapping.id) {
                m.mappings -= 1;
            }
        }
    }
    release_if_unused(d, r, mapping.id, mapping.kind)
}

pub fn unmap(address: u64, size: usize) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let bases = r.mappings_overlapping(address, size as u64);
        if bases.is_empty() {
            return call!(d, cuMemUnmap(address, size));
        }
        r.require_active()?;
        call!(d, cuMemUnmap(address, size))?;
        for base in bases {
            forget_mapping(d, r, base)?;
        }
        Ok(())
    })
}

pub fn set_access(address: u64, size: usize, descriptors: &[RawAccessDesc]) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let bases = r.mappings_overlapping(address, size as u64);
        if bases.is_empty() {
            return call!(
                d,
                cuMemSetAccess(address, size, descriptors.as_ptr(), descriptors.len())
            );
        }
        r.require_active()?;
        let grants = descriptors
            .iter()
            .map(convert::access)
            .collect::<CuResult<Vec<AccessDescriptor>>>()?;
        let mut merged = Vec::with_capacity(bases.len());
        for base in &bases {
            let access = convert::merge_access(&r.mappings[base].access, &grants);
            if access.len() > MAX_ACCESS {
                log!(
                    "cuMemSetAccess: more than {MAX_ACCESS} locations on the mapping at {base:#x} \
                     refused with CUDA_ERROR_NOT_SUPPORTED"
                );
                return Err(CuError::NOT_SUPPORTED);
            }
            merged.push(access);
        }
        call!(
            d,
            cuMemSetAccess(address, size, descriptors.as_ptr(), descriptors.len())
        )?;
        for (base, access) in bases.iter().zip(merged) {
            r.mappings.get_mut(base).expect("collected above").access = access;
        }
        Ok(())
    })
}

pub fn properties_from_handle(out: &mut RawAllocProp, handle: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return call!(d, cuMemGetAllocationPropertiesFromHandle(out, handle));
    }
    let (raw, visible) = process::with(|r| {
        let a = r.allocation_of(handle)?;
        // cuMemAlloc memory is exportable only for the shim's own use.
        let visible = if a.malloc.is_some() {
            0
        } else {
            a.properties.handle_types.bits()
        };
        Ok((a.driver.ok_or(CuError::INVALID_HANDLE)?, visible))
    })?;
    call!(d, cuMemGetAllocationPropertiesFromHandle(out, raw))?;
    // What the application asked for, not what the shim asked of the driver on its behalf.
    out.requested_handle_types = visible;
    Ok(())
}
