//! The state of an interprocess event (`CU_EVENT_INTERPROCESS`): its record count and the last
//! record reached, as two counters in a memfd page every process that opened the event maps,
//! so a record in one process is seen, and waited for, in another.

use crate::error::{CuError, CuResult};
use crate::state::ipc_event::{HANDLE_BYTES, MAGIC};
use crate::sys;
use std::os::fd::OwnedFd;

impl crate::driver::DriverState {
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
