//! The memory IPC adapter: `cuMemAlloc` memory backed by POSIX-exportable VMM from the start,
//! and the `cuIpc*Mem*` calls implemented on the shim's own peer service. The native IPC
//! functions are never called: native checkpoint refuses memory they touched.

use super::track;
use super::{peer, sharing};
use crate::driver::vmm::{map_read_write, unmap_and_free};
use crate::driver::{Driver, context, driver};
use crate::log;
use crate::state::cache;
use crate::state::process;
use crate::state::registry::{Allocation, Kind, MallocInfo, Registry};
use crate::sys::abi::{RawAllocProp, RawLocation, consts};
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AllocationProperties, AllocationReference, AllocationType,
    HandleTypes, IpcMemHandle, Location, ResourceKind,
};
use std::num::NonZeroU64;
use std::os::fd::AsFd;

fn device_properties(device: i32) -> RawAllocProp {
    RawAllocProp::new(
        consts::ALLOCATION_TYPE_PINNED,
        consts::HANDLE_TYPE_POSIX_FD,
        RawLocation {
            type_: consts::LOCATION_TYPE_DEVICE,
            id: device,
        },
        [0; 8],
    )
}

fn read_write(device: i32) -> AccessDescriptor {
    convert::device_grant(device, AccessFlags::ProtReadWrite)
}

/// Records a `cuMemAlloc`-style region: the allocation, its whole-extent mapping with
/// read-write access, and a logical handle for `cuMemRetainAllocationHandle` to return.
fn record_region(
    r: &mut Registry,
    mut allocation: Allocation,
    address: u64,
    device: i32,
    peers: Vec<AccessDescriptor>,
) -> CuResult<()> {
    let id = allocation.reference.id;
    let extent = allocation.size;
    allocation.primary_handle = 0;
    r.allocations.insert(id, allocation);
    let handle = r.mint(id, Kind::Unicast)?;
    r.drop_handle(handle)?;
    r.allocations
        .get_mut(&id)
        .expect("inserted above")
        .primary_handle = handle;
    track::record_mapping(r, address, (id, Kind::Unicast, 0), extent, 0, 0);
    r.mappings.get_mut(&address).expect("recorded above").access =
        convert::merge_access(&[read_write(device)], &peers);
    Ok(())
}

/// Maps `raw` read-write for `device` at a fresh address and grants `peers` (devices with peer
/// access to the owning context) read-write too; on failure nothing stays mapped and `raw` is
/// released. Returns the address and the peers' access to record.
fn map_region(
    d: &Driver,
    raw: u64,
    extent: u64,
    device: i32,
    peers: &[i32],
) -> CuResult<(u64, Vec<AccessDescriptor>)> {
    let address = match map_read_write(d, raw, extent, device) {
        Ok(address) => address,
        Err(e) => {
            let _ = d.mem_release(raw);
            return Err(e);
        }
    };
    match peer::grant_new_region(d, address, extent, peers) {
        Ok(granted) => Ok((address, granted)),
        Err(e) => {
            let _ = unmap_and_free(d, address, extent as usize);
            let _ = d.mem_release(raw);
            Err(e)
        }
    }
}

pub fn mem_alloc(size: usize) -> CuResult<u64> {
    let d = driver()?;
    if size == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let device = context::current_device(d)?;
    process::with(|r| {
        r.require_active()?;
        create_region(d, r, size as u64, device, 0, u64::MAX).map(|(address, _)| address)
    })
}

/// Creates a region of `size` bytes on `device`: exportable VMM memory mapped read-write at a
/// fresh address, recorded with its requested size and `pool` (0 for `cuMemAlloc`). Refused
/// with `OUT_OF_MEMORY` when what it is charged (see `state::pools::charge`) would pass
/// `limit`. Returns the address and extent.
pub fn create_region(
    d: &Driver,
    r: &mut Registry,
    size: u64,
    device: i32,
    pool: u64,
    limit: u64,
) -> CuResult<(u64, u64)> {
    let prop = device_properties(device);
    let granularity = d
        .allocation_granularity(&prop, consts::GRANULARITY_MINIMUM)?
        .max(1) as u64;
    let extent = size
        .checked_next_multiple_of(granularity)
        .ok_or(CuError::OUT_OF_MEMORY)?;
    if crate::state::pools::charge(size) > limit {
        return Err(CuError::OUT_OF_MEMORY);
    }
    let context = context::current(d);
    let raw = d.mem_create(extent as usize, &prop, 0)?;
    // Pool memory obeys its pool's access; cuMemAlloc memory also the context's peers'.
    let peers = if pool == 0 {
        peer::peer_devices(r, context, device)
    } else {
        Vec::new()
    };
    let (address, peers) = map_region(d, raw, extent, device, &peers)?;
    let origin = track::created(r, raw, context);
    let properties = AllocationProperties {
        allocation_type: AllocationType::Pinned,
        location: Location::device(device),
        handle_types: HandleTypes::POSIX_FILE_DESCRIPTOR,
    };
    let allocation = Allocation {
        malloc: Some(MallocInfo {
            requested: size,
            opens: 0,
            ipc_exported: false,
            pool,
        }),
        ..Allocation::new(origin, extent, properties, [0; 8])
    };
    record_region(r, allocation, address, device, peers)?;
    Ok((address, extent))
}

/// The region whose base is exactly `address`, if it is one of the adapter's.
pub fn region_at(
    r: &Registry,
    address: u64,
) -> Option<(cuinterpose_protocol::AllocationId, MallocInfo, bool)> {
    let (base, mapping) = r.mapping_at(address)?;
    if base != address {
        return None;
    }
    let a = r.allocations.get(&mapping.id)?;
    Some((mapping.id, a.malloc?, a.is_creator(r.pid)))
}

/// Unmaps and releases a region after the context finished using it.
pub fn drop_region(
    d: &Driver,
    r: &mut Registry,
    id: cuinterpose_protocol::AllocationId,
    address: u64,
) -> CuResult<()> {
    let extent = r.allocations[&id].size;
    d.mem_unmap(address, extent as usize)?;
    if let Some(a) = r.allocations.get_mut(&id)
        && let Some(m) = a.malloc.take().filter(|m| m.pool != 0)
    {
        r.pools.release(m.pool, m.requested, extent);
    }
    track::forget_mapping(d, r, address)?;
    d.address_free(address, extent as usize)
}

pub fn mem_free(address: u64) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let Some((id, malloc, creator)) = region_at(r, address) else {
            if r.mapping_at(address).is_some() {
                return Err(CuError::INVALID_VALUE);
            }
            return d.mem_free(address);
        };
        r.require_active()?;
        if !creator || malloc.opens != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        // Pending work may still use the memory; a failed synchronization keeps it mapped.
        d.ctx_synchronize()?;
        drop_region(d, r, id, address)
    })
}

/// Drops the adapter's regions (`cuMemAlloc` memory and opened IPC handles) that context `ctx`
/// owns, as the driver frees them when that context is destroyed or reset.
fn drop_context_regions(d: &Driver, r: &mut Registry, ctx: usize) -> CuResult<()> {
    let regions: Vec<(cuinterpose_protocol::AllocationId, u64)> = r
        .mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Unicast)
        .filter(|(_, m)| {
            r.allocations
                .get(&m.id)
                .is_some_and(|a| a.malloc.is_some() && a.context == ctx)
        })
        .map(|(&base, m)| (m.id, base))
        .collect();
    for (id, base) in regions {
        drop_region(d, r, id, base)?;
    }
    Ok(())
}

/// `cuDevicePrimaryCtxReset_v2` (`cudaDeviceReset`): the regions of `device`'s primary context
/// go first, then the driver resets it.
pub fn primary_ctx_reset(device: i32) -> CuResult<()> {
    let d = driver()?;
    // The primary context's handle (retained and released again: no net reference).
    let primary = d.primary_ctx_retain(device)?;
    d.primary_ctx_release(device)?;
    ending_context(d, primary, || d.primary_ctx_reset(device))
}

/// `cuCtxDestroy_v2`: the context's regions go with it.
pub fn ctx_destroy(ctx: usize) -> CuResult<()> {
    let d = driver()?;
    ending_context(d, ctx, || d.ctx_destroy(ctx))
}

/// Drops `ctx`'s regions, lets the driver `end` the context, then forgets its peer links.
fn ending_context(d: &Driver, ctx: usize, end: impl FnOnce() -> CuResult<()>) -> CuResult<()> {
    process::with(|r| {
        if r.allocations
            .values()
            .any(|a| a.malloc.is_some() && a.context == ctx)
        {
            r.require_active()?;
            drop_context_regions(d, r, ctx)?;
        }
        Ok(())
    })?;
    end()?;
    process::with(|r| {
        peer::forget_context(d, r, ctx);
        Ok(())
    })
}

pub fn address_range(address: u64) -> CuResult<Option<(u64, u64)>> {
    process::with(|r| {
        let Some((base, mapping)) = r.mapping_at(address) else {
            return Ok(None);
        };
        let Some(malloc) = r.allocations.get(&mapping.id).and_then(|a| a.malloc) else {
            return Ok(None);
        };
        if address - base >= malloc.requested {
            return Ok(None);
        }
        Ok(Some((base, malloc.requested)))
    })
}

pub fn ipc_get(address: u64) -> CuResult<[u8; 64]> {
    let d = driver()?;
    process::with(|r| {
        let Some((id, malloc, creator)) = region_at(r, address) else {
            return Err(CuError::INVALID_VALUE);
        };
        r.require_active()?;
        if !creator {
            return Err(CuError::INVALID_VALUE);
        }
        sharing::publish(d, r, id, Kind::Unicast)?;
        cache::authorize_by_id(&id);
        let a = r.allocations.get_mut(&id).expect("region_at found it");
        if let Some(m) = a.malloc.as_mut() {
            m.ipc_exported = true;
        }
        let handle = IpcMemHandle {
            creator_pid: a.reference.creator_pid,
            allocation: id,
            requested_size: NonZeroU64::new(malloc.requested).ok_or(CuError::INVALID_VALUE)?,
            extent: NonZeroU64::new(a.size).ok_or(CuError::INVALID_VALUE)?,
        };
        Ok(handle.encode())
    })
}

pub fn ipc_open(bytes: &[u8; 64], flags: u32) -> CuResult<u64> {
    let d = driver()?;
    if flags != consts::IPC_MEM_LAZY_ENABLE_PEER_ACCESS {
        return Err(CuError::INVALID_VALUE);
    }
    let handle = match IpcMemHandle::decode(bytes) {
        Ok(h) => h,
        Err(e) => {
            log!(
                "cuIpcOpenMemHandle: not a cuinterpose IPC handle ({e}); refused with CUDA_ERROR_INVALID_VALUE"
            );
            return Err(CuError::INVALID_VALUE);
        }
    };
    if handle.requested_size > handle.extent {
        return Err(CuError::INVALID_VALUE);
    }
    let device = context::current_device(d)?;
    let reference = AllocationReference {
        id: handle.allocation,
        creator_pid: handle.creator_pid,
    };
    // Already open here: the same address, one more reference.
    let existing = process::with(|r| {
        r.require_active()?;
        if handle.creator_pid == r.pid {
            return Err(CuError::INVALID_CONTEXT);
        }
        let fits = |a: &Allocation, m: &MallocInfo| {
            a.size == handle.extent.get() && m.requested == handle.requested_size.get()
        };
        reopen(r, &reference, fits, CuError::INVALID_HANDLE)
    })?;
    if let Some(address) = existing {
        return Ok(address);
    }
    open_region(
        d,
        reference,
        handle.requested_size.get(),
        handle.extent.get(),
        0,
        Some(device),
    )
    .map(|(address, _)| address)
}

/// One more open of a region already opened here (an IPC open, or a pool pointer imported
/// before): its address. `None` when it is not here; `mismatch` when it is, but `fits` says
/// the handle describes it otherwise.
pub fn reopen(
    r: &mut Registry,
    reference: &AllocationReference,
    fits: impl FnOnce(&Allocation, &MallocInfo) -> bool,
    mismatch: CuError,
) -> CuResult<Option<u64>> {
    let Some(a) = r.allocations.get_mut(&reference.id) else {
        return Ok(None);
    };
    let same = a.reference == *reference && a.malloc.is_some_and(|m| fits(a, &m));
    match a.malloc.as_mut() {
        Some(m) if same => {
            m.opens += 1;
            Ok(r.mappings
                .iter()
                .find(|(_, m)| m.id == reference.id)
                .map(|(&base, _)| base))
        }
        _ => Err(mismatch),
    }
}

/// Maps another process's region here: asks its creator for the FD (the allocation id
/// authorizes it), imports and maps it read-write on `device`, and records it as opened once,
/// in `pool` (0: an IPC open). `device` `None`: the GPU the memory lives on, by this process's
/// own ordinal (the imported handle's location; the creator's ordinal may name another GPU
/// here). Returns the address and the device it was mapped for.
pub fn open_region(
    d: &Driver,
    reference: AllocationReference,
    requested: u64,
    extent: u64,
    pool: u64,
    device: Option<i32>,
) -> CuResult<(u64, i32)> {
    let token = cache::id_token(&reference.id);
    let (reply, fd) = sharing::request_export(&reference, ResourceKind::Unicast, token)?;
    match reply {
        cuinterpose_protocol::Reply::UnicastExport(export) if export.size == extent => {}
        _ => {
            log!(
                "import of {}: the creator's export does not match the handle",
                reference.id
            );
            return Err(CuError::INVALID_HANDLE);
        }
    }
    process::with(|r| {
        r.require_active()?;
        let context = context::current(d);
        let raw = track::import_fd(d, fd.as_fd())?;
        let mut allocation =
            sharing::imported_allocation(d, raw, reference.clone(), extent, token, context)?;
        let device = device.unwrap_or(allocation.properties.location.id);
        allocation.malloc = Some(MallocInfo {
            requested,
            opens: 1,
            ipc_exported: true,
            pool,
        });
        let peers = if pool == 0 {
            peer::peer_devices(r, context, device)
        } else {
            Vec::new()
        };
        let (address, peers) = map_region(d, raw, extent, device, &peers)?;
        record_region(r, allocation, address, device, peers)?;
        Ok((address, device))
    })
}

pub fn ipc_close(address: u64) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let Some((id, malloc, creator)) = region_at(r, address) else {
            return Err(CuError::INVALID_VALUE);
        };
        r.require_active()?;
        if creator || malloc.opens == 0 {
            return Err(CuError::INVALID_VALUE);
        }
        if malloc.opens > 1 {
            if let Some(m) = r.allocations.get_mut(&id).and_then(|a| a.malloc.as_mut()) {
                m.opens -= 1;
            }
            return Ok(());
        }
        d.ctx_synchronize()?;
        drop_region(d, r, id, address)
    })
}
