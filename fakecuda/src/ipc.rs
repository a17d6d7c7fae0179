//! Native legacy IPC: `cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2` / `cuIpcCloseMemHandle`.
//!
//! The 64-byte handle names the creator's pid and allocation; an opener fetches the memfd
//! from the creator's control socket (SCM_RIGHTS) and maps it. Every call is counted
//! (`fakecuda_native_ipc_calls`), so tests can prove an interposer never reached them.

use crate::abi::consts as c;
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys;
use crate::vmm::PhysAlloc;
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
    /// The size the creator asked cuMemAlloc for (what cuMemGetAddressRange reports).
    requested: u64,
    /// The context that opened it: destroying or resetting that context closes it.
    context: u64,
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

    /// Peer handles open here.
    pub fn open_count(&self) -> u64 {
        self.opened.len() as u64
    }

    /// (base, requested size) of the opened block containing `ptr`.
    pub fn opened_range(&self, ptr: u64) -> Option<(u64, u64)> {
        self.opened
            .values()
            .find(|o| o.base <= ptr && ptr < o.base + o.requested)
            .map(|o| (o.base, o.requested))
    }

    /// The context that opened the block mapped at `base`.
    pub fn context_at(&self, base: u64) -> Option<u64> {
        self.opened
            .values()
            .find(|o| o.base == base)
            .map(|o| o.context)
    }

    /// The open handle mapped at `base`, with its key.
    fn opened_at(&mut self, base: u64) -> CuResult<((u32, u64), &mut Opened)> {
        self.opened
            .iter_mut()
            .find(|(_, o)| o.base == base)
            .map(|(k, o)| (*k, o))
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// Forgets every handle context `ctx` opened: the bases to unmap.
    pub fn close_context(&mut self, ctx: u64) -> Vec<u64> {
        let mut bases = Vec::new();
        self.opened.retain(|_, o| {
            let keep = o.context != ctx;
            if !keep {
                bases.push(o.base);
            }
            keep
        });
        bases
    }
}

/// What a handle names: the creator's pid, its allocation handle, the allocation's size and
/// the size cuMemAlloc was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub pid: u32,
    pub alloc: u64,
    pub size: u64,
    pub requested: u64,
}

fn encode(n: Named) -> [u8; HANDLE_BYTES] {
    let mut h = [0u8; HANDLE_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&n.pid.to_le_bytes());
    h[16..24].copy_from_slice(&n.alloc.to_le_bytes());
    h[24..32].copy_from_slice(&n.size.to_le_bytes());
    h[32..40].copy_from_slice(&n.requested.to_le_bytes());
    h
}

fn decode(h: &[u8; HANDLE_BYTES]) -> CuResult<Named> {
    if &h[..8] != MAGIC || h[12..16] != [0; 4] || h[40..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    let (alloc, size, requested) = (sys::le_u64(h, 16), sys::le_u64(h, 24), sys::le_u64(h, 32));
    if requested == 0 || requested > size {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Named {
        pid,
        alloc,
        size,
        requested,
    })
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
