//! Host carriers: one anonymous host arena per process holding a full copy of each shared
//! allocation this process created, between `save_allocations` and `load_allocations`.
//!
//! The arena is ordinary private memory, so CRIU saves it with the process and native
//! checkpoint never sees it as device memory. It is page-locked (`cuMemHostRegister`) only
//! for the duration of each transfer. Copies go through a temporary device alias of the whole
//! allocation (reserve, map, grant read-write), so partial or read-only application mappings
//! do not matter, on one stream per context.

use crate::abi::consts;
use crate::context;
use crate::driver::Driver;
use crate::driver::call;
use crate::error::{CuError, CuResult};
use crate::registry::Allocation;
use cuinterpose_protocol::{AllocationId, LocationType};
use std::collections::BTreeMap;
use std::ffi::c_void;

/// The host copy: an anonymous mapping and where each allocation's bytes sit in it.
#[derive(Debug)]
pub struct Arena {
    base: *mut u8,
    len: usize,
    pub slots: BTreeMap<AllocationId, (usize, u64)>,
}

// SAFETY: the arena is plain memory owned by this struct; it is only touched under the
// registry lock.
unsafe impl Send for Arena {}

impl Arena {
    pub fn new(slots: BTreeMap<AllocationId, (usize, u64)>, len: usize) -> CuResult<Self> {
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(CuError::OUT_OF_MEMORY);
        }
        // Transparent huge pages and one bulk population instead of a page fault per 4 KiB
        // during the copy (the arena is written once, whole). Both are hints: a kernel that
        // declines them only makes the copy slower.
        // SAFETY: advice on the mapping just created, within its length.
        unsafe {
            libc::madvise(base, len.max(1), libc::MADV_HUGEPAGE);
            libc::madvise(base, len.max(1), libc::MADV_POPULATE_WRITE);
        }
        Ok(Arena {
            base: base.cast(),
            len: len.max(1),
            slots,
        })
    }

    fn len(&self) -> usize {
        self.len
    }

    fn at(&self, offset: usize) -> *mut c_void {
        // SAFETY: offsets come from `slots`, which lie within `len` (built together).
        unsafe { self.base.add(offset) }.cast()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Save,
    Load,
}

/// The device a transfer of `a` runs on.
pub fn device_of(a: &Allocation) -> i32 {
    match a.properties.location.location_type {
        LocationType::Device => a.properties.location.id,
        _ => 0,
    }
}

/// Copies every allocation in `jobs` between its device memory and its arena slot.
pub fn transfer(
    d: &Driver,
    arena: &Arena,
    jobs: &[&Allocation],
    direction: Direction,
) -> CuResult<()> {
    let Some(first) = jobs.first() else {
        return Ok(());
    };
    let register = |on: bool| {
        context::run(d, first.context, device_of(first), || {
            if on {
                call!(
                    d,
                    cuMemHostRegister_v2(arena.at(0), arena.len(), consts::HOST_REGISTER_PORTABLE)
                )
            } else {
                call!(d, cuMemHostUnregister(arena.at(0)))
            }
        })
    };
    let pinned = d.cuMemHostRegister_v2.is_some() && register(true).is_ok();
    // One stream per (context, device) group.
    let mut groups: BTreeMap<(usize, i32), Vec<&Allocation>> = BTreeMap::new();
    for a in jobs {
        groups.entry((a.context, device_of(a))).or_default().push(a);
    }
    let mut result = Ok(());
    for ((ctx, device), members) in groups {
        result = context::run(d, ctx, device, || {
            copy_group(d, arena, device, &members, direction)
        });
        if result.is_err() {
            break;
        }
    }
    if pinned {
        let unregistered = register(false);
        result = result.and(unregistered);
    }
    result
}

struct Alias {
    address: u64,
    size: usize,
}

fn copy_group(
    d: &Driver,
    arena: &Arena,
    device: i32,
    members: &[&Allocation],
    direction: Direction,
) -> CuResult<()> {
    let mut stream = 0usize;
    call!(d, cuStreamCreate(&mut stream, consts::STREAM_NON_BLOCKING))?;
    let mut aliases: Vec<Alias> = Vec::new();
    let issued = (|| {
        for a in members {
            let size = usize::try_from(a.size).map_err(|_| CuError::INVALID_VALUE)?;
            let raw = a.driver.ok_or(CuError::INVALID_HANDLE)?;
            let address = crate::vmm::map_read_write(d, raw, a.size, device)?;
            aliases.push(Alias { address, size });
            let (offset, _) = arena.slots[&a.reference.id];
            let host = arena.at(offset);
            match direction {
                Direction::Save => call!(d, cuMemcpyDtoHAsync_v2(host, address, size, stream))?,
                Direction::Load => call!(d, cuMemcpyHtoDAsync_v2(address, host, size, stream))?,
            }
        }
        Ok(())
    })();
    // Whatever was issued must finish before the aliases go away or the arena is reused.
    if let Err(e) = call!(d, cuStreamSynchronize(stream)) {
        crate::log!("CUDA copy completion unknown ({e}); terminating without cleanup");
        // SAFETY: _exit never returns and runs no destructors: memory a DMA may still touch
        // must not be freed or reused.
        unsafe { libc::_exit(127) };
    }
    let _ = call!(d, cuStreamDestroy_v2(stream));
    let mut cleanup = Ok(());
    for alias in aliases {
        cleanup = cleanup.and(crate::vmm::unmap_and_free(d, alias.address, alias.size));
    }
    issued.and(cleanup)
}
