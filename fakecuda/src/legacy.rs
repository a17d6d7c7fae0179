//! `cuMemAlloc` / `cuMemFree` / `cuMemGetAddressRange`: classic device allocations, built on
//! the same memfd + reservation machinery as VMM so native IPC can share them.

use crate::abi::consts as c;
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys::{self, GRANULARITY};
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct LegacyAlloc {
    pub requested: u64,
    pub alloc: u64,
}

#[derive(Debug, Default)]
pub struct Legacy {
    pub by_base: BTreeMap<u64, LegacyAlloc>,
    host_registered: BTreeMap<u64, u64>,
}

impl Driver {
    pub fn mem_alloc(&mut self, bytes: u64) -> CuResult<u64> {
        let (_, device) = self.contexts.current()?;
        if bytes == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let size = sys::round_up(bytes, GRANULARITY).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        let h = self.alloc_create(size, device, c::HANDLE_TYPE_POSIX_FD, true)?;
        let base = self.map_whole_readwrite(h, size, device)?;
        self.legacy.by_base.insert(
            base,
            LegacyAlloc {
                requested: bytes,
                alloc: h,
            },
        );
        Ok(base)
    }

    pub fn mem_free(&mut self, ptr: u64) -> CuResult<()> {
        self.contexts.current()?;
        if !self.legacy.by_base.contains_key(&ptr) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.legacy.by_base.remove(&ptr);
        self.unmap_one(ptr)?;
        self.free_reservation(ptr);
        Ok(())
    }

    /// Base and size of the allocation containing `ptr`: the cuMemAlloc block, or the VMM
    /// mapping.
    pub fn address_range(&self, ptr: u64) -> CuResult<(u64, u64)> {
        if let Some((base, l)) = self.legacy.by_base.range(..=ptr).next_back()
            && ptr < base + l.requested
        {
            return Ok((*base, l.requested));
        }
        self.vmm
            .mapping_at(ptr)
            .map(|(s, m)| (s, m.size))
            .ok_or(CuError::CUDA_ERROR_NOT_FOUND)
    }

    pub fn mem_info(&self) -> CuResult<(u64, u64)> {
        let (_, dev) = self.contexts.current()?;
        let total = self.config.memory;
        Ok((total.saturating_sub(self.vmm.used(dev)), total))
    }

    pub fn host_register(&mut self, p: u64, size: u64, flags: u32) -> CuResult<()> {
        self.contexts.current()?;
        if p == 0 || size == 0 || flags & !c::MEMHOSTREGISTER_ALL != 0 {
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
            .is_some_and(|(s, l)| s + l > p);
        if overlaps {
            return Err(CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.legacy.host_registered.insert(p, size);
        Ok(())
    }

    pub fn host_unregister(&mut self, p: u64) -> CuResult<()> {
        self.contexts.current()?;
        self.legacy
            .host_registered
            .remove(&p)
            .map(|_| ())
            .ok_or(CuError::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    }
}
