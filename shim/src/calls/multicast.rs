//! Multicast objects: creation, devices, bindings, unbinding and import.
//!
//! Bind and add-device calls can wait for other processes (the driver holds a bind until the
//! whole team has joined), so they run with the registry lock dropped; while one is in flight
//! `inspect` and `begin_checkpoint` are refused instead of waiting.

use super::track::{self, HANDLE_TYPES_ALLOWED};
use crate::driver::api::{BindRange, Bound};
use crate::driver::{Driver, context, driver};
use crate::log;
use crate::state::process;
use crate::state::registry::{
    Binding, BindingTarget, Kind, Multicast, Origin, Registry, is_logical,
};
use crate::sys::abi::RawMulticastProp;
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AllocationReference, CapabilityToken, LocationType, MulticastProperties,
};
use std::os::fd::{AsFd, OwnedFd};

pub fn create(prop: &RawMulticastProp) -> CuResult<u64> {
    let d = driver()?;
    let types = prop.handle_types;
    if types & !u64::from(HANDLE_TYPES_ALLOWED) != 0 {
        log!(
            "cuMulticastCreate: handle types {types:#x} refused with CUDA_ERROR_NOT_SUPPORTED: only \
             POSIX file descriptors (1) and FABRIC (8, never exported: refused as without IMEX) \
             can be checkpointed"
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    let properties = convert::multicast_properties(prop)?;
    process::with(|r| {
        r.require_active()?;
        let context = context::current(d);
        let raw = d.multicast_create(prop)?;
        let object = Multicast::new(track::created(r, raw, context), properties);
        adopt(d, r, object)
    })
}

fn adopt(d: &Driver, r: &mut Registry, object: Multicast) -> CuResult<u64> {
    track::adopt_object(d, r, object)
}

/// Records an imported multicast object (the FD came from its creator).
pub fn adopt_import(
    d: &Driver,
    r: &mut Registry,
    reference: AllocationReference,
    properties: MulticastProperties,
    capability: CapabilityToken,
    fd: OwnedFd,
) -> CuResult<u64> {
    let context = context::current(d);
    let raw = track::import_fd(d, fd.as_fd())?;
    drop(fd);
    let origin = Origin::imported(reference, raw, context, capability);
    let object = Multicast::new(origin, properties);
    adopt(d, r, object)
}

/// Runs a driver call that may wait on other processes with the registry lock dropped.
fn unlocked<T>(call: impl FnOnce() -> CuResult<T>) -> CuResult<T> {
    process::with(|r| {
        r.unlocked_calls += 1;
        Ok(())
    })?;
    let result = call();
    let mut guard = process::lock();
    if let Some(r) = guard.as_mut() {
        r.unlocked_calls -= 1;
    }
    result
}

fn object_driver(r: &Registry, handle: u64) -> CuResult<(cuinterpose_protocol::AllocationId, u64)> {
    let entry = r.entry(handle)?;
    if entry.kind != Kind::Multicast {
        return Err(CuError::INVALID_HANDLE);
    }
    let m = r.multicasts.get(&entry.id).ok_or(CuError::INVALID_HANDLE)?;
    Ok((entry.id, m.driver.ok_or(CuError::INVALID_HANDLE)?))
}

pub fn add_device(handle: u64, device: i32) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return d.multicast_add_device(handle, device);
    }
    let (id, raw) = process::with(|r| {
        r.require_active()?;
        object_driver(r, handle)
    })?;
    let current = context::current(d);
    unlocked(|| d.multicast_add_device(raw, device))?;
    process::with(|r| {
        if let Some(m) = r.multicasts.get_mut(&id) {
            if !m.devices.contains(&device) {
                m.devices.push(device);
            }
            if m.context == 0 {
                m.context = current;
            }
        }
        Ok(())
    })
}

/// `cuMulticastBindMem` (`range.device` None) and `cuMulticastBindMem_v2`.
pub fn bind_mem(handle: u64, range: BindRange, member: u64, member_offset: usize) -> CuResult<()> {
    let d = driver()?;
    let size = range.size;
    if !is_logical(handle) {
        if is_logical(member) {
            log!(
                "cuMulticastBindMem: a tracked allocation bound into an untracked multicast object cannot be checkpointed; refused"
            );
            return Err(CuError::NOT_SUPPORTED);
        }
        let bound = Bound::Memory {
            member,
            offset: member_offset,
        };
        return d.multicast_bind(handle, range, bound);
    }
    if !is_logical(member) {
        log!(
            "cuMulticastBindMem: memory not created through the shim cannot be restored into a multicast object; refused with CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    let (id, raw, reference, member_raw, bound_device) = process::with(|r| {
        r.require_active()?;
        let (id, raw) = object_driver(r, handle)?;
        let a = r.allocation_of(member)?;
        if (member_offset as u64)
            .checked_add(size as u64)
            .is_none_or(|end| end > a.size)
        {
            return Err(CuError::INVALID_VALUE);
        }
        let bound_device = match range.device {
            Some(dev) => dev,
            None if a.properties.location.location_type == LocationType::Device => {
                a.properties.location.id
            }
            None => return Err(CuError::NOT_SUPPORTED),
        };
        Ok((
            id,
            raw,
            a.reference.clone(),
            a.driver.ok_or(CuError::INVALID_HANDLE)?,
            bound_device,
        ))
    })?;
    let current = context::current(d);
    let bound = Bound::Memory {
        member: member_raw,
        offset: member_offset,
    };
    unlocked(|| d.multicast_bind(raw, range, bound))?;
    process::with(|r| {
        if let Some(a) = r.allocations.get_mut(&reference.id) {
            a.shared = true;
        }
        record_binding(
            r,
            id,
            current,
            Binding::new(
                BindingTarget::Memory {
                    member: reference,
                    offset: member_offset as u64,
                },
                range,
                bound_device,
            ),
        );
        Ok(())
    })
}

fn record_binding(
    r: &mut Registry,
    id: cuinterpose_protocol::AllocationId,
    current: usize,
    binding: Binding,
) {
    if let Some(m) = r.multicasts.get_mut(&id) {
        if m.context == 0 {
            m.context = current;
        }
        m.bindings.push(binding);
    }
}

/// `cuMulticastBindAddr` (`range.device` None) and `cuMulticastBindAddr_v2`.
pub fn bind_addr(handle: u64, range: BindRange, address: u64) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return d.multicast_bind(handle, range, Bound::Address(address));
    }
    let size = range.size;
    if size == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let end = address
        .checked_add(size as u64)
        .ok_or(CuError::INVALID_VALUE)?;
    let (id, raw, member) = process::with(|r| {
        r.require_active()?;
        let (id, raw) = object_driver(r, handle)?;
        let member = match r.mapping_at(address) {
            Some((base, m)) if m.kind == Kind::Unicast => {
                if end > base + m.size {
                    return Err(CuError::INVALID_VALUE);
                }
                let a = r.allocations.get(&m.id).ok_or(CuError::INVALID_HANDLE)?;
                Some((a.reference.clone(), m.offset + (address - base)))
            }
            Some(_) => return Err(CuError::INVALID_VALUE),
            None => {
                if !r.mappings_overlapping(address, size as u64).is_empty() {
                    return Err(CuError::INVALID_VALUE);
                }
                None
            }
        };
        Ok((id, raw, member))
    })?;
    let bound_device = match range.device {
        Some(dev) => dev,
        None => context::current_device(d)?,
    };
    let current = context::current(d);
    unlocked(|| d.multicast_bind(raw, range, Bound::Address(address)))?;
    process::with(|r| {
        if let Some((reference, _)) = &member
            && let Some(a) = r.allocations.get_mut(&reference.id)
        {
            a.shared = true;
        }
        record_binding(
            r,
            id,
            current,
            Binding::new(
                BindingTarget::Address { address, member },
                range,
                bound_device,
            ),
        );
        Ok(())
    })
}

pub fn unbind(handle: u64, device: i32, multicast_offset: usize, size: usize) -> CuResult<()> {
    let d = driver()?;
    if !is_logical(handle) {
        return d.multicast_unbind(handle, device, multicast_offset, size);
    }
    let (id, raw) = process::with(|r| {
        r.require_active()?;
        object_driver(r, handle)
    })?;
    unlocked(|| d.multicast_unbind(raw, device, multicast_offset, size))?;
    let start = multicast_offset as u64;
    let end = start.saturating_add(size as u64);
    process::with(|r| {
        if let Some(m) = r.multicasts.get_mut(&id) {
            m.bindings.retain(|b| {
                !(b.device == device && b.multicast_offset >= start && b.multicast_offset < end)
            });
        }
        Ok(())
    })
}
