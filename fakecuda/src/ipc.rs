//! Native legacy IPC: `cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2` / `cuIpcCloseMemHandle`.
//!
//! The 64-byte handle names the creator's pid and allocation; an opener fetches the memfd
//! from the creator's control socket (SCM_RIGHTS) and maps it. Every call is counted
//! (`fakecuda_native_ipc_calls`), so tests can prove an interposer never reached them.

use crate::abi::consts as c;
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys::GRANULARITY;
use crate::vmm::{Backing, PhysAlloc};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

pub const HANDLE_BYTES: usize = 64;
const MAGIC: &[u8; 8] = b"FKCUIPC1";

static NATIVE_CALLS: AtomicU64 = AtomicU64::new(0);

pub fn count_call() {
    NATIVE_CALLS.fetch_add(1, Ordering::Relaxed);
}

pub fn calls() -> u64 {
    NATIVE_CALLS.load(Ordering::Relaxed)
}

#[derive(Debug)]
struct Opened {
    base: u64,
    refs: u32,
}

#[derive(Debug, Default)]
pub struct Ipc {
    /// (creator pid, creator's allocation handle) → local mapping.
    opened: HashMap<(u32, u64), Opened>,
}

impl Ipc {
    pub fn live(&self) -> bool {
        !self.opened.is_empty()
    }
}

fn encode(pid: u32, alloc: u64, size: u64) -> [u8; HANDLE_BYTES] {
    let mut h = [0u8; HANDLE_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&pid.to_le_bytes());
    h[16..24].copy_from_slice(&alloc.to_le_bytes());
    h[24..32].copy_from_slice(&size.to_le_bytes());
    h
}

fn decode(h: &[u8; HANDLE_BYTES]) -> CuResult<(u32, u64, u64)> {
    if &h[..8] != MAGIC || h[12..16] != [0; 4] || h[32..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::from_le_bytes(
        h[8..12]
            .try_into()
            .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?,
    );
    let alloc = u64::from_le_bytes(
        h[16..24]
            .try_into()
            .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?,
    );
    let size = u64::from_le_bytes(
        h[24..32]
            .try_into()
            .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?,
    );
    Ok((pid, alloc, size))
}

impl Driver {
    /// The same bytes for the same allocation every time.
    pub fn ipc_get(&mut self, ptr: u64) -> CuResult<[u8; HANDLE_BYTES]> {
        self.contexts.current()?;
        let l = self
            .legacy
            .by_base
            .get(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let h = l.alloc;
        let a = self
            .vmm
            .allocs
            .get_mut(&h)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        a.ipc_handle = true;
        Ok(encode(std::process::id(), h, a.size))
    }

    /// Server side: a new FD for an allocation this process handed an IPC handle for.
    pub fn ipc_fd_for(&self, alloc: u64) -> CuResult<OwnedFd> {
        let a = self
            .vmm
            .allocs
            .get(&alloc)
            .filter(|a| a.ipc_handle)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        crate::sys::dup_cloexec(a.fd()?)
    }

    /// Returns the existing mapping for a handle already open here, or what to fetch.
    pub fn ipc_open_existing(
        &mut self,
        handle: &[u8; HANDLE_BYTES],
        flags: u32,
    ) -> CuResult<Result<u64, (u32, u64, u64)>> {
        if flags & !c::IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.contexts.current()?;
        let (pid, alloc, size) = decode(handle)?;
        if pid == std::process::id() {
            // Opening one's own handle fails as on the real driver.
            return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
        }
        if let Some(o) = self.ipc.opened.get_mut(&(pid, alloc)) {
            o.refs += 1;
            return Ok(Ok(o.base));
        }
        Ok(Err((pid, alloc, size)))
    }

    /// Maps a peer's allocation FD fetched from its control socket.
    pub fn ipc_map(&mut self, pid: u32, alloc: u64, size: u64, fd: OwnedFd) -> CuResult<u64> {
        if let Some(o) = self.ipc.opened.get_mut(&(pid, alloc)) {
            o.refs += 1;
            return Ok(o.base);
        }
        let (_, device) = self.contexts.current()?;
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || crate::sys::file_size(std::os::fd::AsFd::as_fd(&fd))? < size
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = self.next_handle();
        self.vmm.allocs.insert(
            h,
            PhysAlloc {
                size,
                device,
                handle_types: 0,
                backing: Backing::Device(fd),
                handle_refs: 0,
                users: 0,
                exported: false,
                imported: false,
                ipc_handle: false,
                ipc_opened: true,
                legacy: false,
            },
        );
        let base = self.map_whole_readwrite(h, size, device)?;
        self.ipc
            .opened
            .insert((pid, alloc), Opened { base, refs: 1 });
        Ok(base)
    }

    pub fn ipc_close(&mut self, ptr: u64) -> CuResult<()> {
        self.contexts.current()?;
        let key = self
            .ipc
            .opened
            .iter()
            .find(|(_, o)| o.base == ptr)
            .map(|(k, _)| *k)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let o = self
            .ipc
            .opened
            .get_mut(&key)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
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
    let (pid, alloc, size) = match crate::driver::with(|d| d.ipc_open_existing(handle, flags))? {
        Ok(base) => return Ok(base),
        Err(what) => what,
    };
    let fd = crate::checkpoint::client::fetch_ipc_fd(pid, alloc)?;
    crate::driver::with(|d| d.ipc_map(pid, alloc, size, fd))
}
