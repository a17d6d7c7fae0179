//! The state of an interprocess event (`CU_EVENT_INTERPROCESS`): its record count and the last
//! record reached, as two counters in a memfd page every process that opened the event maps,
//! so a record in one process is seen, and waited for, in another.

use crate::error::{CuError, CuResult};
use crate::sys;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = 4096;

/// The shared counters: records so far, and the last record reached.
#[derive(Debug)]
pub struct SharedMarks {
    fd: OwnedFd,
    page: *mut AtomicU64,
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

    fn map(fd: OwnedFd) -> CuResult<SharedMarks> {
        let p = sys::map_page(fd.as_fd(), PAGE).ok_or(CuError::CUDA_ERROR_OPERATING_SYSTEM)?;
        Ok(SharedMarks { fd, page: p.cast() })
    }

    fn counter(&self, i: usize) -> &AtomicU64 {
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

const MAGIC: &[u8; 8] = b"FKCUEVT1";
/// `CUipcEventHandle`.
pub const HANDLE_BYTES: usize = 64;

/// Interprocess events this process exported (their FDs are served on request).
#[derive(Debug, Default)]
pub struct IpcEvents {
    exported: std::collections::BTreeSet<u64>,
}

impl crate::driver::Driver {
    /// `cuIpcGetEventHandle`: 64 bytes naming this process and an interprocess event.
    pub fn event_ipc_handle(&mut self, e: u64) -> CuResult<[u8; HANDLE_BYTES]> {
        let ev = self
            .events
            .get(&e)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        if ev.shared.is_none() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.ipc_events.exported.insert(e);
        let mut h = [0u8; HANDLE_BYTES];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        h[16..24].copy_from_slice(&e.to_le_bytes());
        Ok(h)
    }

    /// The page FD of an event this process exported, for the control socket.
    pub fn event_ipc_fd(&self, e: u64) -> CuResult<OwnedFd> {
        let ev = self
            .events
            .get(&e)
            .filter(|_| self.ipc_events.exported.contains(&e))
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        let shared = ev
            .shared
            .as_ref()
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        sys::dup_cloexec(shared.fd())
    }
}

/// What an event handle names: (creator's pid, its event), checked.
pub fn decode(h: &[u8; HANDLE_BYTES]) -> CuResult<(u32, u64)> {
    if &h[..8] != MAGIC || h[24..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::try_from(sys::le_u64(h, 8)).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    Ok((pid, sys::le_u64(h, 16)))
}
