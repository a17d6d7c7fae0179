//! The pool adapter's records: IPC memory pools (created exportable as POSIX FDs, or imported
//! from another process's adapter) that the shim answers itself. The driver never sees these
//! pools; each of their allocations is tracked VMM memory, which the checkpoint already takes
//! apart and rebuilds. Their handles carry [`POOL_TAG`] in the top 16 bits, which no driver
//! pool handle (a host pointer) has.

use cuinterpose_protocol::{
    AccessDescriptor, AllocationId, CapabilityToken, Location, LocationType, NamespacePid,
};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first adapter pool (created or imported): until then the pool entry points that
/// also serve the driver's own memory (`cuMemFreeAsync`, `cuMemAllocAsync`,
/// `cuPointerGetAttribute(s)`) pass through without taking the registry lock.
static ANY: AtomicBool = AtomicBool::new(false);

/// Whether this process ever held an adapter pool.
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Tag of every adapter pool handle: `0xC0DF` in bits 48..64.
pub const POOL_TAG: u64 = 0xC0DF << 48;
const TAG_MASK: u64 = 0xFFFF << 48;

pub fn is_adapter_pool(handle: u64) -> bool {
    handle & TAG_MASK == POOL_TAG
}

/// An adapter pool.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Names the pool across processes (in its ticket and in every exported pointer).
    pub id: AllocationId,
    pub creator_pid: NamespacePid,
    /// Authorizes nothing yet (pointers are authorized by their allocation id); kept in the
    /// ticket so a ticket is never forgeable from the pool id alone.
    pub capability: CapabilityToken,
    /// The device the pool's memory lives on.
    pub device: i32,
    /// Imported, no pointer imported yet: `device` is a guess (the device current at the
    /// import, else 0) until the first imported pointer's memory names its GPU by this
    /// process's ordinal.
    pub device_guessed: bool,
    /// `CUmemPoolProps::maxSize` (0: no limit but the device's memory).
    pub max_size: u64,
    /// The reuse flags (attributes 1 to 3) and the release threshold, as last set.
    pub reuse: [i32; 3],
    pub release_threshold: u64,
    /// Access granted to other devices (`cuMemPoolSetAccess`), sorted by location.
    pub access: Vec<AccessDescriptor>,
    /// Bytes of live allocations (extents), and the high-water marks.
    pub used: u64,
    pub used_high: u64,
    pub reserved_high: u64,
    /// What live allocations asked for, each rounded to [`CHARGE_ALIGN`]: what `max_size`
    /// limits (the driver's pools suballocate, so many small allocations fit in one granule,
    /// where each has its own here).
    pub charged: u64,
    /// Exports of the pool (`cuMemPoolExportToShareableHandle`).
    pub exports: u64,
    /// Imported from another process.
    pub imported: bool,
    /// Live application handles: 1 for the creator's, one per import (importing the same
    /// pool again names the same record).
    pub handles: u64,
    /// `cuMemPoolDestroy` was called: the record goes with its last allocation.
    pub destroyed: bool,
}

impl Pool {
    pub fn new(id: AllocationId, creator_pid: NamespacePid, capability: CapabilityToken) -> Pool {
        Pool {
            id,
            creator_pid,
            capability,
            device: 0,
            device_guessed: false,
            max_size: 0,
            // The driver's defaults: all reuse allowed, nothing kept back.
            reuse: [1, 1, 1],
            release_threshold: 0,
            access: Vec::new(),
            used: 0,
            used_high: 0,
            reserved_high: 0,
            charged: 0,
            exports: 0,
            imported: false,
            handles: 1,
            destroyed: false,
        }
    }

    /// Whether `location` is the pool's own device, which always keeps read-write access.
    pub fn is_own(&self, location: &Location) -> bool {
        location.location_type == LocationType::Device && location.id == self.device
    }

    /// The pool's device unless it is still a guess.
    pub fn known_device(&self) -> Option<i32> {
        (!self.device_guessed).then_some(self.device)
    }

    /// An imported pointer's memory is on `device` (this process's ordinal): it replaces a
    /// guessed device, and a grant recorded for that GPU under the guess goes.
    pub fn learn_device(&mut self, device: i32) {
        if !self.device_guessed {
            return;
        }
        self.device = device;
        self.device_guessed = false;
        let mut access = std::mem::take(&mut self.access);
        access.retain(|a| !self.is_own(&a.location));
        self.access = access;
    }
}

/// The alignment an allocation is charged in against its pool's `max_size`.
pub const CHARGE_ALIGN: u64 = 512;

/// What an allocation of `requested` bytes is charged.
pub fn charge(requested: u64) -> u64 {
    requested
        .div_ceil(CHARGE_ALIGN)
        .saturating_mul(CHARGE_ALIGN)
}

/// The adapter's pools and which is each device's current pool.
#[derive(Debug, Default)]
pub struct Pools {
    pub by_handle: std::collections::BTreeMap<u64, Pool>,
    /// `cuDeviceSetMemPool` with an adapter pool: what `cuMemAllocAsync` allocates from.
    pub current: std::collections::BTreeMap<i32, u64>,
    next: u64,
}

impl Pools {
    /// A fresh adapter handle for `pool`.
    pub fn insert(&mut self, pool: Pool) -> u64 {
        ANY.store(true, Ordering::Relaxed);
        self.next += 1;
        let handle = POOL_TAG | self.next;
        self.by_handle.insert(handle, pool);
        handle
    }

    /// Accounts an allocation of `requested` bytes (`extent` with its granule) taken from pool
    /// `handle`.
    pub fn take(&mut self, handle: u64, requested: u64, extent: u64) {
        if let Some(p) = self.by_handle.get_mut(&handle) {
            p.charged += charge(requested);
            p.used += extent;
            p.used_high = p.used_high.max(p.used);
            p.reserved_high = p.reserved_high.max(p.used);
        }
    }

    /// Accounts an allocation of `extent` bytes given back to pool `handle`; a destroyed pool
    /// goes with its last allocation.
    pub fn release(&mut self, handle: u64, requested: u64, extent: u64) {
        if let Some(p) = self.by_handle.get_mut(&handle) {
            p.charged = p.charged.saturating_sub(charge(requested));
            p.used = p.used.saturating_sub(extent);
            if p.destroyed && p.used == 0 {
                self.by_handle.remove(&handle);
                self.current.retain(|_, &mut h| h != handle);
            }
        }
    }

    /// The handle of the pool named `id` here, if this process holds it.
    pub fn find(&self, id: &AllocationId) -> Option<u64> {
        self.by_handle
            .iter()
            .find(|(_, p)| p.id == *id && !p.destroyed)
            .map(|(&h, _)| h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_handles_carry_their_own_tag() {
        let mut pools = Pools::default();
        let id = AllocationId::new([7; 16]).unwrap();
        let me = NamespacePid::new(5).unwrap();
        let capability = CapabilityToken::new([1; 16]).unwrap();
        let h = pools.insert(Pool::new(id, me, capability));
        assert!(is_adapter_pool(h));
        assert!(!is_adapter_pool(0x7f00_1234_5000));
        // A logical VMM handle (the registry's tag) is not a pool.
        assert!(!is_adapter_pool((0xC0DE << 48) | 1));
        assert_eq!(pools.find(&id), Some(h));
        pools.by_handle.get_mut(&h).unwrap().destroyed = true;
        assert_eq!(pools.find(&id), None);
    }
}
