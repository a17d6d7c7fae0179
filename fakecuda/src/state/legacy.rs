//! The legacy tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::legacy`.

use crate::error::{CuError, CuResult};
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct LegacyAlloc {
    pub requested: u64,
    pub alloc: u64,
    /// The context it was allocated in: destroying or resetting that context frees it.
    pub context: u64,
    /// `cuMemAllocManaged` memory (device memory the host may touch, here as everywhere).
    pub managed: bool,
}

/// Page-locked host memory from `cuMemAllocHost`/`cuMemHostAlloc`: process-private anonymous
/// memory (not a memfd: it is never shared), with the flags it was allocated with.
#[derive(Debug)]
pub struct HostAlloc {
    pub size: u64,
    pub flags: u32,
    pub context: u64,
}

#[derive(Debug, Default)]
pub struct Legacy {
    pub by_base: BTreeMap<u64, LegacyAlloc>,
    /// Registered host ranges: base → (size, context current at registration).
    pub host_registered: BTreeMap<u64, (u64, u64)>,
    pub host_allocs: BTreeMap<u64, HostAlloc>,
}

impl Legacy {
    /// Forgets the `cuMemAllocHost`/`cuMemHostAlloc` memory at `base`, which must be a base
    /// one of them returned.
    pub fn take_host_alloc(&mut self, base: u64) -> CuResult<HostAlloc> {
        self.host_allocs
            .remove(&base)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }
}
