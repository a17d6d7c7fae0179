//! Stream-ordered memory pools: per-device default and current pools, created pools with their
//! attributes and access, and allocations from them. Each pool allocation is fakecuda device
//! memory like a `cuMemAlloc` block (a memfd mapped read-write for the pool's device and every
//! device the pool grants), so copies, memsets and native checkpoint treat it like any other.
//!
//! Freed memory is returned at once (nothing is cached), so the reserved and used sizes are
//! equal and trimming has nothing to release.
//!
//! A pool created with POSIX-FD handles is shareable: its export is a small memfd naming the
//! creator and the pool; an exported pointer's 64 bytes name the allocation; importing it
//! fetches the allocation's memfd from the creator's control socket and maps it, so the bytes
//! are really shared. Native checkpoint refuses while a pool is shared.

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::pool::{ALLOCATION_TYPE_MANAGED, POOL_ALIGN, Place, Pool};
use crate::sys;
/// `CU_MEMPOOL_ATTR_*` (2, between these, allows opportunistic reuse).
pub use cuinterpose_abi::consts::{
    POOL_ATTR_RELEASE_THRESHOLD as ATTR_RELEASE_THRESHOLD,
    POOL_ATTR_RESERVED_MEM_CURRENT as ATTR_RESERVED_MEM_CURRENT,
    POOL_ATTR_RESERVED_MEM_HIGH as ATTR_RESERVED_MEM_HIGH,
    POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES as ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES as ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
    POOL_ATTR_USED_MEM_CURRENT as ATTR_USED_MEM_CURRENT,
    POOL_ATTR_USED_MEM_HIGH as ATTR_USED_MEM_HIGH,
};
pub use ipc::{POINTER_BYTES, import_pointer};
use std::collections::BTreeMap;

impl DriverState {
    fn pool(&self, h: u64) -> CuResult<&Pool> {
        self.pools
            .pools
            .get(&h)
            .filter(|p| !p.destroyed)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    fn pool_mut(&mut self, h: u64) -> CuResult<&mut Pool> {
        self.pools
            .pools
            .get_mut(&h)
            .filter(|p| !p.destroyed)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    fn new_pool(&mut self, place: Place, default: bool, max_size: u64) -> u64 {
        self.new_pool_with(place, default, max_size, c::HANDLE_TYPE_NONE, None)
    }

    /// A pool at `place`, with the access that place starts with: read-write for its own
    /// device; none for pinned host memory (the CPU's until a device is granted); every
    /// device's for managed memory.
    fn new_pool_with(
        &mut self,
        place: Place,
        default: bool,
        max_size: u64,
        handle_types: u32,
        imported: Option<(u32, u64)>,
    ) -> u64 {
        let h = self.next_handle();
        let access = match place {
            Place::Device(device) => BTreeMap::from([(device, c::ACCESS_READWRITE)]),
            Place::Host | Place::HostNuma(_) => BTreeMap::new(),
            Place::Managed(..) => (0..self.config.count())
                .map(|d| (d, c::ACCESS_READWRITE))
                .collect(),
        };
        self.pools.pools.insert(
            h,
            Pool {
                place,
                default,
                max_size,
                reuse: [true; 3],
                release_threshold: 0,
                used: 0,
                used_high: 0,
                charged: 0,
                access,
                destroyed: false,
                handle_types,
                exported: false,
                imported,
            },
        );
        h
    }

    /// `cuDeviceGetDefaultMemPool` (and the default pool of a host location).
    pub fn pool_default(&mut self, place: Place) -> u64 {
        if let Some(&h) = self.pools.default_of.get(&place) {
            return h;
        }
        let h = self.new_pool(place, true, 0);
        self.pools.default_of.insert(place, h);
        h
    }

    /// `cuDeviceGetMemPool`, `cuMemGetMemPool`: the pool `cuMemAllocAsync` uses at `place`.
    pub fn pool_current(&mut self, place: Place) -> u64 {
        match self.pools.current_of.get(&place) {
            Some(&h) if self.pool(h).is_ok() => h,
            _ => self.pool_default(place),
        }
    }

    /// `cuDeviceSetMemPool`: a pool of that device.
    pub fn pool_set_current(&mut self, device: u32, h: u64) -> CuResult<()> {
        if self.pool(h)?.place != Place::Device(device) {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        self.pools.current_of.insert(Place::Device(device), h);
        Ok(())
    }

    /// A pool location (`CUmemLocation`) for memory of `alloc_type`: for pinned memory a
    /// device, the host (any node, its id ignored) or one host NUMA node; for managed memory
    /// any of those as its preferred location, or none (type 0).
    pub fn pool_place(&self, alloc_type: u32, location: (u32, i32)) -> CuResult<Place> {
        if alloc_type == ALLOCATION_TYPE_MANAGED {
            let id = match location.0 {
                0 | c::LOCATION_TYPE_HOST => 0,
                _ => match self.pool_place(c::ALLOCATION_TYPE_PINNED, location)? {
                    Place::Device(id) | Place::HostNuma(id) => id,
                    _ => 0,
                },
            };
            return Ok(Place::Managed(location.0, id));
        }
        if alloc_type != c::ALLOCATION_TYPE_PINNED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        match location.0 {
            t if t == c::LOCATION_TYPE_DEVICE => {
                Ok(Place::Device(self.config.check_device(location.1)?))
            }
            t if t == c::LOCATION_TYPE_HOST => Ok(Place::Host),
            t if t == c::LOCATION_TYPE_HOST_NUMA => {
                Ok(Place::HostNuma(self.config.check_numa_node(location.1)?))
            }
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemPoolCreate`: pinned memory of a device or a host NUMA node, shareable as POSIX
    /// FDs or not at all; pinned host memory of any node and managed memory, never shareable
    /// (fakecuda models no IPC managed pools).
    pub fn pool_create(
        &mut self,
        alloc_type: u32,
        handle_types: u32,
        location: (u32, i32),
        max_size: u64,
    ) -> CuResult<u64> {
        let place = self.pool_place(alloc_type, location)?;
        if handle_types != c::HANDLE_TYPE_NONE && handle_types != c::HANDLE_TYPE_POSIX_FD {
            // FABRIC needs IMEX; Windows handles need Windows.
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        match place {
            Place::Device(_) | Place::HostNuma(_) => {
                Ok(self.new_pool_with(place, false, max_size, handle_types, None))
            }
            // A pool of the host as a whole is never IPC capable (cuda.h); one of a NUMA node is.
            Place::Host if handle_types != c::HANDLE_TYPE_NONE => {
                Err(CuError::CUDA_ERROR_INVALID_VALUE)
            }
            Place::Managed(..) if handle_types != c::HANDLE_TYPE_NONE => {
                Err(CuError::CUDA_ERROR_NOT_SUPPORTED)
            }
            other => Ok(self.new_pool(other, false, max_size)),
        }
    }

    /// `cuMemPoolDestroy`: outstanding allocations stay valid until freed.
    pub fn pool_destroy(&mut self, h: u64) -> CuResult<()> {
        let pool = self.pool_mut(h)?;
        if pool.default {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        pool.destroyed = true;
        let outstanding = pool.used > 0;
        self.pools.current_of.retain(|_, p| *p != h);
        if !outstanding {
            self.pools.pools.remove(&h);
        }
        Ok(())
    }

    pub fn pool_get_attribute(&self, h: u64, attr: u32) -> CuResult<u64> {
        let p = self.pool(h)?;
        Ok(match attr {
            ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                u64::from(p.reuse[(attr - 1) as usize])
            }
            ATTR_RELEASE_THRESHOLD => p.release_threshold,
            ATTR_RESERVED_MEM_CURRENT | ATTR_USED_MEM_CURRENT => p.used,
            ATTR_RESERVED_MEM_HIGH | ATTR_USED_MEM_HIGH => p.used_high,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// Settable: the reuse flags, the release threshold, and the high-water marks (to 0 only).
    pub fn pool_set_attribute(&mut self, h: u64, attr: u32, value: u64) -> CuResult<()> {
        let p = self.pool_mut(h)?;
        match attr {
            ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attr - 1) as usize] = value != 0;
            }
            ATTR_RELEASE_THRESHOLD => p.release_threshold = value,
            ATTR_RESERVED_MEM_HIGH | ATTR_USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// `cuMemPoolSetAccess`: device grants, applied to the pool's existing allocations too.
    pub fn pool_set_access(&mut self, h: u64, grants: &[(u32, i32, u32)]) -> CuResult<()> {
        let own = match self.pool(h)?.place {
            Place::Device(device) => Some(device),
            Place::Host | Place::HostNuma(_) => None,
            // Every device keeps its access to managed memory.
            Place::Managed(..) => {
                return if grants.iter().all(|g| g.2 == c::ACCESS_READWRITE) {
                    Ok(())
                } else {
                    Err(CuError::CUDA_ERROR_INVALID_VALUE)
                };
            }
        };
        let mut checked = Vec::with_capacity(grants.len());
        for &(location_type, id, flags) in grants {
            if location_type != c::LOCATION_TYPE_DEVICE || flags > c::ACCESS_READWRITE || flags == 2
            {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let device = self.config.check_device(id)?;
            if Some(device) == own && flags != c::ACCESS_READWRITE {
                // The owning device keeps read-write access to its pool.
                return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
            }
            checked.push((device, flags));
        }
        let pool = self.pool_mut(h)?;
        for &(device, flags) in &checked {
            if flags == c::ACCESS_NONE {
                pool.access.remove(&device);
            } else {
                pool.access.insert(device, flags);
            }
        }
        let access = pool.access.clone();
        let bases: Vec<u64> = self
            .pools
            .allocations
            .iter()
            .filter(|(_, (p, _, _))| *p == h)
            .map(|(b, _)| *b)
            .collect();
        for base in bases {
            if let Some(m) = self.vmm.mappings.get_mut(&base) {
                m.access = access.clone();
            }
            self.apply_access(base)?;
        }
        Ok(())
    }

    pub fn pool_get_access(&self, h: u64, location: (u32, i32)) -> CuResult<u32> {
        let p = self.pool(h)?;
        if location.0 != c::LOCATION_TYPE_DEVICE {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let device = self.config.check_device(location.1)?;
        Ok(p.access.get(&device).copied().unwrap_or(c::ACCESS_NONE))
    }

    /// `cuMemAllocFromPoolAsync`: the memory exists once the call returns (earlier than stream
    /// order requires, which no program can tell apart).
    pub fn pool_alloc(&mut self, h: u64, bytes: u64) -> CuResult<u64> {
        if bytes == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let (place, max, charged) = {
            let p = self.pool(h)?;
            (p.place, p.max_size, p.charged)
        };
        let charge = sys::round_up(bytes, POOL_ALIGN).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        let size =
            sys::round_up(bytes, sys::granularity()).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        if self.pool(h)?.imported.is_some() {
            // Memory of an imported pool comes only from its creator, by imported pointers.
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if max != 0 && charged.saturating_add(charge) > max {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let (location_type, id) = place.memory();
        let alloc = self.alloc_create(size, location_type, id, c::HANDLE_TYPE_NONE, true)?;
        let base = self.map_pool_memory(h, alloc, size)?;
        self.pools.allocations.insert(base, (h, alloc, size));
        self.pools.charges.insert(base, charge);
        let p = self.pool_mut(h)?;
        p.used += size;
        p.charged += charge;
        p.used_high = p.used_high.max(p.used);
        Ok(base)
    }

    /// Maps a whole allocation of pool `h` (made here, or imported) with the pool's access:
    /// its own device's, or, for host memory, the CPU's and what the pool grants devices.
    fn map_pool_memory(&mut self, h: u64, alloc: u64, size: u64) -> CuResult<u64> {
        let (device, place, access) = {
            let p = self.pool(h)?;
            (p.device(), p.place, p.access.clone())
        };
        let node = match place {
            Place::Device(_) => None,
            Place::Host | Place::Managed(..) => Some(0),
            Place::HostNuma(node) => Some(node),
        };
        let base = self.map_whole_readwrite(alloc, size, device)?;
        if access.len() > 1 || node.is_some() {
            if let Some(m) = self.vmm.mappings.get_mut(&base) {
                m.access = access;
                // Host memory is the CPU's; devices reach it as the pool grants.
                if let Some(node) = node {
                    m.host_access.insert(node, c::ACCESS_READWRITE);
                }
            }
            self.apply_access(base)?;
        }
        Ok(base)
    }

    /// Checks that `ptr` is a pool allocation's base (for `cuMemFreeAsync` at the call).
    pub fn pool_check_free(&self, ptr: u64) -> CuResult<()> {
        if self.pools.allocations.contains_key(&ptr) {
            Ok(())
        } else {
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        }
    }

    /// Returns a pool allocation (when the stream reaches the free).
    pub fn pool_free(&mut self, ptr: u64) -> CuResult<()> {
        let (h, alloc, size) = self
            .pools
            .allocations
            .remove(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        self.forget_advice(alloc);
        self.pools.imported_ptrs.retain(|_, base| *base != ptr);
        self.unmap_one(ptr)?;
        self.free_reservation(ptr);
        let charge = self.pools.charges.remove(&ptr).unwrap_or(0);
        if let Some(p) = self.pools.pools.get_mut(&h) {
            p.used = p.used.saturating_sub(size);
            p.charged = p.charged.saturating_sub(charge);
            if p.destroyed && p.used == 0 {
                self.pools.pools.remove(&h);
            }
        }
        Ok(())
    }
}

pub mod ipc;
