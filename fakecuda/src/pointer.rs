//! Page-locked host allocations and pointer attributes: what `cuPointerGetAttribute(s)` says
//! about an address (host memory the driver knows, `cuMemAlloc` and managed blocks, VMM
//! mappings), as the driver answers under unified addressing.

use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::legacy::HostAlloc;
use crate::state::vmm::Target;

/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`.
pub const HOST_ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
const SYNC_MEMOPS: u32 = 6;

/// `CUmemorytype`.
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;

/// One attribute's value, sized as cuda.h declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// `unsigned int` / `int` / `CUmemorytype` / booleans.
    U32(u32),
    /// `CUdeviceptr`, `size_t`, `unsigned long long`, pointers.
    U64(u64),
}

/// What the driver knows about an address.
#[derive(Debug, Clone, Copy)]
struct Facts {
    memory_type: u32,
    context: u64,
    device: u32,
    host_pointer: Option<u64>,
    range: (u64, u64),
    managed: bool,
    ipc_capable: bool,
    handle_types: u64,
    buffer_id: u64,
    access: u32,
    pool: u64,
    sync_memops: bool,
}

impl DriverState {
    /// `cuMemAllocHost`/`cuMemHostAlloc`: anonymous private memory, page-locked by promise.
    pub fn host_alloc(&mut self, bytes: u64, flags: u32) -> CuResult<u64> {
        let ctx = self.contexts.current()?.0;
        if bytes == 0 || flags & !HOST_ALLOC_FLAGS != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let len = usize::try_from(bytes).map_err(|_| CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let base = p as u64;
        self.legacy.host_allocs.insert(
            base,
            HostAlloc {
                size: bytes,
                flags,
                context: ctx,
            },
        );
        Ok(base)
    }

    /// `cuMemFreeHost`: only a base `host_alloc` returned.
    pub fn host_free(&mut self, p: u64) -> CuResult<()> {
        self.contexts.current()?;
        let a = self.legacy.take_host_alloc(p)?;
        self.forget_advice(p);
        // SAFETY: unmaps exactly the mapping `host_alloc` made (removed from the table above,
        // so no second free can reach it).
        unsafe { libc::munmap(p as *mut libc::c_void, a.size as usize) };
        Ok(())
    }

    /// Host memory the driver knows that contains `p`: (base, size, context, alloc flags).
    pub(crate) fn host_range(&self, p: u64) -> Option<(u64, u64, u64, u32)> {
        if let Some((&base, a)) = self.legacy.host_allocs.range(..=p).next_back()
            && p < base + a.size
        {
            return Some((base, a.size, a.context, a.flags));
        }
        let (&base, &(size, ctx)) = self.legacy.host_registered.range(..=p).next_back()?;
        (p < base + size).then_some((base, size, ctx, 0))
    }

    /// `cuMemHostGetDevicePointer`: the same address (unified addressing), for known host
    /// memory only; `flags` must be 0.
    pub fn host_device_pointer(&self, p: u64, flags: u32) -> CuResult<u64> {
        self.contexts.current()?;
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.host_range(p)
            .map(|_| p)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuMemHostGetFlags`: the flags of a `cuMemHostAlloc` allocation.
    pub fn host_flags(&self, p: u64) -> CuResult<u32> {
        self.contexts.current()?;
        match self.legacy.host_allocs.range(..=p).next_back() {
            Some((&base, a)) if p < base + a.size => Ok(a.flags),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// What the driver knows about `p`, with the settable attributes applied.
    fn facts(&self, p: u64) -> Option<Facts> {
        let mut f = self.known(p)?;
        f.sync_memops = self.sync_memops.contains(&f.buffer_id);
        Some(f)
    }

    fn known(&self, p: u64) -> Option<Facts> {
        if let Some((base, size, context, _)) = self.host_range(p) {
            let device = self.contexts.device_of(context).unwrap_or(0);
            return Some(Facts {
                memory_type: MEMORY_HOST,
                context,
                device,
                host_pointer: Some(p),
                range: (base, size),
                managed: false,
                ipc_capable: false,
                handle_types: 0,
                buffer_id: base,
                access: crate::abi::consts::ACCESS_READWRITE,
                pool: 0,
                sync_memops: false,
            });
        }
        if let Some((&base, l)) = self.legacy.by_base.range(..=p).next_back()
            && p < base + l.requested
        {
            let a = self.vmm.allocs.get(&l.alloc)?;
            return Some(Facts {
                memory_type: MEMORY_DEVICE,
                context: l.context,
                device: a.device,
                host_pointer: l.managed.then_some(p),
                range: (base, l.requested),
                managed: l.managed,
                ipc_capable: !l.managed,
                handle_types: 0,
                buffer_id: l.alloc,
                access: crate::abi::consts::ACCESS_READWRITE,
                pool: 0,
                sync_memops: false,
            });
        }
        if let Some((base, pool, alloc, size)) = self.pools.allocation_at(p) {
            // A host pool's memory is host memory the CPU reaches at the same address.
            let host = self.pools.host_pool(pool);
            let managed = self.pools.managed_pool(pool);
            return Some(Facts {
                memory_type: if host { MEMORY_HOST } else { MEMORY_DEVICE },
                context: 0,
                device: self.pools.device_of(pool).unwrap_or(0),
                host_pointer: (host || managed).then_some(p),
                range: (base, size),
                managed,
                ipc_capable: false,
                handle_types: 0,
                buffer_id: alloc,
                access: crate::abi::consts::ACCESS_READWRITE,
                pool,
                sync_memops: false,
            });
        }
        let (start, m) = self.vmm.mapping_at(p)?;
        let Target::Alloc(h) = m.target else {
            return None;
        };
        let a = self.vmm.allocs.get(&h)?;
        let device = a.device;
        Some(Facts {
            memory_type: MEMORY_DEVICE,
            context: 0,
            device,
            host_pointer: None,
            range: (start, m.size),
            managed: false,
            ipc_capable: false,
            handle_types: u64::from(a.handle_types),
            buffer_id: h,
            access: m.access.get(&device).copied().unwrap_or(0),
            pool: 0,
            sync_memops: false,
        })
    }

    /// `cuPointerGetAttribute`: `CUDA_ERROR_INVALID_VALUE` for an address the driver does not
    /// know or an attribute that does not apply (a host pointer of device memory).
    pub fn pointer_attribute(&self, attribute: u32, p: u64) -> CuResult<Value> {
        let facts = self.facts(p).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        value(&facts, attribute, p)
    }

    /// The allocation `p` lies in: (range start, size, buffer id, managed), for advice and
    /// settable attributes.
    pub fn allocation_of(&self, p: u64) -> Option<(u64, u64, u64, bool)> {
        self.facts(p)
            .map(|f| (f.range.0, f.range.1, f.buffer_id, f.managed))
    }

    /// `cuPointerSetAttribute`: only `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` is settable, on memory
    /// the driver knows; it holds for the whole allocation.
    pub fn pointer_set_attribute(&mut self, attribute: u32, value: u32, p: u64) -> CuResult<()> {
        if attribute != SYNC_MEMOPS {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let (_, _, buffer, _) = self
            .allocation_of(p)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if value != 0 {
            self.sync_memops.insert(buffer);
        } else {
            self.sync_memops.remove(&buffer);
        }
        Ok(())
    }

    /// `cuPointerGetAttributes`: like [`DriverState::pointer_attribute`], but an unknown address
    /// gives every attribute its zero value instead of an error (cuda.h).
    pub fn pointer_attributes(&self, attributes: &[u32], p: u64) -> CuResult<Vec<Value>> {
        let facts = self.facts(p);
        attributes
            .iter()
            .map(|&a| match &facts {
                Some(f) => value(f, a, p).or(Ok(zero(a)?)),
                None => zero(a),
            })
            .collect()
    }
}

/// Whether an attribute is a 64-bit value.
fn wide(attribute: u32) -> CuResult<bool> {
    Ok(match attribute {
        1 | 3 | 4 | 7 | 11 | 12 | 14 | 17 | 18 | 19 | 20 => true,
        2 | 6 | 8 | 9 | 10 | 13 | 15 | 16 | 21 | 22 => false,
        // P2P tokens (a struct) and anything unknown.
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    })
}

fn zero(attribute: u32) -> CuResult<Value> {
    Ok(if wide(attribute)? {
        Value::U64(0)
    } else {
        Value::U32(0)
    })
}

fn value(f: &Facts, attribute: u32, p: u64) -> CuResult<Value> {
    use Value::{U32, U64};
    Ok(match attribute {
        1 => U64(f.context),
        2 => U32(f.memory_type),
        3 => U64(p),
        4 => U64(f.host_pointer.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?),
        SYNC_MEMOPS => U32(u32::from(f.sync_memops)),
        7 | 20 => U64(f.buffer_id),
        8 => U32(u32::from(f.managed)),
        9 => U32(f.device),
        10 => U32(u32::from(f.ipc_capable)),
        11 | 19 => U64(f.range.0),
        12 | 18 => U64(f.range.1),
        13 => U32(1),
        14 => U64(f.handle_types),
        15 | 21 => U32(0),
        16 => U32(f.access),
        17 => U64(f.pool),
        22 => U32(0),
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    })
}
