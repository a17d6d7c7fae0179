//! Stream-ordered memory pools: per-device default and current pools, created pools with their
//! attributes and access, and allocations from them. Each pool allocation is fakecuda device
//! memory like a `cuMemAlloc` block (a memfd mapped read-write for the pool's device and every
//! device the pool grants), so copies, memsets and native checkpoint treat it like any other.
//!
//! Freed memory is returned at once (nothing is cached), so the reserved and used sizes are
//! equal and trimming has nothing to release. Pools are not shareable between processes yet:
//! the device reports no pool handle types, and a pool asking for one is refused.

use crate::abi::consts as c;
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys::{self, GRANULARITY};
use std::collections::{BTreeMap, HashMap};

/// `CU_MEMPOOL_ATTR_*` (2, between these, allows opportunistic reuse).
pub const ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
pub const ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
pub const ATTR_RELEASE_THRESHOLD: u32 = 4;
pub const ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const ATTR_RESERVED_MEM_HIGH: u32 = 6;
pub const ATTR_USED_MEM_CURRENT: u32 = 7;
pub const ATTR_USED_MEM_HIGH: u32 = 8;

#[derive(Debug)]
pub struct Pool {
    pub device: u32,
    /// A device's default pool (`cuDeviceGetDefaultMemPool`): never destroyed.
    pub default: bool,
    pub max_size: u64,
    reuse: [bool; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
    /// Granted access by device (the pool's own device always has read-write).
    access: BTreeMap<u32, u32>,
    /// Destroyed while allocations were outstanding: released when the last one is freed.
    destroyed: bool,
}

/// The pool memory of one process.
#[derive(Debug, Default)]
pub struct Pools {
    pools: HashMap<u64, Pool>,
    default_of: HashMap<u32, u64>,
    current_of: HashMap<u32, u64>,
    /// Every pool allocation: base → (pool, physical allocation, size).
    pub allocations: BTreeMap<u64, (u64, u64, u64)>,
}

impl Pools {
    /// The pool allocation containing `p`: (base, pool, physical allocation, size).
    pub fn allocation_at(&self, p: u64) -> Option<(u64, u64, u64, u64)> {
        let (&base, &(pool, alloc, size)) = self.allocations.range(..=p).next_back()?;
        (p < base + size).then_some((base, pool, alloc, size))
    }

    /// The device of pool `h`, if it exists.
    pub fn device_of(&self, h: u64) -> Option<u32> {
        self.pools.get(&h).map(|p| p.device)
    }
}

impl Driver {
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

    fn new_pool(&mut self, device: u32, default: bool, max_size: u64) -> u64 {
        let h = self.next_handle();
        let mut access = BTreeMap::new();
        access.insert(device, c::ACCESS_READWRITE);
        self.pools.pools.insert(
            h,
            Pool {
                device,
                default,
                max_size,
                reuse: [true; 3],
                release_threshold: 0,
                used: 0,
                used_high: 0,
                access,
                destroyed: false,
            },
        );
        h
    }

    /// `cuDeviceGetDefaultMemPool`.
    pub fn pool_default(&mut self, device: u32) -> u64 {
        if let Some(&h) = self.pools.default_of.get(&device) {
            return h;
        }
        let h = self.new_pool(device, true, 0);
        self.pools.default_of.insert(device, h);
        h
    }

    /// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` uses on `device`.
    pub fn pool_current(&mut self, device: u32) -> u64 {
        match self.pools.current_of.get(&device) {
            Some(&h) if self.pool(h).is_ok() => h,
            _ => self.pool_default(device),
        }
    }

    /// `cuDeviceSetMemPool`: a pool of that device.
    pub fn pool_set_current(&mut self, device: u32, h: u64) -> CuResult<()> {
        if self.pool(h)?.device != device {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        self.pools.current_of.insert(device, h);
        Ok(())
    }

    /// `cuMemPoolCreate`: pinned device memory, no shareable handle types (not modelled yet).
    pub fn pool_create(
        &mut self,
        alloc_type: u32,
        handle_types: u32,
        location: (u32, i32),
        max_size: u64,
    ) -> CuResult<u64> {
        if alloc_type != c::ALLOCATION_TYPE_PINNED || location.0 != c::LOCATION_TYPE_DEVICE {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let device = self.config.check_device(location.1)?;
        if handle_types != c::HANDLE_TYPE_NONE {
            eprintln!(
                "fakecuda: cuMemPoolCreate: shareable pool handles ({handle_types:#x}) are not \
                 modelled yet; refused with CUDA_ERROR_NOT_SUPPORTED"
            );
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        Ok(self.new_pool(device, false, max_size))
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
        let own = self.pool(h)?.device;
        let mut checked = Vec::with_capacity(grants.len());
        for &(location_type, id, flags) in grants {
            if location_type != c::LOCATION_TYPE_DEVICE || flags > c::ACCESS_READWRITE || flags == 2
            {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let device = self.config.check_device(id)?;
            if device == own && flags != c::ACCESS_READWRITE {
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
        let (device, max, used) = {
            let p = self.pool(h)?;
            (p.device, p.max_size, p.used)
        };
        let size = sys::round_up(bytes, GRANULARITY).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        if max != 0 && used.saturating_add(size) > max {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let alloc = self.alloc_create(
            size,
            c::LOCATION_TYPE_DEVICE,
            device,
            c::HANDLE_TYPE_NONE,
            true,
        )?;
        let base = self.map_whole_readwrite(alloc, size, device)?;
        let access = self.pool(h)?.access.clone();
        if access.len() > 1 {
            if let Some(m) = self.vmm.mappings.get_mut(&base) {
                m.access = access;
            }
            self.apply_access(base)?;
        }
        self.pools.allocations.insert(base, (h, alloc, size));
        let p = self.pool_mut(h)?;
        p.used += size;
        p.used_high = p.used_high.max(p.used);
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
        let (h, _, size) = self
            .pools
            .allocations
            .remove(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        self.unmap_one(ptr)?;
        self.free_reservation(ptr);
        if let Some(p) = self.pools.pools.get_mut(&h) {
            p.used = p.used.saturating_sub(size);
            if p.destroyed && p.used == 0 {
                self.pools.pools.remove(&h);
            }
        }
        Ok(())
    }
}
