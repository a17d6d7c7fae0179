//! The pool adapter: IPC memory pools (`cuMemPoolCreate` with POSIX-FD handles on a device)
//! answered by the shim, never created in the driver. Each allocation from such a pool is a
//! tracked, exportable VMM region (as the memory IPC adapter makes of `cuMemAlloc`), so the
//! checkpoint saves it once in its creator and rebuilds it at the same address in every
//! importer. Exporting the pool hands out a ticket; exporting a pointer hands out 64 bytes
//! naming the allocation ([`PoolPointerHandle`]); importing a pointer asks the creator's shim
//! for the allocation's FD. The driver's own pools (not exportable, or on the host) pass
//! through, and their sharing still makes inspection refuse.
//!
//! Stream order: an allocation is ready when the call returns (earlier than the stream needs
//! it); `cuMemFreeAsync` waits for the stream's earlier work before it unmaps, so the free
//! never overtakes work that still uses the memory.

use super::ipc;
use super::sharing;
use super::track::{new_capability, new_id};
use crate::driver::{Driver, context, driver};
use crate::log;
use crate::state::cache;
use crate::state::pools::{self, Pool, is_adapter_pool};
use crate::state::process;
use crate::state::registry::{Kind, Registry};
use crate::sys::abi::{RawAccessDesc, RawLocation, RawPoolProps, consts};
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::ticket::{TicketError, create_ticket, read_ticket};
use cuinterpose_protocol::{
    AccessFlags, AllocationReference, LocationType, PoolPointerHandle, ResourceKind, Ticket,
    VirtualShareableHandle,
};
use std::num::NonZeroU64;
use std::os::fd::{BorrowedFd, OwnedFd};

/// `cuMemPoolCreate`: an adapter pool for device pools exportable as POSIX FDs; `None` for
/// every other pool (the driver creates it; should it be shared, inspection refuses).
pub fn create(props: &RawPoolProps) -> CuResult<Option<u64>> {
    if props.handle_types & consts::HANDLE_TYPE_POSIX_FD == 0
        || props.alloc_type != consts::ALLOCATION_TYPE_PINNED
        || props.location.type_ != consts::LOCATION_TYPE_DEVICE
    {
        return Ok(None);
    }
    let d = driver()?;
    let device = props.location.id;
    // Validates the device as the driver would (and the granularity every region uses).
    let prop = crate::sys::abi::RawAllocProp::pinned(
        consts::LOCATION_TYPE_DEVICE,
        device,
        consts::HANDLE_TYPE_POSIX_FD,
    );
    d.allocation_granularity(&prop, consts::GRANULARITY_MINIMUM)?;
    process::with(|r| {
        r.require_active()?;
        let mut pool = Pool::new(new_id(), r.pid, new_capability());
        pool.device = device;
        pool.max_size = props.max_size as u64;
        Ok(Some(r.pools.insert(pool)))
    })
}

fn pool_mut(r: &mut Registry, handle: u64) -> CuResult<&mut Pool> {
    r.pools
        .by_handle
        .get_mut(&handle)
        .filter(|p| !p.destroyed)
        .ok_or(CuError::INVALID_VALUE)
}

/// `cuMemPoolDestroy`: the pool goes now, or with its last allocation.
pub fn destroy(handle: u64) -> CuResult<()> {
    process::with(|r| {
        let pool = pool_mut(r, handle)?;
        pool.handles -= 1;
        if pool.handles > 0 {
            // Another import of the same pool still names it.
            return Ok(());
        }
        pool.destroyed = true;
        let idle = pool.used == 0;
        r.pools.current.retain(|_, &mut h| h != handle);
        if idle {
            r.pools.by_handle.remove(&handle);
        }
        Ok(())
    })
}

/// The attributes that are C `int`s (the reuse flags); the others are `cuuint64_t`.
pub fn is_int_attribute(attribute: u32) -> bool {
    (consts::POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
        ..=consts::POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        .contains(&attribute)
}

pub fn get_attribute(handle: u64, attribute: u32) -> CuResult<u64> {
    process::with(|r| {
        let p = pool_mut(r, handle)?;
        Ok(match attribute {
            a if is_int_attribute(a) => {
                p.reuse[(a - consts::POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) as usize] as u64
            }
            consts::POOL_ATTR_RELEASE_THRESHOLD => p.release_threshold,
            // The adapter reserves exactly what is allocated.
            consts::POOL_ATTR_RESERVED_MEM_CURRENT | consts::POOL_ATTR_USED_MEM_CURRENT => p.used,
            consts::POOL_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            consts::POOL_ATTR_USED_MEM_HIGH => p.used_high,
            _ => return Err(CuError::INVALID_VALUE),
        })
    })
}

pub fn set_attribute(handle: u64, attribute: u32, value: u64) -> CuResult<()> {
    process::with(|r| {
        let p = pool_mut(r, handle)?;
        match attribute {
            a if is_int_attribute(a) => {
                p.reuse[(a - consts::POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) as usize] =
                    i32::from(value != 0);
            }
            consts::POOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = value,
            // The high-water marks may only be reset (to the current use).
            consts::POOL_ATTR_RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.used,
            consts::POOL_ATTR_USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(CuError::INVALID_VALUE),
        }
        Ok(())
    })
}

/// `cuMemPoolSetAccess`: recorded for the pool and applied to each of its regions here.
pub fn set_access(handle: u64, grants: &[RawAccessDesc]) -> CuResult<()> {
    let d = driver()?;
    let grants = grants
        .iter()
        .map(convert::access)
        .collect::<CuResult<Vec<_>>>()?;
    process::with(|r| {
        r.require_active()?;
        let p = pool_mut(r, handle)?;
        for g in &grants {
            let own = p.is_own(&g.location);
            if g.location.location_type != LocationType::Device
                || (own && g.flags != AccessFlags::ProtReadWrite)
            {
                // The pool's own device keeps read-write access (as the driver insists).
                return Err(CuError::INVALID_VALUE);
            }
        }
        let others: Vec<_> = grants
            .iter()
            .filter(|g| !p.is_own(&g.location))
            .cloned()
            .collect();
        p.access = convert::merge_access(&p.access, &others);
        let raw: Vec<RawAccessDesc> = others.iter().map(convert::raw_access).collect();
        for base in regions_of(r, handle) {
            let mapping = r.mappings.get(&base).ok_or(CuError::UNKNOWN)?;
            d.mem_set_access(base, mapping.size as usize, &raw)?;
            let merged = convert::merge_access(&mapping.access, &others);
            if let Some(m) = r.mappings.get_mut(&base) {
                m.access = merged;
            }
        }
        Ok(())
    })
}

pub fn get_access(handle: u64, location: RawLocation) -> CuResult<u32> {
    let location = convert::location(location)?;
    process::with(|r| {
        let p = pool_mut(r, handle)?;
        if p.is_own(&location) {
            return Ok(consts::ACCESS_READWRITE);
        }
        Ok(p.access
            .iter()
            .find(|a| a.location == location)
            .map_or(consts::ACCESS_NONE, |a| a.flags.as_u32()))
    })
}

/// Bases of this process's regions of pool `handle`.
fn regions_of(r: &Registry, handle: u64) -> Vec<u64> {
    r.mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Unicast)
        .filter(|(_, m)| {
            r.allocations
                .get(&m.id)
                .and_then(|a| a.malloc)
                .is_some_and(|m| m.pool == handle)
        })
        .map(|(&base, _)| base)
        .collect()
}

/// `cuMemAllocFromPoolAsync` from an adapter pool this process created.
pub fn alloc(handle: u64, size: u64) -> CuResult<u64> {
    let d = driver()?;
    if size == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    process::with(|r| {
        r.require_active()?;
        let p = pool_mut(r, handle)?;
        if p.imported {
            // Only the creator allocates; importers map exported pointers.
            return Err(CuError::INVALID_VALUE);
        }
        let device = p.device;
        let limit = match p.max_size {
            0 => u64::MAX,
            max => max.saturating_sub(p.charged),
        };
        let (address, extent) = ipc::create_region(d, r, size, device, handle, limit)?;
        r.pools.take(handle, size, extent);
        grant_pool_access(d, r, handle, address)?;
        Ok(address)
    })
}

/// Gives pool `handle`'s new region at `address` the access the pool grants other devices
/// (`cuMemPoolSetAccess` covers the allocations to come), and records it. When the driver
/// refuses, the region goes again: nothing stays mapped for a call that failed.
fn grant_pool_access(d: &Driver, r: &mut Registry, handle: u64, address: u64) -> CuResult<()> {
    // A pool destroyed meanwhile stays recorded while it has regions.
    let Some(access) = r.pools.by_handle.get(&handle).map(|p| p.access.clone()) else {
        return Ok(());
    };
    let Some(mapping) = r.mappings.get_mut(&address) else {
        return Err(CuError::UNKNOWN);
    };
    if access.is_empty() {
        return Ok(());
    }
    let (id, size) = (mapping.id, mapping.size);
    let raw: Vec<RawAccessDesc> = access.iter().map(convert::raw_access).collect();
    if let Err(e) = d.mem_set_access(address, size as usize, &raw) {
        let _ = ipc::drop_region(d, r, id, address);
        return Err(e);
    }
    mapping.access = convert::merge_access(&mapping.access, &access);
    Ok(())
}

/// `cuMemAllocAsync`: from the device's current pool when that is an adapter pool (`None`:
/// the driver's pool, the driver allocates).
pub fn alloc_async(size: u64) -> CuResult<Option<u64>> {
    // Most processes never make an adapter pool current: no lock, no driver call for them.
    if !pools::any() || process::with(|r| Ok(r.pools.current.is_empty()))? {
        return Ok(None);
    }
    let d = driver()?;
    let device = context::current_device(d)?;
    let Some(handle) = current_pool(device)? else {
        return Ok(None);
    };
    alloc(handle, size).map(Some)
}

/// The adapter pool `cuDeviceSetMemPool` made current for `device`, if any.
pub fn current_pool(device: i32) -> CuResult<Option<u64>> {
    process::with(|r| Ok(r.pools.current.get(&device).copied()))
}

/// `cuDeviceSetMemPool`: true when `handle` is an adapter pool (recorded here); false when the
/// driver must be told (any adapter pool stops being current for the device).
pub fn set_current_pool(device: i32, handle: u64) -> CuResult<bool> {
    process::with(|r| {
        if !is_adapter_pool(handle) {
            r.pools.current.remove(&device);
            return Ok(false);
        }
        let p = pool_mut(r, handle)?;
        if p.imported || p.device != device {
            return Err(CuError::INVALID_VALUE);
        }
        r.pools.current.insert(device, handle);
        Ok(true)
    })
}

/// `cuMemFreeAsync` of an adapter region (false: not one, the driver frees it). Waits for the
/// stream's earlier work first.
pub fn free_async(address: u64, stream: usize) -> CuResult<bool> {
    if !pools::any() {
        return Ok(false);
    }
    let d = driver()?;
    let region = process::with(|r| Ok(ipc::region_at(r, address)))?;
    if region.is_none_or(|(_, m, _)| m.pool == 0) {
        return Ok(false);
    }
    d.stream_synchronize(stream)?;
    process::with(|r| {
        r.require_active()?;
        let Some((id, malloc, creator)) = ipc::region_at(r, address) else {
            return Err(CuError::INVALID_VALUE);
        };
        if !creator && malloc.opens > 1 {
            if let Some(m) = r.allocations.get_mut(&id).and_then(|a| a.malloc.as_mut()) {
                m.opens -= 1;
            }
            return Ok(true);
        }
        ipc::drop_region(d, r, id, address)?;
        Ok(true)
    })
}

/// `cuMemPoolExportToShareableHandle` of an adapter pool: a ticket naming it.
pub fn export(handle: u64, handle_type: u32, flags: u64) -> CuResult<OwnedFd> {
    if handle_type == consts::HANDLE_TYPE_FABRIC {
        // As for VMM allocations: fabric handles cannot be checkpointed.
        log!(
            "cuMemPoolExportToShareableHandle: fabric handles refused with CUDA_ERROR_NOT_SUPPORTED"
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    if handle_type != consts::HANDLE_TYPE_POSIX_FD || flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let ticket = process::with(|r| {
        r.require_active()?;
        let p = pool_mut(r, handle)?;
        if p.imported {
            return Err(CuError::INVALID_VALUE);
        }
        p.exports += 1;
        Ok(Ticket {
            handle: VirtualShareableHandle {
                creator_pid: p.creator_pid,
                allocation: p.id,
            },
            resource: ResourceKind::Pool,
            capability: p.capability,
        })
    })?;
    create_ticket(&ticket).map_err(|e| {
        log!("cuMemPoolExportToShareableHandle: cannot create the ticket: {e}");
        CuError::OUT_OF_MEMORY
    })
}

/// `cuMemPoolImportFromShareableHandle`: an adapter pool for a pool ticket; `None` when `fd`
/// is not a ticket (a pool of a process without the shim: the driver imports it).
pub fn import(fd: BorrowedFd<'_>) -> CuResult<Option<u64>> {
    let d = driver()?;
    let ticket = match read_ticket(fd) {
        Ok(ticket) => ticket,
        Err(TicketError::NotATicket(_)) => return Ok(None),
        Err(e) => {
            log!("cuMemPoolImportFromShareableHandle: {e}; refused with CUDA_ERROR_INVALID_HANDLE");
            return Err(CuError::INVALID_HANDLE);
        }
    };
    if ticket.resource != ResourceKind::Pool {
        log!(
            "cuMemPoolImportFromShareableHandle: the ticket names a {} allocation, not a pool",
            ticket.resource
        );
        return Err(CuError::INVALID_HANDLE);
    }
    // The driver imports a pool with no context current (cuda-core unpickles one before it
    // sets a device), and the pool's GPU need not be the current one: the ticket does not
    // name it, so the current device is a guess until the first imported pointer's memory
    // names the GPU.
    let device = match context::current_device(d) {
        Ok(device) => device,
        Err(CuError::INVALID_CONTEXT) => 0,
        Err(e) => return Err(e),
    };
    process::with(|r| {
        r.require_active()?;
        if let Some(h) = r.pools.find(&ticket.handle.allocation) {
            // Imported before, or this process's own pool imported back: the same record,
            // one handle more.
            let p = pool_mut(r, h)?;
            p.handles += 1;
            return Ok(Some(h));
        }
        if ticket.handle.creator_pid == r.pid {
            // This process's own pool, destroyed since.
            return Err(CuError::INVALID_HANDLE);
        }
        let mut pool = Pool::new(
            ticket.handle.allocation,
            ticket.handle.creator_pid,
            ticket.capability,
        );
        pool.device = device;
        pool.device_guessed = true;
        pool.imported = true;
        Ok(Some(r.pools.insert(pool)))
    })
}

/// `cuMemPoolExportPointer` of an adapter region (`None`: not one, the driver exports it).
pub fn export_pointer(address: u64) -> CuResult<Option<[u8; 64]>> {
    let d = driver()?;
    process::with(|r| {
        let Some((id, malloc, creator)) = ipc::region_at(r, address) else {
            return Ok(None);
        };
        if malloc.pool == 0 {
            return Ok(None);
        }
        r.require_active()?;
        if !creator {
            return Err(CuError::INVALID_VALUE);
        }
        let pool = r
            .pools
            .by_handle
            .get(&malloc.pool)
            .ok_or(CuError::INVALID_VALUE)?
            .id;
        sharing::publish(d, r, id, Kind::Unicast)?;
        cache::authorize_by_id(&id);
        let a = r.allocations.get_mut(&id).ok_or(CuError::UNKNOWN)?;
        if let Some(m) = a.malloc.as_mut() {
            m.ipc_exported = true;
        }
        let handle = PoolPointerHandle {
            creator_pid: a.reference.creator_pid,
            allocation: id,
            pool,
            device: a.properties.location.id,
            requested_size: NonZeroU64::new(malloc.requested).ok_or(CuError::INVALID_VALUE)?,
            extent: NonZeroU64::new(a.size).ok_or(CuError::INVALID_VALUE)?,
        };
        Ok(Some(handle.encode()))
    })
}

/// `cuMemPoolImportPointer` into an imported adapter pool (`None`: not an adapter pool, the
/// driver imports it).
pub fn import_pointer(handle: u64, data: &[u8; 64]) -> CuResult<Option<u64>> {
    if !is_adapter_pool(handle) {
        return Ok(None);
    }
    let d = driver()?;
    let exported = PoolPointerHandle::decode(data).map_err(|e| {
        log!("cuMemPoolImportPointer: not a cuinterpose pool pointer ({e}); refused");
        CuError::INVALID_VALUE
    })?;
    if exported.requested_size > exported.extent {
        return Err(CuError::INVALID_VALUE);
    }
    let reference = AllocationReference {
        id: exported.allocation,
        creator_pid: exported.creator_pid,
    };
    let (existing, device) = process::with(|r| {
        r.require_active()?;
        let p = pool_mut(r, handle)?;
        if !p.imported || p.id != exported.pool || p.creator_pid != exported.creator_pid {
            // The pointer belongs to another pool.
            return Err(CuError::INVALID_VALUE);
        }
        let device = p.known_device();
        let existing = ipc::reopen(
            r,
            &reference,
            |_, m| m.pool == handle,
            CuError::INVALID_VALUE,
        )?;
        Ok((existing, device))
    })?;
    if let Some(address) = existing {
        return Ok(Some(address));
    }
    let extent = exported.extent.get();
    // An imported pool takes the GPU of its first pointer's memory, by this process's
    // ordinal: the handle's `device` is the creator's, which may name another GPU here
    // (another CUDA_VISIBLE_DEVICES).
    let (address, device) = ipc::open_region(
        d,
        reference,
        exported.requested_size.get(),
        extent,
        handle,
        device,
    )?;
    process::with(|r| {
        if let Some(p) = r.pools.by_handle.get_mut(&handle) {
            p.learn_device(device);
        }
        r.pools.take(handle, exported.requested_size.get(), extent);
        grant_pool_access(d, r, handle, address)?;
        Ok(Some(address))
    })
}

/// The adapter pool of the region that contains `address` (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`).
pub fn pool_of(address: u64) -> CuResult<Option<u64>> {
    if !pools::any() {
        return Ok(None);
    }
    process::with(|r| {
        let Some((_, mapping)) = r.mapping_at(address) else {
            return Ok(None);
        };
        Ok(r.allocations
            .get(&mapping.id)
            .and_then(|a| a.malloc)
            .map(|m| m.pool)
            .filter(|&p| p != 0))
    })
}
