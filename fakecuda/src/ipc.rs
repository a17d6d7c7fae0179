//! Native legacy IPC: `cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2` / `cuIpcCloseMemHandle`.
//!
//! The 64-byte handle names the creator's pid and allocation; an opener fetches the memfd
//! from the creator's control socket (SCM_RIGHTS) and maps it. Every call is counted
//! (`fakecuda_native_ipc_calls`), so tests can prove an interposer never reached them.

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::ipc::{HANDLE_BYTES, Named, Opened, decode, encode};
use crate::state::vmm::PhysAlloc;
use crate::sys;
use std::os::fd::OwnedFd;

impl DriverState {
    /// The same bytes for the same allocation every time.
    pub fn ipc_get(&mut self, ptr: u64) -> CuResult<[u8; HANDLE_BYTES]> {
        self.contexts.current()?;
        let l = self
            .legacy
            .by_base
            .get(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let (h, requested) = (l.alloc, l.requested);
        let a = self
            .vmm
            .allocs
            .get_mut(&h)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        a.ipc_handle = true;
        Ok(encode(Named {
            pid: std::process::id(),
            alloc: h,
            size: a.size,
            requested,
        }))
    }

    /// Server side: a new FD for an allocation this process handed an IPC handle for; one
    /// that was freed since is an invalid handle.
    pub fn ipc_fd_for(&self, alloc: u64) -> CuResult<OwnedFd> {
        let Some(a) = self.vmm.allocs.get(&alloc).filter(|a| a.ipc_handle) else {
            // Handles are unique in a process: it may name an exported interprocess event.
            return self.event_ipc_fd(alloc);
        };
        crate::sys::dup_cloexec(a.fd()?)
    }

    /// Returns the existing mapping for a handle already open here, or what to fetch.
    pub fn ipc_open_existing(
        &mut self,
        handle: &[u8; HANDLE_BYTES],
        flags: u32,
    ) -> CuResult<Result<u64, Named>> {
        if flags & !c::IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.contexts.current()?;
        let named = decode(handle)?;
        if named.pid == std::process::id() {
            // Opening one's own handle fails as on the real driver.
            return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
        }
        if let Some(o) = self.ipc.opened.get_mut(&(named.pid, named.alloc)) {
            o.refs += 1;
            return Ok(Ok(o.base));
        }
        Ok(Err(named))
    }

    /// Maps a peer's allocation FD fetched from its control socket.
    pub fn ipc_map(&mut self, named: Named, fd: OwnedFd) -> CuResult<u64> {
        let Named {
            pid,
            alloc,
            size,
            requested,
        } = named;
        if let Some(o) = self.ipc.opened.get_mut(&(pid, alloc)) {
            o.refs += 1;
            return Ok(o.base);
        }
        let (context, device) = self.contexts.current()?;
        if size == 0
            || !size.is_multiple_of(sys::granularity())
            || crate::sys::file_size(std::os::fd::AsFd::as_fd(&fd))? < size
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = self.next_handle();
        self.vmm
            .allocs
            .insert(h, PhysAlloc::opened(size, device, fd));
        let base = self.map_whole_readwrite(h, size, device)?;
        self.ipc.opened.insert(
            (pid, alloc),
            Opened {
                base,
                refs: 1,
                requested,
                context,
            },
        );
        Ok(base)
    }

    pub fn ipc_close(&mut self, ptr: u64) -> CuResult<()> {
        self.contexts.current()?;
        let (key, o) = self.ipc.opened_at(ptr)?;
        o.refs -= 1;
        if o.refs == 0 {
            self.ipc.opened.remove(&key);
            self.unmap_one(ptr)?;
            self.free_reservation(ptr);
        }
        Ok(())
    }
}

/// cuIpcOpenMemHandle_v2 as a whole: the FD is fetched without holding the driver lock.
pub fn open(handle: &[u8; HANDLE_BYTES], flags: u32) -> CuResult<u64> {
    let named = match crate::driver::with(|d| d.ipc_open_existing(handle, flags))? {
        Ok(base) => return Ok(base),
        Err(named) => named,
    };
    let fd = crate::checkpoint::client::fetch_ipc_fd(named.pid, named.alloc)?;
    crate::driver::with(|d| d.ipc_map(named, fd))
}
