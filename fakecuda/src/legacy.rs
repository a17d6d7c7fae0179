//! `cuMemAlloc` / `cuMemFree` / `cuMemGetAddressRange`: classic device allocations, built on
//! the same memfd + reservation machinery as VMM so native IPC can share them.

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::legacy::LegacyAlloc;
use crate::sys;

impl DriverState {
    pub fn mem_alloc(&mut self, bytes: u64) -> CuResult<u64> {
        self.device_alloc(bytes, false)
    }

    /// `cuMemAllocManaged`: flags `CU_MEM_ATTACH_GLOBAL` (1) or `CU_MEM_ATTACH_HOST` (2).
    pub fn mem_alloc_managed(&mut self, bytes: u64, flags: u32) -> CuResult<u64> {
        if flags != 1 && flags != 2 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.device_alloc(bytes, true)
    }

    fn device_alloc(&mut self, bytes: u64, managed: bool) -> CuResult<u64> {
        let (context, device) = self.contexts.current()?;
        if bytes == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let size =
            sys::round_up(bytes, sys::granularity()).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        let h = self.alloc_create(
            size,
            c::LOCATION_TYPE_DEVICE,
            device,
            c::HANDLE_TYPE_POSIX_FD,
            true,
        )?;
        let base = self.map_whole_readwrite(h, size, device)?;
        self.legacy.by_base.insert(
            base,
            LegacyAlloc {
                requested: bytes,
                alloc: h,
                context,
                managed,
            },
        );
        Ok(base)
    }

    pub fn mem_free(&mut self, ptr: u64) -> CuResult<()> {
        self.contexts.current()?;
        if self.pools.allocations.contains_key(&ptr) {
            // cuMemFree of stream-ordered memory frees it at once.
            return self.pool_free(ptr);
        }
        let freed = self
            .legacy
            .by_base
            .remove(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        self.forget_advice(freed.alloc);
        self.unmap_one(ptr)?;
        self.free_reservation(ptr);
        Ok(())
    }

    /// Frees what context `ctx` owned as it is destroyed or reset (`cudaDeviceReset`): its
    /// cuMemAlloc memory and the peer IPC handles it opened. VMM allocations belong to the
    /// process, not to a context, and stay.
    pub fn release_context_memory(&mut self, ctx: u64) -> CuResult<()> {
        let bases: Vec<u64> = self
            .legacy
            .by_base
            .iter()
            .filter(|(_, l)| l.context == ctx)
            .map(|(b, _)| *b)
            .collect();
        for base in bases {
            self.legacy.by_base.remove(&base);
            self.unmap_one(base)?;
            self.free_reservation(base);
        }
        for base in self.ipc.close_context(ctx) {
            self.unmap_one(base)?;
            self.free_reservation(base);
        }
        Ok(())
    }

    /// Base and size of the allocation containing `ptr`: the cuMemAlloc block, a peer's
    /// block opened by IPC (its requested size), or the VMM mapping.
    pub fn address_range(&self, ptr: u64) -> CuResult<(u64, u64)> {
        if let Some((base, l)) = self.legacy.by_base.range(..=ptr).next_back()
            && ptr < base + l.requested
        {
            return Ok((*base, l.requested));
        }
        if let Some((base, requested)) = self.ipc.opened_range(ptr) {
            return Ok((base, requested));
        }
        self.vmm
            .mapping_at(ptr)
            .map(|(s, m)| (s, m.size))
            .ok_or(CuError::CUDA_ERROR_NOT_FOUND)
    }

    pub fn mem_info(&self) -> CuResult<(u64, u64)> {
        let (_, dev) = self.contexts.current()?;
        let total = self.config.memory(dev);
        Ok((total.saturating_sub(self.vmm.used(dev)), total))
    }

    pub fn host_register(&mut self, p: u64, size: u64, flags: u32) -> CuResult<()> {
        self.contexts.current()?;
        if p == 0 || size == 0 || flags & !c::HOST_REGISTER_ALL != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let end = p
            .checked_add(size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = self
            .legacy
            .host_registered
            .range(..end)
            .next_back()
            .is_some_and(|(s, (l, _))| s + l > p);
        if overlaps {
            return Err(CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        let ctx = self.contexts.current_handle();
        self.legacy.host_registered.insert(p, (size, ctx));
        Ok(())
    }

    pub fn host_unregister(&mut self, p: u64) -> CuResult<()> {
        self.contexts.current()?;
        self.legacy
            .host_registered
            .remove(&p)
            .ok_or(CuError::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
        self.forget_advice(p);
        Ok(())
    }
}
