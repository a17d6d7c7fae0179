//! The ipc_event tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::ipc_event`.

use crate::error::{CuError, CuResult};
use crate::sys;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const PAGE: usize = 4096;

/// The shared counters: records so far, and the last record reached.
#[derive(Debug)]
pub struct SharedMarks {
    pub(crate) fd: OwnedFd,
    pub(crate) page: *mut AtomicU64,
}

// SAFETY: `page` points at a MAP_SHARED page this value owns for its lifetime; the two
// counters in it are atomics, so any thread may use them.
unsafe impl Send for SharedMarks {}

// SAFETY: as above.
unsafe impl Sync for SharedMarks {}

impl SharedMarks {
    /// A fresh page (both counters 0).
    pub fn new() -> CuResult<SharedMarks> {
        SharedMarks::map(sys::new_memfd("fakecuda-event", PAGE as u64)?)
    }

    /// Another process's event page, from the FD its creator served.
    pub fn open(fd: OwnedFd) -> CuResult<SharedMarks> {
        if sys::file_size(fd.as_fd())? < PAGE as u64 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        SharedMarks::map(fd)
    }

    pub(crate) fn map(fd: OwnedFd) -> CuResult<SharedMarks> {
        let p = sys::map_page(fd.as_fd(), PAGE).ok_or(CuError::CUDA_ERROR_OPERATING_SYSTEM)?;
        Ok(SharedMarks { fd, page: p.cast() })
    }

    pub(crate) fn counter(&self, i: usize) -> &AtomicU64 {
        // SAFETY: the page holds two aligned u64 counters, live as long as `self`.
        unsafe { &*self.page.add(i) }
    }

    /// A new record; returns its number.
    pub fn record(&self) -> u64 {
        self.counter(0).fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn recorded(&self) -> u64 {
        self.counter(0).load(Ordering::SeqCst)
    }

    /// Record `n` was reached (in whichever process recorded it).
    pub fn reach(&self, n: u64) {
        self.counter(1).fetch_max(n, Ordering::SeqCst);
    }

    pub fn reached(&self) -> u64 {
        self.counter(1).load(Ordering::SeqCst)
    }

    /// The page's FD, to serve to a process that opens the event.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedMarks {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page `map` made; no reference to it outlives `self`.
        unsafe { libc::munmap(self.page.cast(), PAGE) };
    }
}

pub(crate) const MAGIC: &[u8; 8] = b"FKCUEVT1";

/// `CUipcEventHandle`.
pub const HANDLE_BYTES: usize = 64;

/// Interprocess events this process exported (their FDs are served on request).
#[derive(Debug, Default)]
pub struct IpcEvents {
    pub(crate) exported: std::collections::BTreeSet<u64>,
}

/// What an event handle names: (creator's pid, its event), checked.
pub fn decode(h: &[u8; HANDLE_BYTES]) -> CuResult<(u32, u64)> {
    if &h[..8] != MAGIC || h[24..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::try_from(sys::le_u64(h, 8)).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    Ok((pid, sys::le_u64(h, 16)))
}
