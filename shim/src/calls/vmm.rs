//! The logic behind each wrapped VMM entry point: creation, release, retain, map, unmap,
//! access and properties. Untracked handles go to the driver unchanged.

use super::track::{self, HANDLE_TYPES_ALLOWED, trackable};
use crate::driver::{context, driver};
use crate::log;
use crate::state::process;
use crate::state::registry::{Allocation, Kind, is_logical};
use crate::sys::abi::{RawAccessDesc, RawAllocProp, consts};
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{AccessDescriptor, MAX_ACCESS};

pub fn mem_create(size: usize, prop: &RawAllocProp, flags: u64) -> CuResult<u64> {
    let d = driver()?;
    let types = prop.requested_handle_types;
    if types & consts::HANDLE_TYPE_POSIX_FD == 0 && types & !HANDLE_TYPES_ALLOWED == 0 {
        // Not POSIX-exportable (none requested, or FABRIC alone, whose export the shim
        // refuses): never shared, so native checkpoint saves it; the shim stays out of the way
        // and the driver answers (a driver without IMEX accepts FABRIC here and refuses it at
        // export, as the shim then does).
        return d.mem_create(size, prop, flags);
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
        let raw = d.mem_create(size, prop, flags)?;
        let origin = track::created(r, raw, context);
        let allocation = Allocation::new(origin, size as u64, properties, prop.alloc_flags);
        track::adopt(d, r, allocation)
    })
}

pub fn mem_release(handle: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        d.mem_release(handle)?;
        process::note_native_release(handle);
        return Ok(());
    }
    process::with(|r| {
        r.require_active()?;
        let entry = r.drop_handle(handle)?;
        track::release_if_unused(d, r, entry.id, entry.kind)
    })
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
        d.retain_allocation_handle(address)
    })
}

pub fn map(address: u64, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return d.mem_map(address, size, offset, handle, flags);
    }
    process::with(|r| {
        r.require_active()?;
        let entry = r.entry(handle)?;
        let current = context::current(d);
        let object = r
            .common_mut(&entry.id, entry.kind)
            .ok_or(CuError::INVALID_HANDLE)?;
        let raw = object.driver.ok_or(CuError::INVALID_HANDLE)?;
        d.mem_map(address, size, offset, raw, flags)?;
        if *object.context == 0 {
            *object.context = current;
        }
        track::record_mapping(
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

pub fn unmap(address: u64, size: usize) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let bases = r.mappings_overlapping(address, size as u64);
        if bases.is_empty() {
            return d.mem_unmap(address, size);
        }
        r.require_active()?;
        d.mem_unmap(address, size)?;
        for base in bases {
            track::forget_mapping(d, r, base)?;
        }
        Ok(())
    })
}

pub fn set_access(address: u64, size: usize, descriptors: &[RawAccessDesc]) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let bases = r.mappings_overlapping(address, size as u64);
        if bases.is_empty() {
            return d.mem_set_access(address, size, descriptors);
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
        d.mem_set_access(address, size, descriptors)?;
        for (base, access) in bases.iter().zip(merged) {
            r.mappings.get_mut(base).expect("collected above").access = access;
        }
        Ok(())
    })
}

pub fn properties_from_handle(out: &mut RawAllocProp, handle: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        *out = d.allocation_properties(handle)?;
        return Ok(());
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
    *out = d.allocation_properties(raw)?;
    // What the application asked for, not what the shim asked of the driver on its behalf.
    out.requested_handle_types = visible;
    Ok(())
}
