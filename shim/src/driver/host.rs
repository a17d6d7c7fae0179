//! Host memory the shim owns for its carriers: one anonymous private mapping, handed out as
//! byte slices, page-locked with the driver only for the duration of a transfer.

use super::table::{Driver, call};
use crate::sys::abi::consts;
use crate::sys::error::{CuError, CuResult};
use std::ffi::c_void;

/// Mappings from this size on are populated by several threads.
const PARALLEL_POPULATE: usize = 32 << 20;
const MAX_POPULATE_THREADS: usize = 8;
const HUGE_PAGE: usize = 2 << 20;

/// An anonymous private mapping of `len` bytes (at least one), unmapped on drop.
#[derive(Debug)]
pub struct HostMemory {
    base: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value alone; every access goes through `&self` or
// `&mut self`, so Rust's borrow rules order them as for a `Vec<u8>`.
unsafe impl Send for HostMemory {}

impl HostMemory {
    /// Maps `len` bytes, asking for transparent huge pages and a bulk population instead of a
    /// fault per 4 KiB during the copy (both hints: a kernel that declines them only makes the
    /// copy slower). A large mapping is populated by several threads, each its own part
    /// (zeroing the pages is most of the cost, and it scales with cores). `OUT_OF_MEMORY` when
    /// the kernel refuses the mapping.
    pub fn new(len: usize) -> CuResult<Self> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(CuError::OUT_OF_MEMORY);
        }
        // SAFETY: advice on the mapping just created, within its length.
        unsafe { libc::madvise(base, len, libc::MADV_HUGEPAGE) };
        let memory = HostMemory {
            base: base.cast(),
            len,
        };
        memory.populate();
        Ok(memory)
    }

    /// Faults the whole mapping in: in parts of whole huge pages, one thread each, for a
    /// mapping of at least [`PARALLEL_POPULATE`] bytes.
    fn populate(&self) {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_POPULATE_THREADS);
        let part = if self.len >= PARALLEL_POPULATE && threads > 1 {
            self.len.div_ceil(threads).next_multiple_of(HUGE_PAGE)
        } else {
            self.len
        };
        let (base, total) = (self.base as usize, self.len);
        let populate = move |offset: usize| {
            let len = part.min(total - offset);
            // SAFETY: advice on a part of this mapping, within its length; it changes no bytes.
            unsafe {
                libc::madvise(
                    (base + offset) as *mut c_void,
                    len,
                    libc::MADV_POPULATE_WRITE,
                )
            };
        };
        std::thread::scope(|scope| {
            for offset in (part..total).step_by(part) {
                scope.spawn(move || populate(offset));
            }
            populate(0);
        });
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` readable bytes at `base`, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` writable bytes at `base`, exclusively borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// Page-locks the whole mapping for the driver's DMA (`cuMemHostRegister`, portable), in
    /// whichever context is current; `NOT_SUPPORTED` when the driver has no such call.
    pub fn register(&mut self, d: &Driver) -> CuResult<()> {
        if d.cuMemHostRegister_v2.is_none() {
            return Err(CuError::NOT_SUPPORTED);
        }
        let base = self.base.cast::<c_void>();
        call!(
            d,
            cuMemHostRegister_v2(base, self.len, consts::HOST_REGISTER_PORTABLE)
        )
    }

    /// Undoes [`register`](Self::register).
    pub fn unregister(&mut self, d: &Driver) -> CuResult<()> {
        call!(d, cuMemHostUnregister(self.base.cast::<c_void>()))
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no slice of it outlives `self`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
